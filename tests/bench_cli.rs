//! Issue 38 item 6: `scenario-run bench` measures time to interactive and a command's round
//! trip over N real local sandboxes, in each mode, with ComputeSDK's method (5 % trimmed from
//! each end, nearest-rank percentiles, the success rate), leaves no sandbox behind, and fails
//! on failed iterations and on a p95 over `--max-p95`. Figures are checked for consistency,
//! never for speed (that is `bench/run`'s).

mod common;

use common::*;

fn bench(args: &[&str], state: &std::path::Path) -> (std::process::Output, serde_json::Value) {
    let json = state.join("bench.json");
    let mut all = vec!["bench", "--json", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = cmd(&all).env("SCENARIO_RUN_STATE_DIR", state.join("state")).output().unwrap();
    let r = std::fs::read_to_string(&json).map(|t| serde_json::from_str(&t).unwrap()).unwrap_or_default();
    (out, r)
}

fn sandboxes_left(state: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(state.join("state"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sbx-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_mode_measures_each_iteration_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    for (mode, n) in [("sequential", 6usize), ("staggered", 4), ("burst", 4)] {
        let (out, r) = bench(&["-n", &n.to_string(), "--mode", mode, "--stagger", "20ms"], tmp.path());
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{mode}: {stdout}{}", text(&out.stderr));
        assert!(stdout.contains(&format!("{n} iterations on local ({mode}")), "{stdout}");
        assert!(stdout.contains("time to interactive") && stdout.contains("command round trip"), "{stdout}");
        assert_eq!(
            (r["mode"].as_str(), r["succeeded"].as_u64(), r["failed"].as_u64()),
            (Some(mode), Some(n as u64), Some(0))
        );
        assert_eq!(r["success_rate"], 1.0);
        for key in ["time_to_interactive_ms", "command_round_trip_ms"] {
            let samples = r["samples"][key].as_array().unwrap();
            assert_eq!(samples.len(), n, "{key}: one sample per iteration");
            assert!(samples.iter().all(|v| v.as_f64().unwrap() > 0.0), "{key}: {samples:?}");
            let s = &r[key];
            let f = |k: &str| s[k].as_f64().unwrap();
            assert!(
                f("min") <= f("p50") && f("p50") <= f("p95") && f("p95") <= f("p99") && f("p99") <= f("max"),
                "{s}"
            );
        }
        // The first command comes after the create, so interactive is never sooner than a round trip's floor.
        assert!(r["time_to_interactive_ms"]["min"].as_f64().unwrap() > 0.0);
        assert_eq!(sandboxes_left(tmp.path()), Vec::<String>::new(), "{mode}: every sandbox destroyed");
    }
}

#[test]
fn failed_iterations_and_a_p95_over_budget_fail_the_run_saying_why() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, r) = bench(&["-n", "3", "--template", "nosuch"], tmp.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("failed 3 ×: create: unknown template `nosuch`"), "{stdout}");
    assert!(stderr.contains("FAILED: 3 of 3 iterations did not succeed"), "{stderr}");
    assert_eq!((r["succeeded"].as_u64(), r["success_rate"].as_f64()), (Some(0), Some(0.0)));
    assert!(r["time_to_interactive_ms"].is_null(), "no figures without a success: {r}");
    // No machine here creates a sandbox and runs a command in a millisecond (the floor is ~5 ms).
    let (out, _) = bench(&["-n", "2", "--max-p95", "1ms"], tmp.path());
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is over --max-p95"), "{stderr}");
    let out = cmd(&["bench", "-n", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(sandboxes_left(tmp.path()), Vec::<String>::new());
}

/// A scenario holds a platform to a budget: the `bench` step's figures, asserted after it. A
/// budget no machine meets fails with the figure named.
#[test]
fn the_bench_step_gives_a_scenario_its_figures_to_assert() {
    let tmp = tempfile::tempdir().unwrap();
    let scenario = tmp.path().join("budget.yaml");
    std::fs::write(
        &scenario,
        "name: budget\nsteps:\n  - bench: { iterations: 4, mode: burst }\n    id: speed\n  \
         - assert: { that: \"steps.speed.success_rate == 1 and steps.speed.succeeded == 4 and steps.speed.tti.p50 > 0 \
         and steps.speed.tti.p50 <= steps.speed.tti.p95 and steps.speed.round_trip.p95 > 0\" }\n  \
         - assert: { that: \"steps.speed.tti.p95 < 0.001\", message: \"p95 {{ steps.speed.tti.p95 }} ms is over the budget\" }\n",
    )
    .unwrap();
    let out = cmd(&["--no-progress", scenario.to_str().unwrap()])
        .env("SCENARIO_RUN_STATE_DIR", tmp.path().join("state"))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    // The first assertion passed (the figures are there and ordered); the impossible budget failed, naming the figure.
    assert!(stdout.contains("budget.yaml:6"), "{stdout}");
    assert!(regex::Regex::new(r"p95 [0-9.]+ ms is over the budget").unwrap().is_match(&stdout), "{stdout}");
    assert_eq!(sandboxes_left(tmp.path()), Vec::<String>::new());
}

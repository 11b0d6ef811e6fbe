//! Selection (-k, -t, --shard, --list), --fail-fast, scenario timeouts and provider requirements.

mod common;

use common::*;

fn write(dir: &std::path::Path, name: &str, body: &str) {
    std::fs::write(dir.join(name), body).unwrap();
}

fn listed(args: &[&str]) -> Vec<String> {
    let out = run(args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    text(&out.stdout).lines().map(|l| l.split("  ").next().unwrap().to_string()).collect()
}

#[test]
fn name_and_tag_expressions_and_shards_select() {
    let all = listed(&["--list"]);
    assert!(all.len() >= 25, "{all:?}");
    let k = listed(&["--list", "-k", "files and not binary"]);
    assert!(!k.is_empty() && k.iter().all(|n| n.contains("files") && !n.contains("binary")), "{k:?}");
    let t = listed(&["--list", "-t", "network and not (isolation or egress)"]);
    assert_eq!(t, ["network JSON API with POST", "network http server in the sandbox"]);
    // Shards partition the run, and the same shard is the same set every time.
    let mut union: Vec<String> = (1..=3).flat_map(|k| listed(&["--list", "--shard", &format!("{k}/3")])).collect();
    union.sort();
    let mut sorted = all.clone();
    sorted.sort();
    assert_eq!(union, sorted);
    assert_eq!(listed(&["--list", "--shard", "2/3"]), listed(&["--list", "--shard", "2/3"]));
}

#[test]
fn fail_fast_stops_starting_new_scenarios() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        "name: a first fails\nsteps:\n  - create: base\n  - exec: { cmd: 'false', exit_code: 0 }\n",
    );
    for i in 0..4 {
        write(
            tmp.path(),
            &format!("b{i}.yaml"),
            &format!("name: b{i} later\nsteps:\n  - create: base\n  - exec: 'true'\n"),
        );
    }
    let report = tmp.path().join("r.json");
    let out = run(&[
        tmp.path().to_str().unwrap(),
        "-j",
        "1",
        "--fail-fast",
        "--no-progress",
        "--json",
        report.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    assert_eq!(r["totals"]["failed"], 1);
    assert_eq!(r["totals"]["skipped"], 4, "{}", text(&out.stdout));
    assert!(r["results"][1]["reason"].as_str().unwrap().contains("-x stopped the run"), "{r}");
}

#[test]
fn scenario_timeout_fails_then_finally_and_cleanup_run() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "t.yaml",
        "name: slow scenario\ntimeout: 1s\nsteps:\n  - create: base\n  - exec: sleep 30\nfinally:\n  - exec: echo cleanup\n",
    );
    let report = tmp.path().join("r.json");
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let res = &r["results"][0];
    assert_eq!(res["outcome"], "failed");
    assert!(
        res["reason"].as_str().unwrap().contains("deadline") || res["reason"].as_str().unwrap().contains("timed out"),
        "{res}"
    );
    let steps = res["steps"].as_array().unwrap();
    assert!(steps.iter().any(|s| s["phase"] == "finally" && s["outputs"]["stdout"] == "cleanup\n"));
    assert!(steps.iter().any(|s| s["phase"] == "cleanup" && s["status"] == "passed"));
    assert_eq!(r["provider_stats"]["live"], 0);
}

#[test]
fn provider_requirements_skip_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "p.yaml",
        "name: cloud only\nrequires:\n  providers: [e2b, alicloud]\nsteps:\n  - create: base\n",
    );
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("requires provider e2b or alicloud (running on local)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn matrix_has_one_entry_per_scenario_folder() {
    let out = run(&["matrix", "--emit", "github"]);
    assert!(out.status.success());
    let m: serde_json::Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    let areas: Vec<&str> = m["include"].as_array().unwrap().iter().map(|e| e["area"].as_str().unwrap()).collect();
    let mut dirs: Vec<String> = std::fs::read_dir(root().join("scenarios"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    assert_eq!(areas, dirs);
    let cloud = run(&["matrix", "--providers", "alicloud,e2b"]);
    let m: serde_json::Value = serde_json::from_str(&text(&cloud.stdout)).unwrap();
    assert_eq!(m["include"].as_array().unwrap().len(), dirs.len() * 2);
    assert_eq!(m["include"][0]["provider"], "alicloud");
}

#[test]
fn expect_error_fails_when_the_step_succeeds_or_the_error_differs() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        "name: should have failed\nsteps:\n  - create: base\n  - exec: 'true'\n    expect_error: true\n",
    );
    write(
        tmp.path(),
        "b.yaml",
        "name: wrong error\nsteps:\n  - create: base\n  - read-file: /tmp/none\n    expect_error: { contains: permission denied }\n",
    );
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress", "-j", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let s = text(&out.stdout);
    assert!(s.contains("expected this step to fail, but it succeeded"), "{s}");
    assert!(s.contains("failed as expected, but the error does not match"), "{s}");
}

/// Issue 27 item 5: `-k` matched names case-sensitively, so `-k TTL` found "lifecycle TTL
/// expiry" but `-k ttl` found nothing (and failed the run). Like pytest's `-k`, case is ignored.
#[test]
fn k_ignores_letter_case() {
    let lower = listed(&["--list", "-k", "ttl or json"]);
    assert_eq!(lower, ["lifecycle TTL expiry", "network JSON API with POST"]);
    assert_eq!(listed(&["--list", "-k", "TTL OR Json"]), lower, "and, or, not in any case too");
    assert_eq!(listed(&["--list", "-k", "Files AND NOT Binary"]), listed(&["--list", "-k", "files and not binary"]));
}

/// Issue 27 item 5: `-k 'exit codes'` (words with a space, no `and`/`or`) was only "unexpected
/// `codes`". It says how to write what was meant, and a quoted phrase matches as one piece.
#[test]
fn k_with_spaces_and_no_operator_gets_a_hint_and_phrases_can_be_quoted() {
    let out = run(&["--list", "-k", "exit codes"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "error: -k: `exit codes` is two words with no `and` or `or` between them\n  \
         = help: `-k 'exit and codes'` selects names with both words; `-k '\"exit codes\"'` selects names with the phrase\n"
    );
    assert_eq!(listed(&["--list", "-k", "\"exit codes\""]), ["commands exit codes and streams"]);
    assert_eq!(
        listed(&["--list", "-k", "'Exit Codes' or 'ttl expiry'"]),
        ["commands exit codes and streams", "lifecycle TTL expiry"]
    );
    let tags = run(&["--list", "-t", "commands slow"]);
    assert_eq!(tags.status.code(), Some(2));
    assert!(text(&tags.stderr).contains("= help: `-t 'commands and slow'` selects"), "{}", text(&tags.stderr));
}

/// Issue 27 item 5: `-x` stops at the first failure as pytest's does: nothing new starts, and
/// what is running is stopped at once (its current step interrupted, its `finally` run under
/// the grace period, its sandboxes destroyed) and reported SKIPPED with why, not ERROR.
#[test]
fn x_stops_at_the_first_failure_and_stops_running_scenarios_with_cleanup() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        "a.yaml",
        "name: a fails soon\nsteps:\n  - create: base\n  - sleep: 1s\n  - exec: { cmd: 'false', exit_code: 0 }\n",
    );
    write(
        tmp.path(),
        "b.yaml",
        "name: b runs long\nsteps:\n  - create: base\n  - exec: sleep 40\nfinally:\n  - exec: echo b cleaned up\n",
    );
    write(tmp.path(), "c.yaml", "name: c never starts\nsteps:\n  - create: base\n  - exec: 'true'\n");
    let report = tmp.path().join("r.json");
    let started = std::time::Instant::now();
    let out =
        run(&[tmp.path().to_str().unwrap(), "-j", "2", "-x", "--no-progress", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "b was stopped, not waited for");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let by_name = |n: &str| r["results"].as_array().unwrap().iter().find(|x| x["name"] == n).unwrap().clone();
    assert_eq!(by_name("a fails soon")["outcome"], "failed");
    let b = by_name("b runs long");
    assert_eq!(b["outcome"], "skipped", "{b}");
    assert_eq!(b["reason"], "stopped by -x: `a fails soon` failed", "{b}");
    let steps = b["steps"].as_array().unwrap();
    assert!(steps.iter().any(|s| s["phase"] == "finally" && s["outputs"]["stdout"] == "b cleaned up\n"), "{b}");
    assert!(steps.iter().any(|s| s["phase"] == "cleanup" && s["status"] == "passed"), "{b}");
    let c = by_name("c never starts");
    assert_eq!(c["outcome"], "skipped");
    assert_eq!(c["reason"], "not run: -x stopped the run after `a fails soon` failed");
    assert_eq!(r["interrupted"], false);
    assert_eq!(r["provider_stats"]["live"], 0);
    // The failure, then why the run stops, then the others.
    let stdout = text(&out.stdout);
    let want = [
        "FAILED  a fails soon  ",
        "stopping after -x: `a fails soon` failed; 1 running scenario is stopped (its finally and cleanup still run)",
        "SKIPPED c never starts  ",
        "SKIPPED b runs long  ",
    ];
    for (line, want) in stdout.lines().zip(want) {
        assert!(line.starts_with(want), "{line:?} is not {want:?}:\n{stdout}");
    }
}

/// Issue 37 item 7: C's `&&` and `!` get the expression written with words, and a tag no
/// loaded scenario has gets a did-you-mean from the tags they do have.
#[test]
fn tag_expressions_get_hints_that_are_right() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "a.yaml", "name: a\ntags: [fast, egress]\nsteps:\n  - set: { x: 1 }\n");
    write(tmp.path(), "b.yaml", "name: b\ntags: [fast, commands]\nsteps:\n  - set: { x: 1 }\n");
    let dir = tmp.path().to_str().unwrap();
    let out = run(&[dir, "--list", "-t", "fast && !egress"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("= help: write `-t 'fast and not egress'`"), "{err}");
    assert_eq!(listed(&[dir, "--list", "-t", "fast and not egress"]), ["b"]);

    let out = run(&[dir, "--list", "-t", "comands"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("= help: unknown tag `comands`: did you mean `commands`?"), "{err}");
    // Something selected, a word no scenario has: a warning, and the run goes on.
    let out = run(&[dir, "--list", "-t", "fast or egres"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("warning: -t: unknown tag `egres`: did you mean `egress`?"),
        "{}",
        text(&out.stderr)
    );
}

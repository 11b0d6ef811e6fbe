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
    let t = listed(&["--list", "-t", "network and not isolation"]);
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
    assert!(r["results"][1]["reason"].as_str().unwrap().contains("--fail-fast"));
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

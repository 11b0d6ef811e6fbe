//! The `host` step through the real binary: a command on the runner's machine with exec's
//! outputs and matchers, env/cwd/stdin, a timeout and Ctrl-C that leave no process behind
//! (checked by pid), secrets masked in everything it prints; and the official E2B Python SDK
//! driven by it against a real `scenario-run serve`, including the session-end sweep of a
//! sandbox the SDK left behind.

mod common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::serve::{e2b_cmd, live, serve};
use common::*;

const FIX: &str = "tests/fixtures/host";

fn fixture(name: &str) -> String {
    format!("{FIX}/{name}")
}

/// A pid is running (not gone and not a zombie waiting to be reaped).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && !stat.contains(") Z ")
}

/// Whether `pid` has ended within a few seconds (a killed process takes a moment to die).
fn gone_soon(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The pids a fixture command wrote to `$PIDS` (its background child, then its shell).
fn pids(path: &Path) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let pids: Vec<i32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        if pids.len() == 2 || Instant::now() > deadline {
            return pids;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn report_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn host_outputs_matchers_env_cwd_and_stdin() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = cmd(&["--no-progress", &fixture("outputs.yaml"), "--json", report.path().to_str().unwrap()])
        .env("FROM_RUN", "run")
        .env_remove("SCENARIO_RUN_PROVIDER")
        .env_remove("E2E_RUN_TAG")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let steps = step_outputs(report.path(), "host");
    assert_eq!(steps.len(), 5, "{steps:?}");
    let first = &steps[0];
    assert_eq!((first["stdout"].as_str(), first["stderr"].as_str()), (Some("out host\n"), Some("err\n")));
    assert_eq!((first["exit_code"].as_i64(), first["timed_out"].as_bool()), (Some(3), Some(false)));
    // The pid is a real process of this machine that has ended.
    let pid = first["pid"].as_i64().unwrap() as i32;
    assert!(pid > 1 && gone_soon(pid), "pid {pid}");
}

#[test]
fn a_failing_matcher_on_host_output_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("wrong.yaml");
    std::fs::write(&f, "name: wrong\nsteps:\n  - host: echo actual\n  - assert-stdout: \"expected\\n\"\n").unwrap();
    let out = run(&["--no-progress", f.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("expected \"expected\\n\", found \"actual\\n\""), "{stdout}");
}

#[test]
fn a_timed_out_host_command_and_its_children_are_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let report = dir.path().join("r.json");
    let t0 = Instant::now();
    let out = cmd(&["--no-progress", &fixture("timeout.yaml"), "--json", report.to_str().unwrap()])
        .env("PIDS", &pid_file)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(t0.elapsed() < Duration::from_secs(60), "the timeout ended it: {:?}", t0.elapsed());
    assert!(stdout.contains("command timed out after 1.00s"), "{stdout}");
    let o = &step_outputs(&report, "host")[0];
    assert_eq!(
        (o["timed_out"].as_bool(), o["signal"].as_i64(), o["stdout"].as_str()),
        (Some(true), Some(9), Some("started\n"))
    );
    let p = pids(&pid_file);
    assert_eq!(p.len(), 2, "the command wrote its pids");
    assert_eq!(p[1] as i64, o["pid"].as_i64().unwrap(), "the step's pid is the shell's");
    for pid in p {
        assert!(gone_soon(pid), "pid {pid} outlived its timed-out step");
    }
}

#[test]
fn ctrl_c_kills_a_running_host_command_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let mut child: Child = cmd(&["--no-progress", &fixture("interrupted.yaml")])
        .env("PIDS", &pid_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let p = pids(&pid_file);
    assert_eq!(p.len(), 2, "the command started");
    assert!(p.iter().all(|&pid| alive(pid)), "both run before Ctrl-C");
    // SAFETY: signalling the binary we spawned, by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the run did not end after Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(130));
    for pid in p {
        assert!(gone_soon(pid), "pid {pid} outlived the interrupted run");
    }
}

#[test]
fn a_secret_in_host_output_is_masked_everywhere() {
    let secret = "hst-7f3a9c1e5b2d4f60";
    let dir = tempfile::tempdir().unwrap();
    let (json, html, evidence) = (dir.path().join("r.json"), dir.path().join("r.html"), dir.path().join("ev"));
    let out = cmd(&[
        "--no-progress",
        "-v",
        &fixture("secret.yaml"),
        "--json",
        json.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--evidence",
        evidence.to_str().unwrap(),
    ])
    .env("HOST_TEST_TOKEN", secret)
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // The last assert fails on purpose, so the output is shown as the failure's `found`.
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let o = &step_outputs(&json, "host")[0];
    assert_eq!(o["stdout"].as_str().unwrap().lines().next(), Some("plain ***"), "{o}");
    assert_eq!(o["stderr"], "err ***\n");
    let b64 = "aHN0LTdmM2E5YzFlNWIyZDRmNjA=";
    let mut all = format!("{stdout}{stderr}");
    for p in [&json, &html] {
        all.push_str(&std::fs::read_to_string(p).unwrap());
    }
    for e in std::fs::read_dir(&evidence).unwrap() {
        all.push_str(&std::fs::read_to_string(e.unwrap().path()).unwrap_or_default());
    }
    assert!(all.contains("plain ***"), "the host output is in the reports");
    assert!(!all.contains(secret) && !all.contains(b64), "the secret leaked");
    assert_eq!(report_json(&json)["results"][0]["outcome"], "failed");
}

#[test]
fn bad_host_input_gets_located_diagnostics() {
    let out = run(&["check", &fixture("bad.yaml")]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    for want in [
        "unknown field `cwdd` for `host`\n --> tests/fixtures/host/bad.yaml:4:27",
        "did you mean `cwd`?",
        "`env` must be a mapping of strings, found a list\n --> tests/fixtures/host/bad.yaml:5:32",
        "bad duration for `timeout`: invalid duration `soon`\n --> tests/fixtures/host/bad.yaml:6:36",
        "`exit_code` must be an integer from -255 to 255, found a string \"zero\"\n --> tests/fixtures/host/bad.yaml:7:38",
        "4 problems in 1 file",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
}

// ---- the E2B SDK against a real serve ------------------------------------------------------

#[test]
fn the_official_python_sdk_scenario_passes_against_serve_and_skips_on_local() {
    let srv = serve();
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = e2b_cmd(&srv, &["scenarios/official/e2b-python-sdk.yaml", "--json", report.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let (passed, skipped) = passed_and_skipped(report.path());
    assert_eq!((passed.len(), skipped.len()), (1, 0), "{stdout}");
    // What the SDK saw, from its own JSON line: a real sandbox of serve, tagged with the run.
    let sdk = &step_outputs(report.path(), "host")[1];
    let seen: serde_json::Value = serde_json::from_str(sdk["stdout"].as_str().unwrap()).unwrap();
    let run_id = report_json(report.path())["run_id"].as_str().unwrap().to_string();
    assert_eq!(seen["metadata"]["e2e"], run_id.as_str(), "{seen}");
    assert_eq!(seen["stdout"], "sdk says yes\nuser\n");
    assert!(seen["sdk"].as_str().unwrap().starts_with('2'), "the official SDK ran: {seen}");
    let all = format!("{stdout}{}{}", text(&out.stderr), std::fs::read_to_string(report.path()).unwrap());
    assert!(!all.contains(&srv.key), "the key leaked");
    let doc = report_json(report.path());
    let args = &doc["results"][0]["steps"].as_array().unwrap().iter().find(|s| s["id"] == "sdk").unwrap()["args"];
    assert_eq!(args["env"]["E2B_API_KEY"], "***", "provider.env passed the key, masked: {args}");
    assert_eq!(args["env"]["E2E_RUN_TAG"], format!("e2e={run_id}"), "and the run tag: {args}");
    assert_eq!(live(&srv), 0, "the SDK killed its sandbox");

    // Without an E2B endpoint (local) it skips, saying why.
    let local = tempfile::NamedTempFile::new().unwrap();
    let out =
        run(&["--no-progress", "scenarios/official/e2b-python-sdk.yaml", "--json", local.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let (passed, skipped) = passed_and_skipped(local.path());
    assert!(passed.is_empty());
    assert_eq!(
        skipped,
        [("official e2b python sdk".to_string(), "requires provider e2b or alicloud (running on local)".to_string())]
    );
}

#[test]
fn a_sandbox_the_sdk_left_behind_is_swept_by_the_run_tag() {
    let srv = serve();
    let out = e2b_cmd(&srv, &[&fixture("sdk-left-behind.yaml")]).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("swept 1 sandbox(es) tagged e2e="), "{stderr}");
    assert_eq!(live(&srv), 0, "nothing is left on serve");
}

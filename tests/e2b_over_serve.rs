//! The real proof of the E2B client: the shipped scenarios, run with `--provider e2b` and
//! `--provider alicloud` against `scenario-run serve` (the real server over real local
//! sandboxes), must give the same results as on the local provider.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Server {
    child: Child,
    port: u16,
    key: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling the server we spawned, by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve() -> Server {
    serve_with(&[])
}

fn serve_with(extra: &[&str]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let key = format!("e2b_{:040x}", u128::from(std::process::id()) * 7919 + u128::from(port));
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--listen", &listen, "--api-key", &key];
    args.extend_from_slice(extra);
    let mut child = cmd(&args).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "server did not start: {line:?}");
    Server { child, port, key }
}

fn e2b_run(srv: &Server, args: &[&str]) -> std::process::Output {
    let url = format!("http://127.0.0.1:{}", srv.port);
    cmd(args)
        .env("E2B_API_KEY", &srv.key)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_DOMAIN", format!("localhost:{}", srv.port))
        .output()
        .unwrap()
}

#[test]
fn rate_limited_control_plane_is_retried_even_for_create() {
    // Every third control-plane request is a 429 with Retry-After: 1. A 429 is a refusal, so
    // creates are repeated too, and every scenario still passes.
    let srv = serve_with(&["--fault-429-every", "3", "--fault-control-plane-only"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = e2b_run(
        &srv,
        &[
            "--provider",
            "e2b",
            "--no-progress",
            "-j",
            "4",
            "scenarios/lifecycle",
            "--json",
            report.path().to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(summary_line(&stdout).contains(" 0 failed, 0 error, "), "{stdout}");
}

#[test]
fn unavailable_control_plane_gives_clear_errors_and_no_blind_create_repeats() {
    // Every second control-plane request is a 503. Reads are retried; a create that got a
    // 503 is not repeated (it may have been made), so its scenario is an ERROR that says why.
    let srv = serve_with(&["--fault-5xx-every", "2", "--fault-control-plane-only"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = e2b_run(
        &srv,
        &[
            "--provider",
            "e2b",
            "--no-progress",
            "-j",
            "1",
            "scenarios/commands",
            "--json",
            report.path().to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(matches!(out.status.code(), Some(0) | Some(4)), "no failure, no crash: {stdout}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.path()).unwrap()).unwrap();
    let mut errors = 0;
    for res in r["results"].as_array().unwrap() {
        match res["outcome"].as_str().unwrap() {
            "passed" => {}
            "error" => {
                errors += 1;
                let why = res["reason"].as_str().unwrap();
                assert!(why.contains("503") || why.contains("unavailable"), "{why}");
            }
            other => panic!("unexpected outcome {other}: {res}"),
        }
    }
    assert!(errors > 0, "with every second request failing some create must have been refused: {stdout}");
    assert!(errors < r["results"].as_array().unwrap().len(), "retried reads let some scenarios pass: {stdout}");
}

fn summary_line(stdout: &str) -> String {
    stdout.lines().rev().find(|l| l.contains(" passed, ")).unwrap_or("").to_string()
}

#[test]
fn shipped_scenarios_pass_over_the_e2b_protocol() {
    let srv = serve();
    let url = format!("http://127.0.0.1:{}", srv.port);
    let out = cmd(&["--provider", "e2b", "--no-progress", "-j", "5"])
        .env("E2B_API_KEY", &srv.key)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_DOMAIN", format!("localhost:{}", srv.port))
        .env_remove("SCENARIO_RUN_DEMO_API_KEY")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let local = run(&["--no-progress", "--list"]);
    let cases = text(&local.stdout).lines().count();
    // Template scenarios need `build` (a local-provider capability) or credentials: SKIPPED.
    let templates = text(&run(&["scenarios/templates", "--no-progress", "--list"]).stdout).lines().count();
    let line = summary_line(&stdout);
    let want = format!("{} passed, 0 failed, 0 error, {} skipped, 1 xfail", cases - 2 - templates, 1 + templates);
    assert!(line.starts_with(&want), "{line}");
    assert!(!stdout.contains(&srv.key), "the key leaked");
}

#[test]
fn alicloud_preset_uses_v1_routes_and_bearer_auth() {
    let srv = serve();
    let url = format!("http://127.0.0.1:{}", srv.port);
    let out = cmd(&["--provider", "alicloud", "--no-progress", "scenarios/commands", "scenarios/files"])
        .env("ABX_SANDBOX_API_KEY", &srv.key)
        .env("ABX_SANDBOX_BASE_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("ABX_SANDBOX_DOMAIN", format!("localhost:{}", srv.port))
        .env_remove("E2B_API_KEY")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    assert!(summary_line(&stdout).contains(" 0 failed, 0 error, "), "{stdout}");
}

#[test]
fn a_wrong_key_is_an_error_saying_authentication_failed() {
    let srv = serve();
    let url = format!("http://127.0.0.1:{}", srv.port);
    let out = cmd(&["--provider", "e2b", "--no-progress", "scenarios/commands/stdin.yaml"])
        .env("E2B_API_KEY", "e2b_0000000000000000000000000000000000000000")
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_DOMAIN", format!("localhost:{}", srv.port))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    assert!(stdout.contains("ERROR") && stdout.contains("authentication failed"), "{stdout}");
}

#[test]
fn without_a_key_cloud_scenarios_are_skipped_with_the_variable_named() {
    let out = cmd(&["--provider", "alicloud", "--no-progress", "scenarios/commands/stdin.yaml"])
        .env_remove("ABX_SANDBOX_API_KEY")
        .env_remove("E2B_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("missing credentials [ABX_SANDBOX_API_KEY]"), "{}", text(&out.stdout));
}

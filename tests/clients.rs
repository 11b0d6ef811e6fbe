//! The real clients users call, driven from scenarios against a real `scenario-run serve`:
//! the product's own client (PyPI `agent-sandbox-client`: its `Sandbox` API and the `@sandbox`
//! decorator) on both presets, and the E2B CLI (npm `@e2b/cli`). Each passes, a failing client
//! call fails its scenario, what a client leaves behind is swept by the run tag, and where a
//! client cannot run (local provider, no npm, no reachable envd) the scenario is SKIPPED with
//! the reason. Also the `skip` step those scenarios use.

mod common;

use std::path::Path;
use std::process::Output;

use common::serve::{alicloud_cmd, e2b_cmd, live, serve, serve_with, Server};
use common::*;

const CLIENT: &str = "scenarios/declarative/agent-sandbox-client.yaml";
const CLI: &str = "scenarios/official/e2b-cli.yaml";

fn report_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The outputs of the step with `id` in the first result.
fn step_by_id(report: &Path, id: &str) -> serde_json::Value {
    let doc = report_json(report);
    let steps = doc["results"][0]["steps"].as_array().unwrap();
    steps.iter().find(|s| s["id"] == id).unwrap_or_else(|| panic!("no step {id}")).clone()
}

/// Runs `cmd` with a JSON report: (output, report file).
fn with_report(mut c: std::process::Command, report: &Path) -> Output {
    c.args(["--json", report.to_str().unwrap()]).output().unwrap()
}

fn outcome(report: &Path) -> (String, String) {
    let r = &report_json(report)["results"][0];
    (r["outcome"].as_str().unwrap().to_string(), r["reason"].as_str().unwrap_or_default().to_string())
}

fn assert_no_key(srv: &Server, out: &Output, report: &Path) {
    let all = format!("{}{}{}", text(&out.stdout), text(&out.stderr), std::fs::read_to_string(report).unwrap());
    assert!(!all.contains(&srv.key), "the key leaked");
}

/// What the product client's driver printed, checked against the run: its sandbox tagged with
/// the run, the decorator's result and its own sandbox destroyed.
fn check_client_run(srv: &Server, out: &Output, report: &Path) {
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    assert_eq!(passed_and_skipped(report), (vec!["declarative agent-sandbox-client".to_string()], vec![]), "{stdout}");
    let run_id = report_json(report)["run_id"].as_str().unwrap().to_string();
    let client = step_by_id(report, "client");
    let made: serde_json::Value = serde_json::from_str(client["outputs"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(made["metadata"]["e2e"], run_id.as_str(), "{made}");
    assert!(made["client"].as_str().unwrap().starts_with("0."), "the product's client ran: {made}");
    assert_eq!(client["args"]["env"]["E2E_RUN_TAG"], format!("e2e={run_id}"));
    let remote: serde_json::Value =
        serde_json::from_str(step_by_id(report, "remote")["outputs"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(remote["result"]["spread"], 4, "{remote}");
    assert_eq!(remote["own"]["product"], 42, "{remote}");
    let own = remote["own_ids"].as_array().unwrap();
    assert_eq!(own.len(), 1, "{remote}");
    assert_ne!(own[0], made["id"], "@sandbox made a sandbox of its own");
    // sandbox.run reached the agent-sandbox-server of the sandbox it made over https.
    let reg: serde_json::Value =
        serde_json::from_str(step_by_id(report, "registered")["outputs"]["stdout"].as_str().unwrap()).unwrap();
    assert_eq!(reg["result"]["stdout"], "42 user\n", "{reg}");
    assert_eq!(reg["gone"], true, "{reg}");
    assert_no_key(srv, out, report);
    assert_eq!(live(srv), 0, "every sandbox the client made is gone");
}

#[test]
fn the_product_client_scenario_passes_against_serve_on_both_presets() {
    // E2B's default: ports public (sandbox.run sends no token to the server's port).
    let srv = serve_with(&["--allow-public-traffic"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = with_report(alicloud_cmd(&srv, &[CLIENT]), report.path());
    check_client_run(&srv, &out, report.path());
    // provider.env handed the client its ABX_* settings, the key masked.
    let env = &step_by_id(report.path(), "client")["args"]["env"];
    assert_eq!(env["ABX_SANDBOX_API_KEY"], "***", "{env}");
    assert_eq!(env["ABX_SANDBOX_BASE_URL"], format!("http://127.0.0.1:{}", srv.port), "{env}");

    let report = tempfile::NamedTempFile::new().unwrap();
    let out = with_report(e2b_cmd(&srv, &[CLIENT]), report.path());
    check_client_run(&srv, &out, report.path());
}

#[test]
fn a_failing_product_client_call_fails_the_scenario_and_its_sandbox_is_swept() {
    // One sandbox at a time: the client's own Sandbox.create gets it, so @sandbox's create is
    // refused (429, the client's QuotaExceededError) and the driver exits non-zero.
    let srv = serve_with(&["--max-sandboxes", "1"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = with_report(e2b_cmd(&srv, &[CLIENT]), report.path());
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let (outcome, reason) = outcome(report.path());
    assert_eq!(outcome, "failed", "{stdout}");
    assert!(reason.contains("expected exit code 0"), "{reason}");
    let remote = step_by_id(report.path(), "remote");
    assert!(remote["outputs"]["stderr"].as_str().unwrap().contains("QuotaExceededError"), "{remote}");
    // The client's first sandbox was left running; the run tag let the sweep find it.
    assert!(stderr.contains("swept 1 sandbox(es) tagged e2e="), "{stderr}");
    assert_eq!(live(&srv), 0, "nothing is left on serve");
}

#[test]
fn a_sandbox_the_product_client_left_behind_is_swept_by_the_run_tag() {
    let srv = serve();
    let out = e2b_cmd(&srv, &["tests/fixtures/clients/client-left-behind.yaml"]).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("swept 1 sandbox(es) tagged e2e="), "{stderr}");
    assert_eq!(live(&srv), 0, "nothing is left on serve");
}

#[test]
fn the_e2b_cli_scenario_passes_against_serve() {
    let srv = serve();
    for preset in ["e2b", "alicloud"] {
        let report = tempfile::NamedTempFile::new().unwrap();
        let c = if preset == "e2b" { e2b_cmd(&srv, &[CLI]) } else { alicloud_cmd(&srv, &[CLI]) };
        let out = with_report(c, report.path());
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{preset}: {stdout}\n{}", text(&out.stderr));
        assert_eq!(passed_and_skipped(report.path()), (vec!["official e2b cli".to_string()], vec![]), "{stdout}");
        // What the CLI printed: its exec's streams and exit code, its sandbox's id.
        let exec = &step_by_id(report.path(), "exec")["outputs"];
        assert_eq!(exec["stdout"], "cli says yes in /tmp as user\n", "{exec}");
        assert_eq!(exec["exit_code"], 3, "{exec}");
        let made = step_by_id(report.path(), "made")["outputs"]["stdout"].as_str().unwrap().trim().to_string();
        let listed = step_by_id(report.path(), "listed")["outputs"]["stdout"].as_str().unwrap().to_string();
        assert!(!made.is_empty() && !listed.contains(&made), "the CLI's sandbox is not tagged, ours is: {listed}");
        assert_no_key(&srv, &out, report.path());
        assert_eq!(live(&srv), 0, "{preset}: the CLI killed its sandbox, cleanup ours");
    }
}

#[test]
fn a_failing_cli_call_fails_the_scenario() {
    // scenario-run's own sandbox takes the only place, so the CLI's create is refused.
    let srv = serve_with(&["--max-sandboxes", "1"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = with_report(e2b_cmd(&srv, &[CLI]), report.path());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(outcome(report.path()).0, "failed", "{stdout}");
    let made = step_by_id(report.path(), "made");
    assert_eq!(made["status"], "failed", "{made}");
    assert_ne!(made["outputs"]["exit_code"], 0, "{made}");
    assert_eq!(live(&srv), 0, "nothing is left on serve");
}

#[test]
fn the_cli_scenario_skips_saying_why_when_it_cannot_reach_envd_or_install() {
    let srv = serve();
    // Without E2B_SANDBOX_URL the CLI could reach envd only over https at <port>-<id>.<domain>.
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut c = e2b_cmd(&srv, &[CLI]);
    c.env_remove("E2B_SANDBOX_URL");
    let out = with_report(c, report.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let (outcome_, reason) = outcome(report.path());
    assert_eq!(outcome_, "skipped");
    assert!(reason.contains("plain HTTP without E2B_SANDBOX_URL"), "{reason}");
    // Without npm there is nothing to install it with: a PATH with bash alone.
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/bin/bash", bin.path().join("bash")).unwrap();
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut c = e2b_cmd(&srv, &[CLI]);
    c.env("PATH", bin.path()).env_remove("E2B_CLI");
    let out = with_report(c, report.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let (outcome_, reason) = outcome(report.path());
    assert_eq!(outcome_, "skipped");
    assert!(reason.starts_with("npm and node are needed to install the E2B CLI"), "{reason}");
    assert_eq!(live(&srv), 0);
}

#[test]
fn client_scenarios_skip_on_local_with_the_reason() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = run(&["--no-progress", CLIENT, CLI, "--json", report.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let (passed, skipped) = passed_and_skipped(report.path());
    assert!(passed.is_empty());
    let why = "requires provider e2b or alicloud (running on local)".to_string();
    assert_eq!(
        skipped,
        [("declarative agent-sandbox-client".to_string(), why.clone()), ("official e2b cli".to_string(), why)]
    );
}

#[test]
fn a_skip_step_ends_the_scenario_skipped_and_finally_still_runs() {
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = run(&["--no-progress", "tests/fixtures/clients/skip.yaml", "--json", report.path().to_str().unwrap()]);
    let stdout = text(&out.stdout);
    // The failure in `finally` fails the run; the rest is as each scenario says.
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let doc = report_json(report.path());
    let by_name = |name: &str| {
        doc["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
            .clone()
    };
    let skipped = by_name("skip in setup");
    assert_eq!(
        (skipped["outcome"].as_str(), skipped["reason"].as_str()),
        (Some("skipped"), Some("the probe says this machine cannot run it"))
    );
    let steps: Vec<(String, String, String)> = skipped["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["phase"].as_str().unwrap().into(),
                s["status"].as_str().unwrap().into(),
                s["message"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    assert_eq!(
        steps,
        [
            ("setup".into(), "passed".into(), String::new()),
            ("setup".into(), "skipped".into(), "the probe says this machine cannot run it".into()),
            ("steps".into(), "skipped".into(), "skipped: the probe says this machine cannot run it".into()),
            ("finally".into(), "passed".into(), String::new()),
        ]
    );
    assert_eq!(by_name("skip not taken")["outcome"], "passed");
    assert_eq!(by_name("failure in finally wins over skip")["outcome"], "failed");
    assert_eq!(doc["totals"]["skipped"], 1, "{}", doc["totals"]);
}

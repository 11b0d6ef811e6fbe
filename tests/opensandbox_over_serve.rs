//! The `opensandbox` provider's proof (issue 29): the scenario library, run with `--provider
//! opensandbox` against `scenario-run serve` (OpenSandbox's lifecycle API and execd over real
//! local sandboxes), passes, or skips saying which capability the provider lacks, as
//! `e2b_over_serve.rs` runs the same library over the E2B protocol. The only other skips
//! allowed are the scenarios of E2B's own clients (its SDK and CLI, the product's client),
//! which `requires: { providers: [e2b, alicloud] }` keeps to E2B's protocol.

mod common;

use common::serve::{live, opensandbox_cmd, serve_with};
use common::*;

#[test]
fn the_library_passes_or_skips_by_capability_over_opensandbox() {
    let srv = serve_with(&["--allow-public-traffic"]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = opensandbox_cmd(&srv, &["-j", "5", "scenarios", "--json", report.path().to_str().unwrap()])
        .env_remove("E2E_BUILD_OFFICIAL")
        .env_remove("E2E_SERVER_TEMPLATE")
        .env_remove("SCENARIO_RUN_DEMO_API_KEY")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.path()).unwrap()).unwrap();
    let (mut passed, mut by_capability, mut e2b_only) = (0, 0, 0);
    for res in r["results"].as_array().unwrap() {
        let name = res["name"].as_str().unwrap();
        let reason = res["reason"].as_str().unwrap_or("");
        match res["outcome"].as_str().unwrap() {
            "passed" | "xfail" => passed += 1,
            "skipped" if reason.starts_with("provider opensandbox lacks capability [") => by_capability += 1,
            "skipped" if reason == "requires provider e2b or alicloud (running on opensandbox)" => e2b_only += 1,
            other => panic!("{name}: {other} {reason}\n{stdout}"),
        }
    }
    // The library's core runs here, not only its skips.
    assert!(passed >= 30, "{passed} passed, {by_capability} skipped by capability, {e2b_only} E2B-only\n{stdout}");
    assert!(e2b_only <= 5, "{stdout}");
    assert_eq!(live(&srv), 0, "a sandbox outlived its scenario");
    assert!(!stdout.contains(&srv.key), "the key leaked");
}

#[test]
fn a_wrong_key_is_an_error_saying_authentication_failed() {
    let srv = serve_with(&[]);
    let out = opensandbox_cmd(&srv, &["scenarios/commands/stdin.yaml"])
        .env("OPEN_SANDBOX_API_KEY", "not-the-key-of-this-server-at-all-000")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("ERROR") && stdout.contains("authentication failed"), "{stdout}");
}

#[test]
fn without_a_key_scenarios_are_skipped_with_the_variable_named() {
    let out = cmd(&["--provider", "opensandbox", "--no-progress", "scenarios/commands/stdin.yaml"])
        .env_remove("OPEN_SANDBOX_API_KEY")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(stdout.contains("missing credentials [OPEN_SANDBOX_API_KEY]"), "{stdout}");
}

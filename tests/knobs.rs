//! The suite's knobs (docs/reference.md, "The suite"), through the real binary: `E2E_SANDBOX_TTL` is the
//! lifetime of a sandbox whose `create` names none (default 300 s), and `E2E_SERVER_TEMPLATE`
//! (default `python-hello`) picks the template the server scenarios deploy.

mod common;

use common::*;

fn ttl_run(ttl: Option<&str>, expect: &str) {
    let mut c = cmd(&["tests/fixtures/knobs/sandbox-ttl.yaml", "--no-progress"]);
    match ttl {
        Some(v) => c.env("E2E_SANDBOX_TTL", v),
        None => c.env_remove("E2E_SANDBOX_TTL"),
    };
    let out = c.env("EXPECT_TTL", expect).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "E2E_SANDBOX_TTL={ttl:?}: {}{}", text(&out.stdout), text(&out.stderr));
}

#[test]
fn e2e_sandbox_ttl_is_the_default_lifetime() {
    ttl_run(None, "300");
    ttl_run(Some("7"), "7");
    ttl_run(Some("2m"), "120");
    // A value that is not a duration is a usage error, said as such.
    let out = cmd(&["tests/fixtures/knobs/sandbox-ttl.yaml", "--no-progress"])
        .env("E2E_SANDBOX_TTL", "soon")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn e2e_server_template_picks_the_server_template() {
    can_build();
    let state = tempfile::tempdir().unwrap();
    let report = state.path().join("report.json");
    let out = cmd(&[
        "scenarios/server/agent-sandbox-server-routes.yaml",
        "--no-progress",
        "--json",
        report.to_str().unwrap(),
    ])
    .env("E2E_SERVER_TEMPLATE", "node-web")
    .env("SCENARIO_RUN_STATE_DIR", state.path().join("state"))
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let deployed = step_outputs(&report, "deploy");
    assert_eq!(deployed.len(), 1);
    assert_eq!(deployed[0]["template_id"], "node-web", "the routes ran against node-web's server");
}

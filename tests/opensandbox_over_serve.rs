//! The `opensandbox` provider's proof (issue 29): the scenario library, run with `--provider
//! opensandbox` against `scenario-run serve` (OpenSandbox's lifecycle API and execd over real
//! local sandboxes), passes, or skips saying which capability the provider lacks, as
//! `e2b_over_serve.rs` runs the same library over the E2B protocol. The only other skips
//! allowed are the scenarios of E2B's own clients (its SDK and CLI, the product's client),
//! which `requires: { providers: [e2b, alicloud] }` keeps to E2B's protocol.

mod common;

use axum::response::IntoResponse;
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
    assert!(e2b_only <= 7, "{stdout}");
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

/// Issue 36: an exit code is the command's own, whatever its value (`exit 130` is 130, not
/// SIGINT), and a signal death is the signal execd saw (SIGTERM, SIGUSR1), not SIGKILL.
#[test]
fn exit_codes_stay_codes_and_signals_keep_their_number() {
    let srv = serve_with(&[]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codes.yaml");
    std::fs::write(
        &path,
        r#"name: opensandbox exit codes and signals
steps:
  - create: base
  - exec: "exit 130"
    id: code130
  - exec: "exit 143"
    id: code143
  - exec: "kill -TERM $$"
    id: term
  - exec: "kill -USR1 $$"
    id: usr1
"#,
    )
    .unwrap();
    let report = dir.path().join("report.json");
    let out =
        opensandbox_cmd(&srv, &[path.to_str().unwrap(), "-v", "--json", report.to_str().unwrap()]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let steps = doc["results"][0]["steps"].as_array().unwrap();
    let got: Vec<(String, serde_json::Value, serde_json::Value)> = steps
        .iter()
        .filter(|s| s["id"].is_string())
        .map(|s| {
            (s["id"].as_str().unwrap().to_string(), s["outputs"]["exit_code"].clone(), s["outputs"]["signal"].clone())
        })
        .collect();
    let want = [("code130", 130, None), ("code143", 143, None), ("term", -1, Some(15)), ("usr1", -1, Some(10))];
    let want: Vec<(String, serde_json::Value, serde_json::Value)> = want
        .iter()
        .map(|(id, code, sig)| {
            let code = if *code < 0 { serde_json::Value::Null } else { serde_json::json!(code) };
            (id.to_string(), code, sig.map_or(serde_json::Value::Null, |s| serde_json::json!(s)))
        })
        .collect();
    assert_eq!(got, want, "(step, exit_code, signal)");
    assert_eq!(live(&srv), 0);
}

/// The provider in process, against serve at `addr` (serve's own port, or a proxy before it).
fn provider(srv: &common::serve::Server, addr: &str) -> scenario_run::provider::opensandbox::OpenSandboxProvider {
    let env = [
        ("OPEN_SANDBOX_DOMAIN".to_string(), addr.to_string()),
        ("OPEN_SANDBOX_PROTOCOL".to_string(), "http".to_string()),
        ("OPEN_SANDBOX_API_KEY".to_string(), srv.key.clone()),
    ]
    .into_iter()
    .collect();
    scenario_run::provider::opensandbox::OpenSandboxProvider::new(&env).unwrap()
}

/// Issue 36: `disk` is refused (OpenSandbox's resourceLimits have none), never dropped so that
/// a scenario asking for a disk size would pass on the server's default.
#[tokio::test(flavor = "multi_thread")]
async fn a_disk_size_is_refused_not_dropped() {
    use scenario_run::provider::{CreateRequest, ErrorKind, Provider};
    let srv = serve_with(&[]);
    let p = provider(&srv, &format!("127.0.0.1:{}", srv.port));
    let req = CreateRequest { template: "base".into(), disk_mb: Some(2048), ..Default::default() };
    let e = p.create(req).await.expect_err("a disk size was taken and dropped");
    assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
    assert!(e.message.contains("disk"), "{e}");
    assert_eq!(live(&srv), 0);
}

/// Issue 36: a create that fails after the server made the sandbox deletes it at once, not
/// when the run ends. A proxy before serve answers the endpoint lookup (the create's step
/// after the sandbox exists) with an error.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_failing_after_the_server_made_the_sandbox_deletes_it() {
    use scenario_run::provider::{CreateRequest, Provider};
    let srv = serve_with(&[]);
    let upstream = format!("http://127.0.0.1:{}", srv.port);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = scenario_run::net::client_builder().build().unwrap();
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let (http, upstream) = (http.clone(), upstream.clone());
        async move {
            let (parts, body) = req.into_parts();
            let path = parts.uri.path_and_query().map(|p| p.as_str().to_string()).unwrap_or_default();
            if path.contains("/endpoints/") {
                return (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "{\"code\":\"INJECTED\",\"message\":\"no endpoint today\"}",
                )
                    .into_response();
            }
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let mut r = http.request(parts.method.clone(), format!("{upstream}{path}")).body(body.to_vec());
            for (k, v) in &parts.headers {
                if k != "host" {
                    r = r.header(k.as_str(), v.as_bytes());
                }
            }
            let resp = r.send().await.unwrap();
            let status = axum::http::StatusCode::from_u16(resp.status().as_u16()).unwrap();
            (status, resp.bytes().await.unwrap()).into_response()
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    let p = provider(&srv, &addr.to_string());
    let req = CreateRequest { template: "base".into(), timeout_secs: Some(600), ..Default::default() };
    let e = p.create(req).await.expect_err("the injected endpoint error did not fail the create");
    assert!(e.message.contains("no endpoint today"), "{e}");
    assert_eq!(live(&srv), 0, "the sandbox of the failed create still runs");
}

//! The real proof of the E2B client: the shipped scenarios, run with `--provider e2b` and
//! `--provider alicloud` against `scenario-run serve` (the real server over real local
//! sandboxes), must give the same results as on the local provider.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::serve::{alicloud_cmd, e2b_cmd, serve, serve_env, serve_with, Server};
use common::*;

fn e2b_run(srv: &Server, args: &[&str]) -> std::process::Output {
    e2b_cmd(srv, args).output().unwrap()
}

/// `<args> --json <report>` with the e2b preset against `srv`: the output and the report.
fn e2b_run_report(srv: &Server, args: &[&str]) -> (std::process::Output, tempfile::NamedTempFile) {
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = {
        let mut all = args.to_vec();
        all.extend(["--json", report.path().to_str().unwrap()]);
        e2b_run(srv, &all)
    };
    (out, report)
}

#[test]
fn rate_limited_control_plane_is_retried_even_for_create() {
    // Every third control-plane request is a 429 with Retry-After: 1. A 429 is a refusal, so
    // creates are repeated too, and every scenario still passes. One scenario at a time: the
    // retry of a refused request is then the next request, never another third one. With
    // several at once, retries that wake together share the counter, and a create refused four
    // times running (1 in 27 of those refused once) exhausts its retries: a flake of the test's
    // arithmetic, not of the retrying (seen once in CI after the folder grew a scenario).
    let srv = serve_with(&["--fault-429-every", "3", "--fault-control-plane-only"]);
    let (out, _report) = e2b_run_report(&srv, &["-j", "1", "scenarios/lifecycle"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(summary_line(&stdout).contains(" 0 failed, 0 error, "), "{stdout}");
}

#[test]
fn unavailable_control_plane_gives_clear_errors_and_no_blind_create_repeats() {
    // Every second control-plane request is a 503. Reads are retried; a create that got a
    // 503 is not repeated (it may have been made), so its scenario is an ERROR that says why.
    let srv = serve_with(&["--fault-5xx-every", "2", "--fault-control-plane-only"]);
    let (out, report) = e2b_run_report(&srv, &["-j", "1", "scenarios/commands"]);
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
fn the_whole_library_passes_over_the_e2b_protocol() {
    // E2B's default, public ports: the product client's sandbox.run sends no traffic token.
    let srv = serve_with(&["--allow-public-traffic"]);
    let out = e2b_cmd(&srv, &["-j", "5", "scenarios"])
        // serve builds the official code-interpreter-v1 itself, on the first create of it.
        .env_remove("E2E_BUILD_OFFICIAL")
        .env_remove("E2E_SERVER_TEMPLATE")
        .env_remove("SCENARIO_RUN_DEMO_API_KEY")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let count = |tags: &str| listed(&["scenarios", "-t", tags]);
    let (all, agents, pins) = (count("fast or slow"), count("byo"), count("known-issue"));
    let other_protocol = count("opensandbox");
    assert!(other_protocol > 0, "the OpenSandbox-only scenarios are tagged `opensandbox`");
    // Only the agent templates whose keys are absent and the OpenSandbox-only scenarios skip;
    // the pins are XFAIL.
    let skipped = agents + other_protocol;
    let want = format!("{} passed, 0 failed, 0 error, {skipped} skipped, {pins} xfail, 0 xpass", all - skipped - pins);
    assert!(summary_line(&stdout).starts_with(&want), "{}\nwant {want}", summary_line(&stdout));
    assert!(!stdout.contains(&srv.key), "the key leaked");
}

#[test]
fn the_language_examples_pass_over_the_e2b_protocol() {
    let srv = serve();
    let out = e2b_cmd(&srv, &["examples"]).env_remove("SCENARIO_RUN_DEMO_API_KEY").output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let cases = text(&run(&["--no-progress", "--list", "examples"]).stdout).lines().count();
    let want = format!("{} passed, 0 failed, 0 error, 1 skipped, 1 xfail", cases - 2);
    assert!(summary_line(&stdout).starts_with(&want), "{}", summary_line(&stdout));
}

#[test]
fn alicloud_preset_uses_v1_routes_and_bearer_auth() {
    let srv = serve();
    let out = alicloud_cmd(&srv, &["scenarios/commands", "scenarios/files"]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    assert!(summary_line(&stdout).contains(" 0 failed, 0 error, "), "{stdout}");
}

#[test]
fn a_wrong_key_is_an_error_saying_authentication_failed() {
    let srv = serve();
    let out = e2b_cmd(&srv, &["scenarios/commands/stdin.yaml"])
        .env("E2B_API_KEY", "e2b_0000000000000000000000000000000000000000")
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

/// Builds over serve need its local provider to build: root namespaces and bubblewrap.
/// `GET path` on the server's control plane: (status, body).
fn get(srv: &Server, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {}\r\nConnection: close\r\n\r\n", srv.key).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

#[test]
fn python_hello_builds_over_the_template_api_and_is_deleted_at_the_end() {
    if !can_build() {
        return;
    }
    let srv = serve();
    let (out, report) = e2b_run_report(&srv, &["scenarios/custom/python-hello.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let built = step_outputs(report.path(), "build");
    let log = built[0]["log"].as_str().unwrap();
    // The COPY context went up as a tar, and serve ran it through the local builder.
    assert!(log.contains("uploading 1 files"), "{log}");
    assert!(log.contains("FROM ") && log.contains(" maps to "), "{log}");
    let deployed = step_outputs(report.path(), "deploy");
    let id = deployed[0]["template_id"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 20, "a serve template ID, not the name: {id}");
    assert_eq!(built[0]["image"], deployed[0]["template_id"], "build and deploy share the template");
    // The run deleted what it built.
    assert_eq!(get(&srv, &format!("/templates/{id}")).0, 404);
    assert_eq!(get(&srv, "/templates"), (200, "[]".to_string()));
    assert!(!stdout.contains(&srv.key), "the key leaked");
}

#[test]
fn a_failing_run_names_the_users_dockerfile_line_and_keeps_the_log() {
    if !can_build() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let srv = serve_env(&[], &[("SCENARIO_RUN_STATE_DIR", state.path())]);
    let (out, report) = e2b_run_report(&srv, &["tests/fixtures/broken-build/broken-run.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the scenario fails: {stdout}\n{}", text(&out.stderr));
    // Line 5 of the user's Dockerfile (its ARG before FROM counted), not a line of what serve reconstructed.
    assert!(
        stdout.contains(
            "tests/fixtures/broken-build/templates/broken-run/Dockerfile:5: RUN echo about-to-fail-on-line-5"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("exited with 3"), "{stdout}");
    let log = step_outputs(report.path(), "build")[0]["log"].as_str().unwrap().to_string();
    assert!(log.contains("before-the-failure") && log.contains("about-to-fail-on-line-5"), "{log}");
    assert!(!log.contains("never-reached"), "{log}");
    assert_eq!(get(&srv, "/templates"), (200, "[]".to_string()), "the failed template is deleted too");
    let left: Vec<_> = std::fs::read_dir(state.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().starts_with("tpl-")), "the failed build is removed: {left:?}");
}

#[test]
fn templates_left_on_serve_are_removed_when_it_stops() {
    if !can_build() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let srv = serve_env(&[], &[("SCENARIO_RUN_STATE_DIR", state.path())]);
    // Kept by the client, so only serve's own shutdown removes it.
    let out = e2b_run_env(&srv, &["tests/fixtures/templates/build-twice.yaml"], &[("SCENARIO_RUN_KEEP_BUILDS", "1")]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out.stdout), text(&out.stderr));
    let (status, listed) = get(&srv, "/templates");
    assert_eq!(status, 200);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "one template for both cases: {listed}");
    let layers = || {
        std::fs::read_dir(state.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("tpl-"))
            .count()
    };
    let cache = || {
        let out = cmd(&["cache"]).env("SCENARIO_RUN_STATE_DIR", state.path()).output().unwrap();
        text(&out.stdout)
    };
    // The build is kept by its content for the next build (issue 37 item 1), held by serve.
    assert_eq!(layers(), 0, "nothing but the cache");
    let listed = cache();
    assert!(listed.contains("1 cached build(s)") && listed.contains("(in use)"), "{listed}");
    let uploads = std::env::temp_dir().join(format!("scenario-run-serve-{}-{}", srv.pid(), srv.port));
    assert!(uploads.exists(), "{}", uploads.display());
    drop(srv);
    assert_eq!(layers(), 0, "serve leaves nothing of its templates when it stops");
    let listed = cache();
    assert!(listed.contains("1 cached build(s)") && !listed.contains("(in use)"), "the cache, let go: {listed}");
    assert!(!uploads.exists(), "and its uploads");
}

fn e2b_run_env(srv: &Server, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = e2b_cmd(srv, args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_from_an_image_with_registry_credentials_never_shows_the_password() {
    use scenario_run::provider::e2b::build::RegistryAuth;
    use scenario_run::provider::e2b::{E2bProvider, Preset};
    use scenario_run::provider::{Builds, CreateRequest, ExecRequest, Processes, Provider};
    if !can_build() {
        return;
    }
    let srv = tokio::task::spawn_blocking(serve).await.unwrap();
    let url = format!("http://127.0.0.1:{}", srv.port);
    let env: std::collections::BTreeMap<String, String> = [
        ("E2B_API_KEY", srv.key.as_str()),
        ("E2B_API_URL", url.as_str()),
        ("E2B_SANDBOX_URL", url.as_str()),
        ("E2B_DOMAIN", &format!("localhost:{}", srv.port)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let p = E2bProvider::new(Preset::E2b, &env).unwrap();
    let def = scenario_run::templates::TemplateDef {
        name: "from-image".into(),
        start_command: Some("echo up > /tmp/up; sleep 1000".into()),
        ready_command: Some("test -f /tmp/up".into()),
        ..Default::default()
    };
    let auth = RegistryAuth { username: "robot".into(), password: "pa55-w0rd-never-shown".into() };
    let logged = |mut rx: tokio::sync::mpsc::UnboundedReceiver<String>| async move {
        let mut log = String::new();
        while let Some(l) = rx.recv().await {
            log += &l;
            log.push('\n');
        }
        log
    };
    // A private registry that cannot be reached (a closed loopback port): the build fails,
    // and neither its error nor its log holds the password.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let err = p.build_from_image("127.0.0.1:9/ns/img:1", Some(&auth), &def, &tx).await.unwrap_err();
    drop(tx);
    let log = logged(rx).await;
    assert!(log.contains("from image 127.0.0.1:9/ns/img:1"), "{log}");
    for text in [&log, &format!("{err:?}")] {
        assert!(!text.contains(&auth.password), "{text}");
    }
    // An image the local provider has offline, with the same credentials, builds and runs.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let id = p.build_from_image("python:3.11-slim", Some(&auth), &def, &tx).await.unwrap();
    drop(tx);
    let log = logged(rx).await;
    assert!(log.contains("from image python:3.11-slim"), "{log}");
    assert!(!log.contains(&auth.password), "{log}");
    // Created by its ID, the start command ran and was ready before create returned.
    let sb = p.create(CreateRequest { template: id.clone(), ..Default::default() }).await.unwrap();
    let r = p.exec(&sb.id, ExecRequest { cmd: "cat /tmp/up".into(), ..Default::default() }, None).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "up\n");
    p.kill(&sb.id).await.unwrap();
    assert!(p.remove_builds().await >= 1, "the template is deleted with the run's builds");
    let ((code, _), _srv) =
        tokio::task::spawn_blocking(move || (get(&srv, &format!("/templates/{id}")), srv)).await.unwrap();
    assert_eq!(code, 404);
}

/// The local stack's authenticated registry (`.ci/local-stack.sh` writes it into its env
/// file): (host:port, user, password).
/// Unset: fails in CI, says SKIPPED elsewhere (`common::needs`).
fn auth_registry(test: &str) -> Option<(String, String, String)> {
    let v = |n: &str| common::needs(n, test, common::LOCAL_STACK);
    Some((
        v("LOCAL_STACK_AUTH_REGISTRY")?,
        v("LOCAL_STACK_AUTH_REGISTRY_USERNAME")?,
        v("LOCAL_STACK_AUTH_REGISTRY_PASSWORD")?,
    ))
}

/// `GET http://<registry><path>` with basic auth (or none): the status.
fn registry_status(registry: &str, path: &str, login: Option<(&str, &str)>) -> (u16, String) {
    use base64::Engine;
    use std::io::{Read, Write};
    let port: u16 = registry.rsplit(':').next().unwrap().parse().unwrap();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let auth = login.map_or(String::new(), |(u, p)| {
        format!("Authorization: Basic {}\r\n", base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}")))
    });
    write!(s, "GET {path} HTTP/1.1\r\nHost: {registry}\r\n{auth}Connection: close\r\n\r\n").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// What one ACR-path run of python-hello against `srv` must show: passed, the image pushed
/// to `registry/namespace` under the digest's tag (checked with `login`), made into the
/// template by serve, the engine's tag and the template gone at the end, and none of
/// `secrets` in any output.
fn assert_acr_run(
    srv: &Server,
    out: &std::process::Output,
    report: &std::path::Path,
    registry: &str,
    namespace: &str,
    login: Option<(&str, &str)>,
    secrets: &[&str],
) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("PASSED  template python-hello"), "{stdout}");
    let report_text = std::fs::read_to_string(report).unwrap();
    for (what, t) in [("stdout", &stdout), ("stderr", &stderr), ("the report", &report_text)] {
        for s in secrets {
            assert!(!t.contains(s), "a registry secret shows in {what}");
        }
    }
    let build = &step_outputs(report, "build")[0];
    let log = build["log"].as_str().unwrap();
    let tag = format!("{registry}/{namespace}/python-hello:");
    assert!(log.contains(&format!("push {tag}")) && log.contains(&format!("pushed {tag}")), "{log}");
    assert!(log.contains(&format!("fromImage {tag}")) && log.contains(", 0 steps"), "{log}");
    // serve pulled the pushed image from the registry and made the template from it.
    assert!(
        log.contains(&format!("FROM {tag}"))
            && log.contains(&format!("maps to {registry}/{namespace}/python-hello@sha256:")),
        "serve made the template from the image: {log}"
    );
    // In the registry, under the digest's tag; the engine's tag went with the run.
    let digest12 = &build["digest"].as_str().unwrap().trim_start_matches("sha256:")[..12];
    let (code, tags) = registry_status(registry, &format!("/v2/{namespace}/python-hello/tags/list"), login);
    assert!(code == 200 && tags.contains(digest12), "{code} {tags}");
    let inspect =
        std::process::Command::new("docker").args(["image", "inspect", &format!("{tag}{digest12}")]).output().unwrap();
    assert!(!inspect.status.success(), "the engine still has {tag}{digest12}");
    assert_eq!(get(srv, "/templates"), (200, "[]".to_string()), "the template is deleted at the end");
}

/// The alicloud ACR path end to end: python-hello built on the local stack's engine, pushed
/// to its registry that asks for a login (standing in for ACR; `ACR_USERNAME`/`ACR_PASSWORD`),
/// the template made from the image by serve (which pulls it with `fromImageRegistry`), and
/// the scenario's HTTP calls answered by the agent-sandbox-server that only the image has
/// (the host has none).
#[test]
fn alicloud_acr_path_pushes_the_image_and_the_template_runs_it() {
    if common::needs("DOCKER_HOST", "alicloud_acr_path_pushes_the_image_and_the_template_runs_it", common::LOCAL_STACK)
        .is_none()
    {
        return;
    }
    let Some((registry, user, password)) = auth_registry("alicloud_acr_path_pushes_the_image_and_the_template_runs_it")
    else {
        return;
    };
    if !can_build() {
        return;
    }
    // The registry really asks for the login.
    assert_eq!(registry_status(&registry, "/v2/", None).0, 401);
    assert_eq!(registry_status(&registry, "/v2/", Some((&user, "wrong-password"))).0, 401);
    let namespace = format!("acr-test-{}", std::process::id());
    let state = tempfile::tempdir().unwrap();
    let srv = serve_env(&[], &[("SCENARIO_RUN_STATE_DIR", state.path())]);
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = alicloud_cmd(&srv, &["scenarios/custom/python-hello.yaml", "--json", report.path().to_str().unwrap()])
        .env("SCENARIO_RUN_ACR_REGISTRY", format!("{registry}/{namespace}"))
        .env("ACR_USERNAME", &user)
        .env("ACR_PASSWORD", &password)
        .env_remove("SCENARIO_RUN_ACR_USERNAME")
        .env_remove("SCENARIO_RUN_ACR_PASSWORD")
        .env_remove(scenario_run::steps::build::KEEP_ENV)
        .output()
        .unwrap();
    assert_acr_run(&srv, &out, report.path(), &registry, &namespace, Some((&user, &password)), &[&password]);
}

/// The stub of ACR's `GetAuthorizationToken` (tests/fixtures/acr_token_stub.py), answering
/// with `user`/`token` to requests signed with `ak_id`/`ak_secret` for `instance`: the child,
/// its port and the file it records each call in.
fn acr_token_stub(
    ak_id: &str,
    ak_secret: &str,
    instance: &str,
    user: &str,
    token: &str,
) -> (std::process::Child, u16, tempfile::NamedTempFile) {
    let calls = tempfile::NamedTempFile::new().unwrap();
    let mut child = std::process::Command::new("python3")
        .arg("tests/fixtures/acr_token_stub.py")
        .arg(calls.path())
        .env("STUB_AK_ID", ak_id)
        .env("STUB_AK_SECRET", ak_secret)
        .env("STUB_INSTANCE", instance)
        .env("STUB_USERNAME", user)
        .env("STUB_TOKEN", token)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("stub did not start: {line:?}"));
    (child, port.parse().unwrap(), calls)
}

fn stub_calls(calls: &tempfile::NamedTempFile) -> Vec<serde_json::Value> {
    std::fs::read_to_string(calls.path()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The AccessKey path: no registry login is configured, so the AccessKey pair asks
/// `GetAuthorizationToken` (a stub on 127.0.0.1 that checks the V3 signature with its own
/// implementation) for a temporary login, which then pushes to the authenticated registry and
/// goes to serve as `fromImageRegistry`. The AccessKey pair and the token show nowhere; a
/// wrong secret fails the build with Alibaba's error code and no secret.
#[test]
fn alicloud_acr_path_logs_in_with_a_token_for_the_access_key_pair() {
    if common::needs(
        "DOCKER_HOST",
        "alicloud_acr_path_logs_in_with_a_token_for_the_access_key_pair",
        common::LOCAL_STACK,
    )
    .is_none()
    {
        return;
    }
    let Some((registry, user, password)) =
        auth_registry("alicloud_acr_path_logs_in_with_a_token_for_the_access_key_pair")
    else {
        return;
    };
    if !can_build() {
        return;
    }
    let (ak_id, ak_secret, instance) = ("LTAI5tStubAccessKeyId", "stub-access-key-secret-value", "cri-stubinstance");
    // The registry's password plays the temporary token (the child is not told the
    // registry's own variables, so only scenario-run's handling of the token masks it).
    let (mut stub, port, calls) = acr_token_stub(ak_id, ak_secret, instance, &user, &password);
    let namespace = format!("acr-ak-test-{}", std::process::id());
    let state = tempfile::tempdir().unwrap();
    let srv = serve_env(&[], &[("SCENARIO_RUN_STATE_DIR", state.path())]);
    let run = |secret: &str, report: &std::path::Path| {
        alicloud_cmd(&srv, &["scenarios/custom/python-hello.yaml", "--json", report.to_str().unwrap()])
            .env("SCENARIO_RUN_ACR_REGISTRY", format!("{registry}/{namespace}"))
            .env("ALIBABA_CLOUD_ACCESS_KEY_ID", ak_id)
            .env("ALIBABA_CLOUD_ACCESS_KEY_SECRET", secret)
            .env("SCENARIO_RUN_ACR_INSTANCE_ID", instance)
            .env("SCENARIO_RUN_ACR_API_ENDPOINT", format!("http://127.0.0.1:{port}"))
            .env_remove("LOCAL_STACK_AUTH_REGISTRY_PASSWORD")
            .env_remove("ACR_USERNAME")
            .env_remove("ACR_PASSWORD")
            .env_remove("SCENARIO_RUN_ACR_USERNAME")
            .env_remove("SCENARIO_RUN_ACR_PASSWORD")
            .env_remove(scenario_run::steps::build::KEEP_ENV)
            .output()
            .unwrap()
    };

    // A wrong secret: the stub refuses the signature, the build fails saying so.
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = run("not-the-secret-value", report.path());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert_ne!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("GetAuthorizationToken") && all.contains("IncorrectSignature"), "{all}");
    assert!(!all.contains("not-the-secret-value"), "{all}");
    assert_eq!(stub_calls(&calls).iter().filter(|c| c["ok"] == true).count(), 0);

    let report = tempfile::NamedTempFile::new().unwrap();
    let out = run(ak_secret, report.path());
    let c = stub_calls(&calls);
    let _ = stub.kill();
    let _ = stub.wait();
    let ok: Vec<_> = c.iter().filter(|c| c["ok"] == true).collect();
    assert_eq!(ok.len(), 1, "one temporary login per run: {c:?}");
    assert_eq!(ok[0]["action"], "GetAuthorizationToken");
    let log = step_outputs(report.path(), "build")[0]["log"].as_str().unwrap_or_default().to_string();
    assert!(log.contains("a temporary login for instance cri-stubinstance from GetAuthorizationToken"), "{log}");
    assert_acr_run(
        &srv,
        &out,
        report.path(),
        &registry,
        &namespace,
        Some((&user, &password)),
        &[&password, ak_secret, ak_id],
    );
}

#[test]
fn the_e2b_client_keeps_output_only_to_max_output() {
    let srv = serve();
    let (out, _report) = e2b_run_report(&srv, &["--max-output", "1KiB", "tests/fixtures/output-cap.yaml"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
}

/// `method path` on the control plane with the key and a JSON body: (status, body).
fn api(srv: &Server, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        srv.key,
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

/// Everything under `dir`, read as text.
fn all_text(dir: &std::path::Path) -> String {
    let mut out = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out += &all_text(&p);
        } else {
            out += &String::from_utf8_lossy(&std::fs::read(&p).unwrap());
        }
    }
    out
}

/// The sandbox tokens are secrets: the e2b client sends them where they belong (envd calls,
/// the port requests of http steps) and nowhere else, and serve keeps them from the
/// sandbox's application, so no output of a run holds one, whatever the scenario prints.
#[test]
fn sandbox_tokens_never_reach_any_output() {
    use base64::Engine;
    let srv = serve();
    let (status, made) = api(&srv, "POST", "/v2/sandboxes", r#"{"templateID":"base","timeout":120}"#);
    assert_eq!(status, 201, "{made}");
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let secrets: Vec<String> =
        ["envdAccessToken", "trafficAccessToken"].iter().map(|k| made[k].as_str().unwrap().to_string()).collect();
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("tokens.yaml");
    std::fs::write(
        &scenario,
        r#"name: tokens stay out of every output
steps:
  - connect: { id: "{{ vars.sbid }}" }
  - write-file:
      path: /tmp/echo.py
      content: |
        import http.server, json
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps(dict(self.headers.items())).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def log_message(self, *a):
                pass
        http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
  - exec: { cmd: "exec python3 /tmp/echo.py", background: true }
  - http-get: { port: 8080, path: /by-port, expect: { status: 200 } }
    eventually: { within: 20s, every: 200ms }
    id: by_port
  - http-get: { url: "{{ sandbox.url(8080) }}/by-url", expect: { status: 200 } }
    id: by_url
  - assert: { that: "'e2b-traffic-access-token' not in steps.by_port.json and 'e2b-traffic-access-token' not in steps.by_url.json" }
  - exec: env; cat /proc/self/environ | tr '\0' '\n'
  - read-file: /tmp/echo.py
  - files: { op: list, path: /tmp }
"#,
    )
    .unwrap();
    let report = dir.path().join("report.json");
    let junit = dir.path().join("junit.xml");
    let evidence = dir.path().join("evidence");
    let out = e2b_cmd(
        &srv,
        &[
            "-v",
            "--var",
            &format!("sbid={id}"),
            scenario.to_str().unwrap(),
            "--json",
            report.to_str().unwrap(),
            "--junit",
            junit.to_str().unwrap(),
            "--evidence",
            evidence.to_str().unwrap(),
        ],
    )
    .output()
    .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let everything = format!(
        "{stdout}{stderr}{}{}{}",
        std::fs::read_to_string(&report).unwrap(),
        std::fs::read_to_string(&junit).unwrap(),
        all_text(&evidence)
    );
    assert!(everything.contains("/by-port") && everything.contains(&id), "the outputs are the run's");
    for s in &secrets {
        let b64 = base64::engine::general_purpose::STANDARD.encode(s);
        assert!(!everything.contains(s.as_str()) && !everything.contains(&b64), "a token shows in the outputs");
    }
    let (status, _) = api(&srv, "DELETE", &format!("/sandboxes/{id}"), "");
    assert_eq!(status, 204);
}

/// The fault matrix (issue 13) in quick mode: the shipped scenarios' representative subset
/// with `--provider e2b` against serve under each fault; no create may be repeated after an
/// answer that was not a refusal, and no sandbox may be left alive. `scripts/fault-matrix`
/// prints the full figures.
#[test]
fn fault_matrix_quick_has_no_double_creates_and_no_leaks() {
    let out = std::process::Command::new(root().join("scripts/fault-matrix"))
        .arg("--quick")
        .env("SCENARIO_RUN_BIN", bin())
        .current_dir(root())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| fault")).collect();
    assert!(rows.len() >= 4, "a row per fault: {stdout}");
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | fault | scenarios | outcomes | creates | refused | double creates | leaked |
        assert_eq!(cells[6], "0", "double creates: {row}");
        assert_eq!(cells[7], "0", "leaked sandboxes: {row}");
        assert!(cells[4].parse::<u64>().unwrap() > 0, "the run made sandboxes: {row}");
        if cells[1] == "none" {
            // Without faults everything passes: the matrix measures the client, not a
            // broken environment.
            assert_eq!(cells[3], format!("{} passed", cells[2]), "{row}");
        }
    }
}

#[test]
fn snapshot_steps_delete_their_snapshots_when_the_scenario_ends_unless_kept() {
    // Through the e2b client: `snapshot` is POST /sandboxes/{id}/snapshots, and the cleanup
    // after the scenario's sandboxes is DELETE /templates/{id}, as the SDK deletes one.
    let srv = serve();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.yaml");
    std::fs::write(
        &file,
        "name: snapshots kept and dropped\nsteps:\n  - create: base\n  - snapshot: { name: kept-one, keep: true }\n  - snapshot: { name: dropped-one }\n    id: dropped\n  - create: { template: \"{{ steps.dropped.id }}\" }\n",
    )
    .unwrap();
    let out = e2b_run(&srv, &[file.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    let (status, body) = get(&srv, "/snapshots");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("kept-one"), "the kept snapshot is gone: {body}");
    assert!(!body.contains("dropped-one"), "the snapshot not kept is still there: {body}");
    assert_eq!(common::serve::live(&srv), 0, "a sandbox outlived its scenario");
}

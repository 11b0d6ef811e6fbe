//! Unit tests of every step kind, through the registry's `run` pointers, against
//! [`FakeProvider`] and, for the HTTP steps, a small HTTP server on 127.0.0.1.
//!
//! Every call goes through `step(&mut c, "<kind>", args)`, which looks the kind up in the
//! registry; `every_registry_kind_is_tested` reads this file to check each kind is called.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use minijinja::value::{Serde, Value as MValue};
use serde_json::{json, Value as JsonValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::fake::{done, FakeProvider, FIRST_PID, NOW};
use super::{registry, Severity, StepCtx, StepError};
use crate::provider::{ErrorKind, ExecResult, ProviderError};
use crate::results::Mismatch;

const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

fn fake() -> Arc<FakeProvider> {
    Arc::new(FakeProvider::new())
}

fn ctx(p: &Arc<FakeProvider>) -> StepCtx {
    let http = crate::net::client_builder().no_proxy().build().unwrap();
    StepCtx { scenario_dir: std::env::temp_dir(), ..StepCtx::new(p.clone(), http, "run-1".into()) }
}

/// A context with one sandbox (`sb-1`) made by the `create` step.
async fn ctx_sb(p: &Arc<FakeProvider>) -> StepCtx {
    let mut c = ctx(p);
    step(&mut c, "create", json!({})).await.unwrap();
    c
}

/// Dispatch through the registry, as the runner does: the arguments are converted by the
/// registry's fields first, and a refused one is the step's error.
async fn step(c: &mut StepCtx, kind: &str, args: JsonValue) -> Result<JsonValue, StepError> {
    let k = registry::lookup(kind).unwrap_or_else(|| panic!("no step kind `{kind}` in the registry"));
    let typed = super::args::convert_step(k, &args).map_err(|e| StepError::error(e.message))?;
    (crate::steps::registry::run_fn(k))(c, &typed).await
}

fn failed(r: Result<JsonValue, StepError>) -> StepError {
    let e = r.expect_err("the step should have failed");
    assert_eq!(e.severity, Severity::Fail, "expected a failure, got an error: {}", e.message);
    e
}

fn errored(r: Result<JsonValue, StepError>) -> StepError {
    let e = r.expect_err("the step should have errored");
    assert_eq!(e.severity, Severity::Error, "expected an error, got a failure: {}", e.message);
    e
}

/// The outputs without `duration_ms` (wall time), which must be a number.
fn timeless(mut v: JsonValue) -> JsonValue {
    let d = v.as_object_mut().expect("outputs are an object").remove("duration_ms");
    assert!(d.as_ref().is_some_and(JsonValue::is_u64), "duration_ms missing or not a number: {d:?}");
    v
}

fn outputs_of(e: &StepError) -> JsonValue {
    e.outputs.as_deref().cloned().expect("the failure carries outputs")
}

fn mismatch(expected: &str, actual: &str) -> Option<Box<Mismatch>> {
    Some(Box::new(Mismatch::new(expected, actual)))
}

// ---------------------------------------------------------------------------------------
// create, connect, info, list, kill, set-timeout

#[tokio::test]
async fn create_passes_every_field_and_tags_the_run() {
    let p = fake();
    let mut c = ctx(&p);
    let out = step(
        &mut c,
        "create",
        json!({
            "template": "py", "as": "main", "timeout": "2m", "metadata": { "team": "qa", "n": 1 },
            "envs": { "A": "1" }, "keep": "true", "cpu": "2", "memory": 512,
            "network": { "allow_internet_access": "false", "allow_out": ["10.0.0.1", "10.1.0.0/16"], "deny_out": "0.0.0.0/0" },
        }),
    )
    .await
    .unwrap();
    assert_eq!(out, json!({ "id": "sb-1", "template": "py", "template_id": "py", "alias": "main" }));
    {
        let s = p.state();
        let req = &s.creates[0];
        assert_eq!(req.template, "py");
        assert_eq!(req.timeout_secs, Some(120));
        let want: BTreeMap<String, String> = [("team", "qa"), ("n", "1"), ("e2e", "run-1")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert_eq!(req.metadata, want);
        assert_eq!(req.envs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(), ["A=1"]);
        assert_eq!(s.sandboxes["sb-1"].envs, req.envs);
        assert_eq!((req.cpu, req.memory_mb), (Some(2), Some(512)));
        let n = req.network.as_ref().expect("the network policy");
        assert_eq!(n.allow_internet_access, Some(false));
        assert_eq!(
            (n.allow_out.as_slice(), n.deny_out.as_slice()),
            (&["10.0.0.1".to_string(), "10.1.0.0/16".to_string()][..], &["0.0.0.0/0".to_string()][..])
        );
        assert_eq!(s.sandboxes["sb-1"].info.end_at, NOW + 120);
    }
    let sb = &c.sandboxes[0];
    assert_eq!((sb.id.as_str(), sb.template.as_str(), sb.alias.as_deref()), ("sb-1", "py", Some("main")));
    assert!(sb.keep && !sb.killed);
    assert_eq!((c.current, c.target), (Some(0), Some(0)));
}

#[tokio::test]
async fn create_defaults_and_the_newest_sandbox_becomes_current() {
    let p = fake();
    let mut c = ctx(&p);
    assert_eq!(
        step(&mut c, "create", json!({})).await.unwrap(),
        json!({ "id": "sb-1", "template": "base", "template_id": "base", "alias": null })
    );
    // Sub-second lifetimes round up to one second rather than zero.
    step(&mut c, "create", json!({ "timeout": "200ms" })).await.unwrap();
    let s = p.state();
    assert_eq!(s.creates[0].template, "base");
    assert_eq!(s.creates[0].timeout_secs, Some(300));
    assert_eq!(s.creates[0].metadata.len(), 1);
    assert_eq!((s.creates[0].cpu, s.creates[0].memory_mb), (None, None));
    assert_eq!(s.creates[1].timeout_secs, Some(1));
    assert!(!c.sandboxes[0].keep);
    assert_eq!((c.current, c.target), (Some(1), Some(1)));
}

#[tokio::test]
async fn create_rejects_bad_arguments_before_calling_the_provider() {
    let p = fake();
    let mut c = ctx(&p);
    let e = errored(step(&mut c, "create", json!({ "cpu": "many" })).await);
    assert_eq!(e.message, "`cpu` must be an integer from 1 to 1024, found a string \"many\"");
    let e = errored(step(&mut c, "create", json!({ "keep": "perhaps" })).await);
    assert_eq!(e.message, "`keep` must be true or false, found a string \"perhaps\"");
    let e = errored(step(&mut c, "create", json!({ "timeout": "5 minutes" })).await);
    assert!(e.message.starts_with("bad duration for `timeout`: invalid duration `5 minutes`"), "{}", e.message);
    let e = errored(step(&mut c, "create", json!({ "metadata": "team=qa" })).await);
    assert_eq!(e.message, "`metadata` must be a mapping of strings, found a string \"team=qa\"");
    // Nothing was created: a sandbox made before an argument error would be unknown to the
    // scenario and never destroyed.
    assert!(p.state().creates.is_empty());
    assert!(c.sandboxes.is_empty());
}

#[tokio::test]
async fn provider_error_kinds_map_to_severities() {
    let cases = [
        (ProviderError::not_found("template py not found"), Severity::Fail, "template py not found"),
        (ProviderError::invalid("bad template name"), Severity::Fail, "bad template name"),
        (ProviderError::new(ErrorKind::Timeout, "create timed out"), Severity::Fail, "create timed out"),
        (ProviderError::new(ErrorKind::Auth, "key rejected"), Severity::Error, "authentication failed: key rejected"),
        (
            ProviderError::new(ErrorKind::Auth, "authentication failed (401)"),
            Severity::Error,
            "authentication failed (401)",
        ),
        (ProviderError::infra("connection reset"), Severity::Error, "connection reset"),
        (ProviderError::unsupported("no cpu limits"), Severity::Error, "no cpu limits"),
        (ProviderError::new(ErrorKind::Capacity, "not enough disk space"), Severity::Error, "not enough disk space"),
    ];
    for (err, severity, message) in cases {
        let p = fake();
        p.fail("create", err);
        let mut c = ctx(&p);
        // A name no template folder defines (for one that does, a not-found says to deploy it).
        let e = step(&mut c, "create", json!({ "template": "py" })).await.unwrap_err();
        assert_eq!((e.severity, e.message.as_str()), (severity, message));
        assert!(e.outputs.is_none() && e.mismatch.is_none());
        assert!(c.sandboxes.is_empty() && c.current.is_none());
    }
}

#[tokio::test]
async fn connect_attaches_a_foreign_sandbox_as_kept() {
    let p = fake();
    let other = p.add_sandbox("node", &[("owner", "someone")]);
    let mut c = ctx_sb(&p).await;
    let out = step(&mut c, "connect", json!({ "id": other, "as": "theirs", "timeout": 60 })).await.unwrap();
    assert_eq!(
        out,
        json!({
            "id": "sb-1", "template": "node", "metadata": { "owner": "someone" },
            "started_at": NOW, "end_at": NOW + 60, "state": "running",
        })
    );
    assert_eq!(c.sandboxes.len(), 2);
    let sb = &c.sandboxes[1];
    assert_eq!((sb.id.as_str(), sb.alias.as_deref(), sb.keep), ("sb-1", Some("theirs"), true));
    assert_eq!((c.current, c.target), (Some(1), Some(1)));

    // `owned: true` makes a foreign sandbox ours to destroy.
    let third = p.add_sandbox("base", &[]);
    step(&mut c, "connect", json!({ "id": third, "owned": true })).await.unwrap();
    assert!(!c.sandboxes[2].keep);
}

#[tokio::test]
async fn connect_to_a_sandbox_of_the_scenario_switches_to_it() {
    let p = fake();
    let mut c = ctx(&p);
    step(&mut c, "create", json!({ "as": "a" })).await.unwrap();
    step(&mut c, "create", json!({ "as": "b" })).await.unwrap();
    let out = step(&mut c, "connect", json!({ "id": "sb-1" })).await.unwrap();
    assert_eq!(out["id"], "sb-1");
    assert_eq!(c.sandboxes.len(), 2, "no second entry for a sandbox already known");
    assert_eq!((c.current, c.target), (Some(0), Some(0)));
    // No timeout given: the lifetime is left alone.
    assert_eq!(out["end_at"], NOW + 300);
}

#[tokio::test]
async fn connect_under_a_new_alias_keeps_what_create_kept() {
    let p = fake();
    let mut c = ctx(&p);
    step(&mut c, "create", json!({ "keep": true })).await.unwrap();
    step(&mut c, "create", json!({})).await.unwrap();
    step(&mut c, "connect", json!({ "id": "sb-1", "as": "again" })).await.unwrap();
    step(&mut c, "connect", json!({ "id": "sb-2", "as": "too" })).await.unwrap();
    let keep: Vec<(&str, bool)> = c.sandboxes.iter().map(|s| (s.id.as_str(), s.keep)).collect();
    // The cleanup destroys every entry not kept: a kept sandbox must stay kept under its new
    // alias, and one the scenario owns stays owned.
    assert_eq!(keep, [("sb-1", true), ("sb-2", false), ("sb-1", true), ("sb-2", false)]);
}

#[tokio::test]
async fn connect_failures() {
    let p = fake();
    let mut c = ctx(&p);
    let e = failed(step(&mut c, "connect", json!({ "id": "sb-404" })).await);
    assert_eq!(e.message, "sandbox sb-404 not found");
    let e = errored(step(&mut c, "connect", json!({})).await);
    assert_eq!(e.message, "missing required field `id` for `connect`");
    assert!(c.sandboxes.is_empty() && c.current.is_none());
}

#[tokio::test]
async fn info_of_the_step_sandbox_or_an_id() {
    let p = fake();
    let other = p.add_sandbox("node", &[]);
    let mut c = ctx(&p);
    let e = errored(step(&mut c, "info", json!({})).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
    step(&mut c, "create", json!({ "template": "py", "timeout": 90 })).await.unwrap();
    let out = step(&mut c, "info", json!({})).await.unwrap();
    assert_eq!(
        out,
        json!({
            "id": "sb-2", "template": "py", "metadata": { "e2e": "run-1" },
            "started_at": NOW, "end_at": NOW + 90, "state": "running",
        })
    );
    assert_eq!(step(&mut c, "info", json!({ "id": other })).await.unwrap()["template"], "node");
    let e = failed(step(&mut c, "info", json!({ "id": "gone" })).await);
    assert_eq!(e.message, "sandbox gone not found");
}

#[tokio::test]
async fn list_defaults_to_the_run_tag() {
    let p = fake();
    p.add_sandbox("base", &[("team", "qa")]);
    let mut c = ctx(&p);
    step(&mut c, "create", json!({ "metadata": { "team": "qa" } })).await.unwrap();
    step(&mut c, "create", json!({ "template": "py" })).await.unwrap();

    let out = step(&mut c, "list", json!({})).await.unwrap();
    assert_eq!(out["ids"], json!(["sb-2", "sb-3"]));
    assert_eq!(out["count"], 2);
    assert_eq!(
        out["sandboxes"][1],
        json!({
            "id": "sb-3", "template": "py", "metadata": { "e2e": "run-1" },
            "started_at": NOW, "end_at": NOW + 300, "state": "running",
        })
    );
    let out = step(&mut c, "list", json!({ "metadata": { "team": "qa" } })).await.unwrap();
    assert_eq!((&out["ids"], &out["count"]), (&json!(["sb-1", "sb-2"]), &json!(2)));
    let out = step(&mut c, "list", json!({ "metadata": { "team": "qa", "e2e": "run-1" } })).await.unwrap();
    assert_eq!(out["ids"], json!(["sb-2"]));
    let out = step(&mut c, "list", json!({ "all": true })).await.unwrap();
    assert_eq!(out["count"], 3);
    let out = step(&mut c, "list", json!({ "metadata": { "team": "dev" } })).await.unwrap();
    assert_eq!(out, json!({ "ids": [], "count": 0, "sandboxes": [] }));
    p.fail("list", ProviderError::infra("api down"));
    assert_eq!(errored(step(&mut c, "list", json!({})).await).message, "api down");
}

#[tokio::test]
async fn kill_marks_the_sandbox_killed() {
    let p = fake();
    let mut c = ctx(&p);
    step(&mut c, "create", json!({})).await.unwrap();
    step(&mut c, "create", json!({})).await.unwrap();
    assert_eq!(step(&mut c, "kill", json!({})).await.unwrap(), json!({ "killed": true }));
    assert!(!c.sandboxes[0].killed && c.sandboxes[1].killed);
    assert!(!p.state().sandboxes.contains_key("sb-2"));
    // By id; a sandbox that is already gone is `killed: false`, not a failure.
    assert_eq!(step(&mut c, "kill", json!({ "id": "sb-1" })).await.unwrap(), json!({ "killed": true }));
    assert!(c.sandboxes[0].killed);
    assert_eq!(step(&mut c, "kill", json!({ "id": "sb-1" })).await.unwrap(), json!({ "killed": false }));
    assert_eq!(p.state().stats.destroyed, 2);

    let mut empty = ctx(&p);
    let e = errored(step(&mut empty, "kill", json!({})).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
}

/// `update-network` hands the provider the whole policy given (E2B's update replaces the
/// rules); an empty one opens the sandbox again; a provider's refusal is the step's.
#[tokio::test]
async fn update_network_replaces_the_policy() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let rules = json!({ "allow_out": "registry.npmjs.org", "deny_out": ["0.0.0.0/0"], "dns_servers": [] });
    assert_eq!(step(&mut c, "update-network", rules).await.unwrap(), json!({}));
    step(&mut c, "update-network", json!({})).await.unwrap();
    let got = p.state().networks.clone();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].0, "sb-1");
    assert_eq!(got[0].1.allow_out, ["registry.npmjs.org"]);
    assert_eq!(got[0].1.deny_out, ["0.0.0.0/0"]);
    assert_eq!(got[0].1.dns_servers, Some(vec![]));
    assert_eq!(got[1].1, crate::provider::NetworkPolicy::default(), "an empty update is the open policy");
    p.fail("update_network", ProviderError::unsupported("fake cannot"));
    let e = errored(step(&mut c, "update-network", json!({ "deny_out": ["0.0.0.0/0"] })).await);
    assert_eq!(e.kind, Some(crate::provider::ErrorKind::Unsupported));
    let mut empty = ctx(&p);
    let e = errored(step(&mut empty, "update-network", json!({})).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
}

/// `exec: { background, open_stdin }` starts the process through the provider's open-stdin
/// spawn; `send-stdin` writes by pid and closes when asked; what cannot work is refused.
#[tokio::test]
async fn send_stdin_writes_and_closes_by_pid() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let started = step(&mut c, "exec", json!({ "cmd": "cat", "background": true, "open_stdin": true })).await.unwrap();
    let pid = started["pid"].as_u64().unwrap();
    assert!(p.state().calls.contains(&"spawn"), "{:?}", p.state().calls);
    let out = step(&mut c, "send-stdin", json!({ "pid": pid, "data": "one\n" })).await.unwrap();
    assert_eq!(out, json!({ "pid": pid, "bytes": 4 }));
    step(&mut c, "send-stdin", json!({ "pid": pid, "data": "two\n", "close": true })).await.unwrap();
    let pid = pid as u32;
    assert_eq!(
        p.state().stdin,
        [
            ("sb-1".to_string(), pid, Some(b"one\n".to_vec())),
            ("sb-1".to_string(), pid, Some(b"two\n".to_vec())),
            ("sb-1".to_string(), pid, None)
        ]
    );
    let e = errored(step(&mut c, "send-stdin", json!({ "pid": pid })).await);
    assert!(e.message.contains("needs `data`"), "{}", e.message);
    let e = errored(step(&mut c, "exec", json!({ "cmd": "cat", "open_stdin": true })).await);
    assert!(e.message.contains("needs `background: true`"), "{}", e.message);
}

#[tokio::test]
async fn set_timeout_reports_the_new_end() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    assert_eq!(step(&mut c, "set-timeout", json!({ "timeout": "10m" })).await.unwrap(), json!({ "end_at": NOW + 600 }));
    assert_eq!(step(&mut c, "set-timeout", json!({ "timeout": "200ms" })).await.unwrap(), json!({ "end_at": NOW + 1 }));
    assert_eq!(p.state().set_timeouts, [("sb-1".to_string(), 600), ("sb-1".to_string(), 1)]);
    assert_eq!(
        errored(step(&mut c, "set-timeout", json!({})).await).message,
        "missing required field `timeout` for `set-timeout`"
    );
    let e = errored(step(&mut c, "set-timeout", json!({ "timeout": "10 parsecs" })).await);
    assert!(e.message.starts_with("bad duration for `timeout`: invalid duration `10 parsecs`"), "{}", e.message);
    p.fail("set_timeout", ProviderError::not_found("sandbox sb-1 not found"));
    assert_eq!(failed(step(&mut c, "set-timeout", json!({ "timeout": 5 })).await).message, "sandbox sb-1 not found");
}

// ---------------------------------------------------------------------------------------
// exec, process-list, signal, wait

#[tokio::test]
async fn exec_foreground_passes_the_request_and_returns_outputs() {
    let p = fake();
    p.table(&[("echo hi", done("hi\n", "warn\n", 0))]);
    let mut c = ctx_sb(&p).await;
    let out = step(
        &mut c,
        "exec",
        json!({ "cmd": "echo hi", "cwd": "/tmp", "env": { "A": "1", "N": 2 }, "user": "root", "stdin": "data" }),
    )
    .await
    .unwrap();
    assert_eq!(
        timeless(out),
        json!({ "stdout": "hi\n", "stderr": "warn\n", "exit_code": 0, "signal": null, "timed_out": false, "pid": FIRST_PID,
            "stdout_dropped": 0, "stderr_dropped": 0 })
    );
    let s = p.state();
    let (id, req) = &s.execs[0];
    assert_eq!(id, "sb-1");
    assert_eq!((req.cmd.as_str(), req.cwd.as_deref(), req.user.as_deref()), ("echo hi", Some("/tmp"), Some("root")));
    assert_eq!(req.envs.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(), ["A=1", "N=2"]);
    assert_eq!(req.stdin.as_deref(), Some(&b"data"[..]));
    assert_eq!(req.timeout, Some(EXEC_TIMEOUT), "the scenario's default limit");
    assert!(s.spawns.is_empty());
}

#[tokio::test]
async fn exec_non_zero_exit_is_recorded_not_failed() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.script(|_, _| ExecResult { stdout: vec![b'a', 0xff], ..done("", "boom\n", 3) });
    let out = step(&mut c, "exec", json!({ "cmd": "false", "timeout": "5s" })).await.unwrap();
    assert_eq!(out["exit_code"], 3);
    assert_eq!(out["stdout"], "a\u{fffd}", "invalid UTF-8 is replaced, not an error");
    assert_eq!(p.state().execs[0].1.timeout, Some(Duration::from_secs(5)));
}

#[tokio::test]
async fn exec_exit_code_expectation() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.table(&[("ok", done("", "", 0)), ("three", done("out\n", "l1\nl2\nl3\nl4\n", 3)), ("quiet", done("", "", 3))]);
    step(&mut c, "exec", json!({ "cmd": "ok", "exit_code": 0 })).await.unwrap();
    step(&mut c, "exec", json!({ "cmd": "three", "exit_code": "3" })).await.unwrap();

    let e = failed(step(&mut c, "exec", json!({ "cmd": "three", "exit_code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found 3; stderr: l2\nl3\nl4");
    let out = timeless(outputs_of(&e));
    assert_eq!((&out["stdout"], &out["exit_code"], &out["pid"]), (&json!("out\n"), &json!(3), &json!(FIRST_PID + 2)));
    let e = failed(step(&mut c, "exec", json!({ "cmd": "quiet", "exit_code": 1 })).await);
    assert_eq!(e.message, "expected exit code 1, found 3");

    p.script(|_, _| ExecResult { exit_code: None, signal: Some(9), ..Default::default() });
    let e = failed(step(&mut c, "exec", json!({ "cmd": "killed", "exit_code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found signal 9");
    assert_eq!(outputs_of(&e)["signal"], 9);
}

/// Issue 27 item 1: a command is given no more than its step's bound, so the command is
/// stopped by it (keeping what it printed) and the message names the setting: the step's
/// `timeout:`, exec's own `timeout`, or `--exec-timeout`, whichever is shortest.
#[tokio::test]
async fn a_command_timeout_names_the_setting_that_bounded_it() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.script(|_, _| ExecResult { stdout: b"partial".to_vec(), timed_out: true, ..Default::default() });
    let cases = [
        (None, json!({ "cmd": "a" }), "1m00s (--exec-timeout; give exec a `timeout` for longer)", 60_000),
        (None, json!({ "cmd": "b", "timeout": "2s" }), "2.00s (exec's `timeout`)", 2_000),
        (
            Some((500, super::STEP_TIMEOUT)),
            json!({ "cmd": "c", "timeout": "2s" }),
            "0.50s (the step's `timeout:`)",
            500,
        ),
        (Some((5_000, super::STEP_TIMEOUT)), json!({ "cmd": "d", "timeout": "2s" }), "2.00s (exec's `timeout`)", 2_000),
        (Some((700, super::WINDOW)), json!({ "cmd": "e" }), "0.70s (what was left of `eventually`'s window)", 700),
    ];
    for (bound, args, said, sent_ms) in cases {
        c.step_limit = bound.map(|(ms, setting)| super::StepLimit { limit: Duration::from_millis(ms), setting });
        let e = failed(step(&mut c, "exec", args.clone()).await);
        assert_eq!(e.message, format!("command timed out after {said}"), "{args}");
        assert_eq!(outputs_of(&e)["stdout"], "partial", "what it printed is kept");
        let sent = p.state().execs.last().unwrap().1.timeout;
        assert_eq!(sent, Some(Duration::from_millis(sent_ms)), "{args}");
    }
}

#[tokio::test]
async fn exec_timeout_fails_with_outputs() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.script(|_, _| ExecResult {
        stdout: b"partial".to_vec(),
        exit_code: None,
        signal: Some(9),
        timed_out: true,
        ..Default::default()
    });
    let e = failed(step(&mut c, "exec", json!({ "cmd": "sleep 100", "timeout": "2s", "exit_code": 0 })).await);
    assert_eq!(e.message, "command timed out after 2.00s (exec's `timeout`)");
    assert_eq!(
        timeless(outputs_of(&e)),
        json!({ "stdout": "partial", "stderr": "", "exit_code": null, "signal": 9, "timed_out": true, "pid": FIRST_PID,
            "stdout_dropped": 0, "stderr_dropped": 0 })
    );
    assert_eq!(p.state().execs[0].1.timeout, Some(Duration::from_secs(2)));
}

#[tokio::test]
async fn exec_background_spawns_without_a_limit() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let out = step(&mut c, "exec", json!({ "cmd": "server", "background": "true", "timeout": "5s", "cwd": "/srv" }))
        .await
        .unwrap();
    assert_eq!(
        out,
        json!({ "pid": FIRST_PID, "stdout": "", "stderr": "", "exit_code": null, "signal": null, "timed_out": false, "duration_ms": 0 })
    );
    let s = p.state();
    assert!(s.execs.is_empty());
    let (id, req) = &s.spawns[0];
    assert_eq!(
        (id.as_str(), req.cmd.as_str(), req.cwd.as_deref(), req.timeout),
        ("sb-1", "server", Some("/srv"), None)
    );
}

#[tokio::test]
async fn exec_errors() {
    let p = fake();
    let mut c = ctx(&p);
    assert_eq!(
        errored(step(&mut c, "exec", json!({ "cmd": "true" })).await).message,
        "no sandbox: add a `create` step first"
    );
    step(&mut c, "create", json!({})).await.unwrap();
    assert_eq!(errored(step(&mut c, "exec", json!({})).await).message, "missing required field `cmd` for `exec`");
    let e = errored(step(&mut c, "exec", json!({ "cmd": "x", "background": "maybe" })).await);
    assert_eq!(e.message, "`background` must be true or false, found a string \"maybe\"");
    let e = errored(step(&mut c, "exec", json!({ "cmd": "x", "exit_code": "zero" })).await);
    assert_eq!(e.message, "`exit_code` must be an integer from -255 to 255, found a string \"zero\"");
    p.fail("exec", ProviderError::infra("agent unreachable"));
    assert_eq!(errored(step(&mut c, "exec", json!({ "cmd": "true" })).await).message, "agent unreachable");
    p.fail("spawn", ProviderError::unsupported("no background processes"));
    let e = errored(step(&mut c, "exec", json!({ "cmd": "x", "background": true })).await);
    assert_eq!(e.message, "no background processes");
}

#[tokio::test]
async fn process_list_counts_running_processes() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    step(&mut c, "exec", json!({ "cmd": "sleep 100", "background": true })).await.unwrap();
    step(&mut c, "exec", json!({ "cmd": "sleep 200", "background": true })).await.unwrap();
    step(&mut c, "exec", json!({ "cmd": "true" })).await.unwrap();
    step(&mut c, "signal", json!({ "pid": FIRST_PID, "signal": "KILL" })).await.unwrap();
    let out = step(&mut c, "process-list", json!({})).await.unwrap();
    assert_eq!(
        out,
        json!({
            "pids": [FIRST_PID + 1],
            "count": 1,
            "processes": [
                { "pid": FIRST_PID, "cmd": "sleep 100", "running": false, "exit_code": null },
                { "pid": FIRST_PID + 1, "cmd": "sleep 200", "running": true, "exit_code": null },
                { "pid": FIRST_PID + 2, "cmd": "true", "running": false, "exit_code": 0 },
            ],
        })
    );
    p.fail("process_list", ProviderError::unsupported("no process table"));
    assert_eq!(errored(step(&mut c, "process-list", json!({})).await).message, "no process table");
}

#[tokio::test]
async fn signal_names_and_numbers() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    step(&mut c, "exec", json!({ "cmd": "server", "background": true })).await.unwrap();
    let cases: &[(JsonValue, i32)] = &[
        (JsonValue::Null, 15),
        (json!("TERM"), 15),
        (json!("SIGKILL"), 9),
        (json!("int"), 2),
        (json!("HUP"), 1),
        (json!("QUIT"), 3),
        (json!("USR1"), 10),
        (json!("USR2"), 12),
        (json!("STOP"), 19),
        (json!("CONT"), 18),
        (json!("9"), 9),
        (json!(15), 15),
        (json!(" SIGTERM "), 15),
        (json!("sigterm"), 15),
        (json!("SigHup"), 1),
    ];
    for (sig, num) in cases {
        let args = if sig.is_null() { json!({ "pid": FIRST_PID }) } else { json!({ "pid": FIRST_PID, "signal": sig }) };
        let out = step(&mut c, "signal", args).await.unwrap_or_else(|e| panic!("signal {sig}: {}", e.message));
        assert_eq!(out, json!({ "pid": FIRST_PID, "signal": num }), "signal {sig}");
    }
    {
        let s = p.state();
        assert!(s.signals.iter().all(|(id, pid, _)| id == "sb-1" && *pid == FIRST_PID), "{:?}", s.signals);
        let sent: Vec<i32> = s.signals.iter().map(|(_, _, n)| *n).collect();
        assert_eq!(sent, cases.iter().map(|(_, n)| *n).collect::<Vec<_>>());
    }
    // A templated pid arrives as a string.
    step(&mut c, "signal", json!({ "pid": FIRST_PID.to_string() })).await.unwrap();
}

#[tokio::test]
async fn signal_errors() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    step(&mut c, "exec", json!({ "cmd": "server", "background": true })).await.unwrap();
    let e = errored(step(&mut c, "signal", json!({ "pid": FIRST_PID, "signal": "BOGUS" })).await);
    assert_eq!(e.message, "unknown signal `BOGUS`: use TERM, KILL, INT, HUP, USR1, USR2, STOP, CONT or a number");
    assert!(p.state().signals.is_empty(), "nothing sent for an unknown name");
    let e = failed(step(&mut c, "signal", json!({ "pid": 999 })).await);
    assert_eq!(e.message, "process 999 not found");
    assert_eq!(errored(step(&mut c, "signal", json!({})).await).message, "missing required field `pid` for `signal`");
}

#[tokio::test]
async fn wait_returns_the_process_outputs() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.table(&[("job", done("out\n", "err\n", 4))]);
    step(&mut c, "exec", json!({ "cmd": "job", "background": true })).await.unwrap();
    let out = step(&mut c, "wait", json!({ "pid": FIRST_PID.to_string() })).await.unwrap();
    assert_eq!(
        timeless(out),
        json!({ "stdout": "out\n", "stderr": "err\n", "exit_code": 4, "signal": null, "timed_out": false, "pid": FIRST_PID,
            "stdout_dropped": 0, "stderr_dropped": 0 })
    );
    step(&mut c, "wait", json!({ "pid": FIRST_PID, "timeout": "5s" })).await.unwrap();
    let s = p.state();
    assert_eq!(
        s.waits,
        [
            ("sb-1".to_string(), FIRST_PID, Duration::from_secs(30)),
            ("sb-1".to_string(), FIRST_PID, Duration::from_secs(5))
        ]
    );
}

#[tokio::test]
async fn wait_fails_when_the_process_outlives_the_limit() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.script(|_, _| ExecResult { stdout: b"partial".to_vec(), timed_out: true, ..Default::default() });
    step(&mut c, "exec", json!({ "cmd": "forever", "background": true })).await.unwrap();
    let e = failed(step(&mut c, "wait", json!({ "pid": FIRST_PID, "timeout": 1.5 })).await);
    assert_eq!(e.message, format!("process {FIRST_PID} still running after 1.50s"));
    let out = outputs_of(&e);
    assert_eq!(
        (&out["stdout"], &out["timed_out"], &out["exit_code"]),
        (&json!("partial"), &json!(true), &JsonValue::Null)
    );
    let e = failed(step(&mut c, "wait", json!({ "pid": 4242 })).await);
    assert_eq!(e.message, "process 4242 not found");
}

// ---------------------------------------------------------------------------------------
// write-file, read-file, files

#[tokio::test]
async fn write_file_content() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let out = step(&mut c, "write-file", json!({ "path": "/tmp/a.txt", "content": "hi\n" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/tmp/a.txt", "size": 3 }));
    assert_eq!(p.file("sb-1", "/tmp/a.txt").as_deref(), Some(&b"hi\n"[..]));
    let out = step(&mut c, "write-file", json!({ "path": "notes/b.txt", "content": "é" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/home/user/notes/b.txt", "size": 2 }), "size in bytes; relative under home");
    // No source at all writes an empty file.
    let out = step(&mut c, "write-file", json!({ "path": "/tmp/empty" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/tmp/empty", "size": 0 }));
    assert_eq!(p.file("sb-1", "/tmp/empty"), Some(Vec::new()));
}

#[tokio::test]
async fn write_file_content_base64() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let bytes = [0u8, 0xff, 0x10, b'\n'];
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    let out = step(&mut c, "write-file", json!({ "path": "/tmp/bin", "content_base64": format!(" {encoded}\n") }))
        .await
        .unwrap();
    assert_eq!(out, json!({ "path": "/tmp/bin", "size": 4 }));
    assert_eq!(p.file("sb-1", "/tmp/bin").as_deref(), Some(&bytes[..]));
    let e = errored(step(&mut c, "write-file", json!({ "path": "/tmp/x", "content_base64": "not base64!" })).await);
    assert!(e.message.starts_with("`content_base64` is not valid base64: "), "{}", e.message);
    assert_eq!(p.file("sb-1", "/tmp/x"), None);
}

#[tokio::test]
async fn write_file_from_a_local_file_next_to_the_scenario() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/in.bin"), [1u8, 2, 3, 0xfe]).unwrap();
    c.scenario_dir = dir.path().to_path_buf();
    let out = step(&mut c, "write-file", json!({ "path": "/srv/in.bin", "from": "data/in.bin" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/srv/in.bin", "size": 4 }));
    assert_eq!(p.file("sb-1", "/srv/in.bin").as_deref(), Some(&[1u8, 2, 3, 0xfe][..]));
    let e = errored(step(&mut c, "write-file", json!({ "path": "/srv/x", "from": "data/missing" })).await);
    let want = format!("cannot read local file {}: ", dir.path().join("data/missing").display());
    assert!(e.message.starts_with(&want), "{}", e.message);
}

#[tokio::test]
async fn write_file_mode() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    for (mode, bits) in [("0755", 0o755), ("0o600", 0o600), (" 4755 ", 0o4755), ("644", 0o644)] {
        step(&mut c, "write-file", json!({ "path": "/tmp/run.sh", "content": "#!/bin/sh\n", "mode": mode }))
            .await
            .unwrap();
        assert_eq!(p.state().sandboxes["sb-1"].fs.files["/tmp/run.sh"].1, bits, "mode {mode}");
    }
    for bad in ["999", "17777", "rwx", ""] {
        let e = errored(step(&mut c, "write-file", json!({ "path": "/tmp/y", "content": "", "mode": bad })).await);
        assert_eq!(e.message, format!("`mode` must be octal permission bits like \"0644\", got {bad:?}"));
    }
    assert_eq!(p.file("sb-1", "/tmp/y"), None);
}

#[tokio::test]
async fn write_file_takes_only_one_source() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    for args in [
        json!({ "path": "/tmp/z", "content": "a", "content_base64": "YQ==" }),
        json!({ "path": "/tmp/z", "content": "a", "from": "x" }),
        json!({ "path": "/tmp/z", "content_base64": "YQ==", "from": "x" }),
    ] {
        let e = errored(step(&mut c, "write-file", args).await);
        assert_eq!(e.message, "give only one of `content`, `content_base64`, `from`");
    }
    // A null source (an empty template) does not count.
    step(&mut c, "write-file", json!({ "path": "/tmp/z", "content": "a", "from": null })).await.unwrap();
    assert_eq!(p.state().calls.iter().filter(|c| **c == "write_file").count(), 1);
    assert_eq!(
        errored(step(&mut c, "write-file", json!({ "content": "a" })).await).message,
        "missing required field `path` for `write-file`"
    );
}

#[tokio::test]
async fn read_file_text_and_base64() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.put_file("sb-1", "/tmp/hello.txt", b"hello\n");
    p.put_file("sb-1", "/tmp/bin", &[0x00, 0xff, 0xfe]);
    let out = step(&mut c, "read-file", json!({ "path": "/tmp/hello.txt" })).await.unwrap();
    assert_eq!(out, json!({ "content": "hello\n", "size": 6 }));
    let out = step(&mut c, "read-file", json!({ "path": "/tmp/bin", "encoding": "base64" })).await.unwrap();
    assert_eq!(out, json!({ "content": "AP/+", "size": 3 }));
    let out = step(&mut c, "read-file", json!({ "path": "/tmp/hello.txt", "encoding": "text" })).await.unwrap();
    assert_eq!(out["content"], "hello\n");

    let e = failed(step(&mut c, "read-file", json!({ "path": "/tmp/bin" })).await);
    assert_eq!(e.message, "/tmp/bin is not UTF-8 text; read it with `encoding: base64`");
    let e = failed(step(&mut c, "read-file", json!({ "path": "/tmp/nope" })).await);
    assert_eq!(e.message, "no such file: /tmp/nope");
    p.fail("read_file", ProviderError::infra("envd crashed"));
    assert_eq!(errored(step(&mut c, "read-file", json!({ "path": "/tmp/hello.txt" })).await).message, "envd crashed");
}

#[tokio::test]
async fn files_list_is_sorted_with_entries() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.put_file("sb-1", "/srv/b.txt", b"bb");
    p.put_file("sb-1", "/srv/a.txt", b"a");
    p.put_file("sb-1", "/srv/sub/deep.txt", b"not listed");
    let out = step(&mut c, "files", json!({ "op": "list", "path": "/srv" })).await.unwrap();
    assert_eq!(
        out,
        json!({
            "entries": [
                { "name": "a.txt", "path": "/srv/a.txt", "type": "file", "size": 1, "mode": "0644", "modified": NOW },
                { "name": "b.txt", "path": "/srv/b.txt", "type": "file", "size": 2, "mode": "0644", "modified": NOW },
                { "name": "sub", "path": "/srv/sub", "type": "dir", "size": 4096, "mode": "0755", "modified": NOW },
            ],
            "names": ["a.txt", "b.txt", "sub"],
            "count": 3,
        })
    );
    let e = failed(step(&mut c, "files", json!({ "op": "list", "path": "/nowhere" })).await);
    assert_eq!(e.message, "no such directory: /nowhere");
}

#[tokio::test]
async fn files_stat_mkdir_exists() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    step(&mut c, "write-file", json!({ "path": "/tmp/x.sh", "content": "echo\n", "mode": "0700" })).await.unwrap();
    let out = step(&mut c, "files", json!({ "op": "stat", "path": "/tmp/x.sh" })).await.unwrap();
    assert_eq!(
        out,
        json!({ "name": "x.sh", "path": "/tmp/x.sh", "type": "file", "size": 5, "mode": "0700", "modified": NOW })
    );
    let out = step(&mut c, "files", json!({ "op": "mkdir", "path": "work/a/b" })).await.unwrap();
    assert_eq!(
        out,
        json!({ "name": "b", "path": "/home/user/work/a/b", "type": "dir", "size": 4096, "mode": "0755", "modified": NOW })
    );
    let out = step(&mut c, "files", json!({ "op": "exists", "path": "/home/user/work/a" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/home/user/work/a", "exists": true }));
    let out = step(&mut c, "files", json!({ "op": "exists", "path": "/tmp/nope" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/tmp/nope", "exists": false }));
    let e = failed(step(&mut c, "files", json!({ "op": "stat", "path": "/tmp/nope" })).await);
    assert_eq!(e.message, "no such file: /tmp/nope");
    let e = failed(step(&mut c, "files", json!({ "op": "mkdir", "path": "/tmp/x.sh" })).await);
    assert_eq!(e.message, "/tmp/x.sh exists and is not a directory");
}

#[tokio::test]
async fn files_move_and_remove() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.put_file("sb-1", "/tmp/a.txt", b"abc");
    let out = step(&mut c, "files", json!({ "op": "move", "path": "/tmp/a.txt", "to": "/srv/b.txt" })).await.unwrap();
    assert_eq!(
        out,
        json!({ "name": "b.txt", "path": "/srv/b.txt", "type": "file", "size": 3, "mode": "0644", "modified": NOW })
    );
    assert_eq!((p.file("sb-1", "/tmp/a.txt"), p.file("sb-1", "/srv/b.txt")), (None, Some(b"abc".to_vec())));
    let e = errored(step(&mut c, "files", json!({ "op": "move", "path": "/srv/b.txt" })).await);
    assert_eq!(e.message, "`move` needs `to`");
    let e = failed(step(&mut c, "files", json!({ "op": "move", "path": "/tmp/a.txt", "to": "/tmp/c" })).await);
    assert_eq!(e.message, "no such file: /tmp/a.txt");

    let out = step(&mut c, "files", json!({ "op": "remove", "path": "/srv" })).await.unwrap();
    assert_eq!(out, json!({ "path": "/srv", "removed": true }));
    assert_eq!(p.file("sb-1", "/srv/b.txt"), None, "a directory goes with its contents");
    let e = failed(step(&mut c, "files", json!({ "op": "remove", "path": "/srv" })).await);
    assert_eq!(e.message, "no such file: /srv");
}

#[tokio::test]
async fn files_argument_errors() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let e = errored(step(&mut c, "files", json!({ "op": "chmod", "path": "/tmp" })).await);
    assert_eq!(e.message, "invalid value `chmod` for `op` of `files`");
    assert_eq!(
        errored(step(&mut c, "files", json!({ "path": "/tmp" })).await).message,
        "missing required field `op` for `files`"
    );
    assert_eq!(
        errored(step(&mut c, "files", json!({ "op": "list" })).await).message,
        "missing required field `path` for `files`"
    );
    p.fail("exists", ProviderError::infra("filesystem api down"));
    let e = errored(step(&mut c, "files", json!({ "op": "exists", "path": "/tmp" })).await);
    assert_eq!(e.message, "filesystem api down");
}

// ---------------------------------------------------------------------------------------
// assert-stdout, assert-stderr, assert-exit, assert-file, assert

/// A context whose last command printed `hello\n` / `oops\n` and exited 3, and whose
/// `steps.first` printed `first\n` and exited 0.
async fn ctx_after_exec(p: &Arc<FakeProvider>) -> StepCtx {
    let mut c = ctx_sb(p).await;
    p.table(&[("first", done("first\n", "", 0)), ("second", done("hello\n", "oops\n", 3))]);
    let first = step(&mut c, "exec", json!({ "cmd": "first" })).await.unwrap();
    c.outputs.insert("first".into(), first);
    // As the runner does for a step that `sets_last`.
    c.last_exec = Some(step(&mut c, "exec", json!({ "cmd": "second" })).await.unwrap());
    c
}

#[tokio::test]
async fn assert_stdout_pass_and_fail() {
    let p = fake();
    let mut c = ctx_after_exec(&p).await;
    assert_eq!(step(&mut c, "assert-stdout", json!({ "equals": "hello\n" })).await.unwrap(), JsonValue::Null);
    step(&mut c, "assert-stdout", json!({ "contains": "ell", "starts_with": "he", "lines": 1 })).await.unwrap();
    let e = failed(step(&mut c, "assert-stdout", json!({ "equals": "hello" })).await);
    assert_eq!(e.message, r#"stdout: expected "hello", found "hello\n" (only a trailing newline differs)"#);
    let m = e.mismatch.unwrap();
    assert_eq!((m.expected.as_str(), m.actual.as_str()), ("hello", "hello\n"));
    assert!(m.hint.unwrap().starts_with("only a trailing newline differs: "));
    let e = failed(step(&mut c, "assert-stdout", json!({ "contains": "bye" })).await);
    assert_eq!(e.message, r#"stdout: expected text containing "bye", found "hello\n""#);
    assert_eq!(e.mismatch, None);
    // All clauses must hold.
    let e = failed(step(&mut c, "assert-stdout", json!({ "contains": "ell", "empty": true })).await);
    assert_eq!(e.message, r#"stdout: expected empty text, found "hello\n""#);
}

#[tokio::test]
async fn assert_stdout_of_a_named_step() {
    let p = fake();
    let mut c = ctx_after_exec(&p).await;
    step(&mut c, "assert-stdout", json!({ "of": "first", "equals": "first\n" })).await.unwrap();
    let e = failed(step(&mut c, "assert-stdout", json!({ "of": "first", "equals": "hello\n" })).await);
    assert_eq!(e.mismatch, mismatch("hello\n", "first\n"));
    let e = errored(step(&mut c, "assert-stdout", json!({ "of": "nope", "equals": "" })).await);
    assert_eq!(e.message, "step `nope` has not run");
    let e = errored(step(&mut c, "assert-stdout", json!({ "of": "first" })).await);
    assert_eq!(e.message, "`assert-stdout` needs a matcher");
    let e = errored(step(&mut c, "assert-stdout", json!({ "bogus": 1 })).await);
    assert_eq!(e.message, "unknown field `bogus` for `assert-stdout`");
}

/// Issue 26 item 4, at run time (an `of:` rendered from an expression): a step without stdout
/// was checked as an empty text, and `not_contains`, `empty` passed vacuously.
#[tokio::test]
async fn an_assertion_of_a_step_without_that_output_is_an_error_not_a_vacuous_pass() {
    let p = fake();
    let mut c = ctx_after_exec(&p).await;
    c.outputs.insert("vars".into(), JsonValue::Null);
    c.outputs.insert("web".into(), json!({ "status": 200, "body": "ok" }));
    let e = errored(step(&mut c, "assert-stdout", json!({ "of": "vars", "not_contains": "secret" })).await);
    assert!(e.message.starts_with("step `vars` has no stdout to check"), "{}", e.message);
    assert!(e.bad_args);
    let e = errored(step(&mut c, "assert-stderr", json!({ "of": "web", "empty": true })).await);
    assert!(e.message.starts_with("step `web` has no stderr to check"), "{}", e.message);
    let e = errored(step(&mut c, "assert-exit", json!({ "of": "web", "code": 0 })).await);
    assert!(e.message.starts_with("step `web` has no exit_code to check"), "{}", e.message);
}

#[tokio::test]
async fn assert_stdout_needs_a_command() {
    let p = fake();
    let mut c = ctx(&p);
    let e = errored(step(&mut c, "assert-stdout", json!({ "equals": "" })).await);
    assert_eq!(e.message, "no command has run yet: add an `exec` step before this assertion");
}

#[tokio::test]
async fn assert_stderr_pass_and_fail() {
    let p = fake();
    let mut c = ctx_after_exec(&p).await;
    step(&mut c, "assert-stderr", json!({ "equals": "oops\n" })).await.unwrap();
    step(&mut c, "assert-stderr", json!({ "matches": "^o+ps$" })).await.unwrap_err();
    step(&mut c, "assert-stderr", json!({ "matches": "(?m)^o+ps$" })).await.unwrap();
    let e = failed(step(&mut c, "assert-stderr", json!({ "not_contains": "oops" })).await);
    assert_eq!(e.message, r#"stderr: expected text not containing "oops", found "oops\n""#);
    assert_eq!(e.mismatch, None);
    let e = failed(step(&mut c, "assert-stderr", json!({ "of": "first", "contains": "oops" })).await);
    assert_eq!(e.message, r#"stderr: expected text containing "oops", found """#);
    step(&mut c, "assert-stderr", json!({ "of": "first", "empty": true })).await.unwrap();
}

#[tokio::test]
async fn assert_exit_pass_and_fail() {
    let p = fake();
    let mut c = ctx_after_exec(&p).await;
    assert_eq!(step(&mut c, "assert-exit", json!({ "code": 3 })).await.unwrap(), JsonValue::Null);
    step(&mut c, "assert-exit", json!({ "code": "3" })).await.unwrap();
    step(&mut c, "assert-exit", json!({ "code": 0, "of": "first" })).await.unwrap();
    let e = failed(step(&mut c, "assert-exit", json!({ "code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found 3");
    assert_eq!(e.mismatch, mismatch("0", "3"));

    c.last_exec = Some(json!({ "exit_code": null, "signal": 15 }));
    let e = failed(step(&mut c, "assert-exit", json!({ "code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found none (killed by signal 15)");
    assert_eq!(e.mismatch, mismatch("0", "none (killed by signal 15)"));
    c.last_exec = Some(json!({ "exit_code": null, "signal": null }));
    let e = failed(step(&mut c, "assert-exit", json!({ "code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found none (still running or unknown)");
    assert_eq!(
        errored(step(&mut c, "assert-exit", json!({})).await).message,
        "missing required field `code` for `assert-exit`"
    );
    let e = errored(step(&mut c, "assert-exit", json!({ "code": 0, "of": "later" })).await);
    assert_eq!(e.message, "step `later` has not run");
}

#[tokio::test]
async fn assert_file_with_a_matcher() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.put_file("sb-1", "/tmp/hello.txt", b"hi there\n");
    let out = step(&mut c, "assert-file", json!({ "path": "/tmp/hello.txt", "contains": "there" })).await.unwrap();
    assert_eq!(
        out,
        json!({
            "content": "hi there\n",
            "size": 9,
            "sha256": "c641344867e9806fadfd219f25b62b97c94db0eed04a1d79e93676533cfb782b",
        })
    );
    // No matcher: only existence.
    step(&mut c, "assert-file", json!({ "path": "/tmp/hello.txt" })).await.unwrap();
    step(&mut c, "assert-file", json!({ "path": "/tmp/hello.txt", "exists": true, "ends_with": "\n" })).await.unwrap();

    let e = failed(step(&mut c, "assert-file", json!({ "path": "/tmp/hello.txt", "equals": "hi" })).await);
    assert_eq!(e.message, r#"/tmp/hello.txt: expected "hi", found "hi there\n""#);
    assert_eq!(e.mismatch, mismatch("hi", "hi there\n"));
    assert_eq!(outputs_of(&e)["size"], json!(9));
    assert_eq!(outputs_of(&e)["content"], json!("hi there\n"));
}

#[tokio::test]
async fn assert_file_existence() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    p.put_file("sb-1", "/tmp/there", b"x");
    let e = failed(step(&mut c, "assert-file", json!({ "path": "/tmp/missing", "contains": "x" })).await);
    assert_eq!(e.message, "expected /tmp/missing to exist, found none (no such file: /tmp/missing)");
    let out = step(&mut c, "assert-file", json!({ "path": "/tmp/missing", "exists": false })).await.unwrap();
    assert_eq!(out, json!({ "content": null, "size": null }));
    step(&mut c, "assert-file", json!({ "path": "/tmp/missing", "exists": "false" })).await.unwrap();
    let e = failed(step(&mut c, "assert-file", json!({ "path": "/tmp/there", "exists": false })).await);
    assert_eq!(e.message, "expected /tmp/there not to exist, found a file of 1 bytes");
    p.fail("read_file", ProviderError::infra("envd crashed"));
    let e = errored(step(&mut c, "assert-file", json!({ "path": "/tmp/there", "exists": false })).await);
    assert_eq!(e.message, "envd crashed");
    let mut empty = ctx(&p);
    let e = errored(step(&mut empty, "assert-file", json!({ "path": "/tmp/there" })).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
}

#[tokio::test]
async fn assert_literal_values() {
    let p = fake();
    let mut c = ctx(&p);
    for v in [json!(true), json!(1), json!([0]), json!({ "a": 1 })] {
        assert_eq!(step(&mut c, "assert", json!({ "that": v })).await.unwrap(), JsonValue::Null, "{v}");
    }
    for v in [json!(false), json!(0), json!([]), json!({})] {
        let e = failed(step(&mut c, "assert", json!({ "that": v })).await);
        assert_eq!(e.message, format!("assertion failed: {v}"));
    }
    let e = failed(step(&mut c, "assert", json!({ "that": false, "message": "no files in /tmp" })).await);
    assert_eq!(e.message, "no files in /tmp (false)");
    assert_eq!(errored(step(&mut c, "assert", json!({})).await).message, "missing required field `that` for `assert`");
}

#[tokio::test]
async fn assert_expressions_use_the_template_context() {
    let p = fake();
    let mut c = ctx(&p);
    c.expr_ctx = MValue::from(Serde(json!({
        "steps": { "a": { "exit_code": 0, "names": ["x", "y"] } },
        "vars": { "n": 3 },
    })));
    step(&mut c, "assert", json!({ "that": "steps.a.exit_code == 0" })).await.unwrap();
    step(&mut c, "assert", json!({ "that": "steps.a.names | length > 1 and vars.n >= 3" })).await.unwrap();
    step(&mut c, "assert", json!({ "that": "{{ vars.n == 3 }}" })).await.unwrap();
    // Issue 27 item 2: the value of each operand follows, as pytest's assertion rewriting.
    let e = failed(step(&mut c, "assert", json!({ "that": "vars.n > 5" })).await);
    assert_eq!(e.message, "assertion failed: vars.n > 5\n  where vars.n = 3");
    let e = failed(step(&mut c, "assert", json!({ "that": "steps.a.names | length > 2 and vars.n >= 3" })).await);
    assert_eq!(
        e.message,
        "assertion failed: steps.a.names | length > 2 and vars.n >= 3\n  where steps.a.names = [\"x\",\"y\"]\n  \
         where steps.a.names | length = 2\n  where vars.n = 3"
    );
    // The message quotes the step as written when the runner provides it; a template that
    // rendered to the expression is explained as rendered.
    c.current_source = Some("{{ vars.n }} > 5".into());
    let e = failed(step(&mut c, "assert", json!({ "that": "3 > 5", "message": "too few" })).await);
    assert_eq!(e.message, "too few ({{ vars.n }} > 5)");
    c.current_source = Some("{{ vars.n > 5 }}".into());
    let e = failed(step(&mut c, "assert", json!({ "that": false })).await);
    assert_eq!(e.message, "assertion failed: vars.n > 5\n  where vars.n = 3");
    let e = errored(step(&mut c, "assert", json!({ "that": "vars.n >" })).await);
    assert!(e.message.starts_with("cannot evaluate `vars.n >`: "), "{}", e.message);
}

// ---------------------------------------------------------------------------------------
// http-get, http

/// Serve a few routes on 127.0.0.1 until the test ends; returns the port.
async fn serve() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            tokio::spawn(answer(sock));
        }
    });
    port
}

async fn answer(mut sock: tokio::net::TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let Ok(n) = sock.read(&mut chunk).await else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) = (first.next().unwrap_or_default().to_string(), first.next().unwrap_or_default().to_string());
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = buf[head_end..].to_vec();
    while body.len() < len {
        let Ok(n) = sock.read(&mut chunk).await else { return };
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    // `/slow`: `/health` a third of a second late (Hurl's `duration` checks).
    let path = if path == "/slow" {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        "/health".to_string()
    } else {
        path
    };
    let (status, ctype, text) = match path.as_str() {
        "/health" => (200, "text/plain", "ok".to_string()),
        "/json" => (200, "application/json", r#"{"a":{"b":[1,2]},"name":"box"}"#.to_string()),
        "/echo" => (
            201,
            "application/json",
            json!({
                "method": method,
                "body": String::from_utf8_lossy(&body),
                "content_type": headers.get("content-type"),
                "token": headers.get("x-token"),
            })
            .to_string(),
        ),
        "/big" => (200, "text/plain", format!("{}end", "o".repeat(5000))),
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (200, "text/plain", "late".to_string())
        }
        _ => (404, "text/plain", "nope".to_string()),
    };
    let reason = if status == 404 { "Not Found" } else { "OK" };
    let resp = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nx-served-by: fake\r\nconnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = sock.write_all(resp.as_bytes()).await;
    let _ = sock.shutdown().await;
}

#[tokio::test]
async fn http_get_a_port_inside_the_sandbox() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let out = step(
        &mut c,
        "http-get",
        json!({ "port": port, "path": "/health", "expect": { "status": 200, "body": { "contains": "ok" } } }),
    )
    .await
    .unwrap();
    // The time it took is an output of its own (Hurl's `duration`), a whole number of ms.
    let mut out = out;
    let took = out.as_object_mut().unwrap().remove("duration_ms");
    assert!(took.as_ref().is_some_and(serde_json::Value::is_u64), "{took:?}");
    // What was sent, for -v and the reports.
    let sent = out.as_object_mut().unwrap().remove("request");
    assert_eq!(
        sent,
        Some(json!({ "method": "GET", "url": format!("http://127.0.0.1:{port}/health"), "headers": {}, "body": null }))
    );
    assert_eq!(
        out,
        json!({
            "status": 200,
            "body": "ok",
            "headers": { "content-type": "text/plain", "content-length": "2", "x-served-by": "fake", "connection": "close" },
            "json": null,
            "url": format!("http://127.0.0.1:{port}/health"),
            "body_dropped": 0,
        })
    );
    assert_eq!(p.state().port_urls, [("sb-1".to_string(), port)]);
    // A path without its slash, and a templated port as a string.
    let out = step(&mut c, "http-get", json!({ "port": port.to_string(), "path": "health" })).await.unwrap();
    assert_eq!(out["url"], format!("http://127.0.0.1:{port}/health"));
    let out = step(&mut c, "http-get", json!({ "port": port })).await.unwrap();
    assert_eq!(
        (&out["url"], &out["status"], &out["body"]),
        (&json!(format!("http://127.0.0.1:{port}/")), &json!(404), &json!("nope"))
    );
}

#[tokio::test]
async fn http_get_a_url_and_its_json() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx(&p);
    let url = format!("http://127.0.0.1:{port}/json");
    let out = step(
        &mut c,
        "http-get",
        json!({
            "url": url,
            "expect": {
                "status": [200, "204"],
                "json": [{ "path": "$.a.b[1]", "equals": 2 }, { "path": "$.name", "contains": "bo" }, { "path": "$.c", "exists": false }],
                "headers": { "Content-Type": "json", "x-served-by": "fake" },
            },
        }),
    )
    .await
    .unwrap();
    assert_eq!(out["json"], json!({ "a": { "b": [1, 2] }, "name": "box" }));
    assert_eq!(out["url"], url);
    assert!(p.state().port_urls.is_empty(), "a URL needs no sandbox");
}

#[tokio::test]
async fn http_expectations_fail_with_the_response() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let get = |path: &str, expect: JsonValue| json!({ "port": port, "path": path, "expect": expect });

    let e = failed(step(&mut c, "http-get", get("/missing", json!({ "status": [200, 204] }))).await);
    assert_eq!(e.message, "expected status [200,204], found 404; body: \"nope\"");
    assert_eq!(e.mismatch, mismatch("[200,204]", "404"));
    let out = outputs_of(&e);
    assert_eq!((&out["status"], &out["body"]), (&json!(404), &json!("nope")));
    step(&mut c, "http-get", get("/missing", json!({ "status": "404" }))).await.unwrap();

    let e = failed(step(&mut c, "http-get", get("/health", json!({ "body": "okay" }))).await);
    assert_eq!(e.message, r#"body: expected "okay", found "ok""#);
    assert_eq!(e.mismatch, mismatch("okay", "ok"));
    assert_eq!(outputs_of(&e)["body"], "ok");

    let e = failed(
        step(&mut c, "http-get", get("/json", json!({ "json": [{ "path": "$.name", "equals": "crate" }] }))).await,
    );
    assert_eq!(e.message, r#"body: at $.name: expected "crate", found "box""#);
    assert_eq!(outputs_of(&e)["status"], 200);
    let e =
        failed(step(&mut c, "http-get", get("/health", json!({ "json": [{ "path": "$.a", "exists": true }] }))).await);
    assert!(e.message.starts_with(r#"body: expected JSON, found "ok""#), "{}", e.message);

    let e = failed(step(&mut c, "http-get", get("/health", json!({ "headers": { "X-Served-By": "zzz" } }))).await);
    assert_eq!(e.message, r#"header X-Served-By: expected a value containing "zzz", found "fake""#);
    assert_eq!(outputs_of(&e)["headers"]["x-served-by"], "fake");
    let e = failed(step(&mut c, "http-get", get("/health", json!({ "headers": { "x-nope": "" } }))).await);
    assert_eq!(e.message, "expected header x-nope, found no such header");
    let e = errored(step(&mut c, "http-get", get("/health", json!({ "body": { "bogus": 1 } }))).await);
    assert_eq!(e.message, "`body`: unknown matcher `bogus`");
}

/// Issue 37 item 12: Hurl's `duration < N` as `expect: { duration_ms: { lt: N } }`.
#[tokio::test]
async fn http_duration_is_an_output_and_can_be_bounded() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let get = |expect: JsonValue| json!({ "port": port, "path": "/slow", "expect": expect });
    let e = failed(step(&mut c, "http-get", get(json!({ "status": 200, "duration_ms": { "lt": 100 } }))).await);
    assert!(e.message.starts_with("expected duration_ms < 100, the response took "), "{}", e.message);
    let took = outputs_of(&e)["duration_ms"].as_u64().unwrap();
    assert!((300..10_000).contains(&took), "{took}");
    let e = failed(step(&mut c, "http-get", get(json!({ "duration_ms": { "le": 250 } }))).await);
    assert!(e.message.starts_with("expected duration_ms <= 250"), "{}", e.message);
    let out = step(&mut c, "http-get", get(json!({ "duration_ms": { "lt": 20_000, "le": 20_000 } }))).await.unwrap();
    assert!(out["duration_ms"].as_u64().unwrap() >= 300, "{out}");
}

#[tokio::test]
async fn http_with_a_method_body_and_headers() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let out = step(
        &mut c,
        "http",
        json!({
            "method": "POST", "port": port, "path": "/echo", "headers": { "X-Token": "t1" },
            "body": { "a": 1 }, "expect": { "status": 201 },
        }),
    )
    .await
    .unwrap();
    assert_eq!(
        out["json"],
        json!({ "method": "POST", "body": "{\"a\":1}", "content_type": "application/json", "token": "t1" })
    );
    // A string body goes as it is; the method may be lowercase.
    let out = step(&mut c, "http", json!({ "method": "put", "port": port, "path": "/echo", "body": "raw text" }))
        .await
        .unwrap();
    assert_eq!(out["json"], json!({ "method": "PUT", "body": "raw text", "content_type": null, "token": null }));
    let out = step(&mut c, "http", json!({ "method": "DELETE", "port": port, "path": "/echo" })).await.unwrap();
    assert_eq!(out["json"]["method"], "DELETE");
    assert_eq!(
        errored(step(&mut c, "http", json!({ "port": port })).await).message,
        "missing required field `method` for `http`"
    );
    let e = errored(step(&mut c, "http", json!({ "method": "GE T", "port": port })).await);
    assert_eq!(e.message, "invalid value `GE T` for `method` of `http`");
}

#[tokio::test]
async fn http_target_errors() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let e = errored(step(&mut c, "http-get", json!({ "url": "http://127.0.0.1:1/", "port": 80 })).await);
    assert_eq!(e.message, "give `url` or `port`, not both");
    let e = errored(step(&mut c, "http-get", json!({ "path": "/x" })).await);
    assert_eq!(e.message, "give `url`, or `port` (and `path`) inside the sandbox");
    let e = errored(step(&mut c, "http-get", json!({ "port": 70000 })).await);
    assert_eq!(e.message, "`port` must be an integer from 1 to 65535, found an integer 70000");
    p.fail("port_url", ProviderError::unsupported("ports are not exposed"));
    let e = errored(step(&mut c, "http-get", json!({ "port": 8000 })).await);
    assert_eq!(e.message, "ports are not exposed");
    let mut empty = ctx(&p);
    let e = errored(step(&mut empty, "http-get", json!({ "port": 8000 })).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
}

#[tokio::test]
async fn http_transport_failures_are_step_failures() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let p = fake();
    let mut c = ctx(&p);
    let e = failed(step(&mut c, "http-get", json!({ "url": format!("http://127.0.0.1:{port}/") })).await);
    let want = format!("request to http://127.0.0.1:{port}/ failed: ");
    assert!(e.message.starts_with(&want), "{}", e.message);
    // No response, so no status or body: only what was sent (for -v and the reports).
    let outputs = e.outputs.expect("the request is kept");
    assert_eq!(outputs["request"]["method"], "GET");
    assert!(outputs.get("status").is_none(), "{outputs}");

    let slow = serve().await;
    let started = std::time::Instant::now();
    let url = format!("http://127.0.0.1:{slow}/slow");
    let e = failed(step(&mut c, "http-get", json!({ "url": url, "request_timeout": "200ms" })).await);
    assert!(e.message.starts_with(&format!("request to {url} failed: ")), "{}", e.message);
    assert!(started.elapsed() < Duration::from_secs(4), "request_timeout was not applied");
}

#[tokio::test]
async fn an_http_body_past_max_output_is_read_counted_and_named_by_a_failing_expect() {
    let port = serve().await;
    let p = fake();
    let mut c = ctx(&p);
    c.max_output = 1000;
    let url = format!("http://127.0.0.1:{port}/big");
    let out = step(&mut c, "http-get", json!({ "url": url })).await.unwrap();
    assert_eq!((out["body"].as_str().unwrap().len(), &out["body_dropped"]), (1000, &json!(4003)));
    let e = failed(step(&mut c, "http-get", json!({ "url": url, "expect": { "body": { "ends_with": "end" } } })).await);
    assert!(
        e.message
            .ends_with("(the body was cut: its first 1000 B were kept and 3.9 KiB more dropped; raise --max-output)"),
        "{}",
        e.message
    );
    c.max_output = crate::provider::MAX_OUTPUT;
    let out =
        step(&mut c, "http-get", json!({ "url": url, "expect": { "body": { "ends_with": "end" } } })).await.unwrap();
    assert_eq!(out["body_dropped"], 0);
}

// ---------------------------------------------------------------------------------------
// set, sleep

#[tokio::test]
async fn set_binds_vars() {
    let p = fake();
    let mut c = ctx(&p);
    c.vars.insert("keep".into(), json!("me"));
    c.vars.insert("who".into(), json!("old"));
    let args = json!({ "who": "bob", "n": 3, "list": [1, 2] });
    assert_eq!(step(&mut c, "set", args.clone()).await.unwrap(), args);
    assert_eq!(JsonValue::Object(c.vars.clone()), json!({ "keep": "me", "who": "bob", "n": 3, "list": [1, 2] }));
    let e = errored(step(&mut c, "set", json!("who")).await);
    assert_eq!(e.message, "`set` takes a mapping of names to values");
}

#[tokio::test(start_paused = true)]
async fn sleep_waits_the_duration() {
    let p = fake();
    let mut c = ctx(&p);
    let t0 = tokio::time::Instant::now();
    assert!(
        tokio::time::timeout(Duration::from_secs(119), step(&mut c, "sleep", json!({ "duration": "2m" })))
            .await
            .is_err(),
        "returned before 2m"
    );
    let t0b = tokio::time::Instant::now();
    assert_eq!(step(&mut c, "sleep", json!({ "duration": "2m" })).await.unwrap(), JsonValue::Null);
    assert_eq!(t0b.elapsed(), Duration::from_secs(120));
    let t1 = tokio::time::Instant::now();
    step(&mut c, "sleep", json!({ "duration": 0.25 })).await.unwrap();
    assert_eq!(t1.elapsed(), Duration::from_millis(250));
    assert!(t0.elapsed() >= Duration::from_secs(239));
}

#[tokio::test]
async fn sleep_argument_errors() {
    let p = fake();
    let mut c = ctx(&p);
    assert_eq!(
        errored(step(&mut c, "sleep", json!({})).await).message,
        "missing required field `duration` for `sleep`"
    );
    let e = errored(step(&mut c, "sleep", json!({ "duration": "soon" })).await);
    assert_eq!(e.message, "bad duration for `duration`: invalid duration `soon`");
    // A templated value can render to any number; a bad one is an error, not a panic.
    let e = errored(step(&mut c, "sleep", json!({ "duration": -1 })).await);
    assert_eq!(
        e.message,
        "bad duration for `duration`: invalid duration `-1`: it must be a number of seconds, 0 or more"
    );
    let e = errored(step(&mut c, "sleep", json!({ "duration": 1e300 })).await);
    assert_eq!(e.message, "bad duration for `duration`: duration `1e300` is too long: the longest is 366 days (8784h)");
}

#[tokio::test]
async fn skip_ends_with_its_reason_and_needs_one() {
    let p = fake();
    let mut c = ctx(&p);
    let e = step(&mut c, "skip", json!({ "reason": "npm is missing" })).await.unwrap_err();
    assert_eq!((e.severity, e.message.as_str()), (Severity::Skip, "npm is missing"));
    assert_eq!(errored(step(&mut c, "skip", json!({})).await).message, "missing required field `reason` for `skip`");
    assert_eq!(errored(step(&mut c, "skip", json!({ "reason": " " })).await).message, "`skip` needs a reason");
}

// ---------------------------------------------------------------------------------------
// run-code

const DRIVER: &str = "/tmp/.scenario-run/driver.py";

/// Play python3: check the command and the files the step wrote, then write `result` (if
/// any) where the driver would and print `stdout`.
fn python(p: &FakeProvider, want_code: &'static str, result: Option<&'static str>, r: ExecResult) {
    p.script(move |req, fs| {
        let args: Vec<&str> = req.cmd.split(' ').collect();
        assert_eq!(args.len(), 4, "{}", req.cmd);
        assert_eq!((args[0], args[1]), ("python3", DRIVER));
        assert!(args[2].starts_with("/tmp/.scenario-run/cell-") && args[2].ends_with(".py"), "{}", args[2]);
        assert!(args[3].starts_with("/tmp/.scenario-run/result-") && args[3].ends_with(".json"), "{}", args[3]);
        assert!(String::from_utf8_lossy(fs.read(DRIVER).expect("driver written")).contains("ast.parse"));
        assert_eq!(fs.read(args[2]), Some(want_code.as_bytes()), "the cell holds the code");
        if let Some(result) = result {
            fs.write(args[3], result.as_bytes(), 0o644);
        }
        r.clone()
    });
}

#[tokio::test]
async fn run_code_returns_the_last_expression() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    python(
        &p,
        "x = 1 + 2\nprint('hi')\nx",
        Some(r#"{"results":[{"text":"3","json":3}],"error":null}"#),
        done("hi\n", "", 0),
    );
    let out = step(&mut c, "run-code", json!({ "via": "exec", "code": "x = 1 + 2\nprint('hi')\nx" })).await.unwrap();
    assert_eq!(
        timeless(out),
        json!({
            "stdout": "hi\n", "stderr": "", "exit_code": 0, "signal": null, "timed_out": false, "pid": FIRST_PID,
            "results": [{ "text": "3", "json": 3 }], "text": "3", "error": null,
            "logs": { "stdout": ["hi\n"], "stderr": [] },
            "stdout_dropped": 0, "stderr_dropped": 0, "results_dropped": 0, "frames_dropped": 0, "cut": null,
        })
    );
    let s = p.state();
    assert_eq!(s.execs[0].1.timeout, Some(EXEC_TIMEOUT));
    assert_eq!(s.execs[0].1.max_output, Some(crate::provider::MAX_OUTPUT), "--max-output reaches the provider");
    let left: Vec<&String> = s.sandboxes["sb-1"].fs.files.keys().collect();
    assert_eq!(left, [DRIVER], "the cell and result files are removed");
}

#[tokio::test]
async fn run_code_reports_a_python_exception() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    python(
        &p,
        "1/0",
        Some(r#"{"results":[],"error":{"name":"ZeroDivisionError","value":"division by zero","traceback":"tb"}}"#),
        done("", "", 0),
    );
    let out = step(&mut c, "run-code", json!({ "via": "exec", "code": "1/0", "language": "python", "timeout": "7s" }))
        .await
        .unwrap();
    assert_eq!(out["results"], json!([]));
    assert_eq!(out["text"], JsonValue::Null);
    assert_eq!(out["error"], json!({ "name": "ZeroDivisionError", "value": "division by zero", "traceback": "tb" }));
    assert_eq!(p.state().execs[0].1.timeout, Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn run_code_failures() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    python(&p, "x", None, done("", "bash: python3: command not found\n", 127));
    let e = errored(step(&mut c, "run-code", json!({ "via": "exec", "code": "x" })).await);
    assert_eq!(e.message, "python3 did not run the code (exit 127): bash: python3: command not found");
    assert_eq!(outputs_of(&e)["exit_code"], 127);

    python(&p, "x", None, ExecResult { exit_code: None, signal: Some(9), ..Default::default() });
    let e = errored(step(&mut c, "run-code", json!({ "via": "exec", "code": "x" })).await);
    assert_eq!(e.message, "python3 did not run the code (killed by signal 9)");

    python(&p, "x", Some("not json"), done("", "", 0));
    let e = errored(step(&mut c, "run-code", json!({ "via": "exec", "code": "x" })).await);
    assert!(e.message.starts_with("driver wrote bad JSON: "), "{}", e.message);

    python(&p, "while True: pass", None, ExecResult { timed_out: true, signal: Some(9), ..Default::default() });
    let e =
        failed(step(&mut c, "run-code", json!({ "via": "exec", "code": "while True: pass", "timeout": "1s" })).await);
    assert_eq!(e.message, "code timed out");
    assert_eq!(outputs_of(&e)["timed_out"], true);

    let e = errored(step(&mut c, "run-code", json!({ "via": "exec", "code": "1", "language": "js" })).await);
    assert_eq!(e.message, "language `js` is not supported: use python");
    assert_eq!(
        errored(step(&mut c, "run-code", json!({ "via": "exec" })).await).message,
        "missing required field `code` for `run-code`"
    );
    p.fail("write_file", ProviderError::infra("disk full"));
    assert_eq!(errored(step(&mut c, "run-code", json!({ "via": "exec", "code": "1" })).await).message, "disk full");
    let mut empty = ctx(&p);
    let e = errored(step(&mut empty, "run-code", json!({ "via": "exec", "code": "1" })).await);
    assert_eq!(e.message, "no sandbox: add a `create` step first");
}

// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn build_and_deploy_load_the_folder_and_collect_the_log() {
    let p = fake();
    let mut c = ctx(&p);
    let out = step(&mut c, "build", json!({ "template": "python-hello" })).await.unwrap();
    assert_eq!(out["name"], "python-hello");
    assert_eq!(out["image"], "fake/python-hello");
    assert!(out["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(out["log"], "building python-hello\ndone");
    let out = step(&mut c, "deploy", json!({ "template": "python-hello", "keep": true })).await.unwrap();
    assert_eq!(out["template_id"], "tpl-python-hello");
    assert_eq!(out["cached"], true, "keep reaches the provider");
    assert_eq!(out["log"], "deploying python-hello");
    let out = step(&mut c, "build", json!({ "template": "python-hello", "skip_cache": true })).await.unwrap();
    assert_eq!(out["log"], "building python-hello\nskip_cache\ndone", "skip_cache reaches the provider");

    let e = errored(step(&mut c, "build", json!({ "template": "no-such-template" })).await);
    assert!(e.message.starts_with("no template folder templates/no-such-template (looked for `templates/no-such-template` in the folders above the scenario file; set SCENARIO_RUN_TEMPLATES_DIR"), "{}", e.message);

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("broken")).unwrap();
    std::fs::write(dir.path().join("broken/Dockerfile"), "FROM x\nRUN [\"a\",\n").unwrap();
    c.scenario_dir = dir.path().to_path_buf();
    let e = errored(step(&mut c, "build", json!({ "template": "broken", "path": "broken" })).await);
    assert!(e.message.contains("broken/Dockerfile:2:5"), "{}", e.message);
    let e = errored(step(&mut c, "deploy", json!({ "template": "other", "path": "broken" })).await);
    assert!(e.message.contains("Dockerfile"), "{}", e.message);
}

#[test]
fn every_registry_kind_is_tested() {
    let src: String = include_str!("tests.rs").split_whitespace().collect();
    let untested: Vec<&str> = registry::names().filter(|k| !src.contains(&format!("step(&mutc,\"{k}\""))).collect();
    assert!(untested.is_empty(), "step kinds without a test here: {untested:?}");
}

#[tokio::test]
async fn scripted_model_needs_a_provider_that_can_expose_the_host() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let e = errored(step(&mut c, "scripted-model", json!({ "file": "/tmp/x", "content": "hi" })).await);
    assert!(e.message.contains("cannot make a service of this machine reachable"), "{}", e.message);
    let e = errored(step(&mut c, "scripted-model", json!({ "file": "x", "content": "hi" })).await);
    assert!(e.message.contains("absolute path"), "{}", e.message);
    assert!(c.services.is_empty());
}

/// Issue 13: a rendered duration that does not fit (`timeout: "{{ vars.t }}"` with a huge
/// number) is the step's error, not a panic in `Duration::from_secs_f64`.
#[tokio::test]
async fn rendered_huge_durations_are_errors() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    for timeout in [json!(1e300), json!("99999999999999999999h"), json!(-1), json!("1e300")] {
        let e = step(&mut c, "exec", json!({ "cmd": "true", "timeout": timeout.clone() })).await.unwrap_err();
        assert!(e.message.contains("timeout"), "{timeout}: {}", e.message);
    }
    let e = step(&mut c, "sleep", json!({ "duration": 1e300 })).await.unwrap_err();
    assert!(e.message.contains("too long"), "{}", e.message);
}

/// Issue 18: `http-get: { port: 8000 }` with nothing listening said "request to
/// http://127.0.0.1:43595/health failed: … connection reset": the forwarder's port, not 8000.
/// A forwarder accepts and then closes; a plain port refuses; E2B's proxy answers 502.
#[tokio::test]
async fn nothing_listening_names_the_sandbox_port() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    // A forwarder with nothing behind it: accepts, then closes.
    let fwd = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fport = fwd.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((sock, _)) = fwd.accept().await {
            drop(sock);
        }
    });
    let e = failed(step(&mut c, "http-get", json!({ "port": fport, "path": "/health" })).await);
    assert_eq!(
        e.message.replace(&fport.to_string(), "<port>"),
        "nothing is listening on port <port> in the sandbox: GET /health got connection closed before message \
         completed (through http://127.0.0.1:<port>); start a server on port <port> before this step, and give this \
         step `eventually: 10s` while it starts"
    );
    // Polled: the hint does not ask for what the step already has.
    c.polling = true;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let e = failed(step(&mut c, "http", json!({ "method": "post", "port": closed, "path": "/x" })).await);
    assert_eq!(
        e.message.replace(&closed.to_string(), "<port>"),
        "nothing is listening on port <port> in the sandbox: POST /x got connection refused \
         (through http://127.0.0.1:<port>); start a server on port <port> before this step"
    );
    c.polling = false;
    // A URL is the author's own: its failure names it.
    let e = failed(step(&mut c, "http-get", json!({ "url": format!("http://127.0.0.1:{closed}/y") })).await);
    assert!(e.message.starts_with(&format!("request to http://127.0.0.1:{closed}/y failed: ")), "{}", e.message);
    // E2B's proxy and `serve`: 502 "port is not open".
    let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let pport = proxy.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = proxy.accept().await {
            let mut buf = [0u8; 1024];
            let _ = sock.read(&mut buf).await;
            let body = r#"{"message":"The sandbox is running but port is not open","code":502}"#;
            let resp = format!("HTTP/1.1 502 Bad Gateway\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            let _ = tokio::io::AsyncWriteExt::write_all(&mut sock, resp.as_bytes()).await;
        }
    });
    let e = failed(step(&mut c, "http-get", json!({ "port": pport, "expect": { "status": 200 } })).await);
    assert!(
        e.message.starts_with(&format!(
            "expected status 200, found 502 (nothing is listening on port {pport} in the sandbox); body: "
        )),
        "{}",
        e.message
    );
}

// ---------------------------------------------------------------------------------------

/// `host` runs on this machine: outputs like exec's, `env` over the run's environment, `cwd`
/// relative to the scenario folder, stdin, the output cap, `exit_code`, and a timeout that
/// kills the whole process group.
#[tokio::test]
async fn host_runs_here_with_exec_outputs_env_cwd_stdin_and_a_group_kill() {
    let p = fake();
    let mut c = ctx(&p);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    c.scenario_dir = dir.path().to_path_buf();
    c.env = Arc::new(BTreeMap::from([
        ("FROM_RUN".to_string(), "run-env".to_string()),
        ("PATH".to_string(), std::env::var("PATH").unwrap()),
    ]));
    let out = step(&mut c, "host", json!({ "cmd": "echo hi; echo oops >&2; pwd; exit 3" })).await.unwrap();
    let pid = out["pid"].as_u64().unwrap();
    assert_eq!(
        timeless(out),
        json!({ "stdout": format!("hi\n{}\n", dir.path().display()), "stderr": "oops\n", "exit_code": 3, "signal": null,
                "timed_out": false, "pid": pid, "stdout_dropped": 0, "stderr_dropped": 0 })
    );
    assert!(p.state().calls.is_empty(), "the provider is not involved: {:?}", p.state().calls);

    let out = step(
        &mut c,
        "host",
        json!({ "cmd": "cat; echo \"$FROM_RUN $OWN\"; pwd", "stdin": "fed\n", "env": { "OWN": "mine", "FROM_RUN": "step wins" }, "cwd": "sub" }),
    )
    .await
    .unwrap();
    assert_eq!(out["stdout"], format!("fed\nstep wins mine\n{}/sub\n", dir.path().display()));

    c.max_output = 4;
    let out = step(&mut c, "host", json!({ "cmd": "printf 0123456789" })).await.unwrap();
    assert_eq!((out["stdout"].as_str(), out["stdout_dropped"].as_u64()), (Some("0123"), Some(6)));
    c.max_output = crate::provider::MAX_OUTPUT;

    let e = failed(step(&mut c, "host", json!({ "cmd": "echo bad >&2; exit 2", "exit_code": 0 })).await);
    assert_eq!(e.message, "expected exit code 0, found 2; stderr: bad");
    let e = errored(step(&mut c, "host", json!({ "cmd": "true", "cwd": "missing" })).await);
    assert!(e.message.contains("is not a directory"), "{}", e.message);

    let t0 = std::time::Instant::now();
    let e = failed(step(&mut c, "host", json!({ "cmd": "sleep 30 & echo $!; sleep 30", "timeout": "300ms" })).await);
    assert!(t0.elapsed() < Duration::from_secs(5), "the timeout stops it: {:?}", t0.elapsed());
    assert_eq!(e.message, "command timed out after 0.30s (host's `timeout`)");
    let out = e.outputs.unwrap();
    assert_eq!(
        (out["timed_out"].as_bool(), out["exit_code"].is_null(), out["signal"].as_i64()),
        (Some(true), true, Some(9))
    );
    let child: i32 = out["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(gone_soon(child), "the background sleep of the timed-out group is gone");
    assert!(gone_soon(out["pid"].as_i64().unwrap() as i32), "and so is its leader");
}

/// Whether `pid` has ended (gone, or a zombie) within a few seconds: a SIGKILL is delivered
/// at once but the process takes a moment to die on a busy machine.
fn gone_soon(pid: i32) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat.is_empty() || stat.contains(") Z ") {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A host step abandoned mid-way (the scenario's time is up, Ctrl-C) kills its group.
#[tokio::test]
async fn a_dropped_host_step_kills_its_process_group() {
    let p = fake();
    let mut c = ctx(&p);
    let marker = tempfile::NamedTempFile::new().unwrap();
    let path = marker.path().to_str().unwrap().to_string();
    let cmd = format!("sleep 30 & echo $! > {path}; sleep 30");
    let r = tokio::time::timeout(Duration::from_millis(500), step(&mut c, "host", json!({ "cmd": cmd }))).await;
    assert!(r.is_err(), "the step was still running");
    let child: i32 = std::fs::read_to_string(&path).unwrap().trim().parse().unwrap();
    assert!(gone_soon(child), "the background sleep died with the step");
    assert_eq!(crate::steps::host::kill_all(), 0, "no group is left registered");
}

#[tokio::test]
async fn pause_resume_snapshot_watch_and_pty_say_when_the_provider_lacks_them() {
    // The fake provider has none of these: each step is an ERROR naming what is missing (the
    // real effects are proven by scenarios/lifecycle/pause-resume.yaml, snapshot.yaml,
    // files/watch.yaml and commands/pty.yaml on local and through serve).
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let e = errored(step(&mut c, "pause", json!({})).await);
    assert_eq!(e.message, "fake cannot pause sandboxes");
    let e = errored(step(&mut c, "resume", json!({ "timeout": "1m" })).await);
    assert_eq!(e.message, "fake cannot resume sandboxes");
    let e = errored(step(&mut c, "snapshot", json!({})).await);
    assert_eq!(e.message, "fake cannot snapshot sandboxes");
    assert!(c.snapshots.is_empty(), "nothing to delete at the end");
    let e = errored(step(&mut c, "watch", json!({ "path": "/tmp" })).await);
    assert_eq!(e.message, "fake cannot watch directories");
    let e = errored(step(&mut c, "pty", json!({ "input": "tty\n" })).await);
    assert_eq!(e.message, "fake cannot give commands a terminal");
}

#[tokio::test]
async fn pty_and_watch_arguments_are_checked_before_anything_starts() {
    let p = fake();
    let mut c = ctx_sb(&p).await;
    let e = errored(step(&mut c, "pty", json!({ "cols": 0 })).await);
    assert!(e.message.contains("`cols` must be an integer from 1 to 65535"), "{}", e.message);
    let e = errored(step(&mut c, "pty", json!({ "script": [{ "type": "x" }] })).await);
    assert!(e.message.contains("each `script` item is { send, resize, expect }"), "{}", e.message);
    let e = errored(step(&mut c, "pty", json!({ "script": [{ "resize": { "cols": 80 } }] })).await);
    assert!(e.message.contains("`resize` is { cols: <n>, rows: <n> }"), "{}", e.message);
    let e = errored(step(&mut c, "pty", json!({ "script": "send" })).await);
    assert!(e.message.contains("`script` must be a list"), "{}", e.message);
    let e = errored(step(&mut c, "snapshot", json!({ "name": " " })).await);
    assert_eq!(e.message, "`name` must not be empty");

    let e = errored(step(&mut c, "watch-events", json!({})).await);
    assert_eq!(e.message, "no watch: add a `watch` step first");
    c.outputs.insert("made".into(), json!({ "id": "sb-1" }));
    let e = errored(step(&mut c, "watch-events", json!({ "of": "made" })).await);
    assert_eq!(e.message, "step `made` did not start a watch");
    let e = errored(step(&mut c, "watch-events", json!({ "expect": [{ "name": "a", "type": "poke" }] })).await);
    assert!(
        e.message.contains("each `expect` item is { name: <path>, type: <create|write|remove|rename|chmod> }"),
        "{}",
        e.message
    );
    let e = errored(step(&mut c, "watch-events", json!({ "expect": ["a"], "none": true })).await);
    assert_eq!(e.message, "`none: true` and `expect` contradict each other");
}

/// Issue 38 item 6: the `bench` step runs `scenario-run bench`'s iterations on the scenario's
/// provider, each sandbox tagged with the run's tag and killed, and gives its figures.
#[tokio::test]
async fn bench_measures_each_iteration_and_kills_its_sandboxes() {
    let p = fake();
    let mut c = ctx(&p);
    let out = step(&mut c, "bench", json!({ "iterations": 3, "mode": "burst" })).await.unwrap();
    assert_eq!(
        (out["succeeded"].as_u64(), out["failed"].as_u64(), out["success_rate"].as_f64()),
        (Some(3), Some(0), Some(1.0)),
        "{out}"
    );
    assert_eq!(out["mode"], "burst");
    let tti = &out["tti"];
    assert!(tti["p50"].as_f64().unwrap() <= tti["p95"].as_f64().unwrap(), "{out}");
    assert_eq!(tti["kept"].as_u64(), Some(3));
    let s = crate::provider::Provider::stats(p.as_ref());
    assert_eq!((s.created, s.live), (3, 0), "every sandbox killed");
}

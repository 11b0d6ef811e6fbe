//! envd's `process.Process` service: `Start` and `Connect` (server streams of a process's
//! events, with keepalives while idle), and the unary `List`, `SendSignal`, `SendInput`,
//! `CloseStdin` and `Update`. Processes get the sandbox's create-time `envVars` (applied by
//! the provider) and the request's `envs`; `Connect-Timeout-Ms` on `Process/Start` is the
//! process's lifetime. The table of started processes is `server::procs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::common::{keepalive_header, stream_call, stream_response, timeout_header, Frame, SandboxExt, SharedState};
use crate::provider::{ErrorKind, ExecRequest, OutputChunk, ProviderError};
use crate::server::connect::{self, lenient, RpcError, Unary};
use crate::server::mutants::{Fault, Mutants};
use crate::server::procs::{self, Event};
use crate::server::state::{AppState, ServedSandbox};
use crate::server::users::{basic_user, resolve};

#[derive(Debug, Deserialize, Default)]
struct ProcessConfig {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: ProcessConfig,
    #[serde(default)]
    pty: Option<Value>,
    #[serde(default)]
    tag: Option<String>,
    #[serde(default)]
    stdin: Option<bool>,
}

#[derive(Debug, Deserialize, Default)]
struct Selector {
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ProcessRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: Option<Value>,
    #[serde(default)]
    input: Option<Input>,
}

#[derive(Debug, Deserialize)]
struct Input {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

/// The bash command line that runs `cmd args…`: the SDK's `/bin/bash -l -c X` is taken as is
/// (the provider runs every command through `bash -l -c`), anything else is exec'd quoted.
fn command_line(cfg: &ProcessConfig) -> String {
    let is_bash = matches!(cfg.cmd.as_str(), "/bin/bash" | "bash" | "/usr/bin/bash");
    if is_bash && cfg.args.len() == 3 && matches!(cfg.args[0].as_str(), "-l" | "-lc") && cfg.args[1] == "-c" {
        return cfg.args[2].clone();
    }
    if is_bash && cfg.args.len() == 2 && matches!(cfg.args[0].as_str(), "-c" | "-lc") {
        return cfg.args[1].clone();
    }
    let mut s = String::from("exec");
    for a in std::iter::once(&cfg.cmd).chain(cfg.args.iter()) {
        s.push(' ');
        s.push_str(&shell_quote(a));
    }
    s
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn config_json(cfg: &ProcessConfig) -> Value {
    let mut v = json!({"cmd": cfg.cmd, "args": cfg.args, "envs": cfg.envs});
    if let Some(c) = &cfg.cwd {
        v["cwd"] = json!(c);
    }
    v
}

fn event_json(ev: Value) -> Value {
    json!({"event": ev})
}

/// Writes `start{pid}`, then the subscriber's events, keepalives while idle, and the end.
/// Stops when the client goes away (the process keeps running).
async fn pump(
    pid: u32,
    pty: bool,
    mut events: procs::Subscription,
    out: tokio::sync::mpsc::Sender<Frame>,
    keepalive: Duration,
    sock: Option<crate::server::answer::ConnSocket>,
    (m, sandbox): (Mutants, String),
) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut data_sent = 0usize;
    let send = |b: Bytes| out.send(Ok(b));
    if send(connect::message(&event_json(json!({"start": {"pid": pid}})))).await.is_err() {
        return;
    }
    loop {
        let ev = match tokio::time::timeout(keepalive, events.recv()).await {
            Err(_) => {
                if send(connect::message(&event_json(json!({"keepalive": {}})))).await.is_err() {
                    return;
                }
                continue;
            }
            Ok(ev) => ev,
        };
        if let Some(Event::Data(OutputChunk::Stdout(b) | OutputChunk::Stderr(b))) = &ev {
            data_sent += b.len();
            let past = m.has(Fault::OutputTailLost) && data_sent > 64 << 10;
            if past || (m.has(Fault::OutputStopsAfterResume) && m.was_resumed(&sandbox)) {
                continue;
            }
        }
        let frame = match ev {
            Some(Event::Data(OutputChunk::Stdout(b))) if pty => {
                connect::message(&event_json(json!({"data": {"pty": b64.encode(b)}})))
            }
            Some(Event::Data(OutputChunk::Stdout(b))) => {
                connect::message(&event_json(json!({"data": {"stdout": b64.encode(b)}})))
            }
            Some(Event::Data(OutputChunk::Stderr(b))) if m.has(Fault::StderrAsStdout) => {
                connect::message(&event_json(json!({"data": {"stdout": b64.encode(b)}})))
            }
            Some(Event::Data(OutputChunk::Stderr(b))) => {
                connect::message(&event_json(json!({"data": {"stderr": b64.encode(b)}})))
            }
            Some(Event::End(end)) => {
                let end =
                    if m.has(Fault::ExitCodeZero) { json!({"exited": true, "status": "exit status 0"}) } else { end };
                if send(connect::message(&event_json(json!({"end": end})))).await.is_ok() {
                    let _ = send(connect::end_stream(None)).await;
                }
                return;
            }
            Some(Event::Error(e)) => {
                let _ = send(connect::end_stream(Some(&e))).await;
                return;
            }
            Some(Event::Abort) => {
                if !out.is_closed() {
                    crate::server::answer::reset_on_close(sock);
                }
                let _ = out.send(Err(std::io::Error::other("the sandbox went away"))).await;
                return;
            }
            None => {
                let e = RpcError::new("internal", "process output ended without a status");
                let _ = send(connect::end_stream(Some(&e))).await;
                return;
            }
        };
        if send(frame).await.is_err() {
            return;
        }
    }
}

pub(super) async fn process_start(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    Extension(sock): Extension<Option<crate::server::answer::ConnSocket>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    stream_call(&st, &body, |req: StartRequest| start(&st, &sb, &headers, req, sock)).await
}

async fn start(
    st: &AppState,
    sb: &ServedSandbox,
    headers: &HeaderMap,
    req: StartRequest,
    sock: Option<crate::server::answer::ConnSocket>,
) -> Result<Response, RpcError> {
    let size = req.pty.as_ref().map(pty_size).transpose()?;
    if req.process.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is required"));
    }
    if let Some(bad) = req.process.envs.iter().find_map(|(k, v)| crate::server::sandboxes::env_problem(k, v)) {
        return Err(RpcError::invalid(bad));
    }
    let cwd = match req.process.cwd.as_deref() {
        None | Some("") => None,
        Some(c) => {
            let abs = resolve(c)?;
            match st.provider.sandbox(&sb.provider_id).stat(&abs).await {
                Ok(e) if e.kind == "dir" => {}
                Ok(_) => return Err(RpcError::invalid(format!("cwd '{abs}' is not a directory"))),
                Err(e) if e.kind == ErrorKind::NotFound => {
                    return Err(RpcError::invalid(format!("cwd '{abs}' does not exist")))
                }
                Err(e) => return Err(e.into()),
            }
            Some(abs)
        }
    };
    let exec = ExecRequest {
        cmd: command_line(&req.process),
        cwd: cwd.filter(|_| !st.mutants.has(Fault::CwdIgnored)),
        envs: if st.mutants.has(Fault::EnvIgnored) { Default::default() } else { req.process.envs.clone() },
        user: basic_user(headers),
        // The output reaches clients live (`procs`); what the provider would keep for `wait`
        // (64 MiB a stream by default) is never read here, so it keeps none.
        max_output: Some(0),
        ..Default::default()
    };
    // `stdin` absent means open (back-compat with old clients); the SDK sends false.
    let open_stdin = req.stdin.unwrap_or(true);
    let live = match size {
        Some((cols, rows)) => st.provider.sandbox(&sb.provider_id).spawn_pty(exec, cols, rows).await?,
        None => st.provider.sandbox(&sb.provider_id).spawn_live(exec, open_stdin).await?,
    };
    let pid = live.pid;
    let (_entry, events) = sb.procs.start(
        st.provider.clone(),
        sb.provider_id.clone(),
        live,
        crate::server::procs::Started { config: config_json(&req.process), tag: req.tag.clone(), pty: size.is_some() },
        timeout_header(headers),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let m = (st.mutants.clone(), sb.id.clone());
    tokio::spawn(killed_after(st, sb, pid, pump(pid, size.is_some(), events, tx, keepalive_header(headers), sock, m)));
    Ok(stream_response(st, rx))
}

/// A terminal's `{"size":{"cols":C,"rows":R}}` (envd's `PTY` message).
fn pty_size(v: &Value) -> Result<(u16, u16), RpcError> {
    let dim = |k: &str| {
        let n = &v["size"][k];
        n.as_u64().or_else(|| n.as_str().and_then(|s| s.parse().ok())).unwrap_or(0)
    };
    let (cols, rows) = (dim("cols"), dim("rows"));
    if cols == 0 || rows == 0 || cols > 10_000 || rows > 10_000 {
        return Err(RpcError::invalid(format!("invalid terminal size {cols}x{rows}")));
    }
    Ok((cols as u16, rows as u16))
}

/// `pump`, then (`background-dies-with-request` only) the process killed: the fault of a
/// platform that ties a process to the request that started it.
fn killed_after(
    st: &AppState,
    sb: &ServedSandbox,
    pid: u32,
    pump: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let kill = st.mutants.has(Fault::BackgroundDiesWithRequest).then(|| (st.provider.clone(), sb.provider_id.clone()));
    async move {
        pump.await;
        if let Some((provider, id)) = kill {
            let _ = provider.sandbox(&id).signal_group(pid, libc::SIGKILL).await;
        }
    }
}

fn find(sb: &ServedSandbox, sel: &Selector) -> Result<Arc<procs::Entry>, RpcError> {
    match (sel.pid, sel.tag.as_deref()) {
        (Some(pid), _) => sb.procs.by_pid(pid).ok_or_else(|| no_process(pid)),
        (None, Some(tag)) => {
            sb.procs.by_tag(tag).ok_or_else(|| RpcError::not_found(format!("process with tag {tag} not found")))
        }
        (None, None) => Err(RpcError::invalid("process selector needs a pid or a tag")),
    }
}

fn no_process(pid: u32) -> RpcError {
    RpcError::not_found(format!("process with pid {pid} not found"))
}

pub(super) async fn process_connect(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    Extension(sock): Extension<Option<crate::server::answer::ConnSocket>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    stream_call(&st, &body, |req: ProcessRequest| {
        let stream = find(&sb, &req.process).map(|entry| {
            let (tx, rx) = tokio::sync::mpsc::channel(64);
            let m = (st.mutants.clone(), sb.id.clone());
            let pump = pump(entry.pid, entry.pty, entry.subscribe(), tx, keepalive_header(&headers), sock, m);
            tokio::spawn(killed_after(&st, &sb, entry.pid, pump));
            stream_response(&st, rx)
        });
        std::future::ready(stream)
    })
    .await
}

unary_fn!(process_list, Value, |st, sb, _r| {
    let ours = sb.procs.running();
    // Processes the provider started itself, e.g. a template's start command (envd lists
    // those too: it started them).
    let theirs: Vec<Value> = st
        .provider
        .sandbox(&sb.provider_id)
        .process_list()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.running && !ours.iter().any(|e| e.pid == p.pid))
        .map(|p| json!({"config": {"cmd": "/bin/bash", "args": ["-l", "-c", p.cmd], "envs": {}}, "pid": p.pid}))
        .collect();
    let mut processes: Vec<Value> = ours
        .iter()
        .map(|e| {
            let mut v = json!({"config": e.config, "pid": e.pid});
            if let Some(t) = &e.tag {
                v["tag"] = json!(t);
            }
            v
        })
        .collect();
    processes.extend(theirs);
    Ok(json!({ "processes": processes }))
});

/// The pid a request addresses (by pid, or by the tag of a process we started).
fn target_pid(sb: &ServedSandbox, sel: &Selector) -> Result<u32, RpcError> {
    match sel.pid {
        Some(pid) => Ok(pid),
        None => find(sb, sel).map(|e| e.pid),
    }
}

fn process_err(pid: u32) -> impl Fn(ProviderError) -> RpcError {
    move |e| if e.kind == ErrorKind::NotFound { no_process(pid) } else { e.into() }
}

unary_fn!(send_signal, ProcessRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    let sig = match r.signal.as_ref() {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => libc::SIGKILL,
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => libc::SIGTERM,
        Some(Value::Number(n)) if n.as_i64() == Some(9) => libc::SIGKILL,
        Some(Value::Number(n)) if n.as_i64() == Some(15) => libc::SIGTERM,
        other => return Err(RpcError::unimplemented(format!("signal {other:?} is not supported"))),
    };
    st.provider.sandbox(&sb.provider_id).signal(pid, sig).await.map_err(process_err(pid))?;
    // envd answers once the process is gone (it reaps its children): a `kill -0` right
    // after a kill must not find it. Bounded; a process that ignores SIGTERM is left be.
    if sig == libc::SIGKILL {
        let _ = st.provider.sandbox(&sb.provider_id).wait(pid, Duration::from_secs(2)).await;
    }
    Ok(json!({}))
});

unary_fn!(send_input, ProcessRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    let input = r.input.ok_or_else(|| RpcError::invalid("input is required"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(typed) = input.pty {
        let data = b64.decode(typed).map_err(|e| RpcError::invalid(format!("pty input is not base64: {e}")))?;
        st.provider.sandbox(&sb.provider_id).write_pty(pid, data).await.map_err(process_err(pid))?;
        return Ok(json!({}));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(input.stdin.unwrap_or_default())
        .map_err(|e| RpcError::invalid(format!("stdin is not base64: {e}")))?;
    if st.mutants.has(Fault::StdinDropped) {
        return Ok(json!({}));
    }
    st.provider.sandbox(&sb.provider_id).write_stdin(pid, data).await.map_err(process_err(pid))?;
    Ok(json!({}))
});

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    pty: Option<Value>,
}

unary_fn!(update, UpdateRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    let Some(pty) = r.pty else { return Ok(json!({})) };
    let (cols, rows) = pty_size(&pty)?;
    st.provider.sandbox(&sb.provider_id).resize_pty(pid, cols, rows).await.map_err(process_err(pid))?;
    Ok(json!({}))
});

unary_fn!(close_stdin, ProcessRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    st.provider.sandbox(&sb.provider_id).close_stdin(pid).await.map_err(process_err(pid))?;
    Ok(json!({}))
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines() {
        let sdk = ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi".into()],
            ..Default::default()
        };
        assert_eq!(command_line(&sdk), "echo hi");
        let other = ProcessConfig { cmd: "ls".into(), args: vec!["-la".into(), "it's".into()], ..Default::default() };
        assert_eq!(command_line(&other), "exec 'ls' '-la' 'it'\\''s'");
    }
}

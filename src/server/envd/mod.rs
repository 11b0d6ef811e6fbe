//! The in-sandbox daemon (envd) API, served for the sandbox named by the request (see
//! `super::dispatch`): the `process.Process` and `filesystem.Filesystem` Connect services,
//! plain `GET`/`POST /files` and `/health` (protocol doc §4–§6, §9.3).
//!
//! Paths follow envd's resolution: empty → `/home/user`, `~` and `~/x` → the home
//! directory, relative → under the home directory. Processes get the sandbox's create-time
//! `envVars` (applied by the provider) and the request's `envs`; `Connect-Timeout-Ms` on
//! `Process/Start` is the process's lifetime. PTYs and watchers are not implemented (clean
//! `unimplemented` errors). Access tokens are checked before this router runs (`auth`);
//! `/files` is in `files`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::connect::{self, lenient, RpcError, Unary};
use super::procs::{self, Event};
use super::{json_error, limit_body, AppState, Sbx, RPC_BODY_LIMIT};
use crate::provider::{ErrorKind, ExecRequest, FileEntry, OutputChunk, ProviderError};

const HOME: &str = "/home/user";
/// Idle time between keepalive events when the client does not ask (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

type SharedState = axum::extract::State<Arc<AppState>>;
type SandboxExt = Extension<Arc<Sbx>>;

/// Routes of envd. Every handler finds its sandbox in the request extensions.
pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/process.Process/Start", post(process_start))
        .route("/process.Process/Connect", post(process_connect))
        .route("/process.Process/List", post(unary_route(process_list)))
        .route("/process.Process/SendSignal", post(unary_route(send_signal)))
        .route("/process.Process/SendInput", post(unary_route(send_input)))
        .route("/process.Process/CloseStdin", post(unary_route(close_stdin)))
        .route("/process.Process/Update", post(unary_route(update)))
        .route("/filesystem.Filesystem/Stat", post(unary_route(fs_stat)))
        .route("/filesystem.Filesystem/ListDir", post(unary_route(fs_list_dir)))
        .route("/filesystem.Filesystem/MakeDir", post(unary_route(fs_make_dir)))
        .route("/filesystem.Filesystem/Move", post(unary_route(fs_move)))
        .route("/filesystem.Filesystem/Remove", post(unary_route(fs_remove)))
        .route("/filesystem.Filesystem/CreateWatcher", post(unary_route(create_watcher)))
        .route("/filesystem.Filesystem/GetWatcherEvents", post(unary_route(get_watcher_events)))
        .route("/filesystem.Filesystem/RemoveWatcher", post(unary_route(remove_watcher)))
        .route("/filesystem.Filesystem/WatchDir", post(watch_dir))
        .fallback(unknown)
        .layer(DefaultBodyLimit::max(RPC_BODY_LIMIT))
        // Uploads are streamed to disk under their own limits (`files`).
        .route("/files", get(super::files::download).post(super::files::upload).layer(DefaultBodyLimit::disable()))
        .with_state(state)
}

async fn unknown(req: Request) -> Response {
    let path = req.uri().path();
    if path.starts_with("/process.") || path.starts_with("/filesystem.") {
        RpcError::unimplemented(format!("{path} is not implemented by scenario-run serve")).into_response()
    } else {
        json_error(StatusCode::NOT_FOUND, &format!("no route for {path}"))
    }
}

/// A unary handler: `(state, sandbox, body) -> JSON result`.
type UnaryFn = fn(Arc<AppState>, Arc<Sbx>, Bytes) -> futures_util::future::BoxFuture<'static, Unary>;

/// Adapts a unary handler to a route handler.
fn unary_route(
    f: UnaryFn,
) -> impl Fn(SharedState, SandboxExt, Bytes) -> futures_util::future::BoxFuture<'static, Response>
       + Clone
       + Send
       + Sync
       + 'static {
    move |axum::extract::State(st): SharedState, Extension(sb): SandboxExt, body: Bytes| {
        Box::pin(async move { connect::unary(f(st, sb, body).await) })
    }
}

macro_rules! unary_fn {
    ($name:ident, $req:ty, |$st:ident, $sb:ident, $r:ident| $body:block) => {
        fn $name($st: Arc<AppState>, $sb: Arc<Sbx>, body: Bytes) -> futures_util::future::BoxFuture<'static, Unary> {
            Box::pin(async move {
                let $r: $req = connect::unary_request(&body)?;
                let _ = (&$st, &$sb);
                $body
            })
        }
    };
}

// ---- paths ----

/// envd's path resolution (see the module documentation).
pub(crate) fn resolve(path: &str) -> Result<String, RpcError> {
    resolve_in(path, HOME)
}

/// The home directory of sandbox user `user`, as the base images make them.
pub(crate) fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// [`resolve`] for a request made as a user whose home is `home`.
pub(crate) fn resolve_in(path: &str, home: &str) -> Result<String, RpcError> {
    let home = home.trim_end_matches('/');
    let p = if path.is_empty() || path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('~') {
        return Err(RpcError::invalid(format!("invalid path '{path}': only ~ and ~/ are supported")));
    } else {
        path.to_string()
    };
    let full = if p.starts_with('/') { p } else { format!("{home}/{p}") };
    let mut parts: Vec<&str> = Vec::new();
    for c in full.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    if full.contains('\0') {
        return Err(RpcError::invalid(format!("invalid path: {path:?}")));
    }
    Ok(format!("/{}", parts.join("/")))
}

// ---- process ----

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

/// The user an envd request selects with `Authorization: Basic base64("<user>:")` (protocol
/// doc §3.3); none means the sandbox's default user.
pub(crate) fn basic_user(h: &HeaderMap) -> Option<String> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next().unwrap_or_default();
    (!user.is_empty()).then(|| user.to_string())
}

fn timeout_header(h: &HeaderMap) -> Option<Duration> {
    let ms: u64 = h.get("connect-timeout-ms")?.to_str().ok()?.trim().parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

fn keepalive_header(h: &HeaderMap) -> Duration {
    h.get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE)
}

/// One piece of a streamed response: an already-framed envelope, or an error that aborts
/// the connection.
pub(crate) type Frame = Result<Bytes, std::io::Error>;

/// A server-streaming response fed by a channel of frames.
pub(crate) fn stream_response(st: &AppState, rx: tokio::sync::mpsc::Receiver<Frame>) -> Response {
    let s = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) });
    let body = limit_body(Body::from_stream(s), st.faults.cut_stream_after);
    ([(header::CONTENT_TYPE, HeaderValue::from_static(connect::CONNECT_JSON))], body).into_response()
}

/// A stream that fails before its first message: 200 with only the end-stream error.
fn stream_error(st: &AppState, e: RpcError) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(Ok(connect::end_stream(Some(&e))));
    stream_response(st, rx)
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
    sock: Option<super::ConnSocket>,
) {
    let b64 = base64::engine::general_purpose::STANDARD;
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
        let frame = match ev {
            Some(Event::Data(OutputChunk::Stdout(b))) if pty => {
                connect::message(&event_json(json!({"data": {"pty": b64.encode(b)}})))
            }
            Some(Event::Data(OutputChunk::Stdout(b))) => {
                connect::message(&event_json(json!({"data": {"stdout": b64.encode(b)}})))
            }
            Some(Event::Data(OutputChunk::Stderr(b))) => {
                connect::message(&event_json(json!({"data": {"stderr": b64.encode(b)}})))
            }
            Some(Event::End(end)) => {
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
                    super::reset_on_close(sock);
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

async fn process_start(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    Extension(sock): Extension<Option<super::ConnSocket>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: StartRequest = match connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return stream_error(&st, e),
    };
    match start(&st, &sb, &headers, req, sock).await {
        Ok(resp) => resp,
        Err(e) => stream_error(&st, e),
    }
}

async fn start(
    st: &AppState,
    sb: &Sbx,
    headers: &HeaderMap,
    req: StartRequest,
    sock: Option<super::ConnSocket>,
) -> Result<Response, RpcError> {
    let size = req.pty.as_ref().map(pty_size).transpose()?;
    if req.process.cmd.is_empty() {
        return Err(RpcError::invalid("process.cmd is required"));
    }
    if let Some(bad) = req.process.envs.iter().find_map(|(k, v)| super::control::env_problem(k, v)) {
        return Err(RpcError::invalid(bad));
    }
    let cwd = match req.process.cwd.as_deref() {
        None | Some("") => None,
        Some(c) => {
            let abs = resolve(c)?;
            match st.provider.stat(&sb.provider_id, &abs).await {
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
        cwd,
        envs: req.process.envs.clone(),
        user: basic_user(headers),
        // The output reaches clients live (`procs`); what the provider would keep for `wait`
        // (64 MiB a stream by default) is never read here, so it keeps none.
        max_output: Some(0),
        ..Default::default()
    };
    // `stdin` absent means open (back-compat with old clients); the SDK sends false.
    let open_stdin = req.stdin.unwrap_or(true);
    let live = match size {
        Some((cols, rows)) => st.provider.spawn_pty(&sb.provider_id, exec, cols, rows).await?,
        None => st.provider.spawn_live(&sb.provider_id, exec, open_stdin).await?,
    };
    let pid = live.pid;
    let (_entry, events) = sb.procs.start(
        st.provider.clone(),
        sb.provider_id.clone(),
        live,
        super::procs::Started { config: config_json(&req.process), tag: req.tag.clone(), pty: size.is_some() },
        timeout_header(headers),
    );
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(pump(pid, size.is_some(), events, tx, keepalive_header(headers), sock));
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

fn find(sb: &Sbx, sel: &Selector) -> Result<Arc<procs::Entry>, RpcError> {
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

async fn process_connect(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    Extension(sock): Extension<Option<super::ConnSocket>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: ProcessRequest = match connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return stream_error(&st, e),
    };
    let entry = match find(&sb, &req.process) {
        Ok(e) => e,
        Err(e) => return stream_error(&st, e),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(pump(entry.pid, entry.pty, entry.subscribe(), tx, keepalive_header(&headers), sock));
    stream_response(&st, rx)
}

unary_fn!(process_list, Value, |st, sb, _r| {
    let ours = sb.procs.running();
    // Processes the provider started itself, e.g. a template's start command (envd lists
    // those too: it started them).
    let theirs: Vec<Value> = st
        .provider
        .process_list(&sb.provider_id)
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
fn target_pid(sb: &Sbx, sel: &Selector) -> Result<u32, RpcError> {
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
    st.provider.signal(&sb.provider_id, pid, sig).await.map_err(process_err(pid))?;
    // envd answers once the process is gone (it reaps its children): a `kill -0` right
    // after a kill must not find it. Bounded; a process that ignores SIGTERM is left be.
    if sig == libc::SIGKILL {
        let _ = st.provider.wait(&sb.provider_id, pid, Duration::from_secs(2)).await;
    }
    Ok(json!({}))
});

unary_fn!(send_input, ProcessRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    let input = r.input.ok_or_else(|| RpcError::invalid("input is required"))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(typed) = input.pty {
        let data = b64.decode(typed).map_err(|e| RpcError::invalid(format!("pty input is not base64: {e}")))?;
        st.provider.write_pty(&sb.provider_id, pid, data).await.map_err(process_err(pid))?;
        return Ok(json!({}));
    }
    let data = base64::engine::general_purpose::STANDARD
        .decode(input.stdin.unwrap_or_default())
        .map_err(|e| RpcError::invalid(format!("stdin is not base64: {e}")))?;
    st.provider.write_stdin(&sb.provider_id, pid, data).await.map_err(process_err(pid))?;
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
    st.provider.resize_pty(&sb.provider_id, pid, cols, rows).await.map_err(process_err(pid))?;
    Ok(json!({}))
});

unary_fn!(close_stdin, ProcessRequest, |st, sb, r| {
    let pid = target_pid(&sb, &r.process)?;
    st.provider.close_stdin(&sb.provider_id, pid).await.map_err(process_err(pid))?;
    Ok(json!({}))
});

// ---- filesystem ----

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// Go's `FileMode.String()` for the type and permission bits.
fn permissions(kind: &str, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        "dir" => 'd',
        "symlink" => 'L',
        _ => '-',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// The owner reported for every entry: the provider writes files as the sandbox user, and
/// `FileEntry` carries no owner.
fn owner_name() -> &'static str {
    "user"
}

/// `EntryInfo` in proto3 JSON (int64 size as a string, enum names).
fn entry_json(e: &FileEntry) -> Value {
    let ty = match e.kind.as_str() {
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    json!({
        "name": e.name,
        "type": ty,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode & 0o777,
        "permissions": permissions(&e.kind, e.mode),
        "owner": owner_name(),
        "group": owner_name(),
        "modifiedTime": super::rfc3339(e.modified),
    })
}

/// Most links followed in a row, as the kernel's `ELOOP` limit.
const MAX_LINKS: usize = 40;

/// Where the symbolic link `path` leads: the absolute path it resolves to and what is there,
/// or `None` when it dangles or loops.
async fn follow_link(st: &AppState, sb: &Sbx, path: &str) -> Option<(String, FileEntry)> {
    let mut cur = path.to_string();
    for _ in 0..MAX_LINKS {
        let target = st.provider.read_link(&sb.provider_id, &cur).await.ok()?;
        let base = cur.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        cur = resolve(&if target.starts_with('/') { target } else { format!("{base}/{target}") }).ok()?;
        let e = st.provider.stat(&sb.provider_id, &cur).await.ok()?;
        if e.kind != "symlink" {
            return Some((cur, e));
        }
    }
    None
}

/// envd's `EntryInfo` of `e`: a symbolic link is described by what it leads to (type, mode,
/// size) with `symlinkTarget` set to the absolute path it resolves to; one that dangles stays
/// a link.
async fn describe(st: &AppState, sb: &Sbx, e: &FileEntry) -> Value {
    let mut v = describe_type(st, sb, e).await;
    // envd 0.6.2's file metadata: the `user.e2b.*` extended attributes, when there are any.
    if let Ok(m) = st.provider.file_metadata(&sb.provider_id, &e.path).await {
        if !m.is_empty() {
            v["metadata"] = json!(m);
        }
    }
    v
}

async fn describe_type(st: &AppState, sb: &Sbx, e: &FileEntry) -> Value {
    if e.kind != "symlink" {
        return entry_json(e);
    }
    match follow_link(st, sb, &e.path).await {
        Some((target, t)) => {
            let shown = FileEntry { name: e.name.clone(), path: e.path.clone(), modified: e.modified, ..t };
            let mut v = entry_json(&shown);
            v["symlinkTarget"] = json!(target);
            v
        }
        None => entry_json(e),
    }
}

fn file_not_found(path: &str) -> impl Fn(ProviderError) -> RpcError + '_ {
    move |e| {
        if e.kind == ErrorKind::NotFound {
            RpcError::not_found(format!("file not found: {path}"))
        } else {
            e.into()
        }
    }
}

unary_fn!(fs_stat, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    let e = st.provider.stat(&sb.provider_id, &path).await.map_err(file_not_found(&path))?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_list_dir, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    let depth = r.depth.filter(|d| *d > 0).unwrap_or(1);
    // envd walks depth first, each directory in lexical order (the provider sorts by name),
    // and does not descend into symbolic links; a symbolic link as the root is followed.
    let root = match follow_link(&st, &sb, &path).await {
        Some((target, e)) if e.kind == "dir" => target,
        _ => path.clone(),
    };
    let entries = match st.provider.list_dir(&sb.provider_id, &root).await {
        Ok(v) => v,
        Err(e) if e.kind == ErrorKind::NotFound => {
            return Err(RpcError::not_found(format!("directory not found: {path}")))
        }
        Err(e) if e.message.starts_with("not a directory") => {
            return Err(RpcError::invalid(format!("path is not a directory: {path}")))
        }
        Err(e) => return Err(e.into()),
    };
    // Reported under the requested path, not where a symbolic link root leads.
    let shown = |e: FileEntry, dir: &str| FileEntry { path: format!("{}/{}", dir.trim_end_matches('/'), e.name), ..e };
    let mut stack: Vec<(FileEntry, String, u32)> =
        entries.into_iter().rev().map(|e| (e.clone(), shown(e, &path).path, 1)).collect();
    let mut out = Vec::new();
    while let Some((e, at, level)) = stack.pop() {
        out.push(describe(&st, &sb, &FileEntry { path: at.clone(), ..e.clone() }).await);
        if e.kind == "dir" && level < depth {
            // Vanished or unreadable below the root: skipped.
            if let Ok(children) = st.provider.list_dir(&sb.provider_id, &e.path).await {
                stack.extend(children.into_iter().rev().map(|c| {
                    let p = shown(c.clone(), &at).path;
                    (c, p, level + 1)
                }));
            }
        }
    }
    Ok(json!({ "entries": out }))
});

unary_fn!(fs_make_dir, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    match st.provider.stat(&sb.provider_id, &path).await {
        Ok(e) if e.kind == "dir" => {
            return Err(RpcError::new("already_exists", format!("directory already exists: {path}")))
        }
        Ok(_) => return Err(RpcError::invalid(format!("path already exists but it is not a directory: {path}"))),
        Err(e) if e.kind == ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let e = st.provider.make_dir(&sb.provider_id, &path).await?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_move, MoveRequest, |st, sb, r| {
    let (src, dst) = (resolve(&r.source)?, resolve(&r.destination)?);
    st.provider.stat(&sb.provider_id, &src).await.map_err(file_not_found(&src))?;
    if let Some((parent, _)) = dst.rsplit_once('/') {
        if !parent.is_empty() {
            st.provider.make_dir(&sb.provider_id, parent).await?;
        }
    }
    let e = st.provider.rename(&sb.provider_id, &src, &dst).await?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_remove, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    match st.provider.remove(&sb.provider_id, &path).await {
        Ok(()) => Ok(json!({})),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(json!({})),
        Err(e) => Err(e.into()),
    }
});

// ---- watchers ----

#[derive(Debug, Deserialize)]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, alias = "include_entry")]
    #[serde(rename = "includeEntry")]
    include_entry: bool,
}

#[derive(Debug, Deserialize)]
struct WatcherRequest {
    #[serde(default, alias = "watcher_id")]
    #[serde(rename = "watcherId")]
    watcher_id: String,
}

/// A directory watch and how its events are reported.
pub(crate) struct Watcher {
    watch: Box<dyn crate::provider::DirWatch>,
    /// The watched directory, absolute.
    dir: String,
    include_entry: bool,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("dir", &self.dir).finish()
    }
}

/// Starts a watch on the request's directory: `not_found` if it is missing,
/// `invalid_argument` if it is no directory.
async fn start_watch(st: &AppState, sb: &Sbx, r: &WatchRequest) -> Result<Watcher, RpcError> {
    let dir = resolve(&r.path)?;
    match st.provider.stat(&sb.provider_id, &dir).await {
        Ok(e) if e.kind == "dir" || e.kind == "symlink" => {}
        Ok(_) => return Err(RpcError::invalid(format!("path {dir} is not a directory"))),
        Err(e) if e.kind == ErrorKind::NotFound => return Err(RpcError::not_found(format!("path {dir} not found"))),
        Err(e) => return Err(e.into()),
    }
    let watch = st.provider.watch_dir(&sb.provider_id, &dir, r.recursive).await.map_err(|e| {
        if e.message.starts_with("not a directory") {
            RpcError::invalid(format!("path {dir} is not a directory"))
        } else {
            e.into()
        }
    })?;
    Ok(Watcher { watch, dir, include_entry: r.include_entry })
}

/// `FilesystemEvent`s in proto3 JSON, with the entry where asked and the path still exists.
async fn events_json(st: &AppState, sb: &Sbx, w: &Watcher, events: Vec<crate::provider::FsEvent>) -> Vec<Value> {
    use crate::provider::FsOp;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        let ty = match e.op {
            FsOp::Create => "EVENT_TYPE_CREATE",
            FsOp::Write => "EVENT_TYPE_WRITE",
            FsOp::Remove => "EVENT_TYPE_REMOVE",
            FsOp::Rename => "EVENT_TYPE_RENAME",
            FsOp::Chmod => "EVENT_TYPE_CHMOD",
        };
        let mut v = json!({"name": e.name, "type": ty});
        if w.include_entry {
            let path = format!("{}/{}", w.dir.trim_end_matches('/'), e.name);
            if let Ok(entry) = st.provider.stat(&sb.provider_id, &path).await {
                v["entry"] = describe(st, sb, &entry).await;
            }
        }
        out.push(v);
    }
    out
}

unary_fn!(create_watcher, WatchRequest, |st, sb, r| {
    let w = start_watch(&st, &sb, &r).await?;
    let id = super::new_sandbox_id();
    sb.watchers.lock().expect("watchers").insert(id.clone(), Arc::new(w));
    Ok(json!({"watcherId": id}))
});

unary_fn!(get_watcher_events, WatcherRequest, |st, sb, r| {
    let w = sb.watchers.lock().expect("watchers").get(&r.watcher_id).cloned();
    let w = w.ok_or_else(|| RpcError::not_found(format!("watcher with id {} not found", r.watcher_id)))?;
    let events = w.watch.drain();
    Ok(json!({"events": events_json(&st, &sb, &w, events).await}))
});

unary_fn!(remove_watcher, WatcherRequest, |st, sb, r| {
    let _ = &st;
    match sb.watchers.lock().expect("watchers").remove(&r.watcher_id) {
        Some(_) => Ok(json!({})),
        None => Err(RpcError::not_found(format!("watcher with id {} not found", r.watcher_id))),
    }
});

/// `Filesystem/WatchDir`: `start`, then each change as it comes, keepalives while idle,
/// until the client goes away (which stops the watch).
async fn watch_dir(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: WatchRequest = match connect::stream_request(&body) {
        Ok(r) => r,
        Err(e) => return stream_error(&st, e),
    };
    let w = match start_watch(&st, &sb, &req).await {
        Ok(w) => w,
        Err(e) => return stream_error(&st, e),
    };
    let keepalive = keepalive_header(&headers);
    let (tx, rx) = tokio::sync::mpsc::channel::<Frame>(64);
    let state = st.clone();
    tokio::spawn(async move {
        if tx.send(Ok(connect::message(&json!({"start": {}})))).await.is_err() {
            return;
        }
        let arrived = w.watch.arrived();
        loop {
            // Registered before draining, so a change between the two still wakes us.
            let notified = arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let events = w.watch.drain();
            if events.is_empty() {
                let idle = tokio::select! {
                    _ = notified => false,
                    _ = tokio::time::sleep(keepalive) => true,
                    _ = tx.closed() => return,
                };
                if idle && tx.send(Ok(connect::message(&json!({"keepalive": {}})))).await.is_err() {
                    return;
                }
                continue;
            }
            for ev in events_json(&state, &sb, &w, events).await {
                if tx.send(Ok(connect::message(&json!({"filesystem": ev})))).await.is_err() {
                    return;
                }
            }
        }
    });
    stream_response(&st, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_like_envd() {
        assert_eq!(resolve("").unwrap(), "/home/user");
        assert_eq!(resolve("~").unwrap(), "/home/user");
        assert_eq!(resolve("~/a/b").unwrap(), "/home/user/a/b");
        assert_eq!(resolve("a.txt").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("/tmp/../etc").unwrap(), "/etc");
        assert!(resolve("~root/x").is_err());
    }

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

    #[test]
    fn basic_auth_selects_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic cm9vdDo=")); // root:
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer cm9vdDo="));
        assert_eq!(basic_user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic Og==")); // ":"
        assert_eq!(basic_user(&h), None);
    }

    #[test]
    fn permission_strings() {
        assert_eq!(permissions("file", 0o644), "-rw-r--r--");
        assert_eq!(permissions("dir", 0o755), "drwxr-xr-x");
    }
}

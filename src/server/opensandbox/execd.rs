//! execd on port 44772: `/ping`, commands (`/command`: foreground streams, background
//! commands with status and logs, interrupts), bash sessions (`/session`), metrics, and the
//! routes of `fs` (files, directories) and `code` (contexts and execution).
//!
//! Streams are execd's: one JSON event per frame, each followed by a blank line (`{…}\n\n`,
//! the framing execd writes and the SDKs read beside standard SSE), `Content-Type:
//! text/event-stream`; `init` (the command id), `stdout`/`stderr` (one event per line, without
//! its terminator; a blank line is `"\n"`), then `execution_complete` with the time taken, or
//! `error` `{"ename": "CommandExecError", "evalue": "<exit code>"}` for a command that failed;
//! `ping` every 3 s of the stream. A client that goes away ends its foreground command (execd
//! kills it with the request's context); a background command runs on, its combined output
//! kept for `/command/{id}/logs` (a byte cursor, as execd's).
//!
//! Commands run as execd does in an OpenSandbox container: as root (the container's user)
//! unless `uid` names another user of the sandbox, through bash, with the sandbox's
//! environment and the request's `envs`. A session is execd's: each run is a new bash that
//! starts from the environment and directory the previous run ended with.

// Helpers return the early answer as their error.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::common::{channel_body, query_pairs};
use super::records::{Command, CommandState, OsSandbox, Session};
use crate::provider::{ExecRequest, OutputChunk};
use crate::server::state::{AppState, ServedSandbox};

type Sb = Extension<Arc<ServedSandbox>>;
type Os = Extension<Arc<OsSandbox>>;

/// Output a background command keeps for `/command/{id}/logs`; older output is dropped
/// (the cursor still counts it).
const LOG_KEPT: usize = 32 << 20;
/// How long an interrupt waits after SIGTERM before SIGKILL (execd's 3 s).
const TERM_GRACE: Duration = Duration::from_secs(3);
/// Interval of `ping` events.
const PING_EVERY: Duration = Duration::from_secs(3);

impl Command {
    fn finish(&self, exit_code: i64, error: Option<String>) {
        let mut s = self.state.lock().expect("command");
        s.running = false;
        s.exit_code = Some(exit_code);
        s.error = error;
        s.finished_us = Some(crate::server::state::now_us());
        *self.pid.lock().expect("pid") = None;
    }

    fn append(&self, data: &[u8]) {
        let mut s = self.state.lock().expect("command");
        s.log.extend_from_slice(data);
        if s.log.len() > LOG_KEPT {
            let drop = s.log.len() - LOG_KEPT;
            s.log.drain(..drop);
            s.log_base += drop as u64;
        }
    }
}

/// A fresh id in execd's form (a UUID).
pub(super) fn new_id() -> String {
    let h = crate::random::hex(16);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

pub(super) fn now_ms() -> i64 {
    crate::server::state::now_us() / 1000
}

/// An execd error answer.
pub(super) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    crate::server::answer::error(status, code, message)
}

pub(super) fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", message)
}

pub(super) fn runtime_error(message: impl Into<String>) -> Response {
    error(StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR", message)
}

/// A JSON body of type `T` (execd's 400 otherwise).
pub(super) fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("error parsing request, MAYBE invalid body format. {e}")))
}

/// [`parse`], or `T`'s default for a body of nothing but white space.
pub(super) fn parse_or_default<T: Default + for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse(body)
    }
}

/// execd's own routes: commands, sessions and metrics (`code` and `fs` add theirs).
pub(super) fn routes() -> Router<Arc<AppState>> {
    let r = Router::new()
        .route("/ping", get(|| async { StatusCode::OK }))
        .route("/command", post(run_command).delete(interrupt))
        .route("/command/status/{id}", get(command_status))
        .route("/command/{id}/logs", get(command_logs))
        .route("/session", post(create_session))
        .route("/session/{id}/run", post(run_in_session))
        .route("/session/{id}", delete(delete_session))
        .route("/metrics", get(metrics))
        .route("/metrics/watch", get(watch_metrics));
    r.fallback(|m: axum::http::Method, u: axum::http::Uri| async move {
        let p = u.path();
        let what = if p.starts_with("/v1/filesystem/") {
            Some("file operations as another user (/v1/filesystem/{uid}/{gid})")
        } else if p.starts_with("/v1/isolated") {
            Some("isolated sessions (OSEP-0013)")
        } else if p.starts_with("/pty") {
            Some("PTY sessions")
        } else {
            None
        };
        match what {
            Some(w) => error(
                StatusCode::NOT_IMPLEMENTED,
                "NOT_SUPPORTED",
                format!("{w}: not supported by scenario-run serve ({m} {p})"),
            ),
            None => error(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no such execd route: {m} {p}")),
        }
    })
}

/// One event, as execd frames it.
pub(super) fn frame(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push_str("\n\n");
    Bytes::from(s)
}

pub(super) fn text_event(kind: &str, text: &str) -> Value {
    json!({"type": kind, "text": text, "timestamp": now_ms()})
}

pub(super) fn error_event(name: &str, value: &str, traceback: Vec<String>) -> Value {
    json!({"type": "error", "timestamp": now_ms(), "error": {"ename": name, "evalue": value, "traceback": traceback}})
}

pub(super) fn complete_event(started: Instant) -> Value {
    json!({"type": "execution_complete", "timestamp": now_ms(), "execution_time": started.elapsed().as_millis() as u64})
}

/// A streaming answer of `rx`'s frames.
pub(super) fn stream_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let mut r = Response::new(channel_body(rx));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

/// Splits output into execd's line events: lines end at `\n` or `\r` (`\r\n` once), a blank
/// line is `"\n"`, and what is left unterminated comes out at the end.
#[derive(Default)]
pub(super) struct Lines {
    buf: Vec<u8>,
    last_cr: bool,
}

impl Lines {
    pub(super) fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in data {
            if b == b'\n' || b == b'\r' {
                if !self.buf.is_empty() {
                    out.push(String::from_utf8_lossy(&self.buf).into_owned());
                    self.buf.clear();
                } else if !(b == b'\n' && self.last_cr) {
                    out.push("\n".to_string());
                }
                self.last_cr = b == b'\r';
                continue;
            }
            self.last_cr = false;
            self.buf.push(b);
        }
        out
    }

    pub(super) fn finish(&mut self) -> Option<String> {
        (!self.buf.is_empty()).then(|| String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned())
    }
}

/// A session's lines as execd reads them (Go's `bufio.Scanner`): split at `\n`, a trailing
/// `\r` dropped; empty lines are not sent (execd sends no empty text).
#[derive(Default)]
struct ScanLines {
    buf: Vec<u8>,
}

impl ScanLines {
    fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in data {
            if b == b'\n' {
                let line = std::mem::take(&mut self.buf);
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                if !line.is_empty() {
                    out.push(String::from_utf8_lossy(line).into_owned());
                }
            } else {
                self.buf.push(b);
            }
        }
        out
    }

    fn finish(&mut self) -> Option<String> {
        let line = std::mem::take(&mut self.buf);
        let line = line.strip_suffix(b"\r").unwrap_or(&line);
        (!line.is_empty()).then(|| String::from_utf8_lossy(line).into_owned())
    }
}

/// The user of the sandbox with `uid` (its `/etc/passwd`), checked against `gid`.
async fn user_of(st: &AppState, sb: &ServedSandbox, uid: Option<u32>, gid: Option<u32>) -> Result<String, Response> {
    let Some(uid) = uid else {
        if gid.is_some() {
            return Err(bad_request("invalid request, validation error uid is required when gid is provided"));
        }
        return Ok("root".into());
    };
    let passwd = st
        .provider
        .sandbox(&sb.provider_id)
        .read_file_as("/etc/passwd", "root")
        .await
        .map_err(|e| runtime_error(format!("cannot read the sandbox's users: {e}")))?;
    let text = String::from_utf8_lossy(&passwd);
    let entry = text.lines().map(|l| l.split(':').collect::<Vec<_>>()).find(|f| f.len() > 3 && f[2] == uid.to_string());
    let Some(f) = entry else {
        return Err(bad_request(format!(
            "uid {uid} is no user of the sandbox (its /etc/passwd): scenario-run serve runs commands as named users"
        )));
    };
    if let Some(g) = gid {
        if f[3] != g.to_string() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "NOT_SUPPORTED",
                format!("gid {g} is not the primary group of uid {uid} ({}): other groups are not supported by scenario-run serve", f[0]),
            ));
        }
    }
    Ok(f[0].to_string())
}

#[derive(Debug, Deserialize)]
struct RunCommandRequest {
    #[serde(default)]
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    envs: Option<BTreeMap<String, String>>,
}

async fn run_command(State(st): State<Arc<AppState>>, Extension(sb): Sb, Extension(os): Os, body: Bytes) -> Response {
    let req: RunCommandRequest = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.command.is_empty() {
        return bad_request("invalid request, validation error: command is required");
    }
    if req.timeout.is_some_and(|t| t < 1) {
        return bad_request("invalid request, validation error: timeout must be at least 1 (milliseconds)");
    }
    let user = match user_of(&st, &sb, req.uid, req.gid).await {
        Ok(u) => u,
        Err(r) => return r,
    };
    let envs = req.envs.unwrap_or_default();
    if let Some(bad) = envs.iter().find_map(|(k, v)| crate::server::sandboxes::env_problem(k, v)) {
        return bad_request(bad);
    }
    let exec = ExecRequest {
        cmd: req.command.clone(),
        cwd: req.cwd.filter(|c| !c.is_empty()),
        envs,
        user: Some(user),
        ..Default::default()
    };
    let timeout = req.timeout.map(|ms| Duration::from_millis(ms as u64));
    let id = new_id();
    let started = Instant::now();
    let cmd = Arc::new(Command {
        content: req.command,
        background: req.background,
        started_us: crate::server::state::now_us(),
        pid: Mutex::new(None),
        state: Mutex::new(CommandState { running: true, ..Default::default() }),
    });
    let live = match st.provider.sandbox(&sb.provider_id).spawn_live(exec, false).await {
        Ok(l) => l,
        Err(e) => {
            // Started nothing: init, then the error (execd's answer to a failed start).
            cmd.finish(1, Some(e.message.clone()));
            os.execd.commands.lock().expect("commands").insert(id.clone(), cmd);
            let (tx, rx) = mpsc::channel(4);
            let _ = tx.try_send(frame(&text_event("init", &id)));
            let _ = tx.try_send(frame(&error_event("CommandExecError", &e.message, vec![e.message.clone()])));
            return stream_response(rx);
        }
    };
    *cmd.pid.lock().expect("pid") = Some(live.pid);
    os.execd.commands.lock().expect("commands").insert(id.clone(), cmd.clone());
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let _ = tx.try_send(frame(&text_event("init", &id)));
    if req.background {
        tokio::spawn(background(st.clone(), sb.clone(), cmd, live, timeout));
        let _ = tx.try_send(frame(&complete_event(started)));
        return stream_response(rx);
    }
    tokio::spawn(foreground(st.clone(), sb.clone(), cmd, live, timeout, started, tx));
    stream_response(rx)
}

/// Kills the command `pid` and what it started, as execd does (`kill(-pid, …)`: commands lead
/// their own process group): SIGTERM to the group, then, once the command ended or after
/// [`TERM_GRACE`], SIGKILL to whatever of the group is left (a child that outlived its shell,
/// or one that ignores SIGTERM).
async fn terminate(st: &AppState, sb: &ServedSandbox, pid: u32) {
    let sandbox = st.provider.sandbox(&sb.provider_id);
    if sandbox.signal_group(pid, libc::SIGTERM).await.is_err() {
        return;
    }
    let _ = sandbox.wait(pid, TERM_GRACE).await;
    let _ = sandbox.signal_group(pid, libc::SIGKILL).await;
}

/// Past a command's deadline: SIGKILL to its process group, once.
async fn kill_at_deadline(st: &AppState, sb: &ServedSandbox, pid: u32) {
    let _ = st.provider.sandbox(&sb.provider_id).signal_group(pid, libc::SIGKILL).await;
}

/// Sleeps until `deadline` unless it is None or `fired` (then never ends).
async fn until(deadline: Option<tokio::time::Instant>, fired: bool) {
    match deadline {
        Some(d) if !fired => tokio::time::sleep_until(d).await,
        _ => std::future::pending().await,
    }
}

/// The exit status of `pid` once its output ended: (code, error text) as execd reports it
/// (Go's `ExitCode()`: -1 for a signal).
async fn exit_status(st: &AppState, sb: &ServedSandbox, pid: u32) -> (i64, Option<String>) {
    let waited = st.provider.sandbox(&sb.provider_id).wait(pid, Duration::from_secs(30)).await;
    if st.mutants.has(crate::server::mutants::Fault::ExitCodeZero) {
        return (0, None);
    }
    match waited {
        Ok(r) => match (r.exit_code, r.signal) {
            (Some(0), _) => (0, None),
            (Some(c), _) => (i64::from(c), Some(format!("exit status {c}"))),
            (None, Some(s)) => (-1, Some(format!("signal: {}", crate::server::procs::signal_name(s)))),
            (None, None) => (-1, Some("the process ended without an exit status".into())),
        },
        Err(e) => (-1, Some(e.message)),
    }
}

/// Streams a foreground command to its client; see the module documentation.
async fn foreground(
    st: Arc<AppState>,
    sb: Arc<ServedSandbox>,
    cmd: Arc<Command>,
    mut live: crate::provider::LiveProcess,
    timeout: Option<Duration>,
    started: Instant,
    tx: mpsc::Sender<Bytes>,
) {
    let pid = live.pid;
    let (mut out, mut err) = (Lines::default(), Lines::default());
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    let mut gone = false;
    let mut fired = false;
    loop {
        let chunk = tokio::select! {
            c = live.output.recv() => c,
            _ = ping.tick() => {
                if tx.send(frame(&text_event("ping", "pong"))).await.is_err() { gone = true; break; }
                continue;
            }
            _ = until(deadline, fired) => {
                fired = true;
                kill_at_deadline(&st, &sb, pid).await;
                continue;
            }
            _ = tx.closed() => { gone = true; break; }
        };
        let Some(chunk) = chunk else { break };
        let (lines, kind) = match &chunk {
            OutputChunk::Stdout(b) => (out.push(b), "stdout"),
            OutputChunk::Stderr(b) => (err.push(b), "stderr"),
        };
        for l in lines {
            if tx.send(frame(&text_event(kind, &l))).await.is_err() {
                gone = true;
            }
        }
        if gone {
            break;
        }
    }
    if gone {
        // execd ends a foreground command with its request.
        terminate(&st, &sb, pid).await;
        let (code, error) = exit_status(&st, &sb, pid).await;
        cmd.finish(code, error);
        return;
    }
    for (lines, kind) in [(&mut out, "stdout"), (&mut err, "stderr")] {
        if let Some(l) = lines.finish() {
            let _ = tx.send(frame(&text_event(kind, &l))).await;
        }
    }
    let (code, error) = exit_status(&st, &sb, pid).await;
    cmd.finish(code, error.clone());
    let last = if code == 0 {
        complete_event(started)
    } else {
        let why = error.unwrap_or_default();
        error_event("CommandExecError", &code.to_string(), vec![why])
    };
    let _ = tx.send(frame(&last)).await;
}

/// Keeps a background command's output until it ends.
async fn background(
    st: Arc<AppState>,
    sb: Arc<ServedSandbox>,
    cmd: Arc<Command>,
    mut live: crate::provider::LiveProcess,
    timeout: Option<Duration>,
) {
    let pid = live.pid;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut fired = false;
    loop {
        let chunk = tokio::select! {
            c = live.output.recv() => c,
            _ = until(deadline, fired) => {
                fired = true;
                kill_at_deadline(&st, &sb, pid).await;
                continue;
            }
        };
        match chunk {
            Some(OutputChunk::Stdout(b) | OutputChunk::Stderr(b)) => cmd.append(&b),
            None => break,
        }
    }
    let (code, error) = exit_status(&st, &sb, pid).await;
    cmd.finish(code, error);
}

/// The sandbox's entrypoint, its main process, as root: kept running in the background; when
/// it ends its sandbox's status says so.
pub(super) async fn start_entrypoint(st: &Arc<AppState>, sb: &Arc<ServedSandbox>, os: &Arc<OsSandbox>) {
    let cmd = format!(
        "exec {}",
        os.entrypoint.iter().map(|a| crate::templates::dockerfile::shell_quote(a)).collect::<Vec<_>>().join(" ")
    );
    let exec = ExecRequest { cmd, user: Some("root".into()), ..Default::default() };
    let live = match st.provider.sandbox(&sb.provider_id).spawn_live(exec, false).await {
        Ok(l) => l,
        Err(e) => {
            *os.note.lock().expect("note") =
                Some(("ENTRYPOINT_FAILED".into(), format!("the entrypoint did not start: {e}")));
            return;
        }
    };
    let (st, sb, os) = (st.clone(), sb.clone(), os.clone());
    tokio::spawn(async move {
        let mut live = live;
        let mut tail = Vec::new();
        while let Some(OutputChunk::Stdout(b) | OutputChunk::Stderr(b)) = live.output.recv().await {
            tail.extend_from_slice(&b);
            if tail.len() > 4096 {
                tail.drain(..tail.len() - 4096);
            }
        }
        if st.sandbox(&sb.id).is_none() {
            return;
        }
        let (code, _) = exit_status(&st, &sb, live.pid).await;
        let last = String::from_utf8_lossy(&tail).lines().last().unwrap_or("").to_string();
        let message = format!(
            "the entrypoint {:?} exited with code {code}{}; the sandbox stays until deleted or expired",
            os.entrypoint.join(" "),
            if last.is_empty() { String::new() } else { format!(": {last}") }
        );
        *os.note.lock().expect("note") = Some(("ENTRYPOINT_EXITED".into(), message));
        os.touch();
    });
}

fn command_json(id: &str, c: &Command) -> Value {
    let s = c.state.lock().expect("command");
    json!({
        "id": id,
        "content": c.content,
        "running": s.running,
        "exit_code": s.exit_code,
        "error": s.error.clone().unwrap_or_default(),
        "started_at": crate::server::state::rfc3339_us(c.started_us),
        "finished_at": s.finished_us.map(crate::server::state::rfc3339_us),
    })
}

async fn command_status(Extension(os): Os, Path(id): Path<String>) -> Response {
    match os.execd.commands.lock().expect("commands").get(&id) {
        Some(c) => Json(command_json(&id, c)).into_response(),
        None => error(StatusCode::NOT_FOUND, "INVALID_REQUEST_BODY", format!("command not found: {id}")),
    }
}

async fn command_logs(Extension(os): Os, Path(id): Path<String>, RawQuery(q): RawQuery) -> Response {
    let params = query_pairs(q.as_deref());
    let cursor = params.iter().find(|(k, _)| k == "cursor").and_then(|(_, v)| v.parse::<u64>().ok()).unwrap_or(0);
    let Some(c) = os.execd.commands.lock().expect("commands").get(&id).cloned() else {
        return bad_request(format!("command not found: {id}"));
    };
    if !c.background {
        return bad_request(format!("command {id} is not running in background"));
    }
    let s = c.state.lock().expect("command");
    let end = s.log_base + s.log.len() as u64;
    let from = cursor.clamp(s.log_base, end);
    let body = s.log[(from - s.log_base) as usize..].to_vec();
    let mut r = (StatusCode::OK, body).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert("execd-commands-tail-cursor", HeaderValue::from(end));
    r
}

/// `DELETE /command?id=` (and `DELETE /code?id=`): stops a command, a session's run or a code
/// execution.
pub(super) async fn interrupt(
    State(st): State<Arc<AppState>>,
    Extension(sb): Sb,
    Extension(os): Os,
    RawQuery(q): RawQuery,
) -> Response {
    let params = query_pairs(q.as_deref());
    let Some(id) = params.into_iter().find(|(k, _)| k == "id").map(|(_, v)| v).filter(|v| !v.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'id'");
    };
    if os.code.interrupt(&id) {
        return StatusCode::OK.into_response();
    }
    let command = os.execd.commands.lock().expect("commands").get(&id).cloned();
    if let Some(c) = command {
        let pid = *c.pid.lock().expect("pid");
        let running = c.state.lock().expect("command").running;
        return match pid {
            Some(pid) if running => {
                terminate(&st, &sb, pid).await;
                StatusCode::OK.into_response()
            }
            _ => runtime_error(format!("error interruptting code context. command session {id} is not running")),
        };
    }
    let session = os.execd.sessions.lock().expect("sessions").remove(&id);
    if let Some(s) = session {
        let pid = *s.running.lock().expect("session");
        if let Some(pid) = pid {
            terminate(&st, &sb, pid).await;
        }
        return StatusCode::OK.into_response();
    }
    runtime_error("error interruptting code context. no such session")
}

#[derive(Debug, Default, Deserialize)]
struct CreateSession {
    #[serde(default)]
    cwd: Option<String>,
}

async fn create_session(
    State(st): State<Arc<AppState>>,
    Extension(sb): Sb,
    Extension(os): Os,
    body: Bytes,
) -> Response {
    let req: CreateSession = match parse_or_default(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let cwd = req.cwd.filter(|c| !c.is_empty());
    if let Some(dir) = &cwd {
        // execd makes the directory (`mkdir -p`).
        let mk = ExecRequest {
            cmd: format!("mkdir -p -- {}", crate::templates::dockerfile::shell_quote(dir)),
            user: Some("root".into()),
            ..Default::default()
        };
        match st.provider.sandbox(&sb.provider_id).exec(mk, None).await {
            Ok(r) if r.exit_code == Some(0) => {}
            Ok(r) => {
                return runtime_error(format!(
                    "error creating session. cannot make {dir}: {}",
                    String::from_utf8_lossy(&r.stderr).trim()
                ))
            }
            Err(e) => return runtime_error(format!("error creating session. {e}")),
        }
    }
    let id = new_id();
    let s = Arc::new(Session { env: Mutex::new(BTreeMap::new()), cwd: Mutex::new(cwd), running: Mutex::new(None) });
    os.execd.sessions.lock().expect("sessions").insert(id.clone(), s);
    Json(json!({"session_id": id})).into_response()
}

async fn delete_session(
    State(st): State<Arc<AppState>>,
    Extension(sb): Sb,
    Extension(os): Os,
    Path(id): Path<String>,
) -> Response {
    let Some(s) = os.execd.sessions.lock().expect("sessions").remove(&id) else {
        return error(StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND", format!("session {id} not found"));
    };
    let pid = *s.running.lock().expect("session");
    if let Some(pid) = pid {
        terminate(&st, &sb, pid).await;
    }
    StatusCode::OK.into_response()
}

#[derive(Debug, Deserialize)]
struct RunInSession {
    #[serde(default)]
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    timeout: Option<i64>,
}

const ENV_START: &str = "__ENV_DUMP_START__";
const ENV_END: &str = "__ENV_DUMP_END__";
const EXIT_MARK: &str = "__EXIT_CODE__:";
const PWD_MARK: &str = "__PWD__:";

/// The script a session run is (execd's `buildWrappedScript`): the session's environment and
/// directory, the command, then the markers that report the new environment, directory and
/// exit code.
fn session_script(command: &str, env: &BTreeMap<String, String>, cwd: Option<&str>) -> String {
    let q = crate::templates::dockerfile::shell_quote;
    let mut s = String::from("exec 2>&1\n");
    for (k, v) in env {
        if valid_env_key(k)
            && !matches!(k.as_str(), "PS1" | "PS2" | "PS3" | "PS4" | "PROMPT_COMMAND")
            && v.len() <= 8192
        {
            s += &format!("export {k}={}\n", q(v));
        }
    }
    if let Some(d) = cwd {
        s += &format!("cd {}\n", q(d));
    }
    s += command;
    if !command.ends_with('\n') {
        s.push('\n');
    }
    s += "__USER_EXIT_CODE__=$?\n";
    s += &format!("printf \"\\n%s\\n\" \"{ENV_START}\"\nexport -p\nprintf \"%s\\n\" \"{ENV_END}\"\n");
    s += &format!("printf \"{PWD_MARK}%s\\n\" \"$(pwd)\"\nprintf \"{EXIT_MARK}%s\\n\" \"$__USER_EXIT_CODE__\"\n");
    s += "exit \"$__USER_EXIT_CODE__\"\n";
    s
}

fn valid_env_key(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// One `declare -x NAME="value"` line of `export -p`.
fn export_line(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("declare -x ")?.trim();
    let (name, value) = match rest.split_once('=') {
        Some((n, raw)) => (n, unquote(raw)),
        None => (rest, String::new()),
    };
    valid_env_key(name).then(|| (name.to_string(), value))
}

/// bash's double-quoted `export -p` value.
fn unquote(raw: &str) -> String {
    let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return raw.to_string();
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(n @ ('"' | '\\' | '$' | '`')) => out.push(n),
                Some(n) => {
                    out.push('\\');
                    out.push(n);
                }
                None => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

async fn run_in_session(
    State(st): State<Arc<AppState>>,
    Extension(sb): Sb,
    Extension(os): Os,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let req: RunInSession = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.command.trim().is_empty() {
        return bad_request("invalid request. command is required");
    }
    let Some(session) = os.execd.sessions.lock().expect("sessions").get(&id).cloned() else {
        return runtime_error(format!("error running in session. context {id} not found"));
    };
    let env = session.env.lock().expect("session").clone();
    let cwd = req.cwd.filter(|c| !c.is_empty()).or_else(|| session.cwd.lock().expect("session").clone());
    let exec = ExecRequest {
        cmd: session_script(&req.command, &env, cwd.as_deref()),
        user: Some("root".into()),
        ..Default::default()
    };
    let mut live = match st.provider.sandbox(&sb.provider_id).spawn_live(exec, false).await {
        Ok(l) => l,
        Err(e) => return runtime_error(format!("error running in session. {e}")),
    };
    *session.running.lock().expect("session") = Some(live.pid);
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let _ = tx.try_send(frame(&text_event("init", &id)));
    let timeout = req.timeout.filter(|t| *t > 0).map(|ms| Duration::from_millis(ms as u64));
    tokio::spawn(async move {
        let started = Instant::now();
        let pid = live.pid;
        let deadline = tokio::time::Instant::now() + timeout.unwrap_or(Duration::from_secs(24 * 3600));
        let mut lines = ScanLines::default();
        let (mut in_env, mut new_env, mut pwd, mut exit) = (false, BTreeMap::new(), None, None);
        let mut timed_out = false;
        let mut gone = false;
        let mut handle = |line: String, tx: &mpsc::Sender<Bytes>| -> Option<Bytes> {
            if line == ENV_START {
                in_env = true;
            } else if line == ENV_END {
                in_env = false;
            } else if let Some(c) = line.strip_prefix(EXIT_MARK) {
                exit = c.trim().parse::<i64>().ok();
            } else if let Some(p) = line.strip_prefix(PWD_MARK) {
                pwd = Some(p.to_string());
            } else if in_env {
                if let Some((k, v)) = export_line(&line) {
                    new_env.insert(k, v);
                }
            } else {
                let _ = tx;
                return Some(frame(&text_event("stdout", &line)));
            }
            None
        };
        loop {
            let chunk = tokio::select! {
                c = live.output.recv() => c,
                _ = tokio::time::sleep_until(deadline), if !timed_out => {
                    timed_out = true;
                    kill_at_deadline(&st, &sb, pid).await;
                    continue;
                }
                _ = tx.closed() => { gone = true; break; }
            };
            let Some(OutputChunk::Stdout(b) | OutputChunk::Stderr(b)) = chunk else { break };
            for l in lines.push(&b) {
                if let Some(f) = handle(l, &tx) {
                    if tx.send(f).await.is_err() {
                        gone = true;
                    }
                }
            }
            if gone {
                break;
            }
        }
        if let Some(l) = lines.finish() {
            if let Some(f) = handle(l, &tx) {
                let _ = tx.send(f).await;
            }
        }
        if gone {
            terminate(&st, &sb, pid).await;
        }
        let (status, _) = exit_status(&st, &sb, pid).await;
        *session.running.lock().expect("session") = None;
        if !new_env.is_empty() {
            *session.env.lock().expect("session") = new_env;
        }
        if let Some(p) = pwd {
            *session.cwd.lock().expect("session") = Some(p);
        }
        if gone {
            return;
        }
        let last = if timed_out {
            error_event("Timeout", &format!("timeout after {}ms", timeout.unwrap_or_default().as_millis()), vec![])
        } else {
            match exit.unwrap_or(status) {
                0 => complete_event(started),
                c => error_event("CommandExecError", &c.to_string(), vec![format!("command exited with code {c}")]),
            }
        };
        let _ = tx.send(frame(&last)).await;
    });
    stream_response(rx)
}

/// `/metrics`: the sandbox's CPU use since the last sample (or its start), its memory.
async fn sample(st: &AppState, sb: &ServedSandbox, os: &OsSandbox) -> Result<Value, Response> {
    let usage = st.provider.sandbox(&sb.provider_id).usage().await.map_err(crate::server::answer::provider_error)?;
    let now = crate::server::state::now_us();
    let (prev_at, prev_cpu) = os.execd.cpu_sample.lock().expect("sample").unwrap_or((sb.started_us, 0));
    *os.execd.cpu_sample.lock().expect("sample") = Some((now, usage.cpu_usec));
    let cpus = f64::from(sb.cpu_count.max(1));
    let wall = (now - prev_at).max(1) as f64 * cpus;
    let pct = (usage.cpu_usec.saturating_sub(prev_cpu) as f64 / wall * 100.0).clamp(0.0, 100.0);
    let asked = sb.memory_mb as f64;
    let limit = usage.mem_limit_bytes as f64 / (1024.0 * 1024.0);
    let total = if limit > 0.0 && limit < asked { limit } else { asked };
    let used = (usage.mem_bytes as f64 / (1024.0 * 1024.0)).min(total);
    Ok(json!({
        "cpu_count": cpus,
        "cpu_used_pct": (pct * 100.0).round() / 100.0,
        "mem_total_mib": total,
        "mem_used_mib": (used * 100.0).round() / 100.0,
        "timestamp": now / 1000,
    }))
}

async fn metrics(State(st): State<Arc<AppState>>, Extension(sb): Sb, Extension(os): Os) -> Response {
    match sample(&st, &sb, &os).await {
        Ok(v) => Json(v).into_response(),
        Err(r) => r,
    }
}

async fn watch_metrics(State(st): State<Arc<AppState>>, Extension(sb): Sb, Extension(os): Os) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move {
        loop {
            let Ok(v) = sample(&st, &sb, &os).await else { return };
            if tx.send(frame(&v)).await.is_err() || st.sandbox(&sb.id).is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    stream_response(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_as_execd_splits_them() {
        let mut l = Lines::default();
        assert_eq!(l.push(b"a\nb"), vec!["a"]);
        assert_eq!(l.push(b"c\r\n\nd\re"), vec!["bc", "\n", "d"]);
        assert_eq!(l.finish().as_deref(), Some("e"));
        assert_eq!(l.finish(), None);
    }

    #[test]
    fn export_lines_round_trip() {
        assert_eq!(export_line(r#"declare -x A="b c""#), Some(("A".into(), "b c".into())));
        assert_eq!(export_line(r#"declare -x Q="say \"hi\" \$x""#), Some(("Q".into(), r#"say "hi" $x"#.into())));
        assert_eq!(export_line("declare -x EMPTY"), Some(("EMPTY".into(), String::new())));
        assert_eq!(export_line("nope"), None);
    }

    #[test]
    fn session_scripts_restore_state_first() {
        let env = BTreeMap::from([("X".to_string(), "it's".to_string()), ("PS1".into(), "$ ".into())]);
        let s = session_script("echo $X", &env, Some("/tmp"));
        assert!(s.contains("export X='it'\\''s'\n"));
        assert!(!s.contains("PS1"));
        assert!(s.contains("cd /tmp\necho $X\n"));
        assert!(s.ends_with("exit \"$__USER_EXIT_CODE__\"\n"));
    }
}

//! execd's code interpreting (`/code`, `/code/context`, `/code/contexts`), backed by the code
//! interpreter that runs on port 49999 in `code-interpreter-v1` (E2B's code-interpreter
//! protocol: `POST /contexts`, `POST /execute` answering JSON lines; see
//! `templates/code-interpreter-v1/interpreter/`), reached like any port of the sandbox.
//!
//! * A context is one of the interpreter's (its id is the context id); serve keeps their
//!   languages, so `GET /code/contexts?language=` lists this API's contexts of a language.
//! * `POST /code` without a context id runs in the interpreter's default context of the
//!   language (Python unless named), whose id is `default-<language>`.
//! * The stream is execd's: `init` (the context id), `execution_count`, `stdout`/`stderr` (as
//!   the kernel wrote them), `result` (`results` by MIME type, `text/plain` as `text`),
//!   `error` (`ename`, `evalue`, `traceback` lines), and `execution_complete` when no error
//!   ended it; the interpreter's keep-alives are `ping`s.
//! * `DELETE /code?id=<context>` (or `/command`) interrupts what runs in the context: serve
//!   drops its connection to the interpreter, which interrupts the kernel, and the stream
//!   ends with an `error` `KeyboardInterrupt`.
//! * A language without a kernel (`java`, `go` here) is the interpreter's 500 "Failed to create
//!   context: …"; a sandbox without the interpreter answers execd's "language runtime server
//!   not configured".

// Helpers return the early answer as their error.
#![allow(clippy::result_large_err)]

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::common::query_pairs;
use super::execd::{
    bad_request, complete_event, error, error_event, frame, parse, parse_or_default, runtime_error, stream_response,
};
use super::records::{Contexts, OsSandbox};
use crate::server::state::{AppState, ServedSandbox};

type Sb = Extension<Arc<ServedSandbox>>;
type Os = Extension<Arc<OsSandbox>>;
type St = State<Arc<AppState>>;

/// The interpreter's port.
const INTERPRETER_PORT: u16 = 49999;

/// The interpreter's result keys and the MIME types execd names them by.
const MIME: &[(&str, &str)] = &[
    ("text", "text"),
    ("html", "text/html"),
    ("markdown", "text/markdown"),
    ("svg", "image/svg+xml"),
    ("png", "image/png"),
    ("jpeg", "image/jpeg"),
    ("pdf", "application/pdf"),
    ("latex", "text/latex"),
    ("json", "application/json"),
    ("javascript", "application/javascript"),
    ("data", "e2b/data"),
    ("chart", "e2b/chart"),
];

impl Contexts {
    /// Interrupts the code running in context `id`; false if none runs there. (`DELETE /code`
    /// and `DELETE /command` both take a context's id.)
    pub(super) fn interrupt(&self, id: &str) -> bool {
        match self.running.lock().expect("running").remove(id) {
            Some(tx) => {
                let _ = tx.send(());
                true
            }
            None => false,
        }
    }
}

pub(super) fn routes(r: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    r.route("/code", post(run).delete(super::execd::interrupt))
        .route("/code/context", post(create))
        .route("/code/contexts", get(list).delete(delete_language))
        .route("/code/contexts/{id}", get(get_one).delete(delete_one))
}

fn normalize(language: Option<&str>) -> String {
    let l = language.unwrap_or("").trim().to_ascii_lowercase();
    match l.as_str() {
        "" => "python".into(),
        "js" => "javascript".into(),
        "ts" => "typescript".into(),
        _ => l,
    }
}

fn not_configured() -> Response {
    runtime_error("language runtime server not configured, please check your image runtime (scenario-run serve runs code on the code interpreter of code-interpreter-v1, image opensandbox/code-interpreter)")
}

/// A request to the interpreter: (status, body) for unary calls.
async fn call(
    st: &AppState,
    sb: &ServedSandbox,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<(StatusCode, Bytes), Response> {
    let resp = send(st, sb, method, path, body).await?;
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 16 << 20).await.unwrap_or_default();
    Ok((status, bytes))
}

async fn send(
    st: &AppState,
    sb: &ServedSandbox,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Response, Response> {
    let mut req =
        axum::http::Request::builder().method(method).uri(path).header("host", format!("127.0.0.1:{INTERPRETER_PORT}"));
    let body = match body {
        Some(v) => {
            req = req.header("content-type", "application/json");
            Body::from(v.to_string())
        }
        None => Body::empty(),
    };
    let req = req.body(body).map_err(|e| runtime_error(e.to_string()))?;
    let resp = crate::server::ports::send(st, sb, INTERPRETER_PORT, req).await.map_err(|_| not_configured())?;
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[derive(Debug, Default, Deserialize)]
struct ContextRequest {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

async fn create(State(st): St, Extension(sb): Sb, Extension(os): Os, body: Bytes) -> Response {
    let req: ContextRequest = match parse_or_default(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let language = normalize(req.language.as_deref());
    let mut payload = json!({"language": language});
    if let Some(cwd) = req.cwd.filter(|c| !c.is_empty()) {
        payload["cwd"] = json!(cwd);
    }
    let (status, bytes) = match call(&st, &sb, "POST", "/contexts", Some(payload)).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !status.is_success() {
        return runtime_error(format!("error creating code context. {}", String::from_utf8_lossy(&bytes).trim()));
    }
    let Some(id) = serde_json::from_slice::<Value>(&bytes).ok().and_then(|v| v["id"].as_str().map(str::to_string))
    else {
        return runtime_error("error creating code context: the interpreter named no context");
    };
    os.code.by_id.lock().expect("contexts").insert(id.clone(), language.clone());
    Json(json!({"id": id, "language": language})).into_response()
}

fn language_param(q: Option<&str>) -> Option<String> {
    query_pairs(q).into_iter().find(|(k, _)| k == "language").map(|(_, v)| normalize(Some(&v)))
}

async fn list(Extension(os): Os, RawQuery(q): RawQuery) -> Response {
    let language = language_param(q.as_deref());
    let mut out: Vec<Value> = os
        .code
        .by_id
        .lock()
        .expect("contexts")
        .iter()
        .filter(|(_, l)| language.as_ref().is_none_or(|want| *l == want))
        .map(|(id, l)| json!({"id": id, "language": l}))
        .collect();
    out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Json(Value::Array(out)).into_response()
}

async fn get_one(Extension(os): Os, Path(id): Path<String>) -> Response {
    match os.code.by_id.lock().expect("contexts").get(&id) {
        Some(l) => Json(json!({"id": id, "language": l})).into_response(),
        None => error(StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND", format!("context {id} not found")),
    }
}

async fn remove(st: &AppState, sb: &ServedSandbox, os: &OsSandbox, id: &str) {
    os.code.interrupt(id);
    os.code.by_id.lock().expect("contexts").remove(id);
    let _ = call(st, sb, "DELETE", &format!("/contexts/{id}"), None).await;
}

async fn delete_one(State(st): St, Extension(sb): Sb, Extension(os): Os, Path(id): Path<String>) -> Response {
    if !os.code.by_id.lock().expect("contexts").contains_key(&id) {
        return error(StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND", format!("context {id} not found"));
    }
    remove(&st, &sb, &os, &id).await;
    StatusCode::OK.into_response()
}

async fn delete_language(State(st): St, Extension(sb): Sb, Extension(os): Os, RawQuery(q): RawQuery) -> Response {
    let Some(language) = language_param(q.as_deref()) else {
        return error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'language'");
    };
    let ids: Vec<String> = os
        .code
        .by_id
        .lock()
        .expect("contexts")
        .iter()
        .filter(|(_, l)| **l == language)
        .map(|(id, _)| id.clone())
        .collect();
    for id in ids {
        remove(&st, &sb, &os, &id).await;
    }
    StatusCode::OK.into_response()
}

#[derive(Debug, Default, Deserialize)]
struct CodeContext {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    language: Option<String>,
}

#[derive(Debug, Deserialize)]
struct RunRequest {
    #[serde(default)]
    context: Option<CodeContext>,
    #[serde(default)]
    code: String,
}

/// One line of the interpreter's stream as execd's event, if it makes one; whether it was an
/// error.
fn translate(line: &Value) -> Option<(Value, bool)> {
    let ts = super::execd::now_ms();
    match line["type"].as_str()? {
        "number_of_executions" => Some((
            json!({"type": "execution_count", "execution_count": line["execution_count"], "timestamp": ts}),
            false,
        )),
        kind @ ("stdout" | "stderr") => {
            let text = line["text"].as_str().unwrap_or("");
            (!text.is_empty()).then(|| (json!({"type": kind, "text": text, "timestamp": ts}), false))
        }
        "result" => {
            let mut results = serde_json::Map::new();
            for (key, mime) in MIME {
                if let Some(v) = line.get(*key).filter(|v| !v.is_null()) {
                    results.insert(mime.to_string(), v.clone());
                }
            }
            if let Some(extra) = line["extra"].as_object() {
                for (k, v) in extra {
                    results.insert(k.clone(), v.clone());
                }
            }
            Some((json!({"type": "result", "results": results, "timestamp": ts}), false))
        }
        "error" => {
            let traceback: Vec<String> = match &line["traceback"] {
                Value::String(s) => s.lines().map(str::to_string).collect(),
                Value::Array(a) => a.iter().map(|l| l.as_str().unwrap_or("").to_string()).collect(),
                _ => Vec::new(),
            };
            let name = line["name"].as_str().unwrap_or("Error");
            let value = line["value"].as_str().unwrap_or("");
            Some((error_event(name, value, traceback), true))
        }
        "keepalive" => Some((json!({"type": "ping", "text": "pong", "timestamp": ts}), false)),
        _ => None,
    }
}

async fn run(State(st): St, Extension(sb): Sb, Extension(os): Os, body: Bytes) -> Response {
    let req: RunRequest = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.code.is_empty() {
        return bad_request("invalid request, validation error: code is required");
    }
    let ctx = req.context.unwrap_or_default();
    let (id, payload) = match ctx.id.filter(|i| !i.is_empty()) {
        Some(id) => {
            if !os.code.by_id.lock().expect("contexts").contains_key(&id) {
                return error(StatusCode::NOT_FOUND, "CONTEXT_NOT_FOUND", format!("context {id} not found"));
            }
            (id.clone(), json!({"code": req.code, "context_id": id}))
        }
        None => {
            let language = normalize(ctx.language.as_deref());
            (format!("default-{language}"), json!({"code": req.code, "language": language}))
        }
    };
    let payload = if st.mutants.has(crate::server::mutants::Fault::CodeContextLost) && !id.starts_with("default-") {
        json!({"code": req.code, "language": "python"})
    } else {
        payload
    };
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    {
        let mut running = os.code.running.lock().expect("running");
        if running.contains_key(&id) {
            return runtime_error("error running codes session is busy");
        }
        running.insert(id.clone(), stop_tx);
    }
    let resp = match send(&st, &sb, "POST", "/execute", Some(payload)).await {
        Ok(r) => r,
        Err(r) => {
            os.code.running.lock().expect("running").remove(&id);
            return r;
        }
    };
    if !resp.status().is_success() {
        os.code.running.lock().expect("running").remove(&id);
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20).await.unwrap_or_default();
        return runtime_error(format!("error running codes {}", String::from_utf8_lossy(&bytes).trim()));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let _ = tx.try_send(frame(&super::execd::text_event("init", &id)));
    tokio::spawn(async move {
        let started = Instant::now();
        let mut upstream = resp.into_body().into_data_stream();
        let mut stop = stop_rx;
        let mut buf = Vec::new();
        let mut had_error = false;
        let mut interrupted = false;
        'read: loop {
            let chunk = tokio::select! {
                c = upstream.next() => c,
                _ = &mut stop => { interrupted = true; break 'read; }
                _ = tx.closed() => break 'read,
            };
            let Some(Ok(chunk)) = chunk else { break };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let Ok(v) = serde_json::from_slice::<Value>(&line) else { continue };
                if v["type"] == "end_of_execution" {
                    if !had_error {
                        let _ = tx.send(frame(&complete_event(started))).await;
                    }
                    break 'read;
                }
                if let Some((ev, is_error)) = translate(&v) {
                    had_error |= is_error;
                    if tx.send(frame(&ev)).await.is_err() {
                        break 'read;
                    }
                }
            }
        }
        // Dropping the connection makes the interpreter interrupt the kernel.
        drop(upstream);
        os.code.running.lock().expect("running").remove(&id);
        if interrupted {
            let _ = tx.send(frame(&error_event("KeyboardInterrupt", "interrupted", vec![]))).await;
        }
    });
    stream_response(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_lines_become_execd_events() {
        let (r, e) =
            translate(&json!({"type": "result", "text": "4", "html": "<b>4</b>", "is_main_result": true})).unwrap();
        assert!(!e);
        assert_eq!(r["results"], json!({"text": "4", "text/html": "<b>4</b>"}));
        let (err, e) =
            translate(&json!({"type": "error", "name": "NameError", "value": "x", "traceback": "a\nb"})).unwrap();
        assert!(e);
        assert_eq!(err["error"], json!({"ename": "NameError", "evalue": "x", "traceback": ["a", "b"]}));
        let (c, _) = translate(&json!({"type": "number_of_executions", "execution_count": 3})).unwrap();
        assert_eq!(c["execution_count"], 3);
        assert!(translate(&json!({"type": "stdout", "text": ""})).is_none());
        assert_eq!(normalize(Some("TS")), "typescript");
    }
}

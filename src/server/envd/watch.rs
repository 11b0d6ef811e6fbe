//! The watchers of envd's `filesystem.Filesystem` service: `WatchDir` (a server stream of a
//! directory's changes) and the polled `CreateWatcher`, `GetWatcherEvents` and
//! `RemoveWatcher`, whose watchers stay on the sandbox until removed or the sandbox goes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::common::{keepalive_header, stream_call, stream_response, Frame, SandboxExt, SharedState};
use super::filesystem::describe;
use crate::provider::ErrorKind;
use crate::server::connect::{self, RpcError, Unary};
use crate::server::state::{AppState, ServedSandbox, Watcher};
use crate::server::users::resolve;

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

/// Starts a watch on the request's directory: `not_found` if it is missing,
/// `invalid_argument` if it is no directory.
async fn start_watch(st: &AppState, sb: &ServedSandbox, r: &WatchRequest) -> Result<Watcher, RpcError> {
    let dir = resolve(&r.path)?;
    match st.provider.sandbox(&sb.provider_id).stat(&dir).await {
        Ok(e) if e.kind == "dir" || e.kind == "symlink" => {}
        Ok(_) => return Err(RpcError::invalid(format!("path {dir} is not a directory"))),
        Err(e) if e.kind == ErrorKind::NotFound => return Err(RpcError::not_found(format!("path {dir} not found"))),
        Err(e) => return Err(e.into()),
    }
    let watch = st.provider.sandbox(&sb.provider_id).watch_dir(&dir, r.recursive).await.map_err(|e| {
        if e.message.starts_with("not a directory") {
            RpcError::invalid(format!("path {dir} is not a directory"))
        } else {
            e.into()
        }
    })?;
    Ok(Watcher { watch, dir, include_entry: r.include_entry })
}

/// `FilesystemEvent`s in proto3 JSON, with the entry where asked and the path still exists.
async fn events_json(
    st: &AppState,
    sb: &ServedSandbox,
    w: &Watcher,
    events: Vec<crate::provider::FsEvent>,
) -> Vec<Value> {
    use crate::provider::FsOp;
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        if st.mutants.has(crate::server::mutants::Fault::WatchMissesRemoves) && matches!(e.op, FsOp::Remove) {
            continue;
        }
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
            if let Ok(entry) = st.provider.sandbox(&sb.provider_id).stat(&path).await {
                v["entry"] = describe(st, sb, &entry).await;
            }
        }
        out.push(v);
    }
    out
}

unary_fn!(create_watcher, WatchRequest, |st, sb, r| {
    let w = start_watch(&st, &sb, &r).await?;
    let id = crate::server::state::new_sandbox_id();
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
pub(super) async fn watch_dir(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    stream_call(&st, &body, |req: WatchRequest| watch(&st, sb, &headers, req)).await
}

/// [`watch_dir`] once its request is read: the watch, and the task that streams it.
async fn watch(
    st: &Arc<AppState>,
    sb: Arc<ServedSandbox>,
    headers: &HeaderMap,
    req: WatchRequest,
) -> Result<Response, RpcError> {
    let w = start_watch(st, &sb, &req).await?;
    let keepalive = keepalive_header(headers);
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
    Ok(stream_response(st, rx))
}

//! The in-sandbox daemon (envd) API, served for the sandbox named by the request (see
//! `super::dispatch`): the router of the `process.Process` and `filesystem.Filesystem` Connect
//! services, plain `GET`/`POST /files` and `/health` (protocol doc §4–§6, §9.3), and the
//! unary-route machinery. One file a service: `process`, `filesystem` (entries) and `watch`
//! (the Filesystem service's watchers); what they share is in `common` (the timeout and
//! keepalive headers, server-streaming responses) and `super::users` (envd's path
//! resolution, the Basic-auth user).
//!
//! Paths follow envd's resolution: empty → `/home/user`, `~` and `~/x` → the home
//! directory, relative → under the home directory. Methods not routed here answer a clean
//! `unimplemented`. Access tokens are checked before this router runs (`auth`); `/files` is
//! in `files`.
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use super::answer::json_error;
use super::connect::{self, RpcError, Unary};
use super::state::{AppState, ServedSandbox, RPC_BODY_LIMIT};
use super::users::basic_user;
use common::{SandboxExt, SharedState};
use filesystem::{fs_list_dir, fs_make_dir, fs_move, fs_remove, fs_stat};
use process::{close_stdin, process_connect, process_list, process_start, send_input, send_signal, update};
use watch::{create_watcher, get_watcher_events, remove_watcher, watch_dir};

/// Routes of envd but `/files` (which `files` serves). Every handler finds its sandbox in the
/// request extensions.
pub(crate) fn routes() -> Router<Arc<AppState>> {
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
}

async fn unknown(req: Request) -> Response {
    let path = req.uri().path();
    if path.starts_with("/process.") || path.starts_with("/filesystem.") {
        RpcError::unimplemented(format!("{path} is not implemented by scenario-run serve")).into_response()
    } else {
        json_error(StatusCode::NOT_FOUND, &format!("no route for {path}"))
    }
}

/// A unary handler: `(state, sandbox, Basic user, body) -> JSON result`.
type UnaryFn =
    fn(Arc<AppState>, Arc<ServedSandbox>, Option<String>, Bytes) -> futures_util::future::BoxFuture<'static, Unary>;

/// Adapts a unary handler to a route handler.
fn unary_route(
    f: UnaryFn,
) -> impl Fn(SharedState, SandboxExt, HeaderMap, Bytes) -> futures_util::future::BoxFuture<'static, Response>
       + Clone
       + Send
       + Sync
       + 'static {
    move |axum::extract::State(st): SharedState, Extension(sb): SandboxExt, headers: HeaderMap, body: Bytes| {
        Box::pin(async move { connect::unary(f(st, sb, basic_user(&headers), body).await) })
    }
}

#[macro_use]
mod common;
mod filesystem;
mod process;
mod watch;

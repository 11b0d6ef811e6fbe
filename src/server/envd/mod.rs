//! The in-sandbox daemon (envd) API, served for the sandbox named by the request (see
//! `super::dispatch`): the router of the `process.Process` and `filesystem.Filesystem` Connect
//! services, plain `GET`/`POST /files` and `/health` (protocol doc §4–§6, §9.3), and what the
//! services share: the unary-route machinery, envd's path resolution, the Basic-auth user, the
//! timeout and keepalive headers and server-streaming responses. One file a service:
//! `process`, `filesystem` (entries) and `watch` (the Filesystem service's watchers).
//!
//! Paths follow envd's resolution: empty → `/home/user`, `~` and `~/x` → the home
//! directory, relative → under the home directory. Methods not routed here answer a clean
//! `unimplemented`. Access tokens are checked before this router runs (`auth`); `/files` is
//! in `files`.
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use base64::Engine;

use super::connect::{self, RpcError, Unary};
use super::{json_error, limit_body, AppState, ServedSandbox, RPC_BODY_LIMIT};
use filesystem::{fs_list_dir, fs_make_dir, fs_move, fs_remove, fs_stat};
use process::{close_stdin, process_connect, process_list, process_start, send_input, send_signal, update};
use watch::{create_watcher, get_watcher_events, remove_watcher, watch_dir};

const HOME: &str = "/home/user";
/// Idle time between keepalive events when the client does not ask (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

type SharedState = axum::extract::State<Arc<AppState>>;
type SandboxExt = Extension<Arc<ServedSandbox>>;

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

/// A unary handler taking request type `$req`; `$user` (if named) is the user the request
/// selects with Basic auth, `None` for the default user.
macro_rules! unary_fn {
    ($name:ident, $req:ty, |$st:ident, $sb:ident, $r:ident| $body:block) => {
        unary_fn!($name, $req, |$st, $sb, $r, _user| $body);
    };
    ($name:ident, $req:ty, |$st:ident, $sb:ident, $r:ident, $user:ident| $body:block) => {
        pub(super) fn $name(
            $st: Arc<AppState>,
            $sb: Arc<ServedSandbox>,
            $user: Option<String>,
            body: Bytes,
        ) -> futures_util::future::BoxFuture<'static, Unary> {
            Box::pin(async move {
                let $r: $req = connect::unary_request(&body)?;
                let _ = (&$st, &$sb, &$user);
                $body
            })
        }
    };
}

mod filesystem;
mod process;
mod watch;

pub(crate) use watch::Watcher;

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

/// A server-streaming call: the request parsed, then the response `f` makes of it; a stream
/// with only the end-stream error when either fails.
async fn stream_call<T, F>(st: &AppState, body: &Bytes, f: impl FnOnce(T) -> F) -> Response
where
    T: serde::de::DeserializeOwned,
    F: std::future::Future<Output = Result<Response, RpcError>>,
{
    let req: T = match connect::stream_request(body) {
        Ok(r) => r,
        Err(e) => return stream_error(st, e),
    };
    f(req).await.unwrap_or_else(|e| stream_error(st, e))
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
}

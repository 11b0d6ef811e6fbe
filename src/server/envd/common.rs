//! What envd's services share, below them and below the router (`envd/mod.rs`): the handler
//! extractors, the timeout and keepalive headers, server-streaming responses, and the
//! `unary_fn!` handlers of unary calls are made with.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Extension;

use crate::server::answer::limit_body;
use crate::server::connect::{self, RpcError};
use crate::server::state::{AppState, ServedSandbox};

/// Idle time between keepalive events when the client does not ask (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

pub(super) type SharedState = axum::extract::State<Arc<AppState>>;

pub(super) type SandboxExt = Extension<Arc<ServedSandbox>>;

pub(super) fn timeout_header(h: &HeaderMap) -> Option<Duration> {
    let ms: u64 = h.get("connect-timeout-ms")?.to_str().ok()?.trim().parse().ok()?;
    (ms > 0).then(|| Duration::from_millis(ms))
}

pub(super) fn keepalive_header(h: &HeaderMap) -> Duration {
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
pub(super) fn stream_error(st: &AppState, e: RpcError) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let _ = tx.try_send(Ok(connect::end_stream(Some(&e))));
    stream_response(st, rx)
}

/// A server-streaming call: the request parsed, then the response `f` makes of it; a stream
/// with only the end-stream error when either fails.
pub(super) async fn stream_call<T, F>(st: &AppState, body: &Bytes, f: impl FnOnce(T) -> F) -> Response
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

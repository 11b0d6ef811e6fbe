//! The answers every handler builds on, E2B's and OpenSandbox's: the error bodies of both
//! shapes (and a provider error or an E2B answer in OpenSandbox's), streamed bodies cut by
//! fault injection, a refused request's body drained, and the socket a request came
//! in on (to end a dying stream with a reset).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::json;

use super::{scrub, tls};

/// A JSON error body in the control-plane shape `{"code":<status>,"message":…}`.
pub(crate) fn json_error(status: StatusCode, message: &str) -> Response {
    let message = scrub::answer(status.as_u16(), message);
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string()).into_response()
}

/// Wraps a body so that the connection is aborted after `limit` bytes (fault injection).
pub(crate) fn limit_body(body: Body, limit: Option<u64>) -> Body {
    let Some(limit) = limit else {
        return body;
    };
    let mut sent = 0u64;
    let s = body.into_data_stream().scan(false, move |cut, chunk| {
        if *cut {
            return futures_util::future::ready(None);
        }
        let item = match chunk {
            Ok(b) if sent + b.len() as u64 > limit => {
                *cut = true;
                let keep = (limit - sent) as usize;
                sent = limit;
                // A short last chunk, then an error: hyper drops the connection mid-body.
                return futures_util::future::ready(Some(futures_util::stream::iter(vec![
                    Ok(b.slice(..keep)),
                    Err(std::io::Error::other("fault injection: stream cut")),
                ])));
            }
            Ok(b) => {
                sent += b.len() as u64;
                Ok(b)
            }
            Err(e) => Err(std::io::Error::other(e)),
        };
        futures_util::future::ready(Some(futures_util::stream::iter(vec![item])))
    });
    Body::from_stream(s.flatten().map(|r: Result<Bytes, std::io::Error>| r))
}

/// Reads (and drops) what is left of a refused request's body, up to 1 MiB and 5 s: a
/// response before the body makes hyper close the connection, and a client that reuses it
/// from its pool (the SDK after a refused create) sees "disconnected without a response".
pub(crate) async fn drain(body: Body) {
    let _ = tokio::time::timeout(Duration::from_secs(5), axum::body::to_bytes(body, 1 << 20)).await;
}

/// The socket a request came in on, so that a stream whose sandbox dies can be cut as a
/// dying envd's is: with a reset (see [`reset_on_close`]), not a clean close. And whether it
/// speaks TLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnSocket {
    fd: std::os::fd::RawFd,
    pub(super) tls: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tls::Listener>> for ConnSocket {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tls::Listener>) -> Self {
        use std::os::fd::AsRawFd;
        ConnSocket { fd: stream.io().as_raw_fd(), tls: stream.io().is_tls() }
    }
}

/// Makes the connection of a request whose response is still streaming end with a TCP reset
/// when it is closed (`SO_LINGER` 0): over HTTP/1.1 that is how the SDKs see a connection
/// dropped mid-request (a transport failure, after which they ask `/health` whether the
/// sandbox is gone) rather than a truncated body. Only for a response still being written,
/// so the socket is the request's own.
pub(crate) fn reset_on_close(sock: Option<ConnSocket>) {
    let Some(ConnSocket { fd, .. }) = sock else { return };
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: plain setsockopt on a descriptor the server holds open; a failure is harmless.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

// ---- OpenSandbox's shape: `{"code": "<NAME>", "message"}` ----

/// An OpenSandbox error answer.
pub(crate) fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    let body = json!({"code": code, "message": crate::server::scrub::answer(status.as_u16(), &message)});
    (status, [(axum::http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string())
        .into_response()
}

pub(crate) fn not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, "DOCKER::SANDBOX_NOT_FOUND", format!("Sandbox {id} not found."))
}

/// The code of a create whose declared disk the host has no room for (507).
const INSUFFICIENT_STORAGE: &str = "SANDBOX::INSUFFICIENT_STORAGE";

/// A provider error as an OpenSandbox answer.
pub(crate) fn provider_error(e: crate::provider::ProviderError) -> Response {
    use crate::provider::ErrorKind;
    let (status, code) = match e.kind {
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, "SANDBOX::NOT_FOUND"),
        ErrorKind::Invalid => (StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER"),
        ErrorKind::Auth => (StatusCode::UNAUTHORIZED, "SANDBOX::UNAUTHORIZED"),
        ErrorKind::Unsupported => (StatusCode::NOT_IMPLEMENTED, "SANDBOX::API_NOT_SUPPORTED"),
        ErrorKind::Timeout | ErrorKind::Infra => (StatusCode::INTERNAL_SERVER_ERROR, "SANDBOX::UNKNOWN_ERROR"),
        ErrorKind::Capacity => (StatusCode::INSUFFICIENT_STORAGE, INSUFFICIENT_STORAGE),
    };
    error(status, code, e.message)
}

/// An answer of serve's E2B side (`{"code": <status>, "message"}`) in OpenSandbox's shape.
pub(crate) async fn from_e2b(resp: Response) -> Response {
    let status = resp.status();
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let message = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
    let code = match status {
        StatusCode::BAD_REQUEST => "SANDBOX::INVALID_PARAMETER",
        StatusCode::NOT_FOUND => "SANDBOX::NOT_FOUND",
        StatusCode::TOO_MANY_REQUESTS => "SANDBOX::RATE_LIMITED",
        StatusCode::NOT_IMPLEMENTED => "SANDBOX::API_NOT_SUPPORTED",
        StatusCode::INSUFFICIENT_STORAGE => INSUFFICIENT_STORAGE,
        _ => "SANDBOX::UNKNOWN_ERROR",
    };
    let mut r = error(status, code, message);
    for h in ["retry-after", "should-retry"] {
        if let Some(v) = parts.headers.get(h) {
            r.headers_mut().insert(h, v.clone());
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn cut_bodies_stop_at_the_limit() {
        let body = limit_body(Body::from(vec![7u8; 100]), Some(10));
        let r = axum::body::to_bytes(body, usize::MAX).await;
        assert!(r.is_err());
        let body = limit_body(Body::from(vec![7u8; 10]), Some(10));
        assert_eq!(axum::body::to_bytes(body, usize::MAX).await.unwrap().len(), 10);
    }
}

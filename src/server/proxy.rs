//! Reaching ports inside a sandbox: `{port}-{id}.<domain>` host routing (the form
//! `Sandbox.get_host(port)` returns) and the `E2b-Sandbox-Id` + `E2b-Sandbox-Port` header pair
//! both forward the request to that port, over a connection dialled for it
//! ([`Ports::dial`]).
//!
//! Plain HTTP/1.1 request/response forwarding with streamed bodies (hyper's client, header
//! names in title case as E2B's Go proxy sends them); the `Host` header is passed through
//! unchanged, or replaced by create's `network.maskRequestHost` with `${PORT}` the port. Protocol upgrades (WebSocket) are not forwarded.
//! A port nobody listens on answers 502 "The sandbox is running but port is not open", which
//! the SDKs map to `SandboxUnreachableException`.
//!
//! [`Ports::dial`]: crate::provider::Ports::dial

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::state::{AppState, ServedSandbox, ENVD_PORT};

/// Headers that belong to one hop (RFC 9110 §7.6.1), not forwarded either way.
const HOP_BY_HOP: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];

/// The `(port, sandbox id)` named by a `Host` of the form `{port}-{id}.{anything}`.
pub(crate) fn host_route(host: &str) -> Option<(u16, &str)> {
    let first = host.split('.').next()?;
    if first.len() == host.len() {
        // No domain part: a bare host name is never a sandbox address.
        return None;
    }
    let (port, id) = first.split_once('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return None;
    }
    Some((port.parse().ok()?, id))
}

fn port_closed(id: &str, port: u16) -> Response {
    let body = json!({
        "sandboxId": id,
        "port": port,
        "code": 502,
        "message": "The sandbox is running but port is not open",
    });
    (StatusCode::BAD_GATEWAY, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Forwards `req` to `port` in `sb`, over a connection dialled for it (`super::ports`).
pub(crate) async fn forward(st: &AppState, sb: &ServedSandbox, port: u16, mut req: Request) -> Response {
    let mut pq = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    if st.mutants.has(super::mutants::Fault::ProxyDropsQuery) {
        pq = req.uri().path().to_string();
    }
    let uri: Uri = match pq.parse() {
        Ok(u) => u,
        Err(_) => return port_closed(&sb.id, port),
    };
    *req.uri_mut() = uri;
    *req.version_mut() = axum::http::Version::HTTP_11;
    strip_hop_by_hop(req.headers_mut());
    for h in ["e2b-sandbox-id", "e2b-sandbox-port"] {
        req.headers_mut().remove(h);
    }
    if let Some(mask) = &sb.mask_host {
        // Checked at create with a port put in.
        if let Ok(v) = axum::http::HeaderValue::from_str(&mask.replace("${PORT}", &port.to_string())) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    match super::ports::send(st, sb, port, req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, Body::new(body))
        }
        // The sandbox was killed while the request was in progress: its connection goes, as
        // on E2B, whose proxy loses its upstream with the sandbox (the code-interpreter SDKs
        // tell that broken stream from a closed port, and say the sandbox was killed).
        Err(_) if st.lookup(&sb.id).await.is_none() => cut_off(),
        Err(_) => port_closed(&sb.id, port),
    }
}

/// A response that never completes: its body fails at once, so the client's connection is
/// closed without a complete answer.
fn cut_off() -> Response {
    let failed = futures_util::stream::once(async {
        Err::<bytes::Bytes, std::io::Error>(std::io::Error::other("the sandbox was killed"))
    });
    (StatusCode::BAD_GATEWAY, Body::from_stream(failed)).into_response()
}

fn strip_hop_by_hop(h: &mut axum::http::HeaderMap) {
    // Also whatever the Connection header lists.
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|s| s.trim().to_ascii_lowercase()).collect::<Vec<_>>())
        .filter_map(|s| HeaderName::from_bytes(s.as_bytes()).ok())
        .collect();
    for n in listed {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(*n);
    }
}

/// Where a data-plane request goes: `(sandbox id, port)` from the host or the headers.
pub(super) fn data_target(req: &Request) -> Option<(String, u16)> {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string);
    let host = host.or_else(|| req.uri().host().map(str::to_string)).unwrap_or_default();
    if let Some((port, id)) = host_route(&host) {
        return Some((id.to_string(), port));
    }
    let id = req.headers().get("e2b-sandbox-id").and_then(|v| v.to_str().ok())?;
    let port = req
        .headers()
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(ENVD_PORT);
    Some((id.trim().to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_route_like_the_e2b_proxy() {
        assert_eq!(host_route("8080-abc123.localhost:3000"), Some((8080, "abc123")));
        assert_eq!(host_route("49983-abc.e2b.app"), Some((49983, "abc")));
        assert_eq!(host_route("127.0.0.1:3000"), None);
        assert_eq!(host_route("localhost:3000"), None);
        assert_eq!(host_route("x-abc.localhost"), None);
        assert_eq!(host_route("80-ab-c.localhost"), None);
    }
}

//! OpenSandbox's protocol beside E2B's, over the same local sandboxes: the lifecycle API
//! (`specs/sandbox-lifecycle.yml` of alibaba/OpenSandbox) under `/v1`, and, through the
//! server's proxy route `/sandboxes/{id}/proxy/{port}/…`, the in-sandbox daemons the official
//! SDKs talk to: execd on 44772 (`specs/execd-api.yaml`: commands, sessions, files,
//! directories, metrics, code), the egress sidecar on 18080 (its `/policy`), and any other port
//! forwarded into the sandbox. What each answers follows the specifications and, where they
//! are silent, what the reference server (`server/`) and execd (`components/execd`) do; the
//! unmodified Python SDKs' own end-to-end suite judges it (`tests/opensandbox_sdk/run.sh`).
//!
//! # Routing
//!
//! `super::route` hands over every request that is no E2B data-plane request (no sandbox
//! host, no `E2b-Sandbox-Id`) and whose path is `/v1/…` or the proxy route ([`claims`]):
//!
//! * `/v1/…` is the lifecycle API (`lifecycle`). Every route needs the API key as
//!   `OPEN-SANDBOX-API-KEY` (serve's one key, as E2B's routes take it): without it 401
//!   `MISSING_API_KEY`, with another 401 `INVALID_API_KEY`, the reference server's words.
//! * `/sandboxes/{id}/proxy/{port}/…` (also under `/v1`) is the sandbox's port. The reference
//!   server leaves this route open (its gateway may add a route token); serve does not: it
//!   needs the API key (what the SDKs send with `use_server_proxy`) or the sandbox's own
//!   token as `OpenSandbox-Secure-Access`, the header OpenSandbox's secured endpoints use,
//!   which every endpoint answer names in its `headers` (so the SDKs send it on every call
//!   to that endpoint without being asked). execd and the egress sidecar take the sandbox's
//!   envd token, any other port its traffic token (none if its ports are public, as with
//!   `--allow-public-traffic`); a token of another sandbox is refused (403). What reaches a
//!   port of the sandbox's own carries none of these credentials (`auth::strip_credentials`).
//!
//! Every answer carries `X-Request-ID`: the client's, else a fresh one (the SDKs put it on
//! their exceptions). Errors are `{"code": "<CODE>", "message": "…"}`: the lifecycle's codes
//! (`SANDBOX::…`, `DOCKER::…`) and execd's (`FILE_NOT_FOUND`, `INVALID_REQUEST_BODY`, …).
//!
//! # Sandboxes
//!
//! A sandbox made here is one of serve's (`sandboxes::make_sandbox`: the same limits, tokens,
//! expiry and E2B view), with what OpenSandbox adds kept in [`records::State`]: its startup
//! source, its entrypoint, whether it expires, and execd's state (commands, sessions, code
//! contexts, egress rules). The OpenSandbox API sees the sandboxes made through it; the E2B
//! API sees them too.

// Checks return the refusal as their error; it is built once per refused request.
#![allow(clippy::result_large_err)]

mod code;
mod common;
mod egress;
mod execd;
mod fs;
mod images;
mod lifecycle;
pub(super) mod records;
mod volumes;

pub use volumes::VolumeConfig;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;

use super::answer::{drain, error, from_e2b, not_found};
use super::auth;
use super::state::{inject, AppState, ServedSandbox};
use common::{port_token, ACCESS_HEADER, EGRESS_PORT, EXECD_PORT};
use records::{OsSandbox, Routers};

/// The lifecycle API's key header.
pub(crate) const API_KEY_HEADER: &str = "open-sandbox-api-key";
/// execd's own token header, accepted beside [`ACCESS_HEADER`] on execd's port.
const EXECD_TOKEN_HEADER: &str = "x-execd-access-token";

/// Whether OpenSandbox's side takes this request (see the module documentation).
pub(crate) fn claims(path: &str) -> bool {
    path.starts_with("/v1/") || path == "/v1" || proxy_route(path).is_some()
}

/// `(sandbox id, port, rest of the path)` of `/sandboxes/{id}/proxy/{port}{rest}`, also
/// under `/v1`. A port that is no number, or a `..` anywhere, is no proxy route (as the
/// reference server's strict pattern).
fn proxy_route(path: &str) -> Option<(&str, u16, &str)> {
    if path.contains("..") {
        return None;
    }
    let p = path.strip_prefix("/v1").unwrap_or(path);
    let p = p.strip_prefix("/sandboxes/")?;
    let (id, p) = p.split_once('/')?;
    let p = p.strip_prefix("proxy/")?;
    let (port, rest) = match p.find('/') {
        Some(i) => (&p[..i], &p[i..]),
        None => (p, ""),
    };
    if id.is_empty() || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id, port.parse().ok()?, rest))
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// Whether the request carries serve's API key as `OPEN-SANDBOX-API-KEY`.
fn has_api_key(st: &AppState, h: &HeaderMap) -> bool {
    header(h, API_KEY_HEADER).is_some_and(|k| auth::ct_eq(k.as_bytes(), st.api_key.as_bytes()))
}

/// The lifecycle API's key check: the reference server's answers.
fn check_api_key(st: &AppState, h: &HeaderMap) -> Result<(), Response> {
    match header(h, API_KEY_HEADER) {
        None => Err(error(
            StatusCode::UNAUTHORIZED,
            "MISSING_API_KEY",
            "Authentication credentials are missing. Provide API key via OPEN-SANDBOX-API-KEY header.",
        )),
        Some(_) if !has_api_key(st, h) => Err(error(
            StatusCode::UNAUTHORIZED,
            "INVALID_API_KEY",
            "Authentication credentials are invalid. Check your API key and try again.",
        )),
        Some(_) => Ok(()),
    }
}

/// The proxy route's check (see the module documentation).
fn check_proxy(st: &AppState, sb: &ServedSandbox, port: u16, h: &HeaderMap) -> Result<(), Response> {
    if has_api_key(st, h) {
        return Ok(());
    }
    let public = port != EXECD_PORT && port != EGRESS_PORT && sb.public_ports;
    let given =
        header(h, ACCESS_HEADER).or_else(|| (port == EXECD_PORT).then(|| header(h, EXECD_TOKEN_HEADER)).flatten());
    match given {
        Some(t) if auth::ct_eq(t.as_bytes(), port_token(sb, port).as_bytes()) => Ok(()),
        Some(_) => Err(error(
            StatusCode::FORBIDDEN,
            "SANDBOX::FORBIDDEN",
            format!("invalid access token for sandbox {} port {port}", sb.id),
        )),
        None if public => Ok(()),
        None => Err(error(
            StatusCode::UNAUTHORIZED,
            "MISSING_ACCESS_TOKEN",
            format!(
                "sandbox {} port {port} needs the {ACCESS_HEADER} header its endpoint names, or the API key",
                sb.id
            ),
        )),
    }
}

/// The request id of this request: the client's `X-Request-ID`, else a fresh one.
fn request_id(h: &HeaderMap) -> HeaderValue {
    header(h, "x-request-id").filter(|v| v.len() <= 256).and_then(|v| HeaderValue::from_str(v).ok()).unwrap_or_else(
        || {
            let h = crate::random::hex(16);
            let id = format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..]);
            HeaderValue::from_str(&id).expect("hex")
        },
    )
}

/// Serves one request OpenSandbox's side [`claims`].
pub(crate) async fn route(st: &Arc<AppState>, req: Request) -> Response {
    let id = request_id(req.headers());
    let mut resp = route_inner(st, req).await;
    resp.headers_mut().insert("x-request-id", id);
    resp
}

fn routers(st: &Arc<AppState>) -> &Routers {
    st.opensandbox.routers.get_or_init(|| Routers {
        lifecycle: lifecycle::routes().merge(egress::control_routes()).with_state(st.clone()),
        execd: code::routes(fs::routes(execd::routes())).with_state(st.clone()),
        egress: egress::router(st.clone()),
    })
}

async fn route_inner(st: &Arc<AppState>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if let Some((id, port, rest)) = proxy_route(&path) {
        let (id, rest) = (id.to_string(), rest.to_string());
        return proxy(st, &id, port, &rest, req).await;
    }
    if let Err(r) = check_api_key(st, req.headers()) {
        drain(req.into_body()).await;
        return r;
    }
    if let Some(r) = inject(st).await {
        return from_e2b(r).await;
    }
    routers(st).lifecycle.clone().oneshot(req).await.into_response()
}

/// The sandbox behind a proxy request, with its records; the answer when there is none.
async fn live(st: &Arc<AppState>, id: &str) -> Result<(Arc<ServedSandbox>, Arc<OsSandbox>), Response> {
    let Some(os) = st.opensandbox.get(id) else {
        return Err(not_found(id));
    };
    match st.lookup(id).await {
        Some((sb, _)) => Ok((sb, os)),
        None => {
            st.opensandbox.remove(id);
            Err(not_found(id))
        }
    }
}

/// `/sandboxes/{id}/proxy/{port}{rest}`: execd, the egress sidecar or the sandbox's port.
async fn proxy(st: &Arc<AppState>, id: &str, port: u16, rest: &str, mut req: Request) -> Response {
    let (sb, os) = match live(st, id).await {
        Ok(v) => v,
        // Without the API key an unknown sandbox answers as a known one refusing the
        // credentials would: which ids exist is not for a client without the key to learn.
        Err(r) => {
            let h = req.headers();
            let r = if has_api_key(st, h) {
                r
            } else if header(h, ACCESS_HEADER).is_some() || header(h, EXECD_TOKEN_HEADER).is_some() {
                error(
                    StatusCode::FORBIDDEN,
                    "SANDBOX::FORBIDDEN",
                    format!("invalid access token for sandbox {id} port {port}"),
                )
            } else {
                error(
                    StatusCode::UNAUTHORIZED,
                    "MISSING_ACCESS_TOKEN",
                    format!(
                        "sandbox {id} port {port} needs the {ACCESS_HEADER} header its endpoint names, or the API key"
                    ),
                )
            };
            drain(req.into_body()).await;
            return r;
        }
    };
    if let Err(r) = check_proxy(st, &sb, port, req.headers()) {
        drain(req.into_body()).await;
        return r;
    }
    if sb.is_paused() {
        drain(req.into_body()).await;
        return error(
            StatusCode::CONFLICT,
            "DOCKER::SANDBOX_NOT_RUNNING",
            format!("Sandbox {id} is paused; resume it to reach its port {port}."),
        );
    }
    if let Some(secs) = os.renew_on_access {
        lifecycle::renew_on_access(st, &sb, &os, secs).await;
    }
    let rest = if rest.is_empty() { "/" } else { rest };
    let pq = match req.uri().query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    };
    match pq.parse() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", "invalid path"),
    }
    match port {
        EXECD_PORT | EGRESS_PORT => {
            req.extensions_mut().insert(sb);
            req.extensions_mut().insert(os);
            let r = if port == EXECD_PORT { &routers(st).execd } else { &routers(st).egress };
            r.clone().oneshot(req).await.into_response()
        }
        _ => {
            auth::strip_credentials(st, &sb, req.headers_mut());
            for h in [API_KEY_HEADER, ACCESS_HEADER, EXECD_TOKEN_HEADER] {
                req.headers_mut().remove(h);
            }
            super::proxy::forward(st, &sb, port, req).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_routes_are_exact() {
        assert_eq!(proxy_route("/sandboxes/abc/proxy/44772/command"), Some(("abc", 44772, "/command")));
        assert_eq!(proxy_route("/v1/sandboxes/abc/proxy/8080"), Some(("abc", 8080, "")));
        assert_eq!(proxy_route("/sandboxes/abc/proxy/x/command"), None);
        assert_eq!(proxy_route("/sandboxes/abc/proxy/80/../../x"), None);
        assert_eq!(proxy_route("/sandboxes/abc/timeout"), None);
        assert!(claims("/v1/sandboxes"));
        assert!(!claims("/sandboxes"));
        assert!(!claims("/v2/sandboxes"));
    }
}

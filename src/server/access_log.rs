//! `serve -v`: one line per request on stderr, so an author sees what a client asked and what
//! serve answered (a 404 no longer passes without a word): method, path, status, time and the
//! sandbox, with the values of keys, tokens and signatures in the query masked.

use std::future::Future;
use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;

/// Query parameters whose values are credentials (`signature`, `access_token`, `api_key`, …).
const SECRET_PARAMS: &[&str] = &["key", "token", "signature", "secret", "password", "auth"];

/// `GET /sandboxes/abc/files?path=/x&signature=*** (sandbox abc)`: the request as logged.
pub(super) fn describe(req: &Request) -> String {
    let uri = req.uri();
    let mut line = format!("{} {}", req.method(), uri.path());
    if let Some(query) = uri.query() {
        line.push('?');
        line.push_str(&mask_query(query));
    }
    let sandbox = super::proxy::data_target(req).map(|(id, _)| id).or_else(|| sandbox_in_path(uri.path()));
    if let Some(id) = sandbox.filter(|id| !id.is_empty()) {
        line.push_str(&format!(" (sandbox {id})"));
    }
    line
}

/// The response of `handled`, logged with `line` and its time when there is a line.
pub(super) async fn logged(line: Option<String>, handled: impl Future<Output = Response>) -> Response {
    let Some(line) = line else { return handled.await };
    let started = Instant::now();
    let resp = handled.await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    crate::errln!("serve: {line} -> {} in {ms:.1}ms", resp.status().as_u16());
    resp
}

fn mask_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if is_secret(name) => format!("{name}=***"),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| name.contains(s))
}

/// `/sandboxes/<id>/…` (E2B's control plane, `/v2/` too) and OpenSandbox's `/v1/sandboxes/<id>`.
fn sandbox_in_path(path: &str) -> Option<String> {
    let mut parts = path.split('/').skip_while(|p| *p != "sandboxes");
    parts.next()?;
    parts.next().filter(|id| !id.is_empty()).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_described_with_credentials_masked() {
        let req = Request::builder()
            .method("GET")
            .uri("/files?path=/tmp/a&username=user&signature=v1_abcdef&signature_expiration=9&access_token=t0k3n")
            .header("e2b-sandbox-id", "sb123")
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(
            describe(&req),
            "GET /files?path=/tmp/a&username=user&signature=***&signature_expiration=***&access_token=*** (sandbox sb123)"
        );
        let req = Request::builder().method("DELETE").uri("/sandboxes/abc").body(axum::body::Body::empty()).unwrap();
        assert_eq!(describe(&req), "DELETE /sandboxes/abc (sandbox abc)");
        let req = Request::builder().method("POST").uri("/v2/sandboxes").body(axum::body::Body::empty()).unwrap();
        assert_eq!(describe(&req), "POST /v2/sandboxes");
        assert_eq!(sandbox_in_path("/v1/sandboxes/xyz/pause").as_deref(), Some("xyz"));
    }
}

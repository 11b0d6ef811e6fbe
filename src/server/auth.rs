//! Who may reach what through `serve` (protocol doc §3.3, §5.3, §7; `sandbox-security.md`:
//! nobody without the API key or the sandbox's token reaches its processes, files or ports).
//!
//! Every sandbox gets two random tokens at create, returned by create and connect:
//!
//! * `envdAccessToken`, which the SDKs send as `X-Access-Token` on every envd call, as with
//!   E2B's secure sandboxes. Unlike E2B's public v1 handler, serve issues it whatever the
//!   request's `secure` says: E2B's current SDKs call `secure` deprecated ("every sandbox
//!   secures envd access"), and an insecure sandbox would be open to whoever knows its id.
//!   The SDKs use the token a create answer carries whether or not they asked for one.
//! * `trafficAccessToken`, E2B's private ingress: requests to a sandbox port (not envd's)
//!   must carry it as `e2b-traffic-access-token`. E2B issues it only when a create asks for
//!   `network.allowPublicTraffic: false`; serve does also when create does not say, because
//!   a port host (`{port}-{id}.localhost`) should not be open to anyone who can reach serve's
//!   port. A create saying `allowPublicTraffic: true` gets public ports (and a null
//!   `trafficAccessToken` in its answer, as E2B's); `--allow-public-traffic` makes that the
//!   default, as E2B's (the official SDK tests reach ports without a token).
//!
//! What each route accepts (the API key always works, as `X-API-KEY`, so a person with curl
//! never needs a token; `Authorization` does not authenticate on the data plane, where it is
//! envd's Basic user selection or the sandbox application's own, and it reaches a port's
//! application unless it carries one of serve's secrets):
//!
//! | route | credential | refused with |
//! |---|---|---|
//! | envd `GET /health` | none (envd's rule) | |
//! | envd Connect RPCs | `X-Access-Token` | 401 `{"code":401,"message":"unauthorized access, …"}` |
//! | envd `/files` | `X-Access-Token`, else a `signature` (+ `signature_expiration`) in the query, signed with the token (§5.3) | 401 with envd's messages: token mismatch, missing, invalid or expired signature |
//! | a sandbox port | `e2b-traffic-access-token` (or `X-Access-Token`); none if its ports are public | 403 `{"sandboxId","message","code":403}`, missing or invalid, as E2B's proxy |
//!
//! A signed `/files` URL acts as the user it was signed for (`username`, the default user when
//! empty): a Basic header naming another user is refused, since the signature covers only
//! the query.
//!
//! A signed `/files` URL may arrive with no sandbox id at all: with `E2B_SANDBOX_URL` the SDK
//! builds `upload_url()`/`download_url()` on that one URL (protocol doc §12.4). The signature
//! names the sandbox: it is a hash over the sandbox's token, so serve tries the token of every
//! live sandbox ([`find_signer`]).
//!
//! Every comparison of a secret runs in constant time ([`ct_eq`]). Credentials are never
//! echoed in an answer, and every header carrying one, in whatever form (a bearer or Basic
//! `Authorization`, a cookie, any header name: [`strip_credentials`]), is removed before a
//! request reaches the sandbox's application (see `proxy`), so a server inside that echoes
//! its request headers cannot leak them into a test's report.

// Checks return the refusal as their error; it is built once per refused request.
#![allow(clippy::result_large_err)]

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::answer::json_error;
use super::state::{now_secs, AppState, ServedSandbox};
use super::users::{basic_user, DEFAULT_USER};

/// The header of E2B's private ingress.
pub(crate) const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";
/// envd's token header.
pub(crate) const ACCESS_HEADER: &str = "x-access-token";

/// Equality of two secrets in time independent of where they differ and of their lengths:
/// both sides are hashed first, then every byte of the digests is compared.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let (da, db) = (Sha256::digest(a), Sha256::digest(b));
    let diff = da.iter().zip(db.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

/// Whether the request carries serve's API key as `X-API-KEY`.
pub(crate) fn api_key_header(st: &AppState, h: &HeaderMap) -> bool {
    header(h, "x-api-key").is_some_and(|k| ct_eq(k.as_bytes(), st.api_key.as_bytes()))
}

/// envd's 401 body.
fn unauthorized(message: &str) -> Response {
    json_error(StatusCode::UNAUTHORIZED, message)
}

/// Checks a request to envd of `sb` (path and query as sent). `/files` is checked by
/// [`files`] instead, which needs the query.
pub(crate) fn envd(st: &AppState, sb: &ServedSandbox, path: &str, h: &HeaderMap) -> Result<(), Response> {
    if path == "/health" || path == "/files" {
        return Ok(());
    }
    let token_ok = header(h, ACCESS_HEADER).is_some_and(|t| ct_eq(t.as_bytes(), sb.tokens.envd.as_bytes()));
    if token_ok || api_key_header(st, h) {
        return Ok(());
    }
    Err(unauthorized("unauthorized access, please provide a valid access token or method signing if supported"))
}

/// The signing fields of a `/files` query.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Signed {
    pub path: String,
    pub username: String,
    pub signature: Option<String>,
    pub expiration: Option<String>,
}

impl Signed {
    /// The fields of a raw query string (each value decoded once, as envd's router does).
    pub(crate) fn from_query(q: Option<&str>) -> Self {
        let mut s = Signed::default();
        for (k, v) in crate::net::query_split(q) {
            let v = decode(v);
            match decode(k).as_str() {
                "path" => s.path = v,
                "username" => s.username = v,
                "signature" => s.signature = Some(v),
                "signature_expiration" => s.expiration = Some(v),
                _ => {}
            }
        }
        s
    }
}

/// `application/x-www-form-urlencoded` decoding of one value (`+` is a space).
fn decode(s: &str) -> String {
    let spaced = s.replace('+', " ");
    crate::net::url_decode(&spaced).unwrap_or(spaced)
}

/// `read` for downloads, `write` for uploads.
pub(crate) fn operation(method: &Method) -> &'static str {
    if method == Method::GET || method == Method::HEAD {
        "read"
    } else {
        "write"
    }
}

/// The signature the SDK computes (protocol doc §5.3):
/// `v1_` + base64 (standard, unpadded) of sha256 over `path:op:user:token[:expiration]`.
pub(crate) fn signature(path: &str, op: &str, username: &str, token: &str, expiration: Option<&str>) -> String {
    let mut raw = format!("{path}:{op}:{username}:{token}");
    if let Some(e) = expiration {
        raw.push(':');
        raw.push_str(e);
    }
    let digest = Sha256::digest(raw.as_bytes());
    format!("v1_{}", base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest))
}

/// Checks a `/files` request to `sb`, in envd's order: a token header must match; else the
/// API key; else a signature must be present and right, and not expired.
pub(crate) fn files(
    st: &AppState,
    sb: &ServedSandbox,
    method: &Method,
    q: &Signed,
    h: &HeaderMap,
) -> Result<(), Response> {
    if let Some(t) = header(h, ACCESS_HEADER) {
        if ct_eq(t.as_bytes(), sb.tokens.envd.as_bytes()) || api_key_header(st, h) {
            return Ok(());
        }
        return Err(unauthorized("access token present in header but does not match"));
    }
    if api_key_header(st, h) {
        return Ok(());
    }
    let Some(sig) = q.signature.as_deref() else {
        return Err(unauthorized("missing signature query parameter"));
    };
    let want = signature(&q.path, operation(method), &q.username, &sb.tokens.envd, q.expiration.as_deref());
    if !ct_eq(sig.as_bytes(), want.as_bytes()) {
        return Err(unauthorized("invalid signature"));
    }
    not_expired(q)?;
    signed_user(q, h)
}

/// A signature binds the user the request acts as: the signed `username`, or the default
/// user when it is empty. A Basic header naming anyone else is refused, or a URL signed for
/// the default user would read as root with `Authorization: Basic root:` (issue 23).
fn signed_user(q: &Signed, h: &HeaderMap) -> Result<(), Response> {
    let signed = if q.username.is_empty() { DEFAULT_USER } else { q.username.as_str() };
    match basic_user(h) {
        Some(asked) if asked != signed => Err(unauthorized(&format!(
            "the URL was signed for user '{signed}', and the Authorization header asks for '{asked}'"
        ))),
        _ => Ok(()),
    }
}

fn not_expired(q: &Signed) -> Result<(), Response> {
    let Some(exp) = q.expiration.as_deref() else {
        return Ok(());
    };
    match exp.trim().parse::<i64>() {
        Ok(e) if e >= now_secs() as i64 => Ok(()),
        Ok(_) => Err(unauthorized("signature is already expired")),
        Err(_) => Err(json_error(StatusCode::BAD_REQUEST, "signature_expiration must be unix seconds")),
    }
}

/// The sandbox whose token signed a `/files` request that names no sandbox (see the module
/// documentation), or the 401 envd would answer.
pub(crate) fn find_signer(
    st: &AppState,
    method: &Method,
    q: &Signed,
) -> Result<std::sync::Arc<ServedSandbox>, Response> {
    let Some(sig) = q.signature.as_deref() else {
        return Err(unauthorized("missing signature query parameter"));
    };
    let op = operation(method);
    let signer = st.all_sandboxes().into_iter().find(|sb| {
        let want = signature(&q.path, op, &q.username, &sb.tokens.envd, q.expiration.as_deref());
        ct_eq(sig.as_bytes(), want.as_bytes())
    });
    let sb = signer.ok_or_else(|| unauthorized("invalid signature"))?;
    not_expired(q)?;
    Ok(sb)
}

/// E2B's proxy answer for a port request without the right traffic token.
fn forbidden(id: &str, message: &str) -> Response {
    let body = json!({"sandboxId": id, "message": message, "code": 403});
    (StatusCode::FORBIDDEN, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Checks a request to a port of `sb` other than envd's; public ports take anyone.
pub(crate) fn port(st: &AppState, sb: &ServedSandbox, h: &HeaderMap) -> Result<(), Response> {
    if sb.public_ports {
        return Ok(());
    }
    if let Some(t) = header(h, TRAFFIC_HEADER) {
        if ct_eq(t.as_bytes(), sb.tokens.traffic.as_bytes()) {
            return Ok(());
        }
        return Err(forbidden(&sb.id, "invalid traffic access token"));
    }
    let token_ok = header(h, ACCESS_HEADER).is_some_and(|t| ct_eq(t.as_bytes(), sb.tokens.envd.as_bytes()));
    if token_ok || api_key_header(st, h) {
        return Ok(());
    }
    Err(forbidden(&sb.id, &format!("missing traffic access token: send the {TRAFFIC_HEADER} header")))
}

/// Removes serve's credentials from a request about to reach a sandbox's application: the
/// traffic-token header, and every header that carries the API key or one of the sandbox's
/// tokens in any form a client sends one (see [`carries`]): `X-API-Key`, `Authorization:
/// Bearer`/`Token`/`Basic`, `Proxy-Authorization`, a cookie, a header of any name. Other
/// headers (the application's own credentials among them) pass.
pub(crate) fn strip_credentials(st: &AppState, sb: &ServedSandbox, h: &mut HeaderMap) {
    h.remove(TRAFFIC_HEADER);
    let secrets = [st.api_key.as_str(), sb.tokens.envd.as_str(), sb.tokens.traffic.as_str()];
    let names: Vec<axum::http::HeaderName> =
        h.iter().filter(|(_, v)| carries(v.as_bytes(), &secrets)).map(|(n, _)| n.clone()).collect();
    for n in names {
        h.remove(n);
    }
}

/// Whether a header value carries one of `secrets`: as it is (any ASCII case, anywhere in the
/// value), or base64-encoded in one of its words (Basic credentials `user:secret` or
/// `secret:`, standard or URL-safe alphabet, padded or not).
pub(crate) fn carries(value: &[u8], secrets: &[&str]) -> bool {
    let secrets: Vec<Vec<u8>> =
        secrets.iter().filter(|s| !s.is_empty()).map(|s| s.as_bytes().to_ascii_lowercase()).collect();
    let holds = |hay: &[u8]| {
        let hay = hay.to_ascii_lowercase();
        secrets.iter().any(|s| hay.windows(s.len()).any(|w| w == s.as_slice()))
    };
    if holds(value) {
        return true;
    }
    let engines = [base64::engine::general_purpose::STANDARD_NO_PAD, base64::engine::general_purpose::URL_SAFE_NO_PAD];
    value.split(|b| b.is_ascii_whitespace() || matches!(b, b',' | b';')).any(|word| {
        // A cookie's or a parameter's value, after its name.
        let after = word.iter().position(|b| *b == b'=').map(|i| &word[i + 1..]);
        [Some(word), after].into_iter().flatten().any(|w| {
            let w = w.strip_suffix(b"==").or_else(|| w.strip_suffix(b"=")).unwrap_or(w);
            engines.iter().any(|e| e.decode(w).is_ok_and(|d| holds(&d)))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::state::Tokens;

    #[test]
    fn tokens_are_random_hex() {
        let t = Tokens::new().unwrap();
        assert_eq!(t.envd.len(), 64);
        assert!(t.envd.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(t.envd, t.traffic);
        assert!(!format!("{t:?}").contains(&t.envd));
    }

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(!ct_eq(b"", b"a"));
    }

    #[test]
    fn signatures_match_the_sdk() {
        // e2b.sandbox.signature.get_signature("/home/user/a.txt", "read", None, "tok", None)
        // computed with the SDK's own code: sha256("/home/user/a.txt:read::tok"), base64, no '='.
        let sig = signature("/home/user/a.txt", "read", "", "tok", None);
        let digest = Sha256::digest(b"/home/user/a.txt:read::tok");
        let b64 = base64::engine::general_purpose::STANDARD.encode(digest);
        assert_eq!(sig, format!("v1_{}", b64.trim_end_matches('=')));
        let with_exp = signature("p", "write", "user", "tok", Some("1700000000"));
        assert_ne!(with_exp, signature("p", "write", "user", "tok", None));
    }

    #[test]
    fn secrets_are_found_in_every_form_a_client_sends_them() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        for v in [
            format!("Bearer {key}"),
            format!("bearer   {}", key.to_uppercase()),
            key.to_string(),
            format!("Basic {}", b64(&format!("{key}:"))),
            format!("Basic {}", b64(&format!("api:{key}"))),
            format!("Basic {}", b64(&format!("api:{key}")).trim_end_matches('=')),
            format!("session=1; e2b_api_key={key}"),
            format!("session=1; k={}", b64(key)),
        ] {
            assert!(carries(v.as_bytes(), &["tok", key]), "{v}");
        }
        for v in ["Bearer app-token-123", "Basic dXNlcjo=", "", "text/html; charset=utf-8"] {
            assert!(!carries(v.as_bytes(), &[key, ""]), "{v}");
        }
    }

    #[test]
    fn files_queries_decode_once() {
        let q = Signed::from_query(Some("path=%2Fhome%2Fuser%2Fa%20b.txt&username=user&signature=v1_x%2By&x=1"));
        assert_eq!(q.path, "/home/user/a b.txt");
        assert_eq!(q.username, "user");
        assert_eq!(q.signature.as_deref(), Some("v1_x+y"));
        assert_eq!(q.expiration, None);
    }
}

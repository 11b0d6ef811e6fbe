//! The data-plane transport to one sandbox's envd (protocol doc §3–§5): its address, the
//! identity and auth headers every request carries, Connect unary and server-streaming
//! calls, and the plain `/files` endpoints.
//!
//! Headers (§3.1): `E2b-Sandbox-Id`, `E2b-Sandbox-Port: 49983` always; `X-Access-Token` when
//! the API issued an `envdAccessToken` (marked sensitive, never in a message: text from envd
//! is scrubbed of both tokens before it becomes an error); `Authorization: Basic base64("<user>:")` when the
//! caller names a user (or envd is older than 0.4.0, where the SDK forces `user`). Without
//! it envd runs the operation as the template's default user.
//!
//! Errors keep the Connect code ([`RpcError::Connect`]) so call sites can give `not_found`
//! and `already_exists` their meaning; a proxy 502 saying the sandbox was not found is
//! [`RpcError::Gone`], so a dead sandbox is never mistaken for a missing file.

use std::time::Duration;

use base64::Engine as _;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value as JsonValue;

use super::api::{enc, error_chain};
use super::config::ENVD_PORT;
use super::connect::{envelope, error_from_body, snippet, ConnectError, Decoder, Frame};
use super::retry::{self, Idempotency};
use crate::provider::{ErrorKind, ProviderError};

/// Deadline of unary RPCs (the SDK's default request timeout).
pub const RPC_TIMEOUT: Duration = Duration::from_secs(60);
/// Deadline of `/files` transfers.
pub const FILES_TIMEOUT: Duration = Duration::from_secs(300);
/// How long opening a stream (until the response headers) may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Seconds between keepalive events we ask envd for on streams (what the SDK asks).
pub const KEEPALIVE_SECS: u32 = 50;
/// E2B's private-ingress header for requests to a sandbox's ports (protocol doc §7).
pub const TRAFFIC_HEADER: &str = "e2b-traffic-access-token";

/// A failed envd call.
#[derive(Debug)]
pub enum RpcError {
    /// envd (or the proxy) answered with a Connect error.
    Connect(ConnectError),
    /// The proxy says the sandbox is not there (502 "… was not found").
    Gone(String),
    /// Transport or protocol failure, already mapped.
    Other(ProviderError),
}

impl RpcError {
    pub fn code(&self) -> Option<&str> {
        match self {
            RpcError::Connect(e) => Some(&e.code),
            _ => None,
        }
    }

    /// A provider error for the operation `what` on sandbox `id`.
    pub fn into_provider(self, what: &str, id: &str) -> ProviderError {
        match self {
            RpcError::Connect(e) => {
                let kind = e.kind();
                if kind == ErrorKind::Auth {
                    ProviderError::new(
                        kind,
                        format!("authentication failed: envd refused {what} ({}: {})", e.code, e.message),
                    )
                } else {
                    ProviderError::new(kind, format!("{what}: {}", e.message))
                }
            }
            RpcError::Gone(m) => ProviderError::not_found(format!("{what}: sandbox {id} is not running ({m})")),
            RpcError::Other(e) => e,
        }
    }
}

/// Address and credentials of one sandbox's envd.
#[derive(Clone)]
pub struct Envd {
    pub id: String,
    /// Base URL without a trailing slash.
    pub base: String,
    /// The domain the API returned for this sandbox, if any.
    pub domain: Option<String>,
    pub version: Option<String>,
    token: Option<String>,
    /// `trafficAccessToken`: what requests to the sandbox's other ports must carry as
    /// `e2b-traffic-access-token` (E2B's private ingress), if the API issued one.
    traffic: Option<String>,
}

impl std::fmt::Debug for Envd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envd")
            .field("id", &self.id)
            .field("base", &self.base)
            .field("domain", &self.domain)
            .field("version", &self.version)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("traffic", &self.traffic.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// `"0.6.13"` → (0, 6, 13); missing parts are 0; `None` if it does not start with a number.
pub fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.trim().trim_start_matches('v').split(['.', '-', '+']).map(|p| {
        let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
        digits.parse::<u64>().ok()
    });
    let major = parts.next()??;
    Some((major, parts.next().flatten().unwrap_or(0), parts.next().flatten().unwrap_or(0)))
}

impl Envd {
    pub fn new(id: &str, base: String, domain: Option<String>, version: Option<String>, token: Option<String>) -> Self {
        Self {
            id: id.to_string(),
            base: base.trim_end_matches('/').to_string(),
            domain: domain.filter(|d| !d.is_empty()),
            version,
            token: token.filter(|t| !t.is_empty()),
            traffic: None,
        }
    }

    /// The same, with a traffic access token.
    pub fn with_traffic(mut self, traffic: Option<String>) -> Self {
        self.traffic = traffic.filter(|t| !t.is_empty());
        self
    }

    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    pub fn traffic(&self) -> Option<&str> {
        self.traffic.as_deref()
    }

    /// `text` from a server with this sandbox's tokens replaced by `***`.
    fn scrub(&self, text: String) -> String {
        [&self.token, &self.traffic]
            .into_iter()
            .flatten()
            .filter(|t| t.len() >= 4)
            .fold(text, |s, t| s.replace(t.as_str(), "***"))
    }

    /// The user to name: the caller's, else `user` when envd predates default users (< 0.4.0).
    pub fn user<'a>(&self, user: Option<&'a str>) -> Option<&'a str> {
        match user.filter(|u| !u.is_empty()) {
            Some(u) => Some(u),
            None if self.version.as_deref().and_then(parse_version).is_some_and(|v| v < (0, 4, 0)) => Some("user"),
            None => None,
        }
    }

    /// Whether envd is at least `want` (unknown versions count as new).
    pub fn at_least(&self, want: (u64, u64, u64)) -> bool {
        self.version.as_deref().and_then(parse_version).is_none_or(|v| v >= want)
    }

    fn request(
        &self,
        http: &reqwest::Client,
        method: Method,
        path: &str,
        user: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut rb = http
            .request(method, format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", &self.id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string());
        if let Some(t) = &self.token {
            if let Ok(mut v) = HeaderValue::from_str(t) {
                v.set_sensitive(true);
                rb = rb.header("X-Access-Token", v);
            }
        }
        if let Some(u) = self.user(user) {
            let b = base64::engine::general_purpose::STANDARD.encode(format!("{u}:"));
            rb = rb.header(AUTHORIZATION, format!("Basic {b}"));
        }
        rb
    }

    fn transport(&self, what: &str, e: &reqwest::Error, timeout: Duration) -> RpcError {
        RpcError::Other(if e.is_timeout() {
            ProviderError::new(ErrorKind::Timeout, format!("{what}: envd did not answer within {timeout:?}"))
        } else if e.is_connect() {
            ProviderError::infra(format!("{what}: cannot reach envd at {}: {}", self.base, error_chain(e)))
        } else {
            ProviderError::infra(format!("{what}: envd request failed: {}", error_chain(e)))
        })
    }

    /// Reads a non-200 answer into an error.
    fn failure(&self, status: u16, body: &[u8]) -> RpcError {
        let mut e = error_from_body(status, body);
        e.message = self.scrub(e.message);
        if status == 502 && e.message.to_lowercase().contains("not found") {
            return RpcError::Gone(e.message);
        }
        RpcError::Connect(e)
    }

    /// A unary Connect call with the JSON codec.
    pub async fn unary<T: DeserializeOwned>(
        &self,
        http: &reqwest::Client,
        rpc: &str,
        body: &JsonValue,
        user: Option<&str>,
        what: &str,
    ) -> Result<T, RpcError> {
        let bytes = serde_json::to_vec(body).map_err(|e| RpcError::Other(ProviderError::infra(e.to_string())))?;
        let build = || {
            self.request(http, Method::POST, &format!("/{rpc}"), user)
                .header(CONTENT_TYPE, "application/json")
                .header("Connect-Protocol-Version", "1")
                .header("Connect-Timeout-Ms", RPC_TIMEOUT.as_millis().to_string())
                .header("Accept-Encoding", "identity")
                .timeout(RPC_TIMEOUT + Duration::from_secs(5))
                .body(bytes.clone())
        };
        let resp = retry::send(build, Idempotency::Never).await.map_err(|e| self.transport(what, &e, RPC_TIMEOUT))?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| self.transport(what, &e, RPC_TIMEOUT))?;
        if status != 200 {
            return Err(self.failure(status, &body));
        }
        let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &body };
        serde_json::from_slice(body).map_err(|e| {
            RpcError::Other(ProviderError::infra(format!(
                "{what}: unexpected answer from envd ({e}): {}",
                snippet(body)
            )))
        })
    }

    /// Opens a server-streaming Connect call. `deadline` becomes `Connect-Timeout-Ms`.
    pub async fn stream(
        &self,
        http: &reqwest::Client,
        rpc: &str,
        body: &JsonValue,
        user: Option<&str>,
        deadline: Option<Duration>,
        what: &str,
    ) -> Result<RpcStream, RpcError> {
        let msg = serde_json::to_vec(body).map_err(|e| RpcError::Other(ProviderError::infra(e.to_string())))?;
        let framed = envelope(0, &msg);
        let build = || {
            let mut rb = self
                .request(http, Method::POST, &format!("/{rpc}"), user)
                .header(CONTENT_TYPE, "application/connect+json")
                .header("Connect-Protocol-Version", "1")
                .header("Connect-Content-Encoding", "identity")
                .header("Connect-Accept-Encoding", "identity")
                .header("Keepalive-Ping-Interval", KEEPALIVE_SECS.to_string())
                .body(framed.clone());
            if let Some(d) = deadline {
                rb = rb.header("Connect-Timeout-Ms", d.as_millis().max(1).to_string());
            }
            rb
        };
        let resp = tokio::time::timeout(OPEN_TIMEOUT, retry::send(build, Idempotency::Never))
            .await
            .map_err(|_| {
                RpcError::Other(ProviderError::new(
                    ErrorKind::Timeout,
                    format!("{what}: envd did not answer within {OPEN_TIMEOUT:?}"),
                ))
            })?
            .map_err(|e| self.transport(what, &e, OPEN_TIMEOUT))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body =
                tokio::time::timeout(OPEN_TIMEOUT, resp.bytes()).await.ok().and_then(|r| r.ok()).unwrap_or_default();
            return Err(self.failure(status, &body));
        }
        Ok(RpcStream { resp, dec: Decoder::new(), done: false, what: what.to_string() })
    }

    /// `GET /files?path=…`: the file's bytes.
    pub async fn download(&self, http: &reqwest::Client, path: &str, user: Option<&str>) -> Result<Vec<u8>, RpcError> {
        let what = format!("read {path}");
        let build = || self.request(http, Method::GET, &self.files_query(path, user), user).timeout(FILES_TIMEOUT);
        let resp =
            retry::send(build, Idempotency::Never).await.map_err(|e| self.transport(&what, &e, FILES_TIMEOUT))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.bytes().await.map_err(|e| self.transport(&what, &e, FILES_TIMEOUT))?;
            return Err(self.failure(status, &body));
        }
        // Read as it arrives, up to the limit of one read (a server may send without end).
        let too_large = || RpcError::Other(crate::provider::file_too_large(path));
        if resp.content_length().is_some_and(|n| n > crate::provider::MAX_FILE_READ) {
            return Err(too_large());
        }
        let mut resp = resp;
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.transport(&what, &e, FILES_TIMEOUT))? {
            if (body.len() + chunk.len()) as u64 > crate::provider::MAX_FILE_READ {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// `POST /files?path=…` with one multipart part named `file` whose filename is the
    /// path, as the SDK sends it. Returns the path envd wrote.
    pub async fn upload(
        &self,
        http: &reqwest::Client,
        path: &str,
        data: &[u8],
        user: Option<&str>,
    ) -> Result<String, RpcError> {
        let what = format!("write {path}");
        let boundary = format!("scenario-run-{:016x}", (retry::jitter() * u64::MAX as f64) as u64);
        let body = multipart_body(&boundary, path, data);
        let build = || {
            self.request(http, Method::POST, &self.files_query(path, user), user)
                .header(CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
                .timeout(FILES_TIMEOUT)
                .body(body.clone())
        };
        let resp =
            retry::send(build, Idempotency::Never).await.map_err(|e| self.transport(&what, &e, FILES_TIMEOUT))?;
        let status = resp.status().as_u16();
        let answer = resp.bytes().await.map_err(|e| self.transport(&what, &e, FILES_TIMEOUT))?;
        if status != 200 {
            return Err(self.failure(status, &answer));
        }
        let written: Vec<super::model::UploadedJson> = serde_json::from_slice(&answer).map_err(|e| {
            RpcError::Other(ProviderError::infra(format!(
                "{what}: unexpected answer from envd ({e}): {}",
                snippet(&answer)
            )))
        })?;
        match written.into_iter().next() {
            Some(w) if !w.path.is_empty() => Ok(w.path),
            _ => Err(RpcError::Other(ProviderError::infra(format!("{what}: envd reported no file written")))),
        }
    }

    fn files_query(&self, path: &str, user: Option<&str>) -> String {
        let mut q = format!("/files?path={}", enc(path));
        if let Some(u) = self.user(user) {
            q.push_str(&format!("&username={}", enc(u)));
        }
        q
    }
}

/// A `multipart/form-data` body with one `file` part (§5.2). The filename is the target
/// path with quotes and line breaks percent-escaped; `?path=` takes precedence anyway.
pub fn multipart_body(boundary: &str, path: &str, data: &[u8]) -> Vec<u8> {
    let filename = path.replace('%', "%25").replace('"', "%22").replace('\r', "%0D").replace('\n', "%0A");
    let mut body = Vec::with_capacity(data.len() + 256);
    body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
    body.extend_from_slice(
        format!("Content-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n").as_bytes(),
    );
    body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
    body.extend_from_slice(data);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    body
}

/// The response side of a server stream: message payloads, then the trailer's verdict.
pub struct RpcStream {
    resp: reqwest::Response,
    dec: Decoder,
    done: bool,
    what: String,
}

impl RpcStream {
    /// The next message's JSON; `Ok(None)` at a clean end (with or without the trailer,
    /// which the SDK also tolerates); the trailer's error as [`RpcError::Connect`].
    /// Cancel-safe: a dropped call loses no bytes.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, RpcError> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.dec.next_frame() {
                Ok(Some(Frame::Message(m))) => return Ok(Some(m)),
                Ok(Some(Frame::End(err))) => {
                    self.done = true;
                    return match err {
                        None => Ok(None),
                        Some(e) => Err(RpcError::Connect(e)),
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Err(RpcError::Other(ProviderError::infra(format!("{}: {e}", self.what))));
                }
            }
            match self.resp.chunk().await {
                Ok(Some(bytes)) => self.dec.push(&bytes),
                Ok(None) => {
                    self.done = true;
                    return match self.dec.finish() {
                        Ok(()) => Ok(None),
                        Err(e) => Err(RpcError::Other(ProviderError::infra(format!("{}: {e}", self.what)))),
                    };
                }
                Err(e) => {
                    self.done = true;
                    return Err(RpcError::Other(ProviderError::infra(format!(
                        "{}: stream broke: {}",
                        self.what,
                        error_chain(&e)
                    ))));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(parse_version("0.6.13"), Some((0, 6, 13)));
        assert_eq!(parse_version("0.4"), Some((0, 4, 0)));
        assert_eq!(parse_version("v1.2.3-rc1"), Some((1, 2, 3)));
        assert_eq!(parse_version("x"), None);
        let old = Envd::new("a", "http://h/".into(), None, Some("0.3.9".into()), None);
        assert_eq!(old.base, "http://h");
        assert_eq!(old.user(None), Some("user"), "envd < 0.4.0 needs a user");
        assert_eq!(old.user(Some("root")), Some("root"));
        let new = Envd::new("a", "http://h".into(), None, Some("0.6.13".into()), Some("tok".into()));
        assert_eq!(new.user(None), None);
        assert!(new.at_least((0, 5, 2)));
        assert!(!old.at_least((0, 5, 2)));
        assert!(!format!("{new:?}").contains("tok\""), "token is redacted");
    }

    #[test]
    fn multipart_layout() {
        let b = multipart_body("XX", "/home/user/a \"b\".txt", b"hi\n");
        let s = String::from_utf8(b).unwrap();
        assert_eq!(
            s,
            "--XX\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/home/user/a %22b%22.txt\"\r\n\
             Content-Type: application/octet-stream\r\n\r\nhi\n\r\n--XX--\r\n"
        );
    }

    #[test]
    fn failures() {
        let envd = Envd::new("x", "http://h".into(), None, None, Some("tok-secret".into()));
        let e = envd.failure(502, br#"{"sandboxId":"x","message":"The sandbox was not found","code":502}"#);
        assert!(matches!(e, RpcError::Gone(_)));
        let p = e.into_provider("stat /x", "x");
        assert_eq!(p.kind, ErrorKind::NotFound);
        assert!(p.message.contains("not running"));
        let e = envd.failure(502, br#"{"message":"The sandbox is running but port is not open","code":502}"#);
        assert_eq!(e.code(), Some("unavailable"));
        let e = envd.failure(404, br#"{"code":404,"message":"path '/x' does not exist"}"#);
        assert_eq!(e.code(), Some("not_found"));
        let e = envd.failure(401, br#"{"code":"unauthenticated","message":"invalid username: 'bob'"}"#);
        let p = e.into_provider("run a command", "x");
        assert_eq!(p.kind, ErrorKind::Auth);
        assert!(p.message.starts_with("authentication failed"));
        // A server that echoes a token does not get it into a message.
        let envd = envd.with_traffic(Some("traffic-secret".into()));
        let e = envd.failure(401, br#"{"code":401,"message":"bad token tok-secret or traffic-secret"}"#);
        let p = e.into_provider("run a command", "x");
        assert!(!p.message.contains("tok-secret") && !p.message.contains("traffic-secret"), "{}", p.message);
    }
}

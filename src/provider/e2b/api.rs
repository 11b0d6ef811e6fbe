//! The control-plane REST client (protocol doc §2): create, connect, get, list, kill and
//! set-timeout, with the API key, the retry policy of [`super::retry`] and the mapping of
//! HTTP errors to [`ProviderError`]s.
//!
//! Error mapping: 401/403 → [`ErrorKind::Auth`] ("authentication failed: …", naming the key
//! variable, never its value); 404 → [`ErrorKind::NotFound`] (kill → `false`); 400/409/422 →
//! [`ErrorKind::Invalid`]; 507 and 429 (after its retries) → [`ErrorKind::Capacity`]; other 5xx → [`ErrorKind::Infra`]; a transport timeout →
//! [`ErrorKind::Timeout`]. On create, 404 and template-related 400s name the template.
//! Server messages are scrubbed of the key in case a server echoes it.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderValue, AUTHORIZATION};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value as JsonValue};

use super::config::{AuthStyle, Config, CreateApi};
use super::connect::snippet;
use super::model::{ApiErrorJson, SandboxJson};
use super::retry::{self, Idempotency};
use crate::provider::{CreateRequest, ErrorKind, ProviderError, Result};

/// Timeout of one control-plane request (each attempt).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Timeout of a create (sandboxes may take a while to boot).
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
/// Sandbox lifetime assumed when create does not name one (the server default).
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Pages of `GET /v2/sandboxes` followed at most.
const MAX_PAGES: usize = 100;

/// A non-2xx answer, before the call site decides what it means.
#[derive(Debug)]
pub struct Failure {
    pub status: u16,
    pub message: String,
}

/// Either an HTTP error status or an already mapped transport error.
#[derive(Debug)]
pub enum CallError {
    Status(Failure),
    Other(ProviderError),
}

pub struct Api {
    pub http: reqwest::Client,
    pub cfg: Config,
}

impl Api {
    pub fn new(http: reqwest::Client, cfg: Config) -> Self {
        Self { http, cfg }
    }

    /// Removes the key from text that came from a server.
    pub fn scrub(&self, s: &str) -> String {
        match self.cfg.api_key() {
            Some(k) if k.len() >= 4 => s.replace(k, "***"),
            _ => s.to_string(),
        }
    }

    fn auth_failed(&self, status: u16, message: &str) -> ProviderError {
        let var = self.cfg.preset.key_var();
        let why = if status == 403 { "access denied" } else { "the API key was refused" };
        ProviderError::new(
            ErrorKind::Auth,
            format!("authentication failed: {why} by {} ({status}: {message}); check {var}", self.cfg.api_url),
        )
    }

    /// The general meaning of an error status; call sites handle their special cases first.
    pub fn status_error(&self, what: &str, f: &Failure) -> ProviderError {
        let detail = format!("{what}: {} ({})", f.message, f.status);
        match f.status {
            401 | 403 => self.auth_failed(f.status, &f.message),
            404 => ProviderError::not_found(detail),
            400 | 409 | 422 => ProviderError::invalid(detail),
            // serve's answer to a declared disk the host has no room for.
            507 => ProviderError::new(ErrorKind::Capacity, detail),
            // Refused for want of capacity (a concurrency or rate limit, the memory a host
            // has), once the retries a 429 allows are spent: the platform's answer, not its
            // failure.
            429 => ProviderError::new(
                ErrorKind::Capacity,
                format!("{what}: refused by the API for want of capacity or rate (429: {})", f.message),
            ),
            _ => ProviderError::infra(detail),
        }
    }

    fn transport_error(&self, what: &str, e: &reqwest::Error, timeout: Duration) -> ProviderError {
        if e.is_timeout() {
            ProviderError::new(
                ErrorKind::Timeout,
                format!("{what}: no answer from {} within {timeout:?}", self.cfg.api_url),
            )
        } else if e.is_connect() {
            ProviderError::infra(format!("{what}: cannot reach {}: {}", self.cfg.api_url, self.scrub(&error_chain(e))))
        } else {
            ProviderError::infra(format!(
                "{what}: request to {} failed: {}",
                self.cfg.api_url,
                self.scrub(&error_chain(e))
            ))
        }
    }

    /// One JSON call: returns the status and body of a 2xx answer.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&JsonValue>,
        idem: Idempotency,
        timeout: Duration,
        what: &str,
    ) -> Result<(StatusCode, Vec<u8>, reqwest::header::HeaderMap), CallError> {
        self.call_with(method, path, body, &[], idem, timeout, what).await
    }

    /// [`Api::call`] with extra request headers, the same on every attempt.
    #[allow(clippy::too_many_arguments)]
    pub async fn call_with(
        &self,
        method: Method,
        path: &str,
        body: Option<&JsonValue>,
        headers: &[(&'static str, String)],
        idem: Idempotency,
        timeout: Duration,
        what: &str,
    ) -> Result<(StatusCode, Vec<u8>, reqwest::header::HeaderMap), CallError> {
        let Some(key) = self.cfg.api_key() else {
            // Like the SDK: refuse before sending anything.
            return Err(CallError::Other(ProviderError::new(
                ErrorKind::Auth,
                format!("authentication failed: no API key configured; set {}", self.cfg.preset.key_var()),
            )));
        };
        let mut auth = match self.cfg.auth {
            AuthStyle::ApiKeyHeader => HeaderValue::from_str(key),
            AuthStyle::Bearer => HeaderValue::from_str(&format!("Bearer {key}")),
        }
        .map_err(|_| {
            CallError::Other(ProviderError::invalid("the API key contains characters not allowed in a header"))
        })?;
        auth.set_sensitive(true);
        let header = match self.cfg.auth {
            AuthStyle::ApiKeyHeader => reqwest::header::HeaderName::from_static("x-api-key"),
            AuthStyle::Bearer => AUTHORIZATION,
        };
        let url = format!("{}{path}", self.cfg.api_url);
        let build = || {
            let mut rb = self.http.request(method.clone(), &url).header(header.clone(), auth.clone()).timeout(timeout);
            for (k, v) in headers {
                rb = rb.header(*k, v.as_str());
            }
            if let Some(b) = body {
                rb = rb.json(b);
            }
            rb
        };
        let resp =
            retry::send(build, idem).await.map_err(|e| CallError::Other(self.transport_error(what, &e, timeout)))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.map_err(|e| CallError::Other(self.transport_error(what, &e, timeout)))?;
        if status.is_success() {
            return Ok((status, bytes.to_vec(), headers));
        }
        let parsed: Option<ApiErrorJson> = serde_json::from_slice(&bytes).ok();
        let message = parsed.and_then(|p| p.message).filter(|m| !m.is_empty()).unwrap_or_else(|| {
            let s = snippet(&bytes);
            if s.is_empty() {
                status.canonical_reason().unwrap_or("error").to_lowercase()
            } else {
                s
            }
        });
        Err(CallError::Status(Failure { status: status.as_u16(), message: self.scrub(&message) }))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, what: &str, body: &[u8]) -> Result<T> {
        serde_json::from_slice(body).map_err(|e| {
            ProviderError::infra(format!(
                "{what}: unexpected answer from the API ({e}): {}",
                self.scrub(&snippet(body))
            ))
        })
    }

    fn general(&self, what: &str, e: CallError) -> ProviderError {
        match e {
            CallError::Status(f) => self.status_error(what, &f),
            CallError::Other(e) => e,
        }
    }

    fn sandbox_call_error(&self, what: &str, id: &str, e: CallError) -> ProviderError {
        match e {
            CallError::Status(f) if f.status == 404 => {
                ProviderError::not_found(format!("sandbox {id} not found ({})", f.message))
            }
            e => self.general(what, e),
        }
    }

    /// `POST /sandboxes` (v1) or `POST /v2/sandboxes` (v2). Repeated only after a refusal
    /// (see `retry`). Every attempt of one create carries the same `Idempotency-Key`
    /// (protocol doc §2.1): a server that honours it can tell a repeat from a second create,
    /// and `serve` counts a repeat after a non-refusal as a double create.
    pub async fn create(&self, req: &CreateRequest) -> Result<SandboxJson> {
        let template = if req.template.is_empty() { "base" } else { req.template.as_str() };
        let mut body = json!({ "templateID": template, "metadata": req.metadata, "envVars": req.envs });
        if let Some(t) = req.timeout_secs {
            body["timeout"] = json!(t);
        }
        if let Some(c) = req.cpu {
            body["cpuCount"] = json!(c);
        }
        if let Some(m) = req.memory_mb {
            body["memoryMB"] = json!(m);
        }
        if let Some(n) = &req.network {
            // As the SDK sends them: the switch snake_case at the top, the lists in `network`.
            if let Some(on) = n.allow_internet_access {
                body["allow_internet_access"] = json!(on);
            }
            body["network"] = network_json(n);
        }
        if let Some(l) = &req.lifecycle {
            // As the SDK sends `lifecycle={"on_timeout": …, "auto_resume": …}`.
            body["autoPause"] = json!(l.pause_on_timeout);
            if l.pause_on_timeout {
                body["autoPauseMemory"] = json!(l.keep_memory);
            }
            body["autoResume"] = json!({ "enabled": l.auto_resume });
        }
        let path = match self.cfg.create_api {
            CreateApi::V1 => {
                // What the SDK ≤ 2.50 sends (and what FC's pinned SDK sends): ask for an envd
                // access token where the platform supports them.
                body["secure"] = json!(true);
                "/sandboxes"
            }
            CreateApi::V2 => "/v2/sandboxes",
        };
        let what = format!("create sandbox from template `{template}`");
        let key = [("idempotency-key", idempotency_key())];
        let (_, bytes, _) = self
            .call_with(Method::POST, path, Some(&body), &key, Idempotency::Refused, CREATE_TIMEOUT, &what)
            .await
            .map_err(|e| match e {
                CallError::Status(f) if f.status == 404 => {
                    ProviderError::not_found(format!("template `{template}` not found ({})", f.message))
                }
                CallError::Status(f) if f.status == 400 && f.message.to_lowercase().contains("template") => {
                    ProviderError::invalid(format!("template `{template}` rejected: {} (400)", f.message))
                }
                e => self.general(&what, e),
            })?;
        self.parse(&what, &bytes)
    }

    /// `POST [/v2]/sandboxes/{id}/connect`: attaches to (or resumes) a sandbox.
    pub async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxJson> {
        let (path, body) = match self.cfg.create_api {
            // v1 requires a timeout; the SDK sends 300 when none is given.
            CreateApi::V1 => (
                format!("/sandboxes/{}/connect", enc(id)),
                json!({ "timeout": timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS) }),
            ),
            CreateApi::V2 => (
                format!("/v2/sandboxes/{}/connect", enc(id)),
                timeout_secs.map_or_else(|| json!({}), |t| json!({ "timeout": t })),
            ),
        };
        let what = format!("connect to sandbox {id}");
        let (_, bytes, _) = self
            .call(Method::POST, &path, Some(&body), Idempotency::Idempotent, CREATE_TIMEOUT, &what)
            .await
            .map_err(|e| self.sandbox_call_error(&what, id, e))?;
        let sb: SandboxJson = self.parse(&what, &bytes)?;
        // A connect answers the sandbox it was asked for (the id may carry the legacy
        // `-<clientID>` suffix): another id is a platform bug that would send every later
        // call elsewhere (issue 40's `connect-paused-new-id`).
        let asked =
            id.strip_prefix(sb.sandbox_id.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('-'));
        if !asked {
            return Err(ProviderError::infra(format!(
                "{what}: the platform answered another sandbox, {}",
                sb.sandbox_id
            )));
        }
        Ok(sb)
    }

    /// `GET /sandboxes/{id}` → `SandboxDetail`.
    pub async fn get(&self, id: &str) -> Result<SandboxJson> {
        let what = format!("get sandbox {id}");
        let (_, bytes, _) =
            self.on_sandbox(Method::GET, id, &what).await.map_err(|e| self.sandbox_call_error(&what, id, e))?;
        self.parse(&what, &bytes)
    }

    /// `GET /v2/sandboxes?metadata=…`, following `X-Next-Token` to the last page.
    pub async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxJson>> {
        let what = "list sandboxes";
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..MAX_PAGES {
            let mut query = vec!["limit=100".to_string()];
            if !metadata.is_empty() {
                query.push(format!("metadata={}", enc(&metadata_filter(metadata))));
            }
            if let Some(t) = &next {
                query.push(format!("nextToken={}", enc(t)));
            }
            let path = format!("/v2/sandboxes?{}", query.join("&"));
            let (_, bytes, headers) = self
                .call(Method::GET, &path, None, Idempotency::Idempotent, REQUEST_TIMEOUT, what)
                .await
                .map_err(|e| self.general(what, e))?;
            let page: Vec<SandboxJson> = self.parse(what, &bytes)?;
            out.extend(page);
            next = headers
                .get("x-next-token")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .filter(|t| !t.is_empty() && Some(t) != next.as_ref());
            if next.is_none() {
                break;
            }
        }
        // A server that ignores the filter must not make us report others' sandboxes.
        out.retain(|s| metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v)));
        Ok(out)
    }

    /// `DELETE /sandboxes/{id}`: false if it did not exist.
    pub async fn kill(&self, id: &str) -> Result<bool> {
        let what = format!("kill sandbox {id}");
        match self.on_sandbox(Method::DELETE, id, &what).await {
            Ok(_) => Ok(true),
            Err(CallError::Status(f)) if f.status == 404 => Ok(false),
            Err(e) => Err(self.general(&what, e)),
        }
    }

    /// An idempotent call without a body on sandbox `id` itself (`/sandboxes/{id}`).
    async fn on_sandbox(
        &self,
        method: Method,
        id: &str,
        what: &str,
    ) -> Result<(StatusCode, Vec<u8>, reqwest::header::HeaderMap), CallError> {
        self.call(method, &format!("/sandboxes/{}", enc(id)), None, Idempotency::Idempotent, REQUEST_TIMEOUT, what)
            .await
    }

    /// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress lists.
    pub async fn update_network(&self, id: &str, n: &crate::provider::NetworkPolicy) -> Result<()> {
        let mut body = network_json(n);
        if let Some(on) = n.allow_internet_access {
            body["allow_internet_access"] = json!(on);
        }
        self.sandbox_update(Method::PUT, id, "network", &body, &format!("update the network of sandbox {id}")).await
    }

    /// `POST /sandboxes/{id}/timeout`.
    pub async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        let body = json!({ "timeout": timeout_secs });
        self.sandbox_update(Method::POST, id, "timeout", &body, &format!("set timeout of sandbox {id}")).await
    }

    /// An idempotent change to sandbox `id` (`/sandboxes/{id}/{route}`) whose answer is only
    /// success; errors name the sandbox.
    async fn sandbox_update(&self, method: Method, id: &str, route: &str, body: &JsonValue, what: &str) -> Result<()> {
        let path = format!("/sandboxes/{}/{route}", enc(id));
        self.call(method, &path, Some(body), Idempotency::Idempotent, REQUEST_TIMEOUT, what)
            .await
            .map_err(|e| self.sandbox_call_error(what, id, e))?;
        Ok(())
    }
    /// `POST /sandboxes/{id}/pause` with `{"memory": keep_memory}` (what the SDK sends):
    /// 204, or 409 when it is paused already (also a success: pausing is idempotent).
    pub async fn pause(&self, id: &str, keep_memory: bool) -> Result<()> {
        let what = format!("pause sandbox {id}");
        let body = json!({ "memory": keep_memory });
        let path = format!("/sandboxes/{}/pause", enc(id));
        match self.call(Method::POST, &path, Some(&body), Idempotency::Idempotent, CREATE_TIMEOUT, &what).await {
            Ok(_) => Ok(()),
            Err(CallError::Status(f)) if f.status == 409 => Ok(()),
            Err(e) => Err(self.sandbox_call_error(&what, id, e)),
        }
    }

    /// `POST /sandboxes/{id}/snapshots` with `{"name"}`: 201 `{"snapshotID","names"}`; the
    /// ID is what `create` takes. Not repeated after a failure that may have made one.
    pub async fn snapshot(&self, id: &str, name: &str) -> Result<String> {
        let what = format!("snapshot sandbox {id}");
        let body = if name.is_empty() { json!({}) } else { json!({ "name": name }) };
        let path = format!("/sandboxes/{}/snapshots", enc(id));
        let (_, bytes, _) = self
            .call(Method::POST, &path, Some(&body), Idempotency::Refused, CREATE_TIMEOUT, &what)
            .await
            .map_err(|e| self.sandbox_call_error(&what, id, e))?;
        let made: SnapshotJson = self.parse(&what, &bytes)?;
        if made.snapshot_id.is_empty() {
            return Err(ProviderError::infra(format!("{what}: the API returned no snapshotID")));
        }
        Ok(made.snapshot_id)
    }
}

#[derive(Debug, serde::Deserialize)]
struct SnapshotJson {
    #[serde(rename = "snapshotID", default)]
    snapshot_id: String,
}

/// A fresh `Idempotency-Key` (`[a-z0-9-]{1,255}`): unique per create, not secret.
pub fn idempotency_key() -> String {
    format!("sr-{}", crate::random::hex(16))
}

/// Percent-encodes everything but unreserved characters.
pub fn enc(s: &str) -> String {
    crate::net::url_encode(s)
}

/// The `metadata` filter value before it is encoded as a query value (§2.7): each key and
/// value percent-encoded, then each pair encoded again as `k=v`, joined with `&`. The
/// server unescapes the whole string, splits, and unescapes each part.
pub fn metadata_filter(metadata: &BTreeMap<String, String>) -> String {
    metadata.iter().map(|(k, v)| format!("{}={}", enc(&enc(k)), enc(&enc(v)))).collect::<Vec<_>>().join("&")
}

/// An error and its sources, for messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// The `network` object of a create or network update: `allowOut`, `denyOut` and, when
/// given, `dnsServers` and (a create's) `allowPublicTraffic`.
fn network_json(n: &crate::provider::NetworkPolicy) -> serde_json::Value {
    let mut v = json!({ "allowOut": n.allow_out, "denyOut": n.deny_out });
    if let Some(d) = &n.dns_servers {
        v["dnsServers"] = json!(d);
    }
    if let Some(public) = n.allow_public_traffic {
        v["allowPublicTraffic"] = json!(public);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::e2b::config::Preset;

    fn api(pairs: &[(&str, &str)]) -> Api {
        let env = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Api::new(crate::net::client_builder().build().unwrap(), Config::from_env(Preset::E2b, &env).unwrap())
    }

    #[test]
    fn metadata_filter_matches_the_sdk_capture() {
        let m: BTreeMap<String, String> =
            [("owner", "me"), ("k y", "v&1")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        // Verified capture: metadata=owner%3Dme%26k%252520y%3Dv%2525261 (keys in our order).
        assert_eq!(format!("metadata={}", enc(&metadata_filter(&m))), "metadata=k%252520y%3Dv%2525261%26owner%3Dme");
        // Server side: decode query (done by the HTTP layer), unescape once, split, unescape.
        let once = crate::net::url_decode(&metadata_filter(&m)).unwrap();
        let pairs: Vec<(String, String)> = once
            .split('&')
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap();
                (crate::net::url_decode(k).unwrap(), crate::net::url_decode(v).unwrap())
            })
            .collect();
        assert_eq!(pairs, vec![("k y".into(), "v&1".into()), ("owner".into(), "me".into())]);
    }

    #[test]
    fn error_mapping() {
        let a = api(&[("E2B_API_KEY", "e2b_secretsecret")]);
        let f = |status, message: &str| Failure { status, message: message.into() };
        let e = a.status_error("get sandbox x", &f(401, "Invalid API key"));
        assert_eq!(e.kind, ErrorKind::Auth);
        assert!(e.message.contains("authentication failed") && e.message.contains("E2B_API_KEY"), "{}", e.message);
        assert!(!e.message.contains("secretsecret"));
        assert_eq!(a.status_error("x", &f(403, "no")).kind, ErrorKind::Auth);
        assert_eq!(a.status_error("x", &f(404, "no")).kind, ErrorKind::NotFound);
        assert_eq!(a.status_error("x", &f(400, "bad")).kind, ErrorKind::Invalid);
        // A 429 left after its retries is the platform's refusal for want of capacity or rate.
        let e = a.status_error("x", &f(429, "slow down"));
        assert_eq!(e.kind, ErrorKind::Capacity);
        assert!(e.message.contains("429: slow down"), "{}", e.message);
        assert_eq!(a.status_error("x", &f(503, "busy")).kind, ErrorKind::Infra);
        // serve's refusal of a disk the host has no room for (issue 35 item 5).
        assert_eq!(a.status_error("x", &f(507, "not enough disk space")).kind, ErrorKind::Capacity);
        assert_eq!(a.scrub("echo e2b_secretsecret back"), "echo *** back");
    }

    #[test]
    fn idempotency_keys_are_unique_and_well_formed() {
        let (a, b) = (idempotency_key(), idempotency_key());
        assert_ne!(a, b);
        for k in [a, b] {
            assert!(
                k.len() <= 255 && k.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
                "{k}"
            );
        }
    }

    #[tokio::test]
    async fn no_key_fails_before_sending() {
        let a = api(&[("E2B_API_URL", "http://127.0.0.1:9")]);
        let Err(CallError::Other(e)) =
            a.call(Method::GET, "/x", None, Idempotency::Idempotent, REQUEST_TIMEOUT, "x").await
        else {
            panic!("expected an error")
        };
        assert_eq!(e.kind, ErrorKind::Auth);
        assert!(e.message.contains("authentication failed") && e.message.contains("E2B_API_KEY"));
    }
}

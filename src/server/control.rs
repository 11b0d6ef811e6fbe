//! The control plane (protocol doc §2, §9.2): sandboxes are created, listed, inspected,
//! connected to, given a new timeout and killed. Every route except `/health` needs the API
//! key; that is checked by `super::dispatch` before this router runs.
//!
//! E2B sandbox IDs are 20 characters of `[a-z0-9]` (host routing splits on `-` and `.`), so the
//! server gives each sandbox such an ID and maps it to the provider's own ID.

// Helpers return the early response as their error; it is built once per request.
#![allow(clippy::result_large_err)]

use super::body::JsonBody;
use super::mutants::Fault;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{json_error, rfc3339, rfc3339_us, AppState, ServedSandbox, CLIENT_ID, ENVD_VERSION};
use crate::provider::{CreateRequest, ErrorKind, NetworkPolicy, ProviderError, SandboxInfo, Usage};

/// Sandbox lifetime when create does not say (E2B's default).
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The longest lifetime accepted (Alibaba's cap; E2B Pro allows 24 h too).
const MAX_TIMEOUT_SECS: u64 = 86_400;
/// Page size of `GET /v2/sandboxes`, default and maximum.
const MAX_PAGE: usize = 100;

type SharedState = State<Arc<AppState>>;

/// The control plane's routes of sandboxes; `snapshots` and `templates` add theirs to
/// `others` first (see [`super::serve`]).
pub(crate) fn router(others: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    others
        .route("/health", get(|| async { StatusCode::NO_CONTENT }))
        .route("/sandboxes", post(create).get(list_legacy))
        .route("/v2/sandboxes", post(create).get(list_v2))
        .route("/sandboxes/{id}", get(detail).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/network", axum::routing::put(update_network))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume_legacy))
        .fallback(unimplemented_route)
        .method_not_allowed_fallback(unimplemented_route)
        .with_state(state)
}

/// E2B API routes serve does not implement, by method and path pattern (`*` is one
/// segment), with the feature each belongs to; the first match wins.
const UNIMPLEMENTED: &[(&str, &str, &str)] = &[
    ("POST", "/sandboxes/*/refreshes", "sandbox refreshes"),
    ("GET", "/sandboxes/*/logs", "sandbox logs"),
    ("GET", "/v2/sandboxes/*/logs", "sandbox logs"),
    ("GET", "/sandboxes/metrics", "metrics of several sandboxes"),
    ("*", "/volumes", "volumes"),
    ("*", "/volumes/*", "volumes"),
    ("*", "/volumes/*/*", "volumes"),
    ("*", "/secrets", "secrets"),
    ("*", "/secrets/*", "secrets"),
    ("*", "/templates/tags", "template tags"),
    ("POST", "/templates", "legacy (v1) template builds"),
    ("POST", "/templates/*", "legacy (v1) template builds"),
    ("POST", "/v2/templates", "legacy (v2) template builds"),
    ("POST", "/templates/*/builds/*", "legacy (v1) template builds"),
    ("PATCH", "/templates/*", "template updates"),
    ("PATCH", "/v2/templates/*", "template updates"),
    ("GET", "/templates/*/builds/*/logs", "template build logs"),
    ("GET", "/templates/*/tags", "template tags"),
    ("*", "/teams", "teams"),
    ("*", "/teams/*", "teams"),
    ("*", "/teams/*/*", "teams"),
    ("*", "/api-keys", "API key management"),
    ("*", "/api-keys/*", "API key management"),
    ("*", "/access-tokens", "access token management"),
    ("*", "/access-tokens/*", "access token management"),
    ("*", "/nodes", "cluster nodes"),
    ("*", "/nodes/*", "cluster nodes"),
];

/// The feature an E2B route belongs to, if serve leaves it unimplemented.
pub(crate) fn unimplemented_feature(method: &str, path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    UNIMPLEMENTED.iter().find_map(|(m, pattern, feature)| {
        let pat: Vec<&str> = pattern.split('/').collect();
        let same = pat.len() == segs.len() && pat.iter().zip(&segs).all(|(p, s)| *p == "*" || p == s);
        (same && (*m == "*" || *m == method)).then_some(*feature)
    })
}

/// What a route serve lacks answers: E2B's 501 for a feature a deployment does not offer,
/// naming the feature (the SDKs raise it with the message), or 404 for a path that is no
/// E2B route at all.
async fn unimplemented_route(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    match unimplemented_feature(method.as_str(), path) {
        Some(feature) => json_error(
            StatusCode::NOT_IMPLEMENTED,
            &format!("{feature}: not supported by scenario-run serve ({method} {path})"),
        ),
        None => json_error(StatusCode::NOT_FOUND, &format!("no such route: {method} {path}")),
    }
}

pub(crate) fn provider_error(e: ProviderError) -> Response {
    let status = match e.kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::Auth => StatusCode::UNAUTHORIZED,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Timeout | ErrorKind::Infra => StatusCode::INTERNAL_SERVER_ERROR,
        // A declared disk the host has no room for (the local provider's admission).
        ErrorKind::Capacity => StatusCode::INSUFFICIENT_STORAGE,
    };
    json_error(status, &e.message)
}

pub(crate) fn not_found(id: &str) -> Response {
    json_error(StatusCode::NOT_FOUND, &format!("sandbox \"{id}\" not found"))
}

/// What is wrong with an environment variable, if anything: a process cannot be given a
/// name that is empty or holds `=` or NUL, nor a value with NUL (`execve` takes C strings).
pub(crate) fn env_problem(name: &str, value: &str) -> Option<String> {
    if name.is_empty() {
        Some("environment variable names must not be empty".into())
    } else if name.contains('=') || name.contains('\0') {
        Some(format!("environment variable name {name:?} must not contain '=' or NUL"))
    } else if value.contains('\0') {
        Some(format!("environment variable {name} must not contain NUL"))
    } else {
        None
    }
}

/// What a create asks for: the body of `POST /sandboxes` (the API's `NewSandbox`); a fork
/// of a snapshot makes one too.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct NewSandbox {
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    pub timeout: Option<u64>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub env_vars: Option<BTreeMap<String, String>>,
    pub cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    pub memory_mb: Option<u64>,
    /// Alibaba's create takes it; E2B's sizes the disk by the team's tier.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: Option<u64>,
    pub auto_pause: Option<bool>,
    pub auto_pause_memory: Option<bool>,
    pub auto_resume: Option<AutoResume>,
    pub network: Option<Value>,
    /// The SDKs send this one snake_case.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Host directories to bind (OpenSandbox's volumes; E2B's create has none).
    #[serde(skip)]
    pub mounts: Vec<crate::provider::Mount>,
}

/// Create's or a network update's egress options as the provider takes them:
/// `allow_internet_access` (the SDKs send it snake_case, at the top level) and `allowOut` and
/// `denyOut` of `network` (or of the update's body). What serve cannot honour is refused
/// (501) naming it, never accepted and silently not done: transform `rules` (E2B rewrites
/// matching requests) and an `egressProxy` (E2B sends the sandbox's traffic through a proxy
/// of the caller's). Entries the provider cannot enforce, or that E2B refuses (a domain name
/// in `denyOut`), are refused by the provider.
pub(crate) fn network_policy(internet: Option<bool>, network: Option<&Value>) -> Result<NetworkPolicy, Response> {
    let mut policy = NetworkPolicy { allow_internet_access: internet, ..Default::default() };
    let Some(n) = network.filter(|n| !n.is_null()) else {
        return Ok(policy);
    };
    let Some(n) = n.as_object() else {
        return Err(json_error(StatusCode::BAD_REQUEST, "network must be an object"));
    };
    let field = |camel: &str, snake: &str| n.get(camel).or_else(|| n.get(snake)).filter(|v| !v.is_null());
    for (camel, snake, list) in
        [("allowOut", "allow_out", &mut policy.allow_out), ("denyOut", "deny_out", &mut policy.deny_out)]
    {
        if let Some(v) = field(camel, snake) {
            let entries = v.as_array().and_then(|a| a.iter().map(|e| e.as_str().map(str::to_string)).collect());
            let Some(entries) = entries else {
                return Err(json_error(StatusCode::BAD_REQUEST, &format!("network.{camel} must be a list of strings")));
            };
            *list = entries;
        }
    }
    if let Some(v) = field("dnsServers", "dns_servers") {
        let entries: Option<Vec<String>> =
            v.as_array().and_then(|a| a.iter().map(|e| e.as_str().map(str::to_string)).collect());
        match entries {
            Some(list) if list.iter().all(|e| e.trim().parse::<std::net::Ipv4Addr>().is_ok()) => {
                policy.dns_servers = Some(list)
            }
            _ => {
                return Err(json_error(StatusCode::BAD_REQUEST, "network.dnsServers must be a list of IPv4 addresses"))
            }
        }
    }
    if field("rules", "rules").is_some_and(|r| r.as_object().is_none_or(|o| !o.is_empty())) {
        return Err(json_error(
            StatusCode::NOT_IMPLEMENTED,
            "network transform rules (rewriting a sandbox's requests): not supported by scenario-run serve",
        ));
    }
    if field("egressProxy", "egress_proxy").is_some() {
        return Err(json_error(
            StatusCode::NOT_IMPLEMENTED,
            "an egress proxy of the caller's (network.egressProxy): not supported by scenario-run serve; sandboxes reach the internet through this host's own network",
        ));
    }
    Ok(policy)
}

/// Whether a sandbox under `p` reaches the internet at large (`SandboxDetail.allowInternetAccess`):
/// E2B's `allowInternetAccess: false` is `denyOut: ["0.0.0.0/0"]`, so either says no, unless
/// `allowOut` takes every address back.
fn internet_access(p: &NetworkPolicy) -> bool {
    let all = |e: &String| matches!(e.trim(), "0.0.0.0/0" | "0.0.0.0/0:");
    (p.allow_internet_access != Some(false) && !p.deny_out.iter().any(all)) || p.allow_out.iter().any(all)
}

/// `SandboxDetail.network`'s egress part: the lists the sandbox has now.
fn network_json(p: &NetworkPolicy) -> Value {
    let mut v = json!({});
    if !p.allow_out.is_empty() {
        v["allowOut"] = json!(p.allow_out);
    }
    if !p.deny_out.is_empty() {
        v["denyOut"] = json!(p.deny_out);
    }
    if let Some(d) = &p.dns_servers {
        v["dnsServers"] = json!(d);
    }
    v
}

/// Whether create asked for ports open without the traffic token (`allowPublicTraffic`,
/// E2B's default `true`), else serve's default (`--allow-public-traffic`).
fn public_ports(st: &AppState, network: Option<&Value>) -> Result<bool, Response> {
    match network.and_then(|n| n.get("allowPublicTraffic").or_else(|| n.get("allow_public_traffic"))) {
        None | Some(Value::Null) => Ok(st.public_traffic),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(json_error(StatusCode::BAD_REQUEST, "network.allowPublicTraffic must be true or false")),
    }
}

/// create's `network.maskRequestHost`: the `Host` a sandbox's servers are sent in place of
/// the port host (`${PORT}` becomes the port); an error for one that is no header value.
fn mask_host(network: Option<&Value>) -> Result<Option<String>, Response> {
    let Some(mask) = network.and_then(|n| n.get("maskRequestHost").or_else(|| n.get("mask_request_host"))) else {
        return Ok(None);
    };
    match mask {
        Value::Null => Ok(None),
        Value::String(m) if !m.is_empty() && axum::http::HeaderValue::from_str(&m.replace("${PORT}", "1")).is_ok() => {
            Ok(Some(m.clone()))
        }
        _ => Err(json_error(
            StatusCode::BAD_REQUEST,
            "network.maskRequestHost must be a host name, e.g. example.com:${PORT}",
        )),
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

/// What a sandbox does at its end time (E2B's `lifecycle`); serve keeps it and pauses the
/// sandbox at its end itself (the provider is told it never ends).
pub(crate) use crate::provider::Lifecycle;

/// What the provider is told an auto-pausing sandbox lives: serve pauses it at its end.
const NEVER_SECS: u64 = 10 * 365 * 86_400;

/// The `Sandbox` body of create and connect, with both tokens (see `auth`).
pub(crate) fn sandbox_json(st: &AppState, sb: &ServedSandbox) -> Value {
    json!({
        "sandboxID": sb.id,
        "templateID": sb.template,
        "alias": sb.alias,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.tokens.envd,
        // E2B names a traffic token only for a sandbox whose ports need it.
        "trafficAccessToken": if sb.public_ports { Value::Null } else { json!(sb.tokens.traffic) },
        "domain": st.domain,
    })
}

/// Where envd of every sandbox is, for a client that asks the control plane: `envdUrl`, the
/// origin the request came to (its scheme, see `super::SCHEME_HEADER`, and its `Host`). The product's client
/// (`agent-sandbox-client`) takes a sandbox's envd from `envdUrl` when the platform names one,
/// and otherwise derives `https://49983-{id}.{domain}`, which a plain-HTTP serve on one port
/// cannot answer; it sends `E2b-Sandbox-Id` on every envd call, so `super::dispatch` routes
/// those to the sandbox. The E2B SDKs ignore the field.
fn with_envd_url(mut v: Value, headers: &HeaderMap) -> Value {
    let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok());
    let https = headers.get(super::SCHEME_HEADER).is_some_and(|s| s.as_bytes() == b"https");
    if let Some(host) = host.filter(|h| !h.is_empty() && !h.contains(['/', '@', ' '])) {
        v["envdUrl"] = json!(format!("{}://{host}", if https { "https" } else { "http" }));
    }
    v
}

/// `SandboxDetail` (with the envd token, as E2B's) or `ListedSandbox` (without).
fn detail_json(st: &AppState, sb: &ServedSandbox, info: &SandboxInfo, with_token: bool) -> Value {
    let mut v = listed_json(st, sb, info);
    if with_token {
        v["envdAccessToken"] = json!(sb.tokens.envd);
    }
    v
}

fn listed_json(st: &AppState, sb: &ServedSandbox, info: &SandboxInfo) -> Value {
    let end_at = if sb.lifecycle.pause_on_timeout { *sb.end_ms.lock().expect("end") / 1000 } else { info.end_at };
    let lc = &sb.lifecycle;
    let mut v = json!({
        "sandboxID": sb.id,
        "templateID": sb.template,
        "alias": sb.alias,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339_us(sb.started_us),
        "endAt": rfc3339(end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": sb.cpu_count,
        "memoryMB": sb.memory_mb,
        "diskSizeMB": sb.disk_mb,
        "state": if sb.is_paused() { "paused" } else { "running" },
        "lifecycle": {"autoResume": lc.auto_resume, "onTimeout": if lc.pause_on_timeout { "pause" } else { "kill" }},
        "pauseMode": if lc.keep_memory { "full" } else { "filesystem" },
        "allowInternetAccess": internet_access(&sb.network.lock().expect("network")),
        "network": network_json(&sb.network.lock().expect("network")),
        "metadata": info.metadata,
        "domain": st.domain,
    });
    // Ingress: whether ports take requests without the traffic token, and the Host they see.
    if sb.public_ports || sb.mask_host.is_some() {
        v["network"]["allowPublicTraffic"] = json!(sb.public_ports);
        if let Some(m) = &sb.mask_host {
            v["network"]["maskRequestHost"] = json!(m);
        }
    }
    v
}

async fn create(State(st): SharedState, headers: HeaderMap, JsonBody(req, _): JsonBody<NewSandbox>) -> Response {
    match make_sandbox(&st, req).await {
        Ok(sb) => (StatusCode::CREATED, Json(with_envd_url(sandbox_json(&st, &sb), &headers))).into_response(),
        Err(resp) => resp,
    }
}

/// Makes a sandbox as create asks (also for forks); the error is the answer to give.
pub(crate) async fn make_sandbox(st: &Arc<AppState>, req: NewSandbox) -> Result<Arc<ServedSandbox>, Response> {
    let timeout = req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if timeout == 0 || timeout > MAX_TIMEOUT_SECS {
        return Err(json_error(
            StatusCode::BAD_REQUEST,
            &format!("timeout must be between 1 and {MAX_TIMEOUT_SECS} seconds, got {timeout}"),
        ));
    }
    if let Some(bad) = req.env_vars.iter().flatten().find_map(|(k, v)| env_problem(k, v)) {
        return Err(json_error(StatusCode::BAD_REQUEST, &bad));
    }
    if req.metadata.iter().flatten().any(|(k, v)| k.contains('\0') || v.contains('\0')) {
        return Err(json_error(StatusCode::BAD_REQUEST, "metadata keys and values must not contain NUL"));
    }
    let mut network = network_policy(req.allow_internet_access, req.network.as_ref())?;
    if st.mutants.has(Fault::DenyAllLeaks) && network.allow_internet_access == Some(false) {
        network = NetworkPolicy::default();
    }
    let asked = req.template_id.filter(|t| !t.is_empty()).unwrap_or_else(|| "base".into());
    // A template built here is known by its ID and its name.
    let template = st.snapshots.resolve(&asked).unwrap_or_else(|| st.templates.resolve(&asked));
    // A place under --max-sandboxes; forget expired sandboxes first, they hold places too.
    // Asked before any build, so a create past the limit is refused at once.
    st.prune().await;
    let Ok(slot) = st.slots.clone().try_acquire_owned() else {
        let refused = StatusCode::TOO_MANY_REQUESTS;
        return Err(json_error(
            if st.mutants.has(Fault::RateLimit500) { StatusCode::INTERNAL_SERVER_ERROR } else { refused },
            &format!(
                "you have reached the maximum number of concurrent sandboxes ({}); kill some, or raise serve --max-sandboxes",
                st.limits.max_sandboxes
            ),
        ));
    };
    // The official templates serve builds from their folder, on the first create of each.
    if let Err(e) = st.templates.ensure_official(&st.provider, &template).await {
        return Err(json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()));
    }
    // And the memory it declares, against the host's.
    let declared =
        req.memory_mb.or_else(|| st.templates.memory_of(&template)).unwrap_or(super::admission::DEFAULT_MEMORY_MB);
    let (total, available) = super::admission::host_memory_mb();
    let memory = match st.memory.admit(declared, total, available) {
        Ok(c) => c,
        Err(r) => {
            let refused = StatusCode::TOO_MANY_REQUESTS;
            let status = if st.mutants.has(Fault::RateLimit500) { StatusCode::INTERNAL_SERVER_ERROR } else { refused };
            let mut resp = json_error(status, &r.message);
            if !r.may_retry {
                resp.headers_mut().insert("should-retry", axum::http::HeaderValue::from_static("false"));
            }
            return Err(resp);
        }
    };
    let tokens = match super::auth::Tokens::new() {
        Ok(t) => t,
        Err(e) => {
            return Err(json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot make the sandbox's access tokens: {e}"),
            ))
        }
    };
    let id = super::new_sandbox_id();
    // envd's global environment: E2B_* first, the caller's envVars over them.
    let mut envs = BTreeMap::from([
        ("E2B_SANDBOX".to_string(), "true".to_string()),
        ("E2B_SANDBOX_ID".to_string(), id.clone()),
        ("E2B_TEMPLATE_ID".to_string(), template.clone()),
    ]);
    let env_vars = req.env_vars.unwrap_or_default();
    envs.extend(env_vars.clone());
    let lifecycle = Lifecycle {
        pause_on_timeout: req.auto_pause.unwrap_or(false),
        keep_memory: req.auto_pause_memory.unwrap_or(true),
        auto_resume: req.auto_resume.is_some_and(|a| a.enabled),
    };
    let public_ports = public_ports(st, req.network.as_ref())?;
    let mask_host = mask_host(req.network.as_ref())?;
    let info = match st
        .provider
        .create(CreateRequest {
            template: template.clone(),
            timeout_secs: Some(if lifecycle.pause_on_timeout { NEVER_SECS } else { timeout }),
            metadata: req.metadata.unwrap_or_default(),
            envs,
            cpu: req.cpu_count,
            memory_mb: req.memory_mb,
            disk_mb: req.disk_size_mb,
            network: Some(network.clone()),
            mounts: req.mounts,
            lifecycle: None,
        })
        .await
    {
        Ok(i) => i,
        // E2B's answer for a template it does not know.
        Err(e) if e.kind == ErrorKind::NotFound => {
            return Err(json_error(StatusCode::NOT_FOUND, &format!("template '{asked}' not found")))
        }
        Err(e) => return Err(provider_error(e)),
    };
    let host = super::host_resources();
    let sb = Arc::new(ServedSandbox {
        id: id.clone(),
        provider_id: info.id.clone(),
        template,
        alias: asked,
        started_us: super::now_us(),
        seq: super::next_seq(),
        cpu_count: req.cpu_count.unwrap_or(host.0),
        memory_mb: req.memory_mb.unwrap_or(host.1),
        disk_mb: host.2,
        procs: Default::default(),
        tokens,
        samples: Default::default(),
        timeout_secs: timeout,
        lifecycle,
        paused: Default::default(),
        end_ms: std::sync::Mutex::new(super::now_secs().saturating_add(timeout).saturating_mul(1000)),
        end_changed: Default::default(),
        ended: Default::default(),
        env_vars,
        mask_host,
        public_ports,
        watchers: Default::default(),
        network: std::sync::Mutex::new(network),
        _slot: slot,
        _memory: memory,
    });
    st.register(sb.clone());
    if lifecycle.pause_on_timeout {
        tokio::spawn(pause_at_end(st.clone(), Arc::downgrade(&sb)));
    }
    Ok(sb)
}

async fn detail(State(st): SharedState, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let Some((sb, info)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    Json(with_envd_url(detail_json(&st, &sb, &info, true), &headers)).into_response()
}

async fn kill(State(st): SharedState, Path(id): Path<String>) -> Response {
    let Some(sb) = st.sandbox(&id) else {
        return not_found(&id);
    };
    if st.mutants.has(Fault::KillKeepsSandbox) {
        return StatusCode::NO_CONTENT.into_response();
    }
    match st.end(&sb, KILL_ANSWER).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => not_found(&id),
        Err(e) => provider_error(e),
    }
}

/// How long a kill request waits for the sandbox's teardown before it answers.
const KILL_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// The body of set-timeout, connect and the legacy resume: a timeout in seconds.
#[derive(Debug, Deserialize)]
struct TimeoutBody {
    #[serde(default)]
    timeout: Option<u64>,
}

async fn set_timeout(
    State(st): SharedState,
    Path(id): Path<String>,
    JsonBody(req, _): JsonBody<TimeoutBody>,
) -> Response {
    let Some(t) = req.timeout else {
        return json_error(StatusCode::BAD_REQUEST, "timeout is required");
    };
    if t > MAX_TIMEOUT_SECS {
        return json_error(StatusCode::BAD_REQUEST, &format!("timeout must be at most {MAX_TIMEOUT_SECS} seconds"));
    }
    let Some((sb, _)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    if st.mutants.has(Fault::SetTimeoutIgnored) {
        return StatusCode::NO_CONTENT.into_response();
    }
    if sb.lifecycle.pause_on_timeout {
        set_end(&sb, t);
        return StatusCode::NO_CONTENT.into_response();
    }
    match st.provider.set_timeout(&sb.provider_id, t).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) if e.kind == ErrorKind::NotFound => not_found(&id),
        Err(e) => provider_error(e),
    }
}

#[derive(Debug, Deserialize)]
struct NetworkUpdate {
    #[serde(default)]
    allow_internet_access: Option<bool>,
    /// The lists (`allowOut`, `denyOut`, `dnsServers`), read by [`network_policy`].
    #[serde(flatten)]
    lists: serde_json::Map<String, Value>,
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress lists (fields left out are
/// cleared, as E2B's update does).
async fn update_network(
    State(st): SharedState,
    Path(id): Path<String>,
    JsonBody(req, _): JsonBody<NetworkUpdate>,
) -> Response {
    let policy = match network_policy(req.allow_internet_access, Some(&Value::Object(req.lists))) {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let Some((sb, _)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    let policy = if st.mutants.has(Fault::AllowMerged) {
        super::mutants::merged(&sb.network.lock().expect("network"), policy)
    } else {
        policy
    };
    match st.provider.sandbox(&sb.provider_id).update_network(policy.clone()).await {
        Ok(()) => {
            *sb.network.lock().expect("network") = policy;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) if e.kind == ErrorKind::NotFound => not_found(&id),
        Err(e) => provider_error(e),
    }
}

async fn connect(
    State(st): SharedState,
    Path(id): Path<String>,
    headers: HeaderMap,
    JsonBody(req, _): JsonBody<TimeoutBody>,
) -> Response {
    let Some((sb, info)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    // A paused sandbox is resumed (201, as E2B answers a resume).
    if sb.is_paused() {
        let t = req.timeout.filter(|t| *t > 0).unwrap_or(sb.timeout_secs).min(MAX_TIMEOUT_SECS);
        return match resume(&st, &sb, t).await {
            Ok(()) => {
                let mut body = sandbox_json(&st, &sb);
                if st.mutants.has(Fault::ConnectPausedNewId) {
                    body["sandboxID"] = json!(super::new_sandbox_id());
                }
                (StatusCode::CREATED, Json(with_envd_url(body, &headers))).into_response()
            }
            Err(e) => provider_error(e),
        };
    }
    // Connecting never shortens the sandbox's life, only extends it.
    if let Some(t) = req.timeout.filter(|t| *t > 0) {
        let t = t.min(MAX_TIMEOUT_SECS);
        if sb.lifecycle.pause_on_timeout {
            if (super::now_secs() + t) * 1000 > *sb.end_ms.lock().expect("end") {
                set_end(&sb, t);
            }
        } else if super::now_secs() + t > info.end_at {
            if let Err(e) = st.provider.set_timeout(&sb.provider_id, t).await {
                return provider_error(e);
            }
        }
    }
    match st.provider.connect(&sb.provider_id, None).await {
        Ok(_) => Json(with_envd_url(sandbox_json(&st, &sb), &headers)).into_response(),
        Err(e) if e.kind == ErrorKind::NotFound => {
            st.unregister(&id);
            not_found(&id)
        }
        Err(e) => provider_error(e),
    }
}

/// One metrics sample of a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    at_us: i64,
    usage: Usage,
    cpu_pct: f64,
}

/// Samples kept per sandbox (at most one a second is taken, when metrics are asked for).
const MAX_SAMPLES: usize = 1000;

/// `GET /sandboxes/{id}/metrics?start=&end=` (unix seconds): the sandbox's samples in that
/// window (default: since it started, until now). A sample is taken when asked for, at most
/// once a second: CPU use since the previous one (as a percentage of the sandbox's CPUs),
/// memory in use and its limit, the bytes its writable layer holds.
async fn metrics(State(st): SharedState, Path(id): Path<String>, RawQuery(q): RawQuery) -> Response {
    let mut window = [None, None];
    for (k, v) in query_pairs(q.as_deref()).unwrap_or_default() {
        let slot = match k.as_str() {
            "start" => 0,
            "end" => 1,
            _ => continue,
        };
        match v.parse::<i64>() {
            Ok(t) => window[slot] = Some(t),
            Err(_) => return json_error(StatusCode::BAD_REQUEST, &format!("{k} must be unix seconds, got {v:?}")),
        }
    }
    let Some((sb, _)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    let now = super::now_us();
    let fresh = sb.samples.lock().expect("samples").last().is_some_and(|s| now - s.at_us < 1_000_000);
    if !fresh {
        let usage = match st.provider.sandbox(&sb.provider_id).usage().await {
            Ok(u) => u,
            Err(e) => return provider_error(e),
        };
        let mut samples = sb.samples.lock().expect("samples");
        let (prev_cpu, prev_at) = samples.last().map(|s| (s.usage.cpu_usec, s.at_us)).unwrap_or((0, sb.started_us));
        let wall = (now - prev_at).max(1) as f64 * f64::from(sb.cpu_count.max(1));
        let cpu_pct = (usage.cpu_usec.saturating_sub(prev_cpu) as f64 / wall * 100.0).clamp(0.0, 100.0);
        samples.push(Sample { at_us: now, usage, cpu_pct });
        if samples.len() > MAX_SAMPLES {
            samples.remove(0);
        }
    }
    let start = window[0].unwrap_or(sb.started_us.div_euclid(1_000_000));
    let end = window[1].unwrap_or(i64::MAX);
    let mem_total = |u: &Usage| {
        let asked = sb.memory_mb.saturating_mul(1 << 20);
        if u.mem_limit_bytes > 0 && u.mem_limit_bytes < asked {
            u.mem_limit_bytes
        } else {
            asked
        }
    };
    let out: Vec<Value> = sb
        .samples
        .lock()
        .expect("samples")
        .iter()
        .filter(|s| (start..=end).contains(&s.at_us.div_euclid(1_000_000)))
        .map(|s| {
            json!({
                "timestamp": rfc3339_us(s.at_us),
                "timestampUnix": s.at_us.div_euclid(1_000_000),
                "cpuCount": sb.cpu_count,
                "cpuUsedPct": (s.cpu_pct * 100.0).round() / 100.0,
                "memUsed": s.usage.mem_bytes,
                "memTotal": mem_total(&s.usage),
                "memCache": 0,
                "diskUsed": s.usage.disk_bytes,
                "diskTotal": s.usage.disk_total_bytes,
            })
        })
        .collect();
    Json(Value::Array(out)).into_response()
}

/// Moves an auto-pausing sandbox's end time `timeout_secs` from now.
fn set_end(sb: &ServedSandbox, timeout_secs: u64) {
    *sb.end_ms.lock().expect("end") = super::now_secs().saturating_add(timeout_secs).saturating_mul(1000);
    sb.end_changed.notify_one();
}

/// Pauses a sandbox created with `onTimeout: pause` at its end time (which `set_timeout`
/// and connects move), and again after each resume; ends when the sandbox goes.
async fn pause_at_end(st: Arc<AppState>, sb: std::sync::Weak<ServedSandbox>) {
    loop {
        let Some(s) = sb.upgrade() else { return };
        if st.sandbox(&s.id).is_none() {
            return;
        }
        let end = *s.end_ms.lock().expect("end");
        let now = u64::try_from(super::now_us() / 1000).unwrap_or(0);
        if now >= end && !s.is_paused() {
            if let Err(e) = pause_sandbox(&st, &s, s.lifecycle.keep_memory).await {
                crate::errln!("serve: cannot auto-pause sandbox {}: {e}", s.id);
                return;
            }
            continue;
        }
        let wait = if s.is_paused() {
            std::time::Duration::from_secs(3600)
        } else {
            std::time::Duration::from_millis(end.saturating_sub(now))
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = s.end_changed.notified() => {}
        }
    }
}

/// Pauses the sandbox through the provider (frozen, or without `keep_memory` shut down to its
/// filesystem, to boot again on resume) and marks it paused.
pub(crate) async fn pause_sandbox(st: &AppState, sb: &ServedSandbox, keep_memory: bool) -> Result<(), ProviderError> {
    st.provider.sandbox(&sb.provider_id).pause(keep_memory).await?;
    sb.paused.store(true, std::sync::atomic::Ordering::SeqCst);
    sb.end_changed.notify_one();
    Ok(())
}

/// Resumes a paused sandbox for `timeout_secs`.
pub(crate) async fn resume(st: &AppState, sb: &ServedSandbox, timeout_secs: u64) -> Result<(), ProviderError> {
    let provider_timeout = if sb.lifecycle.pause_on_timeout { NEVER_SECS } else { timeout_secs };
    if st.mutants.resumed(&sb.id) > 1 && st.mutants.has(Fault::SecondResumeFails) {
        return Err(ProviderError::infra("resume failed (injected fault)"));
    }
    st.provider.sandbox(&sb.provider_id).resume(provider_timeout).await?;
    sb.paused.store(false, std::sync::atomic::Ordering::SeqCst);
    if st.mutants.has(Fault::ResumeLosesFiles) {
        super::mutants::lose_files(st, sb).await;
    }
    if sb.lifecycle.pause_on_timeout {
        set_end(sb, timeout_secs);
    }
    Ok(())
}

/// The body of pause: `memory: false` keeps only the filesystem (E2B's filesystem-only pause).
#[derive(Debug, Deserialize)]
struct PauseBody {
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, or 409 if it is already paused.
async fn pause(State(st): SharedState, Path(id): Path<String>, JsonBody(body, _): JsonBody<PauseBody>) -> Response {
    let keep_memory = body.memory.unwrap_or(true);
    let Some((sb, _)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    if sb.is_paused() {
        return json_error(StatusCode::CONFLICT, &format!("sandbox \"{id}\" is already paused"));
    }
    if st.mutants.has(Fault::PauseKeepsRunning) {
        return StatusCode::NO_CONTENT.into_response();
    }
    match pause_sandbox(&st, &sb, keep_memory).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => provider_error(e),
    }
}

/// The deprecated `POST /sandboxes/{id}/resume`: 201 with the sandbox, 409 if it runs.
async fn resume_legacy(
    State(st): SharedState,
    Path(id): Path<String>,
    JsonBody(req, _): JsonBody<TimeoutBody>,
) -> Response {
    let Some((sb, _)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    if !sb.is_paused() {
        return json_error(StatusCode::CONFLICT, &format!("sandbox \"{id}\" is already running"));
    }
    let t = req.timeout.filter(|t| *t > 0).unwrap_or(sb.timeout_secs).min(MAX_TIMEOUT_SECS);
    match resume(&st, &sb, t).await {
        Ok(()) => (StatusCode::CREATED, Json(sandbox_json(&st, &sb))).into_response(),
        Err(e) => provider_error(e),
    }
}

/// A query string or `metadata` filter that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueryError {
    /// A `%` not followed by two hex digits, in the text given.
    #[error("invalid escape in {0:?}")]
    InvalidEscape(String),
    /// Bytes that decode to no UTF-8, in the text given.
    #[error("invalid UTF-8 in {0:?}")]
    InvalidUtf8(String),
    /// A `metadata` pair that is not `key=value`.
    #[error("invalid metadata filter pair {0:?}: expected key=value")]
    MetadataPair(String),
}

/// The `metadata` list filter (protocol doc §2.7): the value (already query-decoded once) is
/// unescaped again, split on `&` and `=`, and each key and value unescaped once more.
pub(crate) fn parse_metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, QueryError> {
    let mut out = BTreeMap::new();
    let whole = query_unescape(raw)?;
    for pair in whole.split('&').filter(|p| !p.is_empty()) {
        let mut kv = pair.split('=');
        let (Some(k), Some(v), None) = (kv.next(), kv.next(), kv.next()) else {
            return Err(QueryError::MetadataPair(pair.to_string()));
        };
        out.insert(query_unescape(k)?, query_unescape(v)?);
    }
    Ok(out)
}

/// Go's `url.QueryUnescape`: `+` is a space, `%XX` a byte.
fn query_unescape(s: &str) -> Result<String, QueryError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let byte = hex
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| QueryError::InvalidEscape(s.to_string()))?;
                out.push(byte);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| QueryError::InvalidUtf8(s.to_string()))
}

/// The query string as pairs, each decoded once (what an HTTP framework hands a handler).
fn query_pairs(raw: Option<&str>) -> Result<Vec<(String, String)>, QueryError> {
    crate::net::query_split(raw).map(|(k, v)| Ok((query_unescape(k)?, query_unescape(v)?))).collect()
}

/// Live sandboxes matching the `metadata`, `state`, `template` and `startedAfter`
/// parameters, newest first unless `order=asc` (by start time, ties in creation order).
async fn matching(
    st: &AppState,
    params: &[(String, String)],
) -> Result<Vec<(Arc<ServedSandbox>, SandboxInfo)>, Response> {
    let mut filter = BTreeMap::new();
    let (mut running_wanted, mut paused_wanted) = (true, true);
    let mut asc = false;
    let mut template = None;
    let mut after = None;
    for (k, v) in params {
        match k.as_str() {
            "metadata" => filter
                .extend(parse_metadata_filter(v).map_err(|e| json_error(StatusCode::BAD_REQUEST, &e.to_string()))?),
            "state" => {
                running_wanted = v.split(',').any(|s| s.trim() == "running");
                paused_wanted = v.split(',').any(|s| s.trim() == "paused");
            }
            "order" => asc = v == "asc",
            "template" => template = Some(v.clone()),
            "startedAfter" => {
                let t: jiff::Timestamp = v.parse().map_err(|e| {
                    json_error(StatusCode::BAD_REQUEST, &format!("startedAfter must be an RFC 3339 time: {e}"))
                })?;
                after = Some(t.as_microsecond());
            }
            _ => {}
        }
    }
    let infos = st.provider.list(&filter).await.map_err(provider_error)?;
    let mut out: Vec<(Arc<ServedSandbox>, SandboxInfo)> =
        infos.into_iter().filter_map(|i| st.by_provider_id(&i.id).map(|sb| (sb, i))).collect();
    out.retain(|(sb, _)| if sb.is_paused() { paused_wanted } else { running_wanted });
    // E2B matches the template by ID or by name.
    out.retain(|(sb, _)| template.as_deref().is_none_or(|t| sb.template == t || sb.alias == t));
    out.retain(|(sb, _)| after.is_none_or(|a| sb.started_us >= a));
    if st.mutants.has(Fault::ListOmitsNewest) {
        let newest = st.all_sandboxes().iter().map(|s| s.seq).max();
        out.retain(|(sb, _)| Some(sb.seq) != newest);
    }
    out.sort_by_key(|(sb, _)| (sb.started_us, sb.seq));
    if !asc {
        out.reverse();
    }
    Ok(out)
}

async fn list_v2(State(st): SharedState, RawQuery(q): RawQuery) -> Response {
    let params = match query_pairs(q.as_deref()) {
        Ok(p) => p,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let all = match matching(&st, &params).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let param = |name: &str| params.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let limit = match param("limit").map(str::parse::<usize>) {
        None => MAX_PAGE,
        Some(Ok(n)) if n >= 1 => n.min(MAX_PAGE),
        Some(_) => return json_error(StatusCode::BAD_REQUEST, "limit must be a positive integer"),
    };
    // The token is the offset into the (stable-ordered) result set.
    let offset = match param("nextToken").filter(|t| !t.is_empty()).map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => return json_error(StatusCode::BAD_REQUEST, "invalid nextToken"),
    };
    let page: Vec<Value> = all.iter().skip(offset).take(limit).map(|(sb, i)| detail_json(&st, sb, i, false)).collect();
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&all.len().to_string()) {
        headers.insert("x-total-running", v);
    }
    if offset + limit < all.len() {
        if let Ok(v) = HeaderValue::from_str(&(offset + limit).to_string()) {
            headers.insert("x-next-token", v);
        }
    }
    (headers, Json(Value::Array(page))).into_response()
}

async fn list_legacy(State(st): SharedState, RawQuery(q): RawQuery) -> Response {
    let params = match query_pairs(q.as_deref()) {
        Ok(p) => p,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    match matching(&st, &params).await {
        Ok(all) => Json(all.iter().map(|(sb, i)| detail_json(&st, sb, i, false)).collect::<Vec<_>>()).into_response(),
        Err(resp) => resp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_filter_as_the_sdk_sends_it() {
        // The SDK's capture for {"owner":"me","k y":"v&1"} after the first (framework) decode.
        let once = query_unescape("owner%3Dme%26k%252520y%3Dv%2525261").unwrap();
        let f = parse_metadata_filter(&once).unwrap();
        assert_eq!(f.get("owner").map(String::as_str), Some("me"));
        assert_eq!(f.get("k y").map(String::as_str), Some("v&1"));
        assert!(parse_metadata_filter("a").is_err());
    }

    /// Issue 28 item 4: each refusal is a kind, and answers the text it did.
    #[test]
    fn query_errors_have_kinds() {
        assert_eq!(parse_metadata_filter("a"), Err(QueryError::MetadataPair("a".into())));
        assert_eq!(
            parse_metadata_filter("a=b%26c").unwrap_err().to_string(),
            "invalid metadata filter pair \"c\": expected key=value"
        );
        assert_eq!(query_unescape("%zz"), Err(QueryError::InvalidEscape("%zz".into())));
        assert_eq!(query_unescape("%2").unwrap_err().to_string(), "invalid escape in \"%2\"");
        assert_eq!(query_unescape("%ff"), Err(QueryError::InvalidUtf8("%ff".into())));
        assert_eq!(query_pairs(Some("a=1&b=%ff")), Err(QueryError::InvalidUtf8("%ff".into())));
        assert_eq!(
            query_pairs(Some("a=1&b+c=%20")).unwrap(),
            vec![("a".into(), "1".into()), ("b c".into(), " ".into())]
        );
    }
}

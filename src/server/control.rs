//! The control plane (protocol doc §2, §9.2): sandboxes are created, listed, inspected,
//! connected to, given a new timeout and killed. Every route except `/health` needs the API
//! key; that is checked by `super::dispatch` before this router runs.
//!
//! E2B sandbox IDs are 20 characters of `[a-z0-9]` (host routing splits on `-` and `.`), so the
//! server gives each sandbox such an ID and maps it to the provider's own ID.

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

use super::answer::json_error;
use super::sandboxes::{
    make_sandbox, network_policy, not_found, pause_sandbox, provider_error, resume, sandbox_json, set_end, NewSandbox,
    MAX_TIMEOUT_SECS,
};
use super::state::{
    new_sandbox_id, now_secs, now_us, rfc3339, rfc3339_us, AppState, Sample, ServedSandbox, CLIENT_ID, ENVD_VERSION,
    SCHEME_HEADER,
};
use crate::provider::{ErrorKind, NetworkPolicy, SandboxInfo, Usage};

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

/// Where envd of every sandbox is, for a client that asks the control plane: `envdUrl`, the
/// origin the request came to (its scheme, see `SCHEME_HEADER`, and its `Host`). The product's client
/// (`agent-sandbox-client`) takes a sandbox's envd from `envdUrl` when the platform names one,
/// and otherwise derives `https://49983-{id}.{domain}`, which a plain-HTTP serve on one port
/// cannot answer; it sends `E2b-Sandbox-Id` on every envd call, so `super::dispatch` routes
/// those to the sandbox. The E2B SDKs ignore the field.
fn with_envd_url(mut v: Value, headers: &HeaderMap) -> Value {
    let host = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok());
    let https = headers.get(SCHEME_HEADER).is_some_and(|s| s.as_bytes() == b"https");
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
                    body["sandboxID"] = json!(new_sandbox_id());
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
            if (now_secs() + t) * 1000 > *sb.end_ms.lock().expect("end") {
                set_end(&sb, t);
            }
        } else if now_secs() + t > info.end_at {
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
    let now = now_us();
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

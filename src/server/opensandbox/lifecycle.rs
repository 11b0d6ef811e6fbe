//! The lifecycle API (`specs/sandbox-lifecycle.yml`) under `/v1`: create (from an image, a
//! snapshot or one of serve's templates), get, list, delete, pause, resume,
//! renew-expiration, metadata patches, endpoints and snapshots.
//!
//! A create is answered once the sandbox runs, so its status is already `Running` (the
//! specification allows `Pending` first; the SDKs poll either way). A null or absent timeout
//! is OpenSandbox's manual cleanup: no `expiresAt`, and the sandbox lives until deleted. The
//! reference server takes timeouts of 60 s and more; so does serve, up to 24 h, and a renewal
//! may set any future expiry (the SDKs' `renew`).
//!
//! What serve does not have is refused by name, never accepted and ignored: volumes other
//! than those it offers, a credential proxy, lifecycle hooks, pools and Kubernetes templates
//! (501 `SANDBOX::API_NOT_SUPPORTED`), a GPU or another platform than the host's (400).

// Helpers return the early answer as their error.
#![allow(clippy::result_large_err)]

use crate::server::body::{JsonBody, OpenSandboxApi};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::common::{find, port_token, query_pairs, ACCESS_HEADER, EGRESS_PORT, EXECD_PORT};
use super::records::{OsSandbox, Policy, SnapshotRecord, Snapshots, Source};
use crate::server::answer::{error, from_e2b, not_found, provider_error};
use crate::server::state::{rfc3339, rfc3339_us, AppState, ServedSandbox};

type St = State<Arc<AppState>>;

/// The shortest timeout a create takes (the reference server's `ge=60`).
const MIN_TIMEOUT_SECS: i64 = 60;
/// The longest (serve's cap, as for E2B creates).
const MAX_TIMEOUT_SECS: i64 = 86_400;
/// What the provider is told a sandbox without automatic expiration lives.
pub(super) const NEVER_SECS: u64 = 10 * 365 * 86_400;
/// The entrypoint of a sandbox restored from a snapshot that names none.
const DEFAULT_ENTRYPOINT: [&str; 3] = ["tail", "-f", "/dev/null"];
/// Metadata keys under this prefix are the system's (the reference server refuses them).
const RESERVED_PREFIX: &str = "opensandbox.io/";
/// The extension that opts into renew-on-access (OSEP-0009), and its bounds.
const RENEW_KEY: &str = "access.renew.extend.seconds";

/// The lifecycle API's routes (`/v1/...`); the network policy's are `egress`'s.
pub(super) fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/sandboxes", post(create).get(list))
        .route("/v1/sandboxes/{id}", get(detail).delete(delete))
        .route("/v1/sandboxes/{id}/metadata", axum::routing::patch(patch_metadata))
        .route("/v1/sandboxes/{id}/pause", post(pause))
        .route("/v1/sandboxes/{id}/resume", post(resume))
        .route("/v1/sandboxes/{id}/renew-expiration", post(renew))
        .route("/v1/sandboxes/{id}/endpoints/{port}", get(endpoint))
        .route("/v1/sandboxes/{id}/snapshots", post(snapshot))
        // The SDKs report their own create latency here; serve keeps no telemetry.
        .route("/v1/metrics/events", post(|| async { StatusCode::NO_CONTENT }))
        .route("/v1/snapshots", get(list_snapshots))
        .route("/v1/snapshots/{id}", get(get_snapshot).delete(delete_snapshot))
        .fallback(unsupported)
}

/// Lifecycle routes of the reference server serve does not have, by path prefix.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("/v1/templates", "fsb templates (a Kubernetes feature)"),
    ("/v1/pools", "sandbox pools (a Kubernetes feature)"),
    ("/v1/devops", "devops diagnostics"),
];

async fn unsupported(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    if let Some((_, what)) = UNSUPPORTED.iter().find(|(p, _)| path == *p || path.starts_with(&format!("{p}/"))) {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "SANDBOX::API_NOT_SUPPORTED",
            format!("{what}: not supported by scenario-run serve ({method} {path})"),
        );
    }
    if path.contains("/diagnostics") {
        return error(
            StatusCode::NOT_IMPLEMENTED,
            "SANDBOX::API_NOT_SUPPORTED",
            format!("diagnostic logs and events: not supported by scenario-run serve ({method} {path})"),
        );
    }
    error(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no such route: {method} {path}"))
}

fn invalid(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER", message)
}

/// 409: the sandbox is not in the state the request needs.
fn conflict(code: &str, message: String) -> Response {
    error(StatusCode::CONFLICT, code, message)
}

fn not_supported(what: &str) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "SANDBOX::API_NOT_SUPPORTED",
        format!("{what}: not supported by scenario-run serve"),
    )
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ImageSpec {
    #[serde(default)]
    uri: String,
    #[serde(default)]
    auth: Option<ImageAuth>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct ImageAuth {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateRequest {
    #[serde(default)]
    image: Option<ImageSpec>,
    #[serde(default)]
    snapshot_id: Option<String>,
    #[serde(default)]
    template_id: Option<String>,
    #[serde(default)]
    platform: Option<Value>,
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    resource_limits: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env: Option<BTreeMap<String, Option<String>>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    network_policy: Option<Value>,
    #[serde(default)]
    credential_proxy: Option<Value>,
    #[serde(default)]
    secure_access: Option<bool>,
    #[serde(default)]
    volumes: Option<Vec<super::volumes::Volume>>,
    #[serde(default)]
    extensions: Option<BTreeMap<String, String>>,
    #[serde(default)]
    lifecycle: Option<Value>,
}

/// A Kubernetes label name (`[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63).
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS subdomain (label prefixes: lowercase labels separated by dots, at most 253).
fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// The reference server's metadata rules: Kubernetes label keys and values, no reserved keys.
fn check_metadata<'a>(pairs: impl Iterator<Item = (&'a String, Option<&'a String>)>) -> Result<(), Response> {
    let bad = |m: String| error(StatusCode::BAD_REQUEST, "SANDBOX::INVALID_METADATA_LABEL", m);
    for (k, v) in pairs {
        if k.starts_with(RESERVED_PREFIX) {
            return Err(bad(format!(
                "Metadata key '{k}' uses the reserved prefix '{RESERVED_PREFIX}'. Keys under this prefix are managed by the system and cannot be set via metadata."
            )));
        }
        let key_ok = match k.rsplit_once('/') {
            Some((prefix, name)) => dns_subdomain(prefix) && label_name(name),
            None => label_name(k),
        };
        if !key_ok {
            return Err(bad(format!(
                "Metadata key '{k}' is invalid: must be either a name or a DNS-subdomain prefix and name separated by /, where the name is up to 63 characters and matches [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
            )));
        }
        if let Some(v) = v {
            if !v.is_empty() && !label_name(v) {
                return Err(bad(format!(
                    "Metadata value '{v}' for key '{k}' is invalid: must be 63 characters or less and match [A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
                )));
            }
        }
    }
    Ok(())
}

/// CPUs from a Kubernetes quantity (`500m`, `1`, `2.5`): whole CPUs, rounded up, at least 1.
fn cpus(q: &str) -> Option<u32> {
    let q = q.trim();
    let cores = match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()? / 1000.0,
        None => q.parse::<f64>().ok()?,
    };
    (cores.is_finite() && cores > 0.0).then(|| (cores.ceil() as u32).max(1))
}

/// MiB from a Kubernetes quantity (`512Mi`, `2Gi`, `1G`, bytes), rounded up, at least 1.
fn mebibytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "k" | "K" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let bytes = n * mult;
    (bytes.is_finite() && bytes > 0.0).then(|| ((bytes / (1024.0 * 1024.0)).ceil() as u64).max(1))
}

/// The machine's architecture in OpenSandbox's words.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

async fn create(
    State(st): St,
    headers: HeaderMap,
    JsonBody(req, _): JsonBody<CreateRequest, OpenSandboxApi>,
) -> Response {
    match make(&st, req).await {
        Ok((sb, os, info)) => {
            let mut v = sandbox_json(&sb, &os, &info, false);
            if let Some(p) = &os.platform {
                v["platform"] = p.clone();
            }
            let mut r = (StatusCode::ACCEPTED, Json(v)).into_response();
            if let Some(host) = headers.get(axum::http::header::HOST).and_then(|h| h.to_str().ok()) {
                if let Ok(loc) = axum::http::HeaderValue::from_str(&format!("http://{host}/v1/sandboxes/{}", sb.id)) {
                    r.headers_mut().insert(axum::http::header::LOCATION, loc);
                }
            }
            r
        }
        Err(r) => r,
    }
}

/// Makes the sandbox a create asks for; the error is the answer.
async fn make(
    st: &Arc<AppState>,
    req: CreateRequest,
) -> Result<(Arc<ServedSandbox>, Arc<OsSandbox>, crate::provider::SandboxInfo), Response> {
    let extensions = req.extensions.unwrap_or_default();
    if extensions.contains_key("poolRef") {
        return Err(not_supported("creating from a pool (extensions.poolRef, a Kubernetes feature)"));
    }
    let sources = [req.image.is_some(), req.snapshot_id.is_some(), req.template_id.is_some()];
    if sources.iter().filter(|s| **s).count() != 1 {
        return Err(invalid("exactly one of image, snapshotId or templateId must be provided"));
    }
    let renew_on_access = match extensions.get(RENEW_KEY) {
        None => None,
        Some(v) => match v.trim().parse::<u64>() {
            Ok(s) if (300..=86_400).contains(&s) => Some(s),
            _ => {
                return Err(invalid(format!(
                    "extensions['{RENEW_KEY}'] must be a whole number of seconds from 300 to 86400, got {v:?}"
                )))
            }
        },
    };
    if let Some(t) = req.timeout {
        if t < MIN_TIMEOUT_SECS {
            return Err(invalid(format!("timeout must be at least {MIN_TIMEOUT_SECS} seconds, got {t}")));
        }
        if t > MAX_TIMEOUT_SECS {
            return Err(invalid(format!("Sandbox timeout {t}s exceeds configured maximum of {MAX_TIMEOUT_SECS}s.")));
        }
    }
    let mounts = super::volumes::mounts(&st.opensandbox.volumes, req.volumes.unwrap_or_default())?;
    if req.credential_proxy.as_ref().is_some_and(|c| c["enabled"].as_bool() == Some(true)) {
        return Err(not_supported("the credential vault proxy (credentialProxy)"));
    }
    if req.lifecycle.as_ref().is_some_and(|l| !l.is_null() && l.as_object().is_none_or(|o| !o.is_empty())) {
        return Err(not_supported("lifecycle hooks (lifecycle)"));
    }
    if let Some(p) = req.platform.as_ref().filter(|p| !p.is_null()) {
        let (os, arch) = (p["os"].as_str().unwrap_or(""), p["arch"].as_str().unwrap_or(""));
        if os != "linux" || arch != host_arch() {
            return Err(invalid(format!(
                "platform {os}/{arch} cannot be satisfied: this server runs linux/{} sandboxes",
                host_arch()
            )));
        }
    }
    let metadata = req.metadata.unwrap_or_default();
    check_metadata(metadata.iter().map(|(k, v)| (k, Some(v))))?;
    let limits = req.resource_limits.unwrap_or_default();
    let mut cpu = None;
    let mut memory_mb = None;
    let mut disk_mb = None;
    for (k, v) in &limits {
        match k.as_str() {
            "cpu" => {
                cpu = Some(cpus(v).ok_or_else(|| invalid(format!("resourceLimits.cpu: not a CPU quantity: {v:?}")))?)
            }
            "memory" => {
                memory_mb =
                    Some(mebibytes(v).ok_or_else(|| invalid(format!("resourceLimits.memory: not a quantity: {v:?}")))?)
            }
            // Kubernetes' name for a pod's disk (what OpenSandbox's Kubernetes runtime passes
            // on): the sandbox's disk, held against the host's free space as E2B's diskSizeMB.
            "ephemeral-storage" => {
                disk_mb = Some(
                    mebibytes(v)
                        .ok_or_else(|| invalid(format!("resourceLimits.ephemeral-storage: not a quantity: {v:?}")))?,
                )
            }
            "gpu" | "nvidia.com/gpu" if v.trim() != "0" => {
                return Err(invalid("resourceLimits.gpu: this server has no GPUs"));
            }
            _ => {}
        }
    }
    let mut envs: BTreeMap<String, String> =
        req.env.unwrap_or_default().into_iter().filter_map(|(k, v)| v.map(|v| (k, v))).collect();
    let policy = match req.network_policy.as_ref().filter(|p| !p.is_null()) {
        Some(p) => Policy::parse(p)?,
        None => Policy::default(),
    };
    let (allow_internet, mut network) = policy.to_e2b()?;
    if req.secure_access == Some(true) {
        network["allowPublicTraffic"] = json!(false);
    }
    // The startup source, as a template of serve's.
    let (template, source, image_entrypoint) = match (req.image, req.snapshot_id, req.template_id) {
        (Some(image), _, _) => {
            if image.uri.trim().is_empty() {
                return Err(invalid("image.uri is required"));
            }
            let resolved = st.opensandbox.images.resolve(st, &image.uri, image.auth.as_ref()).await?;
            for (k, v) in resolved.env {
                envs.entry(k.to_string()).or_insert_with(|| v.to_string());
            }
            (resolved.template, Source::Image(image.uri), resolved.entrypoint)
        }
        (_, Some(snap), _) => {
            let Some(t) = st.opensandbox.snapshots.template_of(&snap) else {
                return Err(error(StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND", format!("Snapshot {snap} not found.")));
            };
            (t, Source::Snapshot(snap), None)
        }
        (_, _, Some(t)) => (t.clone(), Source::Template(t), None),
        _ => unreachable!("one source was checked"),
    };
    let entrypoint = match (req.entrypoint.filter(|e| !e.is_empty()), &source) {
        (Some(e), _) => e,
        (None, Source::Image(_)) => return Err(invalid("entrypoint is required when image is provided")),
        (None, _) => DEFAULT_ENTRYPOINT.iter().map(|s| s.to_string()).collect(),
    };
    let manual = req.timeout.is_none();
    let new = crate::server::sandboxes::NewSandbox {
        template_id: Some(template),
        timeout: Some(req.timeout.map_or(MAX_TIMEOUT_SECS as u64, |t| t as u64)),
        metadata: Some(metadata.clone()),
        env_vars: Some(envs),
        cpu_count: cpu,
        memory_mb,
        disk_size_mb: disk_mb,
        network: Some(network),
        allow_internet_access: allow_internet,
        mounts,
        ..Default::default()
    };
    let sb = match crate::server::sandboxes::make_sandbox(st, new).await {
        Ok(sb) => sb,
        Err(r) => return Err(from_e2b(r).await),
    };
    if manual {
        if let Err(e) = st.provider.set_timeout(&sb.provider_id, NEVER_SECS).await {
            return Err(provider_error(e));
        }
    }
    let os = Arc::new(OsSandbox {
        id: sb.id.clone(),
        source,
        entrypoint,
        manual_cleanup: manual.into(),
        platform: req.platform.filter(|p| !p.is_null()),
        metadata: Mutex::new(metadata),
        note: Mutex::new(None),
        transition_us: sb.started_us.into(),
        renew_on_access,
        paused_expiry: Mutex::new(None),
        execd: Default::default(),
        code: Default::default(),
        egress: Mutex::new(policy),
    });
    st.opensandbox.insert(os.clone());
    // The entrypoint is the sandbox's main process, as root; the image's own (a template
    // whose start command plays it) is already running.
    if image_entrypoint.is_none_or(|e| os.entrypoint.len() != 1 || os.entrypoint[0] != e) {
        super::execd::start_entrypoint(st, &sb, &os).await;
    }
    let info = match st.provider.info(&sb.provider_id).await {
        Ok(i) => i,
        Err(e) => return Err(provider_error(e)),
    };
    Ok((sb, os, info))
}

/// The `Sandbox` body (with the startup source unless `brief`, as the create answer has
/// none).
fn sandbox_json(sb: &ServedSandbox, os: &OsSandbox, info: &crate::provider::SandboxInfo, full: bool) -> Value {
    let state = if sb.is_paused() { "Paused" } else { "Running" };
    let mut status = json!({
        "state": state,
        "reason": if sb.is_paused() { "SANDBOX_PAUSED" } else { "SANDBOX_RUNNING" },
        "lastTransitionAt": rfc3339_us(os.transition_us.load(Ordering::SeqCst)),
    });
    if let Some((reason, message)) = os.note.lock().expect("note").clone() {
        status["reason"] = json!(reason);
        status["message"] = json!(message);
    }
    let mut v = json!({
        "id": sb.id,
        "status": status,
        "metadata": *os.metadata.lock().expect("metadata"),
        "entrypoint": os.entrypoint,
        "createdAt": rfc3339_us(sb.started_us),
    });
    if !os.manual_cleanup.load(Ordering::SeqCst) {
        let end =
            if sb.is_paused() { os.paused_expiry.lock().expect("expiry").unwrap_or(info.end_at) } else { info.end_at };
        v["expiresAt"] = json!(rfc3339(end));
    }
    if full {
        match &os.source {
            Source::Image(uri) => v["image"] = json!({"uri": uri}),
            Source::Snapshot(s) => v["snapshotId"] = json!(s),
            Source::Template(t) => v["templateId"] = json!(t),
        }
        if let Some(p) = &os.platform {
            v["platform"] = p.clone();
        }
    }
    v
}

async fn detail(State(st): St, Path(id): Path<String>) -> Response {
    match find(&st, &id).await {
        Ok((sb, os, info)) => Json(sandbox_json(&sb, &os, &info, true)).into_response(),
        Err(r) => r,
    }
}

/// The `metadata` filter: `k=v&k2=v2` (already decoded once as a query value), each key and
/// value decoded once more (the reference server's `parse_qsl`).
fn metadata_filter(raw: &str) -> Result<BTreeMap<String, String>, Response> {
    let mut out = BTreeMap::new();
    for (k, v) in query_pairs(Some(raw)) {
        if k.is_empty() {
            return Err(invalid(format!("invalid metadata filter {raw:?}: expected key=value pairs")));
        }
        out.insert(k, v);
    }
    Ok(out)
}

/// `page` and `pageSize` (1-based; 20 a page unless asked, at most 200).
fn paging(params: &[(String, String)]) -> Result<(usize, usize), Response> {
    let get = |name: &str, default: usize, max: usize| -> Result<usize, Response> {
        match params.iter().find(|(k, _)| k == name) {
            None => Ok(default),
            Some((_, v)) => match v.parse::<usize>() {
                Ok(n) if n >= 1 && n <= max => Ok(n),
                _ => Err(invalid(format!("{name} must be an integer from 1 to {max}, got {v:?}"))),
            },
        }
    };
    Ok((get("page", 1, usize::MAX)?, get("pageSize", 20, 200)?))
}

/// One page of `items` and its pagination block.
fn page_of(items: Vec<Value>, page: usize, size: usize) -> Value {
    let total = items.len();
    let pages = total.div_ceil(size);
    let items: Vec<Value> = items.into_iter().skip((page - 1).saturating_mul(size)).take(size).collect();
    json!({
        "items": items,
        "pagination": {
            "page": page,
            "pageSize": size,
            "totalItems": total,
            "totalPages": pages,
            "hasNextPage": page < pages,
        },
    })
}

async fn list(State(st): St, RawQuery(q): RawQuery) -> Response {
    let params = query_pairs(q.as_deref());
    let (page, size) = match paging(&params) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let states: Vec<&str> = params.iter().filter(|(k, _)| k == "state").map(|(_, v)| v.as_str()).collect();
    let mut filter = BTreeMap::new();
    for (_, v) in params.iter().filter(|(k, _)| k == "metadata") {
        match metadata_filter(v) {
            Ok(f) => filter.extend(f),
            Err(r) => return r,
        }
    }
    st.prune().await;
    let mut found = Vec::new();
    for os in st.opensandbox.all() {
        let Some((sb, info)) = st.lookup(&os.id).await else {
            st.opensandbox.remove(&os.id);
            continue;
        };
        let state = if sb.is_paused() { "Paused" } else { "Running" };
        if !states.is_empty() && !states.iter().any(|s| s.eq_ignore_ascii_case(state)) {
            continue;
        }
        let meta = os.metadata.lock().expect("metadata").clone();
        if !filter.iter().all(|(k, v)| meta.get(k) == Some(v)) {
            continue;
        }
        found.push((sb.started_us, sb.seq, sandbox_json(&sb, &os, &info, true)));
    }
    // Newest first.
    found.sort_by_key(|f| std::cmp::Reverse((f.0, f.1)));
    Json(page_of(found.into_iter().map(|(_, _, v)| v).collect(), page, size)).into_response()
}

/// How long a delete waits for the teardown before it answers (as E2B's kill).
const DELETE_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

async fn delete(State(st): St, Path(id): Path<String>) -> Response {
    let (Some(os), Some(sb)) = (st.opensandbox.get(&id), st.sandbox(&id)) else {
        st.opensandbox.remove(&id);
        return not_found(&id);
    };
    if st.mutants.has(crate::server::mutants::Fault::KillKeepsSandbox) {
        return StatusCode::NO_CONTENT.into_response();
    }
    st.opensandbox.remove(&id);
    os.execd.end_all();
    match st.end(&sb, DELETE_ANSWER).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => not_found(&id),
        Err(e) => provider_error(e),
    }
}

async fn patch_metadata(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(patch, _): JsonBody<BTreeMap<String, Option<String>>, OpenSandboxApi>,
) -> Response {
    if let Err(r) = check_metadata(patch.iter().map(|(k, v)| (k, v.as_ref()))) {
        return r;
    }
    let (sb, os, info) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    {
        let mut meta = os.metadata.lock().expect("metadata");
        for (k, v) in patch {
            match v {
                Some(v) => meta.insert(k, v),
                None => meta.remove(&k),
            };
        }
    }
    Json(sandbox_json(&sb, &os, &info, true)).into_response()
}

async fn pause(State(st): St, Path(id): Path<String>) -> Response {
    let (sb, os, info) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if sb.is_paused() {
        return conflict("DOCKER::SANDBOX_NOT_RUNNING", format!("Sandbox {id} is not running (it is paused)."));
    }
    *os.paused_expiry.lock().expect("expiry") = Some(info.end_at);
    match crate::server::sandboxes::pause_sandbox(&st, &sb, true).await {
        Ok(()) => {
            os.touch();
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => {
            *os.paused_expiry.lock().expect("expiry") = None;
            provider_error(e)
        }
    }
}

async fn resume(State(st): St, Path(id): Path<String>) -> Response {
    let (sb, os, _) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if !sb.is_paused() {
        return conflict("DOCKER::SANDBOX_NOT_PAUSED", format!("Sandbox {id} is not paused."));
    }
    let secs = if os.manual_cleanup.load(Ordering::SeqCst) {
        NEVER_SECS
    } else {
        // The expiry it had when paused, a minute at least.
        let end = os.paused_expiry.lock().expect("expiry").unwrap_or(0);
        end.saturating_sub(crate::server::state::now_secs()).max(60)
    };
    match crate::server::sandboxes::resume(&st, &sb, secs).await {
        Ok(()) => {
            *os.paused_expiry.lock().expect("expiry") = None;
            os.touch();
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => provider_error(e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RenewRequest {
    #[serde(default)]
    expires_at: Option<String>,
}

/// Moves the expiry of `sb` to unix second `end` (kept for a paused sandbox, which does not
/// expire while paused).
async fn set_expiry(st: &AppState, sb: &ServedSandbox, os: &OsSandbox, end: u64) -> Result<(), Response> {
    if sb.is_paused() {
        *os.paused_expiry.lock().expect("expiry") = Some(end);
        return Ok(());
    }
    let secs = end.saturating_sub(crate::server::state::now_secs()).max(1);
    st.provider.set_timeout(&sb.provider_id, secs).await.map_err(provider_error)
}

async fn renew(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req, _): JsonBody<RenewRequest, OpenSandboxApi>,
) -> Response {
    let Some(raw) = req.expires_at else {
        return invalid("expiresAt is required");
    };
    let at: jiff::Timestamp = match raw.parse() {
        Ok(t) => t,
        Err(e) => {
            return error(StatusCode::BAD_REQUEST, "DOCKER::INVALID_EXPIRATION", format!("expiresAt {raw:?}: {e}"))
        }
    };
    let now = jiff::Timestamp::now();
    if at <= now {
        return error(
            StatusCode::BAD_REQUEST,
            "DOCKER::INVALID_EXPIRATION",
            format!("New expiration time {raw} must be in the future."),
        );
    }
    let (sb, os, _) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if os.manual_cleanup.load(Ordering::SeqCst) {
        return conflict(
            "DOCKER::INVALID_EXPIRATION",
            format!("Sandbox {id} does not have automatic expiration enabled."),
        );
    }
    // Whole seconds, rounded up: the sandbox lives at least until the time asked.
    let end = u64::try_from(at.as_second()).unwrap_or(0) + u64::from(at.subsec_nanosecond() > 0);
    if let Err(r) = set_expiry(&st, &sb, &os, end).await {
        return r;
    }
    Json(json!({"expiresAt": rfc3339(end)})).into_response()
}

/// Traffic through the proxy to a sandbox created with `access.renew.extend.seconds`: its
/// expiry moves `secs` from now when that is later than it is.
pub(super) async fn renew_on_access(st: &AppState, sb: &ServedSandbox, os: &OsSandbox, secs: u64) {
    if os.manual_cleanup.load(Ordering::SeqCst) {
        return;
    }
    let Ok(info) = st.provider.info(&sb.provider_id).await else { return };
    let want = crate::server::state::now_secs() + secs;
    if want > info.end_at {
        let _ = set_expiry(st, sb, os, want).await;
    }
}

#[derive(Debug, Deserialize)]
struct EndpointQuery {
    #[serde(default)]
    use_server_proxy: Option<String>,
    #[serde(default)]
    expires: Option<String>,
}

async fn endpoint(
    State(st): St,
    Path((id, port)): Path<(String, String)>,
    axum::extract::Query(q): axum::extract::Query<EndpointQuery>,
    headers: HeaderMap,
) -> Response {
    let port = match port.parse::<u16>() {
        Ok(p) if p >= 1 => p,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "DOCKER::INVALID_PORT",
                format!("Invalid port {port}: must be 1-65535."),
            )
        }
    };
    let proxy = q.use_server_proxy.as_deref().is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if q.expires.is_some() {
        if proxy {
            return invalid(
                "use_server_proxy cannot be combined with expires; signed endpoints require the gateway route.",
            );
        }
        return invalid(
            "signed endpoints (expires, OSEP-0011) need OpenSandbox's ingress gateway with secure access signing keys; scenario-run serve secures every endpoint with the header its answer names instead",
        );
    }
    let (sb, _, _) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && !h.contains(['/', '@', ' ']))
        .map(str::to_string)
        .unwrap_or_else(|| st.base_url.trim_start_matches("http://").to_string());
    let mut v = json!({"endpoint": format!("{host}/sandboxes/{id}/proxy/{port}")});
    let public = port != EXECD_PORT && port != EGRESS_PORT && sb.public_ports;
    v["headers"] = if public { json!({}) } else { json!({ ACCESS_HEADER: port_token(&sb, port) }) };
    Json(v).into_response()
}

impl Snapshots {
    fn template_of(&self, id: &str) -> Option<String> {
        self.by_id.lock().expect("snapshots").get(id).map(|s| s.template.clone())
    }

    pub(super) fn template_ids(&self) -> Vec<String> {
        self.by_id.lock().expect("snapshots").values().map(|s| s.template.clone()).collect()
    }
}

fn snapshot_json(s: &SnapshotRecord) -> Value {
    let mut v = json!({
        "id": s.id,
        "sandboxId": s.sandbox_id,
        "status": {"state": "Ready", "reason": "snapshot_ready", "lastTransitionAt": rfc3339_us(s.created_us)},
        "createdAt": rfc3339_us(s.created_us),
    });
    if let Some(n) = &s.name {
        v["name"] = json!(n);
    }
    v
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotRequest {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /v1/sandboxes/{id}/snapshots`: the filesystem, captured while the sandbox is frozen
/// (its processes are not); the answer comes once it is `Ready`.
async fn snapshot(
    State(st): St,
    Path(id): Path<String>,
    JsonBody(req, _): JsonBody<SnapshotRequest, OpenSandboxApi>,
) -> Response {
    if req.name.as_deref() == Some("") {
        return invalid("name must not be empty");
    }
    let (sb, _, _) = match find(&st, &id).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    if sb.is_paused() {
        return conflict(
            "SNAPSHOT::INVALID_SOURCE_STATE",
            format!("Sandbox {id} must be Running to be snapshotted (it is paused)."),
        );
    }
    let hex = crate::random::hex(10);
    let template_name = format!("osb-snapshot-{hex}");
    let template = match st.provider.sandbox(&sb.provider_id).snapshot(&template_name).await {
        Ok(t) => t,
        Err(e) => return provider_error(e),
    };
    let rec = SnapshotRecord {
        id: format!("snap-{hex}"),
        sandbox_id: id,
        name: req.name,
        template,
        created_us: crate::server::state::now_us(),
    };
    st.opensandbox.snapshots.by_id.lock().expect("snapshots").insert(rec.id.clone(), rec.clone());
    (StatusCode::ACCEPTED, Json(snapshot_json(&rec))).into_response()
}

async fn list_snapshots(State(st): St, RawQuery(q): RawQuery) -> Response {
    let params = query_pairs(q.as_deref());
    let (page, size) = match paging(&params) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let param = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let (sandbox, name) = (param("sandboxId"), param("name"));
    let states: Vec<&str> = params.iter().filter(|(k, _)| k == "state").map(|(_, v)| v.as_str()).collect();
    let mut all: Vec<SnapshotRecord> =
        st.opensandbox.snapshots.by_id.lock().expect("snapshots").values().cloned().collect();
    all.retain(|s| sandbox.as_ref().is_none_or(|id| &s.sandbox_id == id));
    all.retain(|s| name.as_ref().is_none_or(|n| s.name.as_ref() == Some(n)));
    all.retain(|_| states.is_empty() || states.iter().any(|s| s.eq_ignore_ascii_case("Ready")));
    all.sort_by_key(|s| std::cmp::Reverse(s.created_us));
    Json(page_of(all.iter().map(snapshot_json).collect(), page, size)).into_response()
}

fn snapshot_not_found(id: &str) -> Response {
    error(StatusCode::NOT_FOUND, "SNAPSHOT::NOT_FOUND", format!("Snapshot {id} not found."))
}

async fn get_snapshot(State(st): St, Path(id): Path<String>) -> Response {
    match st.opensandbox.snapshots.by_id.lock().expect("snapshots").get(&id) {
        Some(s) => Json(snapshot_json(s)).into_response(),
        None => snapshot_not_found(&id),
    }
}

async fn delete_snapshot(State(st): St, Path(id): Path<String>) -> Response {
    let Some(rec) = st.opensandbox.snapshots.by_id.lock().expect("snapshots").remove(&id) else {
        return snapshot_not_found(&id);
    };
    match st.provider.delete_snapshot(&rec.template).await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => provider_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_quantities() {
        assert_eq!(cpus("500m"), Some(1));
        assert_eq!(cpus("1"), Some(1));
        assert_eq!(cpus("2.5"), Some(3));
        assert_eq!(cpus("x"), None);
        assert_eq!(mebibytes("512Mi"), Some(512));
        assert_eq!(mebibytes("2Gi"), Some(2048));
        assert_eq!(mebibytes("64Mi"), Some(64));
        assert_eq!(mebibytes("1G"), Some(954));
        assert_eq!(mebibytes("1048576"), Some(1));
        assert_eq!(mebibytes("5Zi"), None);
    }

    #[test]
    fn metadata_follows_label_rules() {
        let ok = |k: &str, v: &str| check_metadata([(&k.to_string(), Some(&v.to_string()))].into_iter()).is_ok();
        assert!(ok("team", "t1"));
        assert!(ok("example.com/team", "a.b-c_d"));
        assert!(!ok("opensandbox.io/x", "y"));
        assert!(!ok("bad key", "v"));
        assert!(!ok("k", "has space"));
        assert!(ok("k", ""));
    }

    #[test]
    fn metadata_filters_decode_once_more() {
        // `?metadata=project%3DApollo%26note%3DDemo%2520Test`, decoded once by the framework.
        let f = metadata_filter("project=Apollo&note=Demo%20Test").unwrap();
        assert_eq!(f["project"], "Apollo");
        assert_eq!(f["note"], "Demo Test");
    }

    #[test]
    fn pages() {
        let items: Vec<Value> = (0..45).map(|i| json!(i)).collect();
        let p = page_of(items, 3, 20);
        assert_eq!(p["items"].as_array().unwrap().len(), 5);
        assert_eq!(p["pagination"]["totalPages"], 3);
        assert_eq!(p["pagination"]["hasNextPage"], false);
    }
}

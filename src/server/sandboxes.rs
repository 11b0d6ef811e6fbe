//! Serve's sandboxes as both protocols make and keep them, below their handlers (E2B's
//! `control` and `snapshots`, OpenSandbox's lifecycle, execd and egress, envd's processes):
//! what a create asks for ([`NewSandbox`]) and the checks of its environment and network,
//! making a sandbox ([`make_sandbox`]: limits, admission, tokens, the record), pausing and
//! resuming it and pausing it at its end, E2B's `Sandbox` body and E2B's answers for a
//! provider error or an unknown sandbox.

// Helpers return the early response as their error; it is built once per request.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer::json_error;
use super::mutants::Fault;
use super::state::{
    new_sandbox_id, next_seq, now_secs, now_us, AppState, ServedSandbox, Tokens, CLIENT_ID, ENVD_VERSION,
};
use crate::provider::{CreateRequest, ErrorKind, NetworkPolicy, ProviderError};

/// Sandbox lifetime when create does not say (E2B's default).
const DEFAULT_TIMEOUT_SECS: u64 = 300;

/// The longest lifetime accepted (Alibaba's cap; E2B Pro allows 24 h too).
pub(super) const MAX_TIMEOUT_SECS: u64 = 86_400;

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
    let tokens = match Tokens::new() {
        Ok(t) => t,
        Err(e) => {
            return Err(json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("cannot make the sandbox's access tokens: {e}"),
            ))
        }
    };
    let id = new_sandbox_id();
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
    let host = host_resources();
    let sb = Arc::new(ServedSandbox {
        id: id.clone(),
        provider_id: info.id.clone(),
        template,
        alias: asked,
        started_us: now_us(),
        seq: next_seq(),
        cpu_count: req.cpu_count.unwrap_or(host.0),
        memory_mb: req.memory_mb.unwrap_or(host.1),
        disk_mb: host.2,
        procs: Default::default(),
        tokens,
        samples: Default::default(),
        timeout_secs: timeout,
        lifecycle,
        paused: Default::default(),
        end_ms: std::sync::Mutex::new(now_secs().saturating_add(timeout).saturating_mul(1000)),
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

/// Moves an auto-pausing sandbox's end time `timeout_secs` from now.
pub(super) fn set_end(sb: &ServedSandbox, timeout_secs: u64) {
    *sb.end_ms.lock().expect("end") = now_secs().saturating_add(timeout_secs).saturating_mul(1000);
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
        let now = u64::try_from(now_us() / 1000).unwrap_or(0);
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
        lose_files(st, sb).await;
    }
    if sb.lifecycle.pause_on_timeout {
        set_end(sb, timeout_secs);
    }
    Ok(())
}

/// What the host offers, reported as a sandbox's resources when create names none: CPUs,
/// memory in MiB, root filesystem size in MiB (the local provider does not limit them).
fn host_resources() -> (u32, u64, u64) {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let si = rustix::system::sysinfo();
    let mem = si.totalram as u64 * si.mem_unit as u64 / (1024 * 1024);
    let disk = rustix::fs::statvfs(c"/").map_or(0, |sv| sv.f_blocks * sv.f_frsize / (1024 * 1024));
    (cpus, mem, disk)
}

/// `resume-loses-files`: what was written under /home/user since the sandbox was made, gone.
pub(crate) async fn lose_files(st: &AppState, sb: &ServedSandbox) {
    let since = sb.started_us.div_euclid(1_000_000);
    let req = crate::provider::ExecRequest {
        cmd: format!("find /home/user -xdev -type f -newermt @{since} -delete"),
        user: Some("root".into()),
        timeout: Some(std::time::Duration::from_secs(30)),
        max_output: Some(4096),
        ..Default::default()
    };
    let _ = st.provider.sandbox(&sb.provider_id).exec(req, None).await;
}

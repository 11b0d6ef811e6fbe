//! OpenSandbox's egress policy (create's `networkPolicy`, the egress sidecar's `/policy` on
//! port 18080, and the lifecycle's `/v1/sandboxes/{id}/networkpolicy`), enforced by the
//! local sandbox's network the E2B way (`NetworkPolicy`: `allow_out`, `deny_out`).
//!
//! OpenSandbox rules are matched first to last, then `defaultAction` decides (`deny` when a
//! policy names none; an empty or null policy allows everything). Translated:
//!
//! * `defaultAction: deny` is `deny_out: ["0.0.0.0/0"]`, and every `allow` rule an
//!   `allow_out` entry (a name, `*.name`, an address or a range), so a sandbox reaches only
//!   those (names by the HTTP `Host` or TLS server name, as the local network matches them);
//!   `deny` rules are what the default does anyway.
//! * `defaultAction: allow` makes `deny` rules for addresses and ranges `deny_out` entries.
//!   A `deny` rule for a name with everything else allowed is refused (501): the local
//!   network, like E2B's, denies by address only.
//! * Order: a rule for the same target as an earlier one is shadowed by it (first match
//!   wins, as in OpenSandbox). A `deny` rule that could contain a later `allow` rule's target
//!   without naming it (`*.example.com` before `api.example.com`, a range before an address
//!   in it) is refused (501), since E2B's semantics, where an allowed entry wins, would
//!   decide it the other way.

// Helpers return the early answer as their error.
#![allow(clippy::result_large_err)]

use std::net::Ipv4Addr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::common::find;
use super::records::{OsSandbox, Policy, Rule};
use crate::server::answer::{error, provider_error};
use crate::server::state::{AppState, ServedSandbox};

fn bad(m: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "SANDBOX::INVALID_PARAMETER", m)
}

fn refuse(m: impl Into<String>) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "SANDBOX::API_NOT_SUPPORTED",
        format!("{}: not supported by scenario-run serve", m.into()),
    )
}

/// What a target is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Target {
    Name,
    Wildcard,
    Any,
    Range(u32, u32),
}

fn classify(t: &str) -> Option<Target> {
    if t == "*" {
        return Some(Target::Any);
    }
    if let Some((ip, bits)) = t.split_once('/') {
        let ip: Ipv4Addr = ip.parse().ok()?;
        let bits: u32 = bits.parse().ok().filter(|b| *b <= 32)?;
        let mask = if bits == 0 { 0 } else { u32::MAX << (32 - bits) };
        let start = u32::from(ip) & mask;
        return Some(Target::Range(start, start | !mask));
    }
    if let Ok(ip) = t.parse::<Ipv4Addr>() {
        let n = u32::from(ip);
        return Some(Target::Range(n, n));
    }
    let (wild, name) = match t.strip_prefix("*.") {
        Some(n) => (true, n),
        None => (false, t),
    };
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    ok.then_some(if wild { Target::Wildcard } else { Target::Name })
}

/// Whether a deny of `deny` could match a connection an allow of `allow` names.
fn may_contain(deny: &str, allow: &str) -> bool {
    match (classify(deny), classify(allow)) {
        (Some(Target::Any), _) => true,
        (Some(Target::Wildcard), Some(Target::Name | Target::Wildcard)) => {
            let suffix = &deny[1..];
            allow.to_ascii_lowercase().ends_with(&suffix.to_ascii_lowercase())
        }
        (Some(Target::Range(a, b)), Some(Target::Range(c, d))) => a <= c && d <= b,
        _ => false,
    }
}

impl Policy {
    /// From OpenSandbox's JSON (`{"defaultAction", "egress": [{"action", "target"}]}`).
    pub(crate) fn parse(v: &Value) -> Result<Self, Response> {
        let Some(o) = v.as_object() else {
            return Err(bad("networkPolicy must be an object"));
        };
        if o.is_empty() {
            return Ok(Self::default());
        }
        let deny_by_default = match o.get("defaultAction").filter(|v| !v.is_null()) {
            None => true,
            Some(Value::String(a)) if a == "deny" => true,
            Some(Value::String(a)) if a == "allow" => false,
            Some(other) => return Err(bad(format!("networkPolicy.defaultAction must be allow or deny, got {other}"))),
        };
        let rules = match o.get("egress").filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::Array(a)) => a.iter().map(rule).collect::<Result<_, _>>()?,
            Some(_) => return Err(bad("networkPolicy.egress must be a list of rules")),
        };
        Ok(Self { deny_by_default, rules })
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "defaultAction": if self.deny_by_default { "deny" } else { "allow" },
            "egress": self.rules.iter().map(|r| json!({
                "action": if r.allow { "allow" } else { "deny" },
                "target": r.target,
            })).collect::<Vec<_>>(),
        })
    }

    /// E2B's `allow_internet_access` and `network` (with `allowOut`/`denyOut`) for this
    /// policy; see the module documentation.
    pub(crate) fn to_e2b(&self) -> Result<(Option<bool>, Value), Response> {
        let mut allow_out = Vec::new();
        let mut deny_out = Vec::new();
        for (i, r) in self.rules.iter().enumerate() {
            let earlier = &self.rules[..i];
            if earlier.iter().any(|e| e.target.eq_ignore_ascii_case(&r.target)) {
                continue;
            }
            if r.allow {
                if let Some(d) = earlier.iter().find(|e| !e.allow && may_contain(&e.target, &r.target)) {
                    return Err(refuse(format!(
                        "an egress rule denying {} ahead of one allowing {} (OpenSandbox's first match; the local network lets an allowed entry win)",
                        d.target, r.target
                    )));
                }
                if self.deny_by_default {
                    allow_out.push(r.target.clone());
                }
            } else if !self.deny_by_default {
                match classify(&r.target) {
                    Some(Target::Range(..)) => deny_out.push(r.target.clone()),
                    Some(Target::Any) => deny_out.push("0.0.0.0/0".to_string()),
                    _ => {
                        return Err(refuse(format!(
                            "denying the domain {} while allowing everything else (the local network denies addresses and ranges, as E2B's)",
                            r.target
                        )))
                    }
                }
            }
        }
        if self.deny_by_default {
            deny_out = vec!["0.0.0.0/0".to_string()];
        }
        let mut network = json!({});
        if !allow_out.is_empty() {
            network["allowOut"] = json!(allow_out);
        }
        if !deny_out.is_empty() {
            network["denyOut"] = json!(deny_out);
        }
        Ok((None, network))
    }

    /// The sidecar's PATCH: incoming rules first (the first of a target wins), then the
    /// existing rules for other targets.
    fn patched(&self, incoming: Vec<Rule>) -> Self {
        let mut rules: Vec<Rule> = Vec::new();
        for r in incoming.into_iter().chain(self.rules.iter().cloned()) {
            if !rules.iter().any(|e| e.target.eq_ignore_ascii_case(&r.target)) {
                rules.push(r);
            }
        }
        Self { deny_by_default: self.deny_by_default, rules }
    }

    fn without(&self, targets: &[String]) -> Self {
        let rules =
            self.rules.iter().filter(|r| !targets.iter().any(|t| t.eq_ignore_ascii_case(&r.target))).cloned().collect();
        Self { deny_by_default: self.deny_by_default, rules }
    }

    /// The sidecar's status answer.
    fn status(&self) -> Value {
        json!({
            "status": "ok",
            "mode": match (self.deny_by_default, self.rules.is_empty()) {
                (false, true) => "allow_all",
                (true, true) => "deny_all",
                _ => "enforcing",
            },
            "enforcementMode": "dns",
            "policy": self.to_json(),
        })
    }
}

fn rule(v: &Value) -> Result<Rule, Response> {
    let action = v["action"].as_str().unwrap_or("");
    let target = v["target"].as_str().unwrap_or("").trim().to_string();
    let allow = match action {
        "allow" => true,
        "deny" => false,
        _ => return Err(bad(format!("egress rule action must be allow or deny, got {:?}", v["action"]))),
    };
    if classify(&target).is_none() {
        return Err(bad(format!(
            "egress rule target {target:?} must be a domain name, *.domain, an IPv4 address or an IPv4 range"
        )));
    }
    Ok(Rule { allow, target })
}

fn rules_body(body: &Bytes) -> Result<Vec<Rule>, Response> {
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("invalid body: {e}")))?;
    match v {
        Value::Array(a) if !a.is_empty() => a.iter().map(rule).collect(),
        _ => Err(bad("the body must be a non-empty list of rules")),
    }
}

fn targets_body(body: &Bytes) -> Result<Vec<String>, Response> {
    let v: Value = serde_json::from_slice(body).map_err(|e| bad(format!("invalid body: {e}")))?;
    match v {
        Value::Array(a) if !a.is_empty() => {
            a.iter().map(|t| t.as_str().map(str::to_string).ok_or_else(|| bad("targets must be strings"))).collect()
        }
        _ => Err(bad("the body must be a non-empty list of targets")),
    }
}

/// Enforces `policy` on the running sandbox and keeps it; the answer is the policy as `view`
/// shows it.
async fn apply(
    st: &AppState,
    sb: &ServedSandbox,
    os: &OsSandbox,
    policy: Policy,
    view: fn(&Policy) -> Value,
) -> Answer {
    let (internet, network) = policy.to_e2b()?;
    let p = crate::server::sandboxes::network_policy(internet, Some(&network)).map_err(|_| bad("invalid policy"))?;
    st.provider.sandbox(&sb.provider_id).update_network(p.clone()).await.map_err(provider_error)?;
    *sb.network.lock().expect("network") = p;
    let answer = Json(view(&policy)).into_response();
    *os.egress.lock().expect("egress") = policy;
    Ok(answer)
}

/// The lifecycle API's network-policy route (`/v1/sandboxes/{id}/networkpolicy`).
pub(super) fn control_routes() -> Router<Arc<AppState>> {
    Router::new().route(
        "/v1/sandboxes/{id}/networkpolicy",
        get(control_get).patch(control_patch).put(control_put).delete(control_delete),
    )
}

pub(super) fn router(st: Arc<AppState>) -> Router {
    Router::new()
        .route("/policy", get(sidecar_get).patch(sidecar_patch).delete(sidecar_delete))
        .fallback(|m: axum::http::Method, u: axum::http::Uri| async move {
            if u.path().starts_with("/credential-vault") {
                return refuse(format!("the credential vault ({m} {})", u.path()));
            }
            error(StatusCode::NOT_FOUND, "NOT_FOUND", format!("no such route of the egress sidecar: {m} {}", u.path()))
        })
        .with_state(st)
}

type St = State<Arc<AppState>>;
type Sb = Extension<Arc<ServedSandbox>>;
type Os = Extension<Arc<OsSandbox>>;
/// A handler's answer; its error is the early answer (a refusal, a missing sandbox).
type Answer = Result<Response, Response>;

async fn sidecar_get(Extension(os): Os) -> Response {
    Json(os.egress.lock().expect("egress").status()).into_response()
}

async fn sidecar_patch(State(st): St, Extension(sb): Sb, Extension(os): Os, body: Bytes) -> Answer {
    let incoming = rules_body(&body)?;
    let next = os.egress.lock().expect("egress").patched(incoming);
    apply(&st, &sb, &os, next, Policy::status).await
}

async fn sidecar_delete(State(st): St, Extension(sb): Sb, Extension(os): Os, body: Bytes) -> Answer {
    let targets = targets_body(&body)?;
    let next = os.egress.lock().expect("egress").without(&targets);
    apply(&st, &sb, &os, next, Policy::status).await
}

/// The lifecycle's `networkpolicy` routes: the same policy, reached with the API key.
pub(super) async fn control_get(State(st): St, Path(id): Path<String>) -> Response {
    match find(&st, &id).await {
        Ok((_, os, _)) => Json(os.egress.lock().expect("egress").to_json()).into_response(),
        Err(r) => r,
    }
}

pub(super) async fn control_patch(State(st): St, Path(id): Path<String>, body: Bytes) -> Answer {
    let incoming = rules_body(&body)?;
    let (sb, os, _) = find(&st, &id).await?;
    let next = os.egress.lock().expect("egress").patched(incoming);
    apply(&st, &sb, &os, next, Policy::to_json).await
}

pub(super) async fn control_put(State(st): St, Path(id): Path<String>, body: Bytes) -> Answer {
    let v: Value = serde_json::from_slice(&body).map_err(|e| bad(format!("invalid body: {e}")))?;
    let next = Policy::parse(&v)?;
    let (sb, os, _) = find(&st, &id).await?;
    apply(&st, &sb, &os, next, Policy::to_json).await
}

pub(super) async fn control_delete(State(st): St, Path(id): Path<String>, body: Bytes) -> Answer {
    let targets = targets_body(&body)?;
    let (sb, os, _) = find(&st, &id).await?;
    let next = os.egress.lock().expect("egress").without(&targets);
    apply(&st, &sb, &os, next, Policy::to_json).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(v: Value) -> Policy {
        Policy::parse(&v).map_err(|r| r.status()).unwrap()
    }

    #[test]
    fn deny_by_default_allows_the_named() {
        let p = policy(json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}));
        let (_, n) = p.to_e2b().map_err(|r| r.status()).unwrap();
        assert_eq!(n, json!({"allowOut": ["pypi.org"], "denyOut": ["0.0.0.0/0"]}));
    }

    #[test]
    fn empty_allows_everything_and_no_default_denies() {
        assert_eq!(policy(json!({})).to_e2b().map_err(|r| r.status()).unwrap().1, json!({}));
        let p = policy(json!({"egress": [{"action": "allow", "target": "*.example.com"}]}));
        assert!(p.deny_by_default);
    }

    #[test]
    fn what_cannot_be_enforced_exactly_is_refused() {
        let name_deny =
            policy(json!({"defaultAction": "allow", "egress": [{"action": "deny", "target": "bad.example.com"}]}));
        assert_eq!(name_deny.to_e2b().unwrap_err().status(), StatusCode::NOT_IMPLEMENTED);
        let range = policy(json!({"defaultAction": "allow", "egress": [{"action": "deny", "target": "10.1.0.0/16"}]}));
        assert_eq!(range.to_e2b().map_err(|r| r.status()).unwrap().1, json!({"denyOut": ["10.1.0.0/16"]}));
        let shadowed = policy(json!({"defaultAction": "deny", "egress": [
            {"action": "deny", "target": "*.example.com"}, {"action": "allow", "target": "api.example.com"}]}));
        assert_eq!(shadowed.to_e2b().unwrap_err().status(), StatusCode::NOT_IMPLEMENTED);
        let same = policy(json!({"defaultAction": "deny", "egress": [
            {"action": "deny", "target": "pypi.org"}, {"action": "allow", "target": "pypi.org"}]}));
        assert_eq!(same.to_e2b().map_err(|r| r.status()).unwrap().1, json!({"denyOut": ["0.0.0.0/0"]}));
    }

    #[test]
    fn patches_put_incoming_rules_first() {
        let p = policy(json!({"defaultAction": "deny", "egress": [{"action": "allow", "target": "pypi.org"}]}));
        let next = p.patched(vec![
            Rule { allow: true, target: "www.github.com".into() },
            Rule { allow: false, target: "pypi.org".into() },
            Rule { allow: true, target: "pypi.org".into() },
        ]);
        assert_eq!(next.rules.len(), 2);
        assert!(!next.rules[1].allow);
        assert_eq!(next.without(&["www.github.com".into(), "nonexistent.example.com".into()]).rules.len(), 1);
    }

    #[test]
    fn bad_rules_are_refused() {
        assert!(Policy::parse(&json!({"egress": [{"action": "maybe", "target": "x.com"}]})).is_err());
        assert!(Policy::parse(&json!({"egress": [{"action": "allow", "target": "http://x.com"}]})).is_err());
    }
}

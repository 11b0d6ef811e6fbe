//! Snapshots and forks: `POST /sandboxes/{id}/snapshots` (201 `{"snapshotID","names"}`),
//! `GET /snapshots` (filters `sandboxID` and `name`, paginated with `X-Next-Token`),
//! `POST /sandboxes/{id}/fork` (201, one `{"sandbox"}` or `{"error"}` per fork); a snapshot
//! is deleted as a template is (`DELETE /templates/{id}`, see `templates`), and `create`
//! takes its ID or name as the template.
//!
//! A snapshot is the sandbox's filesystem made into a template by the provider
//! ([`Snapshots::snapshot`]: on the local provider, the overlay's upper layer copied and
//! stacked on the sandbox's own lowers). Running processes are not captured: a sandbox
//! started from a snapshot boots afresh on the saved files. A fork is a snapshot taken for
//! the purpose and `count` sandboxes created from it. The layers under sandboxes still running
//! are not removed when their snapshot is deleted (an overlay's lower layer must not change
//! under it): the provider removes them when serve stops.
//!
//! [`Snapshots::snapshot`]: crate::provider::Snapshots::snapshot

pub(super) mod store;

use super::body::JsonBody;
use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer::json_error;
use super::sandboxes::{make_sandbox, not_found, provider_error, sandbox_json, NewSandbox};
use super::state::{new_sandbox_id, AppState};
use store::{Snapshot, Store};

type SharedState = State<Arc<AppState>>;

/// Page size of `GET /snapshots`, default and maximum.
const MAX_PAGE: usize = 100;
/// Most forks one request may ask for.
const MAX_FORKS: u32 = 20;

impl Store {
    /// The ID of the snapshot `name_or_id` names, if any.
    pub(crate) fn resolve(&self, name_or_id: &str) -> Option<String> {
        let live = self.live.lock().expect("snapshots");
        live.iter()
            .find(|s| s.id == name_or_id || (!s.hidden && s.names.iter().any(|n| n == name_or_id)))
            .map(|s| s.id.clone())
    }

    /// Every snapshot ID the provider may still hold, for removal at shutdown.
    pub(crate) fn all_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.live.lock().expect("snapshots").iter().map(|s| s.id.clone()).collect();
        ids.extend(self.deleted.lock().expect("snapshots").iter().cloned());
        ids
    }
}

pub(crate) fn routes(r: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    r.route("/sandboxes/{id}/snapshots", post(create))
        .route("/snapshots", get(list))
        .route("/sandboxes/{id}/fork", post(fork))
}

#[derive(Debug, Default, Deserialize)]
struct SnapshotBody {
    #[serde(default)]
    name: Option<String>,
}

/// Takes a snapshot of sandbox `id`.
async fn take(st: &AppState, id: &str, name: Option<String>, hidden: bool) -> Result<Snapshot, Response> {
    let Some((sb, _)) = st.lookup(id).await else {
        return Err(not_found(id));
    };
    if let Some(n) = &name {
        if n.is_empty() || n.contains('/') && n.split('/').any(str::is_empty) {
            return Err(json_error(StatusCode::BAD_REQUEST, &format!("invalid snapshot name {n:?}")));
        }
        if st.snapshots.resolve(n).is_some() {
            return Err(json_error(StatusCode::CONFLICT, &format!("snapshot '{n}' already exists")));
        }
    }
    let snap_id = new_sandbox_id();
    st.provider.sandbox(&sb.provider_id).snapshot(&snap_id).await.map_err(provider_error)?;
    let snap = Snapshot { id: snap_id, names: name.into_iter().collect(), sandbox: sb.id.clone(), hidden };
    st.snapshots.live.lock().expect("snapshots").push(snap.clone());
    Ok(snap)
}

fn snapshot_json(s: &Snapshot) -> Value {
    json!({"snapshotID": s.id, "names": s.names})
}

async fn create(State(st): SharedState, Path(id): Path<String>, JsonBody(req, _): JsonBody<SnapshotBody>) -> Response {
    match take(&st, &id, req.name, false).await {
        Ok(s) => (StatusCode::CREATED, Json(snapshot_json(&s))).into_response(),
        Err(resp) => resp,
    }
}

async fn list(State(st): SharedState, RawQuery(q): RawQuery) -> Response {
    let mut sandbox = None;
    let mut name = None;
    let mut limit = MAX_PAGE;
    let mut offset = 0usize;
    for (k, v) in crate::net::query_split(q.as_deref()) {
        let v = crate::net::form_decode(v);
        match k {
            "sandboxID" => sandbox = Some(v),
            "name" => name = Some(v),
            "limit" => match v.parse::<usize>() {
                Ok(n) if n >= 1 => limit = n.min(MAX_PAGE),
                _ => return json_error(StatusCode::BAD_REQUEST, "limit must be a positive integer"),
            },
            "nextToken" if !v.is_empty() => match v.parse() {
                Ok(n) => offset = n,
                Err(_) => return json_error(StatusCode::BAD_REQUEST, "invalid nextToken"),
            },
            _ => {}
        }
    }
    let all: Vec<Snapshot> = st
        .snapshots
        .live
        .lock()
        .expect("snapshots")
        .iter()
        .rev()
        .filter(|s| !s.hidden)
        .filter(|s| sandbox.as_deref().is_none_or(|id| s.sandbox == id))
        .filter(|s| name.as_deref().is_none_or(|n| s.names.iter().any(|x| x == n)))
        .cloned()
        .collect();
    let page: Vec<Value> = all.iter().skip(offset).take(limit).map(snapshot_json).collect();
    let mut headers = HeaderMap::new();
    if offset + limit < all.len() {
        if let Ok(v) = HeaderValue::from_str(&(offset + limit).to_string()) {
            headers.insert("x-next-token", v);
        }
    }
    (headers, Json(Value::Array(page))).into_response()
}

/// `DELETE /templates/{id}` for a snapshot: `None` if `id` names none.
pub(crate) async fn delete(st: &AppState, id: &str) -> Option<Response> {
    let snap = {
        let mut live = st.snapshots.live.lock().expect("snapshots");
        let i = live.iter().position(|s| s.id == id || (!s.hidden && s.names.iter().any(|n| n == id)))?;
        live.remove(i)
    };
    let in_use = st.all_sandboxes().iter().any(|sb| sb.template == snap.id);
    if in_use {
        st.snapshots.deleted.lock().expect("snapshots").push(snap.id);
    } else {
        st.provider.remove_template(&snap.id).await;
    }
    Some(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct ForkBody {
    #[serde(default)]
    count: Option<u32>,
    #[serde(default)]
    timeout: Option<u64>,
}

/// Forks sandbox `id`: a hidden snapshot, then `count` sandboxes made from it with the
/// source's metadata and `envVars`.
async fn fork(State(st): SharedState, Path(id): Path<String>, JsonBody(req, _): JsonBody<ForkBody>) -> Response {
    let count = req.count.unwrap_or(1);
    if !(1..=MAX_FORKS).contains(&count) {
        return json_error(StatusCode::BAD_REQUEST, &format!("count must be between 1 and {MAX_FORKS}"));
    }
    let Some((source, info)) = st.lookup(&id).await else {
        return not_found(&id);
    };
    let snap = match take(&st, &id, None, true).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    let mut out = Vec::new();
    for _ in 0..count {
        let req = NewSandbox {
            template_id: Some(snap.id.clone()),
            timeout: Some(req.timeout.unwrap_or(source.timeout_secs)),
            metadata: Some(info.metadata.clone()),
            env_vars: Some(source.env_vars.clone()),
            ..Default::default()
        };
        match make_sandbox(&st, req).await {
            Ok(sb) => out.push(json!({"sandbox": sandbox_json(&st, &sb)})),
            Err(resp) => {
                let status = resp.status().as_u16();
                let body = axum::body::to_bytes(resp.into_body(), 1 << 16).await.unwrap_or_default();
                let message = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
                out.push(json!({"error": {"code": status, "message": message}}));
            }
        }
    }
    (StatusCode::CREATED, Json(Value::Array(out))).into_response()
}

//! The template build API (protocol doc §8.1) over the provider's own `build`/`deploy`.
//!
//! * `POST /v3/templates` → 202 `{templateID, buildID, public, names, tags, aliases}`; a name
//!   asked for again gives the same template and a new build.
//! * `GET /templates/{id}/files/{hash}` → 201 `{present}`, plus a one-time upload `url` back at
//!   this server (`/_upload/<token>`, no API key needed: the token is the credential, like a
//!   presigned URL) when the files are not here yet. The PUT body is the gzipped tar; the
//!   token, and a declared length past 1 GiB, are refused before a byte of it is read, and it
//!   is streamed to disk under the same bound.
//! * `POST /v2/templates/{id}/builds/{buildID}` → 202; the build runs in the background:
//!   a template folder is materialized (a Dockerfile from `fromImage` and the steps, one line
//!   per step, so Dockerfile line `n` is step `n - 1`; the uploaded COPY contexts extracted at
//!   their relative paths, never through a link (`build_dir`); a `template.yaml` named after
//!   the template ID with `startCmd`, `readyCmd`, cpu and memory) and handed to the
//!   provider's `deploy` (with a start command)
//!   or `build` (without). Its content digest is replaced by one over the image, the steps
//!   and the template ID, so a second build of the same steps reuses the layer, as E2B's
//!   layer cache does. The provider registers the template under its ID; `POST /sandboxes`
//!   takes the ID or the name.
//! * `GET /templates/{id}/builds/{buildID}/status?logsOffset&limit` → `TemplateBuildInfo`,
//!   the provider's build log as `logEntries`; a failure names the step (`reason.step`, the
//!   1-based index into `steps`) so a client can point at its own Dockerfile line.
//! * `GET /templates`, `GET /templates/{id}`, `DELETE /templates/{id}` (the provider's
//!   registration and layer go too). Whatever is left is removed when the server stops.

// Helpers return the early response as their error.
#![allow(clippy::result_large_err)]

pub(super) mod store;

use std::collections::HashMap;
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Value as JsonValue};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::answer::{drain, json_error};
use super::build_dir::BuildDir;
use super::state::{new_sandbox_id, now_secs, rfc3339, AppState};
use crate::templates::{BuildSpec, TemplateDir, TemplateError};
use store::{Build, Inner, Store, Tpl};

/// Why serve could not make an official template ready for a create.
#[derive(Debug, thiserror::Error)]
pub enum OfficialTemplateError {
    /// Its folder is here but does not load.
    #[error(transparent)]
    Load(#[from] TemplateError),
    /// The provider's build failed; `message` is the provider's.
    #[error("cannot build the official template {name} from {}: {message}", dir.display())]
    Build { name: String, dir: PathBuf, message: String },
}

/// A tag of `POST /templates/tags` that is not `tag` or `name:tag`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    /// An empty side of a colon, or more than one colon.
    #[error("invalid tag {0:?}: expected `tag` or `name:tag`")]
    Shape(String),
    /// A tag with other characters than letters, digits, `-`, `_` and `.`.
    #[error("invalid tag {0:?}")]
    Characters(String),
}

/// A build request serve cannot turn into a Dockerfile, or whose registry login it cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildRequestError {
    #[error("fromImage must be one line")]
    MultilineFrom,
    /// Step `step` (1-based) of type `kind`.
    #[error("step {step} ({kind}): {problem}")]
    Step { step: usize, kind: String, problem: StepProblem },
    #[error("fromImageRegistry: a registry login needs a username and a password")]
    RegistryLogin,
    /// An `aws` or `gcp` login.
    #[error(
        "fromImageRegistry type `{0}`: not supported by scenario-run serve (only `registry`, a username and password)"
    )]
    RegistryUnsupported(String),
    #[error("fromImageRegistry: unknown type (expected `registry`, `aws` or `gcp`)")]
    RegistryUnknown,
}

/// What is wrong with one step of a build request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepProblem {
    #[error("arguments must be one line")]
    MultilineArguments,
    #[error("no command")]
    NoCommand,
    #[error("needs a source and a destination")]
    NoSourceOrDestination,
    #[error("needs name/value pairs")]
    NotPairs,
    #[error("needs an argument")]
    NoArgument,
    #[error("unsupported step type `{0}`")]
    Unsupported(String),
}

/// Alibaba's ids of the official templates serve has (`create` of `base` on the alicloud preset
/// sends `216g37mamkdfhzrauvxk`, of `code-interpreter-v1` `8d926meb1xzckz1a83ib`).
const OFFICIAL_IDS: &[(&str, &str)] =
    &[("216g37mamkdfhzrauvxk", "base"), ("8d926meb1xzckz1a83ib", "code-interpreter-v1")];

/// Official templates serve builds from their folder (`templates/<name>`, or under
/// `$SCENARIO_RUN_TEMPLATES_DIR`) on the first create that names them, as the platform has
/// them: what the code-interpreter SDKs create by default. The build is kept, so a later
/// serve on this machine reuses it in seconds.
pub(crate) const BUILT_OFFICIAL: &[&str] = &["code-interpreter-v1"];

type SharedState = State<Arc<AppState>>;

/// Largest COPY context accepted (as uploaded, compressed).
const MAX_UPLOAD: u64 = 1 << 30;

impl Store {
    pub fn new(root: PathBuf) -> Self {
        Self { root, inner: Mutex::new(Inner::default()), official: Default::default(), templates_dir: None }
    }

    /// The folder of template folders as the run reads it, `./.env` included.
    pub fn with_templates_dir(mut self, dir: Option<String>) -> Self {
        self.templates_dir = dir;
        self
    }

    /// Makes sure the official template `name` (a resolved name) is deployed on `provider`
    /// when serve builds it (see [`BUILT_OFFICIAL`]) and its folder is here; anything else is
    /// left to the provider. The error is what to answer the create with.
    pub async fn ensure_official(
        &self,
        provider: &Arc<dyn crate::provider::Provider>,
        name: &str,
    ) -> Result<(), OfficialTemplateError> {
        if !BUILT_OFFICIAL.contains(&name) {
            return Ok(());
        }
        let mut done = self.official.lock().await;
        if done.contains(name) {
            return Ok(());
        }
        let root = self.templates_dir.clone().or_else(|| std::env::var(crate::templates::TEMPLATES_DIR_ENV).ok());
        let cwd = std::env::current_dir().unwrap_or_default();
        let dir = crate::templates::find_dir(name, &cwd, root.as_deref());
        if !dir.join("Dockerfile").is_file() {
            return Ok(());
        }
        let template = TemplateDir::load(&dir)?;
        eprintln!("official template {name}: building it from {} (first create that names it)", dir.display());
        let started = std::time::Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
        let spec =
            BuildSpec { template, build_args: Default::default(), keep: true, skip_cache: false, from_auth: None };
        let out = provider.deploy(spec, tx).await;
        let _ = drain.await;
        let out = out.map_err(|e| OfficialTemplateError::Build {
            name: name.to_string(),
            dir: dir.clone(),
            message: e.message,
        })?;
        eprintln!(
            "official template {name}: {} in {:.1}s",
            if out.cached { "reused the kept build" } else { "built" },
            started.elapsed().as_secs_f64()
        );
        done.insert(name.to_string());
        Ok(())
    }

    /// The template ID for a name (or the ID itself).
    pub fn resolve(&self, name_or_id: &str) -> String {
        // serve plays the platform, official templates included: the ids the alicloud preset
        // sends for them (templates/*/template.yaml `ids`) name serve's own.
        if let Some((_, name)) = OFFICIAL_IDS.iter().find(|(id, _)| *id == name_or_id) {
            return name.to_string();
        }
        // An official name is the official template's, as an alias is unique on E2B: a
        // template built here under that name (`E2E_BUILD_OFFICIAL`) is reached by its ID.
        // (It used to take the name over, and a create by the name while it was still being
        // built was a 404.)
        if BUILT_OFFICIAL.contains(&name_or_id) {
            return name_or_id.to_string();
        }
        let inner = self.inner.lock().expect("templates");
        inner.by_name.get(name_or_id).cloned().unwrap_or_else(|| name_or_id.to_string())
    }

    /// The memory (MiB) the template `id` was built for, if it was built here with one.
    pub fn memory_of(&self, id: &str) -> Option<u64> {
        self.inner.lock().expect("templates").by_id.get(id).and_then(|t| t.memory)
    }

    /// IDs of every template, to remove at shutdown.
    pub fn ids(&self) -> Vec<String> {
        self.inner.lock().expect("templates").by_id.keys().cloned().collect()
    }

    fn files(&self, id: &str, hash: &str) -> PathBuf {
        self.root.join(id).join("files").join(format!("{hash}.tar.gz"))
    }

    /// Forgets `id` (an ID or a name) and removes its files; returns the ID if it existed.
    fn forget(&self, id_or_name: &str) -> Option<String> {
        let mut inner = self.inner.lock().expect("templates");
        let id = inner.by_name.get(id_or_name).cloned().unwrap_or_else(|| id_or_name.to_string());
        inner.by_id.remove(&id)?;
        inner.by_name.retain(|_, v| *v != id);
        inner.uploads.retain(|_, (tid, _)| *tid != id);
        drop(inner);
        let _ = std::fs::remove_dir_all(self.root.join(&id));
        Some(id)
    }

    /// Removes the store's directory (at shutdown).
    pub fn remove_all(&self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

pub(crate) fn routes(r: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    r.route("/v3/templates", post(create))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates", get(list))
        .route("/v2/templates", get(list))
        .route("/templates/{id}", get(detail).delete(delete))
        .route("/templates/{id}/files/{hash}", get(files))
        .route("/v2/templates/{id}/builds/{build}", post(start))
        .route("/templates/{id}/builds/{build}/status", get(status))
        // Read by the handler itself, after the token (see `upload`).
        .route("/_upload/{token}", put(upload).layer(DefaultBodyLimit::disable()))
}

/// The template a tag target names: `name`, `name:tag` or an ID, or `alias` of `alias:tag`.
fn tagged(inner: &Inner, target: &str) -> Option<String> {
    inner.by_name.get(target).cloned().or_else(|| inner.by_id.contains_key(target).then(|| target.to_string())).or_else(
        || {
            let alias = target.split_once(':')?.0;
            inner.by_name.get(alias).cloned().or_else(|| {
                inner
                    .by_id
                    .values()
                    .find(|t| t.name.split_once(':').is_some_and(|(a, _)| a == alias))
                    .map(|t| t.id.clone())
            })
        },
    )
}

/// The tag part of `alias:tag` or `tag`; refused when either side of a colon is empty.
fn tag_part(t: &str) -> Result<String, TagError> {
    let tag = match t.split_once(':') {
        Some((alias, tag)) if !alias.is_empty() && !tag.is_empty() && !tag.contains(':') => tag,
        None if !t.is_empty() => t,
        _ => return Err(TagError::Shape(t.to_string())),
    };
    if !tag.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.')) {
        return Err(TagError::Characters(t.to_string()));
    }
    Ok(tag.to_string())
}

fn tags_of(v: &JsonValue) -> Vec<String> {
    match v {
        JsonValue::String(s) => vec![s.clone()],
        JsonValue::Array(a) => a.iter().filter_map(|t| t.as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    }
}

/// `POST /templates/tags` `{"target":"name:tag","tags":[…]}`: 201 `{"tags","buildID"}`, the
/// tags pointing at the target's newest build; `name:<tag>` then names the template too.
async fn assign_tags(State(st): SharedState, body: Bytes) -> Response {
    let req = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let target = req["target"].as_str().unwrap_or_default().to_string();
    let tags: Result<Vec<String>, TagError> = tags_of(&req["tags"]).iter().map(|t| tag_part(t)).collect();
    let tags = match tags {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => return json_error(StatusCode::BAD_REQUEST, "tags are required"),
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    let mut inner = st.templates.inner.lock().expect("templates");
    let Some(id) = tagged(&inner, &target) else {
        return not_found(&target);
    };
    let t = inner.by_id.get_mut(&id).expect("found");
    let alias = t.name.split_once(':').map_or(t.name.clone(), |(a, _)| a.to_string());
    let build = if t.last_build.is_empty() { crate::random::uuid_v4() } else { t.last_build.clone() };
    for tag in &tags {
        t.tags.retain(|(x, _, _)| x != tag);
        t.tags.push((tag.clone(), build.clone(), now_secs()));
    }
    for tag in &tags {
        inner.by_name.insert(format!("{alias}:{tag}"), id.clone());
    }
    (StatusCode::CREATED, Json(json!({"tags": tags, "buildID": build}))).into_response()
}

/// `DELETE /templates/tags` `{"name","tags":[…]}`: 204, or 404 for an unknown template.
async fn remove_tags(State(st): SharedState, body: Bytes) -> Response {
    let req = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let name = req["name"].as_str().unwrap_or_default().to_string();
    let mut inner = st.templates.inner.lock().expect("templates");
    let Some(id) = tagged(&inner, &name) else {
        return not_found(&name);
    };
    let gone: Vec<String> = tags_of(&req["tags"]).iter().filter_map(|t| tag_part(t).ok()).collect();
    let t = inner.by_id.get_mut(&id).expect("found");
    t.tags.retain(|(x, _, _)| !gone.contains(x));
    let alias = t.name.split_once(':').map_or(t.name.clone(), |(a, _)| a.to_string());
    for tag in gone {
        inner.by_name.remove(&format!("{alias}:{tag}"));
    }
    StatusCode::NO_CONTENT.into_response()
}

/// `GET /templates/{id}/tags`: `[{"tag","buildID","createdAt"}]`.
async fn list_tags(State(st): SharedState, Path(id): Path<String>) -> Response {
    let inner = st.templates.inner.lock().expect("templates");
    let Some(id) = tagged(&inner, &id) else {
        return not_found(&id);
    };
    let t = &inner.by_id[&id];
    let out: Vec<JsonValue> =
        t.tags.iter().map(|(tag, b, at)| json!({"tag": tag, "buildID": b, "createdAt": rfc3339(*at)})).collect();
    Json(out).into_response()
}

fn body_json(body: &Bytes) -> Result<JsonValue, Response> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    serde_json::from_slice(body).map_err(|e| json_error(StatusCode::BAD_REQUEST, &format!("invalid request body: {e}")))
}

fn not_found(id: &str) -> Response {
    json_error(StatusCode::NOT_FOUND, &format!("template '{id}' not found"))
}

async fn create(State(st): SharedState, body: Bytes) -> Response {
    let req = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(name) = req["name"].as_str().or(req["alias"].as_str()).filter(|n| !n.is_empty()).map(str::to_string)
    else {
        return json_error(StatusCode::BAD_REQUEST, "name is required");
    };
    let build_id = crate::random::uuid_v4();
    let mut inner = st.templates.inner.lock().expect("templates");
    let id = match inner.by_name.get(&name) {
        Some(id) => id.clone(),
        None => {
            let id = new_sandbox_id();
            inner.by_name.insert(name.clone(), id.clone());
            inner.by_id.insert(
                id.clone(),
                Tpl {
                    id: id.clone(),
                    name: name.clone(),
                    cpu: None,
                    memory: None,
                    builds: HashMap::new(),
                    last_build: String::new(),
                    tags: Vec::new(),
                    recipe: None,
                },
            );
            id
        }
    };
    let t = inner.by_id.get_mut(&id).expect("just inserted");
    t.cpu = req["cpuCount"].as_u64().or(t.cpu);
    t.memory = req["memoryMB"].as_u64().or(t.memory);
    t.builds.insert(build_id.clone(), Arc::new(Mutex::new(Build { status: "waiting", ..Default::default() })));
    t.last_build.clone_from(&build_id);
    let body = json!({
        "templateID": id, "buildID": build_id, "public": false,
        "names": [name], "tags": ["default"], "aliases": [name],
    });
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

fn template_json(t: &Tpl) -> JsonValue {
    let builds: Vec<JsonValue> =
        t.builds.iter().map(|(id, b)| json!({"buildID": id, "status": b.lock().expect("build").status})).collect();
    json!({
        "templateID": t.id, "names": [t.name], "aliases": [t.name], "public": false,
        "cpuCount": t.cpu, "memoryMB": t.memory, "builds": builds,
    })
}

async fn list(State(st): SharedState) -> Response {
    let inner = st.templates.inner.lock().expect("templates");
    Json(inner.by_id.values().map(template_json).collect::<Vec<_>>()).into_response()
}

async fn detail(State(st): SharedState, Path(id): Path<String>) -> Response {
    let id = st.templates.resolve(&id);
    let inner = st.templates.inner.lock().expect("templates");
    match inner.by_id.get(&id) {
        Some(t) => Json(template_json(t)).into_response(),
        None => not_found(&id),
    }
}

/// `GET /templates/aliases/{alias}` (`Template.exists`): 200 with the template's ID if the
/// name is taken (`base`, a template built here, a named snapshot), else 404.
async fn alias(State(st): SharedState, Path(alias): Path<String>) -> Response {
    let id = if alias == "base" || BUILT_OFFICIAL.contains(&alias.as_str()) {
        Some(alias.clone())
    } else {
        let built = st.templates.inner.lock().expect("templates").by_name.get(&alias).cloned();
        built.or_else(|| st.snapshots.resolve(&alias))
    };
    match id {
        Some(id) => Json(json!({"templateID": id, "public": false})).into_response(),
        None => not_found(&alias),
    }
}

async fn delete(State(st): SharedState, Path(id): Path<String>) -> Response {
    // Snapshots are deleted as templates are.
    if let Some(r) = super::snapshots::delete(&st, &id).await {
        return r;
    }
    match st.templates.forget(&id) {
        Some(id) => {
            st.provider.remove_template(&id).await;
            StatusCode::NO_CONTENT.into_response()
        }
        None => not_found(&id),
    }
}

fn safe_hash(hash: &str) -> bool {
    !hash.is_empty() && hash.len() <= 128 && hash.bytes().all(|b| b.is_ascii_alphanumeric())
}

async fn files(State(st): SharedState, Path((id, hash)): Path<(String, String)>) -> Response {
    if !safe_hash(&hash) {
        return json_error(StatusCode::BAD_REQUEST, "invalid files hash");
    }
    let mut inner = st.templates.inner.lock().expect("templates");
    if !inner.by_id.contains_key(&id) {
        return not_found(&id);
    }
    if st.templates.files(&id, &hash).exists() || st.mutants.has(super::mutants::Fault::StaleBuildCache) {
        return (StatusCode::CREATED, Json(json!({"present": true}))).into_response();
    }
    let token = format!("{}{}", new_sandbox_id(), new_sandbox_id());
    inner.uploads.insert(token.clone(), (id, hash));
    let url = format!("{}/_upload/{token}", st.base_url);
    (StatusCode::CREATED, Json(json!({"present": false, "url": url}))).into_response()
}

/// Answers a refused upload without reading what the client still sends, but for a small
/// declared body (read, so that a client reusing the connection sees the answer).
async fn refuse_upload(body: Body, declared: Option<u64>, status: StatusCode, message: &str) -> Response {
    if declared.is_some_and(|n| n <= REFUSED_BODY_READ) {
        drain(body).await;
    }
    json_error(status, message)
}

/// The most of a refused upload's body that is read (see [`refuse_upload`]).
const REFUSED_BODY_READ: u64 = 64 << 10;

/// `PUT /_upload/{token}`: the token and the declared length are checked before a byte of
/// the body is read, then the body is streamed to disk, counted against [`MAX_UPLOAD`].
async fn upload(State(st): SharedState, Path(token): Path<String>, req: Request) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let found = st.templates.inner.lock().expect("templates").uploads.remove(&token);
    let Some((id, hash)) = found else {
        return refuse_upload(req.into_body(), declared, StatusCode::FORBIDDEN, "unknown or used upload URL").await;
    };
    let too_large = format!("the files are larger than {}, the most one upload may be", crate::size::human(MAX_UPLOAD));
    if declared.is_some_and(|n| n > MAX_UPLOAD) {
        return refuse_upload(req.into_body(), declared, StatusCode::PAYLOAD_TOO_LARGE, &too_large).await;
    }
    let path = st.templates.files(&id, &hash);
    // One part file per upload URL: two uploads of the same files never share one.
    let tmp = path.with_extension(format!("{token}.part"));
    let stored = async {
        tokio::fs::create_dir_all(path.parent().expect("has a parent")).await?;
        let mut f = tokio::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).await?;
        let mut body = req.into_body().into_data_stream();
        let mut n = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            n += chunk.len() as u64;
            if n > MAX_UPLOAD {
                return Ok(false);
            }
            f.write_all(&chunk).await?;
        }
        f.flush().await?;
        tokio::fs::rename(&tmp, &path).await?;
        Ok::<_, std::io::Error>(true)
    }
    .await;
    if !matches!(stored, Ok(true)) {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    match stored {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => json_error(StatusCode::PAYLOAD_TOO_LARGE, &too_large),
        Err(e) => json_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot store the upload: {e}")),
    }
}

#[derive(serde::Deserialize)]
struct StatusQuery {
    #[serde(rename = "logsOffset", default)]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
}

/// A build and its template's cpu and memory.
type Found = (Arc<Mutex<Build>>, Option<u64>, Option<u64>);

fn find_build(st: &AppState, id: &str, build: &str) -> Result<Found, Response> {
    let inner = st.templates.inner.lock().expect("templates");
    let t = inner.by_id.get(id).ok_or_else(|| not_found(id))?;
    let b =
        t.builds.get(build).cloned().ok_or_else(|| {
            json_error(StatusCode::NOT_FOUND, &format!("build '{build}' of template '{id}' not found"))
        })?;
    Ok((b, t.cpu, t.memory))
}

async fn status(
    State(st): SharedState,
    Path((id, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> Response {
    let b = match find_build(&st, &id, &build) {
        Ok((b, _, _)) => b,
        Err(r) => return r,
    };
    let b = b.lock().expect("build");
    let limit = q.limit.unwrap_or(100).clamp(1, 100);
    let entries: Vec<JsonValue> = b.entries.iter().skip(q.logs_offset).take(limit).cloned().collect();
    let logs: Vec<JsonValue> = entries.iter().map(|e| e["message"].clone()).collect();
    let mut body = json!({
        "templateID": id, "buildID": build, "status": b.status, "logs": logs, "logEntries": entries,
    });
    if let Some(r) = &b.reason {
        body["reason"] = r.clone();
    }
    Json(body).into_response()
}

async fn start(State(st): SharedState, Path((id, build)): Path<(String, String)>, body: Bytes) -> Response {
    let req = match body_json(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let (b, cpu, memory) = match find_build(&st, &id, &build) {
        Ok(x) => x,
        Err(r) => return r,
    };
    {
        let mut b = b.lock().expect("build");
        if b.status != "waiting" {
            return json_error(StatusCode::CONFLICT, &format!("build '{build}' was started already"));
        }
        b.status = "building";
    }
    let (req, inherited) = expand(&st.templates.inner.lock().expect("templates"), &req, &id);
    let folder = match check_registry(&req).and_then(|()| dockerfile(&req)) {
        Ok(f) => f,
        Err(m) => {
            let mut b = b.lock().expect("build");
            b.status = "waiting";
            return json_error(StatusCode::BAD_REQUEST, &m.to_string());
        }
    };
    tokio::spawn(run(st.clone(), id, build, b, req, inherited, folder, cpu, memory));
    StatusCode::ACCEPTED.into_response()
}

/// `req` with `fromImage` set (from `fromImage`, else `fromTemplate`, else E2B's base image)
/// and each COPY step naming the template its files were uploaded to (`_files`). A
/// `fromTemplate` that names a template built here is that template's recipe under the
/// request's steps, as E2B builds a template on top of another's filesystem: the layer is
/// built from its image and both templates' steps. Returns it and how many steps came from
/// the other template (a failing step's number is the client's own).
fn expand(inner: &Inner, req: &JsonValue, id: &str) -> (JsonValue, usize) {
    let mut out = req.clone();
    let own: Vec<JsonValue> = req["steps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|mut s| {
            // Always this template's own: a client's `_files` never names another folder.
            if s["type"] == "COPY" {
                s["_files"] = json!(id);
            } else if let Some(o) = s.as_object_mut() {
                o.remove("_files");
            }
            s
        })
        .collect();
    let parent = req["fromImage"].is_null().then(|| req["fromTemplate"].as_str()).flatten().and_then(|t| {
        let pid = inner.by_name.get(t).map_or(t, String::as_str);
        inner.by_id.get(pid).and_then(|p| p.recipe.clone())
    });
    let (from, mut steps) = match &parent {
        Some(r) => (r["fromImage"].clone(), r["steps"].as_array().cloned().unwrap_or_default()),
        None => {
            (json!(req["fromImage"].as_str().or(req["fromTemplate"].as_str()).unwrap_or("e2bdev/base")), Vec::new())
        }
    };
    let inherited = steps.len();
    steps.extend(own);
    if let Some(o) = out.as_object_mut() {
        o.remove("fromTemplate");
    }
    out["fromImage"] = from;
    out["steps"] = json!(steps);
    (out, inherited)
}

/// Quotes a word for the Dockerfile lexer (`$` stays live: the client substituted its ARGs
/// and leaves `${PATH}`-style references of the image).
fn q(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%${}".contains(c)) {
        s.to_string()
    } else {
        format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

fn strs(step: &JsonValue) -> Vec<String> {
    step["args"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

/// One line per step after `FROM` (so line `n` is step `n - 1`).
fn dockerfile(req: &JsonValue) -> Result<String, BuildRequestError> {
    let from = req["fromImage"].as_str().or(req["fromTemplate"].as_str()).unwrap_or("e2bdev/base");
    if from.contains('\n') {
        return Err(BuildRequestError::MultilineFrom);
    }
    let mut out = format!("FROM {}\n", q(from));
    let empty = Vec::new();
    for (i, step) in req["steps"].as_array().unwrap_or(&empty).iter().enumerate() {
        let args = strs(step);
        let kind = step["type"].as_str().unwrap_or("");
        let bad = |problem| BuildRequestError::Step { step: i + 1, kind: kind.to_string(), problem };
        if kind != "RUN" && args.iter().any(|a| a.contains('\n')) {
            return Err(bad(StepProblem::MultilineArguments));
        }
        let line = match kind {
            "RUN" => {
                let mut cmd = args.first().cloned().ok_or_else(|| bad(StepProblem::NoCommand))?;
                if let Some(u) = args.get(1).filter(|u| !u.is_empty()) {
                    cmd = format!(
                        "exec runuser -u {} -- /bin/sh -c {}",
                        crate::templates::dockerfile::shell_quote(u),
                        crate::templates::dockerfile::shell_quote(&cmd)
                    );
                }
                if cmd.contains('\n') || cmd.ends_with('\\') || cmd.starts_with('[') {
                    format!("RUN {}", json!(["/bin/sh", "-c", cmd]))
                } else {
                    format!("RUN {cmd}")
                }
            }
            "COPY" => {
                let (src, dest) = match (args.first(), args.get(1)) {
                    (Some(s), Some(d)) => (s, d),
                    _ => return Err(bad(StepProblem::NoSourceOrDestination)),
                };
                let mut flags = String::new();
                if let Some(u) = args.get(2).filter(|u| !u.is_empty()) {
                    flags += &format!("--chown={} ", q(u));
                }
                if let Some(m) = args.get(3).filter(|m| !m.is_empty()) {
                    flags += &format!("--chmod={} ", q(m));
                }
                format!("COPY {flags}{} {}", q(src), q(dest))
            }
            "ENV" => {
                if args.is_empty() || !args.len().is_multiple_of(2) {
                    return Err(bad(StepProblem::NotPairs));
                }
                let pairs: Vec<String> = args.chunks(2).map(|p| format!("{}={}", p[0], q(&p[1]))).collect();
                format!("ENV {}", pairs.join(" "))
            }
            "WORKDIR" | "USER" => format!("{kind} {}", q(args.first().ok_or_else(|| bad(StepProblem::NoArgument))?)),
            other => return Err(bad(StepProblem::Unsupported(other.to_string()))),
        };
        out += &line;
        out.push('\n');
    }
    Ok(out)
}

fn entry(level: &str, message: &str) -> JsonValue {
    json!({"timestamp": rfc3339(now_secs()), "level": level, "message": message})
}

#[allow(clippy::too_many_arguments)]
async fn run(
    st: Arc<AppState>,
    id: String,
    build_id: String,
    b: Arc<Mutex<Build>>,
    req: JsonValue,
    inherited: usize,
    dockerfile: String,
    cpu: Option<u64>,
    memory: Option<u64>,
) {
    let dir = st.templates.root.join(&id).join(format!("build-{build_id}"));
    let result = build(&st, &id, &dir, &b, &req, &dockerfile, cpu, memory).await;
    let _ = std::fs::remove_dir_all(&dir);
    if !st.templates.inner.lock().expect("templates").by_id.contains_key(&id) {
        // Deleted while it was building: what the provider registered goes too.
        st.provider.remove_template(&id).await;
    }
    if result.is_ok() {
        if let Some(t) = st.templates.inner.lock().expect("templates").by_id.get_mut(&id) {
            t.recipe = Some(json!({"fromImage": req["fromImage"], "steps": req["steps"]}));
        }
    }
    let mut b = b.lock().expect("build");
    // Step numbers as the client counts them: a step of the template built from is none of its.
    let result = result.map_err(|(message, step)| match step.map(|n| n.checked_sub(inherited)) {
        Some(Some(n)) if n > 0 => {
            let own = format!("step {n} (");
            (message.replacen(&format!("step {} (", n + inherited), &own, 1), Some(n))
        }
        Some(_) => (format!("in the steps of the template it is built from: {message}"), None),
        None => (message, None),
    });
    match result {
        Ok(()) => {
            b.entries.push(entry("info", &format!("template {id} is ready")));
            b.status = "ready";
        }
        Err((message, step)) => {
            b.entries.push(entry("error", &message));
            let mut reason = json!({"message": message});
            if let Some(s) = step {
                reason["step"] = json!(s.to_string());
            }
            b.reason = Some(reason);
            b.status = "error";
        }
    }
}

/// Materializes the folder and builds it; errors are (message, 1-based step).
#[allow(clippy::too_many_arguments)]
async fn build(
    st: &Arc<AppState>,
    id: &str,
    dir: &FsPath,
    b: &Arc<Mutex<Build>>,
    req: &JsonValue,
    dockerfile: &str,
    cpu: Option<u64>,
    memory: Option<u64>,
) -> Result<(), (String, Option<usize>)> {
    let fail = |m: String| (m, None);
    let folder = Arc::new(BuildDir::create(dir).map_err(|e| fail(format!("cannot create the build folder: {e}")))?);
    let steps = req["steps"].as_array().cloned().unwrap_or_default();
    for (i, step) in steps.iter().enumerate() {
        if step["type"] != "COPY" {
            continue;
        }
        let hash = step["filesHash"].as_str().unwrap_or("");
        // Uploaded to this template, or to the one it is built from.
        let tar = st.templates.files(step["_files"].as_str().unwrap_or(id), hash);
        if !safe_hash(hash) || !tar.exists() {
            return Err((format!("step {} (COPY): the files {hash} were not uploaded", i + 1), Some(i + 1)));
        }
        let f = folder.clone();
        tokio::task::spawn_blocking(move || f.unpack(&tar))
            .await
            .map_err(|e| fail(e.to_string()))?
            .map_err(|e| (format!("step {} (COPY): cannot extract the files: {e}", i + 1), Some(i + 1)))?;
    }
    let s = |k: &str| req[k].as_str().map(|v| JsonValue::String(v.to_string()).to_string());
    let mut yaml = format!("name: {}\n", JsonValue::String(id.to_string()));
    if let Some(c) = cpu {
        yaml += &format!("cpu: {c}\n");
    }
    if let Some(m) = memory {
        yaml += &format!("memory: {m}\n");
    }
    let start = s("startCmd");
    if let Some(v) = &start {
        yaml += &format!("start_command: {v}\n");
    }
    if let Some(v) = s("readyCmd") {
        // The platform never really checks: ready at once, whatever the command would say.
        let v = if st.mutants.has(super::mutants::Fault::ReadyCmdFailureOk) { "/bin/true".to_string() } else { v };
        yaml += &format!("ready_command: {v}\n");
    }
    // The e2b provider's extension: template.yaml's ready_timeout (seconds).
    if let Some(t) =
        req[crate::provider::e2b::build::READY_TIMEOUT_FIELD].as_f64().filter(|t| *t >= 1.0 && *t <= 86_400.0)
    {
        yaml += &format!("ready_timeout: {}\n", t.round() as u64);
    }
    folder.write_own("Dockerfile", dockerfile.as_bytes()).map_err(|e| fail(e.to_string()))?;
    folder.write_own("template.yaml", yaml.as_bytes()).map_err(|e| fail(e.to_string()))?;
    // Reads and hashes every file of the folder: off the async workers.
    let at = folder.path().to_path_buf();
    let mut template = tokio::task::spawn_blocking(move || TemplateDir::load(&at))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e| fail(e.to_string()))?;
    // The layer is keyed by what the builder runs, not by the start command.
    let mut h = Sha256::new();
    h.update(id);
    // Not `force`: a forced build is the same template, which the next build then reuses.
    let unforced: Vec<JsonValue> = steps
        .iter()
        .map(|s| {
            let mut s = s.clone();
            if let Some(o) = s.as_object_mut() {
                o.remove("force");
            }
            s
        })
        .collect();
    h.update(json!({"from": req["fromImage"], "steps": unforced}).to_string());
    template.digest = format!("sha256:{:x}", h.finalize());
    // `force` (the whole build, or any step: serve's builds are one layer) builds again.
    let force = req["force"] == json!(true) || steps.iter().any(|s| s["force"] == json!(true));
    if force {
        let _ = b.lock().map(|mut b| b.entries.push(entry("info", "force: building again without the cache")));
    }
    let spec = BuildSpec {
        template,
        build_args: Default::default(),
        keep: false,
        skip_cache: force,
        from_auth: from_auth(req),
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let sink = b.clone();
    let forward = tokio::spawn(async move {
        while let Some(line) = rx.recv().await {
            sink.lock().expect("build").entries.push(entry("info", &line));
        }
    });
    let r = if start.is_some() {
        st.provider.deploy(spec, tx).await.map(|_| ())
    } else {
        st.provider.build(spec, tx).await.map(|_| ())
    };
    let _ = forward.await;
    r.map_err(|e| step_error(&e.message, &steps))
}

/// `fromImageRegistry` as a registry login. Only `{"type": "registry"}` reaches here: the
/// other kinds are refused when the build starts.
fn from_auth(req: &JsonValue) -> Option<crate::image::RegistryAuth> {
    let r = req.get("fromImageRegistry").filter(|r| !r.is_null())?;
    Some(crate::image::RegistryAuth {
        username: r["username"].as_str().unwrap_or_default().to_string(),
        password: r["password"].as_str().unwrap_or_default().to_string(),
    })
}

/// Why `fromImageRegistry` cannot be used, if it cannot: only a username/password login
/// (`"type": "registry"`) is; AWS and GCP logins need those clouds' token exchanges.
fn check_registry(req: &JsonValue) -> Result<(), BuildRequestError> {
    let Some(r) = req.get("fromImageRegistry").filter(|r| !r.is_null()) else { return Ok(()) };
    match r["type"].as_str() {
        Some("registry") => match (r["username"].as_str(), r["password"].as_str()) {
            (Some(u), Some(p)) if !u.is_empty() && !p.is_empty() => Ok(()),
            _ => Err(BuildRequestError::RegistryLogin),
        },
        Some(t @ ("aws" | "gcp")) => Err(BuildRequestError::RegistryUnsupported(t.to_string())),
        _ => Err(BuildRequestError::RegistryUnknown),
    }
}

/// The local builder's `Dockerfile:<line>` as the step it came from.
fn step_error(message: &str, steps: &[JsonValue]) -> (String, Option<usize>) {
    let re = regex::Regex::new(r"^(?:build failed at )?Dockerfile:(\d+):? ?").expect("valid regex");
    let Some(c) = re.captures(message) else {
        return (message.to_string(), None);
    };
    let line: usize = c[1].parse().unwrap_or(0);
    let rest = &message[c[0].len()..];
    match line.checked_sub(1).filter(|n| (1..=steps.len()).contains(n)) {
        Some(n) => {
            let step = &steps[n - 1];
            let args = strs(step);
            let what = format!("{} {}", step["type"].as_str().unwrap_or(""), args.join(" "));
            let rest = match (step["type"].as_str(), args.first(), args.get(1).filter(|u| !u.is_empty())) {
                (Some("RUN"), Some(cmd), Some(user)) if no_such_user(rest, user) => {
                    // What E2B's builder (envd) answers; the SDK's tests look for it.
                    format!(
                        "failed to run command '{cmd}': command failed: unauthenticated: invalid username: '{user}'"
                    )
                }
                _ => rest.to_string(),
            };
            (format!("step {n} ({}) failed: {rest}", what.trim()), Some(n))
        }
        None => (format!("FROM: {rest}"), None),
    }
}

/// Whether a `RUN` as `user` failed because the image has no such user: runuser (which the
/// step runs through) said so, and nothing of the command ran.
fn no_such_user(rest: &str, user: &str) -> bool {
    let said = format!("runuser: user {user} does not exist");
    let mut lines = rest.lines();
    lines.next() == Some("the command exited with 1") && lines.any(|l| l.starts_with(&said))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_become_one_line_each() {
        let req = json!({"fromImage": "python:3.11", "steps": [
            {"type": "RUN", "args": ["a &&\n b"]},
            {"type": "ENV", "args": ["PATH", "/x:${PATH}", "A", "a b"]},
            {"type": "COPY", "args": ["a.py", "/app/", "", ""], "filesHash": "h"},
            {"type": "WORKDIR", "args": ["/app"]},
        ]});
        let d = dockerfile(&req).unwrap();
        let lines: Vec<&str> = d.lines().collect();
        assert_eq!(lines[0], "FROM python:3.11");
        assert_eq!(lines[1], r#"RUN ["/bin/sh","-c","a &&\n b"]"#);
        assert_eq!(lines[2], r#"ENV PATH=/x:${PATH} A="a b""#);
        assert_eq!(lines[3], "COPY a.py /app/");
        assert_eq!(lines.len(), 5);
        crate::templates::dockerfile::parse(&d).unwrap();
    }

    /// Issue 28 item 4: a request serve refuses says why by kind; the answer's text is as it was.
    #[test]
    fn refused_requests_have_kinds() {
        let step = |s: JsonValue| dockerfile(&json!({"steps": [{"type": "ENV", "args": ["A", "1"]}, s]})).unwrap_err();
        let e = step(json!({"type": "ENV", "args": ["A"]}));
        assert_eq!(e, BuildRequestError::Step { step: 2, kind: "ENV".into(), problem: StepProblem::NotPairs });
        assert_eq!(e.to_string(), "step 2 (ENV): needs name/value pairs");
        assert!(matches!(
            step(json!({"type": "RUN"})),
            BuildRequestError::Step { problem: StepProblem::NoCommand, .. }
        ));
        let e = step(json!({"type": "ADD", "args": ["a", "b"]}));
        assert_eq!(e.to_string(), "step 2 (ADD): unsupported step type `ADD`");
        let e = step(json!({"type": "COPY", "args": ["a\nb", "/x"]}));
        assert!(matches!(e, BuildRequestError::Step { problem: StepProblem::MultilineArguments, .. }), "{e:?}");
        assert_eq!(dockerfile(&json!({"fromImage": "a\nb"})), Err(BuildRequestError::MultilineFrom));

        let login = |r: JsonValue| check_registry(&json!({ "fromImageRegistry": r }));
        assert_eq!(login(json!(null)), Ok(()));
        assert_eq!(login(json!({"type": "registry", "username": "u", "password": "p"})), Ok(()));
        assert_eq!(login(json!({"type": "registry", "username": "u"})), Err(BuildRequestError::RegistryLogin));
        let e = login(json!({"type": "aws"})).unwrap_err();
        assert_eq!(e, BuildRequestError::RegistryUnsupported("aws".into()));
        assert_eq!(
            e.to_string(),
            "fromImageRegistry type `aws`: not supported by scenario-run serve (only `registry`, a username and password)"
        );
        assert_eq!(login(json!({"type": "x"})), Err(BuildRequestError::RegistryUnknown));

        assert_eq!(tag_part("name:v1"), Ok("v1".into()));
        assert_eq!(tag_part("v1"), Ok("v1".into()));
        assert_eq!(tag_part(":v1"), Err(TagError::Shape(":v1".into())));
        assert_eq!(tag_part("a:b:c").unwrap_err().to_string(), "invalid tag \"a:b:c\": expected `tag` or `name:tag`");
        assert_eq!(tag_part("a:b c"), Err(TagError::Characters("a:b c".into())));
        assert_eq!(tag_part("a:b c").unwrap_err().to_string(), "invalid tag \"a:b c\"");
    }

    #[test]
    fn builder_lines_name_the_step() {
        let steps = vec![json!({"type": "ENV", "args": ["A", "1"]}), json!({"type": "RUN", "args": ["exit 3"]})];
        let (m, s) = step_error("build failed at Dockerfile:3: the command exited with 3\nboom", &steps);
        assert_eq!(s, Some(2));
        assert!(m.starts_with("step 2 (RUN exit 3) failed: the command exited with 3"), "{m}");
        assert_eq!(step_error("other", &steps), ("other".to_string(), None));
    }

    /// A RUN as a user the image lacks fails as E2B's builder says it (the official SDK's
    /// test_run_command_as_user_that_does_not_exist looks for this text); runuser's words
    /// from any other exit, or for another user, are left alone.
    #[test]
    fn a_run_as_a_missing_user_answers_as_e2b() {
        let steps = vec![json!({"type": "RUN", "args": ["whoami", "root123"]})];
        let said = "runuser: user root123 does not exist or the user entry does not contain all the required fields";
        let (m, s) = step_error(&format!("build failed at Dockerfile:2: the command exited with 1\n{said}"), &steps);
        assert_eq!(s, Some(1));
        assert_eq!(
            m,
            "step 1 (RUN whoami root123) failed: failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'"
        );
        for other in [
            format!("build failed at Dockerfile:2: the command exited with 10\n{said}"),
            "build failed at Dockerfile:2: the command exited with 1\nrunuser: user root1234 does not exist".into(),
            "build failed at Dockerfile:2: the command exited with 1\nwhoami: cannot find name for user ID 5".into(),
        ] {
            let (m, _) = step_error(&other, &steps);
            assert!(m.starts_with("step 1 (RUN whoami root123) failed: the command exited with 1"), "{m}");
        }
        let as_root = vec![json!({"type": "RUN", "args": ["whoami"]})];
        let (m, _) = step_error(&format!("build failed at Dockerfile:2: the command exited with 1\n{said}"), &as_root);
        assert!(m.starts_with("step 1 (RUN whoami) failed: the command exited with 1"), "{m}");
    }
}

#[cfg(test)]
mod official_names {
    use super::*;

    /// A template built here under an official name does not take the name over: creates by
    /// the name go to the official template (built on the first), the built one by its ID.
    #[test]
    fn an_official_name_stays_the_official_templates() {
        let store = Store::new(std::env::temp_dir());
        store.inner.lock().unwrap().by_name.insert("code-interpreter-v1".into(), "tplbuilt123".into());
        store.inner.lock().unwrap().by_name.insert("mine".into(), "tplmine456".into());
        assert_eq!(store.resolve("code-interpreter-v1"), "code-interpreter-v1");
        assert_eq!(store.resolve("8d926meb1xzckz1a83ib"), "code-interpreter-v1");
        assert_eq!(store.resolve("tplbuilt123"), "tplbuilt123");
        assert_eq!(store.resolve("mine"), "tplmine456");
    }
}

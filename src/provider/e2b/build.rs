//! Template builds over the E2B "v2 build system" (protocol doc §8.1), as the SDK's
//! `Template.build()` does them:
//!
//! 1. `POST /v3/templates` `{name, cpuCount, memoryMB}` (from `template.yaml`) →
//!    `templateID`, `buildID`. Asking again with the same name gives the same template and a
//!    new build.
//! 2. The Dockerfile becomes `fromImage` plus `steps` (`plan`), as the SDK's
//!    `fromDockerfile` makes them: first `USER root` and `WORKDIR /` (Docker's defaults: the
//!    platform's own default user for template steps is `user`, and a Dockerfile's RUNs before
//!    its USER run as root), then RUN, COPY, ENV, WORKDIR and USER one to one, and at the end
//!    `USER user` and `WORKDIR /home/user` (E2B's defaults) unless the Dockerfile set them; ARGs (build args over their defaults) are substituted (in RUN
//!    commands textually, `$NAME`/`${NAME}`); FROM → `fromImage`; CMD and EXPOSE are dropped
//!    (`template.yaml`'s `start_command`/`ready_command` become `startCmd`/`readyCmd`). A
//!    COPY with several sources is one step per source.
//! 3. For each COPY: `GET /templates/{id}/files/{filesHash}`; when not present, a gzipped tar
//!    of the matched files (names relative to the template folder) is PUT to the returned
//!    URL with an exact `Content-Length` and without the API key (it is a presigned URL).
//! 4. `POST /v2/templates/{id}/builds/{buildID}`, then `GET …/status?logsOffset=N` every
//!    0.2 s, each log entry streamed to the build log; after `ready`/`error` polling goes on
//!    until no more entries come. `error` fails the step with `reason.message`; when
//!    `reason.step` (the 1-based index into `steps`) names a step, the error starts with the
//!    user's `Dockerfile:<line>` of the instruction it came from.
//!
//! `build` and `deploy`: `build` makes the template without a start command (the layer:
//! files, ENV, WORKDIR), registered under the template's name, so `create { template: <name> }`
//! starts nothing. `deploy` builds the same template again with `startCmd`/`readyCmd` (a new
//! build of the same template ID; the platform reuses its cached layers) and reports `cached`
//! when this provider built that digest before. Each digest is built once per provider
//! instance for each of the two; a `build` after a `deploy` of the same digest reuses the
//! deployed template (building again would drop its start command). `remove_builds` deletes (`DELETE /templates/{id}`) every
//! template this provider made that was not asked to be kept.
//!
//! On alicloud with an ACR registry configured, the image is built here and pushed first
//! (the `acr` module), and the template is built from it with no steps.
//!
//! [`build_from_image`] is the entry for images built elsewhere (e.g. pushed to Alibaba ACR):
//! `fromImage` with optional `fromImageRegistry` credentials and no steps. The registry
//! password is sent in the request body only; it never appears in a log or an error.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value as JsonValue};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::acr::AcrImages;
use super::api::{enc, Api, CallError, REQUEST_TIMEOUT};
use super::retry::Idempotency;
use crate::provider::{ErrorKind, ProviderError, Result};
use crate::templates::dockerfile::{Command, Inst, Seg, Word};
use crate::templates::{BuildSpec, TemplateDef};

/// The build request's field for template.yaml's `ready_timeout` (seconds): serve's extension
/// of `TemplateBuildStartV2`, sent only when the template sets it.
pub const READY_TIMEOUT_FIELD: &str = "x-scenario-run-ready-timeout";

/// Interval of status polls (the SDK's).
const POLL: Duration = Duration::from_millis(200);
/// How long one build may take.
const BUILD_TIMEOUT: Duration = Duration::from_secs(3600);
/// Upload timeout of one COPY context.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// Credentials for a private `fromImage` registry (`fromImageRegistry {"type":"registry"}`):
/// the image layer's, one type for every registry login.
pub use crate::image::RegistryAuth;

/// A COPY step's files: the hash the server keys them by and the paths to pack.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CopyFiles {
    pub hash: String,
    /// Relative to the template folder, sorted; directories included (for their modes).
    pub files: Vec<String>,
}

/// One step of the build and the Dockerfile instruction it came from.
#[derive(Debug, Clone)]
pub(crate) struct PlannedStep {
    pub json: JsonValue,
    pub line: u32,
    pub text: String,
    pub copy: Option<CopyFiles>,
}

/// The Dockerfile translated for the build API.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub from_image: String,
    pub steps: Vec<PlannedStep>,
}

/// `word` expanded from `vars`; variables not in `vars` stay as `${NAME}` for the remote
/// builder (e.g. `$PATH` of the base image), or take their `:-` default.
fn expand_known(word: &Word, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for seg in &word.0 {
        match seg {
            Seg::Lit(s) => out.push_str(s),
            Seg::Var { name, modifier } => {
                if vars.contains_key(name) {
                    out.push_str(&Word(vec![seg.clone()]).expand(vars));
                } else {
                    match modifier {
                        None => out.push_str(&format!("${{{name}}}")),
                        Some(('-', w)) => out.push_str(&expand_known(w, vars)),
                        Some(_) => {}
                    }
                }
            }
        }
    }
    out
}

/// `$NAME` and `${NAME}` of the ARGs in `args` replaced in a shell command.
fn subst_args(cmd: &str, args: &BTreeMap<String, String>) -> String {
    let re = regex::Regex::new(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))").expect("valid regex");
    re.replace_all(cmd, |c: &regex::Captures<'_>| {
        let name = c.get(1).or_else(|| c.get(2)).map_or("", |m| m.as_str());
        args.get(name).cloned().unwrap_or_else(|| c[0].to_string())
    })
    .into_owned()
}

/// Translates `spec`'s Dockerfile into `fromImage` and steps (see the module documentation).
pub(crate) fn plan(spec: &BuildSpec) -> Result<Plan> {
    let t = &spec.template;
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    let mut from_image = None;
    let mut steps = Vec::new();
    let vars = |args: &BTreeMap<String, String>, env: &BTreeMap<String, String>| {
        let mut v = args.clone();
        v.extend(env.clone());
        v
    };
    // Docker's defaults first, as the SDK's `fromDockerfile` does (see the module documentation).
    let from = t.dockerfile.instructions.iter().find(|i| matches!(i.inst, Inst::From { .. }));
    let (from_line, from_text) = from.map_or((1, "FROM".to_string()), |i| (i.line, i.text.clone()));
    for (ty, arg) in [("USER", "root"), ("WORKDIR", "/")] {
        let json = json!({"type": ty, "args": [arg], "force": false});
        steps.push(PlannedStep { json, line: from_line, text: from_text.clone(), copy: None });
    }
    let (mut user_set, mut workdir_set) = (false, false);
    for ins in &t.dockerfile.instructions {
        let at = format!("{}:{}", t.def.dockerfile, ins.line);
        user_set |= matches!(ins.inst, Inst::User(_));
        workdir_set |= matches!(ins.inst, Inst::Workdir(_));
        let mut push = |json: JsonValue, copy: Option<CopyFiles>| {
            steps.push(PlannedStep { json, line: ins.line, text: ins.text.clone(), copy })
        };
        match &ins.inst {
            Inst::From { image } => from_image = Some(image.expand(&args)),
            Inst::Arg { name, default } => {
                let v = spec.build_args.get(name).cloned().or_else(|| default.as_ref().map(|d| d.expand(&args)));
                if let Some(v) = v {
                    args.insert(name.clone(), v);
                }
            }
            Inst::Run(c) => {
                let line = match c {
                    Command::Shell(s) => subst_args(s, &args),
                    Command::Exec(_) => subst_args(&c.shell_line(), &args),
                };
                push(json!({"type": "RUN", "args": [line], "force": false}), None);
            }
            Inst::Env(pairs) => {
                let mut flat = Vec::new();
                for (k, w) in pairs {
                    let v = expand_known(w, &vars(&args, &env));
                    env.insert(k.clone(), v.clone());
                    flat.push(k.clone());
                    flat.push(v);
                }
                push(json!({"type": "ENV", "args": flat, "force": false}), None);
            }
            Inst::Workdir(w) => {
                push(json!({"type": "WORKDIR", "args": [expand_known(w, &vars(&args, &env))], "force": false}), None)
            }
            Inst::User(w) => {
                push(json!({"type": "USER", "args": [expand_known(w, &vars(&args, &env))], "force": false}), None)
            }
            Inst::Copy { sources, dest, ignored_flags } => {
                let v = vars(&args, &env);
                let mut dest = expand_known(dest, &v);
                if sources.len() > 1 && !dest.ends_with('/') {
                    dest.push('/');
                }
                let flag = |name: &str| {
                    ignored_flags
                        .iter()
                        .find_map(|f| f.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
                        .unwrap_or("")
                        .to_string()
                };
                let (user, mode) = (flag("--chown"), flag("--chmod"));
                for s in sources {
                    let src = expand_known(s, &v);
                    let files = copy_files(&t.dir, &src, &at)?;
                    let hash = files_hash(&t.dir, &src, &dest, &files)?;
                    push(
                        json!({"type": "COPY", "args": [src, dest, user, mode], "filesHash": hash, "force": false}),
                        Some(CopyFiles { hash, files }),
                    );
                }
            }
            Inst::Cmd(_) | Inst::Expose(_) => {}
        }
    }
    // Then E2B's defaults, for what the Dockerfile left as Docker's.
    let last = t.dockerfile.instructions.last().map_or(from_line, |i| i.line);
    for (set, ty, arg) in [(user_set, "USER", "user"), (workdir_set, "WORKDIR", "/home/user")] {
        if !set {
            let json = json!({"type": ty, "args": [arg], "force": false});
            steps.push(PlannedStep { json, line: last, text: format!("{ty} {arg} (E2B's default)"), copy: None });
        }
    }
    let from_image = from_image
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ProviderError::invalid(format!("{}: no FROM image", t.def.dockerfile)))?;
    Ok(Plan { from_image, steps })
}

/// The files a COPY source matches (globs expanded), relative to `dir`, with everything
/// below matched directories; each must stay inside the folder.
fn copy_files(dir: &Path, src: &str, at: &str) -> Result<Vec<String>> {
    let root = dir.canonicalize().map_err(|e| ProviderError::infra(format!("{}: {e}", dir.display())))?;
    let rel = src.trim_start_matches("./").trim_end_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    let matches: Vec<PathBuf> = if rel.contains(['*', '?', '[']) {
        glob::glob(&root.join(rel).display().to_string())
            .map_err(|e| ProviderError::invalid(format!("{at}: COPY {src}: {e}")))?
            .filter_map(|p| p.ok())
            .collect()
    } else {
        vec![root.join(rel)]
    };
    let missing = || ProviderError::invalid(format!("{at}: COPY {src}: no such file in {}", dir.display()));
    if matches.is_empty() {
        return Err(missing());
    }
    let mut out = Vec::new();
    for m in matches {
        let real = m.canonicalize().map_err(|_| missing())?;
        let inside = real
            .strip_prefix(&root)
            .map_err(|_| ProviderError::invalid(format!("{at}: COPY {src}: outside the template folder")))?
            .to_path_buf();
        let mut stack = vec![inside];
        while let Some(p) = stack.pop() {
            let full = root.join(&p);
            if !p.as_os_str().is_empty() {
                out.push(p.display().to_string());
            }
            if full.is_dir() {
                for e in
                    std::fs::read_dir(&full).map_err(|e| ProviderError::infra(format!("{}: {e}", full.display())))?
                {
                    let e = e.map_err(|e| ProviderError::infra(e.to_string()))?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name != "__pycache__" && !name.ends_with(".pyc") {
                        stack.push(p.join(name));
                    }
                }
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// sha256 over `COPY src dest`, then each file's relative path, mode and size (directories:
/// mode only) and symlink target or content. Opaque to the server.
fn files_hash(dir: &Path, src: &str, dest: &str, files: &[String]) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut h = Sha256::new();
    h.update(format!("COPY {src} {dest}"));
    for rel in files {
        let p = dir.join(rel);
        let meta = std::fs::symlink_metadata(&p).map_err(|e| ProviderError::infra(format!("{}: {e}", p.display())))?;
        h.update(rel.as_bytes());
        h.update(format!("{:o}", meta.permissions().mode()));
        if meta.file_type().is_symlink() {
            h.update(
                std::fs::read_link(&p).map_err(|e| ProviderError::infra(e.to_string()))?.to_string_lossy().as_bytes(),
            );
        } else if meta.is_file() {
            h.update(meta.len().to_string());
            h.update(std::fs::read(&p).map_err(|e| ProviderError::infra(format!("{}: {e}", p.display())))?);
        }
    }
    Ok(format!("{:x}", h.finalize()))
}

/// A gzipped tar of `files` (names relative to `dir`).
fn tar_gz(dir: &Path, files: &[String]) -> Result<Vec<u8>> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    for rel in files {
        let p = dir.join(rel);
        if p.is_dir() && !p.is_symlink() { tar.append_dir(rel, &p) } else { tar.append_path_with_name(&p, rel) }
            .map_err(|e| ProviderError::infra(format!("cannot pack {}: {e}", p.display())))?;
    }
    let gz = tar.into_inner().map_err(|e| ProviderError::infra(format!("cannot pack: {e}")))?;
    gz.finish().map_err(|e| ProviderError::infra(format!("cannot pack: {e}")))
}

/// What a finished remote build gave.
#[derive(Debug, Clone)]
pub(crate) struct Built {
    pub template_id: String,
}

/// Builds made by one provider: by digest, for `build` and `deploy`, and every template ID
/// made (with whether it is kept) for `remove_builds`.
#[derive(Default)]
pub(crate) struct Builds {
    layers: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Built>>>>,
    deploys: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Built>>>>,
    made: Mutex<HashMap<String, bool>>,
    /// Images built here and pushed to ACR, instead of steps built remotely (alicloud).
    acr: Option<AcrImages>,
}

/// The Dockerfile's path as the user knows it (relative to the working directory if inside).
fn dockerfile_path(spec: &BuildSpec) -> String {
    let p = spec.template.dir.join(&spec.template.def.dockerfile);
    let cwd = std::env::current_dir().unwrap_or_default();
    p.strip_prefix(&cwd).unwrap_or(&p).display().to_string()
}

impl Builds {
    pub fn new(acr: Option<AcrImages>) -> Self {
        Self { acr, ..Self::default() }
    }

    /// `build` (`deploy == false`) or `deploy` of `spec`: the remote build of its digest, made
    /// now or earlier by this provider. Returns it and whether it was reused.
    pub async fn get(
        &self,
        api: &Api,
        spec: &BuildSpec,
        deploy: bool,
        log: &mpsc::UnboundedSender<String>,
    ) -> Result<(Built, bool)> {
        let digest = spec.template.digest.clone();
        if !deploy && !spec.skip_cache {
            // Building again without the start command would take it off the deployed template.
            let deployed = self.deploys.lock().expect("builds").get(&digest).and_then(|c| c.get().cloned());
            if let Some(d) = deployed {
                let _ = log.send(format!(
                    "cached: {} ({digest}) was deployed before as {}",
                    spec.template.def.name, d.template_id
                ));
                return Ok((d, true));
            }
        }
        let had_layer = self.layers.lock().expect("builds").get(&digest).is_some_and(|c| c.initialized());
        let map = if deploy { &self.deploys } else { &self.layers };
        // skip_cache: a cell of its own (which then stands for the digest), and `force`.
        let cell = if spec.skip_cache {
            let _ = log.send("skip_cache: building again with `force`, reusing no earlier build".to_string());
            Default::default()
        } else {
            map.lock().expect("builds").entry(digest.clone()).or_default().clone()
        };
        let mut fresh = false;
        let built = cell
            .get_or_try_init(|| async {
                fresh = true;
                let (plan, registry, dockerfile) = match &self.acr {
                    Some(acr) => {
                        let image = acr.image(spec, log).await?;
                        let auth = acr.registry_auth(log).await?;
                        (Plan { from_image: image, steps: Vec::new() }, auth, "(image)".to_string())
                    }
                    None => (plan(spec)?, None, dockerfile_path(spec)),
                };
                let def = &spec.template.def;
                let (start, ready) =
                    if deploy { (def.start_command.clone(), def.ready_command.clone()) } else { (None, None) };
                let _ = log.send(format!(
                    "building template {} ({digest}) on {}: fromImage {}, {} steps{}",
                    def.name,
                    api.cfg.preset.name(),
                    plan.from_image,
                    plan.steps.len(),
                    if deploy { ", with the start and ready commands" } else { "" }
                ));
                let r = remote_build(
                    api,
                    def,
                    &spec.template.dir,
                    &plan,
                    registry.as_ref(),
                    start.as_deref(),
                    ready.as_deref(),
                    &dockerfile,
                    spec.skip_cache,
                    log,
                    |id| self.record(id, spec.keep),
                )
                .await?;
                Ok::<_, ProviderError>(r)
            })
            .await?
            .clone();
        if spec.skip_cache {
            map.lock().expect("builds").insert(digest.clone(), cell);
            return Ok((built, false));
        }
        if !fresh {
            let _ = log.send(format!(
                "cached: {} ({digest}) was built before as {}",
                spec.template.def.name, built.template_id
            ));
        }
        Ok((built, !fresh || (deploy && had_layer)))
    }

    /// Notes a template made outside [`Builds::get`] (kept or not).
    pub fn record(&self, id: &str, keep: bool) {
        self.made.lock().expect("made").entry(id.to_string()).and_modify(|k| *k |= keep).or_insert(keep);
    }

    /// Deletes every template made that is not kept; returns how many were deleted.
    pub async fn remove(&self, api: &Api) -> usize {
        if let Some(acr) = &self.acr {
            acr.remove_local().await;
        }
        let made: Vec<(String, bool)> = self.made.lock().expect("made").drain().collect();
        self.layers.lock().expect("builds").clear();
        self.deploys.lock().expect("builds").clear();
        let mut n = 0;
        for (id, keep) in made {
            if !keep && delete_template(api, &id).await.unwrap_or(false) {
                n += 1;
            }
        }
        n
    }
}

/// `DELETE /templates/{id}`: false if it did not exist.
pub(crate) async fn delete_template(api: &Api, id: &str) -> Result<bool> {
    let what = format!("delete template {id}");
    match api
        .call(Method::DELETE, &format!("/templates/{}", enc(id)), None, Idempotency::Idempotent, REQUEST_TIMEOUT, &what)
        .await
    {
        Ok(_) => Ok(true),
        Err(CallError::Status(f)) if f.status == 404 => Ok(false),
        Err(CallError::Status(f)) => Err(api.status_error(&what, &f)),
        Err(CallError::Other(e)) => Err(e),
    }
}

fn err(api: &Api, what: &str, e: CallError) -> ProviderError {
    match e {
        CallError::Status(f) => api.status_error(what, &f),
        CallError::Other(e) => e,
    }
}

fn parse(api: &Api, what: &str, body: &[u8]) -> Result<JsonValue> {
    serde_json::from_slice(body).map_err(|e| {
        ProviderError::infra(format!("{what}: unexpected answer ({e}): {}", api.scrub(&String::from_utf8_lossy(body))))
    })
}

/// A template from an image built elsewhere (`fromImage`, optionally with registry
/// credentials, no steps), with `def`'s resources and start/ready commands. Returns the
/// template ID. The caller owns the template (delete it with `DELETE /templates/{id}`).
pub async fn build_from_image(
    api: &Api,
    image: &str,
    registry: Option<&RegistryAuth>,
    def: &TemplateDef,
    log: &mpsc::UnboundedSender<String>,
) -> Result<String> {
    let plan = Plan { from_image: image.to_string(), steps: Vec::new() };
    let _ = log.send(format!("building template {} from image {image}", def.name));
    let built = remote_build(
        api,
        def,
        Path::new("."),
        &plan,
        registry,
        def.start_command.as_deref(),
        def.ready_command.as_deref(),
        "(image)",
        false,
        log,
        |_| {},
    )
    .await?;
    Ok(built.template_id)
}

/// The whole §8.1 flow for one build; `made` learns the template ID as soon as it exists.
#[allow(clippy::too_many_arguments)]
async fn remote_build(
    api: &Api,
    def: &TemplateDef,
    dir: &Path,
    plan: &Plan,
    registry: Option<&RegistryAuth>,
    start: Option<&str>,
    ready: Option<&str>,
    dockerfile: &str,
    force: bool,
    log: &mpsc::UnboundedSender<String>,
    made: impl FnOnce(&str),
) -> Result<Built> {
    let mut req = json!({ "name": def.name });
    if let Some(c) = def.cpu {
        req["cpuCount"] = json!(c);
    }
    if let Some(m) = def.memory {
        req["memoryMB"] = json!(m);
    }
    let what = format!("create template {}", def.name);
    let (_, body, _) = api
        .call(Method::POST, "/v3/templates", Some(&req), Idempotency::Refused, REQUEST_TIMEOUT, &what)
        .await
        .map_err(|e| err(api, &what, e))?;
    let created = parse(api, &what, &body)?;
    let (Some(id), Some(build_id)) = (created["templateID"].as_str(), created["buildID"].as_str()) else {
        return Err(ProviderError::infra(format!("{what}: the answer has no templateID/buildID")));
    };
    let (id, build_id) = (id.to_string(), build_id.to_string());
    made(&id);
    // Text from the server never carries the key or the registry password (nor its encodings).
    let login_masker = super::acr::masker(registry);
    let clean = |s: &str| login_masker.mask(&api.scrub(s)).into_owned();
    let _ = log.send(format!("template {id}, build {build_id}"));

    // COPY contexts the server does not have yet.
    for step in &plan.steps {
        let Some(copy) = &step.copy else { continue };
        let what = format!("check the files of `{}`", step.text);
        let path = format!("/templates/{}/files/{}", enc(&id), enc(&copy.hash));
        let (_, body, _) = api
            .call(Method::GET, &path, None, Idempotency::Idempotent, REQUEST_TIMEOUT, &what)
            .await
            .map_err(|e| err(api, &what, e))?;
        let answer = parse(api, &what, &body)?;
        if answer["present"].as_bool() == Some(true) {
            let _ = log.send(format!("files of `{}` are on the server already", step.text));
            continue;
        }
        let Some(url) = answer["url"].as_str() else { continue };
        let data = tar_gz(dir, &copy.files)?;
        let _ = log.send(format!("uploading {} files ({} bytes) for `{}`", copy.files.len(), data.len(), step.text));
        let mut rb =
            api.http.put(url).header(reqwest::header::CONTENT_LENGTH, data.len()).timeout(UPLOAD_TIMEOUT).body(data);
        if let Some(h) = answer["headers"].as_object() {
            for (k, v) in h {
                if let Some(v) = v.as_str() {
                    rb = rb.header(k.as_str(), v);
                }
            }
        }
        // The presigned URL is a credential: keep it out of the error.
        let resp = rb.send().await.map_err(|e| {
            let e = e.without_url();
            ProviderError::infra(format!(
                "upload of `{}` failed: {}",
                step.text,
                api.scrub(&super::api::error_chain(&e))
            ))
        })?;
        if !resp.status().is_success() {
            return Err(ProviderError::infra(format!("upload of `{}` failed: {}", step.text, resp.status())));
        }
    }

    let mut start_body = json!({
        "fromImage": plan.from_image,
        "force": force,
        "steps": plan.steps.iter().map(|s| s.json.clone()).collect::<Vec<_>>(),
    });
    if let Some(r) = registry {
        start_body["fromImageRegistry"] = json!({"type": "registry", "username": r.username, "password": r.password});
    }
    if let Some(s) = start {
        start_body["startCmd"] = json!(s);
    }
    if let Some(r) = ready {
        start_body["readyCmd"] = json!(r);
        // Not E2B's (its bound is the platform's): only a template.yaml that sets
        // ready_timeout sends it, and serve honours it.
        if let Some(t) = def.ready_timeout {
            start_body[READY_TIMEOUT_FIELD] = json!(t.as_secs_f64());
        }
    }
    let what = format!("start build {build_id} of template {id}");
    api.call(
        Method::POST,
        &format!("/v2/templates/{}/builds/{}", enc(&id), enc(&build_id)),
        Some(&start_body),
        Idempotency::Refused,
        REQUEST_TIMEOUT,
        &what,
    )
    .await
    .map_err(|e| err(api, &what, e))?;

    // Poll until done and the log is drained.
    let deadline = tokio::time::Instant::now() + BUILD_TIMEOUT;
    let mut offset = 0usize;
    // The last lines of the log, for a failure the platform gives no reason for.
    let mut recent: std::collections::VecDeque<String> = Default::default();
    let what = format!("status of build {build_id} of template {id}");
    loop {
        let path = format!("/templates/{}/builds/{}/status?logsOffset={offset}&limit=100", enc(&id), enc(&build_id));
        let body = match api.call(Method::GET, &path, None, Idempotency::Idempotent, REQUEST_TIMEOUT, &what).await {
            Ok((_, body, _)) => body,
            Err(e) => {
                let e = err(api, &what, e);
                // A poll that got no answer is no news: poll again until the build deadline.
                if e.kind == ErrorKind::Timeout && tokio::time::Instant::now() < deadline {
                    let _ = log.send(format!("{what}: no answer yet, polling again"));
                    continue;
                }
                return Err(e);
            }
        };
        let info = parse(api, &what, &body)?;
        let entries = info["logEntries"].as_array().cloned().unwrap_or_default();
        offset += entries.len();
        for e in &entries {
            if let Some(m) = e["message"].as_str() {
                let m = clean(m);
                if recent.len() == REASON_LINES {
                    recent.pop_front();
                }
                recent.push_back(m.clone());
                let _ = log.send(m);
            }
        }
        let status = info["status"].as_str().unwrap_or("building");
        if matches!(status, "ready" | "error") && entries.is_empty() {
            if status == "ready" {
                let _ = log.send(format!("build {build_id} of template {id} finished"));
                return Ok(Built { template_id: id });
            }
            let message = clean(&failure_reason(&info["reason"], recent.make_contiguous()));
            return Err(build_error(&message, &info["reason"], plan, dockerfile));
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProviderError::new(
                ErrorKind::Timeout,
                format!("build {build_id} of template {id} did not finish within {}s", BUILD_TIMEOUT.as_secs()),
            ));
        }
        if entries.is_empty() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How many of the last log lines stand in for a reason the platform did not give.
const REASON_LINES: usize = 5;

/// Why a build failed: `reason.message`, with `reason.logEntries` the message does not repeat;
/// without a message, the build's last log lines (E2B #1009: a build failing without its
/// reason).
fn failure_reason(reason: &JsonValue, recent: &[String]) -> String {
    let message = reason["message"].as_str().map(str::trim).unwrap_or("");
    let entries: Vec<&str> = reason["logEntries"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["message"].as_str().or_else(|| e.as_str())).collect())
        .unwrap_or_default();
    let extra: Vec<&str> = entries.iter().copied().filter(|e| !e.is_empty() && !message.contains(e)).collect();
    let extra = &extra[extra.len().saturating_sub(REASON_LINES)..];
    match (message.is_empty(), extra.is_empty()) {
        (false, true) => message.to_string(),
        (false, false) => format!("{message}\n{}", extra.join("\n")),
        (true, false) => extra.join("\n"),
        (true, true) if recent.is_empty() => "the build failed, and the platform gave no reason and no log".into(),
        (true, true) => format!("the build failed without a reason; its last log lines:\n{}", recent.join("\n")),
    }
}

/// `reason` of a failed build as an error; a step it names is mapped back to its Dockerfile
/// line (`templates/x/Dockerfile:7: RUN …: <message>`).
fn build_error(message: &str, reason: &JsonValue, plan: &Plan, dockerfile: &str) -> ProviderError {
    let message = message.to_string();
    let by_index =
        |s: &str| s.trim().parse::<usize>().ok().and_then(|n| n.checked_sub(1)).and_then(|i| plan.steps.get(i));
    let step = match &reason["step"] {
        JsonValue::String(s) => by_index(s),
        JsonValue::Number(n) => by_index(&n.to_string()),
        _ => None,
    }
    .or_else(|| {
        // No step field: a message naming a step ("step 3 …").
        let re = regex::Regex::new(r"\bstep (\d+)\b").expect("valid regex");
        re.captures(&message).and_then(|c| by_index(&c[1]))
    });
    match step {
        Some(s) => {
            // "step 3 (RUN …) failed: why" says again what the Dockerfile line says.
            let n = plan.steps.iter().position(|p| std::ptr::eq(p, s)).map_or(0, |i| i + 1);
            let why = message
                .strip_prefix(&format!("step {n} ("))
                .and_then(|r| r.find(") failed: ").map(|i| &r[i + ") failed: ".len()..]))
                .unwrap_or(&message);
            ProviderError::invalid(format!("build failed at {dockerfile}:{}: {}: {why}", s.line, s.text))
        }
        None => ProviderError::invalid(format!("build failed: {message}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::templates::TemplateDir;

    fn spec(files: &[(&str, &str)]) -> (tempfile::TempDir, BuildSpec) {
        let dir = tempfile::tempdir().unwrap();
        for (p, c) in files {
            let p = dir.path().join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        let template = TemplateDir::load(dir.path()).unwrap();
        (
            dir,
            BuildSpec {
                template,
                build_args: BTreeMap::from([("V".into(), "9".into())]),
                keep: false,
                skip_cache: false,
                from_auth: None,
            },
        )
    }

    #[test]
    fn dockerfiles_become_steps() {
        let (_d, s) = spec(&[
            (
                "Dockerfile",
                "ARG BASE=python:3.11-slim\nFROM ${BASE}\nARG V=1\nRUN echo $V ${V} $HOME\n\
                 ENV PATH=/opt/bin:$PATH A=$V\nWORKDIR /app\nCOPY a.py app/ /app/\nUSER user\nCMD [\"x\"]\n",
            ),
            ("a.py", "print(1)\n"),
            ("app/b.py", "print(2)\n"),
        ]);
        let p = plan(&s).unwrap();
        assert_eq!(p.from_image, "python:3.11-slim");
        let js: Vec<&JsonValue> = p.steps.iter().map(|s| &s.json).collect();
        // Docker's defaults first, as the SDK's fromDockerfile: RUNs before USER run as root.
        assert_eq!((&js[0]["type"], &js[0]["args"]), (&json!("USER"), &json!(["root"])));
        assert_eq!((&js[1]["type"], &js[1]["args"]), (&json!("WORKDIR"), &json!(["/"])));
        let js = &js[2..];
        assert_eq!(js[0]["args"], json!(["echo 9 9 $HOME"]));
        assert_eq!(js[1]["args"], json!(["PATH", "/opt/bin:${PATH}", "A", "9"]));
        assert_eq!(js[2]["type"], "WORKDIR");
        assert_eq!(js[3]["args"], json!(["a.py", "/app/", "", ""]));
        assert_eq!(js[4]["args"], json!(["app/", "/app/", "", ""]));
        assert_eq!(p.steps[6].copy.as_ref().unwrap().files, ["app", "app/b.py"]);
        assert_eq!(js[5]["args"], json!(["user"]));
        assert_eq!(p.steps.len(), 8, "CMD is dropped; USER and WORKDIR were set, so no E2B defaults follow");
        assert_eq!((p.steps[2].line, p.steps[5].line, p.steps[6].line), (4, 7, 7));
        assert_ne!(js[3]["filesHash"], js[4]["filesHash"]);
        // A Dockerfile that sets neither ends with E2B's defaults.
        let (_d2, s2) = spec(&[("Dockerfile", "FROM x\nRUN true\n")]);
        let tail: Vec<JsonValue> = plan(&s2).unwrap().steps[3..].iter().map(|s| s.json["args"].clone()).collect();
        assert_eq!(tail, [json!(["user"]), json!(["/home/user"])]);
    }

    #[test]
    fn files_hash_follows_content() {
        let (d, s) = spec(&[("Dockerfile", "FROM x\nCOPY a.py /a.py\n"), ("a.py", "1")]);
        let h1 = plan(&s).unwrap().steps[2].copy.clone().unwrap().hash;
        std::fs::write(d.path().join("a.py"), "2").unwrap();
        let h2 = plan(&s).unwrap().steps[2].copy.clone().unwrap().hash;
        assert_ne!(h1, h2);
        let gz = tar_gz(d.path(), &["a.py".into()]).unwrap();
        let mut a = tar::Archive::new(flate2::read::GzDecoder::new(&gz[..]));
        let names: Vec<String> =
            a.entries().unwrap().map(|e| e.unwrap().path().unwrap().display().to_string()).collect();
        assert_eq!(names, ["a.py"]);
    }

    #[test]
    fn a_failed_build_says_why_even_without_a_reason_message() {
        let lines = ["step 2 ok".to_string(), "ready command exited 3: port-not-open".to_string()];
        assert_eq!(failure_reason(&json!({"message": "boom"}), &lines), "boom");
        assert_eq!(
            failure_reason(
                &json!({"message": "boom", "logEntries": [{"message": "boom"}, {"message": "why: disk"}]}),
                &lines
            ),
            "boom\nwhy: disk"
        );
        assert_eq!(failure_reason(&json!({"logEntries": [{"message": "why: disk"}]}), &lines), "why: disk");
        let m = failure_reason(&JsonValue::Null, &lines);
        assert!(m.starts_with("the build failed without a reason") && m.ends_with("port-not-open"), "{m}");
        assert!(failure_reason(&json!({"message": " "}), &[]).contains("no reason and no log"));
    }

    #[test]
    fn a_failed_step_points_at_the_users_line() {
        let (_d, s) = spec(&[("Dockerfile", "FROM x\nENV A=1\n\nRUN exit 3\n")]);
        let p = plan(&s).unwrap();
        // (steps 1 and 2 are Docker's defaults, USER root and WORKDIR /)
        let why = "step 4 (RUN exit 3) failed: the command exited with 3";
        let e = build_error(why, &json!({"step": "4"}), &p, "t/Dockerfile");
        assert_eq!(e.message, "build failed at t/Dockerfile:4: RUN exit 3: the command exited with 3");
        // Without `step`, a message naming the step is enough; without either, no line.
        assert!(build_error(why, &json!({}), &p, "t/Dockerfile").message.contains("t/Dockerfile:4"));
        assert_eq!(build_error("no space", &json!({}), &p, "D").message, "build failed: no space");
    }

    #[test]
    fn registry_auth_debug_hides_the_password() {
        let r = RegistryAuth { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{r:?}").contains("hunter2"));
    }
}

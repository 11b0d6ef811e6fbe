//! Template builds on the docker provider: a real `docker build` through the Engine API.
//!
//! The template folder is sent as the build context (a tar made in memory) to `POST /build`
//! with the **legacy builder** (the local stack's `docker` has no buildx), `networkmode=host`
//! (the only network the stack has; RUN reaches PyPI and npm through it) and the spec's build
//! args. The image is tagged `<registry>/<name>:<first 12 hex of the digest>` and pushed to the
//! registry (the local stack's needs no credentials).
//!
//! `FROM` a public name of the offline table (`python:3.11-slim-bookworm`, `node:22-bookworm-slim`,
//! `e2bdev/base`, …; see `crate::image`) that the engine lacks: the offline image the local
//! provider uses is imported into the engine under that name (once per digest), so the build
//! never needs Docker Hub and the image is the same on both providers. The Dockerfile is built
//! as it is: build args are the scenario's `args`, nothing is rewritten.
//!
//! The build log is streamed line by line. The legacy builder announces every instruction
//! as `Step N/M : ...`, counting an `ARG` before `FROM` like any other, so step N is the N-th
//! parsed instruction; a failing step is reported at its Dockerfile line
//! (`templates/x/Dockerfile:7: RUN ... exited with 3`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;

use bollard::auth::DockerCredentials;
use bollard::query_parameters::{BuildImageOptionsBuilder, PushImageOptionsBuilder, RemoveImageOptionsBuilder};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::api::api_err;
use crate::provider::registered::BuildLog;
use crate::provider::{ProviderError, Result};
use crate::templates::dockerfile::Inst;
use crate::templates::BuildSpec;

/// A finished build: what `create` needs to start containers from it.
#[derive(Debug, Clone)]
pub(crate) struct Image {
    pub name: String,
    pub digest: String,
    /// `<registry>/<name>:<digest12>` when kept, else `<registry>/<name>:<digest12>-<run tag>`.
    pub tag: String,
    /// WORKDIR of the image (the default cwd of commands in sandboxes made from it).
    pub workdir: Option<String>,
    /// CMD, as a shell command line (the start command when the template has none).
    pub cmd: Option<String>,
    pub ports: Vec<u16>,
    pub log: Vec<String>,
    pub keep: bool,
}

/// `<registry>/<name>:<first 12 hex digits of the digest>`, the name made a valid repository.
pub(crate) fn image_tag(registry: &str, name: &str, digest: &str) -> String {
    let clean: String = name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '-' })
        .collect();
    let hex = digest.trim_start_matches("sha256:");
    format!("{}/{clean}:{}", registry.trim_end_matches('/'), &hex[..hex.len().min(12)])
}

/// The build args sent to the engine: the scenario's `args`.
pub(crate) fn build_args(spec: &BuildSpec) -> HashMap<String, String> {
    spec.build_args.clone().into_iter().collect()
}

/// The image `FROM` names once the build args sent to the engine are applied.
pub(crate) fn from_image(spec: &BuildSpec, args: &HashMap<String, String>) -> Option<String> {
    let mut vals: BTreeMap<String, String> = BTreeMap::new();
    for ins in &spec.template.dockerfile.instructions {
        match &ins.inst {
            Inst::Arg { name, default } => {
                if let Some(v) = args.get(name).cloned().or_else(|| default.as_ref().map(|d| d.expand(&vals))) {
                    vals.insert(name.clone(), v);
                }
            }
            Inst::From { image } => return Some(image.expand(&vals)),
            _ => {}
        }
    }
    None
}

/// When the engine lacks `from` and it is in the offline table (Docker Hub is unreachable),
/// the offline image the local provider uses is imported under that name (once per
/// digest), so the build finds it locally. Images the engine has, and other names, are left
/// to the engine.
async fn offline_from(docker: &Docker, from: &str, log: &mut BuildLog) -> Result<()> {
    if let Ok(img) = docker.inspect_image(from).await {
        let id = img.id.unwrap_or_default();
        log.line(format!("FROM {from} maps to the engine's image {}", &id[..id.len().min(19)]));
        return Ok(());
    }
    let Some(recipe) = crate::image::offline_recipe(from) else {
        log.line(format!("FROM {from}: not on the engine; the engine pulls it"));
        return Ok(());
    };
    let t0 = Instant::now();
    log.line(format!(
        "FROM {from}: not on the engine; using the offline image {} (see docs/reference.md, Images)",
        recipe.name
    ));
    let store = crate::image::ImageStore::shared();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let got = {
        let get = store.get(from, None, &tx);
        tokio::pin!(get);
        loop {
            tokio::select! {
                r = &mut get => break r,
                Some(l) = rx.recv() => log.line(l),
            }
        }
    };
    drop(tx);
    while let Ok(l) = rx.try_recv() {
        log.line(l);
    }
    let context = format!("use the offline image for FROM {from}");
    let rootfs = got.map_err(|e| ProviderError::from(e.context(&context)))?;
    let imported = crate::image::docker::ensure(docker, &rootfs, store.ids(), from)
        .await
        .map_err(|e| ProviderError::from(e.context(&context)))?;
    let how = if imported { "imported into the engine" } else { "already on the engine" };
    log.line(format!(
        "FROM {from} maps to {} ({}) {how}, tagged {from}, in {:.1}s",
        rootfs.resolved,
        &rootfs.digest[..rootfs.digest.len().min(19)],
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The build context: the template folder as a tar (symlinks kept as links).
fn context_tar(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)?;
    b.into_inner()
}

/// `Step 12/15 : RUN ...` → 12.
fn step_number(line: &str) -> Option<usize> {
    let rest = line.strip_prefix("Step ")?;
    let (n, _) = rest.split_once('/')?;
    n.trim().parse().ok()
}

/// ` ---> 87b4a12cb924` (the image a finished step made) → its id.
fn layer_id(line: &str) -> Option<&str> {
    let id = line.trim().strip_prefix("---> ")?.trim();
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// Builds `spec` as `tag` and pushes it, with `auth` if the registry needs it.
pub(crate) async fn build(
    docker: &Docker,
    spec: &BuildSpec,
    tag: &str,
    auth: Option<DockerCredentials>,
    tx: mpsc::UnboundedSender<String>,
) -> Result<Image> {
    let started = Instant::now();
    let t = &spec.template;
    let mut log = BuildLog::new(tx);
    let df_path = t.dir.join(&t.def.dockerfile).display().to_string();
    log.line(format!("building template {} ({}) from {} as {tag}", t.def.name, t.digest, t.dir.display()));
    let args = build_args(spec);
    if let Some(from) = from_image(spec, &args) {
        offline_from(docker, &from, &mut log).await?;
    }
    let dir = t.dir.clone();
    let tar = tokio::task::spawn_blocking(move || context_tar(&dir))
        .await
        .map_err(|e| ProviderError::infra(e.to_string()))?
        .map_err(|e| ProviderError::infra(format!("cannot pack {}: {e}", t.dir.display())))?;
    let opts = BuildImageOptionsBuilder::default()
        .dockerfile(&t.def.dockerfile)
        .t(tag)
        .rm(true)
        .forcerm(true)
        .nocache(spec.skip_cache)
        .networkmode("host")
        .buildargs(&args)
        .labels(&labels(spec))
        .build();
    let mut stream = docker.build_image(opts, None, Some(bollard::body_full(tar.into())));
    let mut step: Option<usize> = None;
    let mut tail: Vec<String> = Vec::new();
    let mut partial = String::new();
    let mut failure: Option<String> = None;
    // The image of the last step that finished: after a failure it is untagged and would stay.
    let mut last_layer: Option<String> = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(s) = info.stream {
                    partial.push_str(&s);
                    while let Some(nl) = partial.find('\n') {
                        let l: String = partial.drain(..=nl).collect();
                        let l = l.trim_end_matches(['\n', '\r']).to_string();
                        if let Some(id) = layer_id(&l) {
                            last_layer = Some(id.to_string());
                        }
                        if let Some(n) = step_number(&l) {
                            step = Some(n);
                            tail.clear();
                        } else if !l.trim().is_empty() {
                            tail.push(l.clone());
                            if tail.len() > 5 {
                                tail.remove(0);
                            }
                        }
                        log.line(l);
                    }
                }
                if let Some(d) = info.error_detail {
                    failure = Some(d.message.unwrap_or_else(|| "the build failed".into()));
                }
            }
            Err(bollard::errors::Error::DockerStreamError { error }) => failure = Some(error),
            Err(e) => failure = Some(api_err(e, "build the image").message),
        }
        if failure.is_some() {
            break;
        }
    }
    if !partial.trim().is_empty() {
        log.line(partial.trim_end().to_string());
    }
    if let Some(msg) = failure {
        log.line(format!("error: {msg}"));
        if let Some(id) = last_layer {
            // Not forced: an image another build still uses (a cache hit) is refused, and stays.
            let opts = RemoveImageOptionsBuilder::default().force(false).build();
            if docker.remove_image(&id, Some(opts), None).await.is_ok() {
                log.line(format!("removed {id}, the last layer of the failed build"));
            }
        }
        let at = step.and_then(|n| t.dockerfile.instructions.get(n.wrapping_sub(1)));
        let tail = tail.join("\n");
        return Err(match at {
            Some(ins) => {
                let how = exit_code(&msg).map_or_else(|| msg.clone(), |c| format!("exited with {c}"));
                ProviderError::invalid(format!("{df_path}:{}: {} {how} (build failed)\n{tail}", ins.line, ins.text))
            }
            None => ProviderError::invalid(format!("{df_path}: the build failed: {msg}\n{tail}")),
        });
    }
    let built = started.elapsed().as_secs_f64();
    log.line(format!("built {tag} in {built:.1}s; pushing it"));
    let t0 = Instant::now();
    let mut push = docker.push_image(tag, Some(PushImageOptionsBuilder::default().build()), auth);
    while let Some(item) = push.next().await {
        match item {
            Ok(info) => {
                if let Some(d) = info.error_detail {
                    return Err(ProviderError::infra(format!("cannot push {tag}: {}", d.message.unwrap_or_default())));
                }
            }
            Err(e) => return Err(api_err(e, &format!("push {tag}"))),
        }
    }
    log.line(format!("pushed {tag} in {:.1}s", t0.elapsed().as_secs_f64()));
    let inspect = docker.inspect_image(tag).await.map_err(|e| api_err(e, "inspect the built image"))?;
    Ok(image_from(spec, tag, inspect, log.lines))
}

/// Labels of a built image: which template and digest, and whether it is kept.
fn labels(spec: &BuildSpec) -> HashMap<String, String> {
    let mut l = HashMap::from([
        (LABEL_TEMPLATE.to_string(), spec.template.def.name.clone()),
        (LABEL_DIGEST.to_string(), spec.template.digest.clone()),
    ]);
    if spec.keep {
        l.insert(LABEL_KEEP.to_string(), "1".into());
    }
    l
}

const LABEL_TEMPLATE: &str = "scenario-run.template";
const LABEL_DIGEST: &str = "scenario-run.digest";
const LABEL_KEEP: &str = "scenario-run.keep";

/// A kept build of the same digest from an earlier run, if the engine still has it.
pub(crate) async fn reuse(docker: &Docker, spec: &BuildSpec, tag: &str) -> Option<Image> {
    let inspect = docker.inspect_image(tag).await.ok()?;
    let labels = inspect.config.as_ref()?.labels.clone().unwrap_or_default();
    let kept = labels.get(LABEL_KEEP).is_some_and(|v| v == "1")
        && labels.get(LABEL_DIGEST).is_some_and(|d| *d == spec.template.digest);
    kept.then(|| image_from(spec, tag, inspect, Vec::new()))
}

fn image_from(spec: &BuildSpec, tag: &str, inspect: bollard::models::ImageInspect, log: Vec<String>) -> Image {
    let t = &spec.template;
    let config = inspect.config.unwrap_or_default();
    let workdir = config.working_dir.filter(|w| !w.is_empty());
    let cmd = config
        .cmd
        .filter(|c| !c.is_empty())
        .map(|c| c.iter().map(|a| crate::templates::dockerfile::shell_quote(a)).collect::<Vec<_>>().join(" "));
    let mut ports: Vec<u16> = config
        .exposed_ports
        .unwrap_or_default()
        .iter()
        .filter_map(|p| p.split('/').next().and_then(|n| n.parse().ok()))
        .collect();
    ports.sort_unstable();
    Image {
        name: t.def.name.clone(),
        digest: t.digest.clone(),
        tag: tag.to_string(),
        workdir,
        cmd,
        ports,
        log,
        keep: spec.keep,
    }
}

/// `The command '/bin/sh -c exit 3' returned a non-zero code: 3` → 3.
fn exit_code(msg: &str) -> Option<i64> {
    msg.rsplit_once("non-zero code: ").and_then(|(_, c)| c.trim().parse().ok())
}

/// Removes the local tag of a build (the registry copy stays: the registry's delete API is
/// off in the local stack, and its storage goes with `.ci/local-stack.sh down`).
pub(crate) async fn remove(docker: &Docker, tag: &str) -> bool {
    let opts = RemoveImageOptionsBuilder::default().force(true).build();
    docker.remove_image(tag, Some(opts), None).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags() {
        assert_eq!(
            image_tag("localhost:5000/", "Py Hello", "sha256:0123456789abcdef"),
            "localhost:5000/py-hello:0123456789ab"
        );
    }

    #[test]
    fn layer_ids() {
        assert_eq!(layer_id(" ---> 87b4a12cb924"), Some("87b4a12cb924"));
        assert_eq!(layer_id(" ---> Running in 0a1b2c3d4e5f"), None);
        assert_eq!(layer_id(" ---> Using cache"), None);
        assert_eq!(layer_id("Step 2/4 : RUN echo"), None);
    }

    #[test]
    fn steps_and_exit_codes() {
        assert_eq!(step_number("Step 12/15 : RUN exit 3"), Some(12));
        assert_eq!(step_number(" ---> Running in abc"), None);
        assert_eq!(exit_code("The command '/bin/sh -c exit 3' returned a non-zero code: 3"), Some(3));
    }
}

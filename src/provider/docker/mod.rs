//! The docker provider: a sandbox is a container on a Docker engine.
//!
//! # Why the Engine API (bollard) and not the `docker` CLI
//!
//! We talk to the engine over its HTTP API on the unix socket named by `DOCKER_HOST`, through
//! [bollard](https://docs.rs/bollard), the maintained async Rust client (tokio + hyper, which
//! this crate already builds). On merit:
//!
//! * **no client binary to pick**: this machine has two (`/usr/local/bin/docker` v28 without
//!   buildx first in PATH, Debian's `/usr/bin/docker` 20.10); the API is negotiated once
//!   (`negotiate_version`, so API 1.41 against the 20.10 engine) and nothing depends on PATH;
//! * **one request instead of one process per operation**: a `docker exec` CLI call costs a Go
//!   process start on top of the engine's ~100 ms; stat, list and kill are plain requests;
//! * **structured results**: exit codes from `exec inspect`, stdout and stderr demultiplexed
//!   from the attach stream as they come, HTTP status codes for "no such container/file"
//!   instead of parsing English from stderr;
//! * **files as tar through the API** (`PUT/GET /containers/{id}/archive`, extracted by the
//!   engine inside the container's root, so a symlink in the container cannot redirect a
//!   write onto the host), with no temp files and no `docker cp`.
//!
//! The price is compile time (bollard's generated models) and that the engine API has no
//! "signal this exec" call, so signals and timeouts are delivered with a tiny `kill` exec.
//!
//! # What a sandbox is
//!
//! `create` runs `sleep infinity` in a container named `sbx-<hex>` (the sandbox id) with
//! `--network none` (see Ports), `--init` (tini reaps orphans),
//! working directory `/home/user`, `HOME=/home/user` and the create-time `envs` in the
//! container's environment, so every process gets them. `cpu`/`memory_mb` become
//! `NanoCpus`/`Memory`. Labels carry everything [`Provider::list`] and [`Provider::info`] need,
//! so they work from the engine alone:
//!
//! * the metadata pairs themselves (so `docker ps --filter label=e2e=<run id>` finds a run's
//!   sandboxes, and `list` filters by label on the engine);
//! * `scenario-run.sandbox=1`, `scenario-run.template`, `scenario-run.started-at`,
//!   `scenario-run.end-at` (the initial end time), `scenario-run.metadata` (the JSON list of
//!   the metadata keys, to tell them from other labels). Metadata keys starting with
//!   `scenario-run.` are refused.
//!
//! Templates map to images: `SCENARIO_RUN_DOCKER_IMAGES="base=img:tag,other=img2"` wins;
//! otherwise a template containing `/` or `:` is an image reference as it is, `base` is the
//! offline `base` image of [`crate::image`] (the local provider's, imported into the engine
//! once per digest as `e2bdev/base:latest`) and any other name `<registry>/<name>:latest`, where the
//! registry is `SCENARIO_RUN_DOCKER_REGISTRY`, else `LOCAL_STACK_REGISTRY` (written by
//! `.ci/local-stack.sh` into its env file), else `localhost:5000`. An image missing from the
//! engine is pulled once; if that fails too the create fails naming the template.
//!
//! # Semantics shared with the local provider
//!
//! Commands run as `/bin/bash -l -c <cmd>` as `user` (uid 1000) unless the request names
//! another user (`root`), as on E2B and local; an image without that account gets it before
//! the first command (E2B adds it to every template it builds). They run in `cwd` (default
//! `/home/user`), with the
//! container's environment plus the exec's `envs`. A tiny `/bin/sh` prelude prints its pid
//! (`$$`, the pid *inside* the container) on stdout, changes directory and `exec`s bash, so the
//! reported pid is the command itself; the provider strips that first line. Debian's
//! `/etc/profile` resets PATH for login shells, so, as on local, a `BASH_ENV` script
//! (uploaded at create to `/run/scenario-run/bash_env.sh`) restores the requested one.
//! Relative file paths are under `/home/user`. See `exec` and `files` for the details.
//!
//! # Ports: a network namespace per sandbox
//!
//! Containers run with `--network none`: each has its own network namespace with only a
//! loopback, as local sandboxes do, so two sandboxes can serve the same port and nothing in
//! a sandbox can reach the host's services or the network.
//! [`port_url`](crate::provider::Ports::port_url) is a host `127.0.0.1:<ephemeral>` listener whose connections are made inside the container's
//! namespace (the local provider's forwarder, entered through `/proc/<container pid>/ns/net`;
//! so the engine must run on this machine, which a unix socket implies unless it is in a VM).
//! Builds still use the host's network, to reach the package registries.
//!
//! `SCENARIO_RUN_DOCKER_NETWORK=host` puts sandboxes on the host's network instead (for an
//! engine whose containers this machine cannot enter, or sandboxes that need the network):
//! then a port bound in the container *is* the host's port, `port_url` is
//! `http://127.0.0.1:<port>`, two sandboxes cannot bind the same port, and the provider lacks
//! [`Capability::IsolatedPorts`](crate::provider::Capability::IsolatedPorts), so scenarios that need it are SKIPPED. Filesystems and PID
//! spaces are per container either way.
//!
//! # Lifecycle
//!
//! Sandboxes expire at their end time (`set_timeout` moves it; a task per sandbox removes the
//! container then). `kill` is `docker rm -f`. `destroy_all` removes every container this
//! provider created (waiting for creations under way); `destroy_all_now` sends the same
//! `DELETE /containers/{id}?force=1` requests synchronously over the socket with std I/O, for a
//! second Ctrl-C. Containers outlive a scenario-run that is SIGKILLed (unlike local sandboxes):
//! they carry the run's `e2e=<run id>` label for cleanup, and `.ci/local-stack.sh down`
//! removes every container of the stack.
//!
//! `connect` to a running container with the `scenario-run.sandbox` label that this provider
//! did not create (another run's) adopts it: it can then be used and killed, but
//! `destroy_all` leaves it alone and it does not count in [`Provider::stats`].
//!
//! # Templates: build and deploy
//!
//! `build` is a real engine build (`POST /build`, the classic builder, `--network host`) of the
//! template folder sent as a tar, with its log streamed line by line into the step's evidence.
//! The Dockerfile is built as it is; a `FROM` of the offline image table that the engine lacks
//! is imported from `crate::image` (the image the local provider uses for that name). A
//! failing instruction is reported as `<folder>/Dockerfile:<line>: <instruction> exited with
//! <code>` with the last lines of its output, and the image of the last step that finished is
//! removed so no untagged layer is left. The image is tagged `<registry>/<name>:<digest12>`
//! (plus `-<run tag>` unless kept, so two runs on one engine never remove each other's build)
//! and pushed to the registry. `deploy` also registers the template under its name, so
//! `create { template: <name> }` starts its start command in the background and waits up to
//! 60 s for its ready command (or its ports). Builds happen once per digest per provider;
//! `remove_builds` (the end of the run) removes the local tags of the builds not kept, and a
//! kept build of the same digest is reused by the next run.
//!
//! # Engine
//!
//! `DOCKER_HOST` (`unix:///path`; default `unix:///var/run/docker.sock`). Only unix sockets
//! are supported. Nothing is contacted until the first operation; if no engine answers there,
//! `create` fails with an infrastructure error that says to run `.ci/local-stack.sh up`.

mod api;
mod build;
mod caps;
pub(crate) use build::image_tag;
mod exec;
mod files;

use crate::provider::core::Controlled as _;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions,
};
use bollard::Docker;
use futures_util::StreamExt;
use tokio::sync::{mpsc, OnceCell};

use super::core::{self, no_sandbox, now_ms, Core, Host, Life, Member};
use super::forward::Forwarder;
use super::{
    BuildOutput, BuildSpec, CreateRequest, DeployOutput, ExecRequest, ExecResult, FileEntry, OutputTx, Provider,
    ProviderError, ProviderStats, Result, SandboxInfo,
};
use api::{api_err, is_status};
use exec::ProcTable;

/// Sandbox lifetime when `create` does not say.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// Default engine socket.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";
/// Default image registry prefix (the local stack's registry).
pub const DEFAULT_REGISTRY: &str = "localhost:5000";

const HOME: &str = crate::provider::SANDBOX_HOME;
const LABEL_SANDBOX: &str = "scenario-run.sandbox";
const LABEL_TEMPLATE: &str = "scenario-run.template";
const LABEL_STARTED: &str = "scenario-run.started-at";
const LABEL_END: &str = "scenario-run.end-at";
const LABEL_META_KEYS: &str = "scenario-run.metadata";
/// How long one control-plane request may take (create, start, remove, inspect). Generous: an
/// engine busy unpacking large images has taken over two minutes to create a container here.
const API_TIMEOUT_SECS: u64 = 300;
/// How long connecting to the engine may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of [`DockerProvider::new`].
#[derive(Debug, Clone)]
pub struct DockerOptions {
    /// `unix:///path/to/docker.sock`.
    pub host: String,
    /// Image registry prefix for template names (`<registry>/<template>:latest`).
    pub registry: String,
    /// Explicit template → image mapping; wins over the naming rule.
    pub images: BTreeMap<String, String>,
    /// Sandboxes on the host's network (`SCENARIO_RUN_DOCKER_NETWORK=host`) instead of a
    /// loopback-only network namespace of their own (`none`, the default).
    pub host_network: bool,
}

impl DockerOptions {
    /// From the environment (`DOCKER_HOST`, `SCENARIO_RUN_DOCKER_IMAGES`,
    /// `SCENARIO_RUN_DOCKER_REGISTRY`, `LOCAL_STACK_REGISTRY`, `SCENARIO_RUN_DOCKER_NETWORK`);
    /// empty values count as unset.
    pub fn from_env(env: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| env.get(k).filter(|v| !v.trim().is_empty()).map(|v| v.trim().to_string());
        let host = get("DOCKER_HOST").unwrap_or_else(|| DEFAULT_DOCKER_HOST.into());
        let registry = get("SCENARIO_RUN_DOCKER_REGISTRY")
            .or_else(|| get("LOCAL_STACK_REGISTRY"))
            .unwrap_or_else(|| DEFAULT_REGISTRY.into());
        let images = get("SCENARIO_RUN_DOCKER_IMAGES")
            .map(|s| {
                s.split([',', ' ', '\n'])
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                    .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let host_network = get("SCENARIO_RUN_DOCKER_NETWORK").is_some_and(|n| n == "host");
        Self { host, registry, images, host_network }
    }

    /// The image that runs `template`.
    pub fn image_for(&self, template: &str) -> String {
        let t = if template.is_empty() { "base" } else { template };
        if let Some(img) = self.images.get(t) {
            return img.clone();
        }
        if t.contains('/') || t.contains(':') {
            return t.to_string();
        }
        let name = if t == "base" { "base-python" } else { t };
        format!("{}/{name}:latest", self.registry.trim_end_matches('/'))
    }
}

impl Default for DockerOptions {
    fn default() -> Self {
        let env: BTreeMap<String, String> = std::env::vars().collect();
        Self::from_env(&env)
    }
}

/// Containers on a Docker engine. See the module documentation.
pub struct DockerProvider {
    inner: Arc<Inner>,
}

struct Inner {
    opts: DockerOptions,
    docker: OnceCell<Docker>,
    /// Registry, counters and creation guard (shared with the local provider).
    core: Core<Sandbox>,
    /// Template builds by digest: each is made once per provider (per run).
    builds: Mutex<HashMap<String, Arc<OnceCell<Arc<build::Image>>>>>,
    /// Templates `create` knows by name: registered by `build` (image only) or `deploy`.
    templates: Mutex<HashMap<String, Registered>>,
    /// Appended to the tags of builds that are not kept, so that two runs on one engine
    /// building the same digest never remove each other's image.
    run_tag: String,
}

type Registered = super::registered::Registered<build::Image>;

/// The engine's name for the offline `base` image.
const OFFLINE_BASE: &str = "e2bdev/base:latest";

/// The docker provider's record of one sandbox, a container it made or connected to: its
/// processes, life and port forwarder (what its `SandboxInfo` is made from).
struct Sandbox {
    /// The container's name, which is the sandbox id.
    id: String,
    template: String,
    metadata: BTreeMap<String, String>,
    started_at: u64,
    life: Life,
    procs: ProcTable,
    /// Connected to, not created by this provider.
    adopted: bool,
    /// Into the container's network namespace, made by the first `port_url`; None when the
    /// container is on the host's network.
    fwd: OnceCell<Option<Forwarder>>,
}

impl Member for Sandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn life(&self) -> &Life {
        &self.life
    }
    fn owned(&self) -> bool {
        !self.adopted
    }
}

/// The socket path of a `unix://` DOCKER_HOST.
fn socket_path(host: &str) -> Result<String> {
    match host.strip_prefix("unix://") {
        Some(p) if !p.is_empty() => Ok(p.to_string()),
        _ if host.starts_with('/') => Ok(host.to_string()),
        _ => Err(ProviderError::infra(format!(
            "DOCKER_HOST={host} is not supported: the docker provider talks to a unix socket (unix:///path)"
        ))),
    }
}

impl Inner {
    fn unreachable(&self, why: impl std::fmt::Display) -> ProviderError {
        ProviderError::infra(format!(
            "no Docker engine at {}: {why}; run .ci/local-stack.sh up and `source $STACK_DIR/env` (sets DOCKER_HOST)",
            self.opts.host
        ))
    }

    /// The engine client, connected and version-negotiated on first use.
    async fn client(&self) -> Result<&Docker> {
        self.docker
            .get_or_try_init(|| async {
                let path = socket_path(&self.opts.host)?;
                let d = Docker::connect_with_unix(&path, API_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
                    .map_err(|e| self.unreachable(e))?;
                match tokio::time::timeout(CONNECT_TIMEOUT, d.negotiate_version()).await {
                    Ok(Ok(d)) => Ok(d),
                    Ok(Err(e)) => Err(self.unreachable(e)),
                    Err(_) => Err(self.unreachable("no answer within 5s")),
                }
            })
            .await
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.core.get(id)
    }

    /// The image of a template this provider did not build: `base` is the same offline image
    /// the local provider starts from (E2B's base: the `user` account, sudo, python3, git),
    /// imported into the engine once per digest, unless `SCENARIO_RUN_DOCKER_IMAGES` names
    /// one; any other name is an image reference or a name in the registry.
    async fn base_image(&self, docker: &Docker, template: &str) -> Result<String> {
        if template != "base" || self.opts.images.contains_key("base") {
            return Ok(self.opts.image_for(template));
        }
        let store = crate::image::ImageStore::shared();
        let (log, _) = mpsc::unbounded_channel();
        let rootfs = store.get("base", None, &log).await?;
        crate::image::docker::ensure(docker, &rootfs, store.ids(), OFFLINE_BASE).await?;
        Ok(OFFLINE_BASE.to_string())
    }

    async fn create_sandbox(self: &Arc<Self>, req: CreateRequest) -> Result<Arc<Sandbox>> {
        let docker = self.client().await?.clone();
        let template = if req.template.is_empty() { "base".to_string() } else { req.template.clone() };
        let tpl = self.templates.lock().expect("templates").get(&template).cloned();
        let image = match &tpl {
            Some(t) => t.built.tag.clone(),
            None => self.base_image(&docker, &template).await?,
        };
        let id = format!("sbx-{}", crate::random::hex(6));
        let now = now_ms();
        let timeout_ms = req.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS).saturating_mul(1000);
        let end_ms = now.saturating_add(timeout_ms);

        let mut labels: HashMap<String, String> = req.metadata.clone().into_iter().collect();
        labels.insert(LABEL_SANDBOX.into(), "1".into());
        labels.insert(LABEL_TEMPLATE.into(), template.clone());
        labels.insert(LABEL_STARTED.into(), (now / 1000).to_string());
        labels.insert(LABEL_END.into(), end_ms.div_ceil(1000).to_string());
        let keys: Vec<&String> = req.metadata.keys().collect();
        labels.insert(LABEL_META_KEYS.into(), serde_json::to_string(&keys).unwrap_or_default());

        let mut env = vec![format!("HOME={HOME}")];
        if let Some(t) = &tpl {
            env.extend(t.envs.iter().map(|(k, v)| format!("{k}={v}")));
        }
        env.extend(req.envs.iter().map(|(k, v)| format!("{k}={v}")));
        let host_config = HostConfig {
            network_mode: Some(if self.opts.host_network { "host" } else { "none" }.into()),
            init: Some(true),
            nano_cpus: req.cpu.map(|c| i64::from(c) * 1_000_000_000),
            memory: req.memory_mb.map(|m| (m as i64).saturating_mul(1024 * 1024)),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.clone()),
            cmd: Some(vec!["sleep".into(), "infinity".into()]),
            env: Some(env),
            working_dir: Some(HOME.into()),
            labels: Some(labels),
            host_config: Some(host_config),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::default().name(&id).build();
        match docker.create_container(Some(opts.clone()), body.clone()).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {
                pull(&docker, &image, &template).await?;
                docker.create_container(Some(opts), body).await.map_err(|e| api_err(e, "create the container"))?;
            }
            Err(e) => return Err(api_err(e, "create the container")),
        }
        let started = async {
            files::put_file(&docker, &id, exec::BASH_ENV_PATH, exec::BASH_ENV_SCRIPT.as_bytes(), 0o644).await?;
            docker
                .start_container(&id, None::<StartContainerOptions>)
                .await
                .map_err(|e| api_err(e, "start the container"))
        };
        if let Err(e) = started.await {
            remove_container(&docker, &id).await;
            return Err(e);
        }
        let sb = Arc::new(Sandbox {
            id: id.clone(),
            template,
            metadata: req.metadata.clone(),
            started_at: now / 1000,
            life: Life::new(end_ms),
            procs: ProcTable::new(docker, id.clone())
                .with_default_cwd(tpl.as_ref().and_then(|t| t.built.workdir.clone())),
            adopted: false,
            fwd: OnceCell::new(),
        });
        let sb = self.core.register(sb);
        core::expire_at_end(self, sb.clone());
        if let Some(t) = tpl.as_ref().filter(|t| t.start.is_some()) {
            let start = t.start.clone().expect("checked");
            if let Err(e) = start_template(&sb, &start, t.ready.as_deref(), t.ready_timeout, &t.ports).await {
                core::kill(self.as_ref(), &sb.id).await;
                return Err(e);
            }
        }
        Ok(sb)
    }

    /// The build of `spec`'s digest: made now, or the one this provider made already.
    /// Returns the image and whether it was reused.
    async fn build(&self, spec: &BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<(Arc<build::Image>, bool)> {
        let docker = self.client().await?.clone();
        let digest = spec.template.digest.clone();
        // skip_cache: a cell of its own, which then stands for the digest in this run.
        let cell = if spec.skip_cache {
            let _ = log.send("skip_cache: building again without the engine's cache (--no-cache)".to_string());
            Default::default()
        } else {
            self.builds.lock().expect("builds").entry(digest.clone()).or_default().clone()
        };
        let mut fresh = false;
        let image = cell
            .get_or_try_init(|| async {
                let tag = build::image_tag(&self.opts.registry, &spec.template.def.name, &digest);
                let tag = if spec.keep {
                    if let Some(image) = build::reuse(&docker, spec, &tag).await.filter(|_| !spec.skip_cache) {
                        let _ = log.send(format!("reusing the kept build {tag} of {digest}"));
                        return Ok(Arc::new(image));
                    }
                    tag
                } else if spec.skip_cache {
                    // Its own tag: the earlier build keeps its, to be removed with the run's.
                    format!("{tag}-{}-{}", self.run_tag, crate::random::hex(4))
                } else {
                    format!("{tag}-{}", self.run_tag)
                };
                fresh = true;
                build::build(&docker, spec, &tag, None, log.clone()).await.map(Arc::new)
            })
            .await?
            .clone();
        if spec.skip_cache {
            crate::provider::registered::supersede(&mut self.builds.lock().expect("builds"), digest.clone(), cell);
        }
        if !fresh {
            let _ = log.send(format!("cached: {} ({digest}) was built before as {}; its log:", image.name, image.tag));
            for l in &image.log {
                let _ = log.send(l.clone());
            }
        }
        Ok((image, !fresh))
    }

    /// Synchronous last resort: `DELETE /containers/{id}?force=1` for every container left
    /// that we created (adopted and kept ones are left alone, as by `destroy_all`).
    fn kill_all_now(&self) {
        let ids: Vec<String> = self
            .core
            .everything()
            .iter()
            .filter(|sb| !sb.adopted && !self.core.is_kept(&sb.id))
            .map(|sb| sb.id.clone())
            .collect();
        if ids.is_empty() {
            return;
        }
        let Ok(sock) = socket_path(&self.opts.host) else { return };
        let threads: Vec<_> = ids
            .into_iter()
            .map(|id| {
                let sock = sock.clone();
                std::thread::spawn(move || remove_now(&sock, &id))
            })
            .collect();
        for t in threads {
            let _ = t.join();
        }
    }
}

#[async_trait]
impl Host for Inner {
    type Sandbox = Sandbox;
    fn core(&self) -> &Core<Sandbox> {
        &self.core
    }
    async fn teardown(&self, sb: &Arc<Sandbox>) {
        sb.procs.mark_all_gone();
        if let Some(Some(fwd)) = sb.fwd.get() {
            fwd.stop();
        }
        if let Ok(docker) = self.client().await {
            remove_container(docker, &sb.id).await;
        }
    }
}

/// Removes a container, ignoring "no such container".
async fn remove_container(docker: &Docker, id: &str) {
    let opts = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
    let _ = tokio::time::timeout(Duration::from_secs(60), docker.remove_container(id, Some(opts))).await;
}

/// A blocking `DELETE /containers/{id}?force=1&v=1` over the socket (no runtime needed).
fn remove_now(sock: &str, id: &str) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(sock) else { return };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let req = format!("DELETE /containers/{id}?force=1&v=1 HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_ok() {
        let mut buf = [0u8; 512];
        let _ = s.read(&mut buf);
    }
}

async fn pull(docker: &Docker, image: &str, template: &str) -> Result<()> {
    let opts = CreateImageOptionsBuilder::default().from_image(image).build();
    let mut stream = docker.create_image(Some(opts), None, None);
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            return Err(ProviderError::not_found(format!(
                "unknown template `{template}`: image {image} is not on the engine and cannot be pulled ({e}); \
                 map templates to images with SCENARIO_RUN_DOCKER_IMAGES=name=image"
            )));
        }
    }
    Ok(())
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Dropped without destroy_all: do not leave containers behind.
        self.kill_all_now();
    }
}

impl Sandbox {
    fn info(&self) -> SandboxInfo {
        SandboxInfo {
            id: self.id.clone(),
            template: self.template.clone(),
            metadata: self.metadata.clone(),
            started_at: self.started_at,
            end_at: self.life.end_ms().div_ceil(1000),
            state: "running".into(),
        }
    }

    fn alive(&self) -> Result<()> {
        if self.life.is_gone() {
            return Err(ProviderError::infra(format!("sandbox {} is not running", self.id)));
        }
        Ok(())
    }
}

/// What the labels of a container say about it as a sandbox (None if it is not one).
fn info_from_labels(id: &str, labels: &HashMap<String, String>, running: bool) -> Option<SandboxInfo> {
    if labels.get(LABEL_SANDBOX).map(String::as_str) != Some("1") {
        return None;
    }
    let keys: Vec<String> = labels.get(LABEL_META_KEYS).and_then(|s| serde_json::from_str(s).ok()).unwrap_or_default();
    let metadata = keys.into_iter().filter_map(|k| labels.get(&k).map(|v| (k, v.clone()))).collect();
    let num = |k: &str| labels.get(k).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some(SandboxInfo {
        id: id.to_string(),
        template: labels.get(LABEL_TEMPLATE).cloned().unwrap_or_default(),
        metadata,
        started_at: num(LABEL_STARTED),
        end_at: num(LABEL_END),
        state: if running { "running" } else { "stopped" }.into(),
    })
}

impl DockerProvider {
    /// Does not contact the engine; the first operation does.
    pub fn new(opts: DockerOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                opts,
                docker: OnceCell::new(),
                core: Core::default(),
                builds: Mutex::new(HashMap::new()),
                templates: Mutex::new(HashMap::new()),
                run_tag: crate::random::hex(4),
            }),
        }
    }

    pub fn options(&self) -> &DockerOptions {
        &self.inner.opts
    }

    /// Builds `spec` on the engine as `tag` and pushes it (with `auth` when given), for a
    /// platform that makes templates from pushed images (the alicloud ACR path). Returns
    /// once the image is in the registry.
    pub(crate) async fn build_and_push(
        &self,
        spec: &BuildSpec,
        tag: &str,
        auth: Option<(&str, &str)>,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<()> {
        let docker = self.inner.client().await?;
        let registry = tag.split('/').next().unwrap_or_default();
        let creds = auth.map(|(u, p)| bollard::auth::DockerCredentials {
            username: Some(u.to_string()),
            password: Some(p.to_string()),
            serveraddress: Some(registry.to_string()),
            ..Default::default()
        });
        build::build(docker, spec, tag, creds, log).await.map(|_| ())
    }

    /// Removes the engine's tag `tag` (not the pushed copy); false if it was not there.
    pub(crate) async fn remove_image(&self, tag: &str) -> bool {
        match self.inner.client().await {
            Ok(docker) => build::remove(docker, tag).await,
            Err(_) => false,
        }
    }

    /// The sandbox with its forwarder made (None in it on the host's network), for
    /// `port_url` and `expose_host`.
    async fn forwarded(&self, id: &str) -> Result<Arc<Sandbox>> {
        let sb = self.get(id)?;
        let docker = self.inner.client().await?;
        sb.fwd
            .get_or_try_init(|| async {
                let c = docker
                    .inspect_container(id, None::<InspectContainerOptions>)
                    .await
                    .map_err(|e| api_err(e, "inspect the container"))?;
                if c.host_config.and_then(|h| h.network_mode).as_deref() == Some("host") {
                    return Ok(None);
                }
                match c.state.and_then(|s| s.pid).filter(|p| *p > 0) {
                    Some(pid) => Ok(Some(Forwarder::new(pid as u32))),
                    None => Err(ProviderError::infra(format!("sandbox {id} is not running"))),
                }
            })
            .await?;
        Ok(sb)
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        let sb = self.inner.get(id)?;
        sb.alive()?;
        Ok(sb)
    }
}

#[async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &str {
        "docker"
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        if !req.mounts.is_empty() {
            return Err(ProviderError::unsupported("host directory mounts: not supported by the docker provider"));
        }
        // A container has only its loopback (`--network none`) or the host's whole network:
        // an allow list could be honoured by neither, so it is refused, not ignored.
        if req.lifecycle.is_some() {
            return Err(ProviderError::unsupported(
                "a lifecycle (pause at the end, auto-resume): the docker provider cannot pause a sandbox",
            ));
        }
        if req.network.as_ref().is_some_and(|n| n.allow_public_traffic == Some(false)) {
            return Err(ProviderError::unsupported(
                "private ports (allow_public_traffic: false): the docker provider has no traffic access token",
            ));
        }
        if req.network.as_ref().is_some_and(|n| !n.allow_out.is_empty()) {
            return Err(ProviderError::unsupported(
                "network allow lists: not supported by the docker provider (use local or a cloud)",
            ));
        }
        for k in req.envs.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ProviderError::invalid(format!("invalid environment variable name: {k:?}")));
            }
        }
        for k in req.metadata.keys() {
            if k.starts_with("scenario-run.") || k.is_empty() {
                return Err(ProviderError::invalid(format!("metadata key {k:?} is reserved")));
            }
        }
        if req.envs.values().chain(req.metadata.values()).any(|v| v.contains('\0')) {
            return Err(ProviderError::invalid("envs or metadata contain a NUL byte"));
        }
        let inner = self.inner.clone();
        let sb = core::create(self.inner.clone(), async move { inner.create_sandbox(req).await }).await?;
        Ok(sb.info())
    }

    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo> {
        let docker = self.inner.client().await?.clone();
        let inspected = docker.inspect_container(id, None::<InspectContainerOptions>).await;
        let running = match &inspected {
            Ok(c) => c.state.as_ref().and_then(|s| s.running).unwrap_or(false),
            Err(e) if is_status(e, 404) => false,
            Err(_) => true, // cannot tell: trust what we know
        };
        if let Ok(sb) = self.inner.get(id) {
            if !running {
                // Died under us (removed from outside): clean up and report it gone.
                core::kill(self.inner.as_ref(), id).await;
                return Err(no_sandbox(id));
            }
            if let Some(t) = timeout_secs {
                sb.life.extend(t);
            }
            return Ok(sb.info());
        }
        // Adopt another run's sandbox.
        let c = inspected.map_err(|_| no_sandbox(id))?;
        let name = c.name.as_deref().unwrap_or(id).trim_start_matches('/').to_string();
        let labels = c.config.and_then(|c| c.labels).unwrap_or_default();
        let info = info_from_labels(&name, &labels, running).filter(|_| running).ok_or_else(|| no_sandbox(id))?;
        let end_ms = match timeout_secs {
            Some(t) => now_ms().saturating_add(t.saturating_mul(1000)),
            None => info.end_at.saturating_mul(1000).max(now_ms() + DEFAULT_TIMEOUT_SECS * 1000),
        };
        let sb = Arc::new(Sandbox {
            id: name.clone(),
            template: info.template,
            metadata: info.metadata,
            started_at: info.started_at,
            life: Life::new(end_ms),
            procs: ProcTable::new(docker, name.clone()),
            adopted: true,
            fwd: OnceCell::new(),
        });
        let sb = self.inner.core.register(sb);
        core::expire_at_end(&self.inner, sb.clone());
        Ok(sb.info())
    }

    async fn info(&self, id: &str) -> Result<SandboxInfo> {
        if let Ok(sb) = self.inner.get(id) {
            return Ok(sb.info());
        }
        let docker = self.inner.client().await?;
        let c = docker.inspect_container(id, None::<InspectContainerOptions>).await.map_err(|_| no_sandbox(id))?;
        let running = c.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        let name = c.name.as_deref().unwrap_or(id).trim_start_matches('/').to_string();
        let labels = c.config.and_then(|c| c.labels).unwrap_or_default();
        info_from_labels(&name, &labels, running).ok_or_else(|| no_sandbox(id))
    }

    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let docker = self.inner.client().await?;
        let mut labels = vec![format!("{LABEL_SANDBOX}=1")];
        labels.extend(metadata.iter().map(|(k, v)| format!("{k}={v}")));
        let filters: HashMap<String, Vec<String>> = [("label".to_string(), labels)].into();
        let opts = ListContainersOptionsBuilder::default().all(false).filters(&filters).build();
        let found = docker.list_containers(Some(opts)).await.map_err(|e| api_err(e, "list containers"))?;
        let mut out: Vec<SandboxInfo> = found
            .into_iter()
            .filter_map(|c| {
                let name = c.names.as_ref()?.first()?.trim_start_matches('/').to_string();
                let labels = c.labels.unwrap_or_default();
                let mut info = info_from_labels(&name, &labels, true)?;
                // Ours: the end time as set_timeout left it, not the label's initial one.
                if let Ok(sb) = self.inner.get(&name) {
                    info.end_at = sb.info().end_at;
                }
                Some(info)
            })
            // Being torn down by us: already gone as far as callers are concerned.
            .filter(|i| !self.inner.core.is_dying(&i.id))
            .collect();
        out.sort_by_key(|i| (i.started_at, i.id.clone()));
        Ok(out)
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        if core::kill(self.inner.as_ref(), id).await {
            return Ok(true);
        }
        // Not one this process holds: another run's sandbox (the janitor's case, or one kept
        // with `create { keep: true }`). Removed on the engine if it is a sandbox at all.
        let docker = self.inner.client().await?;
        let Ok(c) = docker.inspect_container(id, None::<InspectContainerOptions>).await else { return Ok(false) };
        let labels = c.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(LABEL_SANDBOX).map(String::as_str) != Some("1") {
            return Ok(false);
        }
        remove_container(docker, id).await;
        if docker.inspect_container(id, None::<InspectContainerOptions>).await.is_ok() {
            return Err(ProviderError::infra(format!("container {id} is still there after its removal")));
        }
        Ok(true)
    }

    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        self.get(id)?.life.extend(timeout_secs);
        Ok(())
    }

    fn keep(&self, id: &str) {
        self.inner.core.keep(id);
    }

    fn is_kept(&self, id: &str) -> bool {
        self.inner.core.is_kept(id)
    }

    async fn destroy_all(&self) -> usize {
        core::destroy_all(&self.inner).await
    }

    fn destroy_all_now(&self) {
        self.inner.kill_all_now();
    }

    fn stats(&self) -> ProviderStats {
        self.inner.core.stats()
    }

    fn features(&self) -> crate::provider::Features<'_> {
        crate::provider::caps::features!(self; processes, live_processes, files, ports, expose_host, builds)
    }
}

/// What `create` uses for a build (`deploy`: with the start and ready commands).
fn registered(image: &Arc<build::Image>, def: &crate::templates::TemplateDef, deploy: bool) -> Registered {
    Registered::new(image, def, deploy, image.cmd.as_deref(), &image.ports)
}

/// Starts a deployed template's start command in `sb` (a background process of the sandbox)
/// and waits until its ready command exits 0 (or, without one, until every port accepts
/// connections), as the local provider does.
async fn start_template(
    sb: &Arc<Sandbox>,
    start: &str,
    ready: Option<&str>,
    ready_timeout: Option<Duration>,
    ports: &[u16],
) -> Result<()> {
    // As the container's own CMD would run: as the image's USER (root unless it says); the
    // engine reads an empty user that way.
    let image_user = Some(String::new());
    let req = ExecRequest { cmd: start.to_string(), user: image_user.clone(), ..Default::default() };
    let p = sb.procs.launch(&req, None, false).await?;
    let Some(probe) = super::registered::ready_probe(ready, ports) else { return Ok(()) };
    super::registered::wait_ready(
        start,
        &probe,
        ready_timeout,
        || p.finished(),
        || p.result(false),
        |timeout| {
            let check = ExecRequest {
                cmd: probe.clone(),
                timeout: Some(timeout),
                user: image_user.clone(),
                ..Default::default()
            };
            async move {
                let q = sb.procs.launch(&check, None, false).await?;
                let r = q.finish(check.timeout).await;
                sb.procs.remove(&q);
                Ok(r)
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn templates_map_to_images() {
        let o = DockerOptions::from_env(&env(&[]));
        assert_eq!(o.host, DEFAULT_DOCKER_HOST);
        assert_eq!(o.image_for("base"), "localhost:5000/base-python:latest");
        assert_eq!(o.image_for(""), "localhost:5000/base-python:latest");
        assert_eq!(o.image_for("web"), "localhost:5000/web:latest");
        assert_eq!(o.image_for("busybox:1"), "busybox:1");
        let o = DockerOptions::from_env(&env(&[
            ("LOCAL_STACK_REGISTRY", "localhost:5001"),
            ("SCENARIO_RUN_DOCKER_IMAGES", "base=localhost:5001/base-busybox:latest, x=y:z"),
            ("DOCKER_HOST", "unix:///tmp/s/docker.sock"),
        ]));
        assert_eq!(o.image_for("base"), "localhost:5001/base-busybox:latest");
        assert_eq!(o.image_for("x"), "y:z");
        assert_eq!(o.image_for("web"), "localhost:5001/web:latest");
        assert_eq!(socket_path(&o.host).unwrap(), "/tmp/s/docker.sock");
        assert!(socket_path("tcp://127.0.0.1:2375").is_err());
        let o =
            DockerOptions::from_env(&env(&[("LOCAL_STACK_REGISTRY", "a:1"), ("SCENARIO_RUN_DOCKER_REGISTRY", "b:2/")]));
        assert_eq!(o.image_for("base"), "b:2/base-python:latest");
    }

    #[test]
    fn labels_round_trip_to_info() {
        let labels: HashMap<String, String> = [
            (LABEL_SANDBOX, "1"),
            (LABEL_TEMPLATE, "base"),
            (LABEL_STARTED, "100"),
            (LABEL_END, "400"),
            (LABEL_META_KEYS, r#"["e2e"]"#),
            ("e2e", "run1"),
            ("other", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let i = info_from_labels("sr-1", &labels, true).unwrap();
        assert_eq!(i.metadata, env(&[("e2e", "run1")]));
        assert_eq!((i.started_at, i.end_at, i.template.as_str()), (100, 400, "base"));
        assert!(info_from_labels("c", &HashMap::new(), true).is_none());
    }

    #[tokio::test]
    async fn no_engine_is_an_infra_error_that_says_what_to_do() {
        let p = DockerProvider::new(DockerOptions {
            host: "unix:///nonexistent/docker.sock".into(),
            ..DockerOptions::from_env(&BTreeMap::new())
        });
        let e = p.create(CreateRequest::default()).await.unwrap_err();
        assert_eq!(e.kind, crate::provider::ErrorKind::Infra);
        assert!(e.message.contains("no Docker engine at unix:///nonexistent/docker.sock"), "{}", e.message);
        assert!(e.message.contains(".ci/local-stack.sh up"), "{}", e.message);
        assert_eq!(p.stats().created, 0);
    }
}

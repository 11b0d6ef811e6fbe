//! The `e2b` and `alicloud` providers: a client of the E2B sandbox protocol, the REST control
//! plane plus the in-sandbox daemon envd (Connect RPC with the JSON codec, and `/files`).
//! Alibaba Cloud FC "Agent Sandbox" speaks the same protocol; the two differ only in their
//! [`Preset`] (endpoints, auth header, create route). `/work/shared/docs/e2b-protocol.md` is
//! the reference this follows; section numbers below point into it.
//!
//! [`E2bProvider`] owns the one `reqwest::Client` (connection pool, HTTP/2 by ALPN over TLS,
//! HTTP/1.1 over plain `http://`), the envd address of every sandbox it has seen (learnt
//! from create/connect/get answers: base URL, domain, access token, envd version), the
//! sandboxes it created (for [`Provider::destroy_all`] and the stats) and the processes it
//! started. Submodules:
//!
//! * `config` — presets, environment variables and their precedence, URL building;
//! * `api` — control-plane calls and their error mapping;
//! * `retry` — which calls are repeated, and how long to wait;
//! * `connect` — Connect envelope framing and error codes (hand-written; see there why no
//!   Connect crate);
//! * `envd` — envd headers, unary and streaming calls, `/files`;
//! * `process` — `Process/Start` streams, the reader task, the process table;
//! * `model` — the JSON shapes and their mapping to provider types.
//!
//! # Mapping of the trait
//!
//! * `create` → `POST /v2/sandboxes` (e2b) or `POST /sandboxes` (alicloud, FC has no v2
//!   routes yet); never retried on a status (see `retry`). It runs in its own task, so a
//!   caller giving up never leaks a sandbox: one nobody waits for any more is killed.
//! * `exec` → `Process/Start` with `/bin/bash -l -c <cmd>`; stdin via `SendInput` +
//!   `CloseStdin`; the timeout is sent as `Connect-Timeout-Ms` (envd kills at the deadline)
//!   and enforced here too with `SendSignal(SIGKILL)`.
//! * `spawn`/`wait` → the same stream kept in a task; `wait` on a pid this provider did not
//!   start attaches with `Process/Connect` (output from then on).
//! * `process_list` → `Process/List` (every running process envd knows, including ones
//!   other clients started) merged with the finished ones this provider saw, with their
//!   exit codes.
//! * `signal` → `SendSignal` for SIGKILL and SIGTERM, the only two envd implements; other
//!   signals are sent by running `kill -<n> <pid>` in the sandbox.
//! * files → `Filesystem/{Stat,ListDir,MakeDir,Move,Remove}` and `/files`. `write_file` with
//!   a mode runs `chmod` afterwards (`/files` has no mode). `make_dir` on an existing
//!   directory returns it (`mkdir -p`, like the local provider); `remove` of a missing path
//!   succeeds, as envd's `os.RemoveAll` does.
//! * `port_url` → `https://{port}-{id}.{domain}` (`http://` for loopback domains; see
//!   `config`).
//!
//! * `build`/`deploy`/`remove_builds` → the template build API (§8.1); see `build`.
//!
//! * `pause` → `POST /sandboxes/{id}/pause` `{"memory"}` (409 "already paused" is a
//!   success); `resume` → `connect` with the timeout, which resumes a paused sandbox.
//! * `snapshot` → `POST /sandboxes/{id}/snapshots` `{"name"}`, whose `snapshotID` `create`
//!   takes; `delete_snapshot` → `DELETE /templates/{id}`, as the SDK deletes one.
//! * `watch_dir` → the `Filesystem/WatchDir` stream, read by a task (see `watch`).
//! * `spawn_pty` → `Process/Start` with `pty.size` (output arrives as `pty` data);
//!   `write_pty` → `SendInput` `{"input":{"pty"}}`; `resize_pty` → `Process/Update`.
//!
//! Not supported: E2B debug mode (`E2B_DEBUG`), metrics. The alicloud preset does not
//! claim `pause` and `snapshot`: FC allowlists pause and has no snapshots (protocol doc §11).

mod acr;
pub mod acs;
pub(crate) mod api;
pub mod build;
mod caps;
pub mod config;
mod connect;
mod envd;
mod model;
/// Go's text of a signal death → the signal (OpenSandbox's execd speaks it too).
pub(crate) use model::signal_from_status;
mod process;
mod retry;
mod watch;

use crate::provider::caps::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use serde_json::{json, Value as JsonValue};
use tokio::sync::{mpsc, oneshot, Notify};

pub use config::{Config, CreateApi, Preset};

use super::{
    CreateRequest, ErrorKind, ExecRequest, ExecResult, FileEntry, OutputTx, ProcessInfo, Provider, ProviderError,
    ProviderStats, Result, SandboxInfo,
};
use api::Api;
use envd::{Envd, RpcError, RpcStream};
use model::{EntryResponse, ListDirResponse, ListResponse, SandboxJson};
use process::{Proc, ProcTable};

/// Timeout of connection establishment (TCP + TLS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `destroy_all` keeps trying.
const DESTROY_DEADLINE: Duration = Duration::from_secs(30);

/// A client of the E2B protocol for one preset. See the module documentation.
pub struct E2bProvider {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for E2bProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bProvider").field("config", &self.inner.api.cfg).finish_non_exhaustive()
    }
}

struct Inner {
    api: Api,
    envds: Mutex<HashMap<String, Envd>>,
    /// Port base URLs handed out by `port_url`, and whose sandbox they reach (for
    /// `port_headers`).
    port_bases: Mutex<HashMap<String, String>>,
    /// Sandboxes this provider created and has not seen killed.
    created: Mutex<HashSet<String>>,
    procs: ProcTable,
    stats: Mutex<ProviderStats>,
    in_flight: AtomicUsize,
    in_flight_changed: Notify,
    shutting_down: AtomicBool,
    builds: build::Builds,
    /// Snapshots made by `snapshot`, not deleted yet nor kept (`remove_builds` deletes them).
    snapshots: Mutex<HashSet<String>>,
    /// Sandboxes a `create { keep: true }` leaves alive after the run: out of `created`, so
    /// `destroy_all` passes them by, and named here so the run's sweep does too.
    kept: Mutex<HashSet<String>>,
}

fn http_client() -> Result<reqwest::Client> {
    crate::net::client_builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(20)
        .tcp_keepalive(Duration::from_secs(30))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_while_idle(true)
        .user_agent(concat!("scenario-run/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| ProviderError::infra(format!("cannot build the HTTP client: {}", api::error_chain(&e))))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The command for messages: its first line, shortened.
fn short(cmd: &str) -> String {
    let line = cmd.lines().next().unwrap_or("").trim();
    if line.chars().count() > 60 || cmd.trim().contains('\n') {
        format!("{}…", line.chars().take(60).collect::<String>())
    } else {
        line.to_string()
    }
}

/// Whether `url` is `base` or below it (a path, query or fragment follows), so that a
/// look-alike host such as `{base}.evil.example` never matches.
fn under(url: &str, base: &str) -> bool {
    url.strip_prefix(base).is_some_and(|rest| rest.is_empty() || rest.starts_with(['/', '?', '#']))
}

/// Single-quotes `s` for bash.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl E2bProvider {
    /// A provider for `preset`, configured from `env` (see [`config`]). Succeeds without a
    /// key: [`Provider::required_credentials`] then names the variable to set.
    pub fn new(preset: Preset, env: &BTreeMap<String, String>) -> Result<Self> {
        let cfg = Config::from_env(preset, env)?;
        let cfg_acr = cfg.acr.clone();
        let http = http_client()?;
        Ok(Self {
            inner: Arc::new(Inner {
                api: Api::new(http.clone(), cfg),
                envds: Mutex::new(HashMap::new()),
                port_bases: Mutex::new(HashMap::new()),
                created: Mutex::new(HashSet::new()),
                procs: ProcTable::default(),
                stats: Mutex::new(ProviderStats::default()),
                in_flight: AtomicUsize::new(0),
                in_flight_changed: Notify::new(),
                shutting_down: AtomicBool::new(false),
                builds: build::Builds::new(cfg_acr.map(|a| acr::AcrImages::new(a, env, http.clone()))),
                snapshots: Mutex::new(HashSet::new()),
                kept: Mutex::new(HashSet::new()),
            }),
        })
    }

    pub fn config(&self) -> &Config {
        &self.inner.api.cfg
    }

    /// A template from an image built elsewhere (e.g. pushed to Alibaba ACR): `fromImage`
    /// with optional registry credentials, `def`'s resources and start/ready commands; see
    /// [`build::build_from_image`]. The template is deleted by `remove_builds` at the end of
    /// the run. Returns its ID.
    pub async fn build_from_image(
        &self,
        image: &str,
        registry: Option<&build::RegistryAuth>,
        def: &crate::templates::TemplateDef,
        log: &mpsc::UnboundedSender<String>,
    ) -> Result<String> {
        let id = build::build_from_image(&self.inner.api, image, registry, def, log).await?;
        self.inner.builds.record(&id, false);
        Ok(id)
    }
}

impl Inner {
    fn http(&self) -> &reqwest::Client {
        &self.api.http
    }

    /// Records where `sb`'s envd is and returns it.
    fn remember(&self, sb: &SandboxJson) -> Envd {
        let mut envds = self.envds.lock().expect("envds");
        let old = envds.get(&sb.sandbox_id);
        // A get answer may omit what create returned (token, domain): keep the old values.
        let domain = sb.domain.clone().filter(|d| !d.is_empty()).or_else(|| old.and_then(|e| e.domain.clone()));
        let token = sb.envd_access_token.clone().or_else(|| old.and_then(|e| e.token().map(str::to_string)));
        let version = sb.envd_version.clone().or_else(|| old.and_then(|e| e.version.clone()));
        let traffic = sb.traffic_access_token.clone().or_else(|| old.and_then(|e| e.traffic().map(str::to_string)));
        let base = self.api.cfg.envd_url(&sb.sandbox_id, domain.as_deref());
        let e = Envd::new(&sb.sandbox_id, base, domain, version, token).with_traffic(traffic);
        envds.insert(sb.sandbox_id.clone(), e.clone());
        e
    }

    /// envd of sandbox `id`, asking the API the first time.
    async fn envd(&self, id: &str) -> Result<Envd> {
        if let Some(e) = self.envds.lock().expect("envds").get(id) {
            return Ok(e.clone());
        }
        let sb = self.api.get(id).await?;
        Ok(self.remember(&sb))
    }

    fn track(&self, id: &str) {
        let mut created = self.created.lock().expect("created");
        created.insert(id.to_string());
        let mut st = self.stats.lock().expect("stats");
        st.created += 1;
        st.live = created.len() as u64;
        st.peak_live = st.peak_live.max(st.live);
    }

    fn untrack(&self, id: &str) {
        let mut created = self.created.lock().expect("created");
        if created.remove(id) {
            let mut st = self.stats.lock().expect("stats");
            st.destroyed += 1;
            st.live = created.len() as u64;
        }
    }

    fn forget(&self, id: &str) {
        self.envds.lock().expect("envds").remove(id);
        self.port_bases.lock().expect("ports").retain(|_, sb| sb != id);
        self.procs.forget_sandbox(id);
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        let existed = self.api.kill(id).await?;
        self.untrack(id);
        self.forget(id);
        Ok(existed)
    }

    async fn rpc<T: serde::de::DeserializeOwned>(
        &self,
        envd: &Envd,
        rpc: &str,
        body: &JsonValue,
        user: Option<&str>,
        what: &str,
    ) -> Result<T, RpcError> {
        envd.unary(self.http(), rpc, body, user, what).await
    }

    /// A unary call about process `pid` whose answer is only success: a missing process is
    /// "no such process".
    async fn process_call(
        &self,
        envd: &Envd,
        id: &str,
        pid: u32,
        rpc: &str,
        body: &JsonValue,
        what: &str,
    ) -> Result<()> {
        self.rpc::<JsonValue>(envd, rpc, body, None, what).await.map_err(|e| process_error(e, pid, what, id))?;
        Ok(())
    }

    async fn send_signal(&self, envd: &Envd, pid: u32, name: &str) -> Result<(), RpcError> {
        let body = json!({ "process": { "pid": pid }, "signal": name });
        self.rpc::<JsonValue>(envd, "process.Process/SendSignal", &body, None, &format!("signal process {pid}"))
            .await
            .map(|_| ())
    }

    /// Starts `req` and reads its start event; feeds stdin if given, or (`open_stdin`) leaves
    /// its stdin open for `SendInput` by pid.
    async fn start(
        &self,
        envd: &Envd,
        req: &ExecRequest,
        open_stdin: bool,
        what: &str,
    ) -> Result<(Arc<Proc>, RpcStream)> {
        let user = req.user.as_deref();
        let mut body = process::start_body(req);
        if open_stdin {
            body["stdin"] = json!(true);
        }
        let mut stream = envd
            .stream(self.http(), "process.Process/Start", &body, user, req.timeout, what)
            .await
            .map_err(|e| e.into_provider(what, &envd.id))?;
        let pid = tokio::time::timeout(envd::OPEN_TIMEOUT, process::read_start(&mut stream, what))
            .await
            .map_err(|_| {
                ProviderError::new(
                    ErrorKind::Timeout,
                    format!("{what}: no start event within {:?}", envd::OPEN_TIMEOUT),
                )
            })?
            .map_err(|e| e.into_provider(what, &envd.id))?;
        let proc = Proc::new(pid, req.cmd.clone(), req.max_output);
        if let Some(input) = req.stdin.as_ref().filter(|_| !open_stdin) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(input);
            let fed = async {
                if !input.is_empty() {
                    let body = json!({ "process": { "pid": pid }, "input": { "stdin": b64 } });
                    self.rpc::<JsonValue>(envd, "process.Process/SendInput", &body, user, "send stdin").await?;
                }
                // CloseStdin exists from envd 0.5.2; older ones keep stdin open.
                if !envd.at_least((0, 5, 2)) {
                    return Ok(JsonValue::Null);
                }
                let body = json!({ "process": { "pid": pid } });
                self.rpc::<JsonValue>(envd, "process.Process/CloseStdin", &body, user, "close stdin").await
            };
            if let Err(e) = fed.await {
                let _ = self.send_signal(envd, pid, "SIGNAL_SIGKILL").await;
                return Err(e.into_provider(&format!("{what}: feed stdin"), &envd.id));
            }
        }
        Ok((proc, stream))
    }

    /// Attaches to a running process this provider did not start (`Process/Connect`).
    async fn attach(self: &Arc<Self>, id: &str, pid: u32) -> Result<Arc<Proc>> {
        let envd = self.envd(id).await?;
        let what = format!("attach to process {pid}");
        let body = json!({ "process": { "pid": pid } });
        let not_found = |e: RpcError| process_error(e, pid, &what, id);
        let mut stream =
            envd.stream(self.http(), "process.Process/Connect", &body, None, None, &what).await.map_err(not_found)?;
        let pid = process::read_start(&mut stream, &what).await.map_err(not_found)?;
        let proc = Proc::new(pid, String::new(), None);
        self.procs.insert(id, proc.clone());
        tokio::spawn(process::drive(stream, proc.clone(), None, what, id.to_string()));
        Ok(proc)
    }

    async fn entry(&self, envd: &Envd, rpc: &str, body: &JsonValue, what: &str) -> Result<FileEntry> {
        let r: EntryResponse =
            self.rpc(envd, rpc, body, None, what).await.map_err(|e| e.into_provider(what, &envd.id))?;
        r.entry
            .and_then(|e| e.entry())
            .ok_or_else(|| ProviderError::infra(format!("{what}: envd returned no usable entry")))
    }

    /// A filesystem call whose request is only `{path}`. Its error is left to the caller, as
    /// some are answers (`not_found` to exists, `already_exists` to make_dir).
    async fn path_call<T: serde::de::DeserializeOwned>(
        &self,
        envd: &Envd,
        call: &str,
        path: &str,
        what: &str,
    ) -> Result<T, RpcError> {
        self.rpc(envd, &format!("filesystem.Filesystem/{call}"), &json!({ "path": path }), None, what).await
    }

    async fn stat(&self, envd: &Envd, path: &str) -> Result<FileEntry> {
        self.entry(envd, "filesystem.Filesystem/Stat", &json!({ "path": path }), &format!("stat {path}")).await
    }

    /// Kills every tracked sandbox; returns how many existed.
    async fn kill_all(self: &Arc<Self>) -> usize {
        let ids: Vec<String> = self.created.lock().expect("created").iter().cloned().collect();
        let mut set = tokio::task::JoinSet::new();
        for id in ids {
            let inner = self.clone();
            set.spawn(async move { inner.kill(&id).await });
        }
        let mut count = 0;
        while let Some(r) = set.join_next().await {
            if matches!(r, Ok(Ok(true))) {
                count += 1;
            }
        }
        count
    }
}

/// Decrements the in-flight create counter even if the create task panics.
struct InFlight(Arc<Inner>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.in_flight_changed.notify_waiters();
    }
}

/// SIGKILLs a foreground command whose `exec` future was dropped before it ended.
struct KillOnDrop {
    inner: Arc<Inner>,
    envd: Envd,
    proc: Option<Arc<Proc>>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(p) = self.proc.take() else { return };
        if p.finished() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (inner, envd) = (self.inner.clone(), self.envd.clone());
            rt.spawn(async move {
                let _ = inner.send_signal(&envd, p.pid, "SIGNAL_SIGKILL").await;
            });
        }
    }
}

#[async_trait]
impl Provider for E2bProvider {
    fn name(&self) -> &str {
        self.inner.api.cfg.preset.name()
    }

    fn client_env(&self) -> BTreeMap<String, String> {
        self.inner.api.cfg.client_env()
    }

    fn keep(&self, id: &str) {
        let inner = &self.inner;
        let mut created = inner.created.lock().expect("created");
        if created.remove(id) {
            inner.stats.lock().expect("stats").live = created.len() as u64;
        }
        inner.kept.lock().expect("kept").insert(id.to_string());
    }

    fn is_kept(&self, id: &str) -> bool {
        self.inner.kept.lock().expect("kept").contains(id)
    }

    fn required_credentials(&self) -> Vec<String> {
        self.inner.api.cfg.required_credentials()
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        if !req.mounts.is_empty() {
            return Err(ProviderError::unsupported("host directory mounts: E2B's create has none"));
        }
        let inner = self.inner.clone();
        inner.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(inner.clone());
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let _guard = guard;
            let now = now_secs();
            let sb = match inner.api.create(&req).await {
                Ok(sb) => sb,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let id = sb.sandbox_id.clone();
            inner.track(&id);
            let envd = inner.remember(&sb);
            let too_old = envd.version.as_deref().and_then(envd::parse_version).filter(|v| *v < (0, 1, 0));
            let mut info = sb.info(now, now + req.timeout_secs.unwrap_or(api::DEFAULT_TIMEOUT_SECS));
            if sb.alias.as_deref().is_none_or(str::is_empty) && !req.template.is_empty() {
                info.template = req.template.clone();
            }
            if info.metadata.is_empty() {
                info.metadata = req.metadata.clone();
            }
            let verdict = if too_old.is_some() {
                Err(ProviderError::invalid(format!(
                    "template `{}` runs envd {}, older than 0.1.0: rebuild the template",
                    info.template,
                    envd.version.as_deref().unwrap_or("?")
                )))
            } else if inner.shutting_down.load(Ordering::SeqCst) {
                Err(ProviderError::infra("provider is shutting down"))
            } else {
                Ok(info)
            };
            let keep = verdict.is_ok();
            if tx.send(verdict).is_err() || !keep {
                let _ = inner.kill(&id).await;
            }
        });
        rx.await.map_err(|_| ProviderError::infra("sandbox creation failed unexpectedly"))?
    }

    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo> {
        let now = now_secs();
        let sb = self.inner.api.connect(id, timeout_secs).await?;
        self.inner.remember(&sb);
        match self.inner.api.get(id).await {
            Ok(detail) => {
                self.inner.remember(&detail);
                Ok(detail.info(now, now))
            }
            Err(_) => Ok(sb.info(now, now + timeout_secs.unwrap_or(api::DEFAULT_TIMEOUT_SECS))),
        }
    }

    async fn info(&self, id: &str) -> Result<SandboxInfo> {
        let sb = self.inner.api.get(id).await?;
        self.inner.remember(&sb);
        Ok(sb.info(0, 0))
    }

    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let mut out: Vec<SandboxInfo> = self.inner.api.list(metadata).await?.iter().map(|s| s.info(0, 0)).collect();
        out.sort_by_key(|i| (i.started_at, i.id.clone()));
        Ok(out)
    }

    async fn list_with_key(&self, api_key: &str, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let api = api::Api::new(self.inner.api.http.clone(), self.inner.api.cfg.with_api_key(api_key));
        Ok(api.list(metadata).await?.iter().map(|s| s.info(0, 0)).collect())
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        self.inner.kill(id).await
    }

    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        self.inner.api.set_timeout(id, timeout_secs).await
    }

    async fn destroy_all(&self) -> usize {
        let inner = &self.inner;
        inner.shutting_down.store(true, Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + DESTROY_DEADLINE;
        let mut count = 0;
        loop {
            count += match tokio::time::timeout_at(deadline, inner.kill_all()).await {
                Ok(n) => n,
                Err(_) => break,
            };
            // Creations still under way register (and, seeing the flag, kill) their sandbox.
            while inner.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
                let changed = inner.in_flight_changed.notified();
                let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
            }
            if inner.created.lock().expect("created").is_empty() || tokio::time::Instant::now() >= deadline {
                break;
            }
            // Kills that failed: try again shortly, until the deadline.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        inner.shutting_down.store(false, Ordering::SeqCst);
        count
    }

    fn destroy_all_now(&self) {
        let ids: Vec<String> = self.inner.created.lock().expect("created").iter().cloned().collect();
        if ids.is_empty() {
            return;
        }
        // Fire the DELETEs from a fresh runtime and client on a thread of their own: the
        // caller's runtime may be busy or winding down. Bounded by the request timeout.
        let cfg = self.inner.api.cfg.clone();
        let t = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            let Ok(http) = http_client() else { return };
            let api = Arc::new(Api::new(http, cfg));
            rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for id in ids {
                    let api = api.clone();
                    set.spawn(async move { tokio::time::timeout(Duration::from_secs(3), api.kill(&id)).await });
                }
                while set.join_next().await.is_some() {}
            });
        });
        let _ = t.join();
    }

    fn stats(&self) -> ProviderStats {
        self.inner.stats.lock().expect("stats").clone()
    }

    fn features(&self) -> crate::provider::Features<'_> {
        // FC allowlists pause, and has no snapshots.
        let e2b = self.inner.api.cfg.preset == Preset::E2b;
        crate::provider::Features {
            pausing: e2b.then_some(self),
            snapshots: e2b.then_some(self),
            ..crate::provider::caps::features!(
                self; processes, live_processes, pty, files, watch_dirs, ports, builds, network_control
            )
        }
    }
}

/// An envd error about process `pid`: `not_found` is "no such process", the rest as usual.
fn process_error(e: RpcError, pid: u32, what: &str, id: &str) -> ProviderError {
    match e.code() {
        Some("not_found") => ProviderError::not_found(format!("no such process: {pid}")),
        _ => e.into_provider(what, id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_without_key_succeeds_and_names_the_variable() {
        let env = BTreeMap::new();
        let p = E2bProvider::new(Preset::Alicloud, &env).unwrap();
        assert_eq!(p.name(), "alicloud");
        assert_eq!(p.required_credentials(), vec!["ABX_SANDBOX_API_KEY"]);
        let p = E2bProvider::new(Preset::E2b, &env).unwrap();
        assert_eq!(p.name(), "e2b");
        assert_eq!(p.required_credentials(), vec!["E2B_API_KEY"]);
    }

    #[test]
    fn debug_hides_the_key() {
        let env = BTreeMap::from([("E2B_API_KEY".to_string(), "e2b_topsecret".to_string())]);
        let p = E2bProvider::new(Preset::E2b, &env).unwrap();
        assert!(p.required_credentials().is_empty());
        assert!(!format!("{p:?}").contains("topsecret"));
    }

    #[test]
    fn port_headers_only_for_urls_we_handed_out() {
        let base = "http://8000-abc.localhost:3000";
        assert!(under("http://8000-abc.localhost:3000", base));
        assert!(under("http://8000-abc.localhost:3000/index.html", base));
        assert!(under("http://8000-abc.localhost:3000?x=1", base));
        assert!(!under("http://8000-abc.localhost:30001/", base));
        assert!(!under("http://8000-abc.localhost:3000.evil.example/", base));
        assert!(!under("https://example.com/", base));
        let p = E2bProvider::new(Preset::E2b, &BTreeMap::new()).unwrap();
        p.inner.envds.lock().unwrap().insert(
            "abc".into(),
            Envd::new("abc", "http://h".into(), None, None, Some("t".into())).with_traffic(Some("traffic".into())),
        );
        p.inner.port_bases.lock().unwrap().insert(base.into(), "abc".into());
        assert_eq!(p.port_headers(&format!("{base}/x")), vec![("e2b-traffic-access-token".into(), "traffic".into())]);
        assert!(p.port_headers("http://127.0.0.1:3000/x").is_empty());
        p.inner.forget("abc");
        assert!(p.port_headers(&format!("{base}/x")).is_empty());
    }

    #[test]
    fn helpers() {
        assert_eq!(short("echo hi"), "echo hi");
        assert_eq!(short("a\nb"), "a…");
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}

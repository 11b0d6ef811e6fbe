//! The local provider: sandboxes on this machine, isolated with Linux namespaces.
//!
//! [`LocalProvider`] owns the registry of sandboxes it created, their lifecycle (creation,
//! expiry at their end time, kill, shutdown) and the counters behind [`Provider::stats`]. The
//! pieces live in submodules:
//!
//! * `sandbox` — starting one namespaced sandbox (bubblewrap over a private-mount-namespace
//!   overlay of `/`; see there for why bwrap), probing whether that works, stopping it;
//! * `process` — running commands inside (via nsenter), the process table, timeouts;
//! * `files` — the sandbox's files from the host via `/proc/<pid1>/root` and
//!   `openat2(RESOLVE_IN_ROOT)`;
//! * `super::forward` — host loopback ports forwarded into the sandbox's network namespace;
//! * `sys` — the few raw system calls (pidfd, openat2) and the spawner thread;
//! * `build` — template builds: a Dockerfile applied in a networked build sandbox whose
//!   overlay upper directory becomes a layer that `create` stacks over `/` (see there);
//!   `layer` — the finished layer; `templates` — builds made once per digest and registered;
//! * `create` — a create, from its checks to its boot (`warm`, `boot`); `ready` — a deployed
//!   template's start and ready probe;
//! * `pool` — the refill machine of what is made ahead (networks, disk images, spares);
//! * `kill` — the synchronous last resort; `errors` — the errors the pieces share.
//!
//! Templates: an unknown name (and `base`) is the host's root. A name registered by `build`
//! stacks that layer and applies its ENV and WORKDIR; one registered by `deploy` also runs the
//! template's start command at create and waits for its ready command (or its ports).
//!
//! # Isolation
//!
//! With [`Isolation::Namespaces`] each sandbox has its own writable root view (an overlay over
//! the host's `/`, so templates are "the host, copy-on-write"), a private `/tmp`, its own
//! `/home/user` (HOME and default cwd), its own PID namespace (killing the sandbox kills every
//! process in it), its own network namespace (only `lo`, up; ports are reached through
//! [`Ports::port_url`]), and its own IPC/UTS/cgroup namespaces. Two sandboxes can write
//! the same absolute path and bind the same port without noticing each other. This needs root
//! (`CAP_SYS_ADMIN`), `bwrap` and `nsenter`.
//!
//! [`Isolation::Auto`] probes once whether that works and otherwise falls back to
//! [`Isolation::None`] with one warning ([`LocalProvider::warning`]). Without isolation a
//! sandbox is only a per-sandbox directory pair, and this is what is lost:
//!
//! * **filesystem**: only `/home/user` and `/tmp` (and paths below them) are private — the
//!   file operations rewrite them to the sandbox's directories and processes get HOME, cwd
//!   and TMPDIR pointing there. Every other path is the host's own, shared by all sandboxes
//!   and writable with the runner's rights; commands that spell out `/home/user` or `/tmp`
//!   literally reach the host's directories.
//! * **network**: sandboxes share the host's network; two sandboxes cannot bind the same
//!   port, and `port_url` is simply `http://127.0.0.1:<port>`.
//! * **processes**: sandboxes share the host's PID space; pids are host pids, processes can
//!   see and signal each other, and kill only reaches the process groups the provider started
//!   (a process that calls `setsid`/`setpgid` escapes it).
//!
//! # Waiting
//!
//! Every wait on something external has a timeout, blocking filesystem work runs under
//! `spawn_blocking`, and children are tokio processes. The one exception is the isolation
//! probe in the synchronous constructor (tens of milliseconds, once per state directory).
//! A `Drop` never waits: it kills at once and hands what must wait for the processes to go
//! (removing cgroups, mount points and directories) to a cleanup thread (`reaper`), which
//! the process's way out waits for ([`wait_for_cleanups`]).
//!
//! Background processes: `spawn` starts one and forgets its output until `wait`;
//! `spawn_live` also streams the output as it comes and can keep stdin open (`write_stdin`,
//! `close_stdin`), which is what `scenario-run serve` needs for E2B's `Process/Start`.
//!
//! The `user` field of an exec request is ignored: every command runs as the invoking user
//! (root, for namespaces).

mod boot;
mod build;
mod build_cache;
mod caps;
mod cgroup;
mod create;
mod disk;
mod dns;
mod egress;
mod enter;
mod errors;
mod fds;
mod files;
mod kill;
mod layer;
pub mod layer_cache;
pub mod lru;
mod netns;
mod pool;
mod process;
mod proxy;
mod pty;
mod ready;
mod reaper;
mod sandbox;
mod seccomp;
mod sys;
mod templates;

/// The process-lifetime thread that forks commands (their `PR_SET_PDEATHSIG` follows it).
pub(crate) use sys::on_spawner;
mod userns;
mod warm;
mod watch;

use super::core::{self, no_sandbox, now_ms, Core, Host, Life, Member};
use crate::provider::caps::*;
use crate::provider::core::Controlled as _;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{
    BuildOutput, BuildSpec, CreateRequest, DeployOutput, ExecRequest, ExecResult, FileEntry, LiveProcess, OutputTx,
    Provider, ProviderError, ProviderStats, Result, SandboxInfo, Usage,
};
use crate::image::{IdMap, ImageStore};
use boot::{Boot, Freezer};
use cgroup::Limits;
use enter::Identity;
use errors::{net_error, no_policy_without_isolation};
use files::Root;
use layer::Layer;
use process::{ProcTable, Target};
use sandbox::{Layout, NsSandbox};

/// Waits (at most `timeout`) for the cleanups a drop handed off (see `reaper`): a killed
/// sandbox's cgroup and directories, removed once its processes are gone. The way out of the
/// process calls it, so an exit right after a drop leaves nothing behind. True if all are done.
pub fn wait_for_cleanups(timeout: Duration) -> bool {
    reaper::wait(timeout)
}

/// Marks every descriptor this process inherited above stderr close-on-exec, so none reaches
/// a sandbox, a build or any command started later: a shell, a CI runner or an IDE often
/// leaves one open on a directory, through which a sandbox could read or write host files.
/// `main` calls it first thing; sandboxes close what is above their own descriptors anyway.
pub fn seal_inherited_descriptors() {
    // A kernel without CLOSE_RANGE_CLOEXEC (before 5.11): each entry into a sandbox still
    // marks its own descriptors (and fails loudly there).
    let _ = sys::cloexec_from(3);
}

/// Sandbox lifetime when `create` does not say.
pub const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// The image `base` (and a `create` with no template) starts from.
pub const BASE_IMAGE: &str = "base";

/// How sandboxes are isolated from the host and from each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Namespaces if they work here, else no isolation (with a warning).
    #[default]
    Auto,
    /// Namespaces or fail.
    Namespaces,
    /// Per-sandbox directories only; see the module documentation for what is lost.
    None,
}

/// Options of [`LocalProvider::new`].
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Where per-sandbox state lives (overlay layers, home directories). Default:
    /// `$SCENARIO_RUN_STATE_DIR`, else `/tmp/scenario-run-<uid>`.
    pub state_dir: PathBuf,
    pub isolation: Isolation,
    /// Where root filesystems come from (`base`, and what a template's `FROM` names).
    pub images: ImageStore,
}

impl LocalOptions {
    pub fn default_state_dir() -> PathBuf {
        match std::env::var_os("SCENARIO_RUN_STATE_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => PathBuf::from(format!("/tmp/scenario-run-{}", rustix::process::getuid().as_raw())),
        }
    }
}

impl Default for LocalOptions {
    fn default() -> Self {
        Self { state_dir: Self::default_state_dir(), isolation: Isolation::Auto, images: ImageStore::shared() }
    }
}

/// Sandboxes on this machine. See the module documentation.
pub struct LocalProvider {
    inner: Arc<Inner>,
    isolation: Isolation,
    warning: Option<String>,
}

struct Inner {
    state_dir: PathBuf,
    namespaces: bool,
    /// Registry, counters and creation guard (shared with the docker provider).
    core: Core<Sandbox>,
    /// Template builds by digest: each is made once per provider (per run).
    builds: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<Arc<Layer>>>>>,
    /// Templates `create` knows by name: registered by `build` (layer only) or `deploy`.
    templates: Mutex<HashMap<String, Registered>>,
    /// Directories of builds under way: a build cancelled mid-way (Ctrl-C) never finishes its
    /// own cleanup, so `remove_builds` removes what is left here.
    building: Mutex<std::collections::HashSet<PathBuf>>,
    /// Root filesystems: `base` and the images templates are built from.
    images: ImageStore,
    /// The host id range of every sandbox's user namespace.
    ids: IdMap,
    /// Networks made ahead for sandboxes and builds (see `netns`).
    nets: Arc<netns::Pool>,
    /// Disk images made ahead for sandboxes (see `disk`).
    disks: Arc<disk::Pool>,
    /// The disks live sandboxes declare, held against the state directory's free space.
    disk_book: Arc<disk::Book>,
    /// What boots a sandbox, and the sandboxes booted ahead (see `warm`).
    booter: Arc<warm::Booter>,
    warm: warm::Pool,
}

/// A template `create` can stack.
type Registered = super::registered::Registered<Layer>;

enum Iso {
    /// Its current boot (replaced when a filesystem-only pause is resumed) and how to boot it.
    Ns {
        boot: std::sync::RwLock<Arc<Boot>>,
        layout: Box<Layout>,
    },
    Plain {
        home: PathBuf,
        tmp: PathBuf,
        bash_env: PathBuf,
    },
}

/// The local provider's record of one sandbox it runs: its directory, id range, isolation,
/// processes, pause state and egress (what its `SandboxInfo` is made from). Each boot's
/// namespaces are an `NsSandbox`.
struct Sandbox {
    id: String,
    template: String,
    metadata: BTreeMap<String, String>,
    /// The image's and template's ENV and the create-time envs (isolated sandboxes add the
    /// user's HOME, USER and a default PATH below them; without isolation this is the whole
    /// base environment).
    envs: BTreeMap<String, String>,
    started_at: u64,
    life: Life,
    dir: PathBuf,
    /// Default working directory: the template's WORKDIR, else the user's home.
    workdir: Option<String>,
    /// The sandbox's id range on the host.
    ids: IdMap,
    iso: Iso,
    procs: ProcTable,
    /// Frozen by `pause` (its cgroup's freezer) until `resume`.
    paused: std::sync::atomic::AtomicBool,
    /// Paused filesystem-only: its processes are gone and `resume` boots it again.
    cold: std::sync::atomic::AtomicBool,
    /// The layers under its own writable one (topmost first), and the environment its
    /// template gives (without create's): what a snapshot of it stacks and keeps.
    lowers: Vec<PathBuf>,
    template_envs: BTreeMap<String, String>,
    /// Its network (isolated sandboxes): kept across boots, with its policy.
    net: Option<Arc<netns::Net>>,
    /// Its declared disk's place in the disk book (isolated sandboxes), given back with it.
    _disk: Option<disk::Claim>,
    /// `lifecycle: { on_timeout: pause }`: paused at its end time (keeping its memory or
    /// not) instead of killed.
    pause_at_end: Option<bool>,
}

impl Sandbox {
    /// Enforces `policy` on the sandbox's network from now on.
    async fn apply_network(&self, policy: egress::Policy) -> Result<()> {
        match &self.net {
            Some(net) => net
                .apply(policy)
                .await
                .map_err(|e| net_error(format!("cannot set sandbox {}'s network policy", self.id), e)),
            None if policy.is_open() => Ok(()),
            None => Err(no_policy_without_isolation()),
        }
    }
}

impl Member for Sandbox {
    fn id(&self) -> &str {
        &self.id
    }
    fn life(&self) -> &Life {
        &self.life
    }
}

/// Removes sandbox directories whose owner process is gone: what a SIGKILLed run leaves on
/// disk (its sandboxes themselves died with it, and their mounts lived only in their own
/// mount namespaces). Directories of live runs sharing the state directory are left alone;
/// one without an owner file is removed only when it is over ten minutes old.
fn sweep_stale(state_dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(state_dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        // Kept builds, and the cache of builds (its entries go by `layer_cache::evict` only).
        if !path.is_dir() || path.join(build::KEEP_FILE).exists() || path == layer_cache::dir(state_dir) {
            continue;
        }
        let stale = match std::fs::read_to_string(path.join(crate::owner::FILE)) {
            Ok(token) => crate::owner::token_gone(&token),
            // One being made (`owner::create_dir`) says its owner in its name.
            Err(_) => crate::owner::unfinished_gone(&e.file_name().to_string_lossy()).unwrap_or_else(|| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age > Duration::from_secs(600))
            }),
        };
        if stale {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// Probe results by state directory: "probes once".
fn probe_cached(state_dir: &Path, ids: IdMap) -> std::result::Result<(), sandbox::ProbeError> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, std::result::Result<(), sandbox::ProbeError>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(r) = cache.lock().expect("probe cache").get(state_dir) {
        return r.clone();
    }
    let r = sandbox::probe(state_dir, ids);
    cache.lock().expect("probe cache").insert(state_dir.to_path_buf(), r.clone());
    r
}

impl LocalProvider {
    /// Prepares the state directory and settles the isolation (probing namespaces for
    /// [`Isolation::Auto`] and [`Isolation::Namespaces`]).
    pub fn new(opts: LocalOptions) -> Result<Self> {
        std::fs::create_dir_all(&opts.state_dir).map_err(|e| {
            ProviderError::infra(format!("cannot create state directory {}: {e}", opts.state_dir.display()))
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&opts.state_dir, std::fs::Permissions::from_mode(0o700));
        }
        sweep_stale(&opts.state_dir);
        cgroup::sweep();
        sandbox::sweep_mount_points();
        let (isolation, warning) = match opts.isolation {
            Isolation::None => (Isolation::None, None),
            Isolation::Namespaces => {
                probe_cached(&opts.state_dir, opts.images.ids())
                    .map_err(|why| ProviderError::infra(format!("namespaces are not usable here: {why}")))?;
                (Isolation::Namespaces, None)
            }
            Isolation::Auto => match probe_cached(&opts.state_dir, opts.images.ids()) {
                Ok(()) => (Isolation::Namespaces, None),
                Err(why) => (
                    Isolation::None,
                    Some(format!(
                        "local sandboxes are NOT isolated ({why}): they share the host's network and ports, \
                         its PID space and its root filesystem; only /home/user and /tmp are per-sandbox \
                         directories. Run as root with bubblewrap and nsenter installed for isolation."
                    )),
                ),
            },
        };
        let disk_book = disk::Book::from_var(std::env::var(disk::OVERCOMMIT_VAR).ok().as_deref())
            .map_err(ProviderError::invalid)?;
        let ids = opts.images.ids();
        let nets = netns::Pool::new();
        let disks = disk::Pool::new(&opts.state_dir, Box::new(move |seed: &Path| sandbox::write_disk_seed(seed, ids)));
        let booter = Arc::new(warm::Booter::new(opts.state_dir.clone(), ids, nets.clone(), disks.clone()));
        let warm = warm::Pool::new(booter.clone());
        Ok(Self {
            inner: Arc::new(Inner {
                state_dir: opts.state_dir.clone(),
                namespaces: isolation == Isolation::Namespaces,
                core: Core::default(),
                builds: Mutex::new(HashMap::new()),
                templates: Mutex::new(HashMap::new()),
                building: Mutex::new(std::collections::HashSet::new()),
                ids,
                images: opts.images,
                nets,
                disks,
                disk_book,
                booter,
                warm,
            }),
            isolation,
            warning,
        })
    }

    /// The one warning to show when [`Isolation::Auto`] fell back to no isolation, or when
    /// limits are enforced by rlimits only.
    pub fn warning(&self) -> Option<String> {
        if self.warning.is_some() {
            return self.warning.clone();
        }
        match cgroup::Enforcement::get() {
            e @ cgroup::Enforcement::Rlimits(_) if self.inner.namespaces => {
                Some(format!("sandbox limits are weaker here: {}", e.describe()))
            }
            _ => None,
        }
    }

    /// How cpu, memory and process limits are enforced (for reports and docs/reference.md).
    pub fn limits_enforcement(&self) -> String {
        cgroup::Enforcement::get().describe()
    }

    /// The isolation in effect ([`Isolation::Namespaces`] or [`Isolation::None`]).
    pub fn isolation(&self) -> Isolation {
        self.isolation
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state_dir
    }

    fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.inner.get(id)
    }

    /// Sandbox `id`'s root acting as its user `user`, and `path` made absolute: what the reads
    /// made with a user's rights go through.
    fn root_as(&self, id: &str, path: &str, user: &str) -> Result<(files::Root, String)> {
        let sb = self.get(id)?;
        let (root, abs, who) = (sb.root()?, files::normalize(path)?, sb.identity(user)?);
        Ok((root.acting_as(who), abs))
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
            state: if self.is_paused() { "paused" } else { "running" }.into(),
        }
    }

    fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Its current boot, if it is isolated.
    fn boot(&self) -> Option<Arc<Boot>> {
        match &self.iso {
            Iso::Ns { boot, .. } => Some(boot.read().expect("boot").clone()),
            Iso::Plain { .. } => None,
        }
    }

    fn is_cold(&self) -> bool {
        self.cold.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The cgroup that pauses it: only isolated sandboxes with cgroups have one.
    fn freezer(&self) -> Result<Freezer> {
        self.boot()
            .filter(|b| b.ns.cgroup().is_some())
            .map(Freezer)
            .ok_or_else(|| ProviderError::unsupported("pausing needs isolated sandboxes with cgroups (a freezer)"))
    }

    /// Not gone: running, or paused (a filesystem-only paused one has no processes to check).
    fn alive(&self) -> bool {
        !self.life.is_gone() && (self.is_cold() || self.boot().is_none_or(|b| b.ns.alive()))
    }

    /// Where `req` runs: as its user (default: the sandbox user `user`), with its full
    /// environment (`req.envs` on top) and its working directory (default: the template's
    /// WORKDIR, else the user's home).
    fn plan(&self, req: &ExecRequest) -> Result<(Target, BTreeMap<String, String>, String)> {
        match &self.iso {
            Iso::Ns { .. } => {
                let who = self.identity(req.user.as_deref().unwrap_or("user"))?;
                let entry = self.boot().expect("isolated").ns.entry.clone();
                let mut env = process::sandbox_env(&who);
                env.extend(self.envs.clone());
                env.extend(req.envs.clone());
                let cwd = files::normalize(req.cwd.as_deref().or(self.workdir.as_deref()).unwrap_or(&who.home))?;
                Ok((Target::Ns { entry, who }, env, cwd))
            }
            Iso::Plain { bash_env, home, tmp } => {
                let mut env = self.envs.clone();
                env.extend(req.envs.clone());
                let abs = files::normalize(req.cwd.as_deref().unwrap_or(files::HOME))?;
                let cwd = Root::plain_path(home, tmp, &abs).display().to_string();
                Ok((Target::Plain { bash_env: bash_env.clone() }, env, cwd))
            }
        }
    }

    /// `user` as the sandbox's own `/etc/passwd` and `/etc/group` define it.
    fn identity(&self, user: &str) -> Result<Identity> {
        let root = self.root()?;
        let read = |p: &str| root.read_as_host(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let (passwd, group) = (read("/etc/passwd"), read("/etc/group"));
        match Identity::lookup(user, &passwd, &group) {
            Some(who) => Ok(who),
            None if user == "user" => Ok(Identity::user()),
            None if user == "root" => Ok(Identity::root()),
            None => Err(ProviderError::invalid(format!("no such user in the sandbox: {user}"))),
        }
    }

    fn root(&self) -> Result<Root> {
        if !self.alive() || self.is_cold() {
            return Err(ProviderError::infra(format!("sandbox {} is not running", self.id)));
        }
        Ok(match &self.iso {
            Iso::Ns { boot, .. } => {
                Root::Proc { pid1: boot.read().expect("boot").ns.pid1.pid(), ids: self.ids, who: Identity::user() }
            }
            Iso::Plain { home, tmp, .. } => Root::Plain { home: home.clone(), tmp: tmp.clone() },
        })
    }

    /// Kills everything in the sandbox and removes its state. Idempotent.
    async fn teardown(&self) {
        match self.boot() {
            Some(b) => b.shut_down().await,
            None => self.procs.kill_groups(),
        }
        self.forget_processes().await;
        let dir = self.dir.clone();
        let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&dir));
        let _ = tokio::time::timeout(Duration::from_secs(10), rm).await;
    }

    /// Waits (bounded) for the processes it ran to be done, killing what is left.
    async fn forget_processes(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        for p in self.procs.all() {
            if !p.finished() {
                p.kill_tree();
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                p.wait_done(left).await;
            }
        }
    }

    /// Synchronous last resort.
    fn kill_now(&self) {
        match self.boot() {
            Some(b) => b.ns.stop_now(),
            None => self.procs.kill_groups(),
        }
    }
}

impl Inner {
    fn get(&self, id: &str) -> Result<Arc<Sandbox>> {
        self.core.get(id)
    }
}

#[async_trait]
impl Host for Inner {
    type Sandbox = Sandbox;
    fn core(&self) -> &Core<Sandbox> {
        &self.core
    }
    async fn teardown(&self, sb: &Arc<Sandbox>) {
        sb.teardown().await;
    }
    async fn at_end(&self, sb: &Arc<Sandbox>) -> bool {
        match sb.pause_at_end {
            Some(keep_memory) => sb.pause(keep_memory).await.is_ok(),
            None => false,
        }
    }
}

#[async_trait]
impl Provider for LocalProvider {
    fn name(&self) -> &str {
        "local"
    }

    /// Makes sure the `base` image is ready, building it on first use (about a minute), so a
    /// first run says what it is doing and how long it took before any scenario waits on it.
    async fn prepare(&self, log: mpsc::UnboundedSender<String>) -> Result<()> {
        if !self.inner.namespaces {
            return Ok(());
        }
        self.inner.images.get(BASE_IMAGE, None, &log).await?;
        Ok(())
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        for k in req.envs.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(ProviderError::invalid(format!("invalid environment variable name: {k:?}")));
            }
        }
        let inner = self.inner.clone();
        let sb = core::create(self.inner.clone(), async move { inner.create_sandbox(req).await }).await?;
        Ok(sb.info())
    }

    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo> {
        let sb = self.get(id)?;
        if !sb.alive() {
            // Died under us (e.g. pid 1 killed from outside): clean up and report it gone.
            core::kill(self.inner.as_ref(), id).await;
            return Err(no_sandbox(id));
        }
        if sb.is_paused() {
            self.resume(id, timeout_secs.unwrap_or(DEFAULT_RESUME_TIMEOUT_SECS)).await?;
        } else if let Some(t) = timeout_secs {
            sb.life.extend(t);
        }
        Ok(sb.info())
    }

    async fn info(&self, id: &str) -> Result<SandboxInfo> {
        Ok(self.get(id)?.info())
    }

    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let mut out: Vec<SandboxInfo> = self
            .inner
            .core
            .live()
            .iter()
            .filter(|sb| metadata.iter().all(|(k, v)| sb.metadata.get(k) == Some(v)))
            .map(|sb| sb.info())
            .collect();
        out.sort_by_key(|i| (i.started_at, i.id.clone()));
        Ok(out)
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        Ok(core::kill(self.inner.as_ref(), id).await)
    }

    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        self.get(id)?.life.extend(timeout_secs);
        Ok(())
    }

    /// `--keep-on-failure` and `create { keep: true }`: left alive at the run's end. A local
    /// sandbox still dies with this process, so a run that keeps one holds it open (see
    /// `cli::keep`).
    fn keep(&self, id: &str) {
        self.inner.core.keep(id);
    }

    fn is_kept(&self, id: &str) -> bool {
        self.inner.core.is_kept(id)
    }

    async fn destroy_all(&self) -> usize {
        self.inner.warm.close().await;
        core::destroy_all(&self.inner).await
    }

    fn destroy_all_now(&self) {
        self.inner.kill_all_now();
    }

    fn stats(&self) -> ProviderStats {
        self.inner.core.stats()
    }

    fn features(&self) -> crate::provider::Features<'_> {
        // Without namespaces a sandbox is a directory of the host's (no overlay, cgroup or
        // devpts of its own): no terminals, watches, pauses, snapshots or builds, as before
        // the capabilities were derived.
        let ns = self.inner.namespaces;
        crate::provider::Features {
            pty: ns.then_some(self),
            watch_dirs: ns.then_some(self),
            pausing: ns.then_some(self),
            snapshots: ns.then_some(self),
            builds: ns.then_some(self),
            network_control: ns.then_some(self),
            ..crate::provider::caps::features!(
                self; processes, live_processes, files, envd_files, ports, expose_host, metrics
            )
        }
    }
}

/// How long a sandbox resumed by `connect` without a timeout lives (E2B's default).
const DEFAULT_RESUME_TIMEOUT_SECS: u64 = 300;

/// Bytes under `dir` (a sandbox's writable layer and its bookkeeping; at most 200,000 entries
/// are counted) and the size of the filesystem holding it.
fn disk_usage(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let mut used = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            seen += 1;
            if seen > 200_000 {
                stack.clear();
                break;
            }
            let Ok(m) = e.metadata() else { continue };
            used += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    let total = rustix::fs::statvfs(dir).map_or(0, |sv| sv.f_blocks * sv.f_frsize);
    (used, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a dead run left is swept whether it got as far as its owner file or not; a live
    /// run's is kept, and so is an unowned directory younger than ten minutes (not ours to
    /// judge).
    #[test]
    fn the_sweep_takes_a_dead_runs_directories_made_or_half_made() {
        let state = tempfile::tempdir().unwrap();
        let at = |n: &str| state.path().join(n);
        let dead_token = "1:2";
        std::fs::create_dir(at("sbx-dead")).unwrap();
        std::fs::write(at("sbx-dead").join(crate::owner::FILE), dead_token).unwrap();
        // SIGKILLed between its mkdir and its rename (see owner::create_dir).
        std::fs::create_dir(at(".1.2.new-abcdef")).unwrap();
        crate::owner::create_dir(&at("sbx-live")).unwrap();
        let half_live = format!(".{}", crate::owner::name("new-123456"));
        std::fs::create_dir(at(&half_live)).unwrap();
        std::fs::create_dir(at("sbx-unowned")).unwrap();
        sweep_stale(state.path());
        let mut left: Vec<String> = std::fs::read_dir(state.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec![half_live, "sbx-live".to_string(), "sbx-unowned".to_string()];
        want.sort();
        assert_eq!(left, want);
    }
}

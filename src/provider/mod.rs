//! The provider seam: where sandboxes live.
//!
//! Everything the steps do to a sandbox goes through [`Provider`] and the capability traits it
//! hands out ([`caps`]), addressed by sandbox id so that the same traits serve the local
//! provider, the E2B-protocol client and the local E2B-compatible server. Providers report
//! failures as [`ProviderError`], whose kind decides
//! the scenario outcome (a missing file is a step failure; a broken provider is an ERROR).

pub mod caps;
pub(crate) mod core;
pub mod docker;
pub mod e2b;
pub mod factory;
pub(crate) mod forward;
pub mod local;
pub mod opensandbox;
pub(crate) mod output;
pub(crate) mod registered;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

pub use crate::error::{ErrorKind, ProviderError};
pub use crate::model::capability::Capability;
pub use crate::stats::ProviderStats;
pub use caps::{
    Builds, EnvdFiles, ExposeHost, Features, FileStream, Files, LiveProcesses, Metrics, NetworkControl, Pausing, Ports,
    Processes, Pty, SandboxRef, Snapshots, WatchDirs,
};

pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Home and default working directory of the sandbox user, on every provider.
pub const SANDBOX_HOME: &str = "/home/user";

/// Makes a sandbox `path` absolute (relative paths are under [`SANDBOX_HOME`]) and removes
/// `.`, `..` and repeated slashes. A `..` that would climb above `/` is rejected.
pub fn normalize_path(path: &str) -> Result<String> {
    if path.contains('\0') {
        return Err(ProviderError::invalid(format!("invalid path: {path:?}")));
    }
    let full = if path.starts_with('/') { path.to_string() } else { format!("{SANDBOX_HOME}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for c in full.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(ProviderError::invalid(format!("path escapes the sandbox root: {path}")));
                }
            }
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The most one read of a whole sandbox file into memory returns, on every provider
/// (`read-file`; serve's downloads on a provider that cannot stream them, and OpenSandbox's
/// downloads by lines): 1 GiB, as much as serve takes in one upload (`--max-upload`'s
/// default). A larger file is refused by its size before anything is read, and one that grows
/// while it is read is cut off at the limit and refused. serve's downloads from local
/// sandboxes stream from the open file ([`EnvdFiles::open_file_as`]) and have no limit. (`--max-output` bounds commands'
/// output, not files: a scenario may read back a file bigger than what it keeps of a command.)
pub const MAX_FILE_READ: u64 = 1 << 30;

/// The refusal of a file larger than [`MAX_FILE_READ`].
pub fn file_too_large(path: &str) -> ProviderError {
    ProviderError::invalid(format!(
        "is larger than {}, the most one read takes: {path}",
        crate::size::human(MAX_FILE_READ)
    ))
}

/// The refusal of a file whose content was asked for but that is not a regular file: `what`
/// it is ("a FIFO", "a character device", …). Reading a FIFO waits for a writer that may
/// never come, and a device may never end: neither is read.
pub fn not_regular(what: &str, path: &str) -> ProviderError {
    ProviderError::invalid(format!("is {what}, not a regular file: {path}"))
}

/// What a file of `mode` (`st_mode`'s type bits) is, for [`not_regular`]; `None` for a
/// regular file.
pub fn special_kind(mode: u32) -> Option<&'static str> {
    match mode & libc::S_IFMT {
        libc::S_IFREG => None,
        libc::S_IFIFO => Some("a FIFO"),
        libc::S_IFCHR => Some("a character device"),
        libc::S_IFBLK => Some("a block device"),
        libc::S_IFSOCK => Some("a socket"),
        libc::S_IFDIR => Some("a directory"),
        libc::S_IFLNK => Some("a symbolic link"),
        _ => Some("an unknown kind of file"),
    }
}

/// `create` arguments after rendering.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CreateRequest {
    pub template: String,
    /// Seconds until the sandbox expires by itself; `None` means the provider default.
    pub timeout_secs: Option<u64>,
    pub metadata: BTreeMap<String, String>,
    /// Environment of every process in the sandbox.
    pub envs: BTreeMap<String, String>,
    pub cpu: Option<u32>,
    pub memory_mb: Option<u64>,
    /// The sandbox's disk, MiB (Alibaba's `diskSizeMB`); `None`: the template's, else the
    /// provider's default.
    pub disk_mb: Option<u64>,
    /// Egress policy (E2B's `allow_internet_access` and `network.allowOut`/`denyOut`);
    /// `None` is the provider's default.
    pub network: Option<NetworkPolicy>,
    /// Host directories bound into the sandbox (OpenSandbox's volumes, through serve); a
    /// provider that cannot bind them refuses a create that asks.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// What happens at its end time (E2B's `lifecycle`); `None`: it is killed. A provider that
    /// cannot pause a sandbox at its end refuses a create that asks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// E2B's `lifecycle` (create's `autoPause`, `autoPauseMemory`, `autoResume`): at its end time
/// the sandbox is paused instead of killed, keeping its memory unless `keep_memory` is false;
/// with `auto_resume` traffic to the paused sandbox wakes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Lifecycle {
    pub pause_on_timeout: bool,
    pub keep_memory: bool,
    pub auto_resume: bool,
}

/// A host directory bound at a path inside a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    /// An existing directory on the provider's host, held open: the mount is made from this
    /// descriptor, never by its name (`crate::hostfs`).
    pub host: crate::hostfs::HostDir,
    /// Absolute, without `.` or `..` components.
    pub path: String,
    pub read_only: bool,
}

/// What a sandbox may reach outside itself, as E2B's create options and network update say:
/// an address is reachable if an `allow_out` entry contains it, else if internet access is on
/// and no `deny_out` entry contains it (`0.0.0.0/0` denies everything not allowed).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// `None`: the platform's default (on, for E2B).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_internet_access: Option<bool>,
    /// Addresses, CIDR ranges or domain names (`*.example.com`), each with an optional port
    /// or port range (`:443`, `:1-1024`): allowed, whatever `deny_out` says.
    #[serde(default)]
    pub allow_out: Vec<String>,
    /// Addresses or CIDR ranges (`0.0.0.0/0`: every address), with optional ports.
    #[serde(default)]
    pub deny_out: Vec<String>,
    /// E2B's `dnsServers`: the IPv4 nameservers a sandbox reaches (all traffic) while
    /// `allow_out` names a domain; `None` is E2B's default, 8.8.8.8, and `Some(vec![])` none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_servers: Option<Vec<String>>,
    /// E2B's `network.allowPublicTraffic` (create only): `Some(false)` makes the sandbox's
    /// ports private, reached only with its traffic access token; `None` is the platform's
    /// default. A provider without private ingress refuses `Some(false)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
}

pub use crate::templates::BuildSpec;

/// What [`Builds::build`] made.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BuildOutput {
    /// Where the result lives: an image name, or (local) the layer's path.
    pub image: String,
    /// Content hash of the template folder that was built.
    pub digest: String,
    /// An earlier build of the same digest was reused.
    pub cached: bool,
}

/// What [`Builds::deploy`] registered.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeployOutput {
    /// What `create { template: }` takes to start the deployed template.
    pub template_id: String,
    pub image: String,
    pub digest: String,
    pub cached: bool,
}

/// What a provider says about one sandbox, the same for every provider: what steps, the
/// CLI and serve read (each provider keeps its own private record of it, a `Sandbox`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SandboxInfo {
    pub id: String,
    pub template: String,
    pub metadata: BTreeMap<String, String>,
    /// Unix seconds.
    pub started_at: u64,
    /// Unix seconds when the sandbox expires.
    pub end_at: u64,
    pub state: String,
}

/// `exec` arguments after rendering.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ExecRequest {
    pub cmd: String,
    pub cwd: Option<String>,
    pub envs: BTreeMap<String, String>,
    pub user: Option<String>,
    pub stdin: Option<Vec<u8>>,
    /// Kill the command after this long; the result then has `timed_out`.
    pub timeout: Option<Duration>,
    /// Bytes of each stream to keep in the result (default [`MAX_OUTPUT`]); the rest is
    /// still streamed live, and counted in `stdout_dropped`/`stderr_dropped`.
    pub max_output: Option<usize>,
}

/// What a command's result keeps of each stream unless its request says otherwise: a
/// runaway `yes` must not take the machine's memory with it.
pub const MAX_OUTPUT: usize = 64 << 20;

/// One chunk of live output from a running command.
#[derive(Debug, Clone)]
pub enum OutputChunk {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// Where a command's live output goes. Bounded: a reader that falls behind makes the command
/// wait (its pipe fills), so a runaway writer never queues up memory.
pub type OutputTx = mpsc::Sender<OutputChunk>;

/// A live-output channel: [`OUTPUT_QUEUE`] chunks (each up to 16–64 KiB) in flight at most.
pub fn output_channel() -> (OutputTx, mpsc::Receiver<OutputChunk>) {
    mpsc::channel(OUTPUT_QUEUE)
}

/// How many output chunks a live-output channel holds before its writer waits.
pub const OUTPUT_QUEUE: usize = 64;

/// A finished command.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ExecResult {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// `None` when killed by a signal or still unknown.
    pub exit_code: Option<i32>,
    /// Signal number that ended it, if any.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub pid: u32,
    /// Bytes beyond `max_output` that the command wrote and the result does not hold.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// A background process started by [`LiveProcesses::spawn_live`] or [`Pty::spawn_pty`].
#[derive(Debug)]
pub struct LiveProcess {
    /// Pid inside the sandbox.
    pub pid: u32,
    /// Output as it is produced. Closed once the process has ended and its output is drained;
    /// [`Processes::wait`] then returns the final status at once.
    pub output: mpsc::Receiver<OutputChunk>,
}

/// A process started by `exec` in the sandbox.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub cmd: String,
    pub running: bool,
    pub exit_code: Option<i32>,
}

/// One entry of a directory listing, or the result of a stat.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FileEntry {
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// `file`, `dir` or `symlink`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
    /// Unix seconds.
    pub modified: u64,
}

/// What a sandbox uses now (E2B's sandbox metrics).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Usage {
    /// CPU time its processes used since it started, in microseconds.
    pub cpu_usec: u64,
    /// Memory in use and its limit, in bytes.
    pub mem_bytes: u64,
    pub mem_limit_bytes: u64,
    /// Bytes its own writable layer holds, and the size of the filesystem under it.
    pub disk_bytes: u64,
    pub disk_total_bytes: u64,
}

/// What happened to a file under a watched directory (envd's `EventType`, after Go's
/// fsnotify).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FsOp {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FsEvent {
    /// The path relative to the watched directory (`sub/file` in a recursive watch).
    pub name: String,
    pub op: FsOp,
}

/// A watch on a directory of a sandbox ([`WatchDirs::watch_dir`]); dropping it stops it.
pub trait DirWatch: Send + Sync {
    /// Every change seen since the last call, oldest first, including those the kernel has
    /// queued up to this call (a change made before the call is in its answer).
    fn drain(&self) -> Vec<FsEvent>;
    /// Notified when changes arrive (for a client that streams them).
    fn arrived(&self) -> std::sync::Arc<tokio::sync::Notify>;
}

/// Where sandboxes live: their lifecycle, and what the provider has beyond it.
///
/// All methods are cancel-safe to drop: the runner wraps every call in a timeout, and a
/// dropped `create` must not leak a sandbox (the provider tracks what it made and
/// [`Provider::destroy_all`] kills it). Work inside a sandbox goes through the capability
/// traits of [`caps`], handed out by [`Provider::features`]; `provider.sandbox(id)` is the
/// handle callers use.
#[async_trait]
pub trait Provider: Send + Sync {
    /// `local`, `docker`, `e2b`, `alicloud`, `opensandbox`.
    fn name(&self) -> &str;
    /// Names of environment variables that must be set for this provider to work.
    fn required_credentials(&self) -> Vec<String> {
        Vec::new()
    }
    /// The variables a client of this platform (an E2B SDK, the product's client or CLI) reads
    /// to reach it, as a `host` step passes them (`{{ provider.env }}`). Empty for providers
    /// without such an endpoint (local, docker).
    fn client_env(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }
    /// Before the first scenario: make ready what every sandbox needs (the local provider
    /// builds its `base` image on first use). Progress lines go to `log`.
    async fn prepare(&self, log: mpsc::UnboundedSender<String>) -> Result<()> {
        let _ = log;
        Ok(())
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo>;
    /// Attach to an existing sandbox (resume it if the provider pauses sandboxes).
    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo>;
    async fn info(&self, id: &str) -> Result<SandboxInfo>;
    /// Sandboxes whose metadata contains every pair of `metadata`.
    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>>;
    /// [`Provider::list`] with another API key than the configured one: the platform suite
    /// proves that a wrong key is refused. Providers without keys do not support it.
    async fn list_with_key(&self, api_key: &str, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let _ = (api_key, metadata);
        Err(ProviderError::unsupported(format!("{} has no API keys", self.name())))
    }
    /// Returns false if the sandbox did not exist.
    async fn kill(&self, id: &str) -> Result<bool>;
    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()>;

    /// `create { keep: true }`: the run leaves this sandbox alive when it ends, so it is no
    /// longer this provider's to destroy ([`Provider::destroy_all`] and the run's sweep by tag
    /// pass it by). The janitor still finds it by its tag. Providers whose sandboxes cannot
    /// outlive the process (local) ignore it.
    fn keep(&self, id: &str) {
        let _ = id;
    }
    /// Whether [`Provider::keep`] was asked for this sandbox.
    fn is_kept(&self, id: &str) -> bool {
        let _ = id;
        false
    }
    /// Kill every sandbox this provider created and has not destroyed yet, except those it
    /// was asked to keep. Used on shutdown.
    async fn destroy_all(&self) -> usize;
    /// Synchronous, signal-safe-enough last resort for a second Ctrl-C: kill what is left
    /// without waiting.
    fn destroy_all_now(&self) {}
    fn stats(&self) -> ProviderStats;

    /// What the provider has beyond the lifecycle, in its present configuration.
    fn features(&self) -> Features<'_>;

    /// The capabilities scenarios may require, derived from [`Provider::features`] (`run-code`
    /// needs a port inside the sandbox; `pause` means both kinds of pause).
    fn capabilities(&self) -> Vec<Capability> {
        let f = self.features();
        let ports = f.ports;
        let has = |c: Capability| match c {
            Capability::Ports | Capability::RunCode => ports.is_some(),
            Capability::IsolatedPorts => ports.is_some_and(|p| p.isolated()),
            Capability::Files => f.files.is_some(),
            Capability::Processes => f.processes.is_some(),
            Capability::Build => f.builds.is_some(),
            Capability::Pause => f.pausing.is_some_and(|p| !p.keeps_memory_only()),
            Capability::AutoResume => f.pausing.is_some_and(|p| p.resumes_on_traffic()),
            Capability::Snapshot => f.snapshots.is_some(),
            Capability::Watch => f.watch_dirs.is_some(),
            Capability::Pty => f.pty.is_some(),
            Capability::OpenStdin => f.live_processes.is_some(),
            Capability::Egress => f.network_control.is_some(),
        };
        Capability::ALL.iter().copied().filter(|&c| has(c)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_path;

    /// One rule for every provider's paths (local, docker and the file steps share it).
    #[test]
    fn paths_normalize_under_home_and_never_climb_above_root() {
        let cases = [
            ("x", Some("/home/user/x")),
            ("./a//b/", Some("/home/user/a/b")),
            ("/tmp/../opt/x", Some("/opt/x")),
            ("../../x", Some("/x")),
            ("/", Some("/")),
            ("/../etc", None),
            ("../../../x", None),
            ("a\0b", None),
        ];
        for (path, want) in cases {
            assert_eq!(normalize_path(path).ok().as_deref(), want, "{path:?}");
        }
    }
}

//! What a provider can do in a sandbox beyond its lifecycle, one trait a capability.
//!
//! A provider implements the traits for what it has and hands them out in
//! [`Provider::features`] (`features!(self; processes, files, …)`), `None` for what it lacks,
//! or lacks in its present configuration (local sandboxes without namespaces have no
//! terminal). [`Provider::capabilities`] is derived from that, so what a provider claims is
//! what it hands out, and a trait it hands out is implemented.
//!
//! Callers that hold a `dyn Provider` work in one sandbox through [`SandboxRef`]
//! (`provider.sandbox(id)`), which asks for the feature and refuses what the provider lacks as
//! `unsupported`, naming the provider and the feature.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::{
    BuildOutput, BuildSpec, DeployOutput, DirWatch, ExecRequest, ExecResult, FileEntry, LiveProcess, NetworkPolicy,
    OutputTx, ProcessInfo, Provider, ProviderError, Result, Usage,
};

/// Commands: to completion, in the background, and what is known of them.
#[async_trait]
pub trait Processes: Send + Sync {
    /// Run a command to completion through `/bin/bash -l -c`. Live output goes to `output` if
    /// given (the result still holds all of it, to its cap); that channel is bounded, so the
    /// caller reads it while the command runs (a command whose output is not read waits).
    async fn exec(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult>;
    /// Start a command in the background; returns its pid in the sandbox.
    async fn spawn(&self, id: &str, req: ExecRequest) -> Result<u32>;
    /// Processes started by `exec`/`spawn` that are still known to the provider.
    async fn process_list(&self, id: &str) -> Result<Vec<ProcessInfo>>;
    async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()>;
    /// Sends `signal` to the process group `pid` leads: the command and what it started (a
    /// `sleep 300 &` in it), as OpenSandbox's execd stops a command. Also once the command
    /// itself has ended, while what it started runs on. A provider that knows no process
    /// groups signals the process alone.
    async fn signal_group(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        self.signal(id, pid, signal).await
    }
    /// Wait for a background process to end (up to `timeout`); returns its output so far.
    async fn wait(&self, id: &str, pid: u32, timeout: Duration) -> Result<ExecResult>;
}

/// Background processes whose output streams as it comes and whose stdin stays open (the E2B
/// `Process/Start` stream, OpenSandbox's execd).
#[async_trait]
pub trait LiveProcesses: Send + Sync {
    /// Like [`Processes::spawn`], but the output is delivered live and, with `open_stdin`, the
    /// process's stdin stays open for [`LiveProcesses::write_stdin`] /
    /// [`LiveProcesses::close_stdin`] (`req.stdin` is then ignored). Without `open_stdin` stdin
    /// is `req.stdin` or `/dev/null`, as for `spawn`. [`Processes::wait`] returns the final
    /// status at once after the output closes.
    async fn spawn_live(&self, id: &str, req: ExecRequest, open_stdin: bool) -> Result<LiveProcess>;
    /// Like [`Processes::spawn`] (its output is kept for [`Processes::wait`]), with its stdin
    /// open for [`LiveProcesses::write_stdin`] / [`LiveProcesses::close_stdin`] by pid, from
    /// this connection or a later one (E2B's `commands.run(stdin=True)`, `send_stdin`).
    async fn spawn_with_stdin(&self, id: &str, req: ExecRequest) -> Result<u32>;
    /// Writes to the stdin of a process started with `spawn_live(.., open_stdin: true)`.
    async fn write_stdin(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()>;
    /// Closes that stdin (the process sees end of file).
    async fn close_stdin(&self, id: &str, pid: u32) -> Result<()>;
}

/// Commands in a pseudo-terminal.
#[async_trait]
pub trait Pty: Send + Sync {
    /// Like [`LiveProcesses::spawn_live`], in a pseudo-terminal of `cols` × `rows`: the
    /// command's stdin, stdout and stderr are the terminal, and what it writes arrives as
    /// stdout chunks.
    async fn spawn_pty(&self, id: &str, req: ExecRequest, cols: u16, rows: u16) -> Result<LiveProcess>;
    /// Types into the terminal of a process started with [`Pty::spawn_pty`].
    async fn write_pty(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()>;
    /// Resizes that terminal.
    async fn resize_pty(&self, id: &str, pid: u32, cols: u16, rows: u16) -> Result<()>;
}

/// The sandbox's files, with the sandbox user's rights. Relative paths are relative to the
/// sandbox user's home (`/home/user`).
#[async_trait]
pub trait Files: Send + Sync {
    /// Parent directories are created.
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry>;
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>>;
    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>>;
    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry>;
    async fn exists(&self, id: &str, path: &str) -> Result<bool>;
    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry>;
    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry>;
    async fn remove(&self, id: &str, path: &str) -> Result<()>;
}

/// What envd's filesystem service adds to [`Files`]: links, other users' rights, and file
/// metadata (what `serve` answers the E2B SDKs with).
#[async_trait]
pub trait EnvdFiles: Send + Sync {
    /// The target of the symbolic link at `path`, as stored in the link (maybe relative).
    async fn read_link(&self, id: &str, path: &str) -> Result<String>;
    /// Writes `path` as envd does for an upload made as sandbox user `user`: as the sandbox's
    /// root (so any path can be written), then the file and the parent directories it made
    /// are given to `user`.
    async fn write_file_as(&self, id: &str, path: &str, data: Vec<u8>, user: &str) -> Result<FileEntry>;
    /// Reads `path` with the rights of sandbox user `user`.
    async fn read_file_as(&self, id: &str, path: &str, user: &str) -> Result<Vec<u8>>;
    /// Opens regular file `path` with the rights of sandbox user `user`, to be streamed (a
    /// download): no size limit, and nothing held in memory.
    async fn open_file_as(&self, id: &str, path: &str, user: &str) -> Result<FileStream>;
    /// The file metadata of `path` (envd's: its `user.e2b.*` extended attributes, without
    /// the prefix).
    async fn file_metadata(&self, id: &str, path: &str) -> Result<BTreeMap<String, String>>;
    /// Makes `metadata` the whole file metadata of `path` (an empty map clears it). Both are
    /// done with the rights of the sandbox's root, as envd does them.
    async fn set_file_metadata(&self, id: &str, path: &str, metadata: BTreeMap<String, String>) -> Result<()>;
}

/// A file opened to be streamed: its length when it was opened, and its content. A file that
/// changes while it is read may give fewer bytes, or other ones; the reader never gives more
/// than `len`.
pub struct FileStream {
    pub len: u64,
    pub reader: std::pin::Pin<Box<dyn ReadSeek>>,
}

/// What a [`FileStream`] reads with: a file (or a buffer) that can also seek, for byte ranges.
pub trait ReadSeek: tokio::io::AsyncRead + tokio::io::AsyncSeek + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncSeek + Send> ReadSeek for T {}

impl FileStream {
    /// A stream of `data`, already read.
    pub fn of(data: Vec<u8>) -> Self {
        FileStream { len: data.len() as u64, reader: Box::pin(std::io::Cursor::new(data)) }
    }

    /// Bytes `start..start + count` of the file, in chunks of at most 64 KiB (fewer bytes if
    /// the file shrank meanwhile, never more): what one chunk of a response body holds.
    pub fn chunks(
        self,
        start: u64,
        count: u64,
    ) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send {
        use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _};
        futures_util::stream::unfold((self.reader, Some(start), count), |(mut r, seek, left)| async move {
            if let Some(pos) = seek.filter(|p| *p > 0) {
                if let Err(e) = r.seek(std::io::SeekFrom::Start(pos)).await {
                    return Some((Err(e), (r, None, 0)));
                }
            }
            if left == 0 {
                return None;
            }
            let mut buf = vec![0u8; left.min(64 << 10) as usize];
            match r.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(bytes::Bytes::from(buf)), (r, None, left - n as u64)))
                }
                Err(e) => Some((Err(e), (r, None, 0))),
            }
        })
    }
}

/// Changes under a directory, reported as they happen.
#[async_trait]
pub trait WatchDirs: Send + Sync {
    /// Watches directory `path` (and, with `recursive`, every directory below it, also those
    /// made later) for changes.
    async fn watch_dir(&self, id: &str, path: &str, recursive: bool) -> Result<Box<dyn DirWatch>>;
}

/// Ports inside a sandbox, reached from the runner.
#[async_trait]
pub trait Ports: Send + Sync {
    /// Each sandbox has its own ports: two sandboxes can bind the same port.
    fn isolated(&self) -> bool;
    /// Base URL (`http://host:port`) at which the client reaches `port` inside the sandbox.
    async fn port_url(&self, id: &str, port: u16) -> Result<String>;
    /// Headers a request to `url` must carry to get through, when `url` is under a base that
    /// [`Ports::port_url`] handed out (E2B's private ingress: `e2b-traffic-access-token`).
    /// Empty for every other URL, so a credential never goes where it was not issued for.
    fn port_headers(&self, url: &str) -> Vec<(String, String)> {
        let _ = url;
        Vec::new()
    }
    /// A connection to `port` inside the sandbox, made for one caller: serve's proxy dials
    /// each request's own, so nothing listens on the host for a private port (rule 2 of the
    /// threat model). By default, a connection to [`Ports::port_url`]'s address; the local
    /// provider connects from inside the sandbox's network namespace instead.
    async fn dial(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream> {
        let url = self.port_url(id, port).await?;
        let authority = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
        let authority = authority.split('/').next().unwrap_or(authority);
        tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| crate::provider::ProviderError::infra(format!("cannot connect to port {port}: {e}")))
    }
}

/// The reverse of [`Ports`]: a service of this machine reached from inside a sandbox.
#[async_trait]
pub trait ExposeHost: Send + Sync {
    /// Makes `host`, a service on this machine's loopback (a scripted model endpoint the run
    /// serves), reachable from inside the sandbox, at `127.0.0.1:port` when the sandbox has a
    /// network of its own, and returns the base URL a program inside uses.
    async fn expose_host(&self, id: &str, host: std::net::SocketAddr, port: u16) -> Result<String>;
}

/// Pausing and resuming a sandbox.
#[async_trait]
pub trait Pausing: Send + Sync {
    /// Whether only a pause that keeps the memory is offered (OpenSandbox's): the `pause`
    /// capability, which scenarios ask for, means both kinds.
    fn keeps_memory_only(&self) -> bool {
        false
    }
    /// Whether a create's `lifecycle.auto_resume` is honoured: traffic to a paused sandbox
    /// (a request to one of its ports) resumes it (E2B's `autoResume`).
    fn resumes_on_traffic(&self) -> bool {
        false
    }
    /// Pauses the sandbox: its processes stop where they are (they get no CPU and keep their
    /// memory) and it no longer expires; its files stay. Without `keep_memory` only its files
    /// stay: its processes end, and [`Pausing::resume`] boots it again (a new boot id, as
    /// E2B's filesystem-only pause cold-boots the VM). Idempotent.
    async fn pause(&self, id: &str, keep_memory: bool) -> Result<()>;
    /// Undoes [`Pausing::pause`]: the processes run on, and the sandbox expires
    /// `timeout_secs` from now. Idempotent.
    async fn resume(&self, id: &str, timeout_secs: u64) -> Result<()>;
}

/// A sandbox's filesystem captured as a template that `create` starts.
#[async_trait]
pub trait Snapshots: Send + Sync {
    /// Captures the sandbox's filesystem as a template named `name` that `create` starts
    /// (with the environment and working directory of the sandbox's own template, no start
    /// command); [`Snapshots::delete_snapshot`] removes it. Processes are not captured.
    /// Returns what `create { template: }` takes to start it (the name, or the id the
    /// platform gave the snapshot).
    async fn snapshot(&self, id: &str, name: &str) -> Result<String>;
    /// Removes a snapshot [`Snapshots::snapshot`] made, by what it returned. False if there
    /// was none.
    async fn delete_snapshot(&self, snapshot: &str) -> Result<bool>;
    /// Marks a snapshot as wanted after the run: [`Builds::remove_builds`] leaves it.
    fn keep_snapshot(&self, snapshot: &str) {
        let _ = snapshot;
    }
}

/// Template folders built into something `create` starts.
#[async_trait]
pub trait Builds: Send + Sync {
    /// Build a template folder (Dockerfile + files) into something `create` can use, streaming
    /// the build log line by line to `log`. The same digest is built once per provider
    /// instance (that is, per run); later calls reuse it and report `cached`.
    async fn build(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<BuildOutput>;
    /// Build if needed, then register the template so that `create { template: <template_id> }`
    /// runs its start command and waits until it is ready.
    async fn deploy(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<DeployOutput>;
    /// End of run: remove the builds and registrations made by `build`/`deploy` that were not
    /// asked to be kept. Returns how many were removed.
    async fn remove_builds(&self) -> usize {
        0
    }
    /// Remove one template registered by `build`/`deploy` under `name`, and its builds that
    /// are not kept. False if there was none.
    async fn remove_template(&self, name: &str) -> bool {
        let _ = name;
        false
    }
}

/// A running sandbox's egress policy, changed live.
#[async_trait]
pub trait NetworkControl: Send + Sync {
    /// Replaces a running sandbox's egress policy (E2B's `PUT /sandboxes/{id}/network`).
    async fn update_network(&self, id: &str, policy: NetworkPolicy) -> Result<()>;
}

/// What a sandbox uses now.
#[async_trait]
pub trait Metrics: Send + Sync {
    async fn usage(&self, id: &str) -> Result<Usage>;
}

/// What a provider has beyond the lifecycle ([`Provider::features`]): each capability trait it
/// implements, or `None` where it lacks it (in its present configuration).
#[derive(Clone, Copy, Default)]
pub struct Features<'a> {
    pub processes: Option<&'a dyn Processes>,
    pub live_processes: Option<&'a dyn LiveProcesses>,
    pub pty: Option<&'a dyn Pty>,
    pub files: Option<&'a dyn Files>,
    pub envd_files: Option<&'a dyn EnvdFiles>,
    pub watch_dirs: Option<&'a dyn WatchDirs>,
    pub ports: Option<&'a dyn Ports>,
    pub expose_host: Option<&'a dyn ExposeHost>,
    pub pausing: Option<&'a dyn Pausing>,
    pub snapshots: Option<&'a dyn Snapshots>,
    pub builds: Option<&'a dyn Builds>,
    pub network_control: Option<&'a dyn NetworkControl>,
    pub metrics: Option<&'a dyn Metrics>,
}

/// A [`Features`] of `provider` with each named capability and none of the others:
/// `features!(self; processes, files, ports)`.
macro_rules! features {
    ($provider:expr; $($feature:ident),+ $(,)?) => {
        $crate::provider::Features { $($feature: Some($provider),)+ ..$crate::provider::Features::default() }
    };
}
pub(crate) use features;

fn lacks(provider: &dyn Provider, what: &str) -> ProviderError {
    ProviderError::unsupported(format!("{} {what}", provider.name()))
}

/// One sandbox of a provider, as the steps and `serve` work in it: each call goes to the
/// capability that does it, and what the provider lacks is refused as `unsupported`.
#[derive(Clone, Copy)]
pub struct SandboxRef<'a> {
    provider: &'a dyn Provider,
    id: &'a str,
}

impl<'a> SandboxRef<'a> {
    /// The capability `pick` takes from the provider's features, or the refusal that names the
    /// provider and what it lacks (`what`).
    fn need<T: ?Sized>(&self, pick: impl FnOnce(Features<'a>) -> Option<&'a T>, what: &str) -> Result<&'a T> {
        pick(self.provider.features()).ok_or_else(|| lacks(self.provider, what))
    }
    fn processes(&self) -> Result<&'a dyn Processes> {
        self.need(|f| f.processes, "cannot run commands")
    }
    fn live(&self) -> Result<&'a dyn LiveProcesses> {
        self.need(|f| f.live_processes, "cannot stream background processes")
    }
    fn pty(&self) -> Result<&'a dyn Pty> {
        self.need(|f| f.pty, "cannot give commands a terminal")
    }
    fn files(&self) -> Result<&'a dyn Files> {
        self.need(|f| f.files, "has no file access")
    }

    pub async fn exec(&self, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        self.processes()?.exec(self.id, req, output).await
    }
    pub async fn spawn(&self, req: ExecRequest) -> Result<u32> {
        self.processes()?.spawn(self.id, req).await
    }
    pub async fn process_list(&self) -> Result<Vec<ProcessInfo>> {
        self.processes()?.process_list(self.id).await
    }
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<()> {
        self.processes()?.signal(self.id, pid, signal).await
    }
    pub async fn signal_group(&self, pid: u32, signal: i32) -> Result<()> {
        self.processes()?.signal_group(self.id, pid, signal).await
    }
    pub async fn wait(&self, pid: u32, timeout: Duration) -> Result<ExecResult> {
        self.processes()?.wait(self.id, pid, timeout).await
    }

    pub async fn spawn_live(&self, req: ExecRequest, open_stdin: bool) -> Result<LiveProcess> {
        self.live()?.spawn_live(self.id, req, open_stdin).await
    }
    pub async fn spawn_with_stdin(&self, req: ExecRequest) -> Result<u32> {
        self.live()?.spawn_with_stdin(self.id, req).await
    }
    pub async fn write_stdin(&self, pid: u32, data: Vec<u8>) -> Result<()> {
        self.live()?.write_stdin(self.id, pid, data).await
    }
    pub async fn close_stdin(&self, pid: u32) -> Result<()> {
        self.live()?.close_stdin(self.id, pid).await
    }

    pub async fn spawn_pty(&self, req: ExecRequest, cols: u16, rows: u16) -> Result<LiveProcess> {
        self.pty()?.spawn_pty(self.id, req, cols, rows).await
    }
    pub async fn write_pty(&self, pid: u32, data: Vec<u8>) -> Result<()> {
        self.pty()?.write_pty(self.id, pid, data).await
    }
    pub async fn resize_pty(&self, pid: u32, cols: u16, rows: u16) -> Result<()> {
        self.pty()?.resize_pty(self.id, pid, cols, rows).await
    }

    pub async fn write_file(&self, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        self.files()?.write_file(self.id, path, data, mode).await
    }
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>> {
        self.files()?.read_file(self.id, path).await
    }
    pub async fn list_dir(&self, path: &str) -> Result<Vec<FileEntry>> {
        self.files()?.list_dir(self.id, path).await
    }
    pub async fn stat(&self, path: &str) -> Result<FileEntry> {
        self.files()?.stat(self.id, path).await
    }
    pub async fn exists(&self, path: &str) -> Result<bool> {
        self.files()?.exists(self.id, path).await
    }
    pub async fn make_dir(&self, path: &str) -> Result<FileEntry> {
        self.files()?.make_dir(self.id, path).await
    }
    pub async fn rename(&self, from: &str, to: &str) -> Result<FileEntry> {
        self.files()?.rename(self.id, from, to).await
    }
    pub async fn remove(&self, path: &str) -> Result<()> {
        self.files()?.remove(self.id, path).await
    }

    pub async fn read_link(&self, path: &str) -> Result<String> {
        self.need(|f| f.envd_files, "cannot read symbolic links")?.read_link(self.id, path).await
    }
    /// As [`EnvdFiles::write_file_as`]; a provider without it writes as `user` only.
    pub async fn write_file_as(&self, path: &str, data: Vec<u8>, user: &str) -> Result<FileEntry> {
        match self.provider.features().envd_files {
            Some(f) => f.write_file_as(self.id, path, data, user).await,
            None if user == "user" => self.write_file(path, data, None).await,
            None => Err(lacks(self.provider, "writes files as `user` only")),
        }
    }
    /// As [`EnvdFiles::read_file_as`]; a provider without it reads as `user` only.
    pub async fn read_file_as(&self, path: &str, user: &str) -> Result<Vec<u8>> {
        match self.provider.features().envd_files {
            Some(f) => f.read_file_as(self.id, path, user).await,
            None if user == "user" => self.read_file(path).await,
            None => Err(lacks(self.provider, "reads files as `user` only")),
        }
    }
    /// As [`EnvdFiles::open_file_as`]; a provider without it reads the file whole, as `user`
    /// only (and up to [`super::MAX_FILE_READ`]).
    pub async fn open_file_as(&self, path: &str, user: &str) -> Result<FileStream> {
        match self.provider.features().envd_files {
            Some(f) => f.open_file_as(self.id, path, user).await,
            None => self.read_file_as(path, user).await.map(FileStream::of),
        }
    }
    pub async fn file_metadata(&self, path: &str) -> Result<BTreeMap<String, String>> {
        self.need(|f| f.envd_files, "has no file metadata")?.file_metadata(self.id, path).await
    }
    pub async fn set_file_metadata(&self, path: &str, metadata: BTreeMap<String, String>) -> Result<()> {
        self.need(|f| f.envd_files, "has no file metadata")?.set_file_metadata(self.id, path, metadata).await
    }

    pub async fn watch_dir(&self, path: &str, recursive: bool) -> Result<Box<dyn DirWatch>> {
        self.need(|f| f.watch_dirs, "cannot watch directories")?.watch_dir(self.id, path, recursive).await
    }

    pub async fn port_url(&self, port: u16) -> Result<String> {
        self.need(|f| f.ports, "cannot reach ports inside its sandboxes")?.port_url(self.id, port).await
    }
    pub async fn dial(&self, port: u16) -> Result<tokio::net::TcpStream> {
        self.need(|f| f.ports, "cannot reach ports inside its sandboxes")?.dial(self.id, port).await
    }
    pub async fn expose_host(&self, host: std::net::SocketAddr, port: u16) -> Result<String> {
        let e = self.provider.features().expose_host.ok_or_else(|| {
            ProviderError::unsupported(format!(
                "provider {} cannot make a service of this machine reachable from its sandboxes",
                self.provider.name()
            ))
        })?;
        e.expose_host(self.id, host, port).await
    }

    pub async fn pause(&self, keep_memory: bool) -> Result<()> {
        self.need(|f| f.pausing, "cannot pause sandboxes")?.pause(self.id, keep_memory).await
    }
    pub async fn resume(&self, timeout_secs: u64) -> Result<()> {
        self.need(|f| f.pausing, "cannot resume sandboxes")?.resume(self.id, timeout_secs).await
    }
    pub async fn snapshot(&self, name: &str) -> Result<String> {
        self.need(|f| f.snapshots, "cannot snapshot sandboxes")?.snapshot(self.id, name).await
    }
    pub async fn update_network(&self, policy: NetworkPolicy) -> Result<()> {
        let n = self.need(|f| f.network_control, "cannot change a sandbox's network policy")?;
        n.update_network(self.id, policy).await
    }
    pub async fn usage(&self) -> Result<Usage> {
        self.need(|f| f.metrics, "does not report resource usage")?.usage(self.id).await
    }
}

impl<'p> dyn Provider + 'p {
    /// The sandbox `id` of this provider (nothing is looked up until a call).
    pub fn sandbox<'a>(&'a self, id: &'a str) -> SandboxRef<'a> {
        SandboxRef { provider: self, id }
    }
    /// [`Ports::port_headers`], or none for a provider without ports.
    pub fn port_headers(&self, url: &str) -> Vec<(String, String)> {
        self.features().ports.map(|p| p.port_headers(url)).unwrap_or_default()
    }
    /// [`Snapshots::delete_snapshot`]; false for a provider without snapshots.
    pub async fn delete_snapshot(&self, snapshot: &str) -> Result<bool> {
        match self.features().snapshots {
            Some(s) => s.delete_snapshot(snapshot).await,
            None => Ok(false),
        }
    }
    /// [`Snapshots::keep_snapshot`].
    pub fn keep_snapshot(&self, snapshot: &str) {
        if let Some(s) = self.features().snapshots {
            s.keep_snapshot(snapshot);
        }
    }
    /// [`Builds::build`], refused by a provider without builds.
    pub async fn build(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<BuildOutput> {
        let b = self.features().builds.ok_or_else(|| lacks(self, "cannot build templates"))?;
        b.build(spec, log).await
    }
    /// [`Builds::deploy`], refused by a provider without builds.
    pub async fn deploy(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<DeployOutput> {
        let b = self.features().builds.ok_or_else(|| lacks(self, "cannot deploy templates"))?;
        b.deploy(spec, log).await
    }
    /// [`Builds::remove_builds`]; 0 for a provider without builds.
    pub async fn remove_builds(&self) -> usize {
        match self.features().builds {
            Some(b) => b.remove_builds().await,
            None => 0,
        }
    }
    /// [`Builds::remove_template`]; false for a provider without builds.
    pub async fn remove_template(&self, name: &str) -> bool {
        match self.features().builds {
            Some(b) => b.remove_template(name).await,
            None => false,
        }
    }
}

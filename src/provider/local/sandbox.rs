//! Namespace setup: starting, probing and stopping one isolated sandbox.
//!
//! A sandbox is a bubblewrap (`bwrap`) process tree whose root is an overlay of the host's `/`
//! (under the template's layers, if any: `lowerdir=<layers>:/`) with a per-sandbox upper directory, plus a private tmpfs `/tmp` and a per-sandbox directory
//! bound at `/home/user`. bwrap runs with `--unshare-all`, so the sandbox has its own mount,
//! PID, network (only `lo`, brought up by bwrap), IPC, UTS and cgroup namespaces.
//!
//! Why bubblewrap plus a private-mount-namespace overlay, rather than hakoniwa or a
//! hand-written `clone()`: bwrap is the field's standard sandbox launcher (Flatpak, many
//! agent sandboxes), packaged by Debian, needs no setuid bit when we are root, and already gets
//! the fiddly parts right: a minimal `/dev`, a fresh `/proc` for the new PID namespace,
//! bringing `lo` up in the new network namespace, a zombie-reaping pid 1, `--info-fd` to report
//! the host pid of that pid 1, and `--die-with-parent` so a crashed scenario-run takes its
//! sandboxes with it. bwrap 0.8 (Debian 12) has no `--overlay` options, so before exec'ing
//! bwrap the forked child (in `pre_exec`) unshares a mount namespace, makes it private and
//! mounts the overlay there. The overlay therefore exists only in that namespace and vanishes
//! with the sandbox's last process: no host mount can leak, not even on SIGKILL of
//! scenario-run. The child exec's bwrap directly, so bwrap's parent is scenario-run itself
//! (forked from the long-lived spawner thread, see `sys`), which `--die-with-parent` needs.
//!
//! The namespace's pid 1 is bwrap's own reaper; its child is `sleep infinity`, which only
//! keeps the sandbox alive. Killing pid 1 with SIGKILL makes the kernel kill every process in
//! the PID namespace; the outer bwrap then exits and we reap it.

use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::sys::{self, Pidfd};
use crate::provider::{ProviderError, Result};

/// Seconds to wait for bwrap to report and the sandbox to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// Seconds to wait for the outer bwrap to exit after pid 1 was killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a sandbox keeps its state on the host (all under `<state_dir>/<id>`).
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    pub home: PathBuf,
    /// Template layers stacked above the host's `/`, topmost first (`lowerdir=<layer>:/`).
    pub lowers: Vec<PathBuf>,
    /// Keep the host's network (template builds reach the package registries).
    pub share_net: bool,
    /// Host directories bound read-only at a path inside (after `/tmp` is mounted).
    pub ro_binds: Vec<(PathBuf, String)>,
}

impl Layout {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: dir.join("merged"),
            home: dir.join("home"),
            lowers: Vec::new(),
            share_net: false,
            ro_binds: Vec::new(),
        }
    }

    /// Creates the directories, and the login-shell hook (see `process`) in the upper layer.
    pub(crate) fn create(&self) -> std::io::Result<()> {
        for d in [&self.upper, &self.work, &self.merged, &self.home] {
            std::fs::create_dir_all(d)?;
        }
        if !self.lowers.is_empty() {
            std::fs::create_dir_all(self.layers())?;
            std::fs::create_dir_all(self.empty())?;
        }
        let rc_dir = self.upper.join(BASH_ENV_IN_SANDBOX.trim_start_matches('/'));
        if let Some(parent) = rc_dir.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(rc_dir, super::process::BASH_ENV_SCRIPT)
    }

    /// Mount point of the read-only overlay that presents the template layers.
    fn layers(&self) -> PathBuf {
        self.dir.join("layers")
    }

    /// The empty second lower of that overlay.
    fn empty(&self) -> PathBuf {
        self.dir.join("empty")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("bwrap.log")
    }
}

/// Path, inside a namespaced sandbox, of the script named by `BASH_ENV` (see `process`).
pub(crate) const BASH_ENV_IN_SANDBOX: &str = "/etc/scenario-run/bash_env.sh";

/// The `bwrap` command line for `layout`, with the `pre_exec` hook that unshares a private
/// mount namespace and mounts the overlay. `info_fd` becomes fd 3 (`--info-fd 3`).
fn bwrap_command(layout: &Layout, info_fd: i32, argv: &[&str]) -> std::io::Result<std::process::Command> {
    use std::ffi::CString;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("unusable {what} path"));
    let merged_s = layout.merged.to_str().ok_or_else(|| bad("state"))?;
    for p in [&layout.upper, &layout.work].into_iter().chain(&layout.lowers) {
        let s = p.to_str().ok_or_else(|| bad("state"))?;
        // overlayfs splits its options at ',' and lowerdir at ':'.
        if s.contains([',', ':']) {
            return Err(bad("state directory (contains ',' or ':')"));
        }
    }
    // Template layers live on the host's root filesystem, below `/`, and overlayfs refuses a
    // lower layer inside another one (ELOOP, "overlapping lowerdir path"). So the layers are
    // first presented by a read-only overlay of their own (a separate superblock) at
    // `layers`, whose second lower is an empty directory (a read-only overlay needs two);
    // the sandbox's overlay then stacks `lowerdir=<layers>:/`.
    let layers = if layout.lowers.is_empty() {
        None
    } else {
        let mut lower = String::new();
        for l in &layout.lowers {
            lower.push_str(&l.display().to_string());
            lower.push(':');
        }
        lower.push_str(&layout.empty().display().to_string());
        let target = layout.layers().to_str().ok_or_else(|| bad("state"))?.to_string();
        Some((
            CString::new(target).map_err(|_| bad("state"))?,
            CString::new(format!("lowerdir={lower}")).map_err(|_| bad("state"))?,
        ))
    };
    let lower = match &layers {
        Some(_) => format!("{}:/", layout.layers().display()),
        None => "/".to_string(),
    };
    let opts = format!("lowerdir={lower},upperdir={},workdir={}", layout.upper.display(), layout.work.display());
    let c_merged = CString::new(merged_s).map_err(|_| bad("state"))?;
    let c_opts = CString::new(opts).map_err(|_| bad("state"))?;
    let c_overlay = CString::new("overlay").expect("static");
    let c_root = CString::new("/").expect("static");

    let mut cmd = std::process::Command::new("bwrap");
    cmd.arg("--bind")
        .arg(&layout.merged)
        .arg("/")
        .args(["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind"])
        .arg(&layout.home)
        .arg("/home/user");
    for (host, inside) in &layout.ro_binds {
        cmd.arg("--ro-bind").arg(host).arg(inside);
    }
    cmd.arg("--unshare-all");
    if layout.share_net {
        cmd.arg("--share-net");
    }
    cmd.args(["--die-with-parent", "--info-fd", "3", "--chdir", "/", "--"]).args(argv);
    // Own process group: a Ctrl-C on the terminal reaches scenario-run, which then tears the
    // sandboxes down in order, instead of killing them under its feet.
    cmd.process_group(0);
    // SAFETY: the closure only makes async-signal-safe system calls on data prepared above.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let none = std::ptr::null::<libc::c_char>();
            if libc::mount(none, c_root.as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some((target, opts)) = &layers {
                let ro = libc::MS_RDONLY;
                if libc::mount(c_overlay.as_ptr(), target.as_ptr(), c_overlay.as_ptr(), ro, opts.as_ptr().cast()) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::mount(c_overlay.as_ptr(), c_merged.as_ptr(), c_overlay.as_ptr(), 0, c_opts.as_ptr().cast()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            sys::dup_onto(info_fd, 3)
        });
    }
    Ok(cmd)
}

/// A running namespaced sandbox.
#[derive(Debug)]
pub(crate) struct NsSandbox {
    /// The namespace's pid 1 (bwrap's reaper), by host pid.
    pub pid1: Pidfd,
    /// The outer bwrap process, our direct child.
    bwrap: tokio::sync::Mutex<tokio::process::Child>,
}

impl NsSandbox {
    /// Starts the sandbox and waits until its root is in place.
    pub(crate) async fn start(layout: Layout) -> Result<Self> {
        let (info_r, info_w) = sys::cloexec_pipe()?;
        let log = std::fs::File::create(layout.log())?;
        let mut cmd =
            bwrap_command(&layout, info_w.as_raw_fd(), &["/bin/sh", "-c", "echo ready && exec sleep infinity"])?;
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
        let mut cmd = tokio::process::Command::from(cmd);
        // Safety net: if we drop the child before it is tracked, the outer bwrap is killed
        // and `--die-with-parent` takes the sandbox with it.
        cmd.kill_on_drop(true);
        let handle = tokio::runtime::Handle::current();
        let spawned = sys::on_spawner(move || {
            let _guard = handle.enter();
            cmd.spawn()
        })
        .await?;
        drop(info_w);
        let mut child =
            spawned.map_err(|e| ProviderError::infra(format!("cannot start bwrap: {}", sys::errno_text(&e))))?;

        let stdout = child.stdout.take();
        let ready = async {
            let mut info = Vec::new();
            let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(info_r)?;
            rx.read_to_end(&mut info).await?;
            let v: serde_json::Value = serde_json::from_slice(&info).map_err(std::io::Error::other)?;
            let pid = v
                .get("child-pid")
                .and_then(|p| p.as_u64())
                .ok_or_else(|| std::io::Error::other("bwrap reported no child-pid"))?;
            let mut line = String::new();
            if let Some(out) = stdout {
                BufReader::new(out).read_line(&mut line).await?;
            }
            if line.trim() != "ready" {
                return Err(std::io::Error::other("sandbox init did not start"));
            }
            Ok::<u32, std::io::Error>(pid as u32)
        };
        let outcome = tokio::time::timeout(START_TIMEOUT, ready).await;
        let pid = match outcome {
            Ok(Ok(pid)) => pid,
            other => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(STOP_TIMEOUT, child.wait()).await;
                let log = tokio::fs::read_to_string(layout.log()).await.unwrap_or_default();
                let why = match other {
                    Err(_) => "timed out waiting for the sandbox to start".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => unreachable!(),
                };
                let log = log.trim();
                return Err(ProviderError::infra(if log.is_empty() {
                    format!("cannot start sandbox: {why}")
                } else {
                    format!("cannot start sandbox: {why}: {log}")
                }));
            }
        };
        let pid1 = Pidfd::open(pid).map_err(|e| ProviderError::infra(format!("sandbox pid 1 vanished: {e}")))?;
        Ok(Self { pid1, bwrap: tokio::sync::Mutex::new(child) })
    }

    pub(crate) fn alive(&self) -> bool {
        !self.pid1.exited()
    }

    /// SIGKILLs pid 1 (and with it the whole PID namespace) and waits for bwrap to exit.
    pub(crate) async fn stop(&self) {
        let _ = self.pid1.signal(libc::SIGKILL);
        let mut child = self.bwrap.lock().await;
        if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(STOP_TIMEOUT, child.wait()).await;
        }
        let _ = self.pid1.wait_exit(STOP_TIMEOUT).await;
    }

    /// Last resort: SIGKILL pid 1 without waiting.
    pub(crate) fn stop_now(&self) {
        let _ = self.pid1.signal(libc::SIGKILL);
    }
}

/// Checks once that namespaced sandboxes work here: `nsenter` exists and bwrap can start a
/// sandbox over a private overlay. Returns why not.
pub(crate) fn probe(state_dir: &Path) -> std::result::Result<(), String> {
    let nsenter =
        std::process::Command::new("nsenter").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !matches!(nsenter, Ok(s) if s.success()) {
        return Err("nsenter is not available".into());
    }
    let dir = state_dir.join(format!("probe-{}", sys::random_hex(4)));
    let layout = Layout::new(&dir);
    let result = (|| {
        layout.create().map_err(|e| format!("cannot prepare {}: {e}", dir.display()))?;
        let (_r, w) = sys::cloexec_pipe().map_err(|e| e.to_string())?;
        let mut cmd = bwrap_command(&layout, w.as_raw_fd(), &["/bin/true"]).map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let run = sys::on_spawner_blocking(move || -> std::result::Result<(), String> {
            let mut child = cmd.spawn().map_err(|e| format!("cannot start bwrap: {}", sys::errno_text(&e)))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(st)) if st.success() => return Ok(()),
                    Ok(Some(st)) => {
                        let mut err = String::new();
                        if let Some(mut e) = child.stderr.take() {
                            use std::io::Read;
                            let _ = e.read_to_string(&mut err);
                        }
                        return Err(format!("bwrap failed ({st}): {}", err.trim()));
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err("bwrap probe timed out".into());
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
        })
        .map_err(|e| e.to_string())?;
        drop(w);
        run
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

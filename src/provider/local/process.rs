//! Processes in a sandbox: launching commands, collecting their output, the per-sandbox
//! process table behind `spawn`/`process_list`/`signal`/`wait`, and timeouts.
//!
//! How a command enters an isolated sandbox: see `enter` (namespaces, cgroups, seccomp and
//! the user, joined between fork and exec; the command reports its pid inside the sandbox and
//! its intermediate the host pid, which we hold as a pidfd for `signal`). The command itself
//! is `/bin/bash -l -c <cmd>`, started in the working directory with exactly the environment
//! given: `PATH` (the image's, else Debian's default), `HOME` and `USER` of the user it runs
//! as, the image's and template's `ENV`, the sandbox's create-time envs, then the exec's envs,
//! which win. Debian's `/etc/profile` resets PATH for login shells, so `BASH_ENV` names a
//! one-line script that restores the PATH we asked for after the profile ran (bash reads
//! `BASH_ENV` after the login files for `bash -l -c`) and then unsets itself, so nested shells
//! are unaffected.
//!
//! Without isolation (the fallback), a tiny shell prelude reports `$$` on fd 3 and enters the
//! working directory before exec'ing the same bash.
//!
//! `spawn_live` (for the E2B server's `Process/Start`) is `spawn` with the live output channel
//! of `exec` and, on request, a stdin pipe kept open in the [`Proc`] for `write_stdin` /
//! `close_stdin` (which closes it, so the command sees end of file).
//!
//! Every command leads its own session and process group; a timeout SIGKILLs that group and
//! the command's pidfd. Output is read until the command exits, then for a short grace period
//! so a background grandchild holding the pipe open cannot hang `exec`.

use crate::provider::core::Controlled as _;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::enter::{self, Entry, Identity};
use super::sys::{self, Pidfd};
use crate::provider::core::{check_env_key, Done, Process, Procs, Stdin};
use crate::provider::output::Captured;
use crate::provider::{ExecRequest, ExecResult, OutputChunk, OutputTx, ProcessInfo, ProviderError, Result};

/// Path, inside a sandbox, of the script named by `BASH_ENV` (written by `sandbox`).
pub(crate) const BASH_ENV_IN_SANDBOX: &str = "/etc/scenario-run/bash_env.sh";

/// Script named by `BASH_ENV`: restore the requested PATH after the login profile.
pub(crate) const BASH_ENV_SCRIPT: &str =
    "# Written by scenario-run: the login profile resets PATH; restore the requested one.\n\
if [ -n \"${SCENARIO_RUN_PATH-}\" ]; then PATH=$SCENARIO_RUN_PATH; export PATH; fi\n\
unset SCENARIO_RUN_PATH BASH_ENV\n";

/// Without isolation: reports the pid on fd 3, enters `$1` (the working directory), then
/// becomes the command. (The environment is already the command's.)
const PRELUDE: &str = "echo $$ >&3; exec 3>&-; cd -- \"$1\" || exit 125; unset OLDPWD; shift; exec \"$@\"";

/// After a command exited, how long to keep reading output its descendants still write.
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// How long to wait for a launched command to report its pid.
const PID_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a write to a process's stdin may block (the pipe is full and nobody reads).
const STDIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long to wait for a killed command to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Where a command is launched.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Inside an isolated sandbox, as `who`.
    Ns { entry: Arc<Entry>, who: Identity },
    /// Directly on the host (no isolation), with this `BASH_ENV` script.
    Plain { bash_env: PathBuf },
}

#[derive(Debug, Default)]
struct Collected {
    out: Captured,
    exit_code: Option<i32>,
    signal: Option<i32>,
    finished: bool,
}

/// One launched command.
#[derive(Debug)]
pub(crate) struct Proc {
    /// Pid inside the sandbox (0 if it never reported one).
    pub pid: u32,
    pub cmd: String,
    /// Host pid of the process-group leader: the command itself.
    pub pgid: u32,
    /// The command's own process on the host, if still found after launch.
    target: Option<Pidfd>,
    state: Mutex<Collected>,
    done: Done,
    /// The command's stdin when it was launched with `open_stdin` (until closed).
    stdin: Stdin<tokio::process::ChildStdin>,
    /// The master of its terminal, when launched with one (`launch`).
    pty: Option<Arc<std::os::fd::OwnedFd>>,
}

impl Proc {
    pub(crate) fn finished(&self) -> bool {
        self.done.is_set()
    }

    /// Waits until the command ended; returns false on timeout.
    pub(crate) async fn wait_done(&self, timeout: Duration) -> bool {
        self.done.wait(Some(timeout)).await
    }

    /// SIGKILLs the command's process group (and the command, should it have left the group).
    pub(crate) fn kill_tree(&self) {
        sys::kill_group(self.pgid, libc::SIGKILL);
        if let Some(t) = &self.target {
            let _ = t.signal(libc::SIGKILL);
        }
    }

    /// Types `data` into the command's terminal.
    pub(crate) async fn write_pty(&self, data: Vec<u8>) -> Result<()> {
        let Some(m) = self.pty.clone() else {
            return Err(ProviderError::invalid(format!("process {} has no terminal", self.pid)));
        };
        let pid = self.pid;
        let write = tokio::task::spawn_blocking(move || super::pty::write(m.as_fd(), &data));
        match tokio::time::timeout(STDIN_TIMEOUT, write).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(ProviderError::infra(format!("cannot write to the terminal of process {pid}: {e}"))),
            Ok(Err(e)) => Err(ProviderError::infra(e.to_string())),
            Err(_) => Err(ProviderError::new(
                crate::provider::ErrorKind::Timeout,
                format!("process {pid} does not read its terminal"),
            )),
        }
    }

    /// Resizes the command's terminal.
    pub(crate) fn resize_pty(&self, cols: u16, rows: u16) -> Result<()> {
        let Some(m) = &self.pty else {
            return Err(ProviderError::invalid(format!("process {} has no terminal", self.pid)));
        };
        super::pty::resize(m.as_fd(), cols, rows)
            .map_err(|e| ProviderError::infra(format!("cannot resize the terminal of process {}: {e}", self.pid)))
    }
}

#[async_trait::async_trait]
impl crate::provider::core::Controlled for Proc {
    async fn signal(&self, sig: i32) -> Result<()> {
        if self.finished() {
            return Err(ProviderError::not_found(format!("process {} is not running", self.pid)));
        }
        match &self.target {
            Some(t) => t.signal(sig).map_err(|e| {
                if e.raw_os_error() == Some(libc::ESRCH) {
                    ProviderError::not_found(format!("process {} is not running", self.pid))
                } else {
                    ProviderError::invalid(format!("cannot signal process {}: {}", self.pid, sys::errno_text(&e)))
                }
            }),
            None => {
                sys::kill_group(self.pgid, sig);
                Ok(())
            }
        }
    }

    /// The command leads its own process group (it calls `setsid`), which outlives it while
    /// what it started runs on: the group is signalled whether or not the command ended.
    async fn signal_group(&self, sig: i32) -> Result<()> {
        sys::kill_group(self.pgid, sig);
        if let (false, Some(t)) = (self.finished(), &self.target) {
            let _ = t.signal(sig);
        }
        Ok(())
    }

    /// Writes to the stdin kept open by `launch(.., open_stdin: true)`.
    async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.stdin.write(self.pid, data, |e| self.finished() || e.kind() == std::io::ErrorKind::BrokenPipe).await
    }

    /// Closes that stdin; closing twice is fine.
    async fn close_stdin(&self) -> Result<()> {
        self.stdin.close().await
    }

    fn result(&self, timed_out: bool) -> ExecResult {
        let st = self.state.lock().expect("proc state");
        ExecResult { exit_code: st.exit_code, signal: st.signal, timed_out, pid: self.pid, ..st.out.result() }
    }
}

/// PATH in a sandbox whose image does not set one (Debian's and Docker's default).
pub(crate) const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The base environment of a process in an isolated sandbox running as `who`, before the
/// image's, template's, create-time and exec envs.
pub(crate) fn sandbox_env(who: &Identity) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
    env.insert("HOME".to_string(), who.home.clone());
    env.insert("USER".to_string(), who.name.clone());
    env.insert("LOGNAME".to_string(), who.name.clone());
    env
}

/// The base environment of a process without isolation, before create-time and exec envs.
pub(crate) fn base_env(home: &str) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    env.insert("PATH".to_string(), std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.into()));
    env.insert("HOME".to_string(), home.to_string());
    let user = std::env::var("USER").ok().unwrap_or_else(|| {
        if rustix::process::getuid().is_root() {
            "root".into()
        } else {
            "user".into()
        }
    });
    env.insert("USER".to_string(), user);
    for k in ["LANG"] {
        if let Ok(v) = std::env::var(k) {
            env.insert(k.to_string(), v);
        }
    }
    env
}

/// Starts `req.cmd` in `target` with environment `env` (already merged) and working directory
/// `cwd` (already mapped to what the launcher sees). Live output goes to `output`. With
/// `open_stdin` the command's stdin is a pipe kept in the [`Proc`] (and `req.stdin` is
/// ignored); otherwise it is `req.stdin` or `/dev/null`. With `pty` the command's stdin,
/// stdout and stderr are that terminal, whose output goes to `output` as stdout (and
/// `open_stdin` is ignored: input is typed into the terminal, [`Proc::write_pty`]).
pub(crate) async fn launch(
    target: &Target,
    env: &BTreeMap<String, String>,
    cwd: &str,
    req: &ExecRequest,
    output: Option<OutputTx>,
    open_stdin: bool,
    pty: Option<super::pty::Pty>,
) -> Result<Arc<Proc>> {
    let open_stdin = open_stdin && pty.is_none();
    for k in env.keys() {
        check_env_key(k)?;
    }
    if req.cmd.contains('\0') || cwd.contains('\0') || env.values().any(|v| v.contains('\0')) {
        return Err(ProviderError::invalid("command or environment contains a NUL byte"));
    }
    let path = env.get("PATH").cloned().unwrap_or_default();
    let (pid_r, pid_w) = sys::cloexec_pipe()?;
    let mut cmd = match target {
        Target::Ns { .. } => std::process::Command::new("/bin/bash"),
        Target::Plain { .. } => {
            let mut c = std::process::Command::new("/bin/sh");
            c.args(["-c", PRELUDE, "sh", cwd, "/bin/bash"]);
            c
        }
    };
    cmd.args(["-l", "-c", &req.cmd])
        .env_clear()
        .envs(env)
        .env("SCENARIO_RUN_PATH", &path)
        .stdin(if req.stdin.is_some() || open_stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut master = None;
    if let Some(p) = pty {
        let dup = |fd: &std::os::fd::OwnedFd| {
            fd.try_clone().map_err(|e| ProviderError::infra(format!("cannot hand the terminal over: {e}")))
        };
        cmd.stdin(Stdio::from(dup(&p.peer)?)).stdout(Stdio::from(dup(&p.peer)?)).stderr(Stdio::from(p.peer));
        if let Some(tx) = output.clone() {
            super::pty::forward(&p.master, tx)?;
        }
        master = Some(Arc::new(p.master));
    }
    let fd = pid_w.as_raw_fd();
    match target {
        Target::Ns { entry, who } => {
            cmd.env("BASH_ENV", BASH_ENV_IN_SANDBOX);
            entry.prepare(&mut cmd, who, cwd, fd);
        }
        Target::Plain { bash_env } => {
            cmd.env("BASH_ENV", bash_env);
            // SAFETY: `pre_exec` needs an async-signal-safe closure: this one makes raw system
            // calls (fcntl/dup2, prctl) on integers captured above, and allocates nothing. `fd`
            // stays open until the spawn returned (`pid_w` is dropped after it).
            unsafe {
                cmd.pre_exec(move || {
                    sys::dup_onto(fd, 3)?;
                    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
                    Ok(())
                });
            }
        }
    }
    let mut cmd = tokio::process::Command::from(cmd);
    let handle = tokio::runtime::Handle::current();
    // Forked on the spawner thread: PR_SET_PDEATHSIG is tied to the forking thread.
    let spawned = sys::on_spawner(move || {
        let _guard = handle.enter();
        cmd.spawn()
    })
    .await?;
    drop(pid_w);
    let mut child =
        spawned.map_err(|e| ProviderError::infra(format!("cannot start command: {}", sys::errno_text(&e))))?;
    let leader = child.id().unwrap_or(0);

    // The pid reports: the prelude's `$$` without isolation; with it, the intermediate's `h`
    // (host pid) and the command's `n` (pid inside). Every copy of the write end is closed
    // once the command runs, so read to the end (bounded).
    let plain = matches!(target, Target::Plain { .. });
    let read_reports = async {
        let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(pid_r)?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64];
        while buf.len() < 256 {
            let n = rx.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
            // Without isolation the prelude's shell keeps fd 3 until exec: one line is all.
            if plain && buf.contains(&b'\n') {
                break;
            }
        }
        Ok::<String, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let reports = match tokio::time::timeout(PID_TIMEOUT, read_reports).await {
        Ok(Ok(text)) => text,
        _ => {
            sys::kill_group(leader, libc::SIGKILL);
            let _ = child.kill().await;
            return Err(ProviderError::infra("command did not start in the sandbox"));
        }
    };
    let (pid, target_fd) = match target {
        Target::Plain { .. } => (reports.trim().parse().unwrap_or(0), Pidfd::open(leader).ok()),
        Target::Ns { .. } => {
            let (host, inside) = enter::parse_reports(&reports);
            let fd = match (host, inside) {
                (Some(h), Some(n)) => Pidfd::open(h)
                    .ok()
                    // Still the command (and not a reused pid) once we hold it?
                    .filter(|_| sys::ns_pids(h).and_then(|v| v.last().copied()) == Some(n)),
                _ => None,
            };
            (inside.unwrap_or(0), fd)
        }
    };

    let done = Done::new();
    let kept_stdin = if open_stdin { child.stdin.take() } else { None };
    let proc = Arc::new(Proc {
        pid,
        cmd: req.cmd.clone(),
        // In a sandbox the command leads its own group; the intermediate is not in it.
        pgid: match (&target_fd, target) {
            (Some(t), Target::Ns { .. }) => t.pid(),
            _ => leader,
        },
        target: target_fd,
        state: Mutex::new(Collected { out: Captured::for_request(req), ..Collected::default() }),
        done,
        stdin: Stdin::new(kept_stdin),
        pty: master,
    });

    if let (Some(data), Some(mut stdin)) = (req.stdin.clone(), child.stdin.take()) {
        tokio::spawn(async move {
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        });
    }
    tokio::spawn(drive(child, proc.clone(), output));
    Ok(proc)
}

/// Collects output until the command exits (plus a short grace), then records its status.
async fn drive(mut child: tokio::process::Child, proc: Arc<Proc>, output: Option<OutputTx>) {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let mut ob = vec![0u8; 16384];
    let mut eb = vec![0u8; 16384];
    let mut status = None;
    let grace = tokio::time::sleep(Duration::from_secs(86400 * 365));
    tokio::pin!(grace);
    loop {
        if stdout.is_none() && stderr.is_none() && status.is_some() {
            break;
        }
        tokio::select! {
            r = async { stdout.as_mut().expect("guarded").read(&mut ob).await }, if stdout.is_some() => match r {
                Ok(n) if n > 0 => {
                    proc.state.lock().expect("proc state").out.stdout(&ob[..n]);
                    if let Some(tx) = &output { let _ = tx.send(OutputChunk::Stdout(ob[..n].to_vec())).await; }
                }
                _ => stdout = None,
            },
            r = async { stderr.as_mut().expect("guarded").read(&mut eb).await }, if stderr.is_some() => match r {
                Ok(n) if n > 0 => {
                    proc.state.lock().expect("proc state").out.stderr(&eb[..n]);
                    if let Some(tx) = &output { let _ = tx.send(OutputChunk::Stderr(eb[..n].to_vec())).await; }
                }
                _ => stderr = None,
            },
            st = child.wait(), if status.is_none() => {
                status = Some(st);
                grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
            },
            _ = &mut grace, if status.is_some() => break,
        }
    }
    let status = match status {
        Some(s) => s,
        None => child.wait().await,
    };
    {
        let mut st = proc.state.lock().expect("proc state");
        if let Ok(s) = status {
            st.exit_code = s.code();
            st.signal = s.signal();
        }
        st.finished = true;
    }
    proc.done.set();
}

impl Process for Proc {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn info(&self) -> ProcessInfo {
        let st = self.state.lock().expect("proc state");
        ProcessInfo { pid: self.pid, cmd: self.cmd.clone(), running: !st.finished, exit_code: st.exit_code }
    }
    fn done(&self) -> &Done {
        &self.done
    }
    fn kill_tree_now(self: Arc<Self>) {
        self.kill_tree();
    }
}

/// A sandbox's processes by in-sandbox pid, and every process group ever started (to kill a
/// sandbox that has no PID namespace of its own).
#[derive(Default)]
pub(crate) struct ProcTable {
    procs: Procs<Proc>,
    groups: Mutex<Vec<u32>>,
}

impl std::ops::Deref for ProcTable {
    type Target = Procs<Proc>;
    fn deref(&self) -> &Procs<Proc> {
        &self.procs
    }
}

impl ProcTable {
    pub(crate) fn insert(&self, p: Arc<Proc>) {
        self.groups.lock().expect("groups").push(p.pgid);
        self.procs.insert(p);
    }

    /// SIGKILLs every process group ever started here.
    pub(crate) fn kill_groups(&self) {
        for g in self.groups.lock().expect("groups").iter() {
            sys::kill_group(*g, libc::SIGKILL);
        }
    }
}

/// Runs a launched command to the end (or its timeout) and returns its result.
pub(crate) async fn finish(proc: &Arc<Proc>, timeout: Option<Duration>) -> ExecResult {
    let ended = proc.done.wait(timeout).await;
    if !ended {
        proc.kill_tree();
        proc.wait_done(KILL_WAIT).await;
    }
    proc.result(!ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_env_has_home_and_path() {
        let env = base_env("/home/user");
        assert_eq!(env["HOME"], "/home/user");
        assert!(env.contains_key("PATH"));
        assert!(env.contains_key("USER"));
    }
}

//! `host`: a command on the runner's own machine, not in a sandbox, to drive real clients (an
//! E2B SDK, a product CLI) against the provider under test.
//!
//! The command runs as `/bin/bash -c <cmd>` in a process group of its own, with the run's
//! environment (process and `.env`) plus the step's `env`, in `cwd` (relative to the scenario
//! file's folder, which is also the default). Output is kept like `exec`'s (the first
//! `--max-output` bytes of each stream, the rest counted) and goes through the same masking,
//! since the step's outputs are recorded like any other.
//!
//! No process outlives its step: when the command ends, whatever it left in its group is
//! killed; on a timeout the group is killed; when the step is abandoned (the scenario's or the
//! step's own limit, Ctrl-C) the future is dropped and the guard kills the group; a second
//! Ctrl-C, which exits at once, kills every live group first ([`kill_all`]); and the leader
//! dies with the runner (`PR_SET_PDEATHSIG`). A process that leaves the group on purpose
//! (`setsid`) is out of reach, as it is for any process supervisor.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use super::args::Args;
use super::{exec_outputs, StepCtx, StepError, StepResult};
use crate::provider::output::keep;
use crate::provider::ExecResult;

/// How long output is still read after the command ended and its group was killed (a process
/// that left the group may hold the pipes open).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Process groups of host commands still running, for [`kill_all`].
static LIVE: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Kills every process group a `host` step started and has not finished with. For the exit on
/// a second Ctrl-C, which does not unwind the steps.
pub fn kill_all() -> usize {
    let groups: Vec<u32> = LIVE.lock().map(|l| l.iter().copied().collect()).unwrap_or_default();
    for g in &groups {
        kill_group(*g);
    }
    groups.len()
}

fn kill_group(pgid: u32) {
    // Not 0 or 1 (our own group, every process), nor past `i32::MAX`.
    if let Some(g) = i32::try_from(pgid).ok().filter(|g| *g > 1).and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(g, rustix::process::Signal::KILL);
    }
}

/// Kills the command's process group when dropped: on every path out of the step.
struct Group(u32);

impl Group {
    fn new(pgid: u32) -> Self {
        if let Ok(mut l) = LIVE.lock() {
            l.insert(pgid);
        }
        Self(pgid)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0);
        if let Ok(mut l) = LIVE.lock() {
            l.remove(&self.0);
        }
    }
}

/// Reads `r` to its end, keeping the first `cap` bytes in `buf` and counting the rest.
async fn pump(r: Option<impl AsyncRead + Unpin>, buf: &mut Vec<u8>, dropped: &mut u64, cap: usize) {
    let Some(mut r) = r else { return };
    let mut chunk = vec![0u8; 16384];
    while let Ok(n) = r.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        keep(buf, dropped, &chunk[..n], cap);
    }
}

pub async fn host(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let cmd_text = a.str("cmd").to_string();
    let env = a.str_map("env");
    let (limit, setting) = super::exec::command_limit(ctx, a, "host");
    let stdin = a.opt_str("stdin").map(|s| s.as_bytes().to_vec());
    let base = if ctx.scenario_dir.as_os_str().is_empty() { PathBuf::from(".") } else { ctx.scenario_dir.clone() };
    let cwd = match a.opt_str("cwd") {
        Some(c) => base.join(c),
        None => base,
    };
    if !cwd.is_dir() {
        return Err(StepError::bad_args(format!("host: cwd {} is not a directory", cwd.display())));
    }
    if cmd_text.contains('\0') || env.iter().any(|(k, v)| k.contains(['\0', '=']) || k.is_empty() || v.contains('\0')) {
        return Err(StepError::bad_args("host: the command or an env entry contains a NUL byte or a bad name"));
    }

    let mut cmd = std::process::Command::new("/bin/bash");
    cmd.args(["-c", &cmd_text])
        .env_clear()
        .envs(ctx.env.iter())
        .envs(&env)
        .current_dir(&cwd)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: `pre_exec` needs a closure that is async-signal-safe: this one makes one raw
    // system call (prctl) and allocates nothing.
    unsafe {
        cmd.pre_exec(|| Ok(rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?));
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let handle = tokio::runtime::Handle::current();
    // Forked on a thread that lives as long as the process: PR_SET_PDEATHSIG follows the
    // forking thread, and a runtime thread may be retired while the command still runs.
    let spawned = crate::provider::local::on_spawner(move || {
        let _guard = handle.enter();
        cmd.spawn()
    })
    .await
    .map_err(|e| StepError::error(format!("host: cannot start the command: {e}")))?;
    let mut child = spawned.map_err(|e| StepError::error(format!("host: cannot start /bin/bash: {e}")))?;
    let pid = child.id().unwrap_or(0);
    let group = Group::new(pid);

    let started = Instant::now();
    let cap = ctx.max_output;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_dropped, mut err_dropped) = (0u64, 0u64);
    let (stdout, stderr, stdin_pipe) = (child.stdout.take(), child.stderr.take(), child.stdin.take());
    let finished = {
        let feed = async move {
            if let (Some(data), Some(mut p)) = (stdin, stdin_pipe) {
                let _ = p.write_all(&data).await;
                let _ = p.shutdown().await;
            }
        };
        let reads = async {
            tokio::join!(
                pump(stdout, &mut out, &mut out_dropped, cap),
                pump(stderr, &mut err, &mut err_dropped, cap),
                feed
            )
        };
        let work = async {
            tokio::pin!(reads);
            let mut drained = false;
            let status = tokio::select! {
                st = child.wait() => st,
                _ = &mut reads => {
                    drained = true;
                    child.wait().await
                }
            };
            // Whatever the command left running in its group goes with it.
            kill_group(pid);
            if !drained {
                let _ = tokio::time::timeout(DRAIN_GRACE, &mut reads).await;
            }
            status
        };
        tokio::time::timeout(limit, work).await
    };
    let mut result = ExecResult {
        stdout: out,
        stderr: err,
        pid,
        stdout_dropped: out_dropped,
        stderr_dropped: err_dropped,
        ..ExecResult::default()
    };
    let status = match finished {
        Ok(st) => st.map_err(|e| StepError::error(format!("host: cannot wait for the command: {e}")))?,
        Err(_) => {
            kill_group(pid);
            result.timed_out = true;
            match tokio::time::timeout(DRAIN_GRACE, child.wait()).await {
                Ok(Ok(st)) => st,
                _ => std::process::ExitStatus::from_raw(libc::SIGKILL),
            }
        }
    };
    drop(group);
    result.exit_code = status.code();
    result.signal = status.signal();
    let outputs = exec_outputs(&result, started.elapsed());
    if result.timed_out {
        return Err(StepError::timeout(super::exec::command_timed_out(limit, &setting)).with_outputs(outputs));
    }
    super::exec::check_exit_code(a, &result, outputs)
}

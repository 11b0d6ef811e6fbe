//! Processes in a container: launching commands through the exec API, collecting their
//! output, the per-sandbox process table behind `spawn`/`process_list`/`signal`/`wait`, and
//! timeouts.
//!
//! A command is one exec of `/bin/sh -c <prelude> sh <cwd> <cmd>`, attached (stdout and stderr
//! demultiplexed by the engine; stdin attached only when there is something to feed). The
//! prelude prints `$$` — the pid inside the container — as the first line of stdout, changes to
//! `cwd`, exports `SCENARIO_RUN_PATH` and `BASH_ENV` (see [`BASH_ENV_SCRIPT`]) and `exec`s
//! `/bin/bash -l -c <cmd>`, so the pid reported is the command itself. runc starts every exec
//! in a new session, so that pid is also a process-group id: a timeout kills the group.
//!
//! The engine has no "signal an exec" call, so `signal` and timeouts run a tiny
//! `kill -<sig> <pid>` exec next to the command.
//!
//! Exit status: the engine reports only an exit code, and a process killed by signal N
//! reads `128+N` there. When the provider itself delivered signal N to that pid (a `signal`
//! step, a timeout, the sandbox being removed) and the code is `128+N`, the result says
//! `signal: N` and no exit code, as on the local provider; otherwise the code is taken as is
//! (a process killed from inside the sandbox by someone else reads as exit `128+N`).
//!
//! End of a command: normally its output stream ends when it exits. A background grandchild
//! (`server &`) may keep the stream open, so the exec is also polled (100 ms, doubling up to
//! 1 s) and, once the engine says it is no longer running, output is read for a short grace
//! period more, like the local provider does.

use crate::provider::core::Controlled as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::{Stream, StreamExt};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use super::api::{api_err, is_status};
use crate::provider::core::{check_env_key, Done, Process, Procs, Stdin};
use crate::provider::output::Captured;
use crate::provider::{ErrorKind, ExecRequest, ExecResult, OutputChunk, OutputTx, ProcessInfo, ProviderError, Result};

/// Who commands and file operations run as unless a request says otherwise.
pub(crate) const DEFAULT_USER: &str = "user";

/// Where the `BASH_ENV` script lives in every container (uploaded at create).
pub(crate) const BASH_ENV_PATH: &str = "/run/scenario-run/bash_env.sh";

/// Script named by `BASH_ENV`: restore the requested PATH after the login profile.
pub(crate) const BASH_ENV_SCRIPT: &str =
    "# Written by scenario-run: the login profile resets PATH; restore the requested one.\n\
if [ -n \"${SCENARIO_RUN_PATH-}\" ]; then PATH=$SCENARIO_RUN_PATH; export PATH; fi\n\
unset SCENARIO_RUN_PATH BASH_ENV\n";

/// `$1` = cwd, `$2` = the command. Reports the in-container pid, then becomes the command.
const PRELUDE: &str = "echo \"$$\"; cd -- \"$1\" || exit 125; \
export SCENARIO_RUN_PATH=\"$PATH\" BASH_ENV=/run/scenario-run/bash_env.sh; exec /bin/bash -l -c \"$2\"";

/// After a command exited, how long its output may pause before the drain ends (each chunk
/// that still comes starts it again, up to [`DRAIN_CAP`]).
const DRAIN_GRACE: Duration = Duration::from_millis(200);
/// The longest drain after the command exited: a background child it left holding the output
/// open (and writing) does not keep the command from ending.
const DRAIN_CAP: Duration = Duration::from_secs(10);
/// How long to wait for a launched command to report its pid.
const PID_TIMEOUT: Duration = Duration::from_secs(30);
/// How long to wait for a killed command to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long a helper exec (kill, file operations) may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);

type OutStream = Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>;
type InStream = Pin<Box<dyn AsyncWrite + Send>>;

#[derive(Debug, Default)]
struct Collected {
    out: Captured,
    /// As the engine reports it.
    raw_exit: Option<i64>,
    /// The container went away under the command.
    vanished: bool,
    finished: bool,
}

/// One launched command.
pub(crate) struct Proc {
    /// Pid inside the container.
    pub pid: u32,
    pub cmd: String,
    docker: Docker,
    container: String,
    state: Mutex<Collected>,
    done: Done,
    /// Signals the provider delivered to this process.
    sent: Mutex<Vec<i32>>,
    /// The exec's stdin when launched with `open_stdin` (until closed).
    stdin: Stdin<InStream>,
}

impl Proc {
    pub(crate) fn finished(&self) -> bool {
        self.done.is_set()
    }

    /// Waits until the command ended; returns false on timeout.
    pub(crate) async fn wait_done(&self, timeout: Duration) -> bool {
        self.done.wait(Some(timeout)).await
    }

    /// SIGKILLs the command's process group and the command.
    pub(crate) async fn kill_tree(&self) {
        if self.finished() {
            return;
        }
        self.sent.lock().expect("sent").push(libc::SIGKILL);
        let script = "kill -9 -\"$1\" 2>/dev/null; kill -9 \"$1\" 2>/dev/null; true";
        let _ =
            run_helper(&self.docker, &self.container, &["/bin/sh", "-c", script, "sh", &self.pid.to_string()]).await;
    }

    /// (exit code, signal) as the local provider reports them.
    fn status(&self, st: &Collected) -> (Option<i32>, Option<i32>) {
        let sent = self.sent.lock().expect("sent");
        match st.raw_exit {
            Some(c) if c > 128 && c <= 128 + 64 && sent.contains(&((c - 128) as i32)) => (None, Some((c - 128) as i32)),
            Some(c) => (Some(c as i32), None),
            None if st.vanished => (None, Some(libc::SIGKILL)),
            None => (None, None),
        }
    }

    async fn push(&self, chunk: OutputChunk, output: &Option<OutputTx>) {
        {
            let mut st = self.state.lock().expect("proc state");
            match &chunk {
                OutputChunk::Stdout(b) => st.out.stdout(b),
                OutputChunk::Stderr(b) => st.out.stderr(b),
            }
        }
        if let Some(tx) = output {
            let _ = tx.send(chunk).await;
        }
    }

    /// Runs the command to the end (or its timeout) and returns its result.
    pub(crate) async fn finish(&self, timeout: Option<Duration>) -> ExecResult {
        let ended = self.done.wait(timeout).await;
        if !ended {
            self.kill_tree().await;
            self.wait_done(KILL_WAIT).await;
        }
        self.result(!ended)
    }
}

#[async_trait::async_trait]
impl crate::provider::core::Controlled for Proc {
    async fn signal(&self, sig: i32) -> Result<()> {
        let gone = || ProviderError::not_found(format!("process {} is not running", self.pid));
        if self.finished() {
            return Err(gone());
        }
        self.sent.lock().expect("sent").push(sig);
        let argv = ["/bin/sh", "-c", "kill -\"$1\" \"$2\"", "sh", &sig.to_string(), &self.pid.to_string()];
        let (code, _, err) = run_helper(&self.docker, &self.container, &argv).await?;
        if code == 0 {
            return Ok(());
        }
        let msg = String::from_utf8_lossy(&err).to_lowercase();
        if msg.contains("no such process") || self.finished() {
            Err(gone())
        } else {
            Err(ProviderError::invalid(format!("cannot signal process {}: {}", self.pid, msg.trim())))
        }
    }

    /// The group `pid` leads, then the command itself should it have left it.
    async fn signal_group(&self, sig: i32) -> Result<()> {
        self.sent.lock().expect("sent").push(sig);
        let script = "kill -\"$1\" -\"$2\" 2>/dev/null; kill -\"$1\" \"$2\" 2>/dev/null; true";
        run_helper(
            &self.docker,
            &self.container,
            &["/bin/sh", "-c", script, "sh", &sig.to_string(), &self.pid.to_string()],
        )
        .await
        .map(|_| ())
    }

    /// Writes to the stdin kept open by `launch(.., open_stdin: true)`.
    async fn write_stdin(&self, data: &[u8]) -> Result<()> {
        self.stdin.write(self.pid, data, |_| self.finished()).await
    }

    /// Closes that stdin (half-closes the attach connection); closing twice is fine.
    async fn close_stdin(&self) -> Result<()> {
        self.stdin.close().await
    }

    fn result(&self, timed_out: bool) -> ExecResult {
        let st = self.state.lock().expect("proc state");
        let (exit_code, signal) = self.status(&st);
        ExecResult { exit_code, signal, timed_out, pid: self.pid, ..st.out.result() }
    }
}

/// Starts an exec and returns its id and attached streams.
async fn start(
    docker: &Docker,
    container: &str,
    argv: Vec<String>,
    env: Vec<String>,
    attach_stdin: bool,
    user: &str,
) -> Result<(String, OutStream, InStream)> {
    let opts = CreateExecOptions {
        user: Some(user.to_string()),
        attach_stdin: Some(attach_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(env),
        cmd: Some(argv),
        working_dir: Some("/".to_string()),
        ..Default::default()
    };
    let exec = docker.create_exec(container, opts).await.map_err(|e| {
        if is_status(&e, 404) || is_status(&e, 409) {
            ProviderError::infra(format!("sandbox {container} is not running"))
        } else {
            api_err(e, "start the command")
        }
    })?;
    match docker.start_exec(&exec.id, None).await.map_err(|e| api_err(e, "start the command"))? {
        StartExecResults::Attached { output, input } => Ok((exec.id, output, input)),
        StartExecResults::Detached => Err(ProviderError::infra("the engine started the command detached")),
    }
}

/// The exit code of a finished exec (polling briefly while the engine still says running);
/// `None` if the exec or its container is gone.
async fn exit_code(docker: &Docker, exec_id: &str) -> Option<i64> {
    for _ in 0..100 {
        match docker.inspect_exec(exec_id).await {
            Ok(r) if r.running != Some(true) => return r.exit_code,
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => return None,
        }
    }
    None
}

/// Runs a helper command (no shell prelude) to the end: (exit code, stdout, stderr).
pub(crate) async fn run_helper(docker: &Docker, container: &str, argv: &[&str]) -> Result<(i64, Vec<u8>, Vec<u8>)> {
    run_helper_as(docker, container, argv, "root").await
}

/// [`run_helper`] as `user` (file operations made for the sandbox user).
pub(crate) async fn run_helper_as(
    docker: &Docker,
    container: &str,
    argv: &[&str],
    user: &str,
) -> Result<(i64, Vec<u8>, Vec<u8>)> {
    let argv = argv.iter().map(|s| s.to_string()).collect();
    let work = async {
        let (exec_id, mut stream, _input) = start(docker, container, argv, Vec::new(), false, user).await?;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        while let Some(item) = stream.next().await {
            match item {
                Ok(LogOutput::StdOut { message }) => out.extend_from_slice(&message),
                Ok(LogOutput::StdErr { message }) => err.extend_from_slice(&message),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let code = exit_code(docker, &exec_id).await.unwrap_or(-1);
        Ok((code, out, err))
    };
    tokio::time::timeout(HELPER_TIMEOUT, work)
        .await
        .map_err(|_| ProviderError::new(ErrorKind::Timeout, format!("sandbox {container} did not answer in time")))?
}

/// Collects output until the command exits (plus a short grace), then records its status.
async fn drive(proc: Arc<Proc>, exec_id: String, mut stream: OutStream, output: Option<OutputTx>) {
    let mut every = Duration::from_millis(100);
    let far = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let poll = tokio::time::sleep(every);
    let (grace, cap) = (tokio::time::sleep_until(far()), tokio::time::sleep_until(far()));
    tokio::pin!(poll, grace, cap);
    let mut exited = false;
    loop {
        tokio::select! {
            item = stream.next() => {
                match item {
                    Some(Ok(LogOutput::StdOut { message })) => proc.push(OutputChunk::Stdout(message.to_vec()), &output).await,
                    Some(Ok(LogOutput::StdErr { message })) => proc.push(OutputChunk::Stderr(message.to_vec()), &output).await,
                    Some(Ok(_)) => {}
                    _ => break,
                }
                // Output the command wrote before it exited may still be on its way (3 MB lag
                // well behind the exit on a loaded host; a fixed grace cut them short): the
                // drain lasts while it keeps coming.
                if exited {
                    grace.as_mut().reset(tokio::time::Instant::now() + DRAIN_GRACE);
                }
            },
            _ = &mut poll, if !exited => {
                match proc.docker.inspect_exec(&exec_id).await {
                    Ok(r) if r.running == Some(true) => {}
                    _ => {
                        exited = true;
                        let now = tokio::time::Instant::now();
                        grace.as_mut().reset(now + DRAIN_GRACE);
                        cap.as_mut().reset(now + DRAIN_CAP);
                    }
                }
                every = (every * 2).min(Duration::from_secs(1));
                poll.as_mut().reset(tokio::time::Instant::now() + every);
            },
            // Quiet for a moment after the exit, or a child it left keeps writing: done.
            _ = &mut grace, if exited => break,
            _ = &mut cap, if exited => break,
        }
    }
    drop(stream);
    let code = exit_code(&proc.docker, &exec_id).await;
    {
        let mut st = proc.state.lock().expect("proc state");
        st.raw_exit = code;
        st.vanished = code.is_none();
        st.finished = true;
    }
    proc.done.set();
}

/// A sandbox's processes by in-container pid, and its engine handle.
pub(crate) struct ProcTable {
    docker: Docker,
    container: String,
    procs: Procs<Proc>,
    /// Set once the `user` account is known to exist in the container.
    /// Set once the `user` account exists; made by one exec at a time (two execs racing to
    /// add it failed on the account database's lock, and one of them reported no account).
    user_ready: tokio::sync::OnceCell<()>,
    /// Where commands run when the request names no cwd: the image's WORKDIR for a built
    /// template, else `/home/user`.
    default_cwd: String,
}

/// The table's processes by pid ([`Procs`]'s insert, get, list and remove).
impl std::ops::Deref for ProcTable {
    type Target = Procs<Proc>;
    fn deref(&self) -> &Procs<Proc> {
        &self.procs
    }
}

impl ProcTable {
    pub(crate) fn new(docker: Docker, container: String) -> Self {
        Self {
            docker,
            container,
            procs: Procs::default(),
            user_ready: tokio::sync::OnceCell::new(),
            default_cwd: crate::provider::SANDBOX_HOME.to_string(),
        }
    }

    /// Commands without a cwd run in `dir` (a template's WORKDIR).
    pub(crate) fn with_default_cwd(mut self, dir: Option<String>) -> Self {
        if let Some(d) = dir {
            self.default_cwd = d;
        }
        self
    }

    pub(crate) fn docker(&self) -> &Docker {
        &self.docker
    }

    pub(crate) fn container(&self) -> &str {
        &self.container
    }

    /// Makes sure the default account exists in the container before anything runs as it:
    /// an image from elsewhere may lack it (E2B adds it to every template it builds; the
    /// images this project builds have it). Checked once per container.
    pub(crate) async fn ensure_user(&self, user: &str) -> Result<()> {
        if user != DEFAULT_USER {
            return Ok(());
        }
        self.user_ready
            .get_or_try_init(|| async {
                let script = "id -u user >/dev/null 2>&1 && exit 0; \
                    { useradd -m -u 1000 -U -s /bin/bash user || adduser -D -u 1000 -s /bin/sh user; } 2>&1; \
                    mkdir -p /home/user && chown 1000:1000 /home/user && id -u user >/dev/null";
                let (code, out, err) = run_helper(&self.docker, &self.container, &["/bin/sh", "-c", script]).await?;
                if code != 0 {
                    let why = format!("{}{}", String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
                    return Err(ProviderError::infra(format!(
                        "the image has no `user` account and one could not be added: {}",
                        why.trim()
                    )));
                }
                Ok(())
            })
            .await
            .map(|_| ())
    }

    /// Starts `req.cmd`. Live output goes to `output`. With `open_stdin` the exec's stdin is
    /// kept in the [`Proc`] (and `req.stdin` ignored); otherwise it is `req.stdin` or empty.
    pub(crate) async fn launch(
        &self,
        req: &ExecRequest,
        output: Option<OutputTx>,
        open_stdin: bool,
    ) -> Result<Arc<Proc>> {
        let cwd = crate::provider::normalize_path(req.cwd.as_deref().unwrap_or(&self.default_cwd))?;
        let mut env = Vec::new();
        for (k, v) in &req.envs {
            check_env_key(k)?;
            env.push(format!("{k}={v}"));
        }
        if req.cmd.contains('\0') || env.iter().any(|e| e.contains('\0')) {
            return Err(ProviderError::invalid("command or environment contains a NUL byte"));
        }
        let argv = ["/bin/sh", "-c", PRELUDE, "sh", &cwd, &req.cmd].map(String::from).to_vec();
        let feed = if open_stdin { None } else { req.stdin.clone() };
        // Commands run as `user` unless the request says otherwise, as on E2B and local.
        let user = req.user.clone().unwrap_or_else(|| DEFAULT_USER.to_string());
        self.ensure_user(&user).await?;
        let (exec_id, mut stream, mut input) =
            start(&self.docker, &self.container, argv, env, open_stdin || feed.is_some(), &user).await?;

        // The first stdout line is the prelude's pid.
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let read_pid = async {
            loop {
                match stream.next().await {
                    Some(Ok(LogOutput::StdOut { message })) => {
                        out.extend_from_slice(&message);
                        if let Some(i) = out.iter().position(|b| *b == b'\n') {
                            let line: Vec<u8> = out.drain(..=i).collect();
                            return String::from_utf8_lossy(&line).trim().parse::<u32>().ok();
                        }
                    }
                    Some(Ok(LogOutput::StdErr { message })) => err.extend_from_slice(&message),
                    Some(Ok(_)) => {}
                    _ => return None,
                }
            }
        };
        let pid = match tokio::time::timeout(PID_TIMEOUT, read_pid).await {
            Ok(Some(pid)) => pid,
            _ => {
                let code = exit_code(&self.docker, &exec_id).await;
                let why = String::from_utf8_lossy(&err).trim().to_string();
                return Err(ProviderError::infra(format!(
                    "command did not start in the sandbox (exit {}): {}",
                    code.map_or("unknown".into(), |c| c.to_string()),
                    if why.is_empty() { "no output" } else { &why }
                )));
            }
        };

        let done = Done::new();
        if let Some(data) = feed {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
            });
            input = Box::pin(tokio::io::sink());
        }
        let proc = Arc::new(Proc {
            pid,
            cmd: req.cmd.clone(),
            docker: self.docker.clone(),
            container: self.container.clone(),
            state: Mutex::new(Collected { out: Captured::for_request(req), ..Collected::default() }),
            done,
            sent: Mutex::new(Vec::new()),
            stdin: Stdin::new(open_stdin.then_some(input)),
        });
        if !out.is_empty() {
            proc.push(OutputChunk::Stdout(out), &output).await;
        }
        if !err.is_empty() {
            proc.push(OutputChunk::Stderr(err), &output).await;
        }
        self.procs.insert(proc.clone());
        tokio::spawn(drive(proc.clone(), exec_id, stream, output));
        Ok(proc)
    }

    /// The container is being removed: whatever still runs dies of SIGKILL.
    pub(crate) fn mark_all_gone(&self) {
        for p in self.procs.all() {
            if !p.finished() {
                p.sent.lock().expect("sent").push(libc::SIGKILL);
            }
        }
    }
}

impl Process for Proc {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn info(&self) -> ProcessInfo {
        let st = self.state.lock().expect("proc state");
        let (exit_code, _) = self.status(&st);
        ProcessInfo { pid: self.pid, cmd: self.cmd.clone(), running: !st.finished, exit_code }
    }
    fn done(&self) -> &Done {
        &self.done
    }
    fn kill_tree_now(self: Arc<Self>) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { self.kill_tree().await });
        }
    }
}

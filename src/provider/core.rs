//! What the providers that run sandboxes themselves (local, docker) share: the registry of
//! live sandboxes with their deadlines, the counters behind [`Provider::stats`], the guard
//! that lets `destroy_all` wait for creations still under way, and the table of a sandbox's
//! processes with the process capabilities over it. Each provider supplies only what differs:
//! how a sandbox is torn down ([`Host::teardown`]), what a process is, and how a command is
//! run and started ([`ProcessHost`]).
//!
//! Ordering rules, kept in one place:
//! * a sandbox is registered and counted (`created`, `live`, `peak_live`) under one lock, and
//!   unregistered and counted `destroyed` under that same lock, so the counters always agree
//!   with what `list` shows (a sandbox being torn down is already gone for callers, as on a
//!   cloud that answers 404 once a kill is accepted);
//! * a creation runs in a task of its own, so a caller that stops waiting (Ctrl-C, a step
//!   timeout) cannot leave a half-made sandbox: the task finishes and kills what it made;
//! * `destroy_all` kills what is registered, then waits (bounded) for creations still in
//!   flight, which see the shutdown flag and kill what they made themselves.
//!
//! [`Provider::stats`]: super::Provider::stats

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{oneshot, Notify};

use super::{
    ExecRequest, ExecResult, LiveProcess, LiveProcesses, OutputTx, ProcessInfo, Processes, ProviderError,
    ProviderStats, Result,
};

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The "no such sandbox" error every provider answers with.
pub(crate) fn no_sandbox(id: &str) -> ProviderError {
    ProviderError::not_found(format!("no such sandbox: {id}"))
}

/// A sandbox's end time and whether it is gone.
#[derive(Debug)]
pub(crate) struct Life {
    end_at_ms: Mutex<u64>,
    changed: Notify,
    gone: AtomicBool,
}

impl Life {
    pub(crate) fn new(end_at_ms: u64) -> Self {
        Self { end_at_ms: Mutex::new(end_at_ms), changed: Notify::new(), gone: AtomicBool::new(false) }
    }

    pub(crate) fn end_ms(&self) -> u64 {
        *self.end_at_ms.lock().expect("end_at")
    }

    /// Moves the end time (`set_timeout`, `connect`).
    pub(crate) fn set_end(&self, end_ms: u64) {
        *self.end_at_ms.lock().expect("end_at") = end_ms;
        self.changed.notify_one();
    }

    /// `timeout_secs` from now.
    pub(crate) fn extend(&self, timeout_secs: u64) {
        self.set_end(now_ms().saturating_add(timeout_secs.saturating_mul(1000)));
    }

    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        self.changed.notify_one();
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }
}

/// A sandbox as the registry sees it.
pub(crate) trait Member: Send + Sync + 'static {
    fn id(&self) -> &str;
    fn life(&self) -> &Life;
    /// Whether this provider made it (and so counts it, and `destroy_all` removes it). The
    /// docker provider also holds sandboxes of other runs it connected to.
    fn owned(&self) -> bool {
        true
    }
}

/// The provider side of the shared core.
#[async_trait]
pub(crate) trait Host: Send + Sync + Sized + 'static {
    type Sandbox: Member;
    fn core(&self) -> &Core<Self::Sandbox>;
    /// Tears a sandbox down for good; it is already unregistered. Must be bounded.
    async fn teardown(&self, sb: &Arc<Self::Sandbox>);
    /// What happens at a sandbox's end time instead of the kill: true when it was handled
    /// (paused by its lifecycle, which moves its end out of reach), false to kill it.
    async fn at_end(&self, _sb: &Arc<Self::Sandbox>) -> bool {
        false
    }
}

/// The registry, counters and creation guard of one provider.
pub(crate) struct Core<S> {
    live: Mutex<HashMap<String, Arc<S>>>,
    /// Being torn down: no longer addressable, but a second Ctrl-C must still finish them off.
    dying: Mutex<HashMap<String, Arc<S>>>,
    stats: Mutex<ProviderStats>,
    in_flight: AtomicUsize,
    in_flight_changed: Notify,
    shutting_down: AtomicBool,
    /// Owned sandboxes a `create { keep: true }` leaves alive after the run: `destroy_all`
    /// passes them by.
    kept: Mutex<std::collections::HashSet<String>>,
}

impl<S> Default for Core<S> {
    fn default() -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            dying: Mutex::new(HashMap::new()),
            stats: Mutex::new(ProviderStats::default()),
            in_flight: AtomicUsize::new(0),
            in_flight_changed: Notify::new(),
            shutting_down: AtomicBool::new(false),
            kept: Mutex::new(std::collections::HashSet::new()),
        }
    }
}

impl<S: Member> Core<S> {
    pub(crate) fn get(&self, id: &str) -> Result<Arc<S>> {
        self.live.lock().expect("sandboxes").get(id).cloned().ok_or_else(|| no_sandbox(id))
    }

    /// Registers `sb` (counted if owned); an adopted one already registered is kept.
    pub(crate) fn register(&self, sb: Arc<S>) -> Arc<S> {
        let mut live = self.live.lock().expect("sandboxes");
        if let Some(existing) = live.get(sb.id()) {
            return existing.clone();
        }
        if sb.owned() {
            let mut st = self.stats.lock().expect("stats");
            st.created += 1;
            st.live += 1;
            st.peak_live = st.peak_live.max(st.live);
        }
        live.insert(sb.id().to_string(), sb.clone());
        sb
    }

    /// The registered sandboxes.
    pub(crate) fn live(&self) -> Vec<Arc<S>> {
        self.live.lock().expect("sandboxes").values().cloned().collect()
    }

    /// Registered and dying ones: what a last-resort kill must reach.
    pub(crate) fn everything(&self) -> Vec<Arc<S>> {
        let mut all = self.live();
        all.extend(self.dying.lock().expect("dying").values().cloned());
        all
    }

    pub(crate) fn is_dying(&self, id: &str) -> bool {
        self.dying.lock().expect("dying").contains_key(id)
    }

    pub(crate) fn stats(&self) -> ProviderStats {
        self.stats.lock().expect("stats").clone()
    }

    /// [`super::Provider::keep`]: `destroy_all` leaves `id` alive.
    pub(crate) fn keep(&self, id: &str) {
        self.kept.lock().expect("kept").insert(id.to_string());
    }

    pub(crate) fn is_kept(&self, id: &str) -> bool {
        self.kept.lock().expect("kept").contains(id)
    }

    /// What `destroy_all` kills: owned and not kept.
    fn doomed(&self, sb: &S) -> bool {
        sb.owned() && !self.is_kept(sb.id())
    }

    /// Unregisters `id` and moves it to the dying set, counting it destroyed under the same
    /// lock. None if it was not registered.
    fn unregister(&self, id: &str) -> Option<Arc<S>> {
        let mut live = self.live.lock().expect("sandboxes");
        let sb = live.remove(id)?;
        if sb.owned() {
            let mut st = self.stats.lock().expect("stats");
            st.destroyed += 1;
            st.live = st.live.saturating_sub(1);
        }
        self.dying.lock().expect("dying").insert(id.to_string(), sb.clone());
        drop(live);
        sb.life().mark_gone();
        Some(sb)
    }
}

/// Unregisters and tears down `id`; false if it was not registered.
pub(crate) async fn kill<H: Host>(host: &H, id: &str) -> bool {
    let core = host.core();
    let Some(sb) = core.unregister(id) else { return false };
    host.teardown(&sb).await;
    core.dying.lock().expect("dying").remove(id);
    true
}

/// Decrements the in-flight counter even if the creation task panics.
struct InFlight<H: Host>(Arc<H>);

impl<H: Host> Drop for InFlight<H> {
    fn drop(&mut self) {
        let core = self.0.core();
        core.in_flight.fetch_sub(1, Ordering::SeqCst);
        core.in_flight_changed.notify_waiters();
    }
}

/// Runs `make` (which registers what it makes) in a task of its own and returns its sandbox;
/// if nobody waits for it any more, or the provider is shutting down, the sandbox is killed.
pub(crate) async fn create<H, F>(host: Arc<H>, make: F) -> Result<Arc<H::Sandbox>>
where
    H: Host,
    F: Future<Output = Result<Arc<H::Sandbox>>> + Send + 'static,
{
    host.core().in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight(host.clone());
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let guard = guard;
        let host = &guard.0;
        match make.await {
            Ok(sb) => {
                if host.core().shutting_down.load(Ordering::SeqCst) {
                    kill(host.as_ref(), sb.id()).await;
                    let _ = tx.send(Err(ProviderError::infra("provider is shutting down")));
                } else if let Err(Ok(sb)) = tx.send(Ok(sb)) {
                    kill(host.as_ref(), sb.id()).await;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        }
    });
    rx.await.map_err(|_| ProviderError::infra("sandbox creation failed unexpectedly"))?
}

/// Kills every owned sandbox but the kept ones, waiting (bounded) for creations in flight;
/// returns how many.
pub(crate) async fn destroy_all<H: Host>(host: &Arc<H>) -> usize {
    let core = host.core();
    core.shutting_down.store(true, Ordering::SeqCst);
    let mut count = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ids: Vec<String> = core.live().iter().filter(|sb| core.doomed(sb)).map(|sb| sb.id().to_string()).collect();
        let mut set = tokio::task::JoinSet::new();
        for id in ids {
            let host = host.clone();
            set.spawn(async move { kill(host.as_ref(), &id).await });
        }
        while let Some(r) = set.join_next().await {
            if matches!(r, Ok(true)) {
                count += 1;
            }
        }
        // Creations still under way register (and, seeing the flag, kill) their sandbox.
        while core.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            let changed = core.in_flight_changed.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
        }
        let left = core.live().iter().any(|sb| core.doomed(sb));
        if !left || tokio::time::Instant::now() >= deadline {
            break;
        }
    }
    // Kills still tearing down in other tasks (a `serve` DELETE answered before its teardown
    // ended) finish before this returns, so shutdown leaves nothing behind.
    while !core.dying.lock().expect("dying").is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    core.shutting_down.store(false, Ordering::SeqCst);
    count
}

/// Kills `sb` at its end time (which `set_timeout` may move), unless it is gone first.
pub(crate) fn expire_at_end<H: Host>(host: &Arc<H>, sb: Arc<H::Sandbox>) {
    let host: Weak<H> = Arc::downgrade(host);
    tokio::spawn(async move {
        loop {
            let life = sb.life();
            if life.is_gone() {
                return;
            }
            let (end, now) = (life.end_ms(), now_ms());
            if now >= end {
                let Some(host) = host.upgrade() else { return };
                // Paused instead (its end is then out of reach until a resume moves it back).
                if host.at_end(&sb).await && sb.life().end_ms() > now_ms() {
                    continue;
                }
                kill(host.as_ref(), sb.id()).await;
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(end - now)) => {}
                _ = life.changed.notified() => {}
            }
        }
    });
}

/// A process as the table sees it.
pub(crate) trait Process: Send + Sync + 'static {
    /// Its pid inside the sandbox.
    fn pid(&self) -> u32;
    fn info(&self) -> ProcessInfo;
    /// Set when it has ended.
    fn done(&self) -> &Done;
    /// SIGKILLs it and what it started, without waiting (in a task of its own where that
    /// takes awaiting).
    fn kill_tree_now(self: Arc<Self>);
}

/// What the shared process capabilities ask of a process in a [`Procs`] table, beyond
/// [`Process`].
#[async_trait]
pub(crate) trait Controlled: Process {
    /// Sends `sig` to it; a process that has ended is `not_found`.
    async fn signal(&self, sig: i32) -> Result<()>;
    /// Sends `sig` to its process group ([`super::Processes::signal_group`]); by default to
    /// it alone.
    async fn signal_group(&self, sig: i32) -> Result<()> {
        self.signal(sig).await
    }
    /// Writes to the stdin kept open for it (`spawn_live(.., open_stdin: true)`).
    async fn write_stdin(&self, data: &[u8]) -> Result<()>;
    /// Closes that stdin; closing twice is fine.
    async fn close_stdin(&self) -> Result<()>;
    /// Its status and output so far.
    fn result(&self, timed_out: bool) -> ExecResult;
}

/// A provider whose sandboxes keep their processes in a [`Procs`] table (local, docker). What
/// differs between them is how a command is run and started; the rest of [`Processes`] and
/// [`LiveProcesses`] is the same table work, done once below.
#[async_trait]
pub(crate) trait ProcessHost: Send + Sync {
    type Proc: Controlled;
    /// `f` of sandbox `id`'s process table.
    fn with_table<R>(&self, id: &str, f: impl FnOnce(&Procs<Self::Proc>) -> R) -> Result<R>;
    /// Runs a command to completion ([`Processes::exec`]).
    async fn run(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult>;
    /// Starts a command in the background, in the table, killed after `req.timeout`; with
    /// `stdin`, its stdin stays open.
    async fn start(&self, id: &str, req: ExecRequest, out: Option<OutputTx>, stdin: bool) -> Result<Arc<Self::Proc>>;

    /// Process `pid` of sandbox `id`.
    fn process(&self, id: &str, pid: u32) -> Result<Arc<Self::Proc>> {
        self.with_table(id, |t| t.get(pid))?
    }
}

#[async_trait]
impl<H: ProcessHost> Processes for H {
    async fn exec(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        self.run(id, req, output).await
    }

    async fn spawn(&self, id: &str, req: ExecRequest) -> Result<u32> {
        Ok(self.start(id, req, None, false).await?.pid())
    }

    async fn process_list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        self.with_table(id, |t| t.list())
    }

    async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        self.process(id, pid)?.signal(signal).await
    }

    async fn signal_group(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        self.process(id, pid)?.signal_group(signal).await
    }

    async fn wait(&self, id: &str, pid: u32, timeout: Duration) -> Result<ExecResult> {
        let p = self.process(id, pid)?;
        let done = p.done().wait(Some(timeout)).await;
        Ok(p.result(!done))
    }
}

#[async_trait]
impl<H: ProcessHost> LiveProcesses for H {
    async fn spawn_live(&self, id: &str, req: ExecRequest, open_stdin: bool) -> Result<LiveProcess> {
        let (tx, rx) = super::output_channel();
        let p = self.start(id, req, Some(tx), open_stdin).await?;
        Ok(LiveProcess { pid: p.pid(), output: rx })
    }

    async fn spawn_with_stdin(&self, id: &str, req: ExecRequest) -> Result<u32> {
        Ok(self.start(id, req, None, true).await?.pid())
    }

    async fn write_stdin(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()> {
        self.process(id, pid)?.write_stdin(&data).await
    }

    async fn close_stdin(&self, id: &str, pid: u32) -> Result<()> {
        self.process(id, pid)?.close_stdin().await
    }
}

/// Kills the command if the `exec` future is dropped before it finished.
pub(crate) struct KillOnDrop<P: Process>(pub Option<Arc<P>>);

impl<P: Process> Drop for KillOnDrop<P> {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            if !p.done().is_set() {
                p.kill_tree_now();
            }
        }
    }
}

/// A background command's `timeout`: past it, the command and what it started are killed.
pub(crate) fn kill_after<P: Process>(p: &Arc<P>, timeout: Option<Duration>) {
    if let Some(t) = timeout {
        let p = p.clone();
        tokio::spawn(async move {
            if !p.done().wait(Some(t)).await {
                p.kill_tree_now();
            }
        });
    }
}

/// A sandbox's processes by pid inside it.
pub(crate) struct Procs<P> {
    procs: Mutex<BTreeMap<u32, Arc<P>>>,
}

impl<P> Default for Procs<P> {
    fn default() -> Self {
        Self { procs: Mutex::new(BTreeMap::new()) }
    }
}

impl<P: Process> Procs<P> {
    pub(crate) fn insert(&self, p: Arc<P>) {
        self.procs.lock().expect("procs").insert(p.pid(), p);
    }

    /// Removes `p` if it is still the entry for its pid.
    pub(crate) fn remove(&self, p: &Arc<P>) {
        let mut procs = self.procs.lock().expect("procs");
        if procs.get(&p.pid()).is_some_and(|q| Arc::ptr_eq(q, p)) {
            procs.remove(&p.pid());
        }
    }

    pub(crate) fn get(&self, pid: u32) -> Result<Arc<P>> {
        self.procs
            .lock()
            .expect("procs")
            .get(&pid)
            .cloned()
            .ok_or_else(|| ProviderError::not_found(format!("no such process: {pid}")))
    }

    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        self.procs.lock().expect("procs").values().map(|p| p.info()).collect()
    }

    pub(crate) fn all(&self) -> Vec<Arc<P>> {
        self.procs.lock().expect("procs").values().cloned().collect()
    }
}

/// An environment variable's name a process may be given: not empty, no `=`, no NUL.
pub(crate) fn check_env_key(k: &str) -> Result<()> {
    if k.is_empty() || k.contains('=') || k.contains('\0') {
        return Err(ProviderError::invalid(format!("invalid environment variable name: {k:?}")));
    }
    Ok(())
}

/// Whether a process has ended, for any number of waiters: set once, when it was reaped.
#[derive(Debug)]
pub(crate) struct Done(tokio::sync::watch::Sender<bool>);

impl Done {
    pub(crate) fn new() -> Self {
        Self(tokio::sync::watch::channel(false).0)
    }

    pub(crate) fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    pub(crate) fn set(&self) {
        self.0.send_replace(true);
    }

    /// Waits until it is set, at most `timeout` (`None`: without a limit); false when the
    /// time ran out first.
    pub(crate) async fn wait(&self, timeout: Option<Duration>) -> bool {
        let mut rx = self.0.subscribe();
        match timeout {
            Some(t) => matches!(tokio::time::timeout(t, rx.wait_for(|d| *d)).await, Ok(Ok(_))),
            None => {
                let _ = rx.wait_for(|d| *d).await;
                true
            }
        }
    }
}

/// How long a write to a process's stdin may block (the pipe is full and nobody reads).
const STDIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A process's stdin kept open for `write_stdin` / `close_stdin` (a process launched with
/// `open_stdin`), as local and docker keep it: a pipe, or the engine's attach connection.
#[derive(Debug)]
pub(crate) struct Stdin<W> {
    w: tokio::sync::Mutex<Option<W>>,
}

impl<W: tokio::io::AsyncWrite + Unpin + Send> Stdin<W> {
    /// `None`: the process has no open stdin.
    pub(crate) fn new(w: Option<W>) -> Self {
        Self { w: tokio::sync::Mutex::new(w) }
    }

    /// Writes `data` to process `pid`'s stdin within [`STDIN_TIMEOUT`]. A write error is
    /// `not_found` (the process is not running) when `gone` says so, else `infra`.
    pub(crate) async fn write(&self, pid: u32, data: &[u8], gone: impl FnOnce(&std::io::Error) -> bool) -> Result<()> {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = self.w.lock().await;
        let Some(w) = stdin.as_mut() else {
            return Err(ProviderError::invalid(format!("process {pid} has no open stdin")));
        };
        match tokio::time::timeout(STDIN_TIMEOUT, async {
            w.write_all(data).await?;
            w.flush().await
        })
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if gone(&e) => Err(ProviderError::not_found(format!("process {pid} is not running"))),
            Ok(Err(e)) => Err(ProviderError::infra(format!("cannot write to stdin of process {pid}: {e}"))),
            Err(_) => {
                Err(ProviderError::new(super::ErrorKind::Timeout, format!("process {pid} does not read its stdin")))
            }
        }
    }

    /// Closes it (the process sees end of file); closing twice is fine.
    pub(crate) async fn close(&self) -> Result<()> {
        use tokio::io::AsyncWriteExt as _;
        if let Some(mut w) = self.w.lock().await.take() {
            let _ = w.shutdown().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_keys_are_checked() {
        assert!(check_env_key("FOO").is_ok());
        assert!(check_env_key("A=B").is_err());
        assert!(check_env_key("").is_err());
    }

    struct Sb {
        id: String,
        life: Life,
    }

    impl Member for Sb {
        fn id(&self) -> &str {
            &self.id
        }
        fn life(&self) -> &Life {
            &self.life
        }
    }

    #[derive(Default)]
    struct Fake {
        core: Core<Sb>,
        torn_down: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl Host for Fake {
        type Sandbox = Sb;
        fn core(&self) -> &Core<Sb> {
            &self.core
        }
        async fn teardown(&self, sb: &Arc<Sb>) {
            // While a teardown runs, the sandbox is already counted destroyed and unlisted.
            let st = self.core.stats();
            assert_eq!(st.live as usize, self.core.live().len());
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.torn_down.lock().unwrap().push(sb.id.clone());
        }
    }

    fn sb(id: &str, end: u64) -> Arc<Sb> {
        Arc::new(Sb { id: id.into(), life: Life::new(end) })
    }

    #[tokio::test]
    async fn counters_agree_with_the_registry_at_every_step() {
        let host = Arc::new(Fake::default());
        for i in 0..3 {
            host.core.register(sb(&format!("s{i}"), u64::MAX));
        }
        assert_eq!((host.core.stats().created, host.core.stats().live, host.core.stats().peak_live), (3, 3, 3));
        let h = host.clone();
        let killing = tokio::spawn(async move { kill(h.as_ref(), "s0").await });
        tokio::task::yield_now().await;
        assert!(killing.await.unwrap());
        assert!(!kill(host.as_ref(), "s0").await, "a second kill finds nothing");
        let st = host.core.stats();
        assert_eq!((st.created, st.destroyed, st.live), (3, 1, 2));
        assert_eq!(destroy_all(&host).await, 2);
        assert_eq!(host.core.stats().live, 0);
        assert_eq!(host.torn_down.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_creation_nobody_waits_for_is_killed() {
        let host = Arc::new(Fake::default());
        let h = host.clone();
        let make = async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Ok(h.core.register(sb("orphan", u64::MAX)))
        };
        let waiting = tokio::spawn(create(host.clone(), make));
        tokio::time::sleep(Duration::from_millis(10)).await;
        waiting.abort();
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(host.torn_down.lock().unwrap().as_slice(), ["orphan"]);
        assert_eq!(host.core.stats().live, 0);
    }

    #[tokio::test]
    async fn sandboxes_expire_at_their_end_time_which_can_move() {
        let host = Arc::new(Fake::default());
        let a = host.core.register(sb("a", now_ms() + 50));
        let b = host.core.register(sb("b", now_ms() + 50));
        b.life.extend(60);
        expire_at_end(&host, a);
        expire_at_end(&host, b);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(host.torn_down.lock().unwrap().as_slice(), ["a"]);
        assert!(host.core.get("b").is_ok());
    }
}

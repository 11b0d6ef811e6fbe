//! The processes one sandbox runs for E2B clients, and the fan-out of their output.
//!
//! `Process/Start` spawns through [`LiveProcesses::spawn_live`] and hands the live output to a hub
//! task owned by the server, not by the HTTP request: the process keeps running (and keeps its
//! `Connect-Timeout-Ms` lifetime) when the client goes away, as with envd. Each stream
//! (`Start`, and every later `Connect`) is a subscriber that receives only output produced after
//! it subscribed. When the output ends the hub asks the provider for the exit status, sends the
//! `end` event (or a `deadline_exceeded` stream error if the hub killed the process at its
//! deadline) and keeps it, so a `Connect` to a process that just ended still gets its end.
//!
//! # Slow subscribers
//!
//! The hub never waits for a subscriber: it must keep draining the provider's output, which
//! is unbounded, or memory would grow there instead. Each subscriber may have at most
//! [`SUBSCRIBER_BUDGET`] bytes of output queued and not yet written to its HTTP stream (a
//! client that does not read fills its socket, then this queue). The policy past it is to
//! disconnect, not to drop chunks silently: the subscriber gets what was queued, then its
//! stream ends with `resource_exhausted` ("fell behind"); the process keeps running, and
//! `Process/Connect` attaches again (to new output, as envd's does). So a slow client costs
//! at most the budget, and never sees output with holes in it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::RpcError;
use crate::provider::{ExecResult, LiveProcess, OutputChunk, Provider};

/// Most bytes of output one subscriber may have queued; see the module documentation.
pub(crate) const SUBSCRIBER_BUDGET: usize = 16 << 20;

/// What a stream subscriber receives.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    Data(OutputChunk),
    /// The `end` event body (`{"exitCode":…,"status":…}`).
    End(Value),
    /// The stream ends with this error instead of an `end` event.
    Error(RpcError),
    /// The sandbox went away under the process: the stream is cut without an end, as envd's
    /// connection drops with its sandbox (the SDK then checks the sandbox's health and
    /// reports it killed).
    Abort,
}

/// One process started through `Process/Start`.
#[derive(Debug)]
pub(crate) struct Entry {
    pub pid: u32,
    pub tag: Option<String>,
    /// Runs in a terminal: its output is the terminal's (`pty` data events).
    pub pty: bool,
    /// The `ProcessConfig` it was started with, for `Process/List`.
    pub config: Value,
    state: Mutex<EntryState>,
    /// [`SUBSCRIBER_BUDGET`], smaller in tests.
    budget: usize,
}

/// The hub's side of one subscriber.
#[derive(Debug)]
struct Subscriber {
    tx: mpsc::UnboundedSender<Event>,
    /// Bytes sent and not yet taken by the receiver.
    queued: Arc<AtomicUsize>,
}

impl Subscriber {
    /// Queues `ev`; false when the subscriber is gone or was just cut off for falling behind.
    fn send(&self, ev: &Event, budget: usize) -> bool {
        if let Event::Data(c) = ev {
            let n = chunk_len(c);
            if self.queued.load(Ordering::SeqCst) + n > budget {
                let why = format!(
                    "output stream fell behind by more than {} and was disconnected; the process keeps \
                     running: reconnect with Process/Connect",
                    crate::size::human(budget as u64)
                );
                let _ = self.tx.send(Event::Error(RpcError::new("resource_exhausted", why)));
                return false;
            }
            self.queued.fetch_add(n, Ordering::SeqCst);
        }
        self.tx.send(ev.clone()).is_ok()
    }
}

fn chunk_len(c: &OutputChunk) -> usize {
    match c {
        OutputChunk::Stdout(b) | OutputChunk::Stderr(b) => b.len(),
    }
}

/// The stream's side of one subscriber.
#[derive(Debug)]
pub(crate) struct Subscription {
    rx: mpsc::UnboundedReceiver<Event>,
    queued: Arc<AtomicUsize>,
}

impl Subscription {
    pub(crate) async fn recv(&mut self) -> Option<Event> {
        let ev = self.rx.recv().await;
        if let Some(Event::Data(c)) = &ev {
            self.queued.fetch_sub(chunk_len(c), Ordering::SeqCst);
        }
        ev
    }
}

#[derive(Debug, Default)]
struct EntryState {
    subscribers: Vec<Subscriber>,
    /// The final event, once the process ended.
    end: Option<Event>,
}

impl Entry {
    pub(crate) fn running(&self) -> bool {
        self.state.lock().expect("entry").end.is_none()
    }

    /// A new subscriber; if the process has ended the receiver already holds the final event.
    pub(crate) fn subscribe(&self) -> Subscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let mut st = self.state.lock().expect("entry");
        match &st.end {
            Some(end) => {
                let _ = tx.send(end.clone());
            }
            None => st.subscribers.push(Subscriber { tx, queued: queued.clone() }),
        }
        Subscription { rx, queued }
    }

    fn broadcast(&self, ev: Event) {
        let budget = self.budget;
        self.state.lock().expect("entry").subscribers.retain(|s| s.send(&ev, budget));
    }

    fn finish(&self, ev: Event) {
        let mut st = self.state.lock().expect("entry");
        for s in st.subscribers.drain(..) {
            let _ = s.tx.send(ev.clone());
        }
        st.end = Some(ev);
    }
}

/// The processes of one sandbox, by pid.
#[derive(Debug, Default)]
pub(crate) struct Table {
    procs: Mutex<BTreeMap<u32, Arc<Entry>>>,
    /// Set when the sandbox is being killed: its processes' streams are then cut (`Abort`).
    gone: Arc<std::sync::atomic::AtomicBool>,
}

/// What a process was started as: its config (as `List` shows it), its tag, and whether it
/// runs on a terminal.
pub(crate) struct Started {
    pub config: Value,
    pub tag: Option<String>,
    pub pty: bool,
}

impl Table {
    /// Marks the sandbox as going away (before it is killed).
    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    /// Registers a process just spawned (`live`) and starts its hub. Returns the entry and the
    /// first subscriber (the `Start` stream), registered before any output is forwarded.
    pub(crate) fn start(
        &self,
        provider: Arc<dyn Provider>,
        sandbox: String,
        live: LiveProcess,
        what: Started,
        deadline: Option<Duration>,
    ) -> (Arc<Entry>, Subscription) {
        let Started { config, tag, pty } = what;
        let entry = Arc::new(Entry {
            pid: live.pid,
            tag,
            pty,
            config,
            state: Mutex::new(EntryState::default()),
            budget: SUBSCRIBER_BUDGET,
        });
        let rx = entry.subscribe();
        self.procs.lock().expect("procs").insert(live.pid, entry.clone());
        tokio::spawn(hub(provider, sandbox, live, entry.clone(), deadline, self.gone.clone()));
        (entry, rx)
    }

    pub(crate) fn by_pid(&self, pid: u32) -> Option<Arc<Entry>> {
        self.procs.lock().expect("procs").get(&pid).cloned()
    }

    /// The running process with this tag (the newest, should several share it).
    pub(crate) fn by_tag(&self, tag: &str) -> Option<Arc<Entry>> {
        let procs = self.procs.lock().expect("procs");
        let mut found: Vec<&Arc<Entry>> = procs.values().filter(|e| e.tag.as_deref() == Some(tag)).collect();
        found.sort_by_key(|e| !e.running());
        found.first().map(|e| (*e).clone())
    }

    pub(crate) fn running(&self) -> Vec<Arc<Entry>> {
        self.procs.lock().expect("procs").values().filter(|e| e.running()).cloned().collect()
    }
}

/// Forwards the output of one process to its subscribers, enforces its deadline, and sends
/// the end.
async fn hub(
    provider: Arc<dyn Provider>,
    sandbox: String,
    mut live: LiveProcess,
    entry: Arc<Entry>,
    deadline: Option<Duration>,
    gone: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut timed_out = false;
    let sleep = tokio::time::sleep(deadline.unwrap_or(Duration::from_secs(86400 * 365)));
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            chunk = live.output.recv() => match chunk {
                Some(c) => entry.broadcast(Event::Data(c)),
                None => break,
            },
            _ = &mut sleep, if deadline.is_some() && !timed_out => {
                timed_out = true;
                // The command and what it started (the group it leads), once.
                let _ = provider.sandbox(&sandbox).signal_group(live.pid, libc::SIGKILL).await;
            }
        }
    }
    let result = provider.sandbox(&sandbox).wait(live.pid, Duration::from_secs(10)).await;
    let ev = if gone.load(Ordering::SeqCst) {
        Event::Abort
    } else if timed_out {
        Event::Error(RpcError::new("deadline_exceeded", "context deadline exceeded"))
    } else {
        match result {
            Ok(r) => Event::End(end_event(&r)),
            // The sandbox went away under the process (expired, say).
            Err(_) => Event::Abort,
        }
    };
    entry.finish(ev);
}

/// The `end` event as envd builds it from Go's `ProcessState`: zero values omitted.
pub(crate) fn end_event(r: &ExecResult) -> Value {
    match (r.exit_code, r.signal) {
        (Some(0), _) => json!({"exited": true, "status": "exit status 0"}),
        (Some(c), _) => {
            let s = format!("exit status {c}");
            json!({"exitCode": c, "exited": true, "status": s, "error": s})
        }
        (None, Some(sig)) => {
            let s = format!("signal: {}", signal_name(sig));
            json!({"exitCode": -1, "status": s, "error": s})
        }
        (None, None) => json!({"exitCode": -1, "status": "unknown", "error": "process status unknown"}),
    }
}

/// Go's `syscall.Signal.String()` for the usual signals (envd's and OpenSandbox execd's text
/// of a signal death).
pub(crate) fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGUSR1 => "user defined signal 1".into(),
        libc::SIGUSR2 => "user defined signal 2".into(),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(budget: usize) -> Entry {
        Entry { pid: 1, tag: None, pty: false, config: json!({}), state: Mutex::new(EntryState::default()), budget }
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_cut_off_not_fed_holes() {
        let e = entry(10);
        let mut slow = e.subscribe();
        let mut fast = e.subscribe();
        let chunk = || Event::Data(OutputChunk::Stdout(vec![b'x'; 4]));
        e.broadcast(chunk());
        assert!(matches!(fast.recv().await, Some(Event::Data(_))));
        e.broadcast(chunk());
        assert!(matches!(fast.recv().await, Some(Event::Data(_))));
        // `slow` has 8 bytes queued; 4 more would pass its budget of 10.
        e.broadcast(chunk());
        assert!(matches!(fast.recv().await, Some(Event::Data(_))));
        assert_eq!(e.state.lock().unwrap().subscribers.len(), 1, "the slow one is dropped");
        for _ in 0..2 {
            assert!(matches!(slow.recv().await, Some(Event::Data(_))), "what was queued is delivered");
        }
        match slow.recv().await {
            Some(Event::Error(err)) => {
                assert_eq!(err.code, "resource_exhausted");
                assert!(err.message.contains("fell behind"), "{}", err.message);
            }
            other => panic!("expected the cut-off error, got {other:?}"),
        }
        assert!(slow.recv().await.is_none());
        // The queue stays bounded however much more the process writes.
        for _ in 0..1000 {
            e.broadcast(chunk());
            assert!(matches!(fast.recv().await, Some(Event::Data(_))));
        }
        e.finish(Event::End(json!({"exited": true})));
        assert!(matches!(fast.recv().await, Some(Event::End(_))));
    }

    #[test]
    fn end_events_look_like_envd() {
        let ok = ExecResult { exit_code: Some(0), ..Default::default() };
        assert_eq!(end_event(&ok), json!({"exited": true, "status": "exit status 0"}));
        let three = ExecResult { exit_code: Some(3), ..Default::default() };
        assert_eq!(end_event(&three)["error"], "exit status 3");
        let killed = ExecResult { signal: Some(9), ..Default::default() };
        assert_eq!(end_event(&killed), json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"}));
    }
}

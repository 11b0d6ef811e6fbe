//! The processes one sandbox runs for E2B clients, and the fan-out of their output.
//!
//! `Process/Start` spawns through [`Provider::spawn_live`] and hands the live output to a hub
//! task owned by the server, not by the HTTP request: the process keeps running (and keeps its
//! `Connect-Timeout-Ms` lifetime) when the client goes away, as with envd. Each stream
//! (`Start`, and every later `Connect`) is a subscriber that receives only output produced after
//! it subscribed. When the output ends the hub asks the provider for the exit status, sends the
//! `end` event (or a `deadline_exceeded` stream error if the hub killed the process at its
//! deadline) and keeps it, so a `Connect` to a process that just ended still gets its end.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::RpcError;
use crate::provider::{ExecResult, LiveProcess, OutputChunk, Provider};

/// What a stream subscriber receives.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    Data(OutputChunk),
    /// The `end` event body (`{"exitCode":…,"status":…}`).
    End(Value),
    /// The stream ends with this error instead of an `end` event.
    Error(RpcError),
}

/// One process started through `Process/Start`.
#[derive(Debug)]
pub(crate) struct Entry {
    pub pid: u32,
    pub tag: Option<String>,
    /// The `ProcessConfig` it was started with, for `Process/List`.
    pub config: Value,
    state: Mutex<EntryState>,
}

#[derive(Debug, Default)]
struct EntryState {
    subscribers: Vec<mpsc::UnboundedSender<Event>>,
    /// The final event, once the process ended.
    end: Option<Event>,
}

impl Entry {
    pub(crate) fn running(&self) -> bool {
        self.state.lock().expect("entry").end.is_none()
    }

    /// A new subscriber; if the process has ended the receiver already holds the final event.
    pub(crate) fn subscribe(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut st = self.state.lock().expect("entry");
        match &st.end {
            Some(end) => {
                let _ = tx.send(end.clone());
            }
            None => st.subscribers.push(tx),
        }
        rx
    }

    fn broadcast(&self, ev: Event) {
        self.state.lock().expect("entry").subscribers.retain(|s| s.send(ev.clone()).is_ok());
    }

    fn finish(&self, ev: Event) {
        let mut st = self.state.lock().expect("entry");
        for s in st.subscribers.drain(..) {
            let _ = s.send(ev.clone());
        }
        st.end = Some(ev);
    }
}

/// The processes of one sandbox, by pid.
#[derive(Debug, Default)]
pub(crate) struct Table {
    procs: Mutex<BTreeMap<u32, Arc<Entry>>>,
}

impl Table {
    /// Registers a process just spawned (`live`) and starts its hub. Returns the entry and the
    /// first subscriber (the `Start` stream), registered before any output is forwarded.
    pub(crate) fn start(
        &self,
        provider: Arc<dyn Provider>,
        sandbox: String,
        live: LiveProcess,
        config: Value,
        tag: Option<String>,
        deadline: Option<Duration>,
    ) -> (Arc<Entry>, mpsc::UnboundedReceiver<Event>) {
        let entry = Arc::new(Entry { pid: live.pid, tag, config, state: Mutex::new(EntryState::default()) });
        let rx = entry.subscribe();
        self.procs.lock().expect("procs").insert(live.pid, entry.clone());
        tokio::spawn(hub(provider, sandbox, live, entry.clone(), deadline));
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
                let _ = provider.signal(&sandbox, live.pid, libc::SIGKILL).await;
            }
        }
    }
    let result = provider.wait(&sandbox, live.pid, Duration::from_secs(10)).await;
    let ev = if timed_out {
        Event::Error(RpcError::new("deadline_exceeded", "context deadline exceeded"))
    } else {
        match result {
            Ok(r) => Event::End(end_event(&r)),
            // The sandbox went away under the process.
            Err(_) => Event::End(json!({"exitCode": -1, "status": "signal: killed", "error": "signal: killed"})),
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

/// Go's `syscall.Signal.String()` for the usual signals.
fn signal_name(sig: i32) -> String {
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

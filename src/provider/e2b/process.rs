//! Commands in a sandbox over `process.Process/Start` (protocol doc §4.3, §6): the request
//! the SDK sends, the task that reads a process's event stream to the end, and the table of
//! processes this provider started.
//!
//! Every process, foreground or background, gets a [`Proc`] whose stream is read by its own
//! task: `start{pid}` first, then base64 `data` events (collected, and forwarded live when
//! asked), then `end`, then the end-of-stream trailer. Foreground `exec` just waits for that
//! task, which makes it cancel-safe: if the caller drops the future, a guard sends SIGKILL
//! and the task still finishes. A stream that ends without an `end` event is an error, as in
//! the SDK; a trailer `deadline_exceeded` (envd enforcing `Connect-Timeout-Ms`) means the
//! command timed out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value as JsonValue};
use tokio::sync::watch;

use super::envd::{RpcError, RpcStream};
use super::model::{EndEvent, EventEnvelope};
use crate::provider::output::Captured;
use crate::provider::{ExecRequest, ExecResult, OutputChunk, OutputTx, ProcessInfo, ProviderError};

/// How long to wait for the `end` event after killing a command that ran out of time.
pub const KILL_WAIT: Duration = Duration::from_secs(5);
/// How long to wait for the trailer after the `end` event before dropping the stream.
const TRAILER_WAIT: Duration = Duration::from_secs(2);

/// The `Process/Start` request for `req`: always `/bin/bash -l -c <cmd>`, like the SDK.
pub fn start_body(req: &ExecRequest) -> JsonValue {
    let mut process = json!({ "cmd": "/bin/bash", "args": ["-l", "-c", req.cmd] });
    if !req.envs.is_empty() {
        process["envs"] = json!(req.envs);
    }
    if let Some(cwd) = req.cwd.as_deref().filter(|c| !c.is_empty()) {
        process["cwd"] = json!(cwd);
    }
    json!({ "process": process, "stdin": req.stdin.is_some() })
}

/// `SIGNAL_*` name envd accepts for `sig`, if it accepts it (only KILL and TERM).
pub fn signal_name(sig: i32) -> Option<&'static str> {
    match sig {
        libc::SIGKILL => Some("SIGNAL_SIGKILL"),
        libc::SIGTERM => Some("SIGNAL_SIGTERM"),
        _ => None,
    }
}

/// Reads the first event, which must be `start`, and returns the pid.
pub async fn read_start(stream: &mut RpcStream, what: &str) -> Result<u32, RpcError> {
    loop {
        let Some(msg) = stream.next().await? else {
            return Err(RpcError::Other(ProviderError::infra(format!("{what}: stream ended before the start event"))));
        };
        let ev: EventEnvelope = parse_event(&msg, what)?;
        let Some(ev) = ev.event else { continue };
        if let Some(s) = ev.start {
            return Ok(s.pid);
        }
        if ev.data.is_some() || ev.end.is_some() {
            return Err(RpcError::Other(ProviderError::infra(format!(
                "{what}: expected the start event first, got another event"
            ))));
        }
        // A keepalive before start: keep reading.
    }
}

fn parse_event(msg: &[u8], what: &str) -> Result<EventEnvelope, RpcError> {
    serde_json::from_slice(msg).map_err(|e| {
        RpcError::Other(ProviderError::infra(format!(
            "{what}: malformed process event ({e}): {}",
            super::connect::snippet(msg)
        )))
    })
}

#[derive(Default)]
struct ProcState {
    out: Captured,
    end: Option<EndEvent>,
    error: Option<ProviderError>,
    timed_out: bool,
    finished: bool,
}

/// One process started (or attached to) by this provider.
pub struct Proc {
    pub pid: u32,
    pub cmd: String,
    state: Mutex<ProcState>,
    done: watch::Sender<bool>,
}

impl Proc {
    /// Keeps up to `max_output` bytes of each stream (see [`Captured::new`]).
    pub fn new(pid: u32, cmd: String, max_output: Option<usize>) -> Arc<Self> {
        let state = Mutex::new(ProcState { out: Captured::new(max_output), ..ProcState::default() });
        Arc::new(Self { pid, cmd, state, done: watch::channel(false).0 })
    }

    pub fn finished(&self) -> bool {
        *self.done.borrow()
    }

    /// Marks that our timeout (not the command) ended it.
    pub fn set_timed_out(&self) {
        self.state.lock().expect("proc state").timed_out = true;
    }

    /// Waits up to `t` for the end; true if it ended.
    pub async fn wait_done(&self, t: Duration) -> bool {
        let mut rx = self.done.subscribe();
        let ended = matches!(tokio::time::timeout(t, rx.wait_for(|d| *d)).await, Ok(Ok(_)));
        ended
    }

    pub async fn wait_forever(&self) -> bool {
        let mut rx = self.done.subscribe();
        let ended = rx.wait_for(|d| *d).await.is_ok();
        ended
    }

    fn finish(&self) {
        self.state.lock().expect("proc state").finished = true;
        self.done.send_replace(true);
    }

    /// The result so far. `Err` if the stream failed without an outcome (and not by our
    /// timeout).
    pub fn result(&self, still_running: bool) -> Result<ExecResult, ProviderError> {
        let st = self.state.lock().expect("proc state");
        if let (Some(e), None, false) = (&st.error, &st.end, st.timed_out) {
            return Err(e.clone());
        }
        let (exit_code, signal) = match &st.end {
            Some(end) => end.outcome(),
            None if st.timed_out && !still_running => (None, Some(libc::SIGKILL)),
            None => (None, None),
        };
        Ok(ExecResult { exit_code, signal, timed_out: st.timed_out || still_running, pid: self.pid, ..st.out.result() })
    }

    pub fn info(&self) -> ProcessInfo {
        let st = self.state.lock().expect("proc state");
        let exit_code = st.end.as_ref().and_then(|e| e.outcome().0);
        ProcessInfo { pid: self.pid, cmd: self.cmd.clone(), running: !st.finished, exit_code }
    }
}

/// Reads `stream` to the end into `proc` (run it in its own task).
pub async fn drive(mut stream: RpcStream, proc: Arc<Proc>, output: Option<OutputTx>, what: String, id: String) {
    let b64 = base64::engine::general_purpose::STANDARD;
    loop {
        let msg = match stream.next().await {
            Ok(Some(m)) => m,
            Ok(None) => {
                proc.state.lock().expect("proc state").error =
                    Some(ProviderError::infra(format!("{what}: command ended without an end event")));
                break;
            }
            Err(RpcError::Connect(e)) if e.code == "deadline_exceeded" => {
                proc.set_timed_out();
                break;
            }
            Err(e) => {
                proc.state.lock().expect("proc state").error = Some(e.into_provider(&what, &id));
                break;
            }
        };
        let ev = match parse_event(&msg, &what) {
            Ok(EventEnvelope { event: Some(ev) }) => ev,
            Ok(_) => continue,
            Err(e) => {
                proc.state.lock().expect("proc state").error = Some(e.into_provider(&what, &id));
                break;
            }
        };
        if let Some(data) = ev.data {
            for (chunk, is_err) in [(data.stdout, false), (data.stderr, true), (data.pty, false)] {
                let Some(text) = chunk else { continue };
                let bytes = match b64.decode(text.trim()) {
                    Ok(b) => b,
                    Err(e) => {
                        proc.state.lock().expect("proc state").error =
                            Some(ProviderError::infra(format!("{what}: output is not base64: {e}")));
                        proc.finish();
                        return;
                    }
                };
                if bytes.is_empty() {
                    continue;
                }
                {
                    let mut st = proc.state.lock().expect("proc state");
                    if is_err {
                        st.out.stderr(&bytes);
                    } else {
                        st.out.stdout(&bytes);
                    }
                }
                if let Some(tx) = &output {
                    let _ = tx.send(if is_err { OutputChunk::Stderr(bytes) } else { OutputChunk::Stdout(bytes) }).await;
                }
            }
        }
        if let Some(end) = ev.end {
            proc.state.lock().expect("proc state").end = Some(end);
            proc.finish();
            // Read the trailer so the connection can be reused; its content no longer matters.
            let _ = tokio::time::timeout(TRAILER_WAIT, async { while let Ok(Some(_)) = stream.next().await {} }).await;
            return;
        }
    }
    proc.finish();
}

/// The processes this provider knows, by sandbox and pid.
#[derive(Default)]
pub struct ProcTable {
    procs: Mutex<HashMap<(String, u32), Arc<Proc>>>,
}

impl ProcTable {
    pub fn insert(&self, id: &str, p: Arc<Proc>) {
        self.procs.lock().expect("procs").insert((id.to_string(), p.pid), p);
    }

    pub fn get(&self, id: &str, pid: u32) -> Option<Arc<Proc>> {
        self.procs.lock().expect("procs").get(&(id.to_string(), pid)).cloned()
    }

    /// Removes `p` if it is still the entry for its pid.
    pub fn remove(&self, id: &str, p: &Arc<Proc>) {
        let mut procs = self.procs.lock().expect("procs");
        let key = (id.to_string(), p.pid);
        if procs.get(&key).is_some_and(|q| Arc::ptr_eq(q, p)) {
            procs.remove(&key);
        }
    }

    pub fn of(&self, id: &str) -> Vec<Arc<Proc>> {
        self.procs.lock().expect("procs").iter().filter(|((s, _), _)| s == id).map(|(_, p)| p.clone()).collect()
    }

    pub fn forget_sandbox(&self, id: &str) {
        self.procs.lock().expect("procs").retain(|(s, _), _| s != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn start_request_matches_the_sdk() {
        let req = ExecRequest { cmd: "echo hi".into(), ..Default::default() };
        assert_eq!(start_body(&req), json!({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}));
        let req = ExecRequest {
            cmd: "pwd".into(),
            cwd: Some("/tmp".into()),
            envs: BTreeMap::from([("FOO".into(), "bar".into())]),
            stdin: Some(b"x".to_vec()),
            ..Default::default()
        };
        assert_eq!(
            start_body(&req),
            json!({"process":{"cmd":"/bin/bash","args":["-l","-c","pwd"],"envs":{"FOO":"bar"},"cwd":"/tmp"},"stdin":true})
        );
    }

    #[test]
    fn signals() {
        assert_eq!(signal_name(9), Some("SIGNAL_SIGKILL"));
        assert_eq!(signal_name(15), Some("SIGNAL_SIGTERM"));
        assert_eq!(signal_name(2), None);
    }

    #[test]
    fn results() {
        let p = Proc::new(5, "x".into(), None);
        assert!(p.result(true).unwrap().timed_out);
        p.state.lock().unwrap().out.stdout(b"out");
        p.state.lock().unwrap().end =
            Some(EndEvent { exit_code: 3, exited: true, status: "exit status 3".into(), error: None });
        p.finish();
        let r = p.result(false).unwrap();
        assert_eq!((r.exit_code, r.signal, r.timed_out, r.pid), (Some(3), None, false, 5));
        assert_eq!(r.stdout, b"out");
        assert_eq!(p.info(), ProcessInfo { pid: 5, cmd: "x".into(), running: false, exit_code: Some(3) });

        let p = Proc::new(6, "y".into(), None);
        p.set_timed_out();
        p.finish();
        let r = p.result(false).unwrap();
        assert_eq!((r.exit_code, r.signal, r.timed_out), (None, Some(9), true));

        let p = Proc::new(7, "z".into(), None);
        p.state.lock().unwrap().error = Some(ProviderError::infra("command ended without an end event"));
        p.finish();
        assert!(p.result(false).unwrap_err().message.contains("without an end event"));
    }
}

//! The `pty` step: a command in a pseudo-terminal, driven like a person at a keyboard.
//!
//! It starts `cmd` (default an interactive login shell) in a terminal of `cols` × `rows`,
//! then runs its interactions in order: the top-level `input`/`expect` first, then each
//! `script` item `{ send, resize, expect }` (text typed, the terminal resized, then a wait of
//! up to `within` until the terminal's output since the item began matches `expect`). With
//! `exit_code` it then waits for the command to end by itself and checks the code; without,
//! the command is killed. It is killed on every other path too (a failure, the step's
//! timeout, an interrupted run).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value as JsonValue};
use tokio::sync::mpsc;

use super::args::Args;
use super::{StepCtx, StepError, StepResult};
use crate::matcher::Matcher;
use crate::provider::{ExecRequest, OutputChunk, Provider};

/// The command a `pty` step runs without `cmd`: what the E2B SDK's `pty.create` starts.
const SHELL: &str = "exec /bin/bash -i -l";

/// SIGKILLs the terminal's process unless it ended or was disarmed.
struct KillOnDrop {
    provider: Arc<dyn Provider>,
    sandbox: String,
    pid: Option<u32>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let Some(pid) = self.pid.take() else { return };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (p, id) = (self.provider.clone(), self.sandbox.clone());
            rt.spawn(async move {
                let _ = p.sandbox(&id).signal(pid, libc::SIGKILL).await;
            });
        }
    }
}

/// One interaction.
struct Item {
    send: Option<String>,
    resize: Option<(u16, u16)>,
    expect: Option<Matcher>,
}

/// A terminal dimension: 1 to 65535.
fn size(n: i64, what: &str) -> Result<u16, StepError> {
    u16::try_from(n)
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| StepError::bad_args(format!("`{what}` must be an integer from 1 to 65535, got {n}")))
}

/// A dimension inside a `script` item (free-form, so read here).
fn size_json(v: &JsonValue, what: &str) -> Result<u16, StepError> {
    let n = match v {
        JsonValue::Number(n) => n.as_i64(),
        other => super::text(other).trim().parse().ok(),
    };
    n.map_or_else(
        || Err(StepError::bad_args(format!("`{what}` must be an integer from 1 to 65535, got {v}"))),
        |n| size(n, what),
    )
}

fn resize_of(v: &JsonValue) -> Result<(u16, u16), StepError> {
    let bad = || StepError::bad_args(format!("`resize` is {{ cols: <n>, rows: <n> }}, got {v}"));
    let o = v.as_object().ok_or_else(bad)?;
    if o.keys().any(|k| k != "cols" && k != "rows") {
        return Err(bad());
    }
    Ok((size_json(o.get("cols").ok_or_else(bad)?, "cols")?, size_json(o.get("rows").ok_or_else(bad)?, "rows")?))
}

fn items(a: &Args) -> Result<Vec<Item>, StepError> {
    let matcher = |v: &JsonValue| Matcher::from_json(v).map_err(|e| StepError::bad_args(format!("`expect`: {e}")));
    let mut out = Vec::new();
    let (input, expect) = (a.opt_str("input").map(str::to_string), a.field_matcher("expect"));
    if input.is_some() || expect.is_some() {
        out.push(Item { send: input, resize: None, expect: expect.cloned() });
    }
    match a.json("script") {
        None => {}
        Some(JsonValue::Array(list)) => {
            for v in list {
                let bad = || StepError::bad_args(format!("each `script` item is {{ send, resize, expect }}, got {v}"));
                let o = v.as_object().ok_or_else(bad)?;
                if o.is_empty() || o.keys().any(|k| !matches!(k.as_str(), "send" | "resize" | "expect")) {
                    return Err(bad());
                }
                out.push(Item {
                    send: o.get("send").map(super::text),
                    resize: o.get("resize").map(resize_of).transpose()?,
                    expect: o.get("expect").map(matcher).transpose()?,
                });
            }
        }
        Some(v) => return Err(StepError::bad_args(format!("`script` must be a list, got {v}"))),
    }
    Ok(out)
}

/// How reading the terminal stopped.
#[derive(PartialEq)]
enum Read {
    Matched,
    /// The command ended and its output with it.
    Closed,
    TimedOut,
    /// The output reached the cap (--max-output) without matching.
    Full,
}

/// Reads the terminal into `all` until `done(all)` holds, the output ends, or `deadline`.
async fn read_until(
    rx: &mut mpsc::Receiver<OutputChunk>,
    all: &mut Vec<u8>,
    cap: usize,
    deadline: Instant,
    done: impl Fn(&[u8]) -> bool,
) -> Read {
    loop {
        if done(all) {
            return Read::Matched;
        }
        if all.len() >= cap {
            return Read::Full;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(OutputChunk::Stdout(b) | OutputChunk::Stderr(b))) => {
                all.extend_from_slice(&b);
                // What else has arrived, before matching again: a fast writer is then matched
                // once per batch, not once per chunk.
                while all.len() < cap {
                    match rx.try_recv() {
                        Ok(OutputChunk::Stdout(b) | OutputChunk::Stderr(b)) => all.extend_from_slice(&b),
                        Err(_) => break,
                    }
                }
            }
            Ok(None) if done(all) => return Read::Matched,
            Ok(None) => return Read::Closed,
            Err(_) => return if done(all) { Read::Matched } else { Read::TimedOut },
        }
    }
}

pub async fn pty(ctx: &mut StepCtx, a: &Args) -> StepResult {
    // 1 to 65535, by their fields.
    let cols = a.int("cols").map_or(80, |n| u16::try_from(n).unwrap_or(80));
    let rows = a.int("rows").map_or(24, |n| u16::try_from(n).unwrap_or(24));
    let within = a.duration("within").unwrap_or(Duration::from_secs(10));
    let want_exit = a.int("exit_code");
    let items = items(a)?;
    let req = ExecRequest {
        cmd: a.opt_str("cmd").unwrap_or(SHELL).to_string(),
        cwd: a.opt_str("cwd").map(str::to_string),
        envs: a.str_map("env"),
        max_output: Some(ctx.max_output),
        ..Default::default()
    };
    // What the step keeps of the terminal's output: a runaway writer must not take memory.
    let cap = ctx.max_output;
    let id = ctx.sandbox_id()?;
    let started = Instant::now();
    let live = ctx.provider.sandbox(&id).spawn_pty(req, cols, rows).await?;
    let pid = live.pid;
    let mut guard = KillOnDrop { provider: ctx.provider.clone(), sandbox: id.clone(), pid: Some(pid) };
    let mut rx = live.output;
    let mut all: Vec<u8> = Vec::new();
    let outputs = |all: &[u8], exit: Option<i32>| {
        json!({
            "output": super::lossy(all), "pid": pid, "exit_code": exit, "cols": cols, "rows": rows,
            "duration_ms": started.elapsed().as_millis() as u64,
        })
    };
    for (n, item) in items.iter().enumerate() {
        let from = all.len();
        if let Some((c, r)) = item.resize {
            ctx.provider.sandbox(&id).resize_pty(pid, c, r).await?;
        }
        if let Some(text) = &item.send {
            ctx.provider.sandbox(&id).write_pty(pid, text.clone().into_bytes()).await?;
        }
        let Some(m) = &item.expect else { continue };
        let matched = |all: &[u8]| m.check_text(&String::from_utf8_lossy(&all[from..])).is_ok();
        let read = read_until(&mut rx, &mut all, cap, Instant::now() + within, matched).await;
        if read != Read::Matched {
            let seen = String::from_utf8_lossy(&all[from..]).into_owned();
            let mut e = match m.check_text(&seen) {
                Err(f) => StepError::from(f),
                Ok(()) => StepError::fail("the terminal's output ended"),
            };
            if read == Read::Full {
                e.message = format!(
                    "the terminal wrote {} without matching (raise --max-output): {}",
                    crate::size::human(all.len() as u64),
                    e.message
                );
            }
            e.message = format!(
                "terminal output (interaction {} of {}, within {}): {}",
                n + 1,
                items.len(),
                crate::duration::human(within),
                e.message
            );
            return Err(e.with_outputs(outputs(&all, None)));
        }
    }
    let exit = match want_exit {
        None => {
            // Killed; its output up to then is the step's.
            ctx.provider.sandbox(&id).signal(pid, libc::SIGKILL).await.ok();
            guard.pid = None;
            None
        }
        Some(want) => {
            // The command ends by itself (its output stream closes), then its code is read.
            let ended = read_until(&mut rx, &mut all, cap, Instant::now() + within, |_| false).await == Read::Closed;
            let r = ctx.provider.sandbox(&id).wait(pid, Duration::from_secs(5)).await;
            let code = r.as_ref().ok().filter(|r| !r.timed_out).and_then(|r| r.exit_code);
            if code.is_some() {
                guard.pid = None;
            }
            if code.map(i64::from) != Some(want) {
                let got = match (&r, code) {
                    (_, Some(c)) => format!("exit code {c}"),
                    (Ok(r), None) if r.signal.is_some() => format!("signal {}", r.signal.unwrap_or(0)),
                    _ if !ended => format!("still running after {}", crate::duration::human(within)),
                    _ => "no exit code".to_string(),
                };
                return Err(StepError::fail(format!("expected exit code {want}, found {got}"))
                    .with_outputs(outputs(&all, code)));
            }
            code
        }
    };
    Ok(outputs(&all, exit))
}

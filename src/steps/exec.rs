//! Command steps: exec (foreground and background), process-list, signal, wait.

use std::time::{Duration, Instant};

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{exec_outputs, StepCtx, StepError, StepResult};
use crate::provider::ExecRequest;

/// The limit of a foreground command (`exec`, `host`) and the setting it comes from, for its
/// timeout message: the command's own `timeout`, else `--exec-timeout`; the step's bound (its
/// `timeout:`, `--step-timeout`, an `eventually` window) when that is shorter.
pub(crate) fn command_limit(ctx: &StepCtx, a: &Args, kind: &str) -> (Duration, String) {
    let (limit, setting) = match a.duration("timeout") {
        Some(d) => (d, format!("{kind}'s `timeout`")),
        None => (ctx.exec_timeout, format!("--exec-timeout; give {kind} a `timeout` for longer")),
    };
    match ctx.step_limit {
        Some(b) if b.limit < limit => (b.limit, b.setting.to_string()),
        _ => (limit, setting),
    }
}

/// `command timed out after 2.00s (exec's `timeout`)`.
pub(crate) fn command_timed_out(limit: Duration, setting: &str) -> String {
    format!("command timed out after {} ({setting})", crate::duration::human(limit))
}

pub async fn exec(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let (limit, setting) = command_limit(ctx, a, "exec");
    let req = ExecRequest {
        cmd: a.str("cmd").to_string(),
        cwd: a.opt_str("cwd").map(str::to_string),
        envs: a.str_map("env"),
        user: a.opt_str("user").map(str::to_string),
        stdin: a.opt_str("stdin").map(|s| s.as_bytes().to_vec()),
        timeout: Some(limit),
        max_output: Some(ctx.max_output),
    };
    let id = ctx.sandbox_id()?;
    if a.flag("open_stdin") && !a.flag("background") {
        return Err(StepError::bad_args(
            "`open_stdin` needs `background: true` (a foreground command's stdin is `stdin`)",
        ));
    }
    if a.flag("background") {
        let sb = ctx.provider.sandbox(&id);
        let req = ExecRequest { timeout: None, ..req };
        let pid = if a.flag("open_stdin") { sb.spawn_with_stdin(req).await? } else { sb.spawn(req).await? };
        return Ok(
            json!({ "pid": pid, "stdout": "", "stderr": "", "exit_code": null, "signal": null, "timed_out": false, "duration_ms": 0 }),
        );
    }
    let started = Instant::now();
    let result = ctx.provider.sandbox(&id).exec(req, None).await?;
    let outputs = exec_outputs(&result, started.elapsed());
    if result.timed_out {
        return Err(StepError::timeout(command_timed_out(limit, &setting)).with_outputs(outputs));
    }
    check_exit_code(a, &result, outputs)
}

/// `exit_code:` on exec and host: the outputs if the command exited with it (or none was
/// asked for), else a failure naming what it did and the end of its stderr.
pub(crate) fn check_exit_code(a: &Args, result: &crate::provider::ExecResult, outputs: JsonValue) -> StepResult {
    if let Some(want) = a.int("exit_code") {
        if result.exit_code.map(i64::from) != Some(want) {
            let got =
                result.exit_code.map_or_else(|| format!("signal {}", result.signal.unwrap_or(0)), |c| c.to_string());
            let stderr = super::lossy(&result.stderr);
            let tail: String =
                stderr.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
            let mut msg = format!("expected exit code {want}, found {got}");
            if !tail.is_empty() {
                msg.push_str(&format!("; stderr: {tail}"));
            }
            return Err(StepError::fail(msg).with_outputs(outputs));
        }
    }
    Ok(outputs)
}

/// `send-stdin`: writes `data` to a background process's open stdin by pid, then (`close`)
/// closes it.
pub async fn send_stdin(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let pid = a.int("pid").and_then(|n| u32::try_from(n).ok()).unwrap_or_default();
    let data = a.opt_str("data").unwrap_or("").as_bytes().to_vec();
    if data.is_empty() && !a.flag("close") {
        return Err(StepError::bad_args("`send-stdin` needs `data`, `close: true`, or both"));
    }
    let id = ctx.sandbox_id()?;
    let sb = ctx.provider.sandbox(&id);
    let bytes = data.len();
    if !data.is_empty() {
        sb.write_stdin(pid, data).await?;
    }
    if a.flag("close") {
        sb.close_stdin(pid).await?;
    }
    Ok(json!({ "pid": pid, "bytes": bytes }))
}

pub async fn process_list(ctx: &mut StepCtx, _args: &Args) -> StepResult {
    let id = ctx.sandbox_id()?;
    let procs = ctx.provider.sandbox(&id).process_list().await?;
    let running: Vec<u32> = procs.iter().filter(|p| p.running).map(|p| p.pid).collect();
    Ok(json!({ "pids": running, "count": running.len(), "processes": procs }))
}

pub async fn signal(ctx: &mut StepCtx, a: &Args) -> StepResult {
    // Both range-checked by the registry's fields (a pid is positive, a signal 1 to 64).
    let pid = a.int("pid").and_then(|n| u32::try_from(n).ok()).unwrap_or_default();
    let sig = a.int("signal").and_then(|n| i32::try_from(n).ok()).unwrap_or(libc::SIGTERM);
    let id = ctx.sandbox_id()?;
    ctx.provider.sandbox(&id).signal(pid, sig).await?;
    Ok(json!({ "pid": pid, "signal": sig }))
}

pub async fn wait(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let pid = a.int("pid").and_then(|n| u32::try_from(n).ok()).unwrap_or_default();
    let limit = a.duration("timeout").unwrap_or(Duration::from_secs(30));
    let id = ctx.sandbox_id()?;
    let started = Instant::now();
    let result = ctx.provider.sandbox(&id).wait(pid, limit).await?;
    let outputs = exec_outputs(&result, started.elapsed());
    if result.timed_out {
        return Err(StepError::timeout(format!("process {pid} still running after {}", crate::duration::human(limit)))
            .with_outputs(outputs));
    }
    Ok(outputs)
}

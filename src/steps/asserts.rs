//! Assertion steps: assert-stdout, assert-stderr, assert-exit, assert-file, assert.

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{StepCtx, StepError, StepResult};
use crate::model::local_file::{self, EQUALS_FILE_AND_ABSENT};
use crate::provider::ErrorKind;

/// The exec outputs an assertion checks: `of: <id>`, else the most recent command. A step
/// without `output` (a `set`, an `http-get`) is refused: checking it would check an empty text.
fn subject<'a>(ctx: &'a StepCtx, a: &Args, output: &str) -> Result<&'a JsonValue, StepError> {
    match a.opt_str("of") {
        Some(id) => {
            let out = ctx.outputs.get(id).ok_or_else(|| StepError::bad_args(format!("step `{id}` has not run")))?;
            if out.get(output).is_none() {
                return Err(StepError::bad_args(format!(
                    "step `{id}` has no {output} to check: `of` names a step that ran a command"
                )));
            }
            Ok(out)
        }
        None => ctx
            .last_exec
            .as_ref()
            .ok_or_else(|| StepError::bad_args("no command has run yet: add an `exec` step before this assertion")),
    }
}

async fn assert_stream(ctx: &mut StepCtx, a: &Args, stream: &str) -> StepResult {
    let out = subject(ctx, a, stream)?;
    let text = out.get(stream).and_then(JsonValue::as_str).unwrap_or_default().to_string();
    let dropped = out.get(format!("{stream}_dropped")).and_then(JsonValue::as_u64).unwrap_or(0);
    let m = a.matcher().ok_or_else(|| StepError::bad_args("no matcher given"))?;
    // Under the failure: the other stream (this one is in expected/found already).
    let other = if stream == "stdout" { "stderr" } else { "stdout" };
    let shown = out.get(other).map(|t| json!({ other: t }));
    m.check_text(&text).map_err(|e| {
        let mut e = StepError::from(e);
        e.message = format!("{stream}: {}", e.message);
        if dropped > 0 {
            e.message.push_str(&super::cut_note(stream, text.len(), dropped));
        }
        e.shown = shown.map(Box::new);
        e
    })?;
    Ok(JsonValue::Null)
}

pub async fn assert_stdout(ctx: &mut StepCtx, a: &Args) -> StepResult {
    assert_stream(ctx, a, "stdout").await
}

pub async fn assert_stderr(ctx: &mut StepCtx, a: &Args) -> StepResult {
    assert_stream(ctx, a, "stderr").await
}

pub async fn assert_exit(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let want = a.int("code").unwrap_or_default();
    let out = subject(ctx, a, "exit_code")?;
    let got = out.get("exit_code").and_then(JsonValue::as_i64);
    if got != Some(want) {
        let got_text = match (got, out.get("signal").and_then(JsonValue::as_i64)) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("none (killed by signal {s})"),
            (None, None) => "none (still running or unknown)".into(),
        };
        let mut e = StepError::fail(format!("expected exit code {want}, found {got_text}"))
            .showing(json!({ "stdout": out.get("stdout"), "stderr": out.get("stderr") }));
        e.mismatch = Some(Box::new(crate::results::Mismatch::new(want.to_string(), got_text)));
        return Err(e);
    }
    Ok(JsonValue::Null)
}

pub async fn assert_file(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let path = a.str("path");
    let id = ctx.sandbox_id()?;
    let must_exist = a.opt_bool("exists").unwrap_or(true);
    if !must_exist && a.has("equals_file") {
        return Err(StepError::bad_args(EQUALS_FILE_AND_ABSENT));
    }
    let read = ctx.provider.sandbox(&id).read_file(path).await;
    match (read, must_exist) {
        (Err(e), false) if e.kind == ErrorKind::NotFound => Ok(json!({ "content": null, "size": null })),
        (Ok(data), false) => {
            Err(StepError::fail(format!("expected {path} not to exist, found a file of {} bytes", data.len())))
        }
        (Err(e), true) if e.kind == ErrorKind::NotFound => {
            Err(StepError::fail(format!("expected {path} to exist, found none ({})", e.message)))
        }
        (Err(e), _) => Err(e.into()),
        (Ok(data), true) => {
            let text = String::from_utf8_lossy(&data).into_owned();
            let sha256 = {
                use sha2::Digest as _;
                hex::encode(sha2::Sha256::digest(&data))
            };
            let outputs = json!({ "content": text, "size": data.len(), "sha256": sha256 });
            if let Some(want) = a.int("size").filter(|want| *want != data.len() as i64) {
                let mut e = StepError::fail(format!("{path}: expected a size of {want} bytes, found {}", data.len()))
                    .with_outputs(outputs.clone());
                e.mismatch = Some(Box::new(crate::results::Mismatch::new(want.to_string(), data.len().to_string())));
                return Err(e);
            }
            if let Some(want) = a.opt_str("sha256").filter(|want| !want.eq_ignore_ascii_case(&sha256)) {
                let mut e = StepError::fail(format!("{path}: expected sha256 {want}, found {sha256}"))
                    .with_outputs(outputs.clone());
                e.mismatch = Some(Box::new(crate::results::Mismatch::new(want.to_string(), sha256.clone())));
                return Err(e);
            }
            if let Some(local) = a.opt_str("equals_file") {
                let real = local_file::resolve(&ctx.scenario_dir, local, "equals_file")
                    .map_err(|r| StepError::bad_args(format!("{} ({})", r.message, r.help)))?;
                let expected = tokio::fs::read(&real)
                    .await
                    .map_err(|e| StepError::bad_args(format!("cannot read the local file {}: {e}", real.display())))?;
                if let Some((message, mismatch)) = local_file::compare(&expected, &data, local, path) {
                    let mut e = StepError::fail(message).with_outputs(outputs.clone());
                    e.mismatch = mismatch.map(Box::new);
                    return Err(e);
                }
            }
            if let Some(m) = a.matcher() {
                m.check_text(&text).map_err(|f| {
                    let mut e = StepError::from(f).with_outputs(outputs.clone());
                    e.message = format!("{path}: {}", e.message);
                    e
                })?;
            }
            Ok(outputs)
        }
    }
}

pub async fn assert(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let value = a.json("that").unwrap_or(&JsonValue::Null);
    let holds = match value {
        JsonValue::Bool(b) => *b,
        JsonValue::String(expr) => crate::expr::eval_bool(expr, &ctx.expr_ctx)
            .map_err(|e| StepError::bad_args(format!("cannot evaluate `{expr}`: {}", e.message)))?,
        JsonValue::Null => false,
        JsonValue::Number(n) => n.as_f64() != Some(0.0),
        JsonValue::Array(v) => !v.is_empty(),
        JsonValue::Object(m) => !m.is_empty(),
    };
    if holds {
        return Ok(JsonValue::Null);
    }
    // As written (before rendering), on one line; then the value of each operand, as
    // pytest's assertion rewriting shows them.
    let original = ctx.current_source.clone().unwrap_or_else(|| super::text(value));
    let expr = crate::expr::explain::one_line(&original);
    let mut message =
        a.opt_str("message").map_or_else(|| format!("assertion failed: {expr}"), |m| format!("{m} ({expr})"));
    // A template that rendered to the expression (`{{ vars.n }} > 5`) is explained as rendered.
    let explained = match value {
        JsonValue::String(rendered) if !crate::expr::explain::is_single(&original) => rendered.as_str(),
        _ => original.as_str(),
    };
    for line in crate::expr::explain::where_lines(explained, &ctx.expr_ctx) {
        message.push_str("\n  ");
        message.push_str(&line);
    }
    Err(StepError::fail(message))
}

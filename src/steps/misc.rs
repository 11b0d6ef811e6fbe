//! `set`, `sleep` and `skip`.

use serde_json::Value as JsonValue;

use super::{Args, StepCtx, StepError, StepResult};

pub async fn set(ctx: &mut StepCtx, args: &JsonValue) -> StepResult {
    let obj = args.as_object().ok_or_else(|| StepError::error("`set` takes a mapping of names to values"))?;
    for (k, v) in obj {
        ctx.vars.insert(k.clone(), v.clone());
    }
    Ok(args.clone())
}

pub async fn sleep(_ctx: &mut StepCtx, args: &JsonValue) -> StepResult {
    let d = Args(args).opt_duration("duration")?.ok_or_else(|| StepError::error("missing `duration`"))?;
    tokio::time::sleep(d).await;
    Ok(JsonValue::Null)
}

/// Ends the scenario as SKIPPED with the reason given (under an `if:` saying when): what a
/// scenario finds out only while running, e.g. that a client cannot reach this endpoint.
pub async fn skip(_ctx: &mut StepCtx, args: &JsonValue) -> StepResult {
    let reason = Args(args).str("reason")?;
    if reason.trim().is_empty() {
        return Err(StepError::error("`skip` needs a reason"));
    }
    Err(StepError::skip(reason))
}

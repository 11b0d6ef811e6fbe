//! `set`, `sleep` and `skip`.

use serde_json::Value as JsonValue;

use super::args::Args;
use super::{StepCtx, StepError, StepResult};

pub async fn set(ctx: &mut StepCtx, a: &Args) -> StepResult {
    for (k, v) in a.free() {
        ctx.vars.insert(k.clone(), v.clone());
    }
    Ok(JsonValue::Object(a.free().clone()))
}

pub async fn sleep(_ctx: &mut StepCtx, a: &Args) -> StepResult {
    let d = a.duration("duration").unwrap_or_default();
    tokio::time::sleep(d).await;
    Ok(JsonValue::Null)
}

/// Ends the scenario as SKIPPED with the reason given (under an `if:` saying when): what a
/// scenario finds out only while running, e.g. that a client cannot reach this endpoint.
pub async fn skip(_ctx: &mut StepCtx, a: &Args) -> StepResult {
    let reason = a.str("reason");
    if reason.trim().is_empty() {
        return Err(StepError::bad_args("`skip` needs a reason"));
    }
    Err(StepError::skip(reason))
}

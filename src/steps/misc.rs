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

/// `bench`: [`crate::bench`]'s measurement on the scenario's provider, its figures as outputs
/// for the assertions after it. The sandboxes carry the run tag, so any an interruption leaves
/// are swept with the run's.
pub async fn bench(ctx: &mut StepCtx, a: &Args) -> StepResult {
    use crate::bench::{iterations, report, Mode, Plan};
    let mode = match a.opt_str("mode").unwrap_or("sequential") {
        "staggered" => Mode::Staggered,
        "burst" => Mode::Burst,
        _ => Mode::Sequential,
    };
    let plan = Plan {
        template: a.opt_str("template").unwrap_or("base").to_string(),
        iterations: a.int("iterations").and_then(|n| usize::try_from(n).ok()).unwrap_or(10),
        mode,
        stagger: a.duration("stagger").unwrap_or(std::time::Duration::from_millis(200)),
    };
    let started = std::time::Instant::now();
    let samples = iterations(&ctx.provider, &plan, &ctx.run_tag).await;
    let r = report(&plan, ctx.provider.name(), &samples, started.elapsed());
    Ok(serde_json::json!({
        "tti": r["time_to_interactive_ms"], "round_trip": r["command_round_trip_ms"],
        "success_rate": r["success_rate"], "succeeded": r["succeeded"], "failed": r["failed"],
        "errors": r["errors"], "iterations": plan.iterations, "mode": r["mode"],
    }))
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

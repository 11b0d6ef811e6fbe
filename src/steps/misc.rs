//! `set` and `sleep`.

use serde_json::Value as J;

use super::{Args, StepCtx, StepError, StepResult};

pub async fn set(ctx: &mut StepCtx, args: &J) -> StepResult {
    let obj = args.as_object().ok_or_else(|| StepError::error("`set` takes a mapping of names to values"))?;
    for (k, v) in obj {
        ctx.vars.insert(k.clone(), v.clone());
    }
    Ok(args.clone())
}

pub async fn sleep(_ctx: &mut StepCtx, args: &J) -> StepResult {
    let d = Args(args).opt_duration("duration")?.ok_or_else(|| StepError::error("missing `duration`"))?;
    tokio::time::sleep(d).await;
    Ok(J::Null)
}

//! `scripted-model`: a scripted model endpoint for the agent CLIs in a sandbox (see
//! [`super::scripted_model`]), served by the run and made reachable inside the sandbox with
//! [`ExposeHost::expose_host`](crate::provider::ExposeHost::expose_host). It lives until the
//! scenario ends.

use std::sync::Arc;

use serde_json::json;

use super::args::Args;
use super::scripted_model::{Script, ScriptedModel};
use super::{StepCtx, StepError, StepResult};

/// The port inside the sandbox when the step names none.
pub const DEFAULT_PORT: u16 = 8787;

pub async fn scripted_model(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let script = Script {
        path: a.str("file").to_string(),
        content: a.str("content").to_string(),
        reply: a.opt_str("reply").unwrap_or("done").to_string(),
        model: a.opt_str("model").unwrap_or("scripted").to_string(),
    };
    if !script.path.starts_with('/') {
        return Err(StepError::bad_args(format!(
            "`file` must be an absolute path in the sandbox, got `{}`",
            script.path
        )));
    }
    let port = match a.int("port") {
        // 1 to 65535, by its field.
        Some(p) => u16::try_from(p).unwrap_or_default(),
        None => DEFAULT_PORT,
    };
    let id = ctx.sandbox_id()?;
    let model = script.model.clone();
    let server = ScriptedModel::start(script)
        .await
        .map_err(|e| StepError::error(format!("cannot start the scripted model: {e}")))?;
    let url = ctx.provider.sandbox(&id).expose_host(server.addr(), port).await?;
    let host_url = format!("http://{}", server.addr());
    ctx.services.push(Arc::new(server));
    Ok(json!({
        "url": url,
        "openai_base_url": format!("{url}/v1"),
        "anthropic_base_url": url,
        "host_url": host_url,
        "model": model,
    }))
}

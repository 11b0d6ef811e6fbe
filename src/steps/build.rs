//! Template steps: build and deploy a template folder on the provider.
//!
//! Both load the folder (`templates/<name>` found from the scenario file, or `path:`), parse
//! its `template.yaml` and Dockerfile (errors point at `file:line:col`) and hand the result to
//! the provider. The build log arrives line by line and becomes the `log` output, so it is in
//! the evidence and the JSON report; on failure it is kept beside the error. The provider
//! builds each folder digest once per run; `keep: true` (or `SCENARIO_RUN_KEEP_BUILDS=1`)
//! keeps the build after the run; otherwise the local provider caches it by content for later
//! runs (`provider::local::layer_cache`) and the others remove it when the run ends.

use serde_json::json;
use tokio::sync::mpsc;

use super::args::Args;
use super::{StepCtx, StepError, StepResult};
use crate::templates::{find_dir, BuildSpec, TemplateDir, TEMPLATES_DIR_ENV};

/// The environment variable that keeps every build after the run.
pub const KEEP_ENV: &str = "SCENARIO_RUN_KEEP_BUILDS";

fn spec(ctx: &StepCtx, a: &Args) -> Result<BuildSpec, StepError> {
    let name = a.str("template");
    let dir = match a.opt_str("path") {
        Some(p) => ctx.scenario_dir.join(p),
        None => find_dir(name, &ctx.scenario_dir, ctx.env.get(TEMPLATES_DIR_ENV).map(String::as_str)),
    };
    if !dir.is_dir() {
        let hint = match (a.opt_str("path"), ctx.env.get(TEMPLATES_DIR_ENV).filter(|v| !v.is_empty())) {
            (Some(_), _) => "`path:` is relative to the scenario file".to_string(),
            (None, Some(root)) => format!("{TEMPLATES_DIR_ENV} is {root}, and it has no folder `{name}`"),
            (None, None) => format!(
                "looked for `templates/{name}` in the folders above the scenario file; set {TEMPLATES_DIR_ENV} to the folder that holds your template folders, or give `path:`"
            ),
        };
        return Err(StepError::bad_args(format!("no template folder {} ({hint})", dir.display())));
    }
    let template = TemplateDir::load(&dir).map_err(|e| StepError::error(e.to_string()))?;
    if template.def.name != name {
        return Err(StepError::bad_args(format!(
            "{} names the template `{}`, not `{name}`",
            dir.join("template.yaml").display(),
            template.def.name
        )));
    }
    let keep_env = ctx.env.get(KEEP_ENV).is_some_and(|v| matches!(v.as_str(), "1" | "true" | "yes"));
    Ok(BuildSpec {
        template,
        build_args: a.str_map("args"),
        keep: a.flag("keep") || keep_env,
        skip_cache: a.flag("skip_cache"),
        from_auth: None,
    })
}

/// Collects the streamed log until the provider drops its sender, passing each line on to the
/// live view as it comes.
fn collector(progress: Option<super::Progress>) -> (mpsc::UnboundedSender<String>, tokio::task::JoinHandle<String>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let task = tokio::spawn(async move {
        let mut lines = Vec::new();
        while let Some(l) = rx.recv().await {
            if let Some(p) = &progress {
                p(&l);
            }
            lines.push(l);
        }
        lines.join("\n")
    });
    (tx, task)
}

pub async fn build(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let spec = spec(ctx, a)?;
    let name = spec.template.def.name.clone();
    let (tx, task) = collector(ctx.progress.clone());
    let result = ctx.provider.build(spec, tx).await;
    let log = task.await.unwrap_or_default();
    match result {
        Ok(o) => Ok(json!({ "name": name, "image": o.image, "digest": o.digest, "cached": o.cached, "log": log })),
        Err(e) => Err(StepError::from(e).with_outputs(json!({ "name": name, "log": log }))),
    }
}

pub async fn deploy(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let spec = spec(ctx, a)?;
    // The name the step gave (and the folder's own `name:`, with `path:` they may differ).
    let names = [a.str("template").to_string(), spec.template.def.name.clone()];
    let (tx, task) = collector(ctx.progress.clone());
    let result = ctx.provider.deploy(spec, tx).await;
    let log = task.await.unwrap_or_default();
    if let Ok(o) = &result {
        for n in names {
            ctx.deployed.insert(n, o.template_id.clone());
        }
    }
    match result {
        Ok(o) => Ok(json!({
            "template_id": o.template_id, "image": o.image, "digest": o.digest, "cached": o.cached, "log": log,
        })),
        Err(e) => Err(StepError::from(e).with_outputs(json!({ "log": log }))),
    }
}

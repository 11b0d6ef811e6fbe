//! Lifecycle steps: create, connect, info, list, kill, set-timeout.

use std::collections::HashMap;

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{SandboxRef, StepCtx, StepError, StepResult};
use crate::provider::{CreateRequest, NetworkPolicy, SandboxInfo};

/// `create`'s `network: { allow_internet_access, allow_out, deny_out, dns_servers,
/// allow_public_traffic }` (a list may be one string).
fn network_arg(a: &Args) -> Option<NetworkPolicy> {
    let n = a.object("network")?;
    Some(NetworkPolicy { allow_public_traffic: n.opt_bool("allow_public_traffic"), ..policy_of(n) })
}

/// The rules of a network policy, as `create`'s `network` and `update-network` give them.
fn policy_of(n: &Args) -> NetworkPolicy {
    NetworkPolicy {
        allow_internet_access: n.opt_bool("allow_internet_access"),
        allow_out: n.str_list("allow_out"),
        deny_out: n.str_list("deny_out"),
        dns_servers: n.has("dns_servers").then(|| n.str_list("dns_servers")),
        allow_public_traffic: None,
    }
}

/// `create`'s `lifecycle: { on_timeout, memory, auto_resume }` (None when absent or
/// `on_timeout: kill` with nothing else asked).
fn lifecycle_arg(a: &Args) -> Option<crate::provider::Lifecycle> {
    let l = a.object("lifecycle")?;
    let pause = l.opt_str("on_timeout") == Some("pause");
    let auto_resume = l.opt_bool("auto_resume").unwrap_or(false);
    (pause || auto_resume).then(|| crate::provider::Lifecycle {
        pause_on_timeout: pause,
        keep_memory: l.opt_bool("memory").unwrap_or(true),
        auto_resume,
    })
}

fn info_json(i: &SandboxInfo) -> JsonValue {
    json!({
        "id": i.id, "template": i.template, "metadata": i.metadata,
        "started_at": i.started_at, "end_at": i.end_at, "state": i.state,
    })
}

/// Adds sandbox `info` (not killed, nothing opened in it yet) as the one steps use from now on.
fn push_sandbox(ctx: &mut StepCtx, alias: Option<String>, info: &SandboxInfo, keep: bool) {
    let sb = SandboxRef {
        alias,
        id: info.id.clone(),
        template: info.template.clone(),
        keep,
        killed: false,
        urls: HashMap::new(),
        code_contexts: HashMap::new(),
    };
    ctx.sandboxes.push(sb);
    ctx.current = Some(ctx.sandboxes.len() - 1);
    ctx.target = ctx.current;
}

/// What to add when a template the provider does not know has a folder here (issue 37 item 3:
/// a `create` of `code-interpreter-v1` without its `deploy` said only "unknown template").
fn deploy_hint(name: &str, scenario_dir: &std::path::Path, root: Option<&str>) -> String {
    let dir = crate::templates::find_dir(name, scenario_dir, root);
    if !dir.join("template.yaml").is_file() {
        return String::new();
    }
    format!(
        "; the template folder {} defines it: add `- deploy: {name}` before this step (a build is \
         kept by content, so only the first run builds it)",
        dir.display()
    )
}

pub async fn create(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let name = a.opt_str("template").unwrap_or("base");
    let template = name;
    // `base` and `code-interpreter-v1` are the platform's own templates in the cloud, under
    // ids of its own: the template folder's `ids` say which (template.yaml).
    let root = ctx.env.get(crate::templates::TEMPLATES_DIR_ENV).map(String::as_str);
    // A template this scenario deployed is the one its name means from then on (the cloud's
    // official one of the same name, mapped by `ids`, is not).
    let template = match ctx.deployed.get(template) {
        Some(id) => id.clone(),
        None => crate::templates::provider_id(template, ctx.provider.name(), &ctx.scenario_dir, root)
            .map_err(|e| StepError::error(e.to_string()))?,
    };
    let mut metadata = a.str_map("metadata");
    metadata.insert(ctx.run_tag.0.clone(), ctx.run_tag.1.clone());
    let req = CreateRequest {
        template: template.clone(),
        timeout_secs: Some(a.duration("timeout").unwrap_or(ctx.sandbox_ttl).as_secs().max(1)),
        metadata,
        envs: a.str_map("envs"),
        // Range-checked by the registry's fields: positive, and far below these types' limits.
        cpu: a.int("cpu").and_then(|v| u32::try_from(v).ok()),
        memory_mb: a.int("memory").and_then(|v| u64::try_from(v).ok()),
        disk_mb: a.int("disk").and_then(|v| u64::try_from(v).ok()),
        network: network_arg(a),
        mounts: Vec::new(),
        lifecycle: lifecycle_arg(a),
    };
    // Read before creating: an argument error after it would leak a sandbox the scenario
    // does not know about and so never destroys.
    let keep = a.flag("keep");
    let info = match ctx.provider.create(req).await {
        Ok(info) => info,
        Err(mut e) if e.kind == crate::provider::ErrorKind::NotFound => {
            e.message.push_str(&deploy_hint(name, &ctx.scenario_dir, root));
            return Err(e.into());
        }
        Err(e) => return Err(e.into()),
    };
    if keep {
        // It outlives the run: the provider's end-of-run destroy and the sweep of the run's
        // tag leave it (a connected sandbox is merely not destroyed by the scenario).
        ctx.provider.keep(&info.id);
    }
    let alias = a.opt_str("as").map(str::to_string);
    push_sandbox(ctx, alias.clone(), &info, keep);
    Ok(json!({ "id": info.id, "template": info.template, "template_id": template, "alias": alias }))
}

pub async fn connect(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let id = a.str("id");
    let info = ctx.provider.connect(id, a.duration("timeout").map(|d| d.as_secs())).await?;
    let existing = ctx.sandboxes.iter().position(|s| s.id == info.id);
    let alias = a.opt_str("as").map(str::to_string);
    match existing {
        Some(i) if alias.is_none() => {
            ctx.current = Some(i);
            ctx.target = Some(i);
        }
        _ => {
            // Connected sandboxes belong to someone else unless `owned: true`; one of ours
            // seen under a new alias stays as it was created (kept or not).
            let keep = !a.flag("owned") && existing.is_none_or(|i| ctx.sandboxes[i].keep);
            push_sandbox(ctx, alias, &info, keep);
        }
    }
    Ok(info_json(&info))
}

fn target_id(ctx: &StepCtx, a: &Args) -> Result<String, StepError> {
    match a.opt_str("id") {
        Some(id) => Ok(id.to_string()),
        None => ctx.sandbox_id(),
    }
}

pub async fn info(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let id = target_id(ctx, a)?;
    Ok(info_json(&ctx.provider.info(&id).await?))
}

pub async fn list(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let mut filter = a.str_map("metadata");
    if filter.is_empty() && !a.flag("all") {
        filter.insert(ctx.run_tag.0.clone(), ctx.run_tag.1.clone());
    }
    let list = match a.opt_str("api_key") {
        Some(key) => ctx.provider.list_with_key(key, &filter).await?,
        None => ctx.provider.list(&filter).await?,
    };
    let ids: Vec<&str> = list.iter().map(|i| i.id.as_str()).collect();
    Ok(json!({ "ids": ids, "count": list.len(), "sandboxes": list.iter().map(info_json).collect::<Vec<_>>() }))
}

pub async fn kill(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let id = target_id(ctx, a)?;
    let killed = ctx.provider.kill(&id).await?;
    for sb in ctx.sandboxes.iter_mut().filter(|s| s.id == id) {
        sb.killed = true;
    }
    Ok(json!({ "killed": killed }))
}

pub async fn set_timeout(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let secs = a.duration("timeout").unwrap_or_default().as_secs().max(1);
    let id = ctx.sandbox_id()?;
    ctx.provider.set_timeout(&id, secs).await?;
    let info = ctx.provider.info(&id).await?;
    Ok(json!({ "end_at": info.end_at }))
}

/// `update-network`: the sandbox's egress policy is the one given from now on (replaced,
/// not merged, as E2B's `update_network`).
pub async fn update_network(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let id = ctx.sandbox_id()?;
    ctx.provider.sandbox(&id).update_network(policy_of(a)).await?;
    Ok(json!({}))
}

/// `pause`: the sandbox's processes stop where they are (or, with `memory: false`, end and
/// only its files stay); it no longer expires.
pub async fn pause(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let keep_memory = a.opt_bool("memory").unwrap_or(true);
    let id = ctx.sandbox_id()?;
    ctx.provider.sandbox(&id).pause(keep_memory).await?;
    let info = ctx.provider.info(&id).await?;
    Ok(json!({ "id": id, "state": info.state }))
}

/// `resume`: the paused sandbox runs on, and expires `timeout` from now.
pub async fn resume(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let secs = a.duration("timeout").unwrap_or(ctx.sandbox_ttl).as_secs().max(1);
    let id = ctx.sandbox_id()?;
    ctx.provider.sandbox(&id).resume(secs).await?;
    let info = ctx.provider.info(&id).await?;
    Ok(json!({ "id": id, "state": info.state, "end_at": info.end_at }))
}

/// `snapshot`: the sandbox's filesystem as a template `create` starts; deleted at the end of
/// the scenario (after its sandboxes) unless `keep`.
pub async fn snapshot(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let keep = a.flag("keep");
    // A name of the run's own: two scenarios (or two runs) never take the same one.
    let name = match a.opt_str("name") {
        Some(n) if n.trim().is_empty() => return Err(StepError::bad_args("`name` must not be empty")),
        Some(n) => n.to_string(),
        None => format!("scenario-run-{}-{}", ctx.run_tag.1, crate::random::hex(4)).to_ascii_lowercase(),
    };
    let id = ctx.sandbox_id()?;
    let snap = ctx.provider.sandbox(&id).snapshot(&name).await?;
    if keep {
        ctx.provider.keep_snapshot(&snap);
    }
    ctx.snapshots.push(super::SnapshotRef { id: snap.clone(), keep });
    Ok(json!({ "id": snap, "name": name, "sandbox": id }))
}

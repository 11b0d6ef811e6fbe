//! File steps: write-file, read-file, files.

use base64::Engine as _;
use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{StepCtx, StepError, StepResult};
use crate::provider::FileEntry;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

pub fn parse_mode(s: &str) -> Result<u32, StepError> {
    let t = s.trim().trim_start_matches("0o");
    u32::from_str_radix(t, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| StepError::bad_args(format!("`mode` must be octal permission bits like \"0644\", got {s:?}")))
}

fn entry_json(e: &FileEntry) -> JsonValue {
    json!({ "name": e.name, "path": e.path, "type": e.kind, "size": e.size, "mode": format!("{:04o}", e.mode), "modified": e.modified })
}

pub async fn write_file(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let path = a.str("path");
    let sources = ["content", "content_base64", "from"].iter().filter(|k| a.has(k)).count();
    if sources > 1 {
        return Err(StepError::bad_args("give only one of `content`, `content_base64`, `from`"));
    }
    let data = if let Some(b) = a.opt_str("content_base64") {
        crate::cpu_bound::off_runtime(b.len(), || b64().decode(b.trim()))
            .map_err(|e| StepError::bad_args(format!("`content_base64` is not valid base64: {e}")))?
    } else if let Some(from) = a.opt_str("from") {
        let p = ctx.scenario_dir.join(from);
        tokio::fs::read(&p)
            .await
            .map_err(|e| StepError::bad_args(format!("cannot read local file {}: {e}", p.display())))?
    } else {
        a.str("content").as_bytes().to_vec()
    };
    let mode = a.opt_str("mode").map(parse_mode).transpose()?;
    let size = data.len();
    let id = ctx.sandbox_id()?;
    let entry = ctx.provider.sandbox(&id).write_file(path, data, mode).await?;
    Ok(json!({ "path": entry.path, "size": size }))
}

pub async fn read_file(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let path = a.str("path");
    let id = ctx.sandbox_id()?;
    let data = ctx.provider.sandbox(&id).read_file(path).await?;
    let content = match a.opt_str("encoding") {
        Some("base64") => crate::cpu_bound::off_runtime(data.len(), || b64().encode(&data)),
        _ => String::from_utf8(data.clone())
            .map_err(|_| StepError::fail(format!("{path} is not UTF-8 text; read it with `encoding: base64`")))?,
    };
    Ok(json!({ "content": content, "size": data.len() }))
}

pub async fn files(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let (op, path) = (a.str("op"), a.str("path").to_string());
    let id = ctx.sandbox_id()?;
    let p = ctx.provider.sandbox(&id);
    Ok(match op {
        "list" => {
            let mut entries = p.list_dir(&path).await?;
            entries.sort_by(|x, y| x.name.cmp(&y.name));
            let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
            json!({ "entries": entries.iter().map(entry_json).collect::<Vec<_>>(), "names": names, "count": entries.len() })
        }
        "stat" => entry_json(&p.stat(&path).await?),
        "mkdir" => entry_json(&p.make_dir(&path).await?),
        "move" => {
            let to = a.opt_str("to").ok_or_else(|| StepError::bad_args("`move` needs `to`"))?;
            entry_json(&p.rename(&path, to).await?)
        }
        "remove" => {
            p.remove(&path).await?;
            json!({ "path": path, "removed": true })
        }
        "exists" => json!({ "path": path, "exists": p.exists(&path).await? }),
        other => return Err(StepError::bad_args(format!("unknown op `{other}`"))),
    })
}

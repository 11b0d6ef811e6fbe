//! Directory watch steps: `watch` starts a watch on a sandbox directory, and `watch-events`
//! (whose `of` is the watch step's `id`) waits until the changes it expects have been reported (or checks that none
//! were). Each `watch-events` looks at the changes reported since the previous one on the
//! same watch. Watches stop when the scenario ends.

use std::time::{Duration, Instant};

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{StepCtx, StepError, StepResult, WatchRef};
use crate::provider::{FsEvent, FsOp};

use crate::model::kinds::WATCH_TYPES as TYPES;

fn op_name(op: FsOp) -> &'static str {
    match op {
        FsOp::Create => "create",
        FsOp::Write => "write",
        FsOp::Remove => "remove",
        FsOp::Rename => "rename",
        FsOp::Chmod => "chmod",
    }
}

pub async fn watch(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let path = a.str("path").to_string();
    let recursive = a.flag("recursive");
    let id = ctx.sandbox_id()?;
    let name = format!("watch-{}", ctx.watches.len() + 1);
    let watch = ctx.provider.sandbox(&id).watch_dir(&path, recursive).await?;
    ctx.watches.push(WatchRef { name: name.clone(), sandbox: id, path: path.clone(), watch });
    Ok(json!({ "name": name, "path": path, "recursive": recursive }))
}

/// One expected event: a name (relative to the watched directory) and maybe a type.
struct Want {
    name: String,
    op: Option<&'static str>,
}

impl Want {
    fn parse(v: &JsonValue) -> Result<Self, StepError> {
        let bad = || {
            StepError::bad_args(format!(
                "each `expect` item is {{ name: <path>, type: <{}> }}, got {v}",
                TYPES.join("|")
            ))
        };
        let obj = match v {
            JsonValue::String(s) => return Ok(Want { name: s.clone(), op: None }),
            JsonValue::Object(o) => o,
            _ => return Err(bad()),
        };
        if obj.keys().any(|k| k != "name" && k != "type") {
            return Err(bad());
        }
        let name = obj.get("name").map(super::text).ok_or_else(bad)?;
        let op = match obj.get("type").filter(|t| !t.is_null()) {
            None => None,
            Some(t) => {
                let t = super::text(t).to_ascii_lowercase();
                Some(*TYPES.iter().find(|x| **x == t).ok_or_else(bad)?)
            }
        };
        Ok(Want { name, op })
    }

    fn seen_in(&self, events: &[FsEvent]) -> bool {
        events.iter().any(|e| e.name == self.name && self.op.is_none_or(|o| op_name(e.op) == o))
    }

    fn describe(&self) -> String {
        match self.op {
            Some(o) => format!("{o} {}", self.name),
            None => self.name.clone(),
        }
    }
}

pub async fn watch_events(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let within = a.duration("within").unwrap_or(Duration::from_secs(10));
    let wants: Vec<Want> = match a.json("expect") {
        None => Vec::new(),
        Some(JsonValue::Array(items)) => items.iter().map(Want::parse).collect::<Result<_, _>>()?,
        Some(one) => vec![Want::parse(one)?],
    };
    let none = a.flag("none");
    if none && !wants.is_empty() {
        return Err(StepError::bad_args("`none: true` and `expect` contradict each other"));
    }
    let w = match a.opt_str("of") {
        Some(step) => {
            let name = ctx.outputs.get(step).and_then(|o| o.get("name")).and_then(JsonValue::as_str);
            let name = name.filter(|n| n.starts_with("watch-"));
            name.and_then(|n| ctx.watches.iter().find(|w| w.name == n))
                .ok_or_else(|| StepError::bad_args(format!("step `{step}` did not start a watch")))?
        }
        None => ctx.watches.last().ok_or_else(|| StepError::bad_args("no watch: add a `watch` step first"))?,
    };
    let deadline = Instant::now() + within;
    let arrived = w.watch.arrived();
    let mut events: Vec<FsEvent> = Vec::new();
    loop {
        let notified = arrived.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        events.extend(w.watch.drain());
        let done = !none && !wants.is_empty() && wants.iter().all(|x| x.seen_in(&events));
        let now = Instant::now();
        if done || now >= deadline {
            break;
        }
        // Woken by an arrival, or every 100 ms (a watch that does not notify).
        let _ = tokio::time::timeout((deadline - now).min(Duration::from_millis(100)), notified).await;
    }
    let listed: Vec<JsonValue> = events.iter().map(|e| json!({ "name": e.name, "type": op_name(e.op) })).collect();
    let mut names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    names.dedup();
    let outputs = json!({ "events": listed, "names": names, "count": events.len() });
    let seen = || {
        if events.is_empty() {
            "none".to_string()
        } else {
            events.iter().map(|e| format!("{} {}", op_name(e.op), e.name)).collect::<Vec<_>>().join(", ")
        }
    };
    if none && !events.is_empty() {
        return Err(StepError::fail(format!(
            "expected no changes under {} within {}, saw: {}",
            w.path,
            crate::duration::human(within),
            seen()
        ))
        .with_outputs(outputs));
    }
    let missing: Vec<String> = wants.iter().filter(|x| !x.seen_in(&events)).map(Want::describe).collect();
    if !missing.is_empty() {
        return Err(StepError::fail(format!(
            "watch of {} in sandbox {}: no {} within {}; saw: {}",
            w.path,
            w.sandbox,
            missing.join(", "),
            crate::duration::human(within),
            seen()
        ))
        .with_outputs(outputs));
    }
    Ok(outputs)
}

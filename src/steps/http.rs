//! HTTP steps: http-get and http, against a URL or a port inside the sandbox.

use std::time::Duration;

use serde_json::{json, Value as J};

use super::{Args, StepCtx, StepError, StepResult};
use crate::matcher::Matcher;
use crate::report::events::Mismatch;

/// The default limit of one request.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The default limit of one attempt of a polled request (`eventually`), as readiness probes
/// do: a server that accepts but does not answer yet costs one short attempt, not the window.
const POLLED_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn http_get(ctx: &mut StepCtx, args: &J) -> StepResult {
    request(ctx, args, "GET".into()).await
}

pub async fn http(ctx: &mut StepCtx, args: &J) -> StepResult {
    let method = Args(args).str("method")?.to_ascii_uppercase();
    request(ctx, args, method).await
}

async fn url_of(ctx: &mut StepCtx, a: &Args<'_>) -> Result<String, StepError> {
    if let Some(url) = a.opt_str("url") {
        if a.get("port").is_some() {
            return Err(StepError::error("give `url` or `port`, not both"));
        }
        return Ok(url);
    }
    let port =
        a.opt_int("port")?.ok_or_else(|| StepError::error("give `url`, or `port` (and `path`) inside the sandbox"))?;
    let port = u16::try_from(port).map_err(|_| StepError::error(format!("`port` {port} is out of range")))?;
    let id = ctx.sandbox_id()?;
    let base = ctx.provider.port_url(&id, port).await?;
    let path = a.opt_str("path").unwrap_or_else(|| "/".into());
    let sep = if path.starts_with('/') { "" } else { "/" };
    Ok(format!("{}{sep}{path}", base.trim_end_matches('/')))
}

async fn request(ctx: &mut StepCtx, args: &J, method: String) -> StepResult {
    let a = Args(args);
    let url = url_of(ctx, &a).await?;
    let m = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| StepError::error(format!("bad method `{method}`")))?;
    let limit = a.opt_duration("request_timeout")?.unwrap_or(if ctx.polling { POLLED_TIMEOUT } else { TIMEOUT });
    let mut req = ctx.http.request(m, &url).timeout(limit);
    // A port behind private ingress needs its token; the provider knows the URLs it gave out.
    for (k, v) in ctx.provider.port_headers(&url) {
        let mut v = reqwest::header::HeaderValue::from_str(&v)
            .map_err(|_| StepError::error(format!("the provider's header {k} is not a valid header value")))?;
        v.set_sensitive(true);
        req = req.header(k, v);
    }
    for (k, v) in a.str_map("headers")? {
        req = req.header(k, v);
    }
    match a.get("body") {
        None => {}
        Some(J::String(s)) => req = req.body(s.clone()),
        Some(other) => req = req.json(other),
    }
    let mut resp =
        req.send().await.map_err(|e| StepError::fail(format!("request to {url} failed: {}", error_chain(&e))))?;
    let status = resp.status().as_u16();
    let headers: serde_json::Map<String, J> = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), J::String(String::from_utf8_lossy(v.as_bytes()).into_owned())))
        .collect();
    // Kept up to --max-output, as command output is; the rest is read and counted.
    let (mut kept, mut dropped) = (Vec::new(), 0u64);
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| StepError::fail(format!("reading the body from {url} failed: {}", error_chain(&e))))?
    {
        crate::provider::output::keep(&mut kept, &mut dropped, &chunk, ctx.max_output);
    }
    let body = String::from_utf8_lossy(&kept).into_owned();
    let parsed = if dropped == 0 { serde_json::from_str::<J>(&body).unwrap_or(J::Null) } else { J::Null };
    let outputs = json!({
        "status": status, "body": body, "headers": headers, "json": parsed, "url": url, "body_dropped": dropped,
    });
    if let Some(expect) = a.get("expect") {
        check_expect(expect, status, &headers, &body).map_err(|mut e| {
            if dropped > 0 {
                e.message.push_str(&super::cut_note("the body", kept.len(), dropped));
            }
            e.with_outputs(outputs.clone())
        })?;
    }
    Ok(outputs)
}

fn check_expect(expect: &J, status: u16, headers: &serde_json::Map<String, J>, body: &str) -> Result<(), StepError> {
    let e = Args(expect);
    if let Some(want) = e.get("status") {
        let allowed: Vec<i64> = match want {
            J::Array(items) => {
                items.iter().filter_map(|v| v.as_i64().or_else(|| super::text(v).parse().ok())).collect()
            }
            v => v.as_i64().or_else(|| super::text(v).parse().ok()).into_iter().collect(),
        };
        if !allowed.contains(&i64::from(status)) {
            let snippet: String = body.chars().take(300).collect();
            let mut err =
                StepError::fail(format!("expected status {}, got {status}; body: {snippet:?}", super::text(want)));
            err.mismatch = Some(Box::new(Mismatch { expected: super::text(want), actual: status.to_string() }));
            return Err(err);
        }
    }
    if let Some(m) = e.get("body") {
        Matcher::from_json(m).map_err(StepError::error)?.check_text(body).map_err(StepError::from)?;
    }
    if let Some(checks) = e.get("json") {
        Matcher::from_json(&json!({ "json": checks }))
            .map_err(StepError::error)?
            .check_text(body)
            .map_err(StepError::from)?;
    }
    for (name, want) in e.str_map("headers")? {
        let got = headers.get(&name.to_ascii_lowercase()).and_then(J::as_str);
        match got {
            Some(v) if v.contains(&want) => {}
            Some(v) => {
                return Err(StepError::fail(format!("header {name}: expected it to contain {want:?}, got {v:?}")))
            }
            None => return Err(StepError::fail(format!("header {name} is missing"))),
        }
    }
    Ok(())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !msg.contains(&t) {
            msg = format!("{msg}: {t}");
        }
        src = s.source();
    }
    msg
}

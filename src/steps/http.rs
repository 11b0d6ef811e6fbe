//! HTTP steps: http-get and http, against a URL or a port inside the sandbox.

use std::time::Duration;

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{StepCtx, StepError, StepResult};
use crate::matcher::Matcher;
use crate::results::Mismatch;

/// The default limit of one request.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The default limit of one attempt of a polled request (`eventually`), as readiness probes
/// do: a server that accepts but does not answer yet costs one short attempt, not the window.
const POLLED_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn http_get(ctx: &mut StepCtx, a: &Args) -> StepResult {
    request(ctx, a, "GET".into()).await
}

pub async fn http(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let method = a.str("method").to_ascii_uppercase();
    request(ctx, a, method).await
}

/// Where a request goes: the URL, and the port inside the sandbox when it was given as one
/// (the URL is then the provider's forwarder, whose own port means nothing to the author).
async fn url_of(ctx: &mut StepCtx, a: &Args) -> Result<(String, Option<u16>), StepError> {
    if let Some(url) = a.opt_str("url") {
        if a.has("port") {
            return Err(StepError::bad_args("give `url` or `port`, not both"));
        }
        return Ok((url.to_string(), None));
    }
    let port =
        a.int("port").ok_or_else(|| StepError::bad_args("give `url`, or `port` (and `path`) inside the sandbox"))?;
    // 1 to 65535, by its field.
    let port = u16::try_from(port).unwrap_or_default();
    let id = ctx.sandbox_id()?;
    let base = ctx.provider.sandbox(&id).port_url(port).await?;
    let path = a.opt_str("path").unwrap_or("/");
    let sep = if path.starts_with('/') { "" } else { "/" };
    Ok((format!("{}{sep}{path}", base.trim_end_matches('/')), Some(port)))
}

/// The message for a request that got no answer. A sandbox port with nothing listening shows
/// up as a refused, reset or closed connection on the forwarder's host port: say so in terms
/// of the port the scenario named (as `serve` answers "port is not open"), not the forwarder's.
fn send_failed(url: &str, port: Option<u16>, method: &str, polling: bool, e: &reqwest::Error) -> String {
    let chain = error_chain(e);
    let lower = chain.to_ascii_lowercase();
    let no_listener = e.is_connect()
        || ["connection refused", "connection reset", "connection closed before message completed", "broken pipe"]
            .iter()
            .any(|s| lower.contains(s));
    match port {
        Some(port) if no_listener => {
            let path = reqwest::Url::parse(url).map(|u| u.path().to_string()).unwrap_or_default();
            let why = ["connection refused", "connection reset", "connection closed before message completed"]
                .iter()
                .find(|s| lower.contains(*s))
                .copied()
                .unwrap_or("no connection");
            let wait = if polling { "" } else { ", and give this step `eventually: 10s` while it starts" };
            format!(
                "nothing is listening on port {port} in the sandbox: {method} {path} got {why} (through {}); start a server on port {port} before this step{wait}",
                origin(url)
            )
        }
        _ => format!("request to {url} failed: {chain}"),
    }
}

/// `http://127.0.0.1:43595` of a URL.
fn origin(url: &str) -> String {
    reqwest::Url::parse(url).map(|u| u.origin().ascii_serialization()).unwrap_or_else(|_| url.to_string())
}

async fn request(ctx: &mut StepCtx, a: &Args, method: String) -> StepResult {
    let (url, port) = url_of(ctx, a).await?;
    let m = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| StepError::bad_args(format!("bad method `{method}`")))?;
    let limit = a.duration("request_timeout").unwrap_or(if ctx.polling { POLLED_TIMEOUT } else { TIMEOUT });
    let mut req = ctx.http.request(m, &url).timeout(limit);
    // A port behind private ingress needs its token; the provider knows the URLs it gave out.
    let tokens = if a.opt_bool("traffic_token").unwrap_or(true) { ctx.provider.port_headers(&url) } else { Vec::new() };
    for (k, v) in tokens {
        let mut v = reqwest::header::HeaderValue::from_str(&v)
            .map_err(|_| StepError::error(format!("the provider's header {k} is not a valid header value")))?;
        v.set_sensitive(true);
        req = req.header(k, v);
    }
    let mut sent_headers = serde_json::Map::new();
    for (k, v) in a.str_map("headers") {
        sent_headers.insert(k.clone(), JsonValue::String(shown_header(&k, &v)));
        req = req.header(k, v);
    }
    let sent_body = match a.json("body") {
        None => None,
        Some(JsonValue::String(s)) => {
            req = req.body(s.clone());
            Some(s.clone())
        }
        Some(other) => {
            req = req.json(other);
            Some(other.to_string())
        }
    };
    // What was sent, for `-v` and the reports: a credential in a header never shows (its
    // value is masked by the header's name, and every known secret by the runner's masker).
    let request = json!({
        "method": method, "url": url, "headers": sent_headers,
        "body": sent_body.as_deref().map(|b| cut(b, SHOWN_BODY)),
    });
    let started = std::time::Instant::now();
    let mut resp = req.send().await.map_err(|e| {
        let err = StepError::fail(send_failed(&url, port, &method, ctx.polling, &e))
            .with_outputs(json!({ "url": url, "request": request }));
        if e.is_timeout() {
            err.of_kind(crate::provider::ErrorKind::Timeout)
        } else {
            err
        }
    })?;
    let status = resp.status().as_u16();
    let headers: serde_json::Map<String, JsonValue> = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), JsonValue::String(String::from_utf8_lossy(v.as_bytes()).into_owned())))
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
    let duration_ms = started.elapsed().as_millis() as u64;
    let body = String::from_utf8_lossy(&kept).into_owned();
    let parsed = if dropped == 0 {
        serde_json::from_str::<JsonValue>(&body).unwrap_or(JsonValue::Null)
    } else {
        JsonValue::Null
    };
    let mut outputs = json!({
        "status": status, "body": body, "headers": headers, "json": parsed, "url": url, "body_dropped": dropped,
        "duration_ms": duration_ms, "request": request,
    });
    if let Some(expect) = a.object("expect") {
        check_expect(expect, status, &headers, &body, port)
            .and_then(|()| check_duration(expect, duration_ms))
            .map_err(|mut e| {
                if dropped > 0 {
                    e.message.push_str(&super::cut_note("the body", kept.len(), dropped));
                }
                e.with_outputs(outputs.clone())
            })?;
    }
    // Captures after the checks, as Hurl's: a response that failed them binds nothing.
    if let Some(spec) = a.json("capture") {
        let captured = capture(spec, &headers, &body).map_err(|e| e.with_outputs(outputs.clone()))?;
        for (k, v) in &captured {
            ctx.vars.insert(k.clone(), v.clone());
        }
        outputs["captures"] = JsonValue::Object(captured);
    }
    Ok(outputs)
}

/// How much of a request's body the step keeps to show (`-v`, reports).
const SHOWN_BODY: usize = 2048;

/// `text` up to `max` bytes (on a character boundary), saying how much was cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
}

/// Headers that carry credentials whatever their value: shown as `***`.
const CREDENTIAL_HEADERS: &[&str] =
    &["authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token", "x-access-token"];

fn shown_header(name: &str, value: &str) -> String {
    let lower = name.to_ascii_lowercase();
    if CREDENTIAL_HEADERS.contains(&lower.as_str()) || lower.contains("token") || lower.contains("secret") {
        // The scheme stays (`Bearer ***`): it says what kind of credential was sent.
        match value.split_once(' ') {
            Some((scheme, _)) if lower.ends_with("authorization") => format!("{scheme} ***"),
            _ => "***".into(),
        }
    } else {
        value.to_string()
    }
}

/// `capture: { name: { header, regex } }`: each name bound to a header's value (its name in
/// any case), or to the first group of a regex (the whole match without a group) on the body
/// or on that header. A capture that finds nothing fails the step, as Hurl's does.
fn capture(
    spec: &JsonValue,
    headers: &serde_json::Map<String, JsonValue>,
    body: &str,
) -> Result<serde_json::Map<String, JsonValue>, StepError> {
    let Some(entries) = spec.as_object() else {
        return Err(StepError::bad_args("`capture` must map variable names to { header, regex }"));
    };
    let mut out = serde_json::Map::new();
    for (name, how) in entries {
        let header = how.get("header").and_then(JsonValue::as_str);
        let regex = how.get("regex").and_then(JsonValue::as_str);
        let (text, what) = match header {
            Some(h) => match headers.get(&h.to_ascii_lowercase()).and_then(JsonValue::as_str) {
                Some(v) => (v, format!("header {h}")),
                None => {
                    let names: Vec<&str> = headers.keys().map(String::as_str).collect();
                    return Err(StepError::fail(format!(
                        "capture `{name}`: the response has no header {h} (it has: {})",
                        names.join(", ")
                    )));
                }
            },
            None if regex.is_some() => (body, "the body".to_string()),
            None => {
                return Err(StepError::bad_args(format!(
                    "capture `{name}` needs `header`, `regex` or both: {{ header: X-Token }}, {{ regex: 'id=(\\d+)' }}"
                )))
            }
        };
        let value = match regex {
            None => text.to_string(),
            Some(re) => {
                let re = regex::Regex::new(re)
                    .map_err(|e| StepError::bad_args(format!("capture `{name}`: bad regex: {e}")))?;
                let Some(caps) = re.captures(text) else {
                    let snippet: String = text.chars().take(200).collect();
                    let mut e = StepError::fail(format!("capture `{name}`: /{re}/ does not match {what}: {snippet:?}"));
                    e.mismatch = Some(Box::new(Mismatch::new(format!("/{re}/"), snippet)));
                    return Err(e);
                };
                caps.get(1).or_else(|| caps.get(0)).map_or("", |m| m.as_str()).to_string()
            }
        };
        out.insert(name.clone(), JsonValue::String(value));
    }
    Ok(out)
}

fn check_expect(
    e: &Args,
    status: u16,
    headers: &serde_json::Map<String, JsonValue>,
    body: &str,
    port: Option<u16>,
) -> Result<(), StepError> {
    if let Some(allowed) = e.int_list("status") {
        if !allowed.contains(&i64::from(status)) {
            let want = match allowed {
                [one] => one.to_string(),
                many => serde_json::to_string(many).unwrap_or_default(),
            };
            let snippet: String = body.chars().take(300).collect();
            // E2B's proxy (and `serve`) answer 502 "port is not open" for a port nobody listens on.
            let closed = match port {
                Some(p) if status == 502 && body.contains("port is not open") => {
                    format!(" (nothing is listening on port {p} in the sandbox)")
                }
                _ => String::new(),
            };
            let mut err = StepError::fail(format!("expected status {want}, found {status}{closed}; body: {snippet:?}"));
            err.mismatch = Some(Box::new(Mismatch::new(want, status.to_string())));
            return Err(err);
        }
    }
    if let Some(m) = e.field_matcher("body") {
        m.check_text(body).map_err(|f| {
            let mut e = StepError::from(f);
            e.message = format!("body: {}", e.message);
            e
        })?;
    }
    if let Some(checks) = e.json("json") {
        Matcher::from_json(&json!({ "json": checks }))
            .map_err(|e| StepError::error(e.to_string()))?
            .check_text(body)
            .map_err(|f| {
            let mut e = StepError::from(f);
            e.message = format!("body: {}", e.message);
            e
        })?;
    }
    for (name, want) in e.str_map("headers") {
        let got = headers.get(&name.to_ascii_lowercase()).and_then(JsonValue::as_str);
        match got {
            Some(v) if v.contains(&want) => {}
            Some(v) => {
                return Err(StepError::fail(format!(
                    "header {name}: expected a value containing {want:?}, found {v:?}"
                )))
            }
            None => return Err(StepError::fail(format!("expected header {name}, found no such header"))),
        }
    }
    Ok(())
}

/// `expect: { duration_ms: { lt, le } }`.
fn check_duration(e: &Args, took: u64) -> Result<(), StepError> {
    let Some(bounds) = e.object("duration_ms") else { return Ok(()) };
    let took = took as i64;
    for (key, op, holds) in [
        ("lt", "<", took < bounds.int("lt").unwrap_or(i64::MAX)),
        ("le", "<=", took <= bounds.int("le").unwrap_or(i64::MAX)),
    ] {
        if let (Some(limit), false) = (bounds.int(key), holds) {
            let mut err = StepError::fail(format!("expected duration_ms {op} {limit}, the response took {took} ms"));
            err.mismatch = Some(Box::new(Mismatch::new(format!("{op} {limit}"), took.to_string())));
            return Err(err);
        }
    }
    Ok(())
}

pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
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

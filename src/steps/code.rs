//! `run-code`: code through the platform's code interpreter, as its clients call it.
//!
//! By default (`via: interpreter`) the step speaks E2B's code-interpreter protocol, as the
//! `e2b-code-interpreter` SDKs and Alibaba's `agent_sandbox.code_interpreter` do: `POST
//! {port URL of 49999}/execute` with `{code, language | context_id, env_vars}`, and reads the
//! streamed JSON lines (`number_of_executions`, `stdout`, `stderr`, `result`, `error`,
//! `keepalive`, `end_of_execution`) into outputs a scenario asserts. A named `context` is made
//! with `POST /contexts` on first use and kept per sandbox, so state stays in it across steps.
//! The step's `timeout` is the client's, as in the SDKs: when it passes the connection is
//! dropped, which makes the interpreter interrupt the kernel, and the step fails.
//!
//! `via: exec` is the fallback for templates without the interpreter (`base`): the code and a
//! small driver are written into the sandbox and run with `python3`. The driver executes every
//! statement, evaluates a trailing expression as the result (like a notebook cell), and writes
//! `{ results, error }` as JSON to a result file, so printed output and the result never mix.

use std::time::{Duration, Instant};

use serde_json::{json, Value as JsonValue};

use super::args::Args;
use super::{exec_outputs, StepCtx, StepError, StepResult};
use crate::provider::{ErrorKind, ExecRequest};

const DRIVER: &str = r#"import ast, json, sys, traceback
src = open(sys.argv[1]).read()
out = {"results": [], "error": None}
ns = {"__name__": "__main__"}
try:
    tree = ast.parse(src, "<cell>")
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), ns)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), ns)
        if value is not None:
            r = {"text": value if isinstance(value, str) else repr(value)}
            try:
                r["json"] = json.loads(value) if isinstance(value, str) else json.loads(json.dumps(value))
            except Exception:
                r["json"] = None
            out["results"].append(r)
except BaseException as e:
    out["error"] = {"name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()}
sys.stdout.flush()
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"#;

/// The code interpreter's port (the SDKs' `JUPYTER_PORT`).
pub const INTERPRETER_PORT: u16 = 49999;

pub async fn run_code(ctx: &mut StepCtx, a: &Args) -> StepResult {
    match a.opt_str("via").unwrap_or("interpreter") {
        "exec" => run_with_driver(ctx, a).await,
        _ => run_on_interpreter(ctx, a).await,
    }
}

async fn run_on_interpreter(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let code = a.str("code");
    let language = a.opt_str("language").filter(|l| !l.is_empty());
    let context = a.opt_str("context").filter(|c| !c.is_empty());
    if a.has("cwd") && context.is_none() {
        return Err(StepError::error("`cwd` is where a new `context` starts: give `context` too"));
    }
    let id = ctx.sandbox_id()?;
    let base = ctx.provider.sandbox(&id).port_url(INTERPRETER_PORT).await?;
    let base = base.trim_end_matches('/').to_string();
    let limit = a.duration("timeout").unwrap_or(ctx.exec_timeout);
    let context_id = match context {
        Some(name) => Some(context_id(ctx, &base, name, language, a.opt_str("cwd")).await?),
        None => None,
    };
    let mut body = json!({ "code": code, "env_vars": a.str_map("env") });
    match &context_id {
        Some(cid) => body["context_id"] = json!(cid),
        None => body["language"] = json!(language.unwrap_or("python")),
    }
    let url = format!("{base}/execute");
    let started = Instant::now();
    let mut req = ctx.http.post(&url).timeout(limit).json(&body);
    for (k, v) in sensitive_headers(ctx, &url)? {
        req = req.header(k, v);
    }
    let mut resp = req.send().await.map_err(|e| unreachable(&url, &e, limit))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Err(StepError::fail(format!("the code interpreter answered {}: {}", status.as_u16(), text.trim())));
    }
    let mut exec = Execution::new(ctx.max_output);
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => exec.feed(&chunk),
            Ok(None) => break,
            Err(e) => {
                let mut outputs = exec.outputs(context_id.as_deref(), started.elapsed());
                let timed_out = e.is_timeout() || started.elapsed() >= limit;
                outputs["timed_out"] = json!(timed_out);
                let msg = if timed_out {
                    format!(
                        "code timed out after {} (the interpreter interrupts the kernel)",
                        crate::duration::human(limit)
                    )
                } else {
                    format!("the code interpreter's answer broke off: {}", super::http::error_chain(&e))
                };
                let kind = if timed_out { ErrorKind::Timeout } else { ErrorKind::Infra };
                return Err(StepError::fail(msg).of_kind(kind).with_outputs(outputs));
            }
        }
    }
    exec.finish();
    let outputs = exec.outputs(context_id.as_deref(), started.elapsed());
    if !exec.ended {
        return Err(StepError::fail("the code interpreter's answer ended without `end_of_execution`")
            .of_kind(ErrorKind::Infra)
            .with_outputs(outputs));
    }
    Ok(outputs)
}

/// The provider's headers for a port URL (E2B's private ingress token), marked sensitive.
fn sensitive_headers(ctx: &StepCtx, url: &str) -> Result<Vec<(String, reqwest::header::HeaderValue)>, StepError> {
    let mut out = Vec::new();
    for (k, v) in ctx.provider.port_headers(url) {
        let mut v = reqwest::header::HeaderValue::from_str(&v)
            .map_err(|_| StepError::error(format!("the provider's header {k} is not a valid header value")))?;
        v.set_sensitive(true);
        out.push((k, v));
    }
    Ok(out)
}

fn unreachable(url: &str, e: &reqwest::Error, limit: Duration) -> StepError {
    if e.is_timeout() {
        return StepError::timeout(format!(
            "code timed out after {} (no answer from the code interpreter)",
            crate::duration::human(limit)
        ));
    }
    StepError::fail(format!(
        "cannot reach the code interpreter on port {INTERPRETER_PORT} of the sandbox ({}): {}; use a template that has it \
         (code-interpreter-v1), or `via: exec` to run Python with the sandbox's python3",
        reqwest::Url::parse(url).map(|u| u.origin().ascii_serialization()).unwrap_or_default(),
        super::http::error_chain(e)
    ))
    .of_kind(ErrorKind::Infra)
}

/// The interpreter's id of the scenario's context `name` in the target sandbox, made on first
/// use with `POST /contexts`.
async fn context_id(
    ctx: &mut StepCtx,
    base: &str,
    name: &str,
    language: Option<&str>,
    cwd: Option<&str>,
) -> Result<String, StepError> {
    let i = ctx.target.ok_or_else(|| StepError::error("no sandbox: add a `create` step first"))?;
    if let Some(cid) = ctx.sandboxes[i].code_contexts.get(name) {
        return Ok(cid.clone());
    }
    let mut body = json!({ "language": language.unwrap_or("python") });
    if let Some(cwd) = cwd {
        body["cwd"] = json!(cwd);
    }
    let url = format!("{base}/contexts");
    let mut req = ctx.http.post(&url).timeout(CONTEXT_TIMEOUT).json(&body);
    for (k, v) in sensitive_headers(ctx, &url)? {
        req = req.header(k, v);
    }
    let resp = req.send().await.map_err(|e| unreachable(&url, &e, CONTEXT_TIMEOUT))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        return Err(StepError::fail(format!(
            "the code interpreter could not make context `{name}` ({}): {}",
            status.as_u16(),
            text.trim()
        )));
    }
    let cid = serde_json::from_str::<JsonValue>(&text)
        .ok()
        .and_then(|v| v["id"].as_str().map(str::to_string))
        .ok_or_else(|| StepError::error(format!("the code interpreter's new context has no id: {text}")))?;
    ctx.sandboxes[i].code_contexts.insert(name.to_string(), cid.clone());
    Ok(cid)
}

/// How long making a context (starting a kernel) may take.
const CONTEXT_TIMEOUT: Duration = Duration::from_secs(120);

/// The formats of a result, in the order the SDKs list them.
const FORMATS: &[&str] =
    &["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript", "data", "chart"];

/// One execution as the SDKs collect it from the stream, bounded as a command's output is:
/// up to `--max-output` bytes of stdout, of stderr, of results and of lines that were not
/// JSON, and no frame longer than [`Execution::frame_limit`] is held while it arrives; what
/// is past the bound is counted (`stdout_dropped`, `stderr_dropped`, `results_dropped`,
/// `frames_dropped`) and said in `cut`. A printing loop cannot grow the runner.
#[derive(Debug)]
pub(crate) struct Execution {
    cap: usize,
    stdout: Kept,
    stderr: Kept,
    results: Vec<JsonValue>,
    /// Bytes of the kept results' frames.
    results_bytes: usize,
    /// Results not kept (their frames would pass the bound).
    results_dropped: u64,
    /// The main result is among those kept.
    main_kept: bool,
    error: Option<JsonValue>,
    execution_count: Option<JsonValue>,
    ended: bool,
    /// Lines that were not JSON objects (shown, never silently dropped).
    unparsed: Kept,
    /// The frame arriving (bytes after the last newline).
    pending: Vec<u8>,
    /// The frame arriving passed the limit: its bytes are skipped up to its newline.
    skipping: bool,
    /// Frames longer than the limit, not read, and their bytes.
    frames_dropped: u64,
    frame_bytes_dropped: u64,
}

/// Text kept up to a bound, in the pieces it came in; the rest counted in bytes.
#[derive(Debug, Default)]
struct Kept {
    pieces: Vec<String>,
    bytes: usize,
    dropped: u64,
}

impl Kept {
    fn push(&mut self, text: String, cap: usize) {
        let room = cap.saturating_sub(self.bytes);
        if text.len() <= room {
            self.bytes += text.len();
            self.pieces.push(text);
            return;
        }
        let mut at = room;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        self.dropped += (text.len() - at) as u64;
        if at > 0 {
            self.bytes += at;
            self.pieces.push(text[..at].to_string());
        }
    }
}

impl Execution {
    pub(crate) fn new(max_output: usize) -> Self {
        Execution {
            cap: max_output,
            stdout: Kept::default(),
            stderr: Kept::default(),
            results: Vec::new(),
            results_bytes: 0,
            results_dropped: 0,
            main_kept: false,
            error: None,
            execution_count: None,
            ended: false,
            unparsed: Kept::default(),
            pending: Vec::new(),
            skipping: false,
            frames_dropped: 0,
            frame_bytes_dropped: 0,
        }
    }

    /// The longest frame read: twice `--max-output` (a frame's text may be escaped) and
    /// 64 KiB for its JSON around it. A longer one is skipped to its newline and counted.
    fn frame_limit(&self) -> usize {
        self.cap.saturating_mul(2).saturating_add(64 * 1024)
    }

    /// Bytes of the stream as they arrive: each complete line is read as a frame.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            let newline = chunk.iter().position(|b| *b == b'\n');
            let (part, rest) = match newline {
                Some(n) => (&chunk[..n], &chunk[n + 1..]),
                None => (chunk, &[][..]),
            };
            chunk = rest;
            if self.skipping {
                self.frame_bytes_dropped += part.len() as u64;
            } else if self.pending.len() + part.len() > self.frame_limit() {
                self.frames_dropped += 1;
                self.frame_bytes_dropped += (self.pending.len() + part.len()) as u64;
                self.pending = Vec::new();
                self.skipping = true;
            } else {
                self.pending.extend_from_slice(part);
            }
            if newline.is_some() {
                if !self.skipping {
                    let line = std::mem::take(&mut self.pending);
                    self.line(&line);
                }
                self.skipping = false;
            }
        }
    }

    /// The stream ended: a last frame without its newline is read too.
    pub(crate) fn finish(&mut self) {
        if !self.skipping && !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.line(&line);
        }
    }

    pub(crate) fn line(&mut self, raw: &[u8]) {
        let text = String::from_utf8_lossy(raw);
        let text = text.trim();
        if text.is_empty() {
            return;
        }
        let Ok(JsonValue::Object(mut m)) = serde_json::from_str::<JsonValue>(text) else {
            self.unparsed.push(text.to_string(), self.cap);
            return;
        };
        let kind = m.remove("type").and_then(|t| t.as_str().map(str::to_string)).unwrap_or_default();
        let text_of = |m: &serde_json::Map<String, JsonValue>| m.get("text").map(super::text).unwrap_or_default();
        match kind.as_str() {
            "stdout" => self.stdout.push(text_of(&m), self.cap),
            "stderr" => self.stderr.push(text_of(&m), self.cap),
            "result" => {
                // The cell's value (the main result) has a place of its own: a flood of
                // display calls before it does not push out `text`.
                let main = m.get("is_main_result") == Some(&JsonValue::Bool(true)) && !self.main_kept;
                let fits = self.results_bytes + text.len() <= self.cap;
                let kept = fits || (main && text.len() <= self.cap);
                if !kept {
                    self.results_dropped += 1;
                    return;
                }
                self.main_kept |= main;
                if fits {
                    self.results_bytes += text.len();
                }
                let mut formats: Vec<JsonValue> =
                    FORMATS.iter().filter(|f| m.get(**f).is_some_and(truthy)).map(|f| json!(f)).collect();
                if let Some(JsonValue::Object(extra)) = m.get("extra") {
                    formats.extend(extra.keys().map(|k| json!(k)));
                }
                m.insert("formats".into(), JsonValue::Array(formats));
                m.entry("is_main_result").or_insert(json!(false));
                self.results.push(JsonValue::Object(m));
            }
            "error" => {
                self.error = Some(json!({
                    "name": m.get("name").cloned().unwrap_or(JsonValue::Null),
                    "value": m.get("value").cloned().unwrap_or(JsonValue::Null),
                    "traceback": m.get("traceback").cloned().unwrap_or(JsonValue::Null),
                }))
            }
            "number_of_executions" => self.execution_count = m.get("execution_count").cloned(),
            "end_of_execution" => self.ended = true,
            // keepalive, and whatever a newer interpreter adds: the SDKs skip them too.
            _ => {}
        }
    }

    pub(crate) fn outputs(&self, context: Option<&str>, took: Duration) -> JsonValue {
        let text = self
            .results
            .iter()
            .find(|r| r["is_main_result"] == json!(true))
            .and_then(|r| r.get("text").cloned())
            .unwrap_or(JsonValue::Null);
        let mut out = json!({
            "stdout": self.stdout.pieces.concat(),
            "stderr": self.stderr.pieces.concat(),
            "logs": { "stdout": self.stdout.pieces, "stderr": self.stderr.pieces },
            "results": self.results,
            "text": text,
            "error": self.error,
            "execution_count": self.execution_count,
            "context": context,
            "timed_out": false,
            "duration_ms": took.as_millis() as u64,
            "stdout_dropped": self.stdout.dropped,
            "stderr_dropped": self.stderr.dropped,
            "results_dropped": self.results_dropped,
            "frames_dropped": self.frames_dropped,
        });
        if !self.unparsed.pieces.is_empty() || self.unparsed.dropped > 0 {
            out["unparsed"] = json!(self.unparsed.pieces);
        }
        out["cut"] = json!(self.cut());
        out
    }

    /// What was not kept, in words, when anything: `stdout: 1 KiB kept, 3.9 KiB dropped; …;
    /// raise --max-output`.
    fn cut(&self) -> Option<String> {
        let size = |n: u64| crate::size::human(n);
        let mut parts = Vec::new();
        for (name, k) in [("stdout", &self.stdout), ("stderr", &self.stderr), ("unparsed lines", &self.unparsed)] {
            if k.dropped > 0 {
                parts.push(format!("{name}: {} kept, {} dropped", size(k.bytes as u64), size(k.dropped)));
            }
        }
        if self.results_dropped > 0 {
            parts.push(format!("results: {} kept, {} dropped", self.results.len(), self.results_dropped));
        }
        if self.frames_dropped > 0 {
            parts.push(format!(
                "{} frame{} longer than {} skipped ({})",
                self.frames_dropped,
                if self.frames_dropped == 1 { "" } else { "s" },
                size(self.frame_limit() as u64),
                size(self.frame_bytes_dropped)
            ));
        }
        (!parts.is_empty()).then(|| {
            format!(
                "the code interpreter's answer passed --max-output ({}): {}; raise --max-output",
                size(self.cap as u64),
                parts.join("; ")
            )
        })
    }
}

/// A value the SDKs count as present (`if self.png:`): not null, empty or false.
fn truthy(v: &JsonValue) -> bool {
    match v {
        JsonValue::Null | JsonValue::Bool(false) => false,
        JsonValue::String(s) => !s.is_empty(),
        JsonValue::Array(a) => !a.is_empty(),
        JsonValue::Object(o) => !o.is_empty(),
        _ => true,
    }
}

async fn run_with_driver(ctx: &mut StepCtx, a: &Args) -> StepResult {
    let code = a.str("code");
    let lang = a.opt_str("language").unwrap_or("python");
    if lang != "python" {
        return Err(StepError::bad_args(format!("language `{lang}` is not supported: use python")));
    }
    let id = ctx.sandbox_id()?;
    let n = crate::random::hex(8);
    let dir = "/tmp/.scenario-run";
    let (driver, cell, result) =
        (format!("{dir}/driver.py"), format!("{dir}/cell-{n}.py"), format!("{dir}/result-{n}.json"));
    ctx.provider.sandbox(&id).write_file(&driver, DRIVER.as_bytes().to_vec(), None).await?;
    ctx.provider.sandbox(&id).write_file(&cell, code.as_bytes().to_vec(), None).await?;
    let req = ExecRequest {
        cmd: format!("python3 {driver} {cell} {result}"),
        timeout: Some(a.duration("timeout").unwrap_or(ctx.exec_timeout)),
        max_output: Some(ctx.max_output),
        ..Default::default()
    };
    let started = Instant::now();
    let r = ctx.provider.sandbox(&id).exec(req, None).await?;
    let mut outputs = exec_outputs(&r, started.elapsed());
    if r.timed_out {
        return Err(StepError::timeout("code timed out").with_outputs(outputs));
    }
    let parsed: JsonValue = match ctx.provider.sandbox(&id).read_file(&result).await {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| StepError::error(format!("driver wrote bad JSON: {e}")))?
        }
        Err(_) => {
            let how = match (r.exit_code, r.signal) {
                (Some(code), _) => format!("exit {code}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                (None, None) => "no exit code".into(),
            };
            let stderr = super::lossy(&r.stderr);
            let mut msg = format!("python3 did not run the code ({how})");
            if !stderr.trim().is_empty() {
                msg.push_str(&format!(": {}", stderr.trim()));
            }
            return Err(StepError::error(msg).with_outputs(outputs));
        }
    };
    let _ = ctx.provider.sandbox(&id).remove(&cell).await;
    let _ = ctx.provider.sandbox(&id).remove(&result).await;
    let results = parsed.get("results").cloned().unwrap_or(json!([]));
    let text =
        results.as_array().and_then(|r| r.last()).and_then(|r| r.get("text")).cloned().unwrap_or(JsonValue::Null);
    let obj = outputs.as_object_mut().expect("exec outputs are an object");
    let logs = json!({ "stdout": lines(&obj["stdout"]), "stderr": lines(&obj["stderr"]) });
    obj.insert("logs".into(), logs);
    obj.insert("results".into(), results);
    obj.insert("text".into(), text);
    obj.insert("error".into(), parsed.get("error").cloned().unwrap_or(JsonValue::Null));
    // The streams were bounded by the command's own --max-output; the driver's results file
    // holds one value.
    let cut = match (r.stdout_dropped, r.stderr_dropped) {
        (0, 0) => JsonValue::Null,
        (o, e) => json!(format!(
            "the code's output passed --max-output ({}): stdout {} dropped, stderr {} dropped; raise --max-output",
            crate::size::human(ctx.max_output as u64),
            crate::size::human(o),
            crate::size::human(e)
        )),
    };
    obj.insert("results_dropped".into(), json!(0));
    obj.insert("frames_dropped".into(), json!(0));
    obj.insert("cut".into(), cut);
    Ok(outputs)
}

/// Output as lines, each with its newline, as the interpreter streams it.
fn lines(v: &JsonValue) -> Vec<String> {
    v.as_str().unwrap_or_default().split_inclusive('\n').map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_becomes_the_sdks_execution() {
        let mut e = Execution::new(crate::provider::MAX_OUTPUT);
        for l in [
            r#"{"type": "number_of_executions", "execution_count": 3}"#,
            r#"{"type": "stdout", "text": "a\n", "timestamp": "t"}"#,
            r#"{"type": "keepalive"}"#,
            r#"{"type": "stdout", "text": "b\n", "timestamp": "t"}"#,
            r#"{"type": "stderr", "text": "w\n", "timestamp": "t"}"#,
            r#"{"type": "result", "text": "<Figure>", "png": "iVBO", "chart": {"type": "bar"}, "is_main_result": false}"#,
            r#"{"type": "result", "text": "2", "extra": {"application/x-thing": 1}, "is_main_result": true}"#,
            r#"{"type": "error", "name": "E", "value": "v", "traceback": "tb"}"#,
            "not json",
            r#"{"type": "end_of_execution"}"#,
        ] {
            e.line(l.as_bytes());
        }
        assert!(e.ended);
        let o = e.outputs(Some("c1"), Duration::from_millis(5));
        assert_eq!(o["stdout"], "a\nb\n");
        assert_eq!(o["logs"], json!({ "stdout": ["a\n", "b\n"], "stderr": ["w\n"] }));
        assert_eq!(o["execution_count"], 3);
        assert_eq!(o["text"], "2", "the main result's text");
        assert_eq!(o["results"][0]["formats"], json!(["text", "png", "chart"]));
        assert_eq!(o["results"][1]["formats"], json!(["text", "application/x-thing"]));
        assert_eq!(o["error"], json!({ "name": "E", "value": "v", "traceback": "tb" }));
        assert_eq!(o["context"], "c1");
        assert_eq!(o["unparsed"], json!(["not json"]));
    }

    /// Issue 36 item 3: the stream was kept whole (a printing loop grew the runner past 8 GB).
    /// Fed as the interpreter sends it, in chunks that split frames, the collector keeps
    /// `max_output` of each part, counts the rest, skips an overlong frame unread, and still
    /// reads what follows it (the main result, the end).
    #[test]
    fn the_stream_is_bounded_by_max_output_and_says_what_it_dropped() {
        let cap = 1000;
        let mut e = Execution::new(cap);
        let mut stream = Vec::new();
        for i in 0..500 {
            stream.extend_from_slice(format!("{{\"type\": \"stdout\", \"text\": \"line {i:04}\\n\"}}\n").as_bytes());
            stream.extend_from_slice(b"{\"type\": \"stderr\", \"text\": \"e\"}\n");
            stream.extend_from_slice(
                format!("{{\"type\": \"result\", \"text\": \"{i}\", \"is_main_result\": false}}\n").as_bytes(),
            );
            stream.extend_from_slice(b"not json at all\n");
        }
        // A frame far past the limit, without JSON structure the collector would need.
        stream.extend_from_slice(&vec![b'x'; 100 * cap]);
        stream.push(b'\n');
        stream.extend_from_slice(b"{\"type\": \"result\", \"text\": \"42\", \"is_main_result\": true}\n");
        stream.extend_from_slice(b"{\"type\": \"end_of_execution\"}");
        for chunk in stream.chunks(777) {
            e.feed(chunk);
            assert!(e.pending.len() <= e.frame_limit(), "the frame arriving is bounded too");
        }
        e.finish();
        assert!(e.ended, "the end after the skipped frame is read");
        let o = e.outputs(None, Duration::ZERO);
        let stdout = o["stdout"].as_str().unwrap();
        assert_eq!(stdout.len(), cap, "the first max_output bytes of stdout");
        assert!(stdout.starts_with("line 0000\nline 0001\n"), "{stdout}");
        assert_eq!(o["stdout_dropped"], 500 * 10 - cap as u64);
        assert_eq!(o["stderr"].as_str().unwrap().len(), 500.min(cap));
        assert_eq!(o["stderr_dropped"], 0);
        let results = o["results"].as_array().unwrap();
        let kept_bytes: usize = results.iter().map(|r| r.to_string().len()).sum();
        assert!(kept_bytes <= 2 * cap, "results are bounded: {kept_bytes} bytes");
        assert_eq!(o["results_dropped"].as_u64().unwrap() as usize, 500 - (results.len() - 1));
        assert_eq!(o["text"], "42", "the main result keeps its place");
        assert_eq!(o["frames_dropped"], 1);
        assert!(o["unparsed"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().len()).sum::<usize>() <= cap);
        let cut = o["cut"].as_str().unwrap();
        assert!(cut.contains("stdout: 1000 B kept") && cut.contains("raise --max-output"), "{cut}");
        assert!(cut.contains("1 frame longer than"), "{cut}");
        // Nothing past the bound: `cut` is null and nothing is counted.
        let mut small = Execution::new(cap);
        small.feed(b"{\"type\": \"stdout\", \"text\": \"hi\"}\n{\"type\": \"end_of_execution\"}\n");
        let o = small.outputs(None, Duration::ZERO);
        assert_eq!(
            (o["cut"].clone(), o["stdout_dropped"].clone(), o["frames_dropped"].clone()),
            (JsonValue::Null, json!(0), json!(0))
        );
    }
}

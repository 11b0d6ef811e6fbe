//! A scripted model endpoint, so agent CLIs can run a whole turn without a model or a key.
//!
//! It speaks the three wire shapes the agent CLIs use: OpenAI Chat Completions
//! (`POST …/chat/completions`), OpenAI Responses (`POST …/responses`) and Anthropic Messages
//! (`POST …/messages`, plus `…/messages/count_tokens`), each whole or streamed (server-sent
//! events, as the real APIs send them), and lists one model (`GET …/models`, `…/models/<id>`). What it answers
//! is decided by the conversation alone, so any number of side requests a CLI makes (titles,
//! summaries, probes) get sensible answers:
//!
//! * a request that offers tools and holds no tool result yet gets **one tool call** that
//!   writes the scripted file: the CLI's own file-writing tool when it offers one (a tool
//!   named like `write`/`create` with a path and a content parameter: Claude Code's `Write`,
//!   Qwen Code's `write_file`, …), else its shell tool (`shell`, `exec_command`, `Bash`,
//!   `run_shell_command`, `terminal`, … with a command parameter) running `printf … > path`,
//!   else Codex's `apply_patch` (a patch adding the file);
//! * any other request (a tool result is back, or no tools) gets the scripted final text.
//!
//! So the agent really carries out the call with its own tool, and the file it writes proves
//! the turn went through. `GET /_log` lists every request (API, model, whether it streamed,
//! the tools offered, what was answered), for a scenario to check what the CLI sent.
//!
//! It listens on the host's loopback; `ExposeHost::expose_host` makes it reachable inside a
//! sandbox. The server stops when the [`ScriptedModel`] is dropped (the scenario's end).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use serde_json::{json, Map, Value as JsonValue};
use tokio_util::sync::CancellationToken;

/// What the model does: write `content` to `path` with a tool, then answer `reply`.
#[derive(Debug, Clone)]
pub struct Script {
    pub path: String,
    pub content: String,
    pub reply: String,
    /// The model name it reports (any name a CLI is given is accepted).
    pub model: String,
}

/// A running endpoint; stops when dropped.
#[derive(Debug)]
pub struct ScriptedModel {
    addr: SocketAddr,
    state: Arc<Shared>,
    stop: CancellationToken,
}

impl Drop for ScriptedModel {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[derive(Debug)]
struct Shared {
    script: Script,
    log: Mutex<Vec<JsonValue>>,
    ids: AtomicU64,
}

impl Shared {
    fn id(&self, prefix: &str) -> String {
        format!("{prefix}_{:06}", self.ids.fetch_add(1, Ordering::SeqCst) + 1)
    }
}

impl ScriptedModel {
    /// Starts the endpoint on `127.0.0.1:<ephemeral>`.
    pub async fn start(script: Script) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Shared { script, log: Mutex::new(Vec::new()), ids: AtomicU64::new(0) });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone())
            // Agent CLIs send their whole system prompt and tool schemas every time.
            .layer(DefaultBodyLimit::max(64 << 20));
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move { s.cancelled().await }).await;
        });
        Ok(Self { addr, state, stop })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request so far (what `GET /_log` answers).
    pub fn log(&self) -> JsonValue {
        log_doc(&self.state)
    }
}

fn log_doc(state: &Shared) -> JsonValue {
    let requests = state.log.lock().expect("log").clone();
    let count =
        |what: &str| requests.iter().filter(|r| r["answer"].as_str().is_some_and(|a| a.starts_with(what))).count();
    json!({ "tool_calls": count("tool_call"), "texts": count("text"), "requests": requests })
}

/// The wire shape of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Chat,
    Responses,
    Messages,
}

impl Api {
    fn name(self) -> &'static str {
        match self {
            Api::Chat => "openai-chat",
            Api::Responses => "openai-responses",
            Api::Messages => "anthropic-messages",
        }
    }
}

/// A tool a request offers.
#[derive(Debug, Clone)]
struct Tool {
    name: String,
    /// JSON Schema of its arguments (`{}` when it has none).
    params: JsonValue,
    kind: ToolKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolKind {
    Function,
    /// A Responses-API `custom` tool: free-form text input (Codex's `apply_patch`).
    Custom,
    /// The Responses API's built-in `local_shell`.
    LocalShell,
}

/// What the model answers.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Call { name: String, input: CallInput },
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
enum CallInput {
    Arguments(JsonValue),
    Custom(String),
    LocalShell(Vec<String>),
}

async fn handle(State(state): State<Arc<Shared>>, method: Method, uri: Uri, body: Bytes) -> Response {
    let path = uri.path().trim_end_matches('/').to_string();
    let req: JsonValue = serde_json::from_slice(&body).unwrap_or(JsonValue::Null);
    if method == Method::GET && path == "/_log" {
        return json_response(StatusCode::OK, &log_doc(&state));
    }
    if method == Method::GET && path.rsplit_once("/models/").is_some_and(|(_, id)| !id.contains('/')) {
        let id = path.rsplit_once("/models/").map(|(_, id)| id).unwrap_or_default();
        let doc = json!({ "id": id, "object": "model", "type": "model", "created": 0, "owned_by": "scenario-run",
            "display_name": id, "created_at": "2025-01-01T00:00:00Z" });
        return json_response(StatusCode::OK, &doc);
    }
    if method == Method::GET && path.ends_with("/models") {
        let m = &state.script.model;
        let doc = json!({ "object": "list", "has_more": false, "first_id": m, "last_id": m, "data": [{
            "id": m, "object": "model", "type": "model", "created": 0, "owned_by": "scenario-run",
            "display_name": m, "created_at": "2025-01-01T00:00:00Z" }] });
        return json_response(StatusCode::OK, &doc);
    }
    if method == Method::POST && path.ends_with("/messages/count_tokens") {
        return json_response(StatusCode::OK, &json!({ "input_tokens": approx_tokens(&body) }));
    }
    let api = match (&method, path.as_str()) {
        (&Method::POST, p) if p.ends_with("/chat/completions") => Api::Chat,
        (&Method::POST, p) if p.ends_with("/responses") => Api::Responses,
        (&Method::POST, p) if p.ends_with("/messages") => Api::Messages,
        _ => {
            state.log.lock().expect("log").push(json!({ "method": method.as_str(), "path": path, "answer": "404" }));
            let e = json!({ "error": { "type": "not_found_error", "message": format!("{method} {path}: not served by the scripted model") } });
            return json_response(StatusCode::NOT_FOUND, &e);
        }
    };
    let tools = tools_of(api, &req);
    let answer = answer(&state.script, &tools, has_tool_result(api, &req));
    let stream = req["stream"].as_bool().unwrap_or(false);
    state.log.lock().expect("log").push(json!({
        "api": api.name(),
        "path": path,
        "model": req["model"],
        "stream": stream,
        "tools": tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        "tool_result_seen": has_tool_result(api, &req),
        "answer": match &answer {
            Answer::Call { name, .. } => format!("tool_call {name}"),
            Answer::Text(_) => "text".to_string(),
        },
    }));
    let model = req["model"].as_str().map_or_else(|| state.script.model.clone(), str::to_string);
    let input_tokens = approx_tokens(&body);
    match (api, stream) {
        (Api::Chat, false) => json_response(StatusCode::OK, &chat(&state, &model, &answer, input_tokens)),
        (Api::Chat, true) => sse(chat_events(&state, &model, &answer, input_tokens, &req)),
        (Api::Responses, false) => json_response(StatusCode::OK, &responses(&state, &model, &answer, input_tokens).0),
        (Api::Responses, true) => sse(responses_events(&state, &model, &answer, input_tokens)),
        (Api::Messages, false) => json_response(StatusCode::OK, &messages(&state, &model, &answer, input_tokens)),
        (Api::Messages, true) => sse(messages_events(&state, &model, &answer, input_tokens)),
    }
}

fn approx_tokens(body: &[u8]) -> u64 {
    (body.len() as u64 / 4).max(1)
}

fn json_response(status: StatusCode, doc: &JsonValue) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Body::from(doc.to_string()))
        .expect("static response")
}

/// Server-sent events: `(event name or none, data)` pairs, then the body ends.
fn sse(events: Vec<(Option<String>, String)>) -> Response {
    let mut body = String::new();
    for (event, data) in events {
        if let Some(e) = event {
            body.push_str(&format!("event: {e}\n"));
        }
        body.push_str(&format!("data: {data}\n\n"));
    }
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from(body))
        .expect("static response")
}

// ---- reading requests ----------------------------------------------------------------------

fn tools_of(api: Api, req: &JsonValue) -> Vec<Tool> {
    let list = req["tools"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for t in &list {
        let tool = match api {
            Api::Chat => {
                let f = if t["function"].is_object() { &t["function"] } else { t };
                f["name"].as_str().map(|n| Tool {
                    name: n.into(),
                    params: f["parameters"].clone(),
                    kind: ToolKind::Function,
                })
            }
            Api::Responses => match t["type"].as_str() {
                Some("function") => t["name"].as_str().map(|n| Tool {
                    name: n.into(),
                    params: t["parameters"].clone(),
                    kind: ToolKind::Function,
                }),
                Some("custom") => {
                    t["name"].as_str().map(|n| Tool { name: n.into(), params: JsonValue::Null, kind: ToolKind::Custom })
                }
                Some("local_shell") => {
                    Some(Tool { name: "local_shell".into(), params: JsonValue::Null, kind: ToolKind::LocalShell })
                }
                _ => None,
            },
            Api::Messages => t["name"].as_str().map(|n| Tool {
                name: n.into(),
                params: t["input_schema"].clone(),
                kind: ToolKind::Function,
            }),
        };
        out.extend(tool);
    }
    out
}

fn has_tool_result(api: Api, req: &JsonValue) -> bool {
    match api {
        Api::Chat => req["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| matches!(m["role"].as_str(), Some("tool" | "function")))),
        Api::Responses => req["input"]
            .as_array()
            .is_some_and(|items| items.iter().any(|i| i["type"].as_str().is_some_and(|t| t.ends_with("_call_output")))),
        Api::Messages => req["messages"].as_array().is_some_and(|m| {
            m.iter().any(|m| {
                m["content"].as_array().is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
            })
        }),
    }
}

// ---- deciding --------------------------------------------------------------------------------

const PATH_KEYS: &[&str] = &["file_path", "path", "filePath", "filename", "file", "absolute_path", "target_file"];
const CONTENT_KEYS: &[&str] = &["content", "contents", "text", "file_text", "data"];
const COMMAND_KEYS: &[&str] = &["command", "cmd", "script", "commands"];
const SHELL_NAMES: &[&str] = &[
    "shell",
    "bash",
    "exec_command",
    "run_shell_command",
    "shell_command",
    "terminal",
    "run",
    "exec",
    "execute",
    "execute_command",
    "run_command",
    "command",
];

fn props(t: &Tool) -> Option<&Map<String, JsonValue>> {
    t.params["properties"].as_object()
}

fn first_key<'a>(props: &Map<String, JsonValue>, keys: &[&'a str]) -> Option<&'a str> {
    keys.iter().copied().find(|k| props.contains_key(*k))
}

/// The answer to a request offering `tools`: the scripted tool call, or the final text.
fn answer(script: &Script, tools: &[Tool], tool_result_seen: bool) -> Answer {
    if tool_result_seen || tools.is_empty() {
        return Answer::Text(script.reply.clone());
    }
    // 1. The CLI's own file-writing tool.
    for t in tools.iter().filter(|t| t.kind == ToolKind::Function) {
        let lower = t.name.to_ascii_lowercase();
        let Some(p) = props(t) else { continue };
        if !(lower.contains("write") || lower.contains("create")) || lower.contains("todo") {
            continue;
        }
        if let (Some(pk), Some(ck)) = (first_key(p, PATH_KEYS), first_key(p, CONTENT_KEYS)) {
            let mut args = Map::new();
            args.insert(pk.into(), JsonValue::String(script.path.clone()));
            args.insert(ck.into(), JsonValue::String(script.content.clone()));
            fill_required(t, &mut args);
            return Answer::Call { name: t.name.clone(), input: CallInput::Arguments(JsonValue::Object(args)) };
        }
    }
    // 2. Its shell.
    let line = shell_line(&script.path, &script.content);
    for t in tools {
        match t.kind {
            ToolKind::LocalShell => {
                return Answer::Call {
                    name: t.name.clone(),
                    input: CallInput::LocalShell(vec!["bash".into(), "-lc".into(), line]),
                };
            }
            ToolKind::Function if SHELL_NAMES.contains(&t.name.to_ascii_lowercase().as_str()) => {
                let Some(p) = props(t) else { continue };
                let Some(ck) = first_key(p, COMMAND_KEYS) else { continue };
                let value = if p[ck]["type"] == "array" {
                    json!(["bash", "-lc", line])
                } else {
                    JsonValue::String(line.clone())
                };
                let mut args = Map::new();
                args.insert(ck.into(), value);
                fill_required(t, &mut args);
                return Answer::Call { name: t.name.clone(), input: CallInput::Arguments(JsonValue::Object(args)) };
            }
            _ => {}
        }
    }
    // 3. Codex's apply_patch.
    if let Some(t) = tools.iter().find(|t| t.name == "apply_patch") {
        let added: String = script.content.lines().map(|l| format!("+{l}\n")).collect();
        let patch = format!("*** Begin Patch\n*** Add File: {}\n{added}*** End Patch\n", script.path);
        let input = match t.kind {
            ToolKind::Custom => CallInput::Custom(patch),
            _ => CallInput::Arguments(json!({ "input": patch })),
        };
        return Answer::Call { name: t.name.clone(), input };
    }
    Answer::Text(script.reply.clone())
}

/// Values for required parameters the script does not set, so the call is valid.
fn fill_required(t: &Tool, args: &mut Map<String, JsonValue>) {
    let Some(p) = props(t) else { return };
    for name in t.params["required"].as_array().into_iter().flatten().filter_map(JsonValue::as_str) {
        if args.contains_key(name) {
            continue;
        }
        let v = match p.get(name).and_then(|s| s["type"].as_str()) {
            Some("boolean") => JsonValue::Bool(false),
            Some("integer" | "number") => json!(0),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ if name == "description" => JsonValue::String("write the file the task asks for".into()),
            _ => JsonValue::String(String::new()),
        };
        args.insert(name.into(), v);
    }
}

/// `mkdir -p <dir> && printf '%s' <content> > <path>`, quoted for a POSIX shell.
fn shell_line(path: &str, content: &str) -> String {
    let q = crate::templates::dockerfile::shell_quote;
    let dir = std::path::Path::new(path).parent().map(|d| d.display().to_string()).unwrap_or_else(|| ".".into());
    format!("mkdir -p {} && printf '%s' {} > {}", q(&dir), q(content), q(path))
}

fn arguments_text(input: &CallInput) -> String {
    match input {
        CallInput::Arguments(a) => a.to_string(),
        CallInput::Custom(s) => s.clone(),
        CallInput::LocalShell(argv) => json!({ "command": argv }).to_string(),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

// ---- OpenAI Chat Completions ----------------------------------------------------------------

fn chat(state: &Shared, model: &str, a: &Answer, input_tokens: u64) -> JsonValue {
    let (message, finish) = match a {
        Answer::Call { name, input } => (
            json!({ "role": "assistant", "content": null, "tool_calls": [{
                "id": state.id("call"), "type": "function",
                "function": { "name": name, "arguments": arguments_text(input) } }] }),
            "tool_calls",
        ),
        Answer::Text(t) => (json!({ "role": "assistant", "content": t }), "stop"),
    };
    json!({
        "id": state.id("chatcmpl"), "object": "chat.completion", "created": now(), "model": model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish, "logprobs": null }],
        "usage": { "prompt_tokens": input_tokens, "completion_tokens": 20, "total_tokens": input_tokens + 20 },
    })
}

fn chat_events(
    state: &Shared,
    model: &str,
    a: &Answer,
    input_tokens: u64,
    req: &JsonValue,
) -> Vec<(Option<String>, String)> {
    let (id, created) = (state.id("chatcmpl"), now());
    let chunk = |delta: JsonValue, finish: JsonValue| {
        json!({ "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish, "logprobs": null }] })
        .to_string()
    };
    let mut out = Vec::new();
    match a {
        Answer::Call { name, input } => {
            let call_id = state.id("call");
            out.push(chunk(
                json!({ "role": "assistant", "content": null, "tool_calls": [{ "index": 0, "id": call_id,
                    "type": "function", "function": { "name": name, "arguments": "" } }] }),
                JsonValue::Null,
            ));
            out.push(chunk(
                json!({ "tool_calls": [{ "index": 0, "function": { "arguments": arguments_text(input) } }] }),
                JsonValue::Null,
            ));
            out.push(chunk(json!({}), json!("tool_calls")));
        }
        Answer::Text(t) => {
            out.push(chunk(json!({ "role": "assistant", "content": "" }), JsonValue::Null));
            out.push(chunk(json!({ "content": t }), JsonValue::Null));
            out.push(chunk(json!({}), json!("stop")));
        }
    }
    if req["stream_options"]["include_usage"].as_bool().unwrap_or(false) {
        out.push(
            json!({ "id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                "usage": { "prompt_tokens": input_tokens, "completion_tokens": 20, "total_tokens": input_tokens + 20 } })
            .to_string(),
        );
    }
    out.push("[DONE]".to_string());
    out.into_iter().map(|d| (None, d)).collect()
}

// ---- OpenAI Responses ------------------------------------------------------------------------

/// The whole response, and its one output item.
fn responses(state: &Shared, model: &str, a: &Answer, input_tokens: u64) -> (JsonValue, JsonValue) {
    let item = match a {
        Answer::Call { name, input: CallInput::Custom(text) } => json!({
            "type": "custom_tool_call", "id": state.id("ctc"), "call_id": state.id("call"),
            "name": name, "input": text, "status": "completed" }),
        Answer::Call { input: CallInput::LocalShell(argv), .. } => json!({
            "type": "local_shell_call", "id": state.id("lsh"), "call_id": state.id("call"), "status": "completed",
            "action": { "type": "exec", "command": argv, "env": {}, "timeout_ms": 60000 } }),
        Answer::Call { name, input } => json!({
            "type": "function_call", "id": state.id("fc"), "call_id": state.id("call"),
            "name": name, "arguments": arguments_text(input), "status": "completed" }),
        Answer::Text(t) => json!({
            "type": "message", "id": state.id("msg"), "role": "assistant", "status": "completed",
            "content": [{ "type": "output_text", "text": t, "annotations": [] }] }),
    };
    let doc = json!({
        "id": state.id("resp"), "object": "response", "created_at": now(), "status": "completed",
        "model": model, "output": [item], "parallel_tool_calls": false, "error": null,
        "incomplete_details": null,
        "usage": { "input_tokens": input_tokens, "output_tokens": 20, "total_tokens": input_tokens + 20,
            "input_tokens_details": { "cached_tokens": 0 }, "output_tokens_details": { "reasoning_tokens": 0 } },
    });
    (doc, item)
}

fn responses_events(state: &Shared, model: &str, a: &Answer, input_tokens: u64) -> Vec<(Option<String>, String)> {
    let (done, item) = responses(state, model, a, input_tokens);
    let mut started = done.clone();
    started["status"] = json!("in_progress");
    started["output"] = json!([]);
    started["usage"] = JsonValue::Null;
    let mut pending = item.clone();
    pending["status"] = json!("in_progress");
    let item_id = item["id"].clone();
    let mut events = vec![
        json!({ "type": "response.created", "response": started }),
        json!({ "type": "response.in_progress", "response": started }),
    ];
    match item["type"].as_str() {
        Some("message") => {
            let text = item["content"][0]["text"].clone();
            pending["content"] = json!([]);
            let part = json!({ "type": "output_text", "text": "", "annotations": [] });
            events.push(json!({ "type": "response.output_item.added", "output_index": 0, "item": pending }));
            events.push(json!({ "type": "response.content_part.added", "item_id": item_id, "output_index": 0,
                "content_index": 0, "part": part }));
            events.push(json!({ "type": "response.output_text.delta", "item_id": item_id, "output_index": 0,
                "content_index": 0, "delta": text }));
            events.push(json!({ "type": "response.output_text.done", "item_id": item_id, "output_index": 0,
                "content_index": 0, "text": text }));
            events.push(json!({ "type": "response.content_part.done", "item_id": item_id, "output_index": 0,
                "content_index": 0, "part": item["content"][0] }));
        }
        Some(kind @ ("function_call" | "custom_tool_call")) => {
            // A call's text (a function's `arguments`, a custom tool's `input`) in one delta.
            let (field, stream) = match kind {
                "function_call" => ("arguments", "response.function_call_arguments"),
                _ => ("input", "response.custom_tool_call_input"),
            };
            pending[field] = json!("");
            events.push(json!({ "type": "response.output_item.added", "output_index": 0, "item": pending }));
            events.push(json!({ "type": format!("{stream}.delta"), "item_id": item_id,
                "output_index": 0, "delta": item[field] }));
            let mut finished = json!({ "type": format!("{stream}.done"), "item_id": item_id, "output_index": 0 });
            finished[field] = item[field].clone();
            events.push(finished);
        }
        _ => events.push(json!({ "type": "response.output_item.added", "output_index": 0, "item": pending })),
    }
    events.push(json!({ "type": "response.output_item.done", "output_index": 0, "item": item }));
    events.push(json!({ "type": "response.completed", "response": done }));
    events
        .into_iter()
        .enumerate()
        .map(|(n, mut e)| {
            e["sequence_number"] = json!(n);
            (e["type"].as_str().map(str::to_string), e.to_string())
        })
        .collect()
}

// ---- Anthropic Messages ----------------------------------------------------------------------

fn messages(state: &Shared, model: &str, a: &Answer, input_tokens: u64) -> JsonValue {
    let (block, stop) = message_block(state, a);
    json!({
        "id": state.id("msg"), "type": "message", "role": "assistant", "model": model,
        "content": [block], "stop_reason": stop, "stop_sequence": null,
        "usage": { "input_tokens": input_tokens, "output_tokens": 20,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0 },
    })
}

fn message_block(state: &Shared, a: &Answer) -> (JsonValue, &'static str) {
    match a {
        Answer::Call { name, input } => {
            let input = match input {
                CallInput::Arguments(args) => args.clone(),
                other => json!({ "input": arguments_text(other) }),
            };
            (json!({ "type": "tool_use", "id": state.id("toolu"), "name": name, "input": input }), "tool_use")
        }
        Answer::Text(t) => (json!({ "type": "text", "text": t }), "end_turn"),
    }
}

fn messages_events(state: &Shared, model: &str, a: &Answer, input_tokens: u64) -> Vec<(Option<String>, String)> {
    let (block, stop) = message_block(state, a);
    let (start_block, delta) = if block["type"] == "tool_use" {
        let mut b = block.clone();
        b["input"] = json!({});
        (b, json!({ "type": "input_json_delta", "partial_json": block["input"].to_string() }))
    } else {
        (json!({ "type": "text", "text": "" }), json!({ "type": "text_delta", "text": block["text"] }))
    };
    let events = [
        json!({ "type": "message_start", "message": {
            "id": state.id("msg"), "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": { "input_tokens": input_tokens, "output_tokens": 1,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0 } } }),
        json!({ "type": "content_block_start", "index": 0, "content_block": start_block }),
        json!({ "type": "content_block_delta", "index": 0, "delta": delta }),
        json!({ "type": "content_block_stop", "index": 0 }),
        json!({ "type": "message_delta", "delta": { "stop_reason": stop, "stop_sequence": null },
            "usage": { "output_tokens": 20 } }),
        json!({ "type": "message_stop" }),
    ];
    events.into_iter().map(|e| (e["type"].as_str().map(str::to_string), e.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> Script {
        Script {
            path: "/home/user/workspace/hello.txt".into(),
            content: "hello it's me".into(),
            reply: "done".into(),
            model: "scripted".into(),
        }
    }

    fn tool(name: &str, params: JsonValue) -> Tool {
        Tool { name: name.into(), params, kind: ToolKind::Function }
    }

    #[test]
    fn a_write_tool_wins_over_a_shell() {
        let tools = [
            tool("Bash", json!({ "properties": { "command": { "type": "string" } }, "required": ["command"] })),
            tool(
                "Write",
                json!({ "properties": { "file_path": {"type": "string"}, "content": {"type": "string"} },
                    "required": ["file_path", "content"] }),
            ),
        ];
        let a = answer(&script(), &tools, false);
        assert_eq!(
            a,
            Answer::Call {
                name: "Write".into(),
                input: CallInput::Arguments(
                    json!({ "file_path": "/home/user/workspace/hello.txt", "content": "hello it's me" })
                )
            }
        );
        assert_eq!(answer(&script(), &tools, true), Answer::Text("done".into()), "after the tool result: the reply");
        assert_eq!(answer(&script(), &[], false), Answer::Text("done".into()), "no tools: the reply");
    }

    #[test]
    fn a_shell_gets_a_quoted_printf_as_a_string_or_an_argv() {
        let s = tool(
            "exec_command",
            json!({ "properties": { "cmd": {"type": "string"}, "login": {"type": "boolean"} }, "required": ["cmd", "login"] }),
        );
        let Answer::Call { input: CallInput::Arguments(a), .. } = answer(&script(), &[s], false) else { panic!() };
        assert_eq!(a["login"], false);
        let line = a["cmd"].as_str().unwrap();
        assert_eq!(
            line,
            r#"mkdir -p /home/user/workspace && printf '%s' 'hello it'\''s me' > /home/user/workspace/hello.txt"#
        );
        let out = std::process::Command::new("bash")
            .args(["-c", &line.replace("/home/user/workspace", "/tmp/sm-test")])
            .status();
        assert!(out.unwrap().success());
        assert_eq!(std::fs::read_to_string("/tmp/sm-test/hello.txt").unwrap(), "hello it's me");
        let _ = std::fs::remove_dir_all("/tmp/sm-test");
        let argv = tool("shell", json!({ "properties": { "command": {"type": "array"} } }));
        let Answer::Call { input: CallInput::Arguments(a), .. } = answer(&script(), &[argv], false) else { panic!() };
        assert_eq!(a["command"][0], "bash");
    }

    #[test]
    fn codex_apply_patch_adds_the_file() {
        let t = Tool { name: "apply_patch".into(), params: JsonValue::Null, kind: ToolKind::Custom };
        let a = answer(&script(), &[t], false);
        let Answer::Call { input: CallInput::Custom(p), .. } = a else { panic!("{a:?}") };
        assert_eq!(p, "*** Begin Patch\n*** Add File: /home/user/workspace/hello.txt\n+hello it's me\n*** End Patch\n");
    }

    #[test]
    fn tool_results_are_seen_in_every_shape() {
        assert!(has_tool_result(Api::Chat, &json!({ "messages": [{ "role": "tool", "content": "ok" }] })));
        assert!(!has_tool_result(Api::Chat, &json!({ "messages": [{ "role": "user", "content": "hi" }] })));
        assert!(has_tool_result(
            Api::Responses,
            &json!({ "input": [{ "type": "function_call_output", "output": "" }] })
        ));
        assert!(has_tool_result(Api::Responses, &json!({ "input": [{ "type": "custom_tool_call_output" }] })));
        assert!(!has_tool_result(Api::Responses, &json!({ "input": "hi" })));
        let m = json!({ "messages": [{ "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "x" }] }] });
        assert!(has_tool_result(Api::Messages, &m));
    }

    #[tokio::test]
    async fn it_serves_every_shape_whole_and_streamed() {
        let m = ScriptedModel::start(script()).await.unwrap();
        let http = crate::net::client_builder().no_proxy().build().unwrap();
        let url = |p: &str| format!("http://{}{p}", m.addr());
        let post = |p: &str, body: JsonValue| {
            let req = http.post(url(p)).json(&body);
            async move { req.send().await.unwrap() }
        };
        let write = json!({ "type": "function", "function": { "name": "write_file", "parameters": {
            "properties": { "path": {"type": "string"}, "content": {"type": "string"} } } } });
        let body = json!({ "model": "x", "messages": [{ "role": "user", "content": "go" }], "tools": [write] });
        let r: JsonValue = post("/v1/chat/completions", body).await.json().await.unwrap();
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
        let args: JsonValue = serde_json::from_str(
            r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap(),
        )
        .unwrap();
        assert_eq!(args["path"], "/home/user/workspace/hello.txt");
        let body = json!({ "model": "x", "stream": true, "messages": [{ "role": "tool", "content": "ok" }], "tools": [write] });
        let text = post("/v1/chat/completions", body).await.text().await.unwrap();
        assert!(text.contains(r#""content":"done""#) && text.ends_with("data: [DONE]\n\n"), "{text}");
        let body = json!({ "model": "claude", "stream": true, "messages": [{ "role": "user", "content": "go" }],
            "tools": [{ "name": "Write", "input_schema": { "properties": { "file_path": {}, "content": {} } } }] });
        let text = post("/v1/messages", body).await.text().await.unwrap();
        assert!(text.starts_with("event: message_start\n") && text.contains("input_json_delta"), "{text}");
        let body = json!({ "model": "gpt", "stream": true, "input": [{ "type": "message", "role": "user", "content": "go" }],
            "tools": [{ "type": "function", "name": "shell", "parameters": { "properties": { "command": { "type": "array" } } } }] });
        let text = post("/v1/responses", body).await.text().await.unwrap();
        assert!(
            text.contains("event: response.output_item.done") && text.contains("event: response.completed"),
            "{text}"
        );
        let log: JsonValue = http.get(url("/_log")).send().await.unwrap().json().await.unwrap();
        assert_eq!((log["tool_calls"].as_u64(), log["texts"].as_u64()), (Some(3), Some(1)), "{log}");
        assert_eq!(log["requests"][2]["api"], "anthropic-messages");
    }
}

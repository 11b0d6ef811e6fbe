//! The `opensandbox` provider: a client of OpenSandbox's APIs (alibaba/OpenSandbox `specs/`),
//! for an OpenSandbox server or `scenario-run serve`, which speaks them beside E2B's.
//!
//! * The lifecycle API (`/v1`, key in `OPEN-SANDBOX-API-KEY`): create from an image (a
//!   scenario's template is the image; `base` is `OPENSANDBOX_BASE_IMAGE`, default `base`,
//!   serve's), get, list by metadata, delete, pause, resume, renew-expiration, endpoints,
//!   snapshots (a snapshot this run took is a template: its create names `snapshotId`).
//!   OpenSandbox's shortest timeout is 60 s: a shorter one is created at 60 s and renewed at
//!   once to expire that long after the sandbox's `createdAt` (as a timeout counts from the
//!   create on E2B), or a second from now if the create took longer than that.
//! * execd (port 44772 through the endpoint the lifecycle API names, with the headers it
//!   names): commands, files and directories. execd streams a command's output as lines, so
//!   a command's exact bytes are not in its stream: `exec` sends the command's stdout and
//!   stderr to files in the sandbox (`/tmp/.scenario-run-os/`) and downloads them, and the
//!   exit code comes from the stream's end. Background commands are execd's background
//!   commands, which know no pid: each writes its shell's pid to a file first (then `exec`s
//!   the command, so the pid is the command's), `process-list` reads `/proc` through a
//!   command, `signal` is `kill` through a command, and `wait` polls execd's command status.
//! * Ports: the endpoint of the port, and the headers its answer names.
//!
//! What OpenSandbox's APIs have no counterpart for is left out of the capabilities (steps
//! that need it are SKIPPED with its name): template builds, directory watches, terminals,
//! and `pause` (its
//! pause keeps the memory; there is no filesystem-only pause, which the library's pause
//! scenario checks too). Files are written by the command user, as on every provider. stdin is written to
//! a file the command reads.
//!
//! Settings (environment or `.env`): `OPEN_SANDBOX_DOMAIN` (as the SDKs: `host:port`, or a
//! URL with its scheme), `OPEN_SANDBOX_PROTOCOL` (`http`, the SDKs' default, or `https`),
//! `OPEN_SANDBOX_API_KEY`.

mod caps;

use crate::provider::caps::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{
    CreateRequest, ErrorKind, ExecRequest, ExecResult, FileEntry, OutputChunk, OutputTx, ProcessInfo, Provider,
    ProviderError, ProviderStats, Result, SandboxInfo,
};

const EXECD_PORT: u16 = 44772;
const KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
/// OpenSandbox's shortest timeout.
const MIN_TIMEOUT_SECS: u64 = 60;
/// The user commands run as when the request names none (as on every provider), if the
/// image has the account.
const DEFAULT_USER: &str = "user";
/// Where commands leave their output for `exec` and `wait` to download.
const WORK: &str = "/tmp/.scenario-run-os";
/// How long one lifecycle or execd request may take (a create builds nothing here, but a
/// server may pull an image).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);
const DESTROY_DEADLINE: Duration = Duration::from_secs(30);

/// Headers an endpoint answer names.
type Headers = Vec<(String, String)>;

/// An execd endpoint: its base URL and the headers its answer names.
#[derive(Debug, Clone)]
struct Endpoint {
    url: String,
    headers: Vec<(String, String)>,
}

/// A background command: execd's id, the pid it wrote, where its output goes.
#[derive(Debug, Clone)]
struct Background {
    command_id: String,
    n: u64,
}

#[derive(Default)]
struct Sbx {
    execd: Option<Endpoint>,
    background: HashMap<u32, Background>,
}

pub struct OpenSandboxProvider {
    http: reqwest::Client,
    /// `<scheme>://<domain>/v1`.
    api: String,
    key: String,
    /// Sandboxes this run made (a create registers its sandbox even if its caller is gone).
    sandboxes: Arc<Mutex<HashMap<String, Sbx>>>,
    /// Creates under way, which `destroy_all` waits for.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// Port URLs handed out, with their headers.
    ports: Mutex<Vec<(String, Headers)>>,
    kept: Mutex<Vec<String>>,
    /// Snapshots this run took: a create naming one starts from it (`snapshotId`).
    snapshots: Mutex<Vec<String>>,
    seq: AtomicU64,
    stats: Arc<Mutex<ProviderStats>>,
    base_image: String,
}

fn infra(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::infra(format!("{what}: {e}"))
}

/// Single-quoted for bash.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A query value, percent-encoded.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn rfc3339_secs(v: &Value) -> u64 {
    v.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()).map_or(0, |t| t.as_second().max(0) as u64)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn rfc3339_at(secs: u64) -> String {
    jiff::Timestamp::from_second(secs as i64).map(|t| t.to_string()).unwrap_or_default()
}

/// Why the `opensandbox` provider cannot be made from the run's environment.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("OPEN_SANDBOX_PROTOCOL must be http or https, not {0:?}")]
    Protocol(String),
    #[error("cannot build the HTTP client: {0}")]
    HttpClient(#[source] reqwest::Error),
}

impl OpenSandboxProvider {
    pub fn new(env: &BTreeMap<String, String>) -> std::result::Result<Self, ConfigError> {
        let get = |k: &str| env.get(k).filter(|v| !v.is_empty()).cloned().or_else(|| std::env::var(k).ok());
        let domain = get("OPEN_SANDBOX_DOMAIN").unwrap_or_else(|| "localhost:8080".into());
        let protocol = get("OPEN_SANDBOX_PROTOCOL").unwrap_or_else(|| "http".into());
        if protocol != "http" && protocol != "https" {
            return Err(ConfigError::Protocol(protocol));
        }
        let base = if domain.starts_with("http://") || domain.starts_with("https://") {
            domain.trim_end_matches('/').to_string()
        } else {
            format!("{protocol}://{}", domain.trim_end_matches('/'))
        };
        let http = crate::net::client_builder().build().map_err(ConfigError::HttpClient)?;
        Ok(Self {
            http,
            api: format!("{base}/v1"),
            key: get("OPEN_SANDBOX_API_KEY").unwrap_or_default(),
            sandboxes: Arc::default(),
            in_flight: Arc::default(),
            ports: Mutex::new(Vec::new()),
            kept: Mutex::new(Vec::new()),
            snapshots: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
            stats: Arc::default(),
            base_image: get("OPENSANDBOX_BASE_IMAGE").unwrap_or_else(|| "base".into()),
        })
    }

    /// A lifecycle request: the JSON answer (Null for an empty one), or the error it means.
    async fn api(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        api_call(&self.http, &self.api, &self.key, method, path, body).await
    }

    async fn execd(&self, id: &str) -> Result<Endpoint> {
        if let Some(e) = self.sandboxes.lock().expect("sandboxes").get(id).and_then(|s| s.execd.clone()) {
            return Ok(e);
        }
        let e = self.endpoint(id, EXECD_PORT).await?;
        self.sandboxes.lock().expect("sandboxes").entry(id.to_string()).or_default().execd = Some(e.clone());
        Ok(e)
    }

    async fn endpoint(&self, id: &str, port: u16) -> Result<Endpoint> {
        let v = self.api(reqwest::Method::GET, &format!("/sandboxes/{id}/endpoints/{port}"), None).await?;
        let ep = v["endpoint"].as_str().ok_or_else(|| ProviderError::infra(format!("no endpoint in {v}")))?;
        let url = if ep.starts_with("http://") || ep.starts_with("https://") {
            ep.to_string()
        } else {
            let scheme = self.api.split("://").next().unwrap_or("http");
            format!("{scheme}://{ep}")
        };
        let headers = v["headers"]
            .as_object()
            .map(|h| h.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        Ok(Endpoint { url: url.trim_end_matches('/').to_string(), headers })
    }

    /// An execd request.
    fn execd_req(&self, e: &Endpoint, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", e.url));
        for (k, v) in &e.headers {
            r = r.header(k, v);
        }
        r
    }

    async fn send(&self, r: reqwest::RequestBuilder, what: &str) -> Result<(reqwest::StatusCode, Vec<u8>)> {
        let resp = tokio::time::timeout(REQUEST_TIMEOUT, r.send())
            .await
            .map_err(|_| ProviderError::infra(format!("{what}: no answer within {REQUEST_TIMEOUT:?}")))?
            .map_err(|e| infra(what, super::e2b::api::error_chain(&e)))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| infra(what, e))?.to_vec();
        Ok((status, body))
    }

    async fn execd_ok(&self, id: &str, r: reqwest::RequestBuilder, what: &str) -> Result<Vec<u8>> {
        let _ = id;
        let (status, body) = self.send(r, what).await?;
        if status.is_success() {
            return Ok(body);
        }
        Err(answer_error(status, &String::from_utf8_lossy(&body), what))
    }

    /// Runs `command` (bash) through execd's `/command` to its end: its exit code, or the
    /// signal that ended it (execd's `-1` with Go's text, `signal: terminated`, in the
    /// traceback), and the text of its stdout events.
    async fn command(
        &self,
        id: &str,
        command: &str,
        cwd: Option<&str>,
        envs: &BTreeMap<String, String>,
        timeout: Option<Duration>,
    ) -> Result<(Option<i32>, Option<i32>, String)> {
        let e = self.execd(id).await?;
        let mut body = json!({"command": command, "background": false});
        if let Some(c) = cwd {
            body["cwd"] = json!(c);
        }
        if !envs.is_empty() {
            body["envs"] = json!(envs);
        }
        if let Some(t) = timeout {
            body["timeout"] = json!(t.as_millis().max(1) as u64);
        }
        let r = self.execd_req(&e, reqwest::Method::POST, "/command").json(&body);
        let out = self.execd_ok(id, r, "run a command").await?;
        let mut code = None;
        let mut signal = None;
        let mut done = false;
        let mut stdout = String::new();
        for frame in String::from_utf8_lossy(&out).split("\n\n") {
            let frame = frame.trim().trim_start_matches("data:").trim();
            let Ok(v) = serde_json::from_str::<Value>(frame) else { continue };
            match v["type"].as_str() {
                Some("stdout") => {
                    stdout.push_str(v["text"].as_str().unwrap_or(""));
                    stdout.push('\n');
                }
                Some("execution_complete") => {
                    done = true;
                    code = code.or(Some(0));
                }
                Some("error") => {
                    done = true;
                    let evalue = v["error"]["evalue"].as_str().unwrap_or("");
                    let why = v["error"]["traceback"][0].as_str().unwrap_or("");
                    match evalue.parse::<i32>() {
                        Ok(c) if c >= 0 => code = Some(c),
                        _ => match crate::provider::e2b::signal_from_status(why) {
                            Some(s) => signal = Some(s),
                            // Not an exit nor a signal: execd could not run it at all.
                            None => {
                                return Err(ProviderError::infra(format!(
                                    "execd could not run the command: {}",
                                    if why.is_empty() { evalue } else { why }
                                )))
                            }
                        },
                    }
                }
                _ => {}
            }
        }
        if !done {
            return Err(ProviderError::infra("the command's stream ended before its end event"));
        }
        Ok((code, signal, stdout))
    }

    /// Downloads `path`; `None` if it is missing.
    async fn download(&self, id: &str, path: &str) -> Result<Option<Vec<u8>>> {
        let e = self.execd(id).await?;
        let r = self.execd_req(&e, reqwest::Method::GET, &format!("/files/download?path={}", enc(path)));
        let (status, body) = self.send(r, "download a file").await?;
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(answer_error(status, &String::from_utf8_lossy(&body), "download a file"));
        }
        Ok(Some(body))
    }

    async fn upload(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<()> {
        let e = self.execd(id).await?;
        let boundary = format!("scenario-run-{}", crate::random::hex(12));
        let mut meta = json!({"path": path});
        if let Some(m) = mode {
            meta["mode"] = json!(format!("{:o}", m & 0o7777).parse::<u64>().unwrap_or(644));
        }
        let mut body = Vec::new();
        body.extend(format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{meta}\r\n"
        ).bytes());
        body.extend(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"file\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .bytes(),
        );
        body.extend(data);
        body.extend(format!("\r\n--{boundary}--\r\n").bytes());
        let r = self
            .execd_req(&e, reqwest::Method::POST, "/files/upload")
            .header("content-type", format!("multipart/form-data; boundary={boundary}"))
            .body(body);
        self.execd_ok(id, r, "upload a file").await.map(|_| ())
    }

    /// A bash command line for `req` that prints its pid and then becomes the command: as
    /// its user (default `user`, the account every provider's commands run as, when the
    /// image has it; else root, OpenSandbox's own default), from that user's home unless
    /// `cwd` says otherwise, stdin from a file, output to `<n>.out`/`.err`.
    async fn wrap(&self, id: &str, req: &ExecRequest, n: u64) -> Result<String> {
        let stdin = match &req.stdin {
            Some(data) => {
                let p = format!("{WORK}/{n}.in");
                self.upload(id, &p, data.clone(), Some(0o600)).await?;
                format!(" <{p}")
            }
            None => " </dev/null".to_string(),
        };
        let user = req.user.as_deref().unwrap_or(DEFAULT_USER);
        let redirect = format!("{stdin} >{WORK}/{n}.out 2>{WORK}/{n}.err");
        // A login shell, as every provider's commands run; its profile resets PATH, so the
        // one the command was given (the image's, the request's) is put back first.
        let cmd = q(&format!("PATH=$SR_PATH; export PATH; unset SR_PATH; {}", req.cmd));
        let cd = if req.cwd.is_none() { r#"cd "$H" 2>/dev/null; "# } else { "" };
        let as_root = format!(r#"H=/root; {cd}SR_PATH="$PATH" exec /bin/bash -l -c {cmd}{redirect}"#);
        if user == "root" {
            return Ok(format!("echo $$; {as_root}"));
        }
        let u = q(user);
        let as_user = format!(
            r#"H=$(getent passwd {u} | cut -d: -f6); {cd}exec setpriv --reuid={u} --regid="$(id -g {u})" --init-groups env HOME="$H" USER={u} LOGNAME={u} SR_PATH="$PATH" /bin/bash -l -c {cmd}{redirect}"#
        );
        let missing = if req.user.is_some() { format!("echo 'no user account {user}' >&2; exit 126") } else { as_root };
        Ok(format!("echo $$; if id -u {u} >/dev/null 2>&1; then {as_user}; else {missing}; fi"))
    }

    async fn collect(&self, id: &str, n: u64, max: usize) -> Result<(Vec<u8>, Vec<u8>, u64, u64)> {
        let mut out = self.download(id, &format!("{WORK}/{n}.out")).await?.unwrap_or_default();
        let mut err = self.download(id, &format!("{WORK}/{n}.err")).await?.unwrap_or_default();
        let e = self.execd(id).await?;
        let r = self.execd_req(
            &e,
            reqwest::Method::DELETE,
            &format!(
                "/files?path={}&path={}&path={}",
                enc(&format!("{WORK}/{n}.out")),
                enc(&format!("{WORK}/{n}.err")),
                enc(&format!("{WORK}/{n}.in"))
            ),
        );
        let _ = self.send(r, "remove output files").await;
        let (od, ed) = (out.len().saturating_sub(max) as u64, err.len().saturating_sub(max) as u64);
        out.truncate(max);
        err.truncate(max);
        Ok((out, err, od, ed))
    }

    fn info_of(v: &Value) -> SandboxInfo {
        let metadata: BTreeMap<String, String> = v["metadata"]
            .as_object()
            .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string()))).collect())
            .unwrap_or_default();
        let template = v["image"]["uri"].as_str().unwrap_or_default().to_string();
        let end_at = match &v["expiresAt"] {
            Value::Null => u64::MAX / 2,
            e => rfc3339_secs(e),
        };
        let state = match v["status"]["state"].as_str().unwrap_or("") {
            "Paused" | "Pausing" => "paused",
            _ => "running",
        };
        SandboxInfo {
            id: v["id"].as_str().unwrap_or_default().to_string(),
            template,
            metadata,
            started_at: rfc3339_secs(&v["createdAt"]),
            end_at,
            state: state.to_string(),
        }
    }

    async fn renew(&self, id: &str, secs: u64) -> Result<()> {
        self.renew_until(id, now_secs() + secs).await
    }

    /// Moves the sandbox's expiry to Unix second `end`.
    async fn renew_until(&self, id: &str, end: u64) -> Result<()> {
        let body = json!({"expiresAt": rfc3339_at(end)});
        self.api(reqwest::Method::POST, &format!("/sandboxes/{id}/renew-expiration"), Some(body)).await.map(|_| ())
    }

    fn entry(&self, path: &str, v: &Value) -> FileEntry {
        let p = v["path"].as_str().unwrap_or(path).to_string();
        let kind = match v["type"].as_str().unwrap_or("") {
            "directory" => "dir",
            "symlink" => "symlink",
            _ => "file",
        };
        let mode = v["mode"].as_u64().and_then(|m| u32::from_str_radix(&m.to_string(), 8).ok()).unwrap_or(0);
        FileEntry {
            name: p.rsplit('/').next().unwrap_or("").to_string(),
            path: p,
            kind: kind.to_string(),
            size: v["size"].as_u64().unwrap_or(0),
            mode,
            modified: rfc3339_secs(&v["modified_at"]),
        }
    }
}

/// A lifecycle request to `api` with `key`: the JSON answer (Null for an empty one), or the
/// error it means.
async fn api_call(
    http: &reqwest::Client,
    api: &str,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Result<Value> {
    let mut r = http.request(method.clone(), format!("{api}{path}")).header(KEY_HEADER, key);
    if let Some(b) = &body {
        r = r.json(b);
    }
    let resp = tokio::time::timeout(REQUEST_TIMEOUT, r.send())
        .await
        .map_err(|_| ProviderError::infra(format!("{method} {path}: no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|e| infra(&format!("{method} {path}"), super::e2b::api::error_chain(&e)))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| infra("reading the answer", e))?;
    if status.is_success() {
        return Ok(serde_json::from_str(&text).unwrap_or(Value::Null));
    }
    Err(answer_error(status, &text, &format!("{method} {path}")))
}

/// An error answer of either API as the provider's error.
fn answer_error(status: reqwest::StatusCode, text: &str, what: &str) -> ProviderError {
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let code = v["code"].as_str().unwrap_or("");
    let message = v["message"].as_str().map(str::to_string).unwrap_or_else(|| text.chars().take(500).collect());
    let msg = format!("{what}: {status} {code}: {message}");
    let kind = match status.as_u16() {
        401 | 403 => return ProviderError::new(ErrorKind::Infra, format!("authentication failed ({msg})")),
        404 => ErrorKind::NotFound,
        400 | 409 | 413 | 422 => ErrorKind::Invalid,
        501 => ErrorKind::Unsupported,
        507 => ErrorKind::Capacity,
        _ => ErrorKind::Infra,
    };
    ProviderError::new(kind, msg)
}

impl OpenSandboxProvider {
    /// What a create does once the server made sandbox `id` (at `created`): a timeout below
    /// the server's minimum, the command directory, the sandbox's info.
    async fn finish_create(&self, id: &str, want: Option<u64>, created: u64) -> Result<SandboxInfo> {
        if let Some(t) = want.filter(|t| *t < MIN_TIMEOUT_SECS) {
            // From the creation, as the timeout was asked; never in the past.
            let from = if created > 0 { created } else { now_secs() };
            self.renew_until(id, (from + t).max(now_secs() + 1)).await?;
        }
        // The command directory, made once (root's, private).
        let e = self.execd(id).await?;
        let r = self.execd_req(&e, reqwest::Method::POST, "/directories").json(&json!({ WORK: {"mode": 711} }));
        self.execd_ok(id, r, "make the work directory").await?;
        self.info(id).await
    }
}

#[async_trait]
impl Provider for OpenSandboxProvider {
    fn name(&self) -> &str {
        "opensandbox"
    }

    fn required_credentials(&self) -> Vec<String> {
        vec!["OPEN_SANDBOX_API_KEY".into()]
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        if !req.mounts.is_empty() {
            return Err(ProviderError::unsupported("host directory mounts through the opensandbox provider"));
        }
        if req.lifecycle.is_some() {
            return Err(ProviderError::unsupported(
                "a lifecycle (pause at the end, auto-resume) through the opensandbox provider",
            ));
        }
        let network = match &req.network {
            Some(n) if *n != super::NetworkPolicy::default() => Some(network_policy(n)?),
            _ => None,
        };
        if let Some(d) = req.disk_mb {
            return Err(ProviderError::unsupported(format!(
                "a disk size ({d} MiB) through the opensandbox provider (OpenSandbox's resourceLimits have no disk)"
            )));
        }
        let image = if req.template.is_empty() || req.template == "base" {
            self.base_image.clone()
        } else {
            req.template.clone()
        };
        let want = req.timeout_secs;
        let mut limits = serde_json::Map::new();
        if let Some(c) = req.cpu {
            limits.insert("cpu".into(), json!(c.to_string()));
        }
        if let Some(m) = req.memory_mb {
            limits.insert("memory".into(), json!(format!("{m}Mi")));
        }
        let from_snapshot = self.snapshots.lock().expect("snapshots").contains(&req.template);
        let mut body = json!({
            "image": {"uri": image},
            "entrypoint": ["tail", "-f", "/dev/null"],
            "timeout": want.unwrap_or(300).max(MIN_TIMEOUT_SECS),
            "metadata": req.metadata,
            "env": req.envs,
            "resourceLimits": limits,
        });
        if let Some(n) = network {
            body["networkPolicy"] = n;
        }
        if from_snapshot {
            body.as_object_mut().expect("an object").remove("image");
            body["snapshotId"] = json!(req.template);
        }
        // In a task of its own: a caller that gives up (a step's timeout, Ctrl-C) drops this
        // future, and the sandbox the server still makes must be registered for
        // `destroy_all`, not leaked.
        let (http, api, key) = (self.http.clone(), self.api.clone(), self.key.clone());
        let (sandboxes, stats, in_flight) = (self.sandboxes.clone(), self.stats.clone(), self.in_flight.clone());
        in_flight.fetch_add(1, Ordering::SeqCst);
        let made = tokio::spawn(async move {
            let r = api_call(&http, &api, &key, reqwest::Method::POST, "/sandboxes", Some(body)).await;
            let r = r.and_then(|v| match v["id"].as_str() {
                Some(id) => {
                    let created = rfc3339_secs(&v["createdAt"]);
                    sandboxes.lock().expect("sandboxes").insert(id.to_string(), Sbx::default());
                    let mut s = stats.lock().expect("stats");
                    s.created += 1;
                    s.live += 1;
                    s.peak_live = s.peak_live.max(s.live);
                    Ok((id.to_string(), created))
                }
                None => Err(ProviderError::infra(format!("no id in the create answer {v}"))),
            });
            in_flight.fetch_sub(1, Ordering::SeqCst);
            r
        });
        let (id, created) = made.await.map_err(|e| ProviderError::infra(e.to_string()))??;
        match self.finish_create(&id, want, created).await {
            Ok(info) => Ok(info),
            Err(e) => {
                // The server made it, the create failed after: deleted now, not at the end
                // of the run (a scenario that goes on would pay for it all along).
                let _ = self.kill(&id).await;
                Err(e)
            }
        }
    }

    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo> {
        let info = self.info(id).await?;
        if info.state == "paused" {
            self.api(reqwest::Method::POST, &format!("/sandboxes/{id}/resume"), None).await?;
        }
        if let Some(t) = timeout_secs {
            self.renew(id, t).await?;
        }
        self.info(id).await
    }

    async fn info(&self, id: &str) -> Result<SandboxInfo> {
        let v = self.api(reqwest::Method::GET, &format!("/sandboxes/{id}"), None).await?;
        Ok(Self::info_of(&v))
    }

    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let mut out = Vec::new();
        let filter: Vec<String> = metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut page = 1;
        loop {
            let mut path = format!("/sandboxes?page={page}&pageSize=100");
            if !filter.is_empty() {
                path += &format!("&metadata={}", enc(&filter.join("&")));
            }
            let v = self.api(reqwest::Method::GET, &path, None).await?;
            let items = v["items"].as_array().cloned().unwrap_or_default();
            out.extend(items.iter().map(Self::info_of));
            if !v["pagination"]["hasNextPage"].as_bool().unwrap_or(false) || items.is_empty() {
                break;
            }
            page += 1;
        }
        Ok(out)
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        let gone = match self.api(reqwest::Method::DELETE, &format!("/sandboxes/{id}"), None).await {
            Ok(_) => true,
            Err(e) if e.kind == ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if self.sandboxes.lock().expect("sandboxes").remove(id).is_some() {
            let mut s = self.stats.lock().expect("stats");
            s.destroyed += 1;
            s.live = s.live.saturating_sub(1);
        }
        Ok(gone)
    }

    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        self.renew(id, timeout_secs).await
    }

    fn keep(&self, id: &str) {
        self.kept.lock().expect("kept").push(id.to_string());
    }

    fn is_kept(&self, id: &str) -> bool {
        self.kept.lock().expect("kept").iter().any(|k| k == id)
    }

    async fn destroy_all(&self) -> usize {
        let deadline = tokio::time::Instant::now() + DESTROY_DEADLINE;
        while self.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let ids: Vec<String> = {
            let kept = self.kept.lock().expect("kept").clone();
            self.sandboxes.lock().expect("sandboxes").keys().filter(|id| !kept.contains(id)).cloned().collect()
        };
        let kills = ids.iter().map(|id| self.kill(id));
        let done = tokio::time::timeout(DESTROY_DEADLINE, futures_util::future::join_all(kills)).await;
        done.map(|r| r.into_iter().filter(|r| matches!(r, Ok(true))).count()).unwrap_or(0)
    }

    fn stats(&self) -> ProviderStats {
        self.stats.lock().expect("stats").clone()
    }

    fn features(&self) -> crate::provider::Features<'_> {
        crate::provider::caps::features!(self; processes, files, ports, pausing, snapshots, network_control)
    }
}

/// E2B's egress rules as OpenSandbox's `networkPolicy` (first match wins, then
/// `defaultAction`): the allowed targets first, so an allowed entry beats a denied one as on
/// E2B, then the denied ones; denying `0.0.0.0/0` (or internet access off) is
/// `defaultAction: deny`. What OpenSandbox's rules cannot say (ports, nameservers, private
/// ports) is refused, never dropped.
fn network_policy(n: &super::NetworkPolicy) -> Result<Value> {
    const ALL: &str = "0.0.0.0/0";
    if n.dns_servers.is_some() {
        return Err(ProviderError::unsupported(
            "dns_servers through the opensandbox provider (OpenSandbox's networkPolicy names no nameservers)",
        ));
    }
    if n.allow_public_traffic == Some(false) {
        return Err(ProviderError::unsupported(
            "private ports (allow_public_traffic: false) through the opensandbox provider",
        ));
    }
    let mut egress = Vec::new();
    for (action, list) in [("allow", &n.allow_out), ("deny", &n.deny_out)] {
        for target in list.iter().map(|t| t.trim()).filter(|t| !(action == "deny" && *t == ALL)) {
            if target.contains(':') {
                return Err(ProviderError::unsupported(format!(
                    "the port in `{target}` through the opensandbox provider (OpenSandbox's egress rules have no ports)"
                )));
            }
            egress.push(json!({ "action": action, "target": target }));
        }
    }
    let deny_all = n.allow_internet_access == Some(false) || n.deny_out.iter().any(|t| t.trim() == ALL);
    Ok(json!({ "defaultAction": if deny_all { "deny" } else { "allow" }, "egress": egress }))
}

#[async_trait]
impl crate::provider::NetworkControl for OpenSandboxProvider {
    /// The lifecycle API's `PUT /sandboxes/{id}/networkpolicy`: the whole policy is replaced,
    /// as E2B's `update_network` replaces its lists.
    async fn update_network(&self, id: &str, policy: super::NetworkPolicy) -> Result<()> {
        let body = network_policy(&policy)?;
        self.api(reqwest::Method::PUT, &format!("/sandboxes/{id}/networkpolicy"), Some(body)).await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_rules_become_a_network_policy_allowed_first_or_are_refused() {
        let p = |allow: &[&str], deny: &[&str], internet: Option<bool>| super::super::NetworkPolicy {
            allow_internet_access: internet,
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let got = network_policy(&p(&["pypi.org", "*.npmjs.org"], &["0.0.0.0/0", "10.1.2.3"], None)).unwrap();
        assert_eq!(
            got,
            json!({"defaultAction": "deny", "egress": [
                {"action": "allow", "target": "pypi.org"},
                {"action": "allow", "target": "*.npmjs.org"},
                {"action": "deny", "target": "10.1.2.3"},
            ]})
        );
        assert_eq!(network_policy(&p(&[], &[], Some(false))).unwrap(), json!({"defaultAction": "deny", "egress": []}));
        assert_eq!(network_policy(&p(&[], &[], None)).unwrap(), json!({"defaultAction": "allow", "egress": []}));
        let refused = |n: super::super::NetworkPolicy| network_policy(&n).unwrap_err().kind;
        assert_eq!(refused(p(&["pypi.org:443"], &[], None)), ErrorKind::Unsupported);
        assert_eq!(
            refused(super::super::NetworkPolicy { dns_servers: Some(vec![]), ..Default::default() }),
            ErrorKind::Unsupported
        );
        assert_eq!(
            refused(super::super::NetworkPolicy { allow_public_traffic: Some(false), ..Default::default() }),
            ErrorKind::Unsupported
        );
    }

    #[test]
    fn quoting_and_query_encoding() {
        assert_eq!(q("it's"), r"'it'\''s'");
        assert_eq!(enc("/tmp/a b&c=d"), "/tmp/a%20b%26c%3Dd");
    }

    #[test]
    fn answers_map_to_error_kinds() {
        let e = answer_error(reqwest::StatusCode::UNAUTHORIZED, r#"{"code":"INVALID_API_KEY","message":"no"}"#, "x");
        assert!(e.message.starts_with("authentication failed"), "{}", e.message);
        let e = answer_error(reqwest::StatusCode::NOT_FOUND, r#"{"code":"SANDBOX::NOT_FOUND","message":"gone"}"#, "x");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("gone"));
        assert_eq!(answer_error(reqwest::StatusCode::NOT_IMPLEMENTED, "", "x").kind, ErrorKind::Unsupported);
        assert_eq!(answer_error(reqwest::StatusCode::INSUFFICIENT_STORAGE, "", "x").kind, ErrorKind::Capacity);
    }

    #[test]
    fn a_sandbox_answer_is_its_info() {
        let v = json!({"id": "abc", "image": {"uri": "base"}, "metadata": {"e2e": "r1"}, "status": {"state": "Paused"},
            "createdAt": "2026-12-05T00:00:00Z", "expiresAt": "2026-12-05T00:05:00Z"});
        let i = OpenSandboxProvider::info_of(&v);
        assert_eq!((i.id.as_str(), i.template.as_str(), i.state.as_str()), ("abc", "base", "paused"));
        assert_eq!(i.end_at - i.started_at, 300);
        assert_eq!(i.metadata["e2e"], "r1");
    }

    #[test]
    fn port_headers_only_for_urls_handed_out() {
        let p = OpenSandboxProvider::new(&BTreeMap::new()).unwrap();
        let base = "http://127.0.0.1:3000/sandboxes/abc/proxy/8000".to_string();
        p.ports.lock().unwrap().push((base.clone(), vec![("OpenSandbox-Secure-Access".into(), "t".into())]));
        assert_eq!(p.port_headers(&format!("{base}/index.html")).len(), 1);
        assert_eq!(p.port_headers(&base).len(), 1);
        assert!(p.port_headers(&format!("{base}0/")).is_empty(), "another port");
        assert!(p.port_headers("http://127.0.0.1:3000/sandboxes/abd/proxy/8000/").is_empty());
    }
}

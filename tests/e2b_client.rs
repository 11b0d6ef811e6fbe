//! The E2B-protocol client against a small fake E2B server on 127.0.0.1.
//!
//! The fake is a hand-written HTTP/1.1 server (one request per connection, `Connection:
//! close`) whose routes each test scripts; it records every request so tests can check what
//! went over the wire: paths, headers, JSON bodies, Connect envelopes, multipart uploads.
//! It plays the API and envd on one port, as `E2B_API_URL` and `E2B_SANDBOX_URL` allow.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use scenario_run::provider::caps::*;
use scenario_run::provider::e2b::{E2bProvider, Preset};
use scenario_run::provider::{CreateRequest, ErrorKind, ExecRequest, OutputChunk, Provider};
use serde_json::{json, Value as JsonValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";
const SBX: &str = "sbx0123456789abcdefg";

// ---- the fake server ----------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    query: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Req {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
    fn json(&self) -> JsonValue {
        serde_json::from_slice(&self.body).unwrap_or(JsonValue::Null)
    }
    /// The message of a one-envelope Connect streaming request.
    fn envelope_json(&self) -> JsonValue {
        assert_eq!(self.body[0], 0, "flag byte");
        let len = u32::from_be_bytes(self.body[1..5].try_into().unwrap()) as usize;
        assert_eq!(self.body.len(), 5 + len, "exactly one envelope");
        serde_json::from_slice(&self.body[5..]).unwrap()
    }
}

enum Resp {
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// `application/connect+json`, written as the chunks arrive, closed when the sender drops.
    Stream(mpsc::UnboundedReceiver<Vec<u8>>),
    /// These bytes as the whole answer (status line and headers included), then the
    /// connection held open without another byte, as a server that stalls.
    Stalled(Vec<u8>),
}

fn json_resp(status: u16, body: JsonValue) -> Resp {
    Resp::Full {
        status,
        headers: vec![("Content-Type".into(), "application/json".into())],
        body: serde_json::to_vec(&body).unwrap(),
    }
}

fn with_header(r: Resp, k: &str, v: &str) -> Resp {
    match r {
        Resp::Full { status, mut headers, body } => {
            headers.push((k.into(), v.into()));
            Resp::Full { status, headers, body }
        }
        s => s,
    }
}

fn frame(flags: u8, j: &JsonValue) -> Vec<u8> {
    let msg = serde_json::to_vec(j).unwrap();
    let mut out = vec![flags];
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(&msg);
    out
}

fn event(ev: JsonValue) -> Vec<u8> {
    frame(0, &json!({ "event": ev }))
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A stream response with the given chunks already queued; it closes after them.
fn stream_of(chunks: Vec<Vec<u8>>) -> Resp {
    let (tx, rx) = mpsc::unbounded_channel();
    for c in chunks {
        tx.send(c).unwrap();
    }
    Resp::Stream(rx)
}

type Handler = Arc<dyn Fn(&Req) -> Option<Resp> + Send + Sync>;

struct Fake {
    port: u16,
    log: Arc<Mutex<Vec<Req>>>,
}

impl Fake {
    /// Starts a fake whose routes are `handler`'s, falling back to a detail for [`SBX`].
    async fn start(handler: impl Fn(&Req) -> Option<Resp> + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let l = log.clone();
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else { return };
                let (h, l) = (handler.clone(), l.clone());
                tokio::spawn(async move {
                    let _ = serve(sock, h, l).await;
                });
            }
        });
        Fake { port, log }
    }

    fn env(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("E2B_API_KEY".to_string(), KEY.to_string()),
            ("E2B_API_URL".to_string(), format!("http://127.0.0.1:{}", self.port)),
            ("E2B_SANDBOX_URL".to_string(), format!("http://127.0.0.1:{}", self.port)),
        ])
    }

    fn provider(&self) -> E2bProvider {
        E2bProvider::new(Preset::E2b, &self.env()).unwrap()
    }

    fn requests(&self, method: &str, path: &str) -> Vec<Req> {
        self.log.lock().unwrap().iter().filter(|r| r.method == method && r.path == path).cloned().collect()
    }
}

fn detail(id: &str) -> JsonValue {
    json!({"templateID":"tmpl1","alias":"base","sandboxID":id,"clientID":"6532622b",
        "startedAt":"2024-01-01T00:00:00Z","endAt":"2024-01-01T00:05:00Z","envdVersion":"0.6.13",
        "cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"state":"running","metadata":{"owner":"me"}})
}

fn default_route(req: &Req) -> Resp {
    if req.method == "GET" && req.path == format!("/sandboxes/{SBX}") {
        return json_resp(200, detail(SBX));
    }
    json_resp(404, json!({"code":404,"message":format!("no route {} {}", req.method, req.path)}))
}

async fn serve(mut sock: TcpStream, handler: Handler, log: Arc<Mutex<Vec<Req>>>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 8192];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap().split(' ');
    let (method, target) = (first.next().unwrap().to_string(), first.next().unwrap().to_string());
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: usize = headers.get("content-length").map_or(0, |v| v.parse().unwrap());
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < len {
        let mut chunk = vec![0u8; len - body.len()];
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let (path, query) = target.split_once('?').map_or((target.clone(), String::new()), |(p, q)| (p.into(), q.into()));
    let req = Req { method, path, query, headers, body };
    log.lock().unwrap().push(req.clone());
    match handler(&req).unwrap_or_else(|| default_route(&req)) {
        Resp::Full { status, headers, body } => {
            let mut out = format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            sock.write_all(out.as_bytes()).await?;
            sock.write_all(&body).await?;
        }
        Resp::Stalled(bytes) => {
            sock.write_all(&bytes).await?;
            sock.flush().await?;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Resp::Stream(mut rx) => {
            sock.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nConnection: close\r\n\r\n")
                .await?;
            while let Some(c) = rx.recv().await {
                sock.write_all(&c).await?;
                sock.flush().await?;
            }
        }
    }
    sock.shutdown().await
}

fn cmd(c: &str) -> ExecRequest {
    ExecRequest { cmd: c.to_string(), timeout: Some(Duration::from_secs(20)), ..Default::default() }
}

// ---- control plane ----------------------------------------------------------------------------

#[tokio::test]
async fn unauthorized_is_an_auth_error_naming_the_variable_not_the_key() {
    let fake = Fake::start(|_| Some(json_resp(401, json!({"code":401,"message":"Invalid API key"})))).await;
    let p = fake.provider();
    let e = p.info("abc").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(e.message.contains("authentication failed"), "{}", e.message);
    assert!(e.message.contains("E2B_API_KEY"), "{}", e.message);
    assert!(!e.message.contains(KEY));
    let e = p.create(CreateRequest { template: "base".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth);
    assert!(e.message.contains("authentication failed"));
    // The key went as X-API-KEY, once per call (401 is not retried).
    let gets = fake.requests("GET", "/sandboxes/abc");
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].header("x-api-key"), Some(KEY));
}

#[tokio::test]
async fn rate_limited_get_is_retried_after_retry_after() {
    let hits = Arc::new(Mutex::new(0));
    let h = hits.clone();
    let fake = Fake::start(move |req| {
        if req.path != format!("/sandboxes/{SBX}") {
            return None;
        }
        let mut n = h.lock().unwrap();
        *n += 1;
        Some(if *n == 1 {
            with_header(json_resp(429, json!({"code":429,"message":"slow down"})), "Retry-After", "1")
        } else {
            json_resp(200, detail(SBX))
        })
    })
    .await;
    let started = Instant::now();
    let info = fake.provider().info(SBX).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(950), "waited {:?}", started.elapsed());
    assert_eq!(*hits.lock().unwrap(), 2);
    assert_eq!(info.id, SBX);
    assert_eq!(info.template, "base");
    assert_eq!((info.started_at, info.end_at), (1_704_067_200, 1_704_067_500));
    assert_eq!(info.metadata["owner"], "me");
}

#[tokio::test]
async fn should_retry_false_forbids_the_retry() {
    let fake = Fake::start(|req| {
        (req.method == "GET")
            .then(|| with_header(json_resp(503, json!({"code":503,"message":"busy"})), "Should-Retry", "false"))
    })
    .await;
    let e = fake.provider().info(SBX).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Infra);
    assert_eq!(fake.requests("GET", &format!("/sandboxes/{SBX}")).len(), 1);
}

/// A 429 the client may not retry (serve's memory admission says `Should-Retry: false`) is a
/// refusal for want of capacity, which `expect_error: { kind: capacity }` names, not an error
/// of the platform.
#[tokio::test]
async fn a_429_left_after_its_retries_is_a_refusal_for_capacity() {
    let fake = Fake::start(|req| {
        (req.method == "GET").then(|| {
            with_header(json_resp(429, json!({"code":429,"message":"not enough memory"})), "Should-Retry", "false")
        })
    })
    .await;
    let e = fake.provider().info(SBX).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Capacity, "{e}");
    assert!(e.message.contains("not enough memory") && e.message.contains("429"), "{e}");
    assert_eq!(fake.requests("GET", &format!("/sandboxes/{SBX}")).len(), 1);
}

#[tokio::test]
async fn create_503_is_not_retried() {
    let fake = Fake::start(|_| Some(json_resp(503, json!({"code":503,"message":"service busy"})))).await;
    let e = fake.provider().create(CreateRequest { template: "base".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Infra);
    assert!(e.message.contains("service busy"), "{}", e.message);
    assert_eq!(fake.requests("POST", "/v2/sandboxes").len(), 1, "a create is never repeated");
}

#[tokio::test]
async fn create_sends_the_sdk_body_and_unknown_template_is_named() {
    let fake = Fake::start(|req| {
        if req.method != "POST" || req.path != "/v2/sandboxes" {
            return None;
        }
        Some(if req.json()["templateID"] == "nope" {
            json_resp(404, json!({"code":404,"message":"template 'nope' not found"}))
        } else {
            json_resp(
                201,
                json!({"sandboxID":SBX,"templateID":"tmpl1","alias":"base","clientID":"6532622b","envdVersion":"0.6.13"}),
            )
        })
    })
    .await;
    let p = fake.provider();
    let req = CreateRequest {
        template: "base".into(),
        timeout_secs: Some(120),
        metadata: BTreeMap::from([("owner".into(), "me".into())]),
        envs: BTreeMap::from([("FOO".into(), "bar".into())]),
        ..Default::default()
    };
    let info = p.create(req).await.unwrap();
    assert_eq!((info.id.as_str(), info.template.as_str(), info.state.as_str()), (SBX, "base", "running"));
    assert_eq!(info.metadata["owner"], "me");
    assert_eq!(info.end_at - info.started_at, 120);
    let sent = &fake.requests("POST", "/v2/sandboxes")[0];
    assert_eq!(
        sent.json(),
        json!({"templateID":"base","timeout":120,"metadata":{"owner":"me"},"envVars":{"FOO":"bar"}})
    );
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(p.stats().created, 1);
    assert_eq!(p.stats().live, 1);

    let e = p.create(CreateRequest { template: "nope".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("template `nope`"), "{}", e.message);

    // A lifecycle goes as the SDK sends `lifecycle={"on_timeout": "pause", "auto_resume": …}`.
    let lifecycle = scenario_run::provider::Lifecycle { pause_on_timeout: true, keep_memory: false, auto_resume: true };
    p.create(CreateRequest { template: "base".into(), lifecycle: Some(lifecycle), ..Default::default() })
        .await
        .unwrap();
    let sent = &fake.requests("POST", "/v2/sandboxes")[2];
    assert_eq!(
        (&sent.json()["autoPause"], &sent.json()["autoPauseMemory"], &sent.json()["autoResume"]),
        (&json!(true), &json!(false), &json!({"enabled": true}))
    );
}

#[tokio::test]
async fn alicloud_uses_v1_create_and_bearer_auth() {
    let fake = Fake::start(|req| {
        (req.method == "POST" && req.path == "/sandboxes")
            .then(|| json_resp(201, json!({"sandboxID":SBX,"templateID":"base","clientID":"x","envdVersion":"0.5.4"})))
    })
    .await;
    let env = BTreeMap::from([
        ("ABX_SANDBOX_API_KEY".to_string(), KEY.to_string()),
        ("ABX_SANDBOX_BASE_URL".to_string(), format!("http://127.0.0.1:{}", fake.port)),
    ]);
    let p = E2bProvider::new(Preset::Alicloud, &env).unwrap();
    assert_eq!(p.name(), "alicloud");
    p.create(CreateRequest { template: "base".into(), ..Default::default() }).await.unwrap();
    let sent = &fake.requests("POST", "/sandboxes")[0];
    assert_eq!(sent.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
    assert_eq!(sent.header("x-api-key"), None);
    assert_eq!(sent.json()["secure"], json!(true));
    assert_eq!(sent.json()["templateID"], json!("base"));
    assert!(sent.json().get("timeout").is_none(), "no timeout given: server default");
}

#[tokio::test]
async fn list_follows_next_token_and_encodes_the_metadata_filter() {
    let fake = Fake::start(|req| {
        if req.path != "/v2/sandboxes" {
            return None;
        }
        Some(if req.query.contains("nextToken=page2") {
            json_resp(200, json!([detail("b2")]))
        } else {
            with_header(json_resp(200, json!([detail("a1")])), "X-Next-Token", "page2")
        })
    })
    .await;
    let meta = BTreeMap::from([("owner".to_string(), "me".to_string()), ("k y".to_string(), "v&1".to_string())]);
    let all = fake.provider().list(&BTreeMap::from([("owner".to_string(), "me".to_string())])).await.unwrap();
    assert_eq!(all.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), vec!["a1", "b2"]);
    let _ = fake.provider().list(&meta).await.unwrap();
    let reqs = fake.requests("GET", "/v2/sandboxes");
    assert_eq!(reqs.len(), 4);
    assert!(reqs[0].query.contains("metadata=owner%3Dme"), "{}", reqs[0].query);
    assert!(reqs[1].query.contains("nextToken=page2"));
    assert!(reqs[2].query.contains("metadata=k%252520y%3Dv%2525261%26owner%3Dme"), "{}", reqs[2].query);
}

#[tokio::test]
async fn kill_and_timeout_and_not_found() {
    let fake = Fake::start(|req| match (req.method.as_str(), req.path.as_str()) {
        ("DELETE", p) if p == format!("/sandboxes/{SBX}") => {
            Some(Resp::Full { status: 204, headers: vec![], body: vec![] })
        }
        ("POST", p) if p == format!("/sandboxes/{SBX}/timeout") => {
            Some(Resp::Full { status: 204, headers: vec![], body: vec![] })
        }
        _ => None,
    })
    .await;
    let p = fake.provider();
    assert!(p.kill(SBX).await.unwrap());
    assert!(!p.kill("gone").await.unwrap(), "404 on kill is false");
    p.set_timeout(SBX, 60).await.unwrap();
    assert_eq!(fake.requests("POST", &format!("/sandboxes/{SBX}/timeout"))[0].json(), json!({"timeout":60}));
    let e = p.set_timeout("gone", 60).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    let e = p.info("gone").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("sandbox gone not found"), "{}", e.message);
}

// ---- envd: processes -----------------------------------------------------------------------

#[tokio::test]
async fn exec_streams_stdout_stderr_and_exit_code() {
    let fake = Fake::start(|req| {
        (req.path == "/process.Process/Start").then(|| {
            stream_of(vec![
                event(json!({"start":{"pid":42}})),
                event(json!({"keepalive":{}})),
                event(json!({"data":{"stdout":b64("hi\n")}})),
                event(json!({"data":{"stderr":b64("err\n")}})),
                event(json!({"data":{"stdout":b64("bar\n")}})),
                event(json!({"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}})),
                frame(2, &json!({})),
            ])
        })
    })
    .await;
    let p = fake.provider();
    let (tx, mut rx) = scenario_run::provider::output_channel();
    let mut req = cmd("echo hi; echo err >&2; echo $FOO; exit 3");
    req.cwd = Some("/tmp".into());
    req.envs = BTreeMap::from([("FOO".into(), "bar".into())]);
    req.user = Some("root".into());
    let r = p.exec(SBX, req, Some(tx)).await.unwrap();
    assert_eq!(r.stdout, b"hi\nbar\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!((r.exit_code, r.signal, r.timed_out, r.pid), (Some(3), None, false, 42));
    let mut live = Vec::new();
    while let Ok(c) = rx.try_recv() {
        live.push(match c {
            OutputChunk::Stdout(b) => format!("out:{}", String::from_utf8(b).unwrap()),
            OutputChunk::Stderr(b) => format!("err:{}", String::from_utf8(b).unwrap()),
        });
    }
    assert_eq!(live, vec!["out:hi\n", "err:err\n", "out:bar\n"]);

    let start = &fake.requests("POST", "/process.Process/Start")[0];
    assert_eq!(
        start.envelope_json(),
        json!({"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi; echo err >&2; echo $FOO; exit 3"],
            "envs":{"FOO":"bar"},"cwd":"/tmp"},"stdin":false})
    );
    assert_eq!(start.header("content-type"), Some("application/connect+json"));
    assert_eq!(start.header("connect-protocol-version"), Some("1"));
    assert_eq!(start.header("connect-timeout-ms"), Some("20000"));
    assert_eq!(start.header("keepalive-ping-interval"), Some("50"));
    assert_eq!(start.header("e2b-sandbox-id"), Some(SBX));
    assert_eq!(start.header("e2b-sandbox-port"), Some("49983"));
    assert_eq!(start.header("authorization"), Some(format!("Basic {}", b64("root:")).as_str()));
    assert_eq!(start.header("x-api-key"), None, "the API key never goes to envd");
}

#[tokio::test]
async fn access_token_from_create_goes_to_envd() {
    let fake = Fake::start(|req| match req.path.as_str() {
        "/v2/sandboxes" => Some(json_resp(
            201,
            json!({"sandboxID":SBX,"templateID":"t","clientID":"c","envdVersion":"0.6.13","envdAccessToken":"tok-1"}),
        )),
        "/process.Process/Start" => Some(stream_of(vec![
            event(json!({"start":{"pid":1}})),
            event(json!({"end":{"exited":true,"status":"exit status 0"}})),
            frame(2, &json!({})),
        ])),
        _ => None,
    })
    .await;
    let p = fake.provider();
    p.create(CreateRequest::default()).await.unwrap();
    let r = p.exec(SBX, cmd("true"), None).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "omitted exitCode means 0");
    let start = &fake.requests("POST", "/process.Process/Start")[0];
    assert_eq!(start.header("x-access-token"), Some("tok-1"));
    assert_eq!(start.header("authorization"), None, "no user named: envd's default user");
    assert!(fake.requests("GET", &format!("/sandboxes/{SBX}")).is_empty(), "create told us where envd is");
}

#[tokio::test]
async fn exec_errors_end_stream_trailer_missing_end_and_cut_stream() {
    let fake = Fake::start(|req| {
        if req.path != "/process.Process/Start" {
            return None;
        }
        let script = req.envelope_json()["process"]["args"][2].as_str().unwrap().to_string();
        Some(match script.as_str() {
            "badcwd" => stream_of(vec![frame(
                2,
                &json!({"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"}}),
            )]),
            "noend" => stream_of(vec![event(json!({"start":{"pid":5}})), frame(2, &json!({}))]),
            "cut" => {
                let mut data = event(json!({"data":{"stdout":b64("partial")}}));
                data.truncate(data.len() - 4);
                stream_of(vec![event(json!({"start":{"pid":6}})), data])
            }
            _ => json_resp(404, json!({"code":"not_found","message":"?"})),
        })
    })
    .await;
    let p = fake.provider();
    let e = p.exec(SBX, cmd("badcwd"), None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("cwd '/nope' does not exist"), "{}", e.message);
    let e = p.exec(SBX, cmd("noend"), None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Infra);
    assert!(e.message.contains("without an end event"), "{}", e.message);
    let e = p.exec(SBX, cmd("cut"), None).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Infra);
    assert!(e.message.contains("cut in the middle of a frame"), "{}", e.message);
}

/// A fake envd whose processes run until SendSignal, which ends them with "signal: killed".
fn killable() -> impl Fn(&Req) -> Option<Resp> + Send + Sync + 'static {
    let running: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Vec<u8>>>>> = Arc::default();
    let next_pid = Arc::new(Mutex::new(100u32));
    move |req| match req.path.as_str() {
        "/process.Process/Start" => {
            let pid = {
                let mut n = next_pid.lock().unwrap();
                *n += 1;
                *n
            };
            let (tx, rx) = mpsc::unbounded_channel();
            tx.send(event(json!({"start":{"pid":pid}}))).unwrap();
            tx.send(event(json!({"data":{"stdout":b64("started\n")}}))).unwrap();
            running.lock().unwrap().insert(pid, tx);
            Some(Resp::Stream(rx))
        }
        "/process.Process/SendSignal" => {
            let body = req.json();
            let pid = body["process"]["pid"].as_u64().unwrap() as u32;
            let Some(tx) = running.lock().unwrap().remove(&pid) else {
                return Some(json_resp(
                    404,
                    json!({"code":"not_found","message":format!("process with pid {pid} not found")}),
                ));
            };
            let status = if body["signal"] == "SIGNAL_SIGTERM" { "signal: terminated" } else { "signal: killed" };
            let _ = tx.send(event(json!({"end":{"exitCode":-1,"status":status,"error":status}})));
            let _ = tx.send(frame(2, &json!({})));
            Some(json_resp(200, json!({})))
        }
        "/process.Process/List" => {
            let procs: Vec<JsonValue> = running
                .lock()
                .unwrap()
                .keys()
                .map(|pid| json!({"config":{"cmd":"/bin/bash","args":["-l","-c","sleep 1000"]},"pid":pid}))
                .collect();
            Some(json_resp(200, json!({ "processes": procs })))
        }
        _ => None,
    }
}

#[tokio::test]
async fn exec_timeout_kills_the_process_via_send_signal() {
    let fake = Fake::start(killable()).await;
    let p = fake.provider();
    let mut req = cmd("sleep 1000");
    req.timeout = Some(Duration::from_millis(300));
    let started = Instant::now();
    let r = p.exec(SBX, req, None).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(r.timed_out);
    assert_eq!((r.exit_code, r.signal), (None, Some(9)));
    assert_eq!(r.stdout, b"started\n");
    let kill = &fake.requests("POST", "/process.Process/SendSignal")[0];
    assert_eq!(kill.json(), json!({"process":{"pid":101},"signal":"SIGNAL_SIGKILL"}));
    assert_eq!(kill.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn spawn_list_signal_and_wait() {
    let fake = Fake::start(killable()).await;
    let p = fake.provider();
    let pid = p.spawn(SBX, ExecRequest { cmd: "sleep 1000".into(), ..Default::default() }).await.unwrap();
    assert_eq!(pid, 101);
    let start = &fake.requests("POST", "/process.Process/Start")[0];
    assert_eq!(start.header("connect-timeout-ms"), None, "no timeout: no deadline");

    let r = p.wait(SBX, pid, Duration::from_millis(200)).await.unwrap();
    assert!(r.timed_out, "still running");
    let procs = p.process_list(SBX).await.unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!((procs[0].pid, procs[0].cmd.as_str(), procs[0].running), (101, "sleep 1000", true));

    p.signal(SBX, pid, 15).await.unwrap();
    let r = p.wait(SBX, pid, Duration::from_secs(5)).await.unwrap();
    assert!(!r.timed_out);
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    assert_eq!(r.stdout, b"started\n");
    let procs = p.process_list(SBX).await.unwrap();
    assert_eq!(procs.len(), 1, "the finished one stays known");
    assert!(!procs[0].running);

    let e = p.signal(SBX, 999, 9).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("no such process: 999"));
}

#[tokio::test]
async fn dead_sandbox_on_envd_is_not_found_not_a_missing_file() {
    let fake = Fake::start(|req| {
        req.path
            .starts_with("/filesystem.")
            .then(|| json_resp(502, json!({"sandboxId":SBX,"message":"The sandbox was not found","code":502})))
    })
    .await;
    let p = fake.provider();
    let e = p.exists(SBX, "/x").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("is not running"), "{}", e.message);
}

// ---- envd: files ---------------------------------------------------------------------------

/// The content of the `file` part of a multipart body.
fn multipart_file(req: &Req) -> (String, Vec<u8>) {
    let ct = req.header("content-type").unwrap();
    let boundary = ct.split("boundary=").nth(1).unwrap();
    let body = &req.body;
    let start_marker = format!("--{boundary}\r\n");
    assert!(body.starts_with(start_marker.as_bytes()));
    let head_end = body.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&body[..head_end]).to_string();
    assert!(head.contains("name=\"file\""), "{head}");
    let filename = head.split("filename=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let end_marker = format!("\r\n--{boundary}--\r\n");
    assert!(body.ends_with(end_marker.as_bytes()));
    (filename, body[head_end + 4..body.len() - end_marker.len()].to_vec())
}

fn query_param(q: &str, name: &str) -> Option<String> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| scenario_run::net::url_decode(v).unwrap())
}

fn files_server() -> impl Fn(&Req) -> Option<Resp> + Send + Sync + 'static {
    let files: Arc<Mutex<HashMap<String, Vec<u8>>>> = Arc::default();
    move |req| {
        let abs = |p: &str| if p.starts_with('/') { p.to_string() } else { format!("/home/user/{p}") };
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/files") => {
                let (filename, data) = multipart_file(req);
                let path = abs(&query_param(&req.query, "path").unwrap_or(filename));
                files.lock().unwrap().insert(path.clone(), data);
                let name = path.rsplit('/').next().unwrap().to_string();
                Some(json_resp(200, json!([{"path":path,"name":name,"type":"file"}])))
            }
            ("GET", "/files") => {
                let path = abs(&query_param(&req.query, "path").unwrap());
                Some(match files.lock().unwrap().get(&path) {
                    Some(d) => Resp::Full { status: 200, headers: vec![], body: d.clone() },
                    None => json_resp(404, json!({"code":404,"message":format!("path '{path}' does not exist")})),
                })
            }
            ("POST", "/filesystem.Filesystem/Stat") => {
                let path = abs(req.json()["path"].as_str().unwrap());
                Some(match files.lock().unwrap().get(&path) {
                    Some(d) => json_resp(
                        200,
                        json!({"entry":{"name":path.rsplit('/').next(),"type":"FILE_TYPE_FILE","path":path,
                            "size":d.len().to_string(),"mode":420,"modifiedTime":"2024-01-01T00:00:00Z"}}),
                    ),
                    None => json_resp(404, json!({"code":"not_found","message":format!("file not found: {path}")})),
                })
            }
            ("POST", "/filesystem.Filesystem/MakeDir") => {
                Some(json_resp(409, json!({"code":"already_exists","message":"directory already exists"})))
            }
            _ => None,
        }
    }
}

#[tokio::test]
async fn files_upload_and_download_round_trip() {
    let fake = Fake::start(files_server()).await;
    let p = fake.provider();
    let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let entry = p.write_file(SBX, "/home/user/dir/blob.bin", data.clone(), None).await.unwrap();
    assert_eq!((entry.path.as_str(), entry.kind.as_str(), entry.size), ("/home/user/dir/blob.bin", "file", 70_000));
    assert_eq!((entry.name.as_str(), entry.mode, entry.modified), ("blob.bin", 0o644, 1_704_067_200));
    assert_eq!(p.read_file(SBX, "/home/user/dir/blob.bin").await.unwrap(), data);

    // Relative paths are envd's business (the user's home); the answer names the real path.
    let entry = p.write_file(SBX, "rel.txt", b"hi\n".to_vec(), None).await.unwrap();
    assert_eq!(entry.path, "/home/user/rel.txt");
    assert_eq!(p.read_file(SBX, "rel.txt").await.unwrap(), b"hi\n");

    let up = &fake.requests("POST", "/files")[0];
    assert_eq!(query_param(&up.query, "path").as_deref(), Some("/home/user/dir/blob.bin"));
    assert_eq!(multipart_file(up).0, "/home/user/dir/blob.bin", "the part's filename is the path");
    assert_eq!(up.header("e2b-sandbox-id"), Some(SBX));

    let e = p.read_file(SBX, "/nope").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("/nope"));
    assert!(p.exists(SBX, "rel.txt").await.unwrap());
    assert!(!p.exists(SBX, "/nope").await.unwrap());
    let e = p.stat(SBX, "/nope").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
}

/// Regression (issue 23, item 10): a download was read whole, however much the server sent
/// (a link to `/dev/zero` in a sandbox took the runner to OOM). One larger than the read
/// limit is refused as soon as its length says so, or once it passes the limit.
#[tokio::test]
async fn a_download_past_the_read_limit_is_refused_without_reading_it() {
    let fake = Fake::start(|req: &Req| {
        (req.method == "GET" && req.path == "/files").then(|| {
            let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2147483648\r\n\r\n".to_vec();
            answer.extend_from_slice(&[0u8; 4096]);
            Resp::Stalled(answer)
        })
    })
    .await;
    let p = fake.provider();
    let r = tokio::time::timeout(Duration::from_secs(10), p.read_file(SBX, "/home/user/zero")).await;
    let e = r.expect("refused without waiting for 2 GiB").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert_eq!(e.message, "is larger than 1 GiB, the most one read takes: /home/user/zero");
}

#[tokio::test]
async fn make_dir_on_an_existing_path() {
    let fake = Fake::start(files_server()).await;
    let p = fake.provider();
    p.write_file(SBX, "/f", b"x".to_vec(), None).await.unwrap();
    let e = p.make_dir(SBX, "/f").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "exists and is not a directory");
    assert!(e.message.contains("not a directory"), "{}", e.message);
}

#[tokio::test]
async fn stdin_is_sent_then_closed() {
    let pending: Arc<Mutex<Option<mpsc::UnboundedSender<Vec<u8>>>>> = Arc::default();
    let input: Arc<Mutex<Vec<u8>>> = Arc::default();
    let (p2, i2) = (pending.clone(), input.clone());
    let fake = Fake::start(move |req| match req.path.as_str() {
        "/process.Process/Start" => {
            let (tx, rx) = mpsc::unbounded_channel();
            tx.send(event(json!({"start":{"pid":7}}))).unwrap();
            *p2.lock().unwrap() = Some(tx);
            Some(Resp::Stream(rx))
        }
        "/process.Process/SendInput" => {
            let b = req.json()["input"]["stdin"].as_str().unwrap().to_string();
            i2.lock().unwrap().extend(base64::engine::general_purpose::STANDARD.decode(b).unwrap());
            Some(json_resp(200, json!({})))
        }
        "/process.Process/CloseStdin" => {
            // `cat` echoes its input and exits at EOF.
            let tx = p2.lock().unwrap().take().unwrap();
            let echoed = String::from_utf8(i2.lock().unwrap().clone()).unwrap();
            tx.send(event(json!({"data":{"stdout":b64(&echoed)}}))).unwrap();
            tx.send(event(json!({"end":{"exited":true,"status":"exit status 0"}}))).unwrap();
            tx.send(frame(2, &json!({}))).unwrap();
            Some(json_resp(200, json!({})))
        }
        _ => None,
    })
    .await;
    let mut req = cmd("cat");
    req.stdin = Some(b"line 1\nline 2\n".to_vec());
    let r = fake.provider().exec(SBX, req, None).await.unwrap();
    assert_eq!(r.stdout, b"line 1\nline 2\n");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(fake.requests("POST", "/process.Process/Start")[0].envelope_json()["stdin"], json!(true));
    assert_eq!(fake.requests("POST", "/process.Process/CloseStdin")[0].json(), json!({"process":{"pid":7}}));
}

#[tokio::test]
async fn wait_on_a_pid_started_elsewhere_attaches_with_connect() {
    let fake = Fake::start(|req| {
        (req.path == "/process.Process/Connect").then(|| {
            if req.envelope_json() != json!({"process":{"pid":55}}) {
                return stream_of(vec![frame(2, &json!({"error":{"code":"not_found","message":"no process"}}))]);
            }
            stream_of(vec![
                event(json!({"start":{"pid":55}})),
                event(json!({"data":{"stdout":b64("late\n")}})),
                event(json!({"end":{"exitCode":2,"exited":true,"status":"exit status 2"}})),
                frame(2, &json!({})),
            ])
        })
    })
    .await;
    let p = fake.provider();
    let r = p.wait(SBX, 55, Duration::from_secs(5)).await.unwrap();
    assert_eq!((r.exit_code, r.timed_out, r.stdout.as_slice()), (Some(2), false, b"late\n".as_slice()));
    let e = p.wait(SBX, 56, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("no such process: 56"), "{}", e.message);
}

#[tokio::test]
async fn destroy_all_kills_what_this_provider_created() {
    let n = Arc::new(Mutex::new(0));
    let n2 = n.clone();
    let fake = Fake::start(move |req| match (req.method.as_str(), req.path.as_str()) {
        ("POST", "/v2/sandboxes") => {
            let mut n = n2.lock().unwrap();
            *n += 1;
            Some(json_resp(
                201,
                json!({"sandboxID":format!("made{n}"),"templateID":"t","clientID":"c","envdVersion":"0.6.13"}),
            ))
        }
        ("DELETE", _) => Some(Resp::Full { status: 204, headers: vec![], body: vec![] }),
        _ => None,
    })
    .await;
    let p = fake.provider();
    for _ in 0..2 {
        p.create(CreateRequest::default()).await.unwrap();
    }
    assert_eq!(p.stats().peak_live, 2);
    assert_eq!(p.destroy_all().await, 2);
    let st = p.stats();
    assert_eq!((st.created, st.destroyed, st.live, st.peak_live), (2, 2, 0, 2));
    let mut killed: Vec<String> =
        fake.log.lock().unwrap().iter().filter(|r| r.method == "DELETE").map(|r| r.path.clone()).collect();
    killed.sort();
    assert_eq!(killed, vec!["/sandboxes/made1", "/sandboxes/made2"]);
    assert_eq!(p.destroy_all().await, 0);
}

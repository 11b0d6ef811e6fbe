//! `scenario-run serve` on the real binary, spoken to with raw HTTP (reqwest): create a
//! sandbox, run a command through the Connect `Process/Start` stream, check the streamed
//! output and exit code, the 401 and 502 error bodies, kill, and clean shutdown on SIGTERM;
//! the data plane's authentication (envd token, signed `/files` URLs, traffic token on
//! ports); and its bounds (create validation, `--max-sandboxes`, a gzip bomb, slow readers,
//! Connect body size).
//! Needs what the local provider needs (root, bwrap, nsenter), like `local_provider.rs`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};

const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

/// The server process; SIGKILLed if a test fails before stopping it.
struct Server {
    child: Option<Child>,
    base: String,
    _state: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Self {
        Self::start_env(extra, &[])
    }

    /// [`Server::start`] with variables set for the server (`TMPDIR`, say).
    fn start_env(extra: &[&str], env: &[(&str, &std::path::Path)]) -> Self {
        let state = tempfile::Builder::new().prefix("srserve-").tempdir().unwrap();
        // The key from the environment, as README prefers (a flag's value is in /proc/<pid>/cmdline).
        let mut child = Command::new(common::bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("SCENARIO_RUN_STATE_DIR", state.path())
            .env("E2B_API_KEY", KEY)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("server starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("ready line within 30 s");
        assert!(!line.is_empty(), "serve exited before listening");
        let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("ready line: {line:?}"));
        Self { base: base.to_string(), child: Some(child), _state: state }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn port(&self) -> u16 {
        self.base.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// SIGTERM, wait, and return (success, stderr).
    fn stop(mut self) -> (bool, String) {
        let child = self.child.take().unwrap();
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = child.wait_with_output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn envelope(v: &Value) -> Vec<u8> {
    let payload = v.to_string().into_bytes();
    let mut b = vec![0u8];
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend(payload);
    b
}

/// Splits a Connect streaming body into (flags, JSON) envelopes.
fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while !body.is_empty() {
        assert!(body.len() >= 5, "truncated envelope header");
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        let json = serde_json::from_slice(&body[5..5 + len]).expect("envelope holds JSON");
        out.push((body[0], json));
        body = &body[5 + len..];
    }
    out
}

#[tokio::test]
async fn serve_speaks_the_e2b_protocol() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = scenario_run::net::client_builder().build().unwrap();

    // Health needs no key; everything else on the control plane does.
    let r = http.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    for auth in [None, Some(("X-API-KEY", "e2b_wrong".to_string()))] {
        let mut req = http.post(format!("{base}/v2/sandboxes")).json(&json!({"templateID": "base"}));
        if let Some((h, v)) = auth {
            req = req.header(h, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], 401);
        assert!(body["message"].as_str().unwrap().contains("API key"), "{body}");
    }

    // Create (v2, with the Bearer form of the key).
    let r = http
        .post(format!("{base}/v2/sandboxes"))
        .bearer_auth(KEY)
        .json(&json!({"templateID": "base", "timeout": 60, "metadata": {"who": "serve.rs"}, "envVars": {"FOO": "bar"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let sb: Value = r.json().await.unwrap();
    let id = sb["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 20);
    assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()), "{id}");
    assert_eq!(sb["templateID"], "base");
    assert_eq!(sb["clientID"], "6532622b");
    assert!(sb["envdVersion"].as_str().is_some());
    let token = sb["envdAccessToken"].as_str().expect("an envd access token").to_string();
    let traffic = sb["trafficAccessToken"].as_str().expect("a traffic access token").to_string();
    assert_eq!(token.len(), 64);
    assert_ne!(token, traffic);

    // Process/Start: start{pid}, stdout and stderr data, end with the exit code, end-stream {}.
    let start = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi; echo $FOO >&2; exit 7"]},
        "stdin": false,
    });
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/connect+json")
        .header("Connect-Protocol-Version", "1")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/connect+json");
    let frames = envelopes(&r.bytes().await.unwrap());
    let pid = frames[0].1["event"]["start"]["pid"].as_u64().expect("first event is start");
    assert!(pid > 0);
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut stdout, mut stderr, mut end) = (Vec::new(), Vec::new(), None);
    for (flags, msg) in &frames[1..frames.len() - 1] {
        assert_eq!(*flags, 0);
        let ev = &msg["event"];
        if let Some(s) = ev["data"]["stdout"].as_str() {
            stdout.extend(b64.decode(s).unwrap());
        } else if let Some(s) = ev["data"]["stderr"].as_str() {
            stderr.extend(b64.decode(s).unwrap());
        } else if ev.get("end").is_some() {
            end = Some(ev["end"].clone());
        }
    }
    assert_eq!(stdout, b"hi\n");
    assert_eq!(stderr, b"bar\n");
    let end = end.expect("an end event");
    assert_eq!(end["exitCode"], 7);
    assert_eq!(end["status"], "exit status 7");
    assert_eq!(frames.last().unwrap(), &(2u8, json!({})));

    // A bad cwd fails the stream in its end-stream envelope, as connect-go does.
    let bad = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "pwd"], "cwd": "/nope"}, "stdin": false});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&bad))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let frames = envelopes(&r.bytes().await.unwrap());
    assert_eq!(frames.len(), 1);
    assert_eq!(frames[0].0, 2);
    assert_eq!(frames[0].1["error"]["code"], "invalid_argument");

    // Unary RPC errors carry the Connect code and the matching HTTP status.
    let r = http
        .post(format!("{base}/filesystem.Filesystem/Stat"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .json(&json!({"path": "/home/user/missing"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "not_found");

    // Detail, then kill (204, then 404 with a JSON body).
    let r = http.get(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let detail: Value = r.json().await.unwrap();
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["metadata"], json!({"who": "serve.rs"}));
    assert_eq!(detail["envdAccessToken"], token.as_str(), "SandboxDetail carries the envd token, as E2B's");
    for key in ["startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion", "clientID"] {
        assert!(detail.get(key).is_some(), "SandboxDetail lacks {key}: {detail}");
    }
    let r = http.delete(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = http.delete(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 404);

    // envd or a port of a killed (or never existing) sandbox: 502 with E2B's proxy's words
    // (the JS SDK's own `ping server in non-running sandbox` compares them).
    for sid in [id.as_str(), "nosuchsandbox0000000"] {
        let envd = http.post(format!("{base}/process.Process/List")).header("E2b-Sandbox-Id", sid).json(&json!({}));
        // `*.localhost` resolved to loopback by scenario-run's resolver.
        let port = client().get(format!("http://3000-{sid}.localhost:{}/", server.port()));
        for req in [envd, port] {
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 502);
            let body: Value = r.json().await.unwrap();
            assert_eq!(body, json!({"sandboxId": sid, "code": 502, "message": "The sandbox was not found"}));
        }
    }

    let (ok, stderr) = server.stop();
    assert!(ok, "server exit: {stderr}");
    assert!(stderr.contains("destroyed 0 sandboxes"), "{stderr}");
}

#[tokio::test]
async fn serve_destroys_its_sandboxes_on_sigterm_and_injects_faults() {
    let server = Server::start(&["--fault-429-every", "2"]);
    let base = server.base.clone();
    let http = scenario_run::net::client_builder().build().unwrap();
    let create =
        || http.post(format!("{base}/sandboxes")).header("X-API-KEY", KEY).json(&json!({"templateID": "base"}));
    // Request 1 passes, request 2 is the injected 429 with Retry-After, request 3 passes.
    let r = create().send().await.unwrap();
    assert_eq!(r.status(), 201);
    let r = create().send().await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 429);
    let r = create().send().await.unwrap();
    assert_eq!(r.status(), 201);
    let (ok, stderr) = server.stop();
    assert!(ok, "server exit: {stderr}");
    assert!(stderr.contains("destroyed 2 sandboxes"), "{stderr}");
}

#[tokio::test]
async fn serve_fault_flags_cut_streams_and_answer_503() {
    let server = Server::start(&["--fault-cut-stream-after", "64", "--fault-5xx-every", "3", "--fault-latency", "50"]);
    let base = server.base.clone();
    let http = scenario_run::net::client_builder().build().unwrap();
    let t = std::time::Instant::now();
    // Requests 1 and 2 pass (each delayed), request 3 is the injected 503.
    let r = http.get(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(t.elapsed() >= Duration::from_millis(50));
    let r = http
        .post(format!("{base}/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let sb = r.json::<Value>().await.unwrap();
    let (id, token) =
        (sb["sandboxID"].as_str().unwrap().to_string(), sb["envdAccessToken"].as_str().unwrap().to_string());
    let r = http.get(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 503);
    // Request 4: a process stream with more than 64 bytes of output is cut mid-body.
    let start =
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "head -c 5000 /dev/zero"]}, "stdin": false});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.is_err(), "the body should have been cut");
    let (ok, stderr) = server.stop();
    assert!(ok, "server exit: {stderr}");
    assert!(stderr.contains("destroyed 1 sandbox"), "{stderr}");
}

// ---- the data plane's authentication (issue 12, item 5) -------------------------------------

/// A sandbox made through serve: its id and both tokens.
struct Made {
    id: String,
    token: String,
    traffic: String,
}

fn client() -> reqwest::Client {
    scenario_run::net::client_builder().dns_resolver(scenario_run::net::LoopbackResolver).build().unwrap()
}

async fn make(http: &reqwest::Client, base: &str) -> Made {
    let r = http
        .post(format!("{base}/v2/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base", "timeout": 120}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let sb: Value = r.json().await.unwrap();
    // Absent tokens read as empty, so that these tests, run against a server without
    // authentication, fail at what they check rather than here.
    let text = |k: &str| sb[k].as_str().unwrap_or_default().to_string();
    Made { id: text("sandboxID"), token: text("envdAccessToken"), traffic: text("trafficAccessToken") }
}

/// Runs `cmd` to its end through Process/Start with the token: (stdout, end event or error).
async fn run_cmd(http: &reqwest::Client, base: &str, sb: &Made, cmd: &str) -> (String, Value) {
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = Vec::new();
    let mut last = Value::Null;
    for (flags, msg) in envelopes(&r.bytes().await.unwrap()) {
        if let Some(s) = msg["event"]["data"]["stdout"].as_str() {
            out.extend(b64.decode(s).unwrap());
        } else if msg["event"].get("end").is_some() {
            last = msg["event"]["end"].clone();
        } else if flags == 2 && msg.get("error").is_some() {
            last = msg.clone();
        }
    }
    (String::from_utf8_lossy(&out).into_owned(), last)
}

/// A credential header to add, if any: (name, value).
type Credential<'a> = Option<(&'a str, &'a str)>;

/// (what, method, path and query, extra header, expected message).
type SignedCase<'a> = (&'a str, reqwest::Method, String, Option<(&'a str, String)>, &'a str);

/// Every envd route, as (method, path, body).
fn envd_routes() -> Vec<(reqwest::Method, &'static str, Vec<u8>)> {
    use reqwest::Method;
    let start = envelope(&json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo pwned > /tmp/pwned"]}}));
    // Not pid 1: with the token, SIGKILL to the sandbox's init would end the sandbox.
    let pid = json!({"process": {"pid": 999_999}}).to_string().into_bytes();
    let path = json!({"path": "/tmp"}).to_string().into_bytes();
    vec![
        (Method::POST, "/process.Process/Start", start),
        (Method::POST, "/process.Process/Connect", envelope(&json!({"process": {"pid": 999_999}}))),
        (Method::POST, "/process.Process/List", b"{}".to_vec()),
        (
            Method::POST,
            "/process.Process/SendSignal",
            json!({"process": {"pid": 999_999}, "signal": "SIGNAL_SIGKILL"}).to_string().into_bytes(),
        ),
        (
            Method::POST,
            "/process.Process/SendInput",
            json!({"process": {"pid": 999_999}, "input": {"stdin": "aGkK"}}).to_string().into_bytes(),
        ),
        (Method::POST, "/process.Process/CloseStdin", pid),
        (Method::POST, "/process.Process/StreamInput", b"{}".to_vec()),
        (Method::POST, "/filesystem.Filesystem/Stat", path.clone()),
        (Method::POST, "/filesystem.Filesystem/ListDir", path.clone()),
        (Method::POST, "/filesystem.Filesystem/MakeDir", json!({"path": "/tmp/pwned-dir"}).to_string().into_bytes()),
        (
            Method::POST,
            "/filesystem.Filesystem/Move",
            json!({"source": "/tmp/a", "destination": "/tmp/b"}).to_string().into_bytes(),
        ),
        (Method::POST, "/filesystem.Filesystem/Remove", json!({"path": "/home/user"}).to_string().into_bytes()),
        (Method::POST, "/filesystem.Filesystem/WatchDir", path),
        (Method::GET, "/files?path=/etc/hostname", Vec::new()),
        (Method::POST, "/files?path=/tmp/pwned", b"pwned".to_vec()),
    ]
}

#[tokio::test]
async fn envd_routes_refuse_requests_without_the_token() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let host = format!("49983-{}.localhost:{}", sb.id, server.port());
    let wrong = "0".repeat(64);
    for (method, path, body) in envd_routes() {
        let ctype = if path.starts_with("/files") { "application/octet-stream" } else { "application/json" };
        // (how the sandbox is named, extra credential header, expected 401)
        let cases: Vec<(&str, Credential, bool)> = vec![
            ("header", None, true),
            ("host", None, true),
            ("header", Some(("X-Access-Token", wrong.as_str())), true),
            ("header", Some(("X-API-KEY", "e2b_0000000000000000000000000000000000000000")), true),
            // The other sandbox-scoped token does not open envd.
            ("header", Some(("e2b-traffic-access-token", sb.traffic.as_str())), true),
            ("header", Some(("X-Access-Token", sb.token.as_str())), false),
            ("host", Some(("X-Access-Token", sb.token.as_str())), false),
            ("header", Some(("X-API-KEY", KEY)), false),
        ];
        for (via, cred, refused) in cases {
            let url = match via {
                "host" => format!("http://{host}{path}"),
                _ => format!("{base}{path}"),
            };
            let mut req = http.request(method.clone(), &url).header("Content-Type", ctype).body(body.clone());
            if via == "header" {
                req = req.header("E2b-Sandbox-Id", &sb.id).header("E2b-Sandbox-Port", "49983");
            }
            if let Some((h, v)) = cred {
                req = req.header(h, v);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            if refused {
                let text = r.text().await.unwrap_or_default();
                assert_eq!(status, 401, "{method} {path} via {via} with {cred:?}: {text}");
                let body: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(body["code"], 401, "{text}");
                assert!(!text.contains(&sb.token) && !text.contains(&sb.traffic), "a token echoed: {text}");
            } else {
                // Let in: the status says so. The body is not read: a stream let in (WatchDir)
                // runs until the client hangs up, which dropping the response does.
                assert_ne!(status, 401, "{method} {path} via {via} with {cred:?}");
            }
        }
    }
    // Health stays open, as envd's.
    let r = http.get(format!("{base}/health")).header("E2b-Sandbox-Id", &sb.id).send().await.unwrap();
    assert_eq!(r.status(), 204);
    // Nothing the refused requests asked for happened (the accepted ones ran `echo pwned`
    // only after being let in, so check before them: a fresh sandbox).
    let fresh = make(&http, &base).await;
    for (method, path, body) in envd_routes() {
        let r = http
            .request(method, format!("{base}{path}"))
            .header("E2b-Sandbox-Id", &fresh.id)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }
    let (out, end) = run_cmd(&http, &base, &fresh, "ls /tmp/pwned /tmp/pwned-dir 2>&1; ls -d /home/user").await;
    assert!(out.contains("No such file") && out.contains("/home/user\n"), "{out} {end}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// `?path=…&signature=…[&signature_expiration=…]` as the SDK's `download_url`/`upload_url`.
fn signed(path: &str, op: &str, token: &str, expiration: Option<i64>) -> String {
    use sha2::Digest;
    let raw = match expiration {
        Some(e) => format!("{path}:{op}::{token}:{e}"),
        None => format!("{path}:{op}::{token}"),
    };
    let sig = base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(raw.as_bytes()));
    let mut q = format!(
        "/files?path={}&signature={}",
        scenario_run::net::url_encode(path),
        scenario_run::net::url_encode(&format!("v1_{sig}"))
    );
    if let Some(e) = expiration {
        q.push_str(&format!("&signature_expiration={e}"));
    }
    q
}

#[tokio::test]
async fn files_take_a_signature_in_place_of_the_token() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let other = make(&http, &base).await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let path = "/home/user/signed file.txt";
    // Write through a signed URL: with the sandbox header, and with no sandbox named at all
    // (the SDK's URL on E2B_SANDBOX_URL): the signature says whose it is.
    for (i, with_header) in [(0, true), (1, false)] {
        let mut req = http
            .post(format!("{base}{}", signed(path, "write", &sb.token, Some(now + 60))))
            .header("Content-Type", "application/octet-stream")
            .body(format!("written {i}"));
        if with_header {
            req = req.header("E2b-Sandbox-Id", &sb.id);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let r = http.get(format!("{base}{}", signed(path, "read", &sb.token, None))).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().await.unwrap(), format!("written {i}"));
    }
    // The other sandbox's file system was not touched.
    let r = http.get(format!("{base}{}", signed(path, "read", &other.token, None))).send().await.unwrap();
    assert_eq!(r.status(), 404, "{}", r.text().await.unwrap());
    // Refusals, each with envd's message.
    let cases: Vec<SignedCase> = vec![
        (
            "no credential",
            reqwest::Method::GET,
            format!("/files?path={}", scenario_run::net::url_encode(path)),
            None,
            "missing signature",
        ),
        (
            "wrong signature",
            reqwest::Method::GET,
            signed(path, "read", &"f".repeat(64), None),
            None,
            "invalid signature",
        ),
        (
            "another path",
            reqwest::Method::GET,
            signed(path, "read", &sb.token, None).replace("signed%20file", "other"),
            None,
            "invalid signature",
        ),
        (
            "a read signature used to write",
            reqwest::Method::POST,
            signed(path, "read", &sb.token, None),
            None,
            "invalid signature",
        ),
        (
            "expired",
            reqwest::Method::GET,
            signed(path, "read", &sb.token, Some(now - 5)),
            None,
            "signature is already expired",
        ),
        (
            "expiration changed",
            reqwest::Method::GET,
            signed(path, "read", &sb.token, Some(now + 60))
                .replace(&format!("={}", now + 60), &format!("={}", now + 999)),
            None,
            "invalid signature",
        ),
        (
            "a wrong token beside a good signature",
            reqwest::Method::GET,
            signed(path, "read", &sb.token, None),
            Some(("X-Access-Token", "0".repeat(64))),
            "does not match",
        ),
    ];
    for (what, method, q, extra, want) in cases {
        for with_header in [true, false] {
            let mut req = http
                .request(method.clone(), format!("{base}{q}"))
                .header("Content-Type", "application/octet-stream")
                .body("x");
            if with_header {
                req = req.header("E2b-Sandbox-Id", &sb.id);
            }
            if let Some((h, v)) = &extra {
                req = req.header(*h, v);
            }
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            if !with_header && what == "no credential" {
                // No sandbox and no signature: that is the control plane, which wants the key.
                assert_eq!(status, 401, "{what}: {body}");
                continue;
            }
            assert_eq!(status, 401, "{what} (sandbox header: {with_header}): {body}");
            assert!(body.contains(want), "{what}: {body}");
        }
    }
    let r = http.get(format!("{base}{}", signed(path, "read", &sb.token, None))).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "written 1", "no refused write landed");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// A tiny HTTP server for inside the sandbox: answers every GET with the request's headers.
const ECHO_SERVER: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = "".join(f"{k.lower()}: {v}\n" for k, v in self.headers.items()).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8080), H).serve_forever()
"#;

#[tokio::test]
async fn ports_need_the_traffic_token() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let url = format!("http://8080-{}.localhost:{}/hello", sb.id, server.port());
    start_echo(&http, &base, &sb, &url, Some(("e2b-traffic-access-token", &sb.traffic))).await;
    let get = |cred: Option<(&'static str, String)>| {
        let mut req = http.get(&url);
        if let Some((h, v)) = cred {
            req = req.header(h, v);
        }
        req.send()
    };
    // Refused: E2B's proxy answers 403, missing or invalid.
    for (cred, want) in [
        (None, "missing traffic access token"),
        (Some(("e2b-traffic-access-token", "0".repeat(64))), "invalid traffic access token"),
        (Some(("X-Access-Token", "0".repeat(64))), "missing traffic access token"),
        (
            Some(("X-API-KEY", "e2b_0000000000000000000000000000000000000000".to_string())),
            "missing traffic access token",
        ),
    ] {
        let r = get(cred.clone()).await.unwrap();
        assert_eq!(r.status(), 403, "{cred:?}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], 403);
        assert_eq!(body["sandboxId"], sb.id.as_str());
        assert!(body["message"].as_str().unwrap().contains(want), "{body}");
    }
    // The header form of E2B's edge is held to the same rule.
    let r = http
        .get(format!("{base}/hello"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("E2b-Sandbox-Port", "8080")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // Accepted: the traffic token, the envd token, the API key; none reaches the application.
    for cred in [
        ("e2b-traffic-access-token", sb.traffic.clone()),
        ("X-Access-Token", sb.token.clone()),
        ("X-API-KEY", KEY.to_string()),
    ] {
        let r = get(Some(cred.clone())).await.unwrap();
        assert_eq!(r.status(), 200, "{cred:?}");
        let seen = r.text().await.unwrap();
        assert!(seen.contains(&format!("host: 8080-{}", sb.id)), "{seen}");
        for secret in [&sb.traffic, &sb.token, &KEY.to_string()] {
            assert!(!seen.contains(secret.as_str()), "a credential reached the application: {seen}");
        }
        assert!(!seen.contains("e2b-traffic-access-token"), "{seen}");
    }
    let r = http
        .get(format!("{base}/hello"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("E2b-Sandbox-Port", "8080")
        .header("e2b-traffic-access-token", &sb.traffic)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // Another sandbox's token does not open this one.
    let other = make(&http, &base).await;
    let r = get(Some(("e2b-traffic-access-token", other.traffic.clone()))).await.unwrap();
    assert_eq!(r.status(), 403);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// `network.maskRequestHost` (the JS and Python SDKs' own `maskRequestHost` tests): the port
/// proxy sends the sandbox's application that `Host`, `${PORT}` filled in, instead of the
/// caller's; `get_info` reports it; one that could not be a header is refused at create; a
/// sandbox made without it still sees the caller's `Host`.
#[tokio::test]
async fn ports_see_the_masked_request_host() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let (status, body) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/v2/sandboxes"),
        Some(json!({"templateID": "base", "network": {"maskRequestHost": "bad\nhost:${PORT}"}})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("maskRequestHost"), "{body}");
    let masked = make_with(
        &http,
        &base,
        json!({"templateID": "base", "timeout": 120, "network": {"maskRequestHost": "custom-host.example.com:${PORT}"}}),
    )
    .await;
    let plain = make(&http, &base).await;
    let (status, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", masked.id), None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["network"]["maskRequestHost"], "custom-host.example.com:${PORT}", "{info}");
    for (sb, want) in [
        (&masked, "host: custom-host.example.com:8080\n".to_string()),
        (&plain, format!("host: 8080-{}.localhost:{}\n", plain.id, server.port())),
    ] {
        let url = format!("http://8080-{}.localhost:{}/hello", sb.id, server.port());
        start_echo(&http, &base, sb, &url, Some(("e2b-traffic-access-token", &sb.traffic))).await;
        let r = http.get(&url).header("e2b-traffic-access-token", &sb.traffic).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let seen = r.text().await.unwrap();
        assert!(seen.contains(&want), "want {want:?} in {seen}");
    }
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// `network.allowPublicTraffic: true` in so many words (the JS SDK's own `sandbox works without
/// token`): that sandbox's ports take requests without a token; `get_info` says so; any other
/// sandbox's stay private; a value that is not a boolean is refused at create.
#[tokio::test]
async fn ports_are_public_only_when_create_asks() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let (status, body) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/v2/sandboxes"),
        Some(json!({"templateID": "base", "network": {"allowPublicTraffic": "yes"}})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("allowPublicTraffic"), "{body}");
    let public =
        make_with(&http, &base, json!({"templateID": "base", "timeout": 120, "network": {"allowPublicTraffic": true}}))
            .await;
    let private = make_with(
        &http,
        &base,
        json!({"templateID": "base", "timeout": 120, "network": {"allowPublicTraffic": false}}),
    )
    .await;
    let (_, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", public.id), None).await;
    assert_eq!(info["network"]["allowPublicTraffic"], true, "{info}");
    let url = |sb: &Made| format!("http://8080-{}.localhost:{}/hello", sb.id, server.port());
    // Up with the token first, so that what follows is about the token alone.
    for sb in [&public, &private] {
        start_echo(&http, &base, sb, &url(sb), Some(("e2b-traffic-access-token", &sb.traffic))).await;
    }
    let r = http.get(url(&public)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains(&format!("host: 8080-{}", public.id)));
    assert_eq!(http.get(url(&private)).send().await.unwrap().status(), 403);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

// ---- bounded input (issue 13, items 12 and 13) ----------------------------------------------

#[tokio::test]
async fn create_refuses_what_e2b_refuses() {
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let create = |body: &'static str| {
        http.post(format!("{base}/sandboxes"))
            .header("X-API-KEY", KEY)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    for (body, status, want) in [
        ("[]", 400, "JSON object"),
        ("\"base\"", 400, "JSON object"),
        ("{\"templateID\": 7}", 400, "parsing request"),
        ("{\"templateID\": \"no-such-template\"}", 404, "template 'no-such-template' not found"),
        ("{\"envVars\": {\"A\": \"x\\u0000y\"}}", 400, "NUL"),
        ("{\"envVars\": {\"A\\u0000B\": \"x\"}}", 400, "NUL"),
        ("{\"envVars\": {\"A=B\": \"x\"}}", 400, "'='"),
        ("{\"envVars\": {\"\": \"x\"}}", 400, "empty"),
        ("{\"metadata\": {\"k\": \"v\\u0000\"}}", 400, "NUL"),
    ] {
        let r = create(body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{body}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["code"], status, "{body}");
        assert!(b["message"].as_str().unwrap().contains(want), "{body}: {b}");
    }
    // None of them made a sandbox.
    let r = http.get(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!([]));
    // NUL in a command's envs is refused too.
    let sb = make(&http, &base).await;
    // Every route with a JSON body takes an object of its shape, or answers 400 in its API's
    // words, before it looks at the sandbox.
    for (method, route, body) in [
        (reqwest::Method::POST, format!("/sandboxes/{}/timeout", sb.id), "[]"),
        (reqwest::Method::POST, format!("/sandboxes/{}/connect", sb.id), "{\"timeout\": \"x\"}"),
        (reqwest::Method::PUT, format!("/sandboxes/{}/network", sb.id), "{\"allow_internet_access\": \"yes\"}"),
        (reqwest::Method::POST, format!("/sandboxes/{}/pause", sb.id), "[1]"),
        (reqwest::Method::POST, format!("/sandboxes/{}/snapshots", sb.id), "{"),
        (reqwest::Method::POST, "/sandboxes/no-such-sandbox/fork".to_string(), "{\"count\": -1}"),
    ] {
        let r =
            http.request(method, format!("{base}{route}")).header("X-API-KEY", KEY).body(body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{route} {body}");
        let b: Value = r.json().await.unwrap();
        assert!(b["message"].as_str().unwrap().starts_with("Error when parsing request: "), "{route}: {b}");
    }
    let r = http
        .post(format!("{base}/v1/sandboxes"))
        .header("OPEN-SANDBOX-API-KEY", KEY)
        .header("Content-Type", "application/json")
        .body("[]")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "SANDBOX::INVALID_PARAMETER", "{b}");
    assert_eq!(b["message"], "invalid request body: the body must be a JSON object", "{b}");
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "env"], "envs": {"A": "x\u{0}y"}}});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    let frames = envelopes(&r.bytes().await.unwrap());
    assert_eq!(frames[0].1["error"]["code"], "invalid_argument", "{frames:?}");
    // A Connect body past the limit is 413, not read into memory.
    let r = http
        .post(format!("{base}/filesystem.Filesystem/Stat"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/json")
        .body(vec![b' '; 20 << 20])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

#[test]
fn a_short_api_key_is_refused() {
    let mut child = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key", "e2b_short"])
        .env_remove("E2B_API_KEY")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that takes the key runs until stopped: give it 10 s to refuse.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started with a 9-character key");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(2));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("at least 32"), "{err}");
    assert!(!err.contains("e2b_short"), "the key is not echoed: {err}");
}

/// Issue 35 item 8: `serve --api-key K` put the key in /proc/<pid>/cmdline, readable by every
/// local user. The key comes from `--api-key-file` (first line, trimmed) or E2B_API_KEY, and
/// is then nowhere in serve's command line; `--api-key` still works, with a warning.
#[tokio::test]
async fn the_key_comes_from_a_file_or_the_environment_never_the_command_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let http = client();
    let by_file = Server::start_env(&["--api-key-file", file.to_str().unwrap()], &[]);
    let by_env = Server::start(&[]);
    for server in [&by_file, &by_env] {
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", server.pid())).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.starts_with(&common::bin().display().to_string()), "{cmdline}");
        assert!(!cmdline.contains(KEY), "the key is on serve's command line: {cmdline}");
        let list = |key: &str| http.get(format!("{}/v2/sandboxes", server.base)).header("X-API-KEY", key).send();
        assert_eq!(list(KEY).await.unwrap().status(), 200, "{cmdline}");
        assert_eq!(list("e2b_0000000000000000000000000000000000000000").await.unwrap().status(), 401);
    }
    // The file's key, not the environment's (the test's serve has E2B_API_KEY too): a file
    // holding another key is what serve takes.
    let other = "e2b_fedcba9876543210fedcba9876543210fedcba98";
    std::fs::write(&file, format!("  {other}  \n")).unwrap();
    let by_other_file = Server::start_env(&["--api-key-file", file.to_str().unwrap()], &[]);
    let r = http.get(format!("{}/v2/sandboxes", by_other_file.base)).header("X-API-KEY", other).send().await.unwrap();
    assert_eq!(r.status(), 200);
    for server in [by_file, by_env, by_other_file] {
        let (ok, stderr) = server.stop();
        assert!(ok && !stderr.contains("warning: --api-key"), "{stderr}");
    }
    // The flag still works, and says who else can read the key.
    let by_flag = Server::start(&["--api-key", KEY]);
    let r = http.get(format!("{}/v2/sandboxes", by_flag.base)).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (ok, stderr) = by_flag.stop();
    assert!(ok && stderr.contains("warning: --api-key puts the key where every local user can read it"), "{stderr}");
    assert!(!stderr.contains(KEY), "the key is not echoed: {stderr}");
}

/// Issue 35 item 5: a declared disk (E2B's diskSizeMB, OpenSandbox's ephemeral-storage, up
/// to 1 TiB) was never held against the free space where the sandboxes' sparse images live,
/// so sandboxes could fill the host's disk. A disk larger than what is free is refused, 507,
/// naming the size, what is free and the knob, in each API's error shape; a normal create
/// still works.
#[tokio::test]
async fn a_disk_past_the_hosts_free_space_is_refused() {
    let server = Server::start(&[]);
    let free_mib = free_mib(server._state.path());
    if free_mib >= 1 << 20 {
        eprintln!("skipped: the state directory's filesystem has {free_mib} MiB free, more than the largest disk");
        return;
    }
    let base = server.base.clone();
    let http = client();
    let r = http
        .post(format!("{base}/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base", "diskSizeMB": 1 << 20}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 507);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], 507, "{b}");
    let m = b["message"].as_str().unwrap();
    assert!(m.contains("not enough disk space on this host: the sandbox declares a disk of 1 TiB"), "{m}");
    assert!(m.contains(" free") && m.contains("SCENARIO_RUN_DISK_OVERCOMMIT"), "{m}");
    assert!(!m.contains(&server._state.path().display().to_string()), "no host path: {m}");
    let r = http
        .post(format!("{base}/v1/sandboxes"))
        .header("OPEN-SANDBOX-API-KEY", KEY)
        .json(&json!({"templateId": "base", "timeout": 300, "resourceLimits": {"ephemeral-storage": "1Ti"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 507);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["code"], "SANDBOX::INSUFFICIENT_STORAGE", "{b}");
    assert!(b["message"].as_str().unwrap().contains("declares a disk of 1 TiB"), "{b}");
    // Nothing was made, and what fits is made.
    let r = http.get(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), json!([]));
    let r = http
        .post(format!("{base}/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base", "diskSizeMB": 64}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// The space free on the filesystem of `dir`, MiB.
fn free_mib(dir: &std::path::Path) -> u64 {
    let out = Command::new("df").args(["-B1M", "--output=avail"]).arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().last().unwrap().trim().parse().unwrap()
}

/// Issue 35 item 8: a 500 named host paths of serve's (here the folder of an official
/// template that does not load); it says what failed, and the path goes to serve's stderr.
#[tokio::test]
async fn a_server_error_names_no_host_path() {
    let templates = tempfile::tempdir().unwrap();
    let folder = templates.path().join("code-interpreter-v1");
    std::fs::create_dir_all(folder.join("template.yaml")).unwrap();
    std::fs::write(folder.join("Dockerfile"), "FROM base\n").unwrap();
    let server = Server::start_env(&[], &[("SCENARIO_RUN_TEMPLATES_DIR", templates.path())]);
    let http = client();
    let r = http
        .post(format!("{}/sandboxes", server.base))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "code-interpreter-v1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let b: Value = r.json().await.unwrap();
    let m = b["message"].as_str().unwrap();
    assert!(m.starts_with("cannot read <path>: "), "says what failed: {m}");
    assert!(!m.contains(&templates.path().display().to_string()) && !m.contains("/tmp"), "a host path: {m}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
    assert!(stderr.contains(&folder.join("template.yaml").display().to_string()), "the detail is logged: {stderr}");
}

#[tokio::test]
async fn max_sandboxes_caps_live_sandboxes() {
    let server = Server::start(&["--max-sandboxes", "2"]);
    let base = server.base.clone();
    let http = client();
    let a = make(&http, &base).await;
    let _b = make(&http, &base).await;
    let r = http.post(format!("{base}/sandboxes")).header("X-API-KEY", KEY).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("maximum number of concurrent sandboxes (2)"), "{body}");
    // A place comes back when a sandbox goes, by kill or by expiry.
    let r = http.delete(format!("{base}/sandboxes/{}", a.id)).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let c = make(&http, &base).await;
    let r = http
        .post(format!("{base}/sandboxes/{}/timeout", c.id))
        .header("X-API-KEY", KEY)
        .json(&json!({"timeout": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let _d = make(&http, &base).await;
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// Peak resident memory of process `pid` (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A download streams from the open file, as envd's does: a file past the 1 GiB that one read
/// takes comes whole, and serve's memory stays flat (it used to read the file into memory
/// first, and refuse one past 1 GiB). The file is opened with the request's user's rights.
#[tokio::test]
async fn downloads_stream_from_the_open_file() {
    const SIZE: u64 = 1536 << 20;
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    // Sparse: 1.5 GiB of zeros that take no disk, and a root-only file.
    let (out, _) = run_cmd(
        &http,
        &base,
        &sb,
        &format!(
            "truncate -s {SIZE} big && sudo sh -c 'echo secret > /root.only && chmod 600 /root.only' && echo made"
        ),
    )
    .await;
    assert_eq!(out, "made\n");
    let get = |path: &str| {
        http.get(format!("{base}/files?path={path}"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .send()
    };
    let before = peak_rss_kib(server.pid());
    let mut r = get("big").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(SIZE));
    let (mut n, mut stray) = (0u64, false);
    while let Some(chunk) = r.chunk().await.unwrap() {
        n += chunk.len() as u64;
        stray |= chunk.iter().any(|b| *b != 0);
    }
    assert_eq!(n, SIZE);
    assert!(!stray, "a sparse file reads as zeros");
    let after = peak_rss_kib(server.pid());
    eprintln!("a {SIZE}-byte download: serve's peak RSS {before} KiB before, {after} KiB after");
    assert!(after < before + 100 * 1024, "peak RSS went from {before} KiB to {after} KiB");
    // The sandbox user cannot read root's file; root can.
    let r = get("/root.only").await.unwrap();
    assert_ne!(r.status(), 200);
    let refusal = r.text().await.unwrap();
    assert!(refusal.contains("permission denied") && !refusal.contains("secret"), "{refusal}");
    let r = get("/root.only&username=root").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "secret\n");
    // A download under way ends when its sandbox is killed, rather than hold its disk open.
    let mut r = get("big").await.unwrap();
    let mut n = r.chunk().await.unwrap().expect("a first chunk").len() as u64;
    let (status, _) = api(&http, reqwest::Method::DELETE, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(status, 204);
    let cut = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match r.chunk().await {
                Ok(Some(c)) => n += c.len() as u64,
                Ok(None) => return false,
                Err(_) => return true,
            }
        }
    })
    .await
    .expect("the download ends soon after the kill");
    assert!(cut && n < SIZE, "the killed sandbox's download went on: {n} of {SIZE} bytes, cut: {cut}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// 800 MB of zeros through `gzip -9`: about 780 KB.
fn gzip_bomb() -> Vec<u8> {
    let out = Command::new("sh").args(["-c", "head -c 800000000 /dev/zero | gzip -9"]).output().unwrap();
    assert!(out.status.success());
    assert!(out.stdout.len() < 1 << 20, "{}", out.stdout.len());
    out.stdout
}

/// Regression (issue 13, item 12): a 783 KB gzip upload to `/files` inflated to 800 MB of
/// server memory. It is refused now while it inflates on disk, and memory stays flat.
#[tokio::test]
async fn a_gzip_bomb_upload_is_refused_without_inflating_in_memory() {
    let bomb = tokio::task::spawn_blocking(gzip_bomb).await.unwrap();
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let upload = |body: Vec<u8>, path: &str| {
        http.post(format!("{base}/files?path={path}"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .header("Content-Type", "application/octet-stream")
            .header("Content-Encoding", "gzip")
            .body(body)
            .send()
    };
    let before = peak_rss_kib(server.pid());
    let r = upload(bomb, "/tmp/bomb.bin").await.unwrap();
    assert_eq!(r.status(), 413);
    assert!(r.text().await.unwrap().contains("--max-inflate-ratio"));
    let after = peak_rss_kib(server.pid());
    eprintln!("gzip bomb: serve's peak RSS {before} KiB before, {after} KiB after");
    assert!(after < before + 100 * 1024, "peak RSS went from {before} KiB to {after} KiB");
    // No spool file is left behind, and nothing was written.
    let spool = std::env::temp_dir().join(format!("scenario-run-serve-{}-{}/spool", server.pid(), server.port()));
    let left: Vec<_> = std::fs::read_dir(&spool).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "{left:?}");
    let (out, _) = run_cmd(&http, &base, &sb, "test -e /tmp/bomb.bin && echo there || echo absent").await;
    assert_eq!(out, "absent\n");
    // An honest gzip upload still works.
    let text: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, text.as_bytes()).unwrap();
    let r = upload(gz.finish().unwrap(), "/tmp/text.txt").await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(format!("{base}/files?path=/tmp/text.txt"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), text);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

#[tokio::test]
async fn uploads_past_max_upload_are_refused() {
    let server = Server::start(&["--max-upload", "1MiB"]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let send = |n: usize, multipart: bool| {
        let req = http
            .post(format!("{base}/files?path=/tmp/big"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token);
        if multipart {
            let body = scenario_run_multipart(n);
            req.header("Content-Type", "multipart/form-data; boundary=XyZ").body(body).send()
        } else {
            req.header("Content-Type", "application/octet-stream").body(vec![b'a'; n]).send()
        }
    };
    for multipart in [false, true] {
        assert_eq!(send(1 << 20, multipart).await.unwrap().status(), 200, "multipart: {multipart}");
        let r = send((1 << 20) + 1, multipart).await.unwrap();
        assert_eq!(r.status(), 413, "multipart: {multipart}");
        assert!(r.text().await.unwrap().contains("--max-upload"));
    }
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

fn scenario_run_multipart(n: usize) -> Vec<u8> {
    let mut b = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/big\"\r\n\r\n".to_vec();
    b.extend(vec![b'a'; n]);
    b.extend_from_slice(b"\r\n--XyZ--\r\n");
    b
}

/// Regression (issue 13, item 13): a client that opens a process stream and does not read it
/// made serve queue the whole output in memory. It is cut off after a bounded backlog now.
#[tokio::test]
async fn a_client_that_does_not_read_its_stream_is_cut_off() {
    use std::io::{Read, Write};
    let server = Server::start(&[]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let before = peak_rss_kib(server.pid());
    // 400 MB of output to a client that reads nothing until the process is done.
    let body = envelope(
        &json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "head -c 400000000 /dev/zero; echo done > /tmp/done"]}, "stdin": false}),
    );
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    sock.shrink_receive_buffer();
    write!(
        sock,
        "POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\nE2b-Sandbox-Id: {}\r\nX-Access-Token: {}\r\n\
         Content-Type: application/connect+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        sb.id,
        sb.token,
        body.len()
    )
    .unwrap();
    sock.write_all(&body).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (out, _) = run_cmd(&http, &base, &sb, "cat /tmp/done 2>/dev/null || true").await;
        if out == "done\n" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the writer did not finish");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let after = peak_rss_kib(server.pid());
    eprintln!("400 MB to a client that does not read: serve's peak RSS {before} KiB before, {after} KiB after");
    assert!(after < before + 64 * 1024, "peak RSS went from {before} KiB to {after} KiB");
    // What was queued is delivered, then the stream ends with the reason.
    let mut all = Vec::new();
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let _ = sock.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all);
    assert!(
        text.contains("resource_exhausted") && text.contains("fell behind"),
        "{}",
        &text[text.len().saturating_sub(400)..]
    );
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// A small receive buffer, so that the kernel holds little of what the client does not read.
trait SmallBuffer {
    fn shrink_receive_buffer(&self);
}

impl SmallBuffer for std::net::TcpStream {
    fn shrink_receive_buffer(&self) {
        use std::os::fd::AsRawFd;
        let size: libc::c_int = 64 << 10;
        // SAFETY: setsockopt on a socket we own, with a c_int option value.
        unsafe {
            libc::setsockopt(
                self.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

#[tokio::test]
async fn a_create_repeated_after_an_answer_that_was_not_a_refusal_is_counted() {
    // Requests 1 (create), 2 (its repeat: the injected 503), 3 (another repeat), 4 (stats).
    let server = Server::start(&["--fault-5xx-every", "2"]);
    let base = server.base.clone();
    let http = client();
    let create = |key: &'static str| {
        http.post(format!("{base}/sandboxes"))
            .header("X-API-KEY", KEY)
            .header("Idempotency-Key", key)
            .json(&json!({}))
            .send()
    };
    assert_eq!(create("k1").await.unwrap().status(), 201);
    assert_eq!(create("k1").await.unwrap().status(), 503);
    assert_eq!(create("k1").await.unwrap().status(), 201);
    let r = http.get(format!("{base}/_serve/stats")).header("X-API-KEY", KEY).send().await.unwrap();
    let stats: Value = r.json().await.unwrap();
    assert_eq!(stats, json!({"live": 2, "creates": 3, "refusedCreates": 0, "doubleCreates": 2}));
    let r = http.get(format!("{base}/_serve/stats")).send().await.unwrap();
    assert_eq!(r.status(), 401, "stats need the key");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
    assert!(stderr.contains("3 creates, 0 refused, 2 double"), "{stderr}");
}

// ---- issue 17: what the official SDK suite found missing or wrong ----

async fn api(http: &reqwest::Client, method: reqwest::Method, url: String, body: Option<Value>) -> (u16, Value) {
    let mut r = http.request(method, url).header("X-API-KEY", KEY);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn make_with(http: &reqwest::Client, base: &str, body: Value) -> Made {
    let (status, sb) = api(http, reqwest::Method::POST, format!("{base}/v2/sandboxes"), Some(body)).await;
    assert_eq!(status, 201, "{sb}");
    let text = |k: &str| sb[k].as_str().unwrap_or_default().to_string();
    Made { id: text("sandboxID"), token: text("envdAccessToken"), traffic: text("trafficAccessToken") }
}

async fn unary(http: &reqwest::Client, base: &str, sb: &Made, route: &str, body: Value) -> (u16, Value) {
    let r = http
        .post(format!("{base}/{route}"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array().unwrap().iter().map(|s| s["sandboxID"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn issue_17_list_orders_by_start_time_and_filters_by_start_and_template() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let tag = json!({"templateID": "base", "timeout": 120, "metadata": {"t": "order"}});
    // Both start within the same second, which is what made the order fall back to the id.
    let a = make_with(&http, &base, tag.clone()).await;
    let b = make_with(&http, &base, tag).await;
    let list = |q: &str| api(&http, reqwest::Method::GET, format!("{base}/v2/sandboxes?metadata=t%3Dorder{q}"), None);
    let (_, desc) = list("").await;
    assert_eq!(ids(&desc), [b.id.clone(), a.id.clone()], "newest first");
    let (_, asc) = list("&order=asc").await;
    assert_eq!(ids(&asc), [a.id.clone(), b.id.clone()]);
    let b_started = desc[0]["startedAt"].as_str().unwrap().to_string();
    let (_, after) = list(&format!("&startedAfter={}", b_started.replace(':', "%3A"))).await;
    assert_eq!(
        ids(&after),
        std::slice::from_ref(&b.id),
        "startedAfter is inclusive and leaves out what started before"
    );
    let later: jiff::Timestamp = b_started.parse().unwrap();
    let later = (later + jiff::SignedDuration::from_secs(1)).to_string().replace(':', "%3A");
    let (_, none) = list(&format!("&startedAfter={later}")).await;
    assert_eq!(ids(&none), Vec::<String>::new());
    let (_, by_template) = list("&template=base").await;
    assert_eq!(ids(&by_template).len(), 2);
    let (_, unknown) = list("&template=unknown-template").await;
    assert_eq!(ids(&unknown), Vec::<String>::new());
    server.stop();
}

#[tokio::test]
async fn issue_17_list_dir_is_depth_first_and_stat_follows_symlinks() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (_, end) = run_cmd(
        &http,
        &base,
        &sb,
        "mkdir -p d/a/x d/b && touch d/a/f d/c && ln -s /home/user/d/c d/link && ln -s c d/rel",
    )
    .await;
    assert!(end.get("error").is_none(), "{end}");
    let (status, r) = unary(&http, &base, &sb, "filesystem.Filesystem/ListDir", json!({"path": "d", "depth": 2})).await;
    assert_eq!(status, 200, "{r}");
    let names: Vec<&str> = r["entries"].as_array().unwrap().iter().map(|e| e["path"].as_str().unwrap()).collect();
    let want = ["a", "a/f", "a/x", "b", "c", "link", "rel"].map(|n| format!("/home/user/d/{n}"));
    assert_eq!(names, want, "each directory's entries right after it, in lexical order");
    for link in ["d/link", "d/rel"] {
        let (status, r) = unary(&http, &base, &sb, "filesystem.Filesystem/Stat", json!({"path": link})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["entry"]["type"], "FILE_TYPE_FILE", "{link}: the link is followed: {r}");
        assert_eq!(r["entry"]["symlinkTarget"], "/home/user/d/c", "{link}");
    }
    let (_, r) = unary(&http, &base, &sb, "filesystem.Filesystem/Stat", json!({"path": "d/c"})).await;
    assert!(r["entry"].get("symlinkTarget").is_none(), "{r}");
    server.stop();
}

#[tokio::test]
async fn issue_17_a_sandbox_killed_under_a_command_resets_its_stream() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "sleep 60"]}, "stdin": false});
    let mut r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().expect("the start event");
    assert!(String::from_utf8_lossy(&first).contains("start"));
    let (status, _) = api(&http, reqwest::Method::DELETE, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(status, 204);
    // envd's connection drops with its sandbox: no end event, no clean end of stream.
    let mut rest = Vec::new();
    let outcome = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match r.chunk().await {
                Ok(Some(c)) => rest.extend_from_slice(&c),
                Ok(None) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the stream ends within 10 s");
    assert!(outcome.is_err(), "the stream ended cleanly: {:?}", String::from_utf8_lossy(&rest));
    let health = http.get(format!("{base}/health")).header("E2b-Sandbox-Id", &sb.id).send().await.unwrap();
    assert_eq!(health.status(), 502, "a client that asks after the cut hears the sandbox is gone");
    server.stop();
}

#[tokio::test]
async fn issue_17_metrics_and_honest_errors_for_routes_serve_lacks() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (status, m) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}/metrics", sb.id), None).await;
    assert_eq!(status, 200, "{m}");
    let m0 = &m.as_array().expect("an array of samples")[0];
    for k in ["timestamp", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "diskUsed", "diskTotal"] {
        assert!(m0.get(k).is_some(), "{k} missing from {m0}");
    }
    assert!(m0["memTotal"].as_u64().unwrap() > 0 && m0["diskTotal"].as_u64().unwrap() > 0, "{m0}");
    let (_, before) =
        api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}/metrics?start=1000&end=2000", sb.id), None).await;
    assert_eq!(before, json!([]), "nothing before the sandbox existed");
    let (status, _) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/nosuchsandbox/metrics"), None).await;
    assert_eq!(status, 404);
    let (status, e) = api(&http, reqwest::Method::POST, format!("{base}/volumes"), Some(json!({"name": "v"}))).await;
    assert_eq!(status, 501, "{e}");
    assert!(e["message"].as_str().unwrap().contains("volumes"), "the feature is named: {e}");
    assert_eq!(e["code"], 501);
    // A network update replaces the lists (the effect inside is proven in sandbox_network.rs).
    let put =
        |id: &str, body: Value| api(&http, reqwest::Method::PUT, format!("{base}/sandboxes/{id}/network"), Some(body));
    let (status, e) = put(&sb.id, json!({"allowOut": ["10.255.255.0/24"], "denyOut": ["0.0.0.0/0"]})).await;
    assert_eq!(status, 204, "{e}");
    let (_, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(info["network"], json!({"allowOut": ["10.255.255.0/24"], "denyOut": ["0.0.0.0/0"]}), "{info}");
    let (status, e) = put(&sb.id, json!({})).await;
    assert_eq!(status, 204, "{e}");
    let (_, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(info["network"], json!({}), "an empty update clears the lists: {info}");
    // Names in allowOut (and dnsServers) are taken and reported; a name in denyOut is refused
    // as E2B refuses it.
    let names =
        json!({"allowOut": ["example.com", "*.example.org:443"], "denyOut": ["0.0.0.0/0"], "dnsServers": ["1.1.1.1"]});
    let (status, e) = put(&sb.id, names.clone()).await;
    assert_eq!(status, 204, "{e}");
    let (_, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(info["network"], names, "{info}");
    assert_eq!(info["allowInternetAccess"], false, "{info}");
    let (status, e) = put(&sb.id, json!({"denyOut": ["example.com"]})).await;
    assert_eq!(status, 400, "{e}");
    assert!(e["message"].as_str().unwrap().contains("allowOut only"), "{e}");
    let (status, e) = put(&sb.id, json!({"dnsServers": ["dns.example"]})).await;
    assert_eq!(status, 400, "{e}");
    let (status, _) = put("nosuchsandbox", json!({})).await;
    assert_eq!(status, 404);
    // Template tags: validated, and an unknown template is not found.
    let tags = |body: Value| api(&http, reqwest::Method::POST, format!("{base}/templates/tags"), Some(body));
    let (status, e) = tags(json!({"target": "nosuch:v1", "tags": [":bad"]})).await;
    assert_eq!(status, 400, "{e}");
    let (status, e) = tags(json!({"target": "nosuch:v1", "tags": ["prod"]})).await;
    assert_eq!(status, 404, "{e}");
    let (status, _) = api(&http, reqwest::Method::GET, format!("{base}/no/such/route"), None).await;
    assert_eq!(status, 404, "a path that is no E2B route at all");
    // Network options serve cannot honour are refused, not accepted and ignored: transform
    // rules, an egress proxy of the caller's.
    let create = |body: Value| api(&http, reqwest::Method::POST, format!("{base}/v2/sandboxes"), Some(body));
    for (network, named) in [
        (json!({"rules": {"example.com": [{"transform": {"headers": {"a": "b"}}}]}}), "transform rules"),
        (json!({"egressProxy": {"address": "proxy:1080"}}), "egress proxy"),
    ] {
        let (status, e) = create(json!({"templateID": "base", "network": network})).await;
        assert_eq!(status, 501, "{e}");
        assert!(e["message"].as_str().unwrap().contains(named), "{e}");
    }
    let (status, e) = create(json!({"templateID": "base", "network": {"allowOut": [1]}})).await;
    assert_eq!(status, 400, "{e}");
    // What the SDKs send by default is accepted, and reported as the sandbox has it.
    let (status, e) = create(json!({"templateID": "base", "allow_internet_access": true})).await;
    assert_eq!(status, 201, "{e}");
    let (_, info) =
        api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", e["sandboxID"].as_str().unwrap()), None).await;
    assert_eq!(info["allowInternetAccess"], true);
    let (status, e) = create(json!({"templateID": "base", "network": {"denyOut": ["0.0.0.0/0"]}})).await;
    assert_eq!(status, 201, "{e}");
    // Template.exists: the name is looked up, not refused.
    let (status, t) = api(&http, reqwest::Method::GET, format!("{base}/templates/aliases/base"), None).await;
    assert_eq!((status, t["templateID"].as_str()), (200, Some("base")), "{t}");
    let (status, _) = api(&http, reqwest::Method::GET, format!("{base}/templates/aliases/nonexistent-x"), None).await;
    assert_eq!(status, 404);
    server.stop();
}

#[tokio::test]
async fn issue_17_a_paused_sandbox_is_frozen_unreachable_and_resumes_on_connect() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    // A ticker: 20 increments a second while it runs.
    let tick = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c",
        "i=0; while :; do i=$((i+1)); echo $i > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.05; done"]}, "stdin": false});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&tick))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = || run_cmd(&http, &base, &sb, "cat /tmp/n");
    let n1: u64 = read().await.0.trim().parse().unwrap();
    let pause = format!("{base}/sandboxes/{}/pause", sb.id);
    let (status, e) = api(&http, reqwest::Method::POST, pause.clone(), Some(json!({}))).await;
    assert_eq!(status, 204, "{e}");
    let (status, _) = api(&http, reqwest::Method::POST, pause, Some(json!({}))).await;
    assert_eq!(status, 409, "already paused");
    let (_, info) = api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(info["state"], "paused");
    let (_, listed) = api(&http, reqwest::Method::GET, format!("{base}/v2/sandboxes?state=paused"), None).await;
    assert_eq!(ids(&listed), std::slice::from_ref(&sb.id));
    let (_, running) = api(&http, reqwest::Method::GET, format!("{base}/v2/sandboxes?state=running"), None).await;
    assert_eq!(ids(&running), Vec::<String>::new());
    let health = http.get(format!("{base}/health")).header("E2b-Sandbox-Id", &sb.id).send().await.unwrap();
    assert_eq!(health.status(), 502, "a paused sandbox is not running");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, e) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/v2/sandboxes/{}/connect", sb.id),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(status, 201, "a resume: {e}");
    let n2: u64 = read().await.0.trim().parse().unwrap();
    // 1.5 s running would be about 30 ticks; frozen, the ticker got no CPU at all.
    assert!(n2 - n1 < 10, "the ticker ran while paused: {n1} -> {n2}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n3: u64 = read().await.0.trim().parse().unwrap();
    assert!(n3 > n2 + 3, "the ticker runs again after the resume: {n2} -> {n3}");
    drop(r);
    server.stop();
}

#[tokio::test]
async fn issue_17_snapshots_and_forks_carry_the_filesystem_not_the_later_changes() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (_, end) = run_cmd(&http, &base, &sb, "echo before > /home/user/state && sudo rm /etc/debian_version").await;
    assert!(end.get("error").is_none(), "{end}");
    let (status, snap) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/sandboxes/{}/snapshots", sb.id),
        Some(json!({"name": "snap-17"})),
    )
    .await;
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["snapshotID"].as_str().unwrap().to_string();
    assert_eq!(snap["names"], json!(["snap-17"]));
    run_cmd(&http, &base, &sb, "echo after > /home/user/state").await;
    let (_, listed) = api(&http, reqwest::Method::GET, format!("{base}/snapshots?sandboxID={}", sb.id), None).await;
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // A sandbox from the snapshot (by name) has the files as they were, deletions included.
    let copy = make_with(&http, &base, json!({"templateID": "snap-17", "timeout": 60})).await;
    let (out, _) = run_cmd(&http, &base, &copy, "cat /home/user/state; test -e /etc/debian_version && echo back").await;
    assert_eq!(out, "before\n", "the snapshot's files, and a whiteout stays a whiteout");
    // A fork starts from the source as it is now, and is independent of it.
    let (status, forks) =
        api(&http, reqwest::Method::POST, format!("{base}/sandboxes/{}/fork", sb.id), Some(json!({"count": 2}))).await;
    assert_eq!(status, 201, "{forks}");
    let forks: Vec<Made> = forks
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let s = &f["sandbox"];
            let text = |k: &str| s[k].as_str().unwrap_or_default().to_string();
            Made { id: text("sandboxID"), token: text("envdAccessToken"), traffic: text("trafficAccessToken") }
        })
        .collect();
    assert_eq!(forks.len(), 2);
    run_cmd(&http, &base, &forks[0], "echo fork > /home/user/state").await;
    assert_eq!(run_cmd(&http, &base, &forks[1], "cat /home/user/state").await.0, "after\n");
    assert_eq!(run_cmd(&http, &base, &sb, "cat /home/user/state").await.0, "after\n");
    let (status, _) = api(&http, reqwest::Method::DELETE, format!("{base}/templates/{snap_id}"), None).await;
    assert_eq!(status, 204);
    let (status, _) = api(&http, reqwest::Method::DELETE, format!("{base}/templates/{snap_id}"), None).await;
    assert_eq!(status, 404, "deleted once");
    let (status, _) =
        api(&http, reqwest::Method::POST, format!("{base}/sandboxes/nosuchsandbox/fork"), Some(json!({}))).await;
    assert_eq!(status, 404);
    server.stop();
}

#[tokio::test]
async fn issue_17_file_metadata_is_kept_in_user_e2b_xattrs() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (_, created) = api(&http, reqwest::Method::POST, format!("{base}/v2/sandboxes"), Some(json!({}))).await;
    assert_eq!(created["envdVersion"], "0.6.4", "the version whose features serve implements");
    let upload = |meta: Vec<(&'static str, &'static str)>| {
        let mut r = http
            .post(format!("{base}/files?path=m.txt"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .header("Content-Type", "application/octet-stream");
        for (k, v) in meta {
            r = r.header(k, v);
        }
        r.body("data").send()
    };
    let r = upload(vec![("X-Metadata-Author", "mish")]).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()[0]["metadata"], json!({"author": "mish"}));
    let (_, st) = unary(&http, &base, &sb, "filesystem.Filesystem/Stat", json!({"path": "m.txt"})).await;
    assert_eq!(st["entry"]["metadata"], json!({"author": "mish"}), "{st}");
    // It is a real extended attribute: the sandbox sees it, and one set inside shows.
    let (out, _) = run_cmd(
        &http,
        &base,
        &sb,
        "python3 -c \"import os; print(os.getxattr('m.txt', 'user.e2b.author').decode()); os.setxattr('m.txt', 'user.e2b.k', b'v')\"",
    )
    .await;
    assert_eq!(out, "mish\n");
    let (_, ls) = unary(&http, &base, &sb, "filesystem.Filesystem/ListDir", json!({"path": "/home/user"})).await;
    let m = ls["entries"].as_array().unwrap().iter().find(|e| e["name"] == "m.txt").unwrap().clone();
    assert_eq!(m["metadata"], json!({"author": "mish", "k": "v"}));
    // An upload without metadata clears it; invalid metadata is refused.
    assert_eq!(upload(vec![]).await.unwrap().status(), 200);
    let (_, st) = unary(&http, &base, &sb, "filesystem.Filesystem/Stat", json!({"path": "m.txt"})).await;
    assert!(st["entry"].get("metadata").is_none(), "{st}");
    assert_eq!(upload(vec![("X-Metadata-Bad", "caf\u{e9}")]).await.unwrap().status(), 400);
    server.stop();
}

#[tokio::test]
async fn issue_17_watchers_report_changes_made_inside_the_sandbox_and_through_files() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    run_cmd(&http, &base, &sb, "mkdir -p w && echo x > plain").await;
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/CreateWatcher", json!({"path": "nowhere"})).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("not_found")), "{e}");
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/CreateWatcher", json!({"path": "plain"})).await;
    assert_eq!((status, e["code"].as_str()), (400, Some("invalid_argument")), "{e}");
    let (status, w) = unary(
        &http,
        &base,
        &sb,
        "filesystem.Filesystem/CreateWatcher",
        json!({"path": "w", "recursive": true, "includeEntry": true}),
    )
    .await;
    assert_eq!(status, 200, "{w}");
    let id = w["watcherId"].as_str().unwrap().to_string();
    run_cmd(&http, &base, &sb, "mkdir w/sub").await;
    run_cmd(&http, &base, &sb, "echo hello > w/sub/f && chmod 600 w/sub/f && mv w/sub/f w/g && rm w/g").await;
    let (_, ev) = unary(&http, &base, &sb, "filesystem.Filesystem/GetWatcherEvents", json!({"watcherId": id})).await;
    let got: Vec<(String, String)> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().trim_start_matches("EVENT_TYPE_").to_string(),
                e["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("CREATE", "sub"),
        ("CREATE", "sub/f"),
        ("WRITE", "sub/f"),
        ("CHMOD", "sub/f"),
        ("RENAME", "sub/f"),
        ("CREATE", "g"),
        ("REMOVE", "g"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(got, want, "{ev}");
    let sub = &ev["events"][0];
    assert_eq!(
        (sub["entry"]["type"].as_str(), sub["entry"]["path"].as_str()),
        (Some("FILE_TYPE_DIRECTORY"), Some("/home/user/w/sub"))
    );
    // Drained: nothing twice. An upload is a create, envd's chown and a write.
    let (_, ev) = unary(&http, &base, &sb, "filesystem.Filesystem/GetWatcherEvents", json!({"watcherId": id})).await;
    assert_eq!(ev["events"], json!([]));
    let r = http
        .post(format!("{base}/files?path=w/up.txt"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/octet-stream")
        .body("data")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, ev) = unary(&http, &base, &sb, "filesystem.Filesystem/GetWatcherEvents", json!({"watcherId": id})).await;
    let types: Vec<&str> = ev["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE", "EVENT_TYPE_CHMOD"], "{ev}");
    let (status, _) = unary(&http, &base, &sb, "filesystem.Filesystem/RemoveWatcher", json!({"watcherId": id})).await;
    assert_eq!(status, 200);
    let (status, _) =
        unary(&http, &base, &sb, "filesystem.Filesystem/GetWatcherEvents", json!({"watcherId": id})).await;
    assert_eq!(status, 404);
    // The streaming form: start, then the change.
    let mut r = http
        .post(format!("{base}/filesystem.Filesystem/WatchDir"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&json!({"path": "/home/user/w"})))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first = r.chunk().await.unwrap().unwrap();
    assert_eq!(envelopes(&first)[0].1, json!({"start": {}}));
    run_cmd(&http, &base, &sb, "touch w/streamed").await;
    let next = tokio::time::timeout(Duration::from_secs(5), r.chunk()).await.unwrap().unwrap().unwrap();
    assert_eq!(envelopes(&next)[0].1["filesystem"]["name"], "streamed");
    server.stop();
}

/// A server stream that fails before its first message (a body that does not parse, a
/// process or directory that is not there) is a 200 whose only envelope is the end of the
/// stream with the error, for each of envd's three streaming methods (issue 19 moved them onto
/// one `stream_call`).
#[tokio::test]
async fn streams_that_fail_before_their_first_message_carry_only_the_error() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    run_cmd(&http, &base, &sb, "echo x > plain").await;
    let truncated = vec![0u8, 0, 0, 0, 9, b'{'];
    let cases: [(&str, Vec<u8>, &str); 7] = [
        ("process.Process/Start", truncated.clone(), "invalid_argument"),
        ("process.Process/Start", envelope(&json!({"process": {"cmd": ""}})), "invalid_argument"),
        ("process.Process/Connect", truncated.clone(), "invalid_argument"),
        ("process.Process/Connect", envelope(&json!({"process": {"pid": 999_999}})), "not_found"),
        ("process.Process/Connect", envelope(&json!({"process": {}})), "invalid_argument"),
        ("filesystem.Filesystem/WatchDir", envelope(&json!({"path": "nowhere"})), "not_found"),
        ("filesystem.Filesystem/WatchDir", envelope(&json!({"path": "plain"})), "invalid_argument"),
    ];
    for (route, body, code) in cases {
        let r = http
            .post(format!("{base}/{route}"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .header("Content-Type", "application/connect+json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{route}");
        let frames = envelopes(&r.bytes().await.unwrap());
        assert_eq!(frames.len(), 1, "{route}: {frames:?}");
        assert_eq!(frames[0].0, 2, "{route}: not the end of the stream: {frames:?}");
        assert_eq!(frames[0].1["error"]["code"], code, "{route}: {frames:?}");
    }
    server.stop();
}

#[tokio::test]
async fn issue_17_a_pty_session_is_a_real_terminal_in_the_sandbox() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": {"TERM": "xterm"}},
        "pty": {"size": {"cols": 80, "rows": 24}}});
    let mut r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/connect+json")
        .body(envelope(&start))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first = envelopes(&r.chunk().await.unwrap().unwrap());
    let pid = first[0].1["event"]["start"]["pid"].as_u64().expect("a start event");
    let b64 = base64::engine::general_purpose::STANDARD;
    let typed = |s: &str| json!({"process": {"pid": pid}, "input": {"pty": b64.encode(s)}});
    let mut out = String::new();
    let mut end = Value::Null;
    // Reads the stream until `until` is in the terminal's output (or the stream ends).
    async fn read_until(r: &mut reqwest::Response, out: &mut String, end: &mut Value, until: &str) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut pending = Vec::new();
        while !out.contains(until) {
            let Some(c) = tokio::time::timeout(Duration::from_secs(20), r.chunk()).await.expect("output").unwrap()
            else {
                return;
            };
            pending.extend_from_slice(&c);
            // Whole envelopes only.
            while pending.len() >= 5 {
                let len = u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
                if pending.len() < 5 + len {
                    break;
                }
                let m: Value = serde_json::from_slice(&pending[5..5 + len]).unwrap();
                pending.drain(..5 + len);
                if let Some(d) = m["event"]["data"]["pty"].as_str() {
                    out.push_str(&String::from_utf8_lossy(&b64.decode(d).unwrap()));
                }
                assert!(m["event"]["data"].get("stdout").is_none(), "terminal output is pty data: {m}");
                if m["event"].get("end").is_some() {
                    *end = m["event"]["end"].clone();
                }
            }
        }
    }
    let (status, e) = unary(&http, &base, &sb, "process.Process/SendInput", typed("tty; tput cols\n")).await;
    assert_eq!(status, 200, "{e}");
    read_until(&mut r, &mut out, &mut end, "\r\n80\r\n").await;
    let (status, e) = unary(
        &http,
        &base,
        &sb,
        "process.Process/Update",
        json!({"process": {"pid": pid}, "pty": {"size": {"cols": 123, "rows": 40}}}),
    )
    .await;
    assert_eq!(status, 200, "{e}");
    unary(&http, &base, &sb, "process.Process/SendInput", typed("tput cols; stty size; exit 7\n")).await;
    read_until(&mut r, &mut out, &mut end, "\u{0}never").await;
    assert!(out.contains("/dev/pts/"), "its stdin is a terminal of the sandbox: {out:?}");
    assert!(out.contains("\r\n80\r\n"), "80 columns at first: {out:?}");
    assert!(out.contains("123\r\n40 123\r\n"), "then resized: {out:?}");
    assert_eq!(end["exitCode"], 7, "{end}");
    server.stop();
}

#[tokio::test]
async fn issue_17_uploads_are_made_as_envd_makes_them() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let upload = |path: &'static str, user: Option<&'static str>| {
        let mut r = http
            .post(format!("{base}/files?path={path}"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .header("Content-Type", "application/octet-stream");
        if let Some(u) = user {
            r = r.basic_auth(u, Some(""));
        }
        r.body("x").send()
    };
    // Any path, and the directories made for it, belong to the user the upload is made as.
    let r = upload("/0/deep/f.txt", None).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    // A relative path is under the home of the user it is made as.
    let r = upload("hello.txt", Some("root")).await.unwrap();
    let (status, body) = (r.status(), r.text().await.unwrap());
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()[0]["path"], "/root/hello.txt");
    let (out, _) = run_cmd(&http, &base, &sb, "sudo stat -c '%U %n' /0 /0/deep /0/deep/f.txt /root/hello.txt").await;
    assert_eq!(out, "user /0\nuser /0/deep\nuser /0/deep/f.txt\nroot /root/hello.txt\n");
    // And a download made as root reads what only root may.
    let r = http
        .get(format!("{base}/files?path=hello.txt"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .basic_auth("root", Some(""))
        .send()
        .await
        .unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap()), (200, "x".to_string()));
    server.stop();
}

/// The product's client (`agent-sandbox-client`) takes each sandbox's envd from `envdUrl` and
/// otherwise derives `https://49983-{id}.{domain}`, which serve (plain HTTP, one port) cannot
/// answer: create, detail and connect name the origin the request came to, and envd answers
/// there for the `E2b-Sandbox-Id` the client sends.
#[tokio::test]
async fn sandbox_bodies_name_envd_at_the_origin_the_client_used() {
    let srv = Server::start(&[]);
    let http = client();
    let (status, made) =
        api(&http, reqwest::Method::POST, format!("{}/sandboxes", srv.base), Some(json!({"templateID": "base"}))).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["envdUrl"], srv.base.as_str(), "{made}");
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let (status, detail) = api(&http, reqwest::Method::GET, format!("{}/sandboxes/{id}", srv.base), None).await;
    assert_eq!((status, &detail["envdUrl"]), (200, &json!(srv.base)), "{detail}");
    let (status, connected) =
        api(&http, reqwest::Method::POST, format!("{}/sandboxes/{id}/connect", srv.base), Some(json!({"timeout": 60})))
            .await;
    assert_eq!((status, &connected["envdUrl"]), (200, &json!(srv.base)), "{connected}");
    // The origin is the one asked at, not a fixed address.
    let r = http
        .get(format!("{}/sandboxes/{id}", srv.base))
        .header("X-API-KEY", KEY)
        .header("Host", format!("localhost:{}", srv.port()))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["envdUrl"], format!("http://localhost:{}", srv.port()), "{v}");
    // envd answers at that URL, routed by the sandbox id header.
    let sb =
        Made { id: id.clone(), token: made["envdAccessToken"].as_str().unwrap().to_string(), traffic: String::new() };
    let url = made["envdUrl"].as_str().unwrap();
    let (out, end) = run_cmd(&http, url, &sb, "echo envd at $E2B_SANDBOX_ID").await;
    assert_eq!(out, format!("envd at {id}\n"), "{end}");
    // Lists stay E2B's `ListedSandbox`.
    let (_, list) = api(&http, reqwest::Method::GET, format!("{}/sandboxes", srv.base), None).await;
    assert!(list[0].get("envdUrl").is_none(), "{list}");
    assert!(srv.stop().0);
}

/// E2B's filesystem-only pause (`pause` with `memory: false`, or `autoPauseMemory: false` at
/// the timeout): the processes end, the files stay, and the resume cold-boots the sandbox, which
/// the official SDK tests see as a new `/proc/sys/kernel/random/boot_id`. A pause that keeps
/// memory keeps the boot id and the processes.
#[tokio::test]
async fn a_filesystem_only_pause_reboots_the_sandbox_and_keeps_its_files() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let boot_id = "cat /proc/sys/kernel/random/boot_id";
    let state = |id: String| {
        let (http, base) = (http.clone(), base.clone());
        async move { api(&http, reqwest::Method::GET, format!("{base}/sandboxes/{id}"), None).await.1["state"].clone() }
    };
    let connect = |id: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let url = format!("{base}/v2/sandboxes/{id}/connect");
            let (status, e) = api(&http, reqwest::Method::POST, url, Some(json!({"timeout": 60}))).await;
            assert_eq!(status, 201, "a resume: {e}");
        }
    };
    // A process that would live on, and a file.
    let alive = "kill -0 $(cat /home/user/pid) 2>/dev/null && echo alive || echo gone";
    let sb = make(&http, &base).await;
    let (_, end) =
        run_cmd(&http, &base, &sb, "echo kept > /home/user/marker; sleep 1000 & echo $! > /home/user/pid").await;
    assert!(end.get("error").is_none(), "{end}");
    let (boot1, _) = run_cmd(&http, &base, &sb, boot_id).await;
    assert_eq!(boot1.trim().len(), 36, "a UUID: {boot1:?}");
    assert_eq!(run_cmd(&http, &base, &sb, boot_id).await.0, boot1, "one boot, one boot id");
    let host = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_ne!(boot1, host, "a sandbox boots apart from the host");

    // Keeping memory: the same boot, its process still there.
    let pause = format!("{base}/sandboxes/{}/pause", sb.id);
    let (status, e) = api(&http, reqwest::Method::POST, pause.clone(), Some(json!({"memory": true}))).await;
    assert_eq!(status, 204, "{e}");
    connect(sb.id.clone()).await;
    assert_eq!(run_cmd(&http, &base, &sb, boot_id).await.0, boot1);
    assert_eq!(run_cmd(&http, &base, &sb, alive).await.0, "alive\n");

    // Filesystem only: paused, then a new boot with the files and without the process.
    let (status, e) = api(&http, reqwest::Method::POST, pause.clone(), Some(json!({"memory": false}))).await;
    assert_eq!(status, 204, "{e}");
    assert_eq!(state(sb.id.clone()).await, "paused");
    connect(sb.id.clone()).await;
    assert_eq!(state(sb.id.clone()).await, "running");
    let (boot2, _) = run_cmd(&http, &base, &sb, boot_id).await;
    assert_eq!(boot2.trim().len(), 36, "a UUID: {boot2:?}");
    assert_ne!(boot2, boot1, "a filesystem-only resume is a new boot");
    assert_eq!(run_cmd(&http, &base, &sb, "cat /home/user/marker").await.0, "kept\n");
    assert_eq!(run_cmd(&http, &base, &sb, alive).await.0, "gone\n");
    // The rebooted sandbox is a whole one: a file written now, a process started now.
    let (out, _) = run_cmd(&http, &base, &sb, "echo again > /home/user/m2 && cat /home/user/m2").await;
    assert_eq!(out, "again\n");

    // The timeout's auto-pause without memory reboots it too.
    let auto = make_with(
        &http,
        &base,
        json!({"templateID": "base", "timeout": 2, "autoPause": true, "autoPauseMemory": false}),
    )
    .await;
    run_cmd(&http, &base, &auto, "echo kept > /home/user/marker").await;
    let (boot3, _) = run_cmd(&http, &base, &auto, boot_id).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state(auto.id.clone()).await != "paused" {
        assert!(std::time::Instant::now() < deadline, "auto-paused at its timeout");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    connect(auto.id.clone()).await;
    assert_ne!(run_cmd(&http, &base, &auto, boot_id).await.0, boot3);
    assert_eq!(run_cmd(&http, &base, &auto, "cat /home/user/marker").await.0, "kept\n");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// A template context with symlinks (relative, absolute, dangling, and one to the host's
/// `/etc/shadow`), built through the template API as the SDK's `copy("folder/*", …)` does: the
/// links are copied as links, as Docker copies them, never followed on the host, so the build
/// neither fails ("outside the template folder") nor copies a host file into the template.
#[tokio::test]
async fn copy_keeps_symlinks_in_the_context_as_links_and_never_reads_their_targets() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    // The context, as the SDK uploads it: a gzipped tar of the matched files.
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let mut file = tar::Header::new_gnu();
    file.set_size(5);
    file.set_mode(0o644);
    tar.append_data(&mut file, "folder/test.txt", &b"hello"[..]).unwrap();
    for (name, target) in [
        ("rel.txt", "test.txt"),
        ("abs.txt", "/tmp/nowhere/test.txt"),
        ("dangling.txt", "12345"),
        ("shadow", "/etc/shadow"),
    ] {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        h.set_mode(0o777);
        tar.append_link(&mut h, format!("folder/{name}"), target).unwrap();
    }
    let gz = tar.into_inner().unwrap().finish().unwrap();

    let (status, t) =
        api(&http, reqwest::Method::POST, format!("{base}/v3/templates"), Some(json!({"name": "links"}))).await;
    assert_eq!(status, 202, "{t}");
    let (id, build) = (t["templateID"].as_str().unwrap().to_string(), t["buildID"].as_str().unwrap().to_string());
    let (status, f) = api(&http, reqwest::Method::GET, format!("{base}/templates/{id}/files/h1"), None).await;
    assert_eq!(status, 201, "{f}");
    let r = http.put(f["url"].as_str().unwrap()).body(gz).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let steps = json!([{"type": "COPY", "args": ["folder/*", "/copied", "", ""], "filesHash": "h1"}]);
    let url = format!("{base}/v2/templates/{id}/builds/{build}");
    let (status, e) =
        api(&http, reqwest::Method::POST, url, Some(json!({"fromTemplate": "base", "steps": steps}))).await;
    assert_eq!(status, 202, "{e}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, st) =
            api(&http, reqwest::Method::GET, format!("{base}/templates/{id}/builds/{build}/status"), None).await;
        match st["status"].as_str() {
            Some("ready") => break,
            Some("error") => panic!("the build failed: {st}"),
            _ => {}
        }
        assert!(std::time::Instant::now() < deadline, "the build ends: {st}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let sb = make_with(&http, &base, json!({"templateID": id, "timeout": 60})).await;
    let (out, _) = run_cmd(
        &http,
        &base,
        &sb,
        "cd /copied && for f in rel.txt abs.txt dangling.txt shadow; do test -L $f && echo $f $(readlink $f); done; cat rel.txt",
    )
    .await;
    assert_eq!(
        out, "rel.txt test.txt\nabs.txt /tmp/nowhere/test.txt\ndangling.txt 12345\nshadow /etc/shadow\nhello",
        "every link copied as a link, with its target as written"
    );
    // Inside, the link names the sandbox's own file, not the host's.
    let (through_link, _) = run_cmd(&http, &base, &sb, "sudo cat /copied/shadow").await;
    let (own, _) = run_cmd(&http, &base, &sb, "sudo cat /etc/shadow").await;
    assert!(!own.is_empty());
    assert_eq!(through_link, own, "the link reads the sandbox's /etc/shadow");
    if let Ok(host) = std::fs::read_to_string("/etc/shadow") {
        assert_ne!(through_link, host, "the host's /etc/shadow leaked");
    }
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// E2B's base image (`FROM python:3.11.6`) has `python`; the SDK's own `test_ping_server` runs
/// `python -m http.server` in it.
#[tokio::test]
async fn the_base_image_has_python_as_e2bs_does() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (out, end) = run_cmd(&http, &base, &sb, "python -c 'import sys; print(sys.version_info[0])'").await;
    assert_eq!(out, "3\n", "{end}");
    server.stop();
}

/// The server's end of a client connection has `TCP_NODELAY`. Without it every small write
/// after the first of a streamed response (the Connect frames of `Process/Start`) waits for
/// the client's delayed ACK: `commands.run("true")` took 59 ms instead of 4. Checked on the
/// server's own socket, taken from the running process with `pidfd_getfd`.
#[test]
fn accepted_connections_are_nodelay() {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let server = Server::start(&[]);
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 256];
    let n = conn.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 "), "a response");
    // The server's socket of this connection: local port = serve's, remote = ours.
    let (ours, theirs) = (conn.local_addr().unwrap().port(), server.port());
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let inode = tcp
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
            (port(f[1]) == Some(theirs) && port(f[2]) == Some(ours)).then(|| f[9].to_string())
        })
        .expect("the server's end of the connection in /proc/net/tcp");
    let link = format!("socket:[{inode}]");
    let fd_dir = format!("/proc/{}/fd", server.pid());
    let remote_fd: i32 = std::fs::read_dir(&fd_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == link))
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .expect("serve holds the socket");
    // SAFETY: pidfd_open/pidfd_getfd/getsockopt on descriptors this test owns afterwards.
    let nodelay = unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, server.pid(), 0) as i32;
        assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        let _pidfd = std::os::fd::OwnedFd::from_raw_fd(pidfd);
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, remote_fd, 0) as i32;
        assert!(fd >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        let _fd = std::os::fd::OwnedFd::from_raw_fd(fd);
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let r =
            libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, (&mut v as *mut libc::c_int).cast(), &mut len);
        assert_eq!(r, 0, "getsockopt: {}", std::io::Error::last_os_error());
        v
    };
    assert_ne!(nodelay, 0, "serve's socket has TCP_NODELAY");
    drop(conn);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

// ---- https port hosts (TLS on serve's port) --------------------------------------------------

/// A client that trusts only the CA in `ca_dir` (and resolves `*.localhost` to loopback).
fn tls_client(ca_dir: &std::path::Path) -> reqwest::Client {
    let pem = std::fs::read(ca_dir.join("ca.pem")).expect("serve wrote its CA certificate");
    let ca = reqwest::Certificate::from_pem(&pem).unwrap();
    scenario_run::net::client_builder()
        .dns_resolver(scenario_run::net::LoopbackResolver)
        .tls_certs_only([ca])
        .build()
        .unwrap()
}

/// An HTTP server in `sb` on port 8080 that echoes its request headers, once it answers.
async fn start_echo(http: &reqwest::Client, base: &str, sb: &Made, url: &str, cred: Credential<'_>) {
    let r = http
        .post(format!("{base}/files?path=/tmp/echo.py"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/octet-stream")
        .body(ECHO_SERVER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    run_cmd(http, base, sb, "python3 /tmp/echo.py >/dev/null 2>&1 &").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut req = http.get(url);
        if let Some((h, v)) = cred {
            req = req.header(h, v);
        }
        let r = req.send().await.unwrap();
        if r.status() == 200 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the echo server did not come up: {}", r.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn port_hosts_answer_https_with_a_certificate_from_serves_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    let server = Server::start(&["--ca-dir", ca_dir.to_str().unwrap()]);
    let port = server.port();
    let https = tls_client(&ca_dir);
    let base = format!("https://localhost:{port}");
    // The control plane over TLS; envdUrl names the scheme the request came in with.
    let r = https
        .post(format!("{base}/v2/sandboxes"))
        .header("X-API-KEY", KEY)
        .json(&json!({"templateID": "base", "timeout": 120}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    assert_eq!(made["envdUrl"], format!("https://localhost:{port}"), "{made}");
    let sb = make(&https, &base).await;
    // envd through its own port host, over TLS.
    let envd = format!("https://49983-{}.localhost:{port}", sb.id);
    let r = https
        .post(format!("{envd}/files?path=/tmp/hello.txt"))
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/octet-stream")
        .body("over tls")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (out, end) = run_cmd(&https, &envd, &sb, "cat /tmp/hello.txt").await;
    assert_eq!((out.as_str(), end["exitCode"].as_i64().unwrap_or(0)), ("over tls", 0), "{end}");
    // A server in the sandbox, through https://8080-<id>.localhost:<port>.
    let url = format!("https://8080-{}.localhost:{port}/hello", sb.id);
    start_echo(&https, &base, &sb, &url, Some(("e2b-traffic-access-token", &sb.traffic))).await;
    let r = https.get(&url).header("e2b-traffic-access-token", &sb.traffic).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let seen = r.text().await.unwrap();
    assert!(seen.contains(&format!("host: 8080-{}.localhost:{port}", sb.id)), "{seen}");
    assert!(!seen.contains(&sb.traffic), "the token reached the application: {seen}");
    // The traffic token is needed over TLS as over HTTP.
    let r = https.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 403);
    // Plain HTTP on the same port still works, to the same server.
    let plain = client();
    let r = plain
        .get(format!("http://8080-{}.localhost:{port}/hello", sb.id))
        .header("e2b-traffic-access-token", &sb.traffic)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A client that does not trust serve's CA refuses the certificate; one that trusts
    // another CA too.
    let untrusting =
        scenario_run::net::client_builder().dns_resolver(scenario_run::net::LoopbackResolver).build().unwrap();
    let e = untrusting.get(&url).send().await.unwrap_err();
    assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
    let other = tempfile::tempdir().unwrap();
    scenario_run::server::tls::Ca::load_or_create(other.path()).unwrap();
    let e = tls_client(other.path()).get(&url).send().await.unwrap_err();
    assert!(format!("{e:?}").contains("BadSignature") || format!("{e:?}").contains("UnknownIssuer"), "{e:?}");
    // maskRequestHost: the sandbox's server is sent that Host, the port put in.
    let body = json!({"templateID": "base", "timeout": 120, "network": {"maskRequestHost": "custom-host.example.com:${PORT}"}});
    let r = https.post(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let made: Value = r.json().await.unwrap();
    let text = |k: &str| made[k].as_str().unwrap_or_default().to_string();
    let masked = Made { id: text("sandboxID"), token: text("envdAccessToken"), traffic: text("trafficAccessToken") };
    let url = format!("https://8080-{}.localhost:{port}/hello", masked.id);
    start_echo(&https, &base, &masked, &url, Some(("e2b-traffic-access-token", &masked.traffic))).await;
    let r = https.get(&url).header("e2b-traffic-access-token", &masked.traffic).send().await.unwrap();
    let seen = r.text().await.unwrap();
    assert!(seen.contains("host: custom-host.example.com:8080\n"), "{seen}");
    let body = json!({"templateID": "base", "network": {"maskRequestHost": "bad\nhost"}});
    let r = https.post(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 400);
    // A connection that sends nothing holds up no one.
    let idle = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), https.get(format!("{base}/health")).send()).await;
    assert_eq!(r.expect("answered beside an idle connection").unwrap().status(), 204);
    drop(idle);
    let (ok, stderr) = server.stop();
    assert!(ok && stderr.contains("destroyed 3 sandboxes"), "{stderr}");
    // The CA is kept: a second server in the same directory signs with it.
    let ca = std::fs::read(ca_dir.join("ca.pem")).unwrap();
    let again = Server::start(&["--ca-dir", ca_dir.to_str().unwrap()]);
    assert_eq!(std::fs::read(ca_dir.join("ca.pem")).unwrap(), ca);
    let r = https.get(format!("https://localhost:{}/health", again.port())).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let (ok, stderr) = again.stop();
    assert!(ok, "{stderr}");
}

#[tokio::test]
async fn allow_public_traffic_opens_ports_and_false_keeps_them_private() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("ca");
    for default_public in [false, true] {
        let mut flags = vec!["--ca-dir", ca_dir.to_str().unwrap()];
        if default_public {
            flags.push("--allow-public-traffic");
        }
        let server = Server::start(&flags);
        let port = server.port();
        let https = tls_client(&ca_dir);
        let base = format!("https://localhost:{port}");
        // (create's network, ports public?)
        let cases = [
            (None, default_public),
            (Some(json!({"allowPublicTraffic": true})), true),
            (Some(json!({"allowPublicTraffic": false})), false),
        ];
        for (network, public) in cases {
            let mut body = json!({"templateID": "base", "timeout": 120});
            if let Some(n) = &network {
                body["network"] = n.clone();
            }
            let r =
                https.post(format!("{base}/v2/sandboxes")).header("X-API-KEY", KEY).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 201);
            let made: Value = r.json().await.unwrap();
            let what = format!("default public {default_public}, network {network:?}");
            // E2B names a traffic token only for private ports.
            assert_eq!(made["trafficAccessToken"].is_null(), public, "{what}: {made}");
            let sb = Made {
                id: made["sandboxID"].as_str().unwrap().into(),
                token: made["envdAccessToken"].as_str().unwrap().into(),
                traffic: made["trafficAccessToken"].as_str().unwrap_or_default().into(),
            };
            let url = format!("https://8080-{}.localhost:{port}/hello", sb.id);
            let cred = (!public).then_some(("e2b-traffic-access-token", sb.traffic.as_str()));
            start_echo(&https, &base, &sb, &url, cred).await;
            let r = https.get(&url).send().await.unwrap();
            assert_eq!(r.status(), if public { 200 } else { 403 }, "{what}");
            if !public {
                let body: Value = r.json().await.unwrap();
                assert!(body["message"].as_str().unwrap().contains("missing traffic access token"), "{body}");
            }
        }
        let (ok, stderr) = server.stop();
        assert!(ok && stderr.contains("destroyed 3 sandboxes"), "{stderr}");
    }
}

#[test]
fn a_ca_dir_serve_cannot_use_is_an_error_if_named_and_plain_http_only_if_not() {
    let named = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY, "--ca-dir", "/proc/no-such/ca"])
        .env_remove("E2B_API_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&named.stderr);
    assert_eq!(named.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("certificate authority in /proc/no-such/ca"), "{stderr}");
    // The default directory unusable: serve runs, plain HTTP only, and says so.
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY])
        .env("XDG_STATE_HOME", "/proc/no-such")
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .env_remove("E2B_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut first, mut second) = (String::new(), String::new());
    out.read_line(&mut first).unwrap();
    out.read_line(&mut second).unwrap();
    let addr = first.trim().strip_prefix("listening on http://").unwrap_or_else(|| panic!("{first:?}")).to_string();
    assert_eq!(second.trim(), "no https");
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    std::io::Write::write_all(&mut conn, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut conn, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 204"), "{answer}");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
}

// ---- issues 23 and 26: the seams around a sandbox --------------------------------------------

/// One entry of a COPY context.
enum Entry<'a> {
    File(&'a [u8]),
    Link(&'a str),
    Fifo,
}

/// A gzipped tar of `entries`, as the SDK uploads a COPY context.
fn context(entries: &[(&str, Entry)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    for (name, e) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        match e {
            Entry::File(data) => {
                h.set_size(data.len() as u64);
                tar.append_data(&mut h, name, *data).unwrap();
            }
            Entry::Link(target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                tar.append_link(&mut h, name, target).unwrap();
            }
            Entry::Fifo => {
                h.set_entry_type(tar::EntryType::Fifo);
                h.set_size(0);
                tar.append_data(&mut h, name, &[][..]).unwrap();
            }
        }
    }
    tar.into_inner().unwrap().finish().unwrap()
}

/// Makes template `name` and uploads `ctx` as its files `h1`: (template ID, build ID), or the
/// upload's refusal (status, body).
async fn upload_context(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    ctx: Vec<u8>,
) -> Result<(String, String), (u16, String)> {
    let (status, t) =
        api(http, reqwest::Method::POST, format!("{base}/v3/templates"), Some(json!({"name": name}))).await;
    assert_eq!(status, 202, "{t}");
    let (id, build) = (t["templateID"].as_str().unwrap().to_string(), t["buildID"].as_str().unwrap().to_string());
    let (status, f) = api(http, reqwest::Method::GET, format!("{base}/templates/{id}/files/h1"), None).await;
    assert_eq!(status, 201, "{f}");
    let r = http.put(f["url"].as_str().unwrap()).body(ctx).send().await.unwrap();
    match r.status().as_u16() {
        200 => Ok((id, build)),
        s => Err((s, r.text().await.unwrap())),
    }
}

/// Builds template `name` from the COPY context `ctx` (files hash `h1`) and `steps`, with
/// `extra` keys in the build request: the last status body, or a refusal (status, body).
async fn build_with_context(
    http: &reqwest::Client,
    base: &str,
    name: &str,
    ctx: Vec<u8>,
    steps: Value,
    extra: Value,
) -> Result<Value, (u16, String)> {
    let (id, build) = upload_context(http, base, name, ctx).await?;
    let mut req = json!({"fromTemplate": "base", "steps": steps});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let url = format!("{base}/v2/templates/{id}/builds/{build}");
    let (status, e) = api(http, reqwest::Method::POST, url, Some(req)).await;
    if status != 202 {
        return Err((status, e.to_string()));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, st) =
            api(http, reqwest::Method::GET, format!("{base}/templates/{id}/builds/{build}/status"), None).await;
        if matches!(st["status"].as_str(), Some("ready" | "error")) {
            return Ok(st);
        }
        assert!(std::time::Instant::now() < deadline, "the build of {name} ends: {st}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Regression (issue 23, item 1): a COPY context holding `Dockerfile` and `template.yaml` as
/// links to host paths made serve (root) overwrite a root-only host file with `FROM …` and
/// plant a new file with content the request chose. Nothing the build writes follows a link
/// now: a context that would be written through (or that holds what is not a file, a
/// directory or a link) is refused, naming the entry, and the host is left as it was.
#[tokio::test]
async fn issue_23_a_build_context_never_makes_serve_write_through_a_link() {
    use std::os::unix::fs::PermissionsExt;
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let host = tempfile::tempdir().unwrap();
    let victim = host.path().join("root-only");
    std::fs::write(&victim, "secret\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let planted = host.path().join("planted.yaml");
    let dir = host.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    let (victim_s, planted_s, dir_s) =
        (victim.to_str().unwrap(), planted.to_str().unwrap(), dir.to_str().unwrap().to_string());
    let a = ("a.txt", Entry::File(b"a"));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("Dockerfile", context(&[("Dockerfile", Entry::Link(victim_s)), a])),
        ("template.yaml", context(&[("a.txt", Entry::File(b"a")), ("template.yaml", Entry::Link(planted_s))])),
        (
            "sub",
            context(&[("a.txt", Entry::File(b"a")), ("sub", Entry::Link(&dir_s)), ("sub/x.txt", Entry::File(b"x"))]),
        ),
        ("pipe", context(&[("a.txt", Entry::File(b"a")), ("pipe", Entry::Fifo)])),
    ];
    for (i, (what, ctx)) in cases.into_iter().enumerate() {
        let steps = json!([{"type": "COPY", "args": ["a.txt", "/a.txt", "", ""], "filesHash": "h1"}]);
        let extra = json!({"startCmd": "echo $(id) > /tmp/started", "readyCmd": "true"});
        match build_with_context(&http, &base, &format!("links-{i}"), ctx, steps, extra).await {
            Err((status, body)) => assert!(status == 400 && body.contains(what), "{what}: {status} {body}"),
            Ok(st) => {
                assert_eq!(st["status"], "error", "{what}: a context with a link in the way was built: {st}");
                let m = st["reason"]["message"].as_str().unwrap_or_default();
                assert!(m.contains(&format!("`{what}`")), "{what}: the refusal names the entry: {st}");
            }
        }
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "secret\n",
            "{what}: a host file was written through a link"
        );
        assert!(!planted.exists(), "{what}: a file was planted on the host");
        assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "{what}: written into a host directory");
    }
    // A regular Dockerfile in the context (a project copied whole) is not the build's: the
    // build writes its own beside the context's files, and still builds.
    let ctx = context(&[("Dockerfile", Entry::File(b"FROM scratch\n")), ("a.txt", Entry::File(b"a"))]);
    let steps = json!([{"type": "COPY", "args": ["a.txt", "/a.txt", "", ""], "filesHash": "h1"}]);
    let st = build_with_context(&http, &base, "plain", ctx, steps, json!({})).await.unwrap();
    assert_eq!(st["status"], "ready", "{st}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// Regression (issue 23, item 10): a download of a FIFO never returned (a serve thread blocked
/// for good), and one of a link to `/dev/zero` took serve to OOM in 3 s. What is not a regular
/// file is refused at once, saying what it is; a write to a FIFO does not block either, and
/// serve stays responsive. A file past 1 GiB was refused by its size while downloads were read
/// into memory; they stream now, so it is answered at once with its length
/// ([`downloads_stream_from_the_open_file`] reads one whole).
#[tokio::test]
async fn issue_23_downloads_refuse_fifos_and_devices_at_once() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let setup = "mkfifo /home/user/fifo && ln -s /dev/zero /home/user/zero && truncate -s 3G /home/user/huge \
                 && head -c 1000 /dev/urandom > /home/user/small";
    let (_, end) = run_cmd(&http, &base, &sb, setup).await;
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0, "{end}");
    let get = |path: &str| {
        http.get(format!("{base}/files?path={path}"))
            .header("E2b-Sandbox-Id", &sb.id)
            .header("X-Access-Token", &sb.token)
            .timeout(Duration::from_secs(10))
            .send()
    };
    for (path, want) in [
        ("fifo", "is a FIFO, not a regular file: /home/user/fifo"),
        ("zero", "is a character device, not a regular file: /home/user/zero"),
    ] {
        let r = get(path).await.unwrap_or_else(|e| panic!("the download of {path} did not answer: {e}"));
        let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains(want), "{path}: {body}");
    }
    let mut r = get("huge").await.unwrap();
    assert_eq!((r.status().as_u16(), r.content_length()), (200, Some(3 << 30)));
    assert!(r.chunk().await.unwrap().is_some_and(|c| !c.is_empty() && c.iter().all(|b| *b == 0)));
    drop(r);
    let r = get("small").await.unwrap();
    assert_eq!((r.status().as_u16(), r.bytes().await.unwrap().len()), (200, 1000));
    // An upload onto the FIFO is refused too, without waiting for a reader.
    let r = http
        .post(format!("{base}/files?path=/home/user/fifo"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/octet-stream")
        .timeout(Duration::from_secs(10))
        .body("x")
        .send()
        .await
        .expect("the upload onto a FIFO answers");
    let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("is a FIFO, not a regular file"), "{body}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// Regression (issue 23, item 11): `PUT /_upload/<anything>` read the whole body (up to 1 GiB)
/// before answering 403: three requests took serve to 3.2 GB. A wrong token is refused as soon
/// as the headers are in, and a body declared past the limit with a right one too.
#[tokio::test]
async fn issue_23_an_upload_url_is_checked_before_its_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let (status, t) =
        api(&http, reqwest::Method::POST, format!("{base}/v3/templates"), Some(json!({"name": "up"}))).await;
    assert_eq!(status, 202, "{t}");
    let id = t["templateID"].as_str().unwrap().to_string();
    let (_, f) = api(&http, reqwest::Method::GET, format!("{base}/templates/{id}/files/h1"), None).await;
    let good = f["url"].as_str().unwrap().rsplit('/').next().unwrap().to_string();
    for (token, length, want) in [("not-a-token", 1u64 << 30, "403"), (good.as_str(), 2 << 30, "413")] {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", server.port())).await.unwrap();
        let head = format!(
            "PUT /_upload/{token} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\nContent-Type: application/gzip\r\n\r\n"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(&[0u8; 4096]).await.unwrap();
        let started = std::time::Instant::now();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("{token}: no answer while the body was still to come"))
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(answer.starts_with(&format!("HTTP/1.1 {want}")), "{token}: {answer}");
        assert!(started.elapsed() < Duration::from_secs(3), "{token}: answered after {:?}", started.elapsed());
    }
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// A `/files` URL signed for `user` (empty: the default user), as the SDK signs it.
fn signed_for(path: &str, op: &str, user: &str, token: &str) -> String {
    use sha2::Digest;
    let raw = format!("{path}:{op}:{user}:{token}");
    let sig = base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(raw.as_bytes()));
    let mut q = format!(
        "/files?path={}&signature={}",
        scenario_run::net::url_encode(path),
        scenario_run::net::url_encode(&format!("v1_{sig}"))
    );
    if !user.is_empty() {
        q.push_str(&format!("&username={user}"));
    }
    q
}

/// Regression (issue 23, item 11a): a URL signed with no username (the default user) plus
/// `Authorization: Basic root:` read `/etc/shadow` as root. The signature binds the user the
/// request acts as: a Basic header naming another user is refused.
#[tokio::test]
async fn issue_23_a_signed_url_acts_only_as_the_user_it_was_signed_for() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let default = format!("{base}{}", signed_for("/etc/shadow", "read", "", &sb.token));
    for with_header in [true, false] {
        let mut req = http.get(&default).basic_auth("root", Some(""));
        if with_header {
            req = req.header("E2b-Sandbox-Id", &sb.id);
        }
        let r = req.send().await.unwrap();
        let (status, body) = (r.status().as_u16(), r.text().await.unwrap());
        assert_eq!(status, 401, "a signature for the default user read as root: {body}");
        assert!(body.contains("signed for"), "{body}");
    }
    // Without a Basic header it is the default user's read, which /etc/shadow refuses.
    let r = http.get(&default).header("E2b-Sandbox-Id", &sb.id).send().await.unwrap();
    assert_ne!(r.status(), 200, "{}", r.text().await.unwrap());
    // Signed for root, it reads as root (the token's holder asked for that), Basic or not.
    let as_root = format!("{base}{}", signed_for("/etc/shadow", "read", "root", &sb.token));
    for basic in [None, Some("root")] {
        let mut req = http.get(&as_root).header("E2b-Sandbox-Id", &sb.id);
        if let Some(u) = basic {
            req = req.basic_auth(u, Some(""));
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.text().await.unwrap().contains("root:"));
    }
    // And a Basic user other than the one signed for is refused there too.
    let r = http.get(&as_root).header("E2b-Sandbox-Id", &sb.id).basic_auth("user", Some("")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// Regression (issue 23, item 11b): the API key sent as `Authorization: Bearer <key>` reached
/// the sandbox's application through the port proxy. serve's secrets (the API key, the
/// sandbox's tokens) are stripped in every header form a client uses before a request is
/// forwarded; what the application's own clients send passes.
#[tokio::test]
async fn issue_23_serves_secrets_never_reach_a_sandbox_port_in_any_header_form() {
    let server = Server::start(&["--allow-public-traffic"]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let url = format!("http://8080-{}.localhost:{}/hello", sb.id, server.port());
    start_echo(&http, &base, &sb, &url, None).await;
    let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
    // (Public ports: the sandbox has no traffic token.)
    for secret in [KEY, sb.token.as_str()] {
        let forms = [
            ("Authorization", format!("Bearer {secret}")),
            ("authorization", format!("bearer   {secret}")),
            ("Authorization", format!("Token {secret}")),
            ("Authorization", format!("Basic {}", b64(format!("{secret}:")))),
            ("Authorization", format!("Basic {}", b64(format!("api:{secret}")))),
            ("Proxy-Authorization", format!("Bearer {secret}")),
            ("X-Api-Key", secret.to_string()),
            ("x-e2b-api-key", secret.to_string()),
            ("Api-Key", secret.to_string()),
            ("X-Access-Token", secret.to_string()),
            ("Cookie", format!("session=1; e2b_api_key={secret}")),
        ];
        for (name, value) in forms {
            let r = http.get(&url).header(name, &value).send().await.unwrap();
            assert_eq!(r.status(), 200, "{name}");
            let seen = r.text().await.unwrap();
            assert!(
                !seen.contains(secret) && !seen.contains(&value),
                "{name}: {value} reached the application:\n{seen}"
            );
        }
    }
    // The application's own credentials pass untouched.
    let r = http.get(&url).header("Authorization", "Bearer app-token-123").send().await.unwrap();
    assert!(r.text().await.unwrap().contains("authorization: Bearer app-token-123\n"));
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// `MemTotal` and `MemAvailable` of this host, in MiB.
fn host_memory_mib() -> (u64, u64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        let line = info.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// Regression (issue 23, item 11c): 256 sandboxes of 512 MiB were admitted on a 24 GiB host.
/// A create is admitted by its declared memory against the host's: more than the host has
/// at all, or past `--memory-overcommit` times its memory over the live sandboxes, answers
/// 429 saying so; a killed sandbox gives its memory back.
#[tokio::test]
async fn issue_23_creates_are_admitted_by_declared_memory() {
    let (total, available) = host_memory_mib();
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let (status, body) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/v2/sandboxes"),
        Some(json!({"templateID": "base", "timeout": 60, "memoryMB": total * 64})),
    )
    .await;
    assert_eq!(status, 429, "a sandbox of 64 times the host's memory was admitted: {body}");
    assert_eq!(body["code"], 429);
    assert!(body["message"].as_str().unwrap().contains("memory"), "{body}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");

    // Promised memory adds up: with serve promising 1.5 times a sandbox's memory, it fits
    // once, not twice (60 % of what is free now, whatever else the machine runs).
    let mb = available * 6 / 10;
    let ratio = format!("{:.3}", (mb as f64 * 1.5 / total as f64) + 0.0005);
    let server = Server::start(&["--memory-overcommit", &ratio]);
    let (http, base) = (client(), server.base.clone());
    let body = json!({"templateID": "base", "timeout": 60, "memoryMB": mb});
    let a = make_with(&http, &base, body.clone()).await;
    let (status, refused) = api(&http, reqwest::Method::POST, format!("{base}/v2/sandboxes"), Some(body.clone())).await;
    assert_eq!(status, 429, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("--memory-overcommit"), "{refused}");
    let r = http.delete(format!("{base}/sandboxes/{}", a.id)).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 204);
    make_with(&http, &base, body).await;
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// serve's work directories under `tmp`.
fn work_dirs(tmp: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("scenario-run-serve-"))
        .collect();
    v.sort();
    v
}

/// Regression (issue 23, item 12): a SIGKILLed serve left its work directory (uploads, build
/// contexts: 191 MB) for good; the next run swept sandboxes but not that. The next serve, and
/// the next run, remove the work directories whose serve is gone, never a live one's.
#[tokio::test]
async fn issue_23_a_killed_serves_work_directory_is_swept_by_the_next_serve_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let env = [("TMPDIR", tmp.path())];
    let killed = Server::start_env(&[], &env);
    let live = Server::start_env(&[], &env);
    let http = client();
    for s in [&killed, &live] {
        let ctx = context(&[("a.txt", Entry::File(&[7u8; 100_000]))]);
        upload_context(&http, &s.base, "left", ctx).await.unwrap();
    }
    let dir_of = |s: &Server| tmp.path().join(format!("scenario-run-serve-{}-{}", s.pid(), s.port()));
    let (killed_dir, live_dir) = (dir_of(&killed), dir_of(&live));
    assert_eq!(work_dirs(tmp.path()), {
        let mut v = vec![killed_dir.clone(), live_dir.clone()];
        v.sort();
        v
    });
    drop(killed); // SIGKILL
    let next = Server::start_env(&[], &env);
    // Once it answers, it has swept.
    assert_eq!(http.get(format!("{}/health", next.base)).send().await.unwrap().status(), 204);
    assert!(!killed_dir.exists(), "the next serve left a dead serve's work directory");
    assert!(live_dir.exists(), "the next serve swept a live serve's work directory");
    assert!(dir_of(&next).exists());
    // A run on the local provider sweeps them too.
    let next_dir = dir_of(&next);
    drop(next);
    let scenario = tmp.path().join("s.yaml");
    std::fs::write(&scenario, "name: sweep\nsteps:\n  - create: base\n  - exec: \"true\"\n").unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = common::cmd(&[scenario.to_str().unwrap(), "--no-progress"])
        .env("TMPDIR", tmp.path())
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!next_dir.exists(), "a run left a dead serve's work directory");
    assert!(live_dir.exists(), "a run swept a live serve's work directory");
    let (ok, stderr) = live.stop();
    assert!(ok, "{stderr}");
    assert!(!live_dir.exists(), "serve removes its work directory when it stops");
}

/// Regression (issue 26, item 11): `MakeDir("/contract-x")` as `user` answered 400
/// "permission denied" where envd makes the directory as root and gives it to the user; and
/// envd moves and removes as root too. serve does all three as envd does.
#[tokio::test]
async fn issue_26_make_dir_move_and_remove_act_as_envd_does() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let sb = make(&http, &base).await;
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/MakeDir", json!({"path": "/contract-x"})).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(
        (e["entry"]["path"].as_str(), e["entry"]["type"].as_str()),
        (Some("/contract-x"), Some("FILE_TYPE_DIRECTORY"))
    );
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/MakeDir", json!({"path": "/contract-x"})).await;
    assert_eq!((status, e["code"].as_str()), (409, Some("already_exists")), "{e}");
    let (status, e) =
        unary(&http, &base, &sb, "filesystem.Filesystem/MakeDir", json!({"path": "/opt/made/deep"})).await;
    assert_eq!(status, 200, "{e}");
    let (_, end) = run_cmd(&http, &base, &sb, "echo moved > /home/user/moved.txt").await;
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0);
    let mv = json!({"source": "/home/user/moved.txt", "destination": "/srv/new/moved.txt"});
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/Move", mv).await;
    assert_eq!(status, 200, "{e}");
    assert_eq!(e["entry"]["path"], "/srv/new/moved.txt", "{e}");
    let (out, _) = run_cmd(
        &http,
        &base,
        &sb,
        "sudo stat -c '%U:%G %n' /contract-x /opt/made /opt/made/deep /srv/new /srv/new/moved.txt; cat /srv/new/moved.txt",
    )
    .await;
    assert_eq!(
        out,
        "user:user /contract-x\nuser:user /opt/made\nuser:user /opt/made/deep\nuser:user /srv/new\nuser:user /srv/new/moved.txt\nmoved\n"
    );
    let (_, end) = run_cmd(&http, &base, &sb, "sudo touch /etc/root-file").await;
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0);
    for path in ["/srv/new", "/opt/made", "/etc/root-file"] {
        let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/Remove", json!({"path": path})).await;
        assert_eq!(status, 200, "{path}: {e}");
    }
    let (out, _) = run_cmd(&http, &base, &sb, "ls -d /srv/new /opt/made /etc/root-file 2>&1 | wc -l").await;
    assert_eq!(out.trim(), "3", "every removed path is gone (ls complains of each)");
    // Made as root, a directory is root's.
    let r = http
        .post(format!("{base}/filesystem.Filesystem/MakeDir"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .basic_auth("root", Some(""))
        .json(&json!({"path": "/root-made"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let (out, _) = run_cmd(&http, &base, &sb, "stat -c '%U:%G' /root-made").await;
    assert_eq!(out, "root:root\n");
    // Errors keep envd's codes: a file in the way, a missing source.
    let (status, e) =
        unary(&http, &base, &sb, "filesystem.Filesystem/MakeDir", json!({"path": "/contract-x/f/../x"})).await;
    assert_eq!(status, 200, "{e}");
    let (_, _) = run_cmd(&http, &base, &sb, "sudo touch /opt/file").await;
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/MakeDir", json!({"path": "/opt/file/x"})).await;
    assert_eq!((status, e["code"].as_str()), (400, Some("invalid_argument")), "{e}");
    let mv = json!({"source": "/no/such", "destination": "/srv/x"});
    let (status, e) = unary(&http, &base, &sb, "filesystem.Filesystem/Move", mv).await;
    assert_eq!((status, e["code"].as_str()), (404, Some("not_found")), "{e}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// A server for inside the sandbox that never answers `/hang` (and answers anything else).
const HANGING_SERVER: &str = r#"
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/hang":
            time.sleep(600)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8080), H).serve_forever()
"#;

/// A request in flight to a port when its sandbox is killed loses its connection, as on E2B
/// where the proxy's upstream dies with the sandbox: the code-interpreter SDKs see the broken
/// stream and say "the sandbox was killed while the request was in progress". serve answered a
/// complete 502 "port is not open" instead, which the SDKs read as a timeout (the official
/// suite's test_run_code_raises_when_sandbox_is_killed_during_execution failed under load).
#[tokio::test]
async fn a_request_in_flight_when_its_sandbox_is_killed_loses_its_connection() {
    let server = Server::start(&["--allow-public-traffic"]);
    let base = server.base.clone();
    let http = client();
    let sb = make(&http, &base).await;
    let r = http
        .post(format!("{base}/files?path=/tmp/hang.py"))
        .header("E2b-Sandbox-Id", &sb.id)
        .header("X-Access-Token", &sb.token)
        .header("Content-Type", "application/octet-stream")
        .body(HANGING_SERVER)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    run_cmd(&http, &base, &sb, "python3 /tmp/hang.py >/dev/null 2>&1 &").await;
    let url = |path: &str| format!("http://8080-{}.localhost:{}{path}", sb.id, server.port());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while http.get(url("/up")).send().await.map(|r| r.status()).ok() != Some(reqwest::StatusCode::OK) {
        assert!(std::time::Instant::now() < deadline, "the server in the sandbox did not come up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let in_flight = tokio::spawn({
        let (http, url) = (http.clone(), url("/hang"));
        async move {
            match http.get(url).send().await {
                Err(e) => Err(e.to_string()),
                Ok(r) => {
                    let status = r.status();
                    match r.bytes().await {
                        Err(e) => Err(format!("{status}, then {e}")),
                        Ok(body) => Ok(format!("{status} {}", String::from_utf8_lossy(&body))),
                    }
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, _) = api(&http, reqwest::Method::DELETE, format!("{base}/sandboxes/{}", sb.id), None).await;
    assert_eq!(status, 204);
    let outcome = tokio::time::timeout(Duration::from_secs(20), in_flight).await.expect("it ends").unwrap();
    assert!(outcome.is_err(), "a complete answer for a request whose sandbox was killed: {outcome:?}");
    server.stop();
}

/// Issue 37 item 4: serve reads `SCENARIO_RUN_TEMPLATES_DIR` from `./.env` as the run does,
/// says at start (on stderr) which template folder it uses and what it can build, keeps
/// "listening on" as its first stdout line, and with `-v` logs each request with its status
/// and sandbox, the query's credentials masked.
#[tokio::test]
async fn serve_says_its_templates_and_logs_requests_with_v() {
    let dir = tempfile::tempdir().unwrap();
    let tpls = dir.path().join("my-templates");
    for name in ["code-interpreter-v1", "mine"] {
        std::fs::create_dir_all(tpls.join(name)).unwrap();
        std::fs::write(tpls.join(name).join("Dockerfile"), "FROM base\n").unwrap();
    }
    std::fs::write(dir.path().join(".env"), format!("SCENARIO_RUN_TEMPLATES_DIR={}\n", tpls.display())).unwrap();
    let state = tempfile::Builder::new().prefix("srserve-").tempdir().unwrap();
    let mut child = Command::new(common::bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY, "-v"])
        .current_dir(dir.path())
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .env_remove("E2B_API_KEY")
        .env_remove("SCENARIO_RUN_TEMPLATES_DIR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server starts");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first stdout line: {line:?}"));
    let srv = Server { base: base.to_string(), child: Some(child), _state: state };
    let http = client();
    let r = http.get(format!("{}/sandboxes", srv.base)).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = http
        .get(format!("{}/files?path=/x&signature=v1_sekrit&signature_expiration=1", srv.base))
        .header("e2b-sandbox-id", "nosuchsandbox")
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let (_, err) = srv.stop();
    assert!(
        err.contains(&format!(
            "serve: templates from {} (from SCENARIO_RUN_TEMPLATES_DIR): code-interpreter-v1, mine; built on the first create that names them: code-interpreter-v1; the others through the template API (`e2b template build`): mine",
            tpls.display()
        )),
        "{err}"
    );
    assert!(err.contains("serve: GET /sandboxes -> 200 in "), "{err}");
    assert!(
        err.contains(&format!(
            "serve: GET /files?path=/x&signature=***&signature_expiration=*** (sandbox nosuchsandbox) -> {status} in "
        )),
        "{err}"
    );
    assert!(!err.contains("sekrit") && !err.contains(KEY), "{err}");
}

/// Issue 35, rule 1: a build's `USER` is looked up in the image's passwd and group read inside
/// the build's root. A RUN that made `/etc/passwd` an absolute link to a host file, and
/// `/etc/group` a FIFO, once had serve read the host's file (its user was found) and then block
/// a thread on the FIFO for good (the build never ended). Now the link resolves inside the
/// image (no such user) and the FIFO is refused unread: the build ends, with the reason.
#[tokio::test]
async fn issue_35_a_build_user_lookup_never_reads_the_host_nor_blocks_on_a_fifo() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let host = tempfile::tempdir().unwrap();
    let fake = host.path().join("passwd");
    std::fs::write(&fake, "hostonly:x:4242:4242::/:/bin/sh\n").unwrap();
    let plant = format!("ln -sf {} /etc/passwd && rm -f /etc/group && mkfifo /etc/group", fake.display());
    let steps = json!([
        {"type": "RUN", "args": [plant]},
        {"type": "USER", "args": ["hostonly"]},
        {"type": "RUN", "args": ["id -u"]},
    ]);
    let ctx = context(&[("a.txt", Entry::File(b"a"))]);
    let st = build_with_context(&http, &base, "user-lookup", ctx, steps, json!({})).await.unwrap();
    assert_eq!(st["status"], "error", "the host's user was found: {st}");
    let m = st["reason"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("hostonly"), "the reason names the user: {st}");
}

/// Builds template `name` from `base` with `steps` and `extra` keys in the build request
/// through the template API, as the SDK does: the last status body (every log entry in it)
/// and whether log entries arrived while it was still building.
async fn build_steps(http: &reqwest::Client, base: &str, name: &str, steps: Value, extra: Value) -> (Value, bool) {
    let (status, t) =
        api(http, reqwest::Method::POST, format!("{base}/v3/templates"), Some(json!({"name": name}))).await;
    assert_eq!(status, 202, "{t}");
    let (id, build) = (t["templateID"].as_str().unwrap().to_string(), t["buildID"].as_str().unwrap().to_string());
    let mut req = json!({"fromTemplate": "base", "steps": steps});
    for (k, v) in extra.as_object().unwrap() {
        req[k] = v.clone();
    }
    let (status, e) =
        api(http, reqwest::Method::POST, format!("{base}/v2/templates/{id}/builds/{build}"), Some(req)).await;
    assert_eq!(status, 202, "{e}");
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let mut streamed = false;
    loop {
        let (_, st) =
            api(http, reqwest::Method::GET, format!("{base}/templates/{id}/builds/{build}/status"), None).await;
        match st["status"].as_str() {
            Some("ready" | "error") => return (st, streamed),
            Some("building") => streamed |= st["logEntries"].as_array().is_some_and(|e| !e.is_empty()),
            _ => {}
        }
        assert!(std::time::Instant::now() < deadline, "the build of {name} ends: {st}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn log_of(st: &Value) -> String {
    st["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 38 item 4: a second build of an unchanged template through the template API is
/// served from the cache and its log says so (E2B's build cache); `force` (the SDK's
/// `skipCache`) builds it again; and the log streams while the build runs (E2B #1018: a
/// build that shows nothing until it ends looks stuck).
#[tokio::test]
async fn a_second_build_is_served_from_the_cache_and_force_builds_again() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let steps = json!([{"type": "RUN", "args": ["echo first-step; sleep 2; echo made > /home/user/made", "root"], "force": false}]);
    let (first, streamed) = build_steps(&http, &base, "cache-probe", steps.clone(), json!({})).await;
    assert_eq!(first["status"], "ready", "{first}");
    assert!(streamed, "log entries arrive while the build runs: {first}");
    assert!(!log_of(&first).contains("was built before"), "{}", log_of(&first));

    let (second, _) = build_steps(&http, &base, "cache-probe", steps.clone(), json!({})).await;
    assert_eq!(second["status"], "ready", "{second}");
    assert!(
        log_of(&second).contains("was built before"),
        "the second build says it is the cached one: {}",
        log_of(&second)
    );

    let (forced, _) = build_steps(&http, &base, "cache-probe", steps.clone(), json!({"force": true})).await;
    assert_eq!(forced["status"], "ready", "{forced}");
    let log = log_of(&forced);
    assert!(log.contains("building again without the cache") && !log.contains("was built before"), "{log}");
    // A step's own force (the SDK's per-step skipCache) forces the build too, and the build
    // after it is served from the forced one, its steps being the same.
    let mut step_forced = steps.clone();
    step_forced[0]["force"] = json!(true);
    let (again, _) = build_steps(&http, &base, "cache-probe", step_forced, json!({})).await;
    assert!(log_of(&again).contains("building again without the cache"), "{}", log_of(&again));
    let (after, _) = build_steps(&http, &base, "cache-probe", steps, json!({})).await;
    assert!(log_of(&after).contains("was built before"), "{}", log_of(&after));
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// E2B #1009 and #1018 as serve's probe: a template whose ready command never succeeds makes
/// the create fail within the build request's ready timeout (the e2b provider's
/// `x-scenario-run-ready-timeout`, from template.yaml), not hang past the client's create
/// timeout, and the error carries the ready command's exit code and what it printed.
#[tokio::test]
async fn a_create_whose_ready_command_fails_says_why_within_the_ready_timeout() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let (status, t) =
        api(&http, reqwest::Method::POST, format!("{base}/v3/templates"), Some(json!({"name": "never-ready"}))).await;
    assert_eq!(status, 202, "{t}");
    let (id, build) = (t["templateID"].as_str().unwrap().to_string(), t["buildID"].as_str().unwrap().to_string());
    let req = json!({
        "fromTemplate": "base", "steps": [],
        "startCmd": "echo server-starting; sleep 600",
        "readyCmd": "echo port-not-open >&2; exit 3",
        scenario_run::provider::e2b::build::READY_TIMEOUT_FIELD: 2,
    });
    let (status, e) =
        api(&http, reqwest::Method::POST, format!("{base}/v2/templates/{id}/builds/{build}"), Some(req)).await;
    assert_eq!(status, 202, "{e}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (_, st) =
            api(&http, reqwest::Method::GET, format!("{base}/templates/{id}/builds/{build}/status"), None).await;
        if st["status"] == "ready" {
            break;
        }
        assert!(st["status"] != "error" && std::time::Instant::now() < deadline, "{st}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = std::time::Instant::now();
    let (status, body) = api(
        &http,
        reqwest::Method::POST,
        format!("{base}/v2/sandboxes"),
        Some(json!({"templateID": id, "timeout": 60})),
    )
    .await;
    assert!(status >= 400, "the create fails: {status} {body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("within 2s")
            && message.contains("exit 3, printing: port-not-open")
            && message.contains("server-starting"),
        "{message}"
    );
    // Bounded by the ready timeout, not serve's 180 s (generous for a loaded machine).
    assert!(started.elapsed() < Duration::from_secs(60), "{:?}", started.elapsed());
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

/// Issue 38 item 4: `fromTemplate` naming a template built here builds on its filesystem (its
/// image and steps, then the request's), as E2B does; a failing step is numbered as the
/// client numbered it.
#[tokio::test]
async fn from_template_builds_on_a_template_built_here() {
    let server = Server::start(&[]);
    let (http, base) = (client(), server.base.clone());
    let parent = json!([{"type": "RUN", "args": ["echo from-parent > /parent-mark", "root"], "force": false}]);
    let (st, _) = build_steps(&http, &base, "parent-tpl", parent, json!({})).await;
    assert_eq!(st["status"], "ready", "{st}");
    let child = json!([{"type": "RUN", "args": ["cat /parent-mark > /child-mark", "root"], "force": false}]);
    let (st, _) = build_steps(&http, &base, "child-tpl", child, json!({"fromTemplate": "parent-tpl"})).await;
    assert_eq!(st["status"], "ready", "{}", log_of(&st));
    let sb = make_with(&http, &base, json!({"templateID": "child-tpl", "timeout": 60})).await;
    let (out, _) = run_cmd(&http, &base, &sb, "cat /child-mark /parent-mark").await;
    assert_eq!(out, "from-parent\nfrom-parent\n");
    // The child's own step 1 fails: reason.step is 1, not the parent's step count plus one.
    let bad = json!([{"type": "RUN", "args": ["exit 7", "root"], "force": false}]);
    let (st, _) = build_steps(&http, &base, "child-bad", bad, json!({"fromTemplate": "parent-tpl"})).await;
    assert_eq!(st["status"], "error", "{st}");
    assert_eq!(st["reason"]["step"], "1", "{st}");
    assert!(st["reason"]["message"].as_str().unwrap().starts_with("step 1 (RUN"), "{st}");
    let (ok, stderr) = server.stop();
    assert!(ok, "{stderr}");
}

//! `scenario-run serve` on the real binary, spoken to with raw HTTP (reqwest): create a
//! sandbox, run a command through the Connect `Process/Start` stream, check the streamed
//! output and exit code, the 401 and 502 error bodies, kill, and clean shutdown on SIGTERM.
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
        let state = tempfile::Builder::new().prefix("srserve-").tempdir().unwrap();
        let mut child = Command::new(common::bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--api-key", KEY])
            .args(extra)
            .env("SCENARIO_RUN_STATE_DIR", state.path())
            .env_remove("E2B_API_KEY")
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
        let base = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("ready line: {line:?}"));
        Self { base: base.to_string(), child: Some(child), _state: state }
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

    // Process/Start: start{pid}, stdout and stderr data, end with the exit code, end-stream {}.
    let start = json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi; echo $FOO >&2; exit 7"]},
        "stdin": false,
    });
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
        .header("E2b-Sandbox-Port", "49983")
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
    for key in ["startedAt", "endAt", "cpuCount", "memoryMB", "diskSizeMB", "envdVersion", "clientID"] {
        assert!(detail.get(key).is_some(), "SandboxDetail lacks {key}: {detail}");
    }
    let r = http.delete(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = http.delete(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 404);

    // envd of a killed (or never existing) sandbox: 502 "… was not found".
    for sid in [id.as_str(), "nosuchsandbox0000000"] {
        let r = http
            .post(format!("{base}/process.Process/List"))
            .header("E2b-Sandbox-Id", sid)
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 502);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], 502);
        assert_eq!(body["message"], format!("The sandbox {sid} was not found"));
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
    let id = r.json::<Value>().await.unwrap()["sandboxID"].as_str().unwrap().to_string();
    let r = http.get(format!("{base}/sandboxes/{id}")).header("X-API-KEY", KEY).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], 503);
    // Request 4: a process stream with more than 64 bytes of output is cut mid-body.
    let start =
        json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "head -c 5000 /dev/zero"]}, "stdin": false});
    let r = http
        .post(format!("{base}/process.Process/Start"))
        .header("E2b-Sandbox-Id", &id)
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

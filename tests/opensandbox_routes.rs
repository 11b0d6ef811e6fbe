//! A hostile client against serve's OpenSandbox routes (issue 29): the lifecycle API without
//! its key or with a wrong one, and each sandbox's proxy route (execd, the egress sidecar, a
//! port of its own) without credentials, with a wrong token, with another sandbox's token,
//! and for a sandbox that does not exist. Each refusal is checked beside the same request
//! with the right credentials succeeding, so a server that refused everything would fail too.

mod common;

use common::serve::{serve, Server};
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
const ACCESS: &str = "OpenSandbox-Secure-Access";
const EXECD: u16 = 44772;
const EGRESS: u16 = 18080;

fn client() -> reqwest::Client {
    scenario_run::net::client_builder().build().unwrap()
}

fn base(srv: &Server) -> String {
    format!("http://127.0.0.1:{}", srv.port)
}

/// The answer's status and its JSON body (Null if none).
async fn answer(r: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let r = r.send().await.unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// A sandbox of `base`, kept until the run ends; its id.
async fn create(http: &reqwest::Client, srv: &Server) -> String {
    let (status, v) = answer(
        http.post(format!("{}/v1/sandboxes", base(srv)))
            .header(KEY_HEADER, &srv.key)
            .json(&json!({"templateId": "base", "timeout": 300, "metadata": {"who": "hostile-test"}})),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// The endpoint of `port` of `id`: its URL (with the scheme) and the token its headers name.
async fn endpoint(http: &reqwest::Client, srv: &Server, id: &str, port: u16) -> (String, Option<String>) {
    let (status, v) =
        answer(http.get(format!("{}/v1/sandboxes/{id}/endpoints/{port}", base(srv))).header(KEY_HEADER, &srv.key))
            .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let url = format!("http://{}", v["endpoint"].as_str().unwrap());
    (url, v["headers"][ACCESS].as_str().map(str::to_string))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_lifecycle_api_needs_its_key() {
    let srv = serve();
    let http = client();
    let b = base(&srv);
    let routes: Vec<(reqwest::Method, String, Option<Value>)> = vec![
        (reqwest::Method::POST, format!("{b}/v1/sandboxes"), Some(json!({"templateId": "base", "timeout": 300}))),
        (reqwest::Method::GET, format!("{b}/v1/sandboxes"), None),
        (reqwest::Method::GET, format!("{b}/v1/sandboxes/nope"), None),
        (reqwest::Method::DELETE, format!("{b}/v1/sandboxes/nope"), None),
        (reqwest::Method::POST, format!("{b}/v1/sandboxes/nope/pause"), None),
        (reqwest::Method::POST, format!("{b}/v1/sandboxes/nope/resume"), None),
        (
            reqwest::Method::POST,
            format!("{b}/v1/sandboxes/nope/renew-expiration"),
            Some(json!({"expiresAt": "2099-01-01T00:00:00Z"})),
        ),
        (reqwest::Method::GET, format!("{b}/v1/sandboxes/nope/endpoints/{EXECD}"), None),
        (reqwest::Method::POST, format!("{b}/v1/sandboxes/nope/snapshots"), Some(json!({}))),
        (reqwest::Method::GET, format!("{b}/v1/snapshots"), None),
    ];
    let wrong = format!("{}x", srv.key);
    for (method, url, body) in &routes {
        let req = |key: Option<&str>| {
            let mut r = http.request(method.clone(), url);
            if let Some(k) = key {
                r = r.header(KEY_HEADER, k);
            }
            if let Some(b) = body {
                r = r.json(b);
            }
            r
        };
        let (status, v) = answer(req(None)).await;
        assert_eq!((status, v["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("MISSING_API_KEY")), "{method} {url}");
        let (status, v) = answer(req(Some(&wrong))).await;
        assert_eq!((status, v["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("INVALID_API_KEY")), "{method} {url}");
        // E2B's key headers are not OpenSandbox's.
        let (status, _) = answer({
            let mut r = http.request(method.clone(), url).header("X-API-KEY", &srv.key);
            if let Some(b) = body {
                r = r.json(b);
            }
            r
        })
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {url} with X-API-KEY");
    }
    // With the key, a host directory is refused unless serve was told where they may come
    // from (--host-volume-prefix), and a named volume's name cannot climb out of its folder.
    for (volume, code) in [
        (json!({"name": "root", "host": {"path": "/"}, "mountPath": "/mnt/root"}), "VOLUME::INVALID_HOST_PATH"),
        (json!({"name": "etc", "host": {"path": "/etc"}, "mountPath": "/mnt/etc"}), "VOLUME::HOST_PATH_NOT_ALLOWED"),
        (json!({"name": "up", "pvc": {"claimName": ".."}, "mountPath": "/mnt/up"}), "VOLUME::INVALID_PVC_NAME"),
        (
            json!({"name": "sub", "pvc": {"claimName": "v"}, "mountPath": "/mnt/v", "subPath": "../.."}),
            "VOLUME::INVALID_SUB_PATH",
        ),
    ] {
        let (status, v) = answer(
            http.post(format!("{b}/v1/sandboxes"))
                .header(KEY_HEADER, &srv.key)
                .json(&json!({"templateId": "base", "timeout": 300, "volumes": [volume]})),
        )
        .await;
        assert_eq!((status, v["code"].as_str()), (StatusCode::BAD_REQUEST, Some(code)), "{volume}: {v}");
    }
    // Nothing was made by the refused creates; the key itself works.
    let (status, v) = answer(http.get(format!("{b}/v1/sandboxes")).header(KEY_HEADER, &srv.key)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["items"].as_array().map(Vec::len), Some(0), "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_endpoint_refuses_other_credentials() {
    let srv = serve();
    let http = client();
    let a = create(&http, &srv).await;
    let b = create(&http, &srv).await;
    let (a_execd, a_token) = endpoint(&http, &srv, &a, EXECD).await;
    let (b_execd, b_token) = endpoint(&http, &srv, &b, EXECD).await;
    let (a_token, b_token) = (a_token.expect("execd is secured"), b_token.expect("execd is secured"));
    assert_ne!(a_token, b_token);
    let ping = |url: &str| http.get(format!("{url}/ping"));

    // The right token opens execd, and runs a command there.
    assert_eq!(answer(ping(&a_execd).header(ACCESS, &a_token)).await.0, StatusCode::OK);
    let r = http
        .post(format!("{a_execd}/command"))
        .header(ACCESS, &a_token)
        .json(&json!({"command": "echo inside-$((6*7))"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.text().await.unwrap().contains("inside-42"));

    // No credentials, a wrong token, the other sandbox's token, E2B's headers.
    let (status, v) = answer(ping(&a_execd)).await;
    assert_eq!((status, v["code"].as_str()), (StatusCode::UNAUTHORIZED, Some("MISSING_ACCESS_TOKEN")), "{v}");
    assert_eq!(answer(ping(&a_execd).header(ACCESS, "wrong")).await.0, StatusCode::FORBIDDEN);
    assert_eq!(answer(ping(&a_execd).header(ACCESS, &b_token)).await.0, StatusCode::FORBIDDEN, "B's token on A");
    assert_eq!(answer(ping(&b_execd).header(ACCESS, &a_token)).await.0, StatusCode::FORBIDDEN, "A's token on B");
    assert_eq!(answer(ping(&a_execd).header("X-Access-Token", &a_token)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(ping(&a_execd).header("X-API-KEY", &srv.key)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(ping(&a_execd).header(KEY_HEADER, format!("{}x", srv.key))).await.0, StatusCode::UNAUTHORIZED);
    // A command with B's token never runs in A.
    let r = http
        .post(format!("{a_execd}/command"))
        .header(ACCESS, &b_token)
        .json(&json!({"command": "touch /tmp/pwned"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let (status, _) = answer(http.get(format!("{a_execd}/files/info?path=/tmp/pwned")).header(ACCESS, &a_token)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the refused command ran");

    // The egress sidecar takes the same token as execd, and no other.
    let (a_egress, a_egress_token) = endpoint(&http, &srv, &a, EGRESS).await;
    assert_eq!(a_egress_token.as_deref(), Some(a_token.as_str()));
    let policy = |t: Option<&str>| {
        let r = http.get(format!("{a_egress}/policy"));
        match t {
            Some(t) => r.header(ACCESS, t),
            None => r,
        }
    };
    assert_eq!(answer(policy(Some(&a_token))).await.0, StatusCode::OK);
    assert_eq!(answer(policy(None)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(policy(Some(&b_token))).await.0, StatusCode::FORBIDDEN);

    // Another port of A: its own token (not execd's), B's refused.
    let (a_web, a_web_token) = endpoint(&http, &srv, &a, 8000).await;
    let a_web_token = a_web_token.expect("ports are private without --allow-public-traffic");
    assert_ne!(a_web_token, a_token);
    let r = http
        .post(format!("{a_execd}/command"))
        .header(ACCESS, &a_token)
        .json(&json!({"command": "cd /tmp && nohup python3 -m http.server 8000 >/dev/null 2>&1 &", "background": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut served = StatusCode::BAD_GATEWAY;
    for _ in 0..100 {
        served = answer(http.get(format!("{a_web}/")).header(ACCESS, &a_web_token)).await.0;
        if served == StatusCode::OK {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(served, StatusCode::OK, "A's server through its port with its token");
    assert_eq!(answer(http.get(format!("{a_web}/"))).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(http.get(format!("{a_web}/")).header(ACCESS, &a_token)).await.0, StatusCode::FORBIDDEN);
    let (_, b_web_token) = endpoint(&http, &srv, &b, 8000).await;
    assert_eq!(
        answer(http.get(format!("{a_web}/")).header(ACCESS, b_web_token.unwrap())).await.0,
        StatusCode::FORBIDDEN
    );

    // A sandbox that does not exist: no key, no answer about it (refused as a known one).
    let ghost = format!("http://127.0.0.1:{}/sandboxes/doesnotexist/proxy/{EXECD}", srv.port);
    assert_eq!(answer(ping(&ghost)).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(answer(ping(&ghost).header(ACCESS, &a_token)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(answer(ping(&ghost).header(KEY_HEADER, &srv.key)).await.0, StatusCode::NOT_FOUND);

    // A path that climbs out of the proxy route is no proxy route (and needs the key).
    let climb = format!("http://127.0.0.1:{}/sandboxes/{a}/proxy/{EXECD}/../../../v1/sandboxes", srv.port);
    let (status, _) = answer(http.get(&climb).header(ACCESS, &a_token)).await;
    assert!(status == StatusCode::UNAUTHORIZED || status == StatusCode::NOT_FOUND, "{status}");

    // Deleting needs the key; with it both go.
    for id in [&a, &b] {
        let url = format!("{}/v1/sandboxes/{id}", base(&srv));
        assert_eq!(answer(http.delete(&url).header(ACCESS, &a_token)).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(answer(http.delete(&url).header(KEY_HEADER, &srv.key)).await.0, StatusCode::NO_CONTENT);
    }
    assert_eq!(answer(ping(&a_execd).header(ACCESS, &a_token)).await.0, StatusCode::FORBIDDEN, "a deleted sandbox");
}

/// execd's `/files/download`: a whole file streamed (one past the 1 GiB that one read takes,
/// without serve holding it), a byte range of it, lines by `offset`/`limit`, and the refusals.
#[tokio::test(flavor = "multi_thread")]
async fn execd_downloads_stream_whole_files_and_ranges() {
    const BIG: u64 = 1100 << 20;
    let srv = serve();
    let http = client();
    let id = create(&http, &srv).await;
    let (execd, token) = endpoint(&http, &srv, &id, EXECD).await;
    let token = token.expect("execd is secured");
    let r = http
        .post(format!("{execd}/command"))
        .header(ACCESS, &token)
        .json(&json!({"command": format!("printf 'one\\ntwo\\nthree\\n' > /tmp/lines && truncate -s {BIG} /tmp/big")}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let _ = r.text().await.unwrap();
    let get = |query: &str| http.get(format!("{execd}/files/download?{query}")).header(ACCESS, &token);

    let mut r = get("path=/tmp/big").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.content_length(), Some(BIG));
    let mut n = 0u64;
    while let Some(chunk) = r.chunk().await.unwrap() {
        n += chunk.len() as u64;
    }
    assert_eq!(n, BIG);

    let r = get("path=/tmp/lines").header("Range", "bytes=4-6").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(r.headers()["content-range"], "bytes 4-6/14");
    assert_eq!(r.text().await.unwrap(), "two");
    let r = get("path=/tmp/lines").header("Range", "bytes=10-").send().await.unwrap();
    assert_eq!((r.status(), r.text().await.unwrap()), (StatusCode::PARTIAL_CONTENT, "ree\n".to_string()));
    let r = get("path=/tmp/lines&offset=2&limit=1").send().await.unwrap();
    assert_eq!((r.status(), r.text().await.unwrap()), (StatusCode::OK, "two\n".to_string()));
    let r = get("path=/tmp/lines").header("Range", "bytes=99-").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    let (status, v) = answer(get("path=/tmp/none")).await;
    assert_eq!((status, v["code"].as_str()), (StatusCode::NOT_FOUND, Some("FILE_NOT_FOUND")), "{v}");
}

/// Reads a command's event stream until `until` says stop or the stream ends (within `limit`):
/// the events so far, and whether the stream ended.
async fn events(
    r: &mut reqwest::Response,
    limit: std::time::Duration,
    until: impl Fn(&[Value]) -> bool,
) -> (Vec<Value>, bool) {
    let deadline = tokio::time::Instant::now() + limit;
    let (mut buf, mut out) = (String::new(), Vec::new());
    loop {
        let chunk = match tokio::time::timeout_at(deadline, r.chunk()).await {
            Ok(c) => c.unwrap(),
            Err(_) => return (out, false),
        };
        let Some(chunk) = chunk else { return (out, true) };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some((frame, rest)) = buf.split_once("\n\n") {
            if let Ok(v) = serde_json::from_str::<Value>(frame.trim()) {
                out.push(v);
            }
            buf = rest.to_string();
        }
        if until(&out) {
            return (out, false);
        }
    }
}

/// The first stdout line of `evs`, as a pid.
fn printed_pid(evs: &[Value]) -> Option<u32> {
    evs.iter().find(|v| v["type"] == "stdout").and_then(|v| v["text"].as_str()?.trim().parse().ok())
}

/// A sandbox's execd for the process-group tests: serve, the client, execd's URL and token.
struct Execd {
    _srv: Server,
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Execd {
    async fn new() -> Self {
        let srv = serve();
        let http = client();
        let id = create(&http, &srv).await;
        let (url, token) = endpoint(&http, &srv, &id, EXECD).await;
        Self { _srv: srv, http, url, token: token.expect("execd is secured") }
    }

    async fn run(&self, body: Value) -> reqwest::Response {
        self.http.post(format!("{}/command", self.url)).header(ACCESS, &self.token).json(&body).send().await.unwrap()
    }

    /// Starts the script that leaves a child behind; the response, its command id and the child's pid.
    async fn start(&self, timeout_ms: Option<u64>) -> (reqwest::Response, String, u32) {
        let mut body = json!({"command": "sleep 300 & echo $!; wait"});
        if let Some(t) = timeout_ms {
            body["timeout"] = json!(t);
        }
        let mut r = self.run(body).await;
        let (evs, _) = events(&mut r, std::time::Duration::from_secs(20), |e| printed_pid(e).is_some()).await;
        let command = evs.iter().find(|v| v["type"] == "init").and_then(|v| v["text"].as_str()).unwrap().to_string();
        let child = printed_pid(&evs).unwrap_or_else(|| panic!("no pid printed: {evs:?}"));
        (r, command, child)
    }

    /// What `pid` runs, if it is still a `sleep` of the sandbox a few seconds after the stop
    /// (looked for in /proc through the sandbox itself).
    async fn still_running(&self, pid: u32) -> Option<String> {
        let mut last = String::new();
        for _ in 0..50 {
            let mut r =
                self.run(json!({"command": format!("cat /proc/{pid}/cmdline 2>/dev/null | tr '\\0' ' '; echo")})).await;
            let (evs, _) = events(&mut r, std::time::Duration::from_secs(30), |_| false).await;
            last = evs.iter().filter(|v| v["type"] == "stdout").filter_map(|v| v["text"].as_str()).collect();
            if !last.contains("sleep") {
                return None;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Some(last)
    }
}

// Issue 36: a command that times out, is deleted (`DELETE /command`) or whose client goes
// away is stopped with what it started, as OpenSandbox's execd kills the command's process
// group: a `sleep 300 &` left behind would run on (and hold the output open).

#[tokio::test(flavor = "multi_thread")]
async fn a_timed_out_command_leaves_none_of_its_children() {
    let x = Execd::new().await;
    let (mut r, _, child) = x.start(Some(1500)).await;
    let (evs, ended) = events(&mut r, std::time::Duration::from_secs(20), |_| false).await;
    assert!(ended, "the timed-out command's stream did not end within 20 s: {evs:?}");
    assert!(evs.iter().any(|v| v["type"] == "error"), "{evs:?}");
    assert_eq!(x.still_running(child).await, None, "the timed-out command's child {child} runs on");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_command_leaves_none_of_its_children() {
    let x = Execd::new().await;
    let (mut r, command, child) = x.start(None).await;
    let (status, v) = answer(x.http.delete(format!("{}/command?id={command}", x.url)).header(ACCESS, &x.token)).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (evs, ended) = events(&mut r, std::time::Duration::from_secs(20), |_| false).await;
    assert!(ended, "the deleted command's stream did not end within 20 s: {evs:?}");
    assert_eq!(x.still_running(child).await, None, "the deleted command's child {child} runs on");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_whose_client_left_leaves_none_of_its_children() {
    let x = Execd::new().await;
    let (r, _, child) = x.start(None).await;
    drop(r);
    assert_eq!(x.still_running(child).await, None, "the child {child} of a command whose client left runs on");
}

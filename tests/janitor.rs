//! `scenario-run cleanup`: a run killed hard (SIGKILL) leaves its sandboxes on the server; the
//! janitor finds them by the run tag, lists them in a dry run, deletes them with --yes, and
//! never touches a sandbox without the tag.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// A raw HTTP/1.1 request to serve; returns (status, body).
fn http(port: u16, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-API-KEY: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn listed_ids(port: u16, key: &str) -> Vec<(String, Option<String>)> {
    let (status, body) = http(port, "GET", "/v2/sandboxes", key, "");
    assert_eq!(status, 200, "{body}");
    // The body may be chunked; take the JSON array out of it.
    let start = body.find('[').unwrap();
    let end = body.rfind(']').unwrap();
    let list: serde_json::Value = serde_json::from_str(&body[start..=end]).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|s| (s["sandboxID"].as_str().unwrap().to_string(), s["metadata"]["e2e"].as_str().map(str::to_string)))
        .collect()
}

#[test]
fn sigkilled_run_leaves_tagged_sandboxes_that_the_janitor_removes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let key = format!("e2b_{:040x}", 0xfeed_u128 * 1_000_003 + u128::from(port));
    let listen = format!("127.0.0.1:{port}");
    let mut server =
        cmd(&["serve", "--listen", &listen]).env("E2B_API_KEY", &key).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let url = format!("http://127.0.0.1:{port}");
    let env = |c: &mut std::process::Command| {
        c.env("E2B_API_KEY", &key)
            .env("E2B_API_URL", &url)
            .env("E2B_SANDBOX_URL", &url)
            .env("E2B_DOMAIN", format!("localhost:{port}"));
    };

    // A sandbox someone else made, without our tag: the janitor must leave it alone.
    let (status, body) = http(
        port,
        "POST",
        "/v2/sandboxes",
        &key,
        r#"{"templateID":"base","metadata":{"owner":"someone"},"envVars":{}}"#,
    );
    assert_eq!(status, 201, "{body}");

    let run_id = format!("janitor-{}", std::process::id());
    let mut c = cmd(&["--provider", "e2b", "--no-progress", "-j", "3", "tests/fixtures/interrupt"]);
    env(&mut c);
    let mut runner = c.env("E2E_RUN_ID", &run_id).env("SR_TEST_MARK", "janitor").stdout(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while listed_ids(port, &key).iter().filter(|(_, tag)| tag.as_deref() == Some(run_id.as_str())).count() < 3 {
        assert!(Instant::now() < deadline, "the run never created its sandboxes");
        std::thread::sleep(Duration::from_millis(100));
    }
    runner.kill().unwrap(); // SIGKILL: no cleanup of its own
    runner.wait().unwrap();
    let left: Vec<_> =
        listed_ids(port, &key).into_iter().filter(|(_, tag)| tag.as_deref() == Some(run_id.as_str())).collect();
    assert_eq!(left.len(), 3, "a SIGKILLed run leaves its sandboxes behind on a remote provider");

    let mut dry = cmd(&["cleanup", "--provider", "e2b", "--run-id", &run_id]);
    env(&mut dry);
    let out = dry.output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("3 sandbox(es) would be deleted"), "{stdout}");
    for (id, _) in &left {
        assert!(stdout.contains(id.as_str()), "{id} not listed:\n{stdout}");
    }
    assert_eq!(listed_ids(port, &key).len(), 4, "a dry run deletes nothing");

    // Fresh sandboxes are not older than an hour.
    let mut young = cmd(&["cleanup", "--provider", "e2b", "--all-tagged", "--older-than", "1h", "--yes"]);
    env(&mut young);
    let out = young.output().unwrap();
    assert!(text(&out.stdout).contains("deleted 0 sandbox(es)"), "{}", text(&out.stdout));
    assert_eq!(listed_ids(port, &key).len(), 4);

    let mut real = cmd(&["cleanup", "--provider", "e2b", "--all-tagged", "--yes"]);
    env(&mut real);
    let out = real.output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("deleted 3 sandbox(es)"), "{}", text(&out.stdout));
    let rest = listed_ids(port, &key);
    assert_eq!(rest.len(), 1, "only the untagged sandbox remains: {rest:?}");
    assert_eq!(rest[0].1, None);

    // SAFETY: signalling the server we spawned, by its pid.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let _ = server.wait();
}

#[test]
fn janitor_needs_a_selection() {
    let out =
        cmd(&["cleanup", "--provider", "e2b"]).env_remove("E2E_RUN_ID").env("E2B_API_KEY", "e2b_x").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--run-id"), "{}", text(&out.stderr));
}

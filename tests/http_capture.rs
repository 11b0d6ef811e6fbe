//! Issue 37 item 12, Hurl's habits: `capture` binds a response header or a regex's group to a
//! variable the next steps use; `-v` shows a failing HTTP step's whole exchange (request and
//! response) with credentials masked; `check` locates a capture's mistakes. Against a real HTTP
//! server on the test's own loopback port, through the binary.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;

/// A server that answers GET with a token header and an id in the body, and POST with a 500,
/// sending each POST's Authorization header and body to the channel. Its port.
fn server() -> (u16, mpsc::Receiver<(String, String)>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut r = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            if r.read_line(&mut first).is_err() {
                continue;
            }
            let (mut len, mut auth) = (0usize, String::new());
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap_or((&h, ""));
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap_or(0),
                    "authorization" => auth = v.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let mut conn = conn;
            let reply = if first.starts_with("POST") {
                let _ = tx.send((auth, String::from_utf8_lossy(&body).into_owned()));
                let b = r#"{"error":"no such order"}"#;
                format!("HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}", b.len())
            } else {
                let b = "<p>order id=42; next</p>";
                format!(
                    "HTTP/1.1 200 OK\r\nx-token: abc123\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                    b.len()
                )
            };
            let _ = conn.write_all(reply.as_bytes());
        }
    });
    (port, rx)
}

fn scenario(dir: &std::path::Path, body: &str) -> String {
    let path = dir.join("capture.yaml");
    std::fs::write(&path, format!("name: capture\nsteps:\n{body}")).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn captures_feed_the_next_request_and_a_failing_exchange_shows_whole_with_credentials_masked() {
    let (port, posts) = server();
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        &format!(
            "  - http-get:\n      url: http://127.0.0.1:{port}/\n      capture:\n        token: {{ header: X-Token }}\n        id: {{ regex: 'id=(\\d+)' }}\n  - http:\n      method: POST\n      url: http://127.0.0.1:{port}/orders\n      headers: {{ Authorization: \"Bearer {{{{ vars.token }}}}\" }}\n      body: \"id={{{{ vars.id }}}}\"\n      expect: {{ status: 201 }}\n"
        ),
    );
    let out = run(&[&file, "--no-progress", "-v"]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the 500 fails the run: {stdout}{stderr}");
    // The captures reached the server: the header's value and the regex's first group.
    let (auth, body) = posts.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
    assert_eq!((auth.as_str(), body.as_str()), ("Bearer abc123", "id=42"));
    // The exchange, as `curl -v` shows it; the token never.
    for line in [
        format!("      > POST http://127.0.0.1:{port}/orders"),
        "      > Authorization: Bearer ***".into(),
        "      > id=42".into(),
        "      < 500 (".into(),
        "      < content-type: application/json".into(),
        r#"      < {"error":"no such order"}"#.into(),
    ] {
        assert!(stdout.contains(&line), "missing {line:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("abc123") && !stderr.contains("abc123"), "the captured token shows: {stdout}");
    // Without -v, the failure stays one block, as before.
    let quiet = text(&run(&[&file, "--no-progress"]).stdout);
    assert!(!quiet.contains("      > POST"), "{quiet}");
}

#[test]
fn a_capture_that_finds_nothing_fails_its_step_and_check_locates_bad_captures() {
    let (port, _posts) = server();
    let dir = tempfile::tempdir().unwrap();
    let file = scenario(
        dir.path(),
        &format!(
            "  - http-get:\n      url: http://127.0.0.1:{port}/\n      capture:\n        missing: {{ regex: 'ref=(\\d+)' }}\n  - http-get: {{ url: \"http://127.0.0.1:{port}/?never\" }}\n"
        ),
    );
    let out = run(&[&file, "--no-progress"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("capture `missing`: /ref=(\\d+)/ does not match the body"), "{stdout}");
    let file = scenario(
        dir.path(),
        "  - http-get:\n      url: http://127.0.0.1:1/\n      capture:\n        id: { regex: 'id=(\\d+' }\n        tok: { heder: X-Token }\n        1st: { header: X-A }\n",
    );
    let out = run(&["check", &file]);
    let err = text(&out.stderr) + &text(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{err}");
    for want in [
        "capture.yaml:6:22",
        "bad regex for capture `id`",
        "capture.yaml:7:16",
        "heder",
        "capture.yaml:8:9",
        "capture name `1st`",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

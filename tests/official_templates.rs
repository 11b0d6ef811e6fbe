//! Issue 14: `create: { template: base }` (and `code-interpreter-v1`) sends the platform's own
//! id from the template folder's `template.yaml` `ids`: on alicloud `216g37mamkdfhzrauvxk`
//! (and `8d926meb1xzckz1a83ib`), on e2b `base` (and `code-interpreter-v1`); a name no folder
//! maps goes as it is. Checked on the wire: the real binary against a small stub of the
//! control plane on 127.0.0.1 that records every create body.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use common::*;

/// A stub control plane: creates answer 201 with a fresh id, kills 204, anything else 404.
/// Returns its port and the JSON bodies of the creates it saw.
fn stub() -> (u16, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let creates = Arc::new(Mutex::new(Vec::new()));
    let seen = creates.clone();
    std::thread::spawn(move || {
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut first = String::new();
            if reader.read_line(&mut first).is_err() {
                continue;
            }
            let mut len = 0usize;
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = h.split_once(':') {
                    if k.eq_ignore_ascii_case("content-length") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0u8; len];
            let _ = reader.read_exact(&mut body);
            let mut parts = first.split(' ');
            let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (status, reply) = if method == "POST" && (path == "/sandboxes" || path == "/v2/sandboxes") {
                let sent: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let reply = serde_json::json!({
                    "sandboxID": format!("sbx{n:017}"), "templateID": sent["templateID"],
                    "clientID": "stub", "envdVersion": "0.5.4",
                });
                seen.lock().unwrap().push(sent);
                ("201 Created", reply.to_string())
            } else if method == "DELETE" {
                ("204 No Content", String::new())
            } else {
                ("404 Not Found", r#"{"code":404,"message":"not in the stub"}"#.to_string())
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
                reply.len()
            );
        }
    });
    (port, creates)
}

/// Runs the fixture on `provider` (its variables in `env`); the fixture checks `template_id`.
fn run_on(provider: &str, env: &[(&str, String)], expect: (&str, &str)) {
    let mut c = cmd(&["tests/fixtures/official-ids/create-official.yaml", "--provider", provider, "--no-progress"]);
    for k in [
        "E2B_API_KEY",
        "E2B_API_URL",
        "E2B_DOMAIN",
        "ABX_SANDBOX_API_KEY",
        "ABX_SANDBOX_BASE_URL",
        "ABX_SANDBOX_DOMAIN",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.env("EXPECT_BASE", expect.0).env("EXPECT_CI", expect.1).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
}

const KEY: &str = "e2b_0123456789abcdef0123456789abcdef01234567";

#[test]
fn create_sends_the_official_ids_of_template_yaml() {
    let (port, creates) = stub();
    let url = format!("http://127.0.0.1:{port}");
    let alicloud = [("ABX_SANDBOX_API_KEY", KEY.to_string()), ("ABX_SANDBOX_BASE_URL", url.clone())];
    run_on("alicloud", &alicloud, ("216g37mamkdfhzrauvxk", "8d926meb1xzckz1a83ib"));
    let e2b = [("E2B_API_KEY", KEY.to_string()), ("E2B_API_URL", url.clone())];
    run_on("e2b", &e2b, ("base", "code-interpreter-v1"));
    let ids: Vec<String> =
        creates.lock().unwrap().iter().map(|b| b["templateID"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(
        ids,
        [
            "216g37mamkdfhzrauvxk",
            "8d926meb1xzckz1a83ib",
            "my-own-template",
            "base",
            "code-interpreter-v1",
            "my-own-template"
        ],
        "what went over the wire"
    );
}

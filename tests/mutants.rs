//! Platform faults (issue 40, `serve --fault`): a fault makes a shipped scenario fail that
//! passes on the faithful serve (the core of `scripts/mutation` can fail), no client can
//! switch a fault on, and an unknown name is refused with the known ones.

mod common;

use std::io::{Read, Write};

use common::serve::{e2b_cmd, live, serve, serve_with, Server};
use common::*;

const SCENARIO: &str = "scenarios/commands/exit-codes-and-streams.yaml";

#[test]
fn a_fault_fails_a_shipped_scenario_that_passes_without_it() {
    let faithful = serve();
    let out = e2b_cmd(&faithful, &[SCENARIO]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "faithful serve: {}{}", text(&out.stdout), text(&out.stderr));
    drop(faithful);
    let faulty = serve_with(&["--fault", "exit-code-zero"]);
    let out = e2b_cmd(&faulty, &[SCENARIO]).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "with exit-code-zero: {stdout}{}", text(&out.stderr));
    assert!(stdout.contains("FAILED") && stdout.contains("assert-exit"), "{stdout}");
}

/// One HTTP/1.1 request to `srv`; the status and the body.
fn http(srv: &Server, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (k, v) in headers {
        req += &format!("{k}: {v}\r\n");
    }
    req += &format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// The hostile rule: faults are the host's configuration. A client naming one every way it
/// could (headers, query strings, create's metadata and body) gets the faithful serve: a wrong
/// key is still refused (`any-api-key`), a kill still kills (`kill-keeps-sandbox`).
#[test]
fn no_client_can_switch_a_fault_on() {
    let srv = serve();
    let names = "any-api-key,kill-keeps-sandbox,exit-code-zero";
    let asks = [("X-Fault", names), ("X-Serve-Fault", names), ("Fault", names), ("X-Mutants", names)];
    let wrong = [("X-API-KEY", "e2b_ffffffffffffffffffffffffffffffffffffffff")];
    let (status, _) = http(&srv, "GET", &format!("/v2/sandboxes?fault={names}"), &[&wrong[..], &asks].concat(), "");
    assert_eq!(status, 401, "a wrong key naming any-api-key is still refused");
    let key = [("X-API-KEY", srv.key.as_str())];
    let body = format!(
        r#"{{"templateID":"base","timeout":120,"metadata":{{"fault":"{names}","mutants":"{names}"}},"fault":"{names}","faults":["kill-keeps-sandbox"]}}"#
    );
    let (status, created) =
        http(&srv, "POST", &format!("/sandboxes?fault={names}"), &[&key[..], &asks].concat(), &body);
    assert_eq!(status, 201, "{created}");
    let v: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = v["sandboxID"].as_str().unwrap();
    let (status, answer) =
        http(&srv, "DELETE", &format!("/sandboxes/{id}?fault={names}"), &[&key[..], &asks].concat(), "");
    assert_eq!(status, 204, "{answer}");
    let (status, _) = http(&srv, "GET", &format!("/sandboxes/{id}"), &key, "");
    assert_eq!(status, 404, "the kill killed");
    assert_eq!(live(&srv), 0);
}

#[test]
fn unknown_faults_are_refused_with_the_known_ones_and_list_prints_the_catalog() {
    let key = "e2b_0000000000000000000000000000000000000000";
    let out = cmd(&["serve", "--listen", "127.0.0.1:0", "--fault", "exit-code-zero,no-such-fault"])
        .env("E2B_API_KEY", key)
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown fault \"no-such-fault\"; known faults: resume-loses-files, "), "{stderr}");
    let out = run(&["serve", "--fault", "list"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("NAME\tAREA\tSTANDS FOR\tDOES\n"), "{stdout}");
    assert!(stdout.contains("resume-loses-files\tlifecycle\tE2B #884: changes lost after a resume\t"), "{stdout}");
    assert!(stdout.lines().count() > 25, "{stdout}");
}

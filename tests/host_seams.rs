//! Rules 1 and 2 of the threat model (docs/reference.md, "Threat model"), tried as an attacker against a
//! real `serve` in its default configuration and with host volumes enabled:
//!
//! * check and act on the same object: a sandbox sharing a named volume swaps a directory for
//!   a link to `/` (or to a host directory) in a loop while another create mounts, or makes, a
//!   `subPath` there; nothing outside the volume is ever mounted or changed;
//! * no listener goes around an access rule: after requests to sandbox ports through serve,
//!   serve holds no TCP listener but its own API's.
//!
//! Needs what the local provider needs (root, bwrap), like `opensandbox_routes.rs`. The
//! attackers' loops are bounded (`timeout 300`) and end with their sandbox.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::serve::{serve_with, Server};
use reqwest::StatusCode;
use serde_json::{json, Value};

const KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
const ACCESS: &str = "OpenSandbox-Secure-Access";
const EXECD: u16 = 44772;

fn client() -> reqwest::Client {
    scenario_run::net::client_builder().timeout(Duration::from_secs(60)).build().unwrap()
}

fn base(srv: &Server) -> String {
    format!("http://127.0.0.1:{}", srv.port)
}

async fn answer(r: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let r = r.send().await.unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Creates a sandbox of `base` with `volumes`: the answer.
async fn create(http: &reqwest::Client, srv: &Server, volumes: Value) -> (StatusCode, Value) {
    answer(
        http.post(format!("{}/v1/sandboxes", base(srv)))
            .header(KEY_HEADER, &srv.key)
            .json(&json!({"templateId": "base", "timeout": 300, "volumes": volumes})),
    )
    .await
}

async fn kill(http: &reqwest::Client, srv: &Server, id: &str) {
    let r = http.delete(format!("{}/v1/sandboxes/{id}", base(srv))).header(KEY_HEADER, &srv.key).send().await.unwrap();
    assert!(r.status().is_success(), "kill {id}: {}", r.status());
}

/// The URL of `port` of `id` and the token its headers name.
async fn endpoint(http: &reqwest::Client, srv: &Server, id: &str, port: u16) -> (String, String) {
    let (status, v) =
        answer(http.get(format!("{}/v1/sandboxes/{id}/endpoints/{port}", base(srv))).header(KEY_HEADER, &srv.key))
            .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    (format!("http://{}", v["endpoint"].as_str().unwrap()), v["headers"][ACCESS].as_str().unwrap_or("").to_string())
}

/// Runs `command` in `id` through execd: its output (foreground), or at once (background).
async fn run(http: &reqwest::Client, srv: &Server, id: &str, command: &str, background: bool) -> String {
    let (url, token) = endpoint(http, srv, id, EXECD).await;
    let r = http
        .post(format!("{url}/command"))
        .header(ACCESS, token)
        .json(&json!({"command": command, "background": background}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{command}");
    r.text().await.unwrap()
}

/// A named volume `claim` at `at`, optionally one `subPath` of it.
fn pvc(claim: &str, at: &str, sub: Option<&str>) -> Value {
    let mut v = json!({"name": "v", "pvc": {"claimName": claim}, "mountPath": at});
    if let Some(s) = sub {
        v["subPath"] = json!(s);
    }
    json!([v])
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sub_path_swapped_for_a_link_to_the_root_never_mounts_the_host() {
    let vols = tempfile::Builder::new().prefix("srseam-vols-").tempdir().unwrap();
    let srv = serve_with(&["--volumes-dir", vols.path().to_str().unwrap()]);
    let http = client();
    let (status, a) = create(&http, &srv, pvc("race", "/data", None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{a}");
    let a = a["id"].as_str().unwrap().to_string();
    // The attacker: /data/x is, by turns, the real directory (with a mark) and a link to /,
    // swapped by renames so that it is never missing for long.
    run(&http, &srv, &a, "mkdir -p /data/x && touch /data/x/in-volume && ln -sfn / /data/l", false).await;
    run(
        &http,
        &srv,
        &a,
        "timeout 300 sh -c 'while :; do mv -T /data/x /data/y; mv -T /data/l /data/x; mv -T /data/x /data/l; mv -T /data/y /data/x; done'",
        true,
    )
    .await;
    let (mut mounted, mut refused) = (0, 0);
    for _ in 0..20 {
        let (status, b) = create(&http, &srv, pvc("race", "/mnt", Some("x"))).await;
        if status != StatusCode::ACCEPTED {
            // Refused: a link (400), or the checked directory was renamed over and removed
            // before the mount (the create fails). Either way nothing was mounted.
            eprintln!("refused: {status} {b}");
            refused += 1;
            continue;
        }
        mounted += 1;
        let b = b["id"].as_str().unwrap().to_string();
        let seen = run(&http, &srv, &b, "ls -A /mnt; test -e /mnt/etc/hostname && echo HOST-ROOT", false).await;
        assert!(!seen.contains("HOST-ROOT") && !seen.contains("proc"), "the host's root was mounted: {seen}");
        kill(&http, &srv, &b).await;
    }
    eprintln!("mounted {mounted}, refused {refused}");
    assert!(mounted > 0, "no create got the directory: the test proves nothing");
    kill(&http, &srv, &a).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_sub_path_is_made_inside_the_volume_whatever_links_come_and_go() {
    let vols = tempfile::Builder::new().prefix("srseam-vols-").tempdir().unwrap();
    // A root-owned 0700 directory of the host the attacker aims at.
    let victim = tempfile::Builder::new().prefix("srseam-victim-").tempdir().unwrap();
    std::fs::set_permissions(victim.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let srv = serve_with(&["--volumes-dir", vols.path().to_str().unwrap()]);
    let http = client();
    let (status, a) = create(&http, &srv, pvc("chmod", "/data", None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{a}");
    let a = a["id"].as_str().unwrap().to_string();
    // The attacker: each n<i> comes and goes as a link to the victim (a host path: serve, not
    // the sandbox, would follow it).
    let target = victim.path().display();
    run(
        &http,
        &srv,
        &a,
        &format!(
            "timeout 300 sh -c 'while :; do for i in $(seq 0 19); do ln -s {target} /data/n$i 2>/dev/null; rm -f /data/n$i; done; done'"
        ),
        true,
    )
    .await;
    for i in 0..20 {
        let sub = format!("n{i}/inner");
        let (status, b) = create(&http, &srv, pvc("chmod", "/mnt", Some(&sub))).await;
        match status {
            StatusCode::ACCEPTED => kill(&http, &srv, b["id"].as_str().unwrap()).await,
            _ => assert_eq!(status, StatusCode::BAD_REQUEST, "{b}"),
        }
    }
    kill(&http, &srv, &a).await;
    let mode = std::fs::metadata(victim.path()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the host directory's mode was changed through a link");
    let inside: Vec<_> = std::fs::read_dir(victim.path()).unwrap().collect();
    assert!(inside.is_empty(), "serve made directories in the host directory: {inside:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn host_volumes_refuse_links_below_the_prefix_and_mount_what_was_checked() {
    let prefix = tempfile::Builder::new().prefix("srseam-prefix-").tempdir().unwrap();
    let srv = serve_with(&["--host-volume-prefix", prefix.path().to_str().unwrap()]);
    let http = client();
    std::fs::create_dir(prefix.path().join("real")).unwrap();
    std::fs::write(prefix.path().join("real/mark"), "in the prefix").unwrap();
    std::os::unix::fs::symlink("/", prefix.path().join("root")).unwrap();
    std::os::unix::fs::symlink("real", prefix.path().join("alias")).unwrap();
    let host = |p: &str, sub: Option<&str>| {
        let mut v = json!({"name": "h", "host": {"path": prefix.path().join(p)}, "mountPath": "/mnt"});
        if let Some(s) = sub {
            v["subPath"] = json!(s);
        }
        json!([v])
    };
    for (vol, what) in [
        (host("root", None), "a link to /"),
        (host("root/etc", None), "through a link to /"),
        (host("alias", None), "a link inside the prefix"),
        (host("real", Some("../root")), "a climbing subPath"),
    ] {
        let (status, v) = create(&http, &srv, vol).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
    }
    let (status, v) = create(&http, &srv, host("real", None)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    assert!(run(&http, &srv, &id, "cat /mnt/mark", false).await.contains("in the prefix"));
    kill(&http, &srv, &id).await;
    // A missing directory below the prefix is made there, not through a link.
    let (status, v) = create(&http, &srv, host("real", Some("made/deeper"))).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    assert!(prefix.path().join("real/made/deeper").is_dir());
    kill(&http, &srv, v["id"].as_str().unwrap()).await;
}

/// The local TCP ports `pid` listens on (its LISTEN sockets, matched by inode).
fn listening_ports(pid: u32) -> Vec<u16> {
    let mut inodes = std::collections::HashSet::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
        if let Ok(link) = std::fs::read_link(fd.path()) {
            let link = link.to_string_lossy().into_owned();
            if let Some(n) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                inodes.insert(n.to_string());
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: LISTEN), inode.
            if f.len() > 9 && f[3] == "0A" && inodes.contains(f[9]) {
                let port = f[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports.sort_unstable();
    ports
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_listens_on_nothing_but_its_api_after_sandbox_ports_are_used() {
    let srv = serve_with(&[]);
    let http = client();
    assert_eq!(listening_ports(srv.pid()), vec![srv.port], "before any sandbox");
    let (status, v) = create(&http, &srv, json!([])).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    run(&http, &srv, &id, "cd /tmp && echo private > page.txt && python3 -m http.server 8000", true).await;
    let (url, token) = endpoint(&http, &srv, &id, 8000).await;
    let mut page = String::new();
    for _ in 0..100 {
        let r = http.get(format!("{url}/page.txt")).header(ACCESS, &token).send().await;
        if let Ok(r) = r {
            if r.status() == StatusCode::OK {
                page = r.text().await.unwrap();
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(page, "private\n", "the port was not reached with the token");
    // Every listener serve now has (a forwarder left behind would be one), tried as nobody.
    let ports = listening_ports(srv.pid());
    let mut reached = Vec::new();
    for port in ports.iter().copied().filter(|p| *p != srv.port) {
        let fetch = format!(
            "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:{port}/page.txt',timeout=5).read())"
        );
        // The system's Python: root's own (pyenv under /root) is not nobody's to run.
        let out = std::process::Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", "/usr/bin/python3", "-c", &fetch])
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // A client that could not even run proves nothing: it must have been refused or answered.
        assert!(out.status.success() || stderr.contains("urlopen error") || stderr.contains("Error"), "{stderr}");
        if stdout.contains("private") {
            reached.push(port);
        }
    }
    assert!(reached.is_empty(), "nobody reached the private port without a token through {reached:?}");
    assert_eq!(ports, vec![srv.port], "serve listens beyond its API: {ports:?}");
    kill(&http, &srv, &id).await;
}

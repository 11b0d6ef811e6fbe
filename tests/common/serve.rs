//! A real `scenario-run serve` for tests that drive clients against it (`host_step.rs`,
//! `clients.rs`, `e2b_over_serve.rs`): started on a free loopback port with a fresh key, stopped when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::cmd;

pub struct Server {
    child: Child,
    pub port: u16,
    pub key: String,
    /// Its CA (`ca/ca.pem`) and `bundle.pem`: the system's roots and that CA.
    tls: tempfile::TempDir,
}

impl Server {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What a client trusts to reach the server's https port hosts: the system's roots and
    /// serve's CA (SSL_CERT_FILE replaces Python's store, and pip must still reach PyPI).
    pub fn ca_bundle(&self) -> std::path::PathBuf {
        self.tls.path().join("bundle.pem")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: signalling the server we spawned, by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `scenario-run serve` with `extra` flags, once it listens.
pub fn serve_with(extra: &[&str]) -> Server {
    serve_env(extra, &[])
}

/// [`serve_with`], with variables set for the server (its state directory, say).
pub fn serve_env(extra: &[&str], env: &[(&str, &std::path::Path)]) -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let key = format!("e2b_{:040x}", u128::from(std::process::id()) * 104729 + u128::from(port));
    let listen = format!("127.0.0.1:{port}");
    let tls = tempfile::Builder::new().prefix("srserve-ca-").tempdir().unwrap();
    let ca_dir = tls.path().join("ca");
    let ca_dir = ca_dir.to_str().unwrap();
    let mut args = vec!["serve", "--listen", &listen, "--ca-dir", ca_dir];
    args.extend_from_slice(extra);
    let mut c = cmd(&args);
    // The key from the environment, as README prefers (a flag's value is in /proc/<pid>/cmdline).
    c.env("E2B_API_KEY", &key);
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on http://127.0.0.1:"), "server did not start: {line:?}");
    let mut bundle = std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    bundle.extend(std::fs::read(tls.path().join("ca/ca.pem")).expect("serve made its CA"));
    std::fs::write(tls.path().join("bundle.pem"), bundle).unwrap();
    Server { child, port, key, tls }
}

pub fn serve() -> Server {
    serve_with(&[])
}

/// The binary with `--provider e2b` pointed at `srv`, as tests/e2b_sdk/run.sh points the SDK
/// (its clients trusting serve's CA for https port hosts).
pub fn e2b_cmd(srv: &Server, args: &[&str]) -> Command {
    let url = format!("http://127.0.0.1:{}", srv.port);
    let mut all = vec!["--provider", "e2b", "--no-progress"];
    all.extend_from_slice(args);
    let mut c = cmd(&all);
    c.env("E2B_API_KEY", &srv.key)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_DOMAIN", format!("localhost:{}", srv.port))
        .env("SSL_CERT_FILE", srv.ca_bundle())
        .env_remove("E2E_RUN_TAG");
    c
}

/// The binary with the alicloud preset pointed at `srv` (the product client's `ABX_*`
/// settings, and no E2B key to fall back on).
pub fn alicloud_cmd(srv: &Server, args: &[&str]) -> Command {
    let url = format!("http://127.0.0.1:{}", srv.port);
    let mut all = vec!["--provider", "alicloud", "--no-progress"];
    all.extend_from_slice(args);
    let mut c = cmd(&all);
    c.env("ABX_SANDBOX_API_KEY", &srv.key)
        .env("ABX_SANDBOX_BASE_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("ABX_SANDBOX_DOMAIN", format!("localhost:{}", srv.port))
        .env("SSL_CERT_FILE", srv.ca_bundle())
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_API_URL")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2E_RUN_TAG");
    c
}

/// The binary with `--provider opensandbox` pointed at `srv` (OpenSandbox's lifecycle API and
/// execd, as the OpenSandbox SDKs reach them), and no E2B settings to fall back on.
pub fn opensandbox_cmd(srv: &Server, args: &[&str]) -> Command {
    let mut all = vec!["--provider", "opensandbox", "--no-progress"];
    all.extend_from_slice(args);
    let mut c = cmd(&all);
    c.env("OPEN_SANDBOX_API_KEY", &srv.key)
        .env("OPEN_SANDBOX_DOMAIN", format!("127.0.0.1:{}", srv.port))
        .env("OPEN_SANDBOX_PROTOCOL", "http")
        .env("SSL_CERT_FILE", srv.ca_bundle())
        .env_remove("E2B_API_KEY")
        .env_remove("E2B_API_URL")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2E_RUN_TAG");
    c
}

/// Live sandboxes on `srv` (its stats route).
pub fn live(srv: &Server) -> u64 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", srv.port)).unwrap();
    write!(s, "GET /_serve/stats HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {}\r\nConnection: close\r\n\r\n", srv.key)
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let start = body.find('{').unwrap_or_else(|| panic!("no stats in {resp}"));
    let end = body.rfind('}').unwrap();
    let v: serde_json::Value = serde_json::from_str(&body[start..=end]).unwrap();
    v["live"].as_u64().unwrap()
}

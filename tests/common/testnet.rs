//! Test hosts outside every sandbox, for the egress tests: a network namespace the test makes,
//! joined to this host by a veth pair, holding addresses of a documentation range
//! (TEST-NET-2, 198.51.100.0/24) with servers on them (tests/fixtures/egress/server.py: HTTP
//! on 80, HTTPS on 443, a banner on 7000, each answer naming its address). The host routes to
//! them through the pair, so a sandbox's traffic, which leaves through the host's sockets,
//! reaches them; nothing leaves this machine. Everything is removed when the value is dropped.
//!
//! The namespace is held by a process of the test's (`unshare --net`), not named under
//! `/run/netns`: nothing is mounted on the host, and the pair goes with the namespace. Tests
//! run in parallel processes: each takes one of 15 slots (a /28 each, by an exclusive lock on
//! `/run/scenario-run-testnet/<slot>.lock`, held for its lifetime), and clears what a killed
//! earlier holder of the same slot left.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};

pub struct TestNet {
    slot: u8,
    _lock: std::fs::File,
    /// The process that holds the namespace, then the servers in it.
    procs: Vec<Child>,
    dir: tempfile::TempDir,
    /// The namespace, as `nsenter --net` takes it.
    ns: String,
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("these tests need iproute2's `ip`")
}

fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl TestNet {
    /// A test network with `hosts` test hosts (at most 13), each serving (see the module
    /// documentation).
    pub fn new(hosts: usize) -> Self {
        assert!(hosts <= 13);
        let lock_dir = std::path::Path::new("/run/scenario-run-testnet");
        std::fs::create_dir_all(lock_dir).unwrap();
        let (slot, lock) = (1u8..16)
            .cycle()
            .take(15 * 200)
            .find_map(|slot| {
                let f = std::fs::File::create(lock_dir.join(format!("{slot}.lock"))).ok()?;
                // SAFETY: flock on a descriptor we own.
                let locked = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
                if !locked {
                    std::thread::sleep(std::time::Duration::from_millis(if slot == 15 { 100 } else { 0 }));
                }
                locked.then_some((slot, f))
            })
            .expect("a free test-network slot within 5 minutes");
        let mut net =
            Self { slot, _lock: lock, procs: Vec::new(), dir: tempfile::tempdir().unwrap(), ns: String::new() };
        net.clear();
        let holder = Command::new("unshare").args(["--net", "sleep", "infinity"]).spawn().expect("unshare");
        let pid = holder.id().to_string();
        net.procs.push(holder);
        let ns = format!("/proc/{pid}/ns/net");
        net.ns = ns.clone();
        // `unshare` has made the namespace once `sleep` runs in it.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(&ns).ok() == std::fs::read_link("/proc/self/ns/net").ok() {
            assert!(std::time::Instant::now() < deadline, "unshare --net made no namespace");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let inside = |args: &[&str]| {
            let out = Command::new("nsenter").arg(format!("--net={ns}")).arg("ip").args(args).output().unwrap();
            assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        };
        let (h, t) = (net.host_if(), net.test_if());
        ip_ok(&["link", "add", &h, "type", "veth", "peer", "name", &t, "netns", &pid]);
        ip_ok(&["addr", "add", &format!("{}/28", net.gateway()), "dev", &h]);
        ip_ok(&["link", "set", &h, "up"]);
        inside(&["link", "set", "lo", "up"]);
        inside(&["link", "set", &t, "up"]);
        for i in 0..hosts {
            inside(&["addr", "add", &format!("{}/28", net.host(i)), "dev", &t]);
        }
        inside(&["route", "add", "default", "via", &net.gateway().to_string()]);
        let (cert, key) = (net.dir.path().join("cert.pem"), net.dir.path().join("key.pem"));
        let st = Command::new("openssl")
            .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test"])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stderr(Stdio::null())
            .status()
            .expect("these tests need openssl");
        assert!(st.success());
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/egress/server.py");
        for i in 0..hosts {
            let mut child = Command::new("nsenter")
                .arg(format!("--net={ns}"))
                .arg("python3")
                .arg(&script)
                .arg(net.host(i).to_string())
                .arg(&cert)
                .arg(&key)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            use std::io::BufRead;
            std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
            assert_eq!(line.trim(), "ready", "the test host {} did not start", net.host(i));
            net.procs.push(child);
        }
        net
    }

    /// Starts `python3 SCRIPT ARGS...` inside the namespace and waits for its `ready` line; it
    /// ends with the network.
    pub fn serve_inside(&mut self, script: &std::path::Path, args: &[&str]) {
        let mut child = Command::new("nsenter")
            .arg(format!("--net={}", self.ns))
            .arg("python3")
            .arg(script)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "ready", "{} did not start", script.display());
        self.procs.push(child);
    }

    fn host_if(&self) -> String {
        format!("srtn{}h", self.slot)
    }
    fn test_if(&self) -> String {
        format!("srtn{}t", self.slot)
    }

    /// This host's end (an address of the host: no sandbox may reach it).
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, 16 * self.slot + 1)
    }

    /// Test host `i`.
    pub fn host(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, 16 * self.slot + 2 + i as u8)
    }

    /// The slot's range, as a policy names it.
    pub fn range(&self) -> String {
        format!("198.51.100.{}/28", 16 * self.slot)
    }

    fn clear(&self) {
        let _ = ip(&["link", "del", &self.host_if()]);
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        for s in self.procs.iter_mut().rev() {
            let _ = s.kill();
            let _ = s.wait();
        }
        self.clear();
    }
}

//! "Never the host" is decided by how the host routes (issue 35, items 4, 6 and 7), through the
//! real binary and real namespaces: an address the host takes by a `local` route is refused as
//! its interface addresses are, whether it came before or after the sandbox; the sandbox's DNS
//! address carries DNS only, to a nameserver the test starts in a network namespace of its own
//! (nothing is ever sent to this machine's resolver: the run sees a `/etc/resolv.conf` of the
//! test's, bound over the host's in a mount namespace of its own); and the egress proxy closes
//! an idle connection and refuses connections beyond its cap. They need root, iproute2,
//! nftables, slirp4netns and python3 (CI runs as root; `scripts/setup` installs them).
//! `SCENARIO_RUN_TEST_BIN` points them at an older build, to see them fail there.

mod common;

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::testnet::TestNet;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/egress").join(name)
}

/// What a run gave: its output (the run must have passed), and each `exec` step's stdout.
struct Ran {
    text: String,
    execs: Vec<String>,
}

/// Runs `yaml` with the binary in a mount namespace of its own, where each `(file, path)` of
/// `binds` is bound over `path` (nothing of the host changes). The scenario's steps must pass;
/// what the sandboxes saw is checked by the test, from the execs' outputs.
fn run(dir: &Path, yaml: &str, env: &[(&str, &str)], binds: &[(&Path, &str)]) -> Ran {
    let file = dir.join("scenario.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut script = String::new();
    for (src, dst) in binds {
        script.push_str(&format!("mount --bind '{}' {dst} && ", src.display()));
    }
    script.push_str("exec \"$@\"");
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(common::bin())
        .args([file.to_str().unwrap(), "--no-progress", "--isolation", "namespaces", "--json"])
        .arg(dir.join("report.json"))
        .env("NO_COLOR", "1")
        .env("SCENARIO_RUN_STATE_DIR", dir.join("state"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    let execs = common::step_outputs(&dir.join("report.json"), "exec");
    // Each exec's stdout, then its stderr (what the test checks is printed to stdout).
    let execs = execs
        .iter()
        .map(|o| format!("{}{}", o["stdout"].as_str().unwrap_or_default(), o["stderr"].as_str().unwrap_or_default()))
        .collect();
    Ran { text, execs }
}

/// Fails with every broken expectation at once, and what the sandboxes printed.
fn check(ran: &Ran, failures: &[String]) {
    assert!(failures.is_empty(), "{}\n\nexec outputs: {:#?}\n{}", failures.join("\n"), ran.execs, ran.text);
}

/// An `exec` step that runs a Python script in `sandbox`.
fn exec_py(sandbox: &str, name: &str, script: &str) -> String {
    let body: String = script.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "  - exec: |\n      python3 - <<'EOF'\n{body}      EOF\n    sandbox: {sandbox}\n    timeout: 60s\n    name: {name}\n"
    )
}

/// A listener on every host address that answers each connection with `hello`.
fn host_server() -> u16 {
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::Write;
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"hello");
        }
    });
    port
}

/// The `local` routes this test adds, in TEST-NET-2's first /28 (which `common::testnet`
/// never uses); removed on every path, and cleared first of what a killed earlier run left.
/// Runs of this test take turns by an exclusive lock.
struct LocalRoutes {
    _lock: std::fs::File,
}

const ROUTES: [&str; 2] = ["198.51.100.7/32", "198.51.100.8/29"];

impl LocalRoutes {
    fn take() -> Self {
        let dir = Path::new("/run/scenario-run-testnet");
        std::fs::create_dir_all(dir).unwrap();
        let lock = std::fs::File::create(dir.join("local-routes.lock")).unwrap();
        // SAFETY: flock on a descriptor we own.
        assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
        let routes = Self { _lock: lock };
        routes.clear();
        routes
    }

    fn clear(&self) {
        for r in ROUTES {
            let _ = Command::new("ip").args(["route", "del", "local", r, "dev", "lo", "table", "local"]).output();
        }
    }
}

impl Drop for LocalRoutes {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Issue 35, item 4: the host answers on 0.0.0.0 for every address its `local` routes take
/// (AnyIP), not only its interfaces'. A sandbox made before the routes exist loses them as
/// they appear (the kernel's route events), and one made after never has them.
#[test]
fn addresses_the_host_takes_by_local_routes_are_never_reached() {
    let routes = LocalRoutes::take();
    let port = host_server();
    let dir = tempfile::tempdir().unwrap();
    let probe = r#"import socket, time
def reach(a):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((a, PORT)); return s.recv(16).decode() or "closed"
    except Exception as e:
        return type(e).__name__
deadline = time.time() + 10
while True:
    got = [reach(a) for a in ("198.51.100.7", "198.51.100.9")]
    if "hello" not in got or time.time() > deadline:
        break
    time.sleep(0.1)
print("reached:", got)"#
        .replace("PORT", &port.to_string());
    let add = ROUTES.map(|r| format!("ip route add local {r} dev lo")).join(" && ");
    let yaml = [
        "name: local routes\nsteps:\n  - create: { template: base, as: before }\n".to_string(),
        format!("  - host: \"{add}\"\n"),
        format!(
            "  - host: python3 -c \"import socket; print(socket.create_connection(('198.51.100.9', {port}), 5).recv(16))\"\n    \
             name: the host itself answers there\n"
        ),
        "  - assert-stdout: { contains: hello }\n".to_string(),
        exec_py("before", "a sandbox made before the routes", &probe),
        "  - create: { template: base, as: after }\n".to_string(),
        exec_py("after", "a sandbox made after them", &probe.replace("time.time() + 10", "time.time()")),
    ]
    .concat();
    let ran = run(dir.path(), &yaml, &[], &[]);
    drop(routes);
    let mut failures = Vec::new();
    for (i, who) in ["a sandbox made before the routes", "a sandbox made after them"].iter().enumerate() {
        if ran.execs[i].contains("hello") || !ran.execs[i].contains("reached:") {
            failures.push(format!("{who} reached the host's service: {}", ran.execs[i].trim()));
        }
    }
    check(&ran, &failures);
}

/// Issue 35, item 6: the DNS address passes on well-formed queries only, over UDP and TCP; other
/// bytes to its port 53 never reach the nameserver, and the nameserver's address is the host's
/// (no other port of it is reached).
#[test]
fn the_dns_address_carries_dns_only() {
    let mut net = TestNet::new(1);
    let server = net.host(0).to_string();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("dns.log");
    std::fs::write(&log, "").unwrap();
    net.serve_inside(&fixture("dns.py"), &[&server, log.to_str().unwrap()]);
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {server}\n")).unwrap();
    let probe = r#"import socket, struct
def query(name):
    b = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for l in name.split("."):
        b += bytes([len(l)]) + l.encode()
    return b + b"\x00" + struct.pack(">HH", 1, 1)
def tcp(payload, framed=True):
    s = socket.create_connection(("10.0.2.3", 53), 5); s.settimeout(3)
    s.sendall(struct.pack(">H", len(payload)) + payload if framed else payload)
    try:
        return s.recv(4096) or "closed"
    except Exception as e:
        return type(e).__name__
a = tcp(query("tcp.test"))
print("tcp answer", ".".join(map(str, a[-4:])) if isinstance(a, bytes) else a)
print("tcp junk:", tcp(b"NOTDNS-framed-junk-0123456789"))
print("tcp raw junk:", tcp(b"GET / HTTP/1.1\r\nHost: NOTDNS\r\n\r\n", framed=False))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
u.sendto(b"NOTDNS-udp-junk-0123456789", ("10.0.2.3", 53))
try:
    print("udp junk:", u.recvfrom(4096))
except Exception as e:
    print("udp junk:", type(e).__name__)
b = socket.socket(); b.settimeout(5)
try:
    b.connect(("SERVER", 7000)); print("the nameserver's other port:", b.recv(64))
except Exception as e:
    print("the nameserver's other port:", type(e).__name__)"#
        .replace("SERVER", &server);
    let yaml = [
        "name: dns only\nsteps:\n  - create: { template: base, as: sb }\n".to_string(),
        "  - exec: getent ahostsv4 udp.test\n    name: a query over UDP resolves through the test's nameserver\n"
            .to_string(),
        exec_py("sb", "TCP queries pass, other bytes do not", &probe),
    ]
    .concat();
    let ran = run(dir.path(), &yaml, &[], &[(&resolv, "/etc/resolv.conf")]);
    // What the nameserver logs of a connection ends with the connection.
    std::thread::sleep(Duration::from_secs(1));
    let seen = std::fs::read_to_string(&log).unwrap();
    drop(net);
    let mut failures = Vec::new();
    if !ran.execs[0].contains("198.51.100.99") {
        failures.push("a query over UDP did not resolve through the test's nameserver".to_string());
    }
    if !ran.execs[1].contains("tcp answer 198.51.100.99") {
        failures.push("a query over TCP did not resolve through the test's nameserver".to_string());
    }
    if ran.execs[1].contains("banner") {
        failures.push("the nameserver's address was reached on another port".to_string());
    }
    let marker = b"NOTDNS".iter().map(|b| format!("{b:02x}")).collect::<String>();
    if seen.contains(&marker) {
        failures.push(format!("bytes that are no DNS query reached the nameserver:\n{seen}"));
    }
    if !seen.lines().any(|l| l.starts_with("udp ")) || !seen.lines().any(|l| l.starts_with("tcp ")) {
        failures.push(format!("the nameserver saw no query over UDP and TCP:\n{seen}"));
    }
    check(&ran, &failures);
}

/// Issue 35, item 7: a sandbox's connections through the egress proxy end after a time
/// without a byte either way (`SCENARIO_RUN_PROXY_IDLE`, 3 s here; one that trickles stays),
/// and no more than 128 are held at once: beyond, each is refused at once.
#[test]
fn the_egress_proxy_closes_idle_connections_and_caps_them() {
    let net = TestNet::new(1);
    let a = net.host(0).to_string();
    let dir = tempfile::tempdir().unwrap();
    let idle = r#"import socket, time
quiet = socket.create_connection(("ADDR", 80), 5)
busy = socket.create_connection(("ADDR", 80), 5)
busy.sendall(b"GET / HTTP/1.1\r\n")
for i in range(10):
    time.sleep(1); busy.sendall(b"X-Keep: %d\r\n" % i)
busy.sendall(b"Host: h\r\n\r\n"); busy.settimeout(5)
got = b""
while True:
    d = busy.recv(4096)
    if not d:
        break
    got += d
print("busy:", got.split(b"\r\n\r\n")[-1].decode().strip())
quiet.setblocking(False)
try:
    print("quiet:", "closed" if quiet.recv(16) == b"" else "data")
except BlockingIOError:
    print("quiet: open")
except ConnectionResetError:
    print("quiet: closed")"#
        .replace("ADDR", &a);
    let many = r#"import socket, time
conns = []
held = refused = 0
for _ in range(140):
    try:
        conns.append(socket.create_connection(("ADDR", 80), 5))
    except ConnectionResetError:
        refused += 1  # reset before connect() returned
time.sleep(1.5)
for c in conns:
    c.setblocking(False)
    try:
        c.recv(1); refused += 1
    except BlockingIOError:
        held += 1
    except ConnectionResetError:
        refused += 1
print(f"held={held} refused={refused}")"#
        .replace("ADDR", &a);
    let policy = "network: { allow_out: [\"unused.test\"] }";
    let yaml = [
        format!("name: proxy limits\nsteps:\n  - create: {{ template: base, as: idle, {policy} }}\n"),
        format!("  - create: {{ template: base, as: many, {policy} }}\n"),
        exec_py("idle", "an idle connection is closed, a trickling one is not", &idle),
        exec_py("many", "connections beyond the cap are refused", &many),
    ]
    .concat();
    let ran = run(dir.path(), &yaml, &[("SCENARIO_RUN_PROXY_IDLE", "3")], &[]);
    let mut failures = Vec::new();
    if !ran.execs[0].contains(&format!("busy: host {a} for h")) {
        failures.push("a connection that trickled bytes was not carried to its end".to_string());
    }
    if !ran.execs[0].contains("quiet: closed") {
        failures.push("an idle connection was not closed".to_string());
    }
    if !ran.execs[1].contains("held=128 refused=12") {
        failures.push("connections beyond the cap of 128 were not refused".to_string());
    }
    check(&ran, &failures);
}

//! Egress of local sandboxes (issue 24): a sandbox reaches the internet by default through its
//! user-space stack, never this host (its loopback, its addresses, its services) or another
//! sandbox, and `network.allowOut`/`denyOut` decide by address, range, port and (for HTTP and
//! TLS) name, with E2B's precedence, live. "The internet" here is what this machine may reach:
//! the package registries, and test hosts that the tests place in a network namespace of their
//! own (`common::testnet`, addresses of TEST-NET-2). They need root, iproute2, nftables,
//! slirp4netns and openssl (CI runs as root; `scripts/setup` installs them).

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::testnet::TestNet;
use scenario_run::provider::caps::*;
use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ErrorKind, ExecRequest, NetworkPolicy, Provider};

fn provider() -> (LocalProvider, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let opts =
        LocalOptions { state_dir: dir.path().to_path_buf(), isolation: Isolation::Namespaces, ..Default::default() };
    (LocalProvider::new(opts).expect("isolated sandboxes (needs root, bwrap)"), dir)
}

fn policy(allow: &[&str], deny: &[&str], internet: Option<bool>) -> NetworkPolicy {
    NetworkPolicy {
        allow_internet_access: internet,
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

async fn create(p: &LocalProvider, network: Option<NetworkPolicy>) -> String {
    p.create(CreateRequest { network, ..Default::default() }).await.unwrap().id
}

async fn sh(p: &LocalProvider, id: &str, user: &str, cmd: &str) -> (Option<i32>, String) {
    let req = ExecRequest {
        cmd: cmd.into(),
        user: Some(user.into()),
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    };
    let r = p.exec(id, req, None).await.unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    (r.exit_code, out)
}

/// What a TCP connection from inside to `addr:port` gives: the first line the server sends,
/// `closed` (accepted, then closed without a word: E2B's answer to a name it denies), or the
/// error's name (`ECONNREFUSED`, `EHOSTUNREACH`, `timeout`, ...).
async fn reach(p: &LocalProvider, id: &str, addr: &str, port: u16) -> String {
    let py = format!(
        "import socket, errno\n\
         s = socket.socket(); s.settimeout(5)\n\
         try:\n    s.connect(('{addr}', {port})); d = s.recv(100).decode().strip(); print(d or 'closed')\n\
         except socket.timeout:\n    print('timeout')\n\
         except OSError as e:\n    print(errno.errorcode.get(e.errno, str(e)))\n"
    );
    let req = ExecRequest {
        cmd: "python3 -".into(),
        stdin: Some(py.into_bytes()),
        user: Some("root".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let r = p.exec(id, req, None).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{}", String::from_utf8_lossy(&r.stderr));
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

/// An HTTP GET from inside; the body, or curl's error.
async fn get(p: &LocalProvider, id: &str, url: &str) -> String {
    let (_, out) = sh(p, id, "user", &format!("curl -sS -k -m 10 '{url}' 2>&1")).await;
    out.trim().to_string()
}

/// Whether `what` is a refusal (anything but a server's answer).
fn refused(what: &str) -> bool {
    !what.starts_with("banner") && !what.starts_with("host ")
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

/// Every IPv4 address of this host, loopback included.
fn host_addresses() -> Vec<String> {
    let out = std::process::Command::new("ip").args(["-4", "-o", "addr", "show"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|a| a.split('/').next().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn a_sandbox_reaches_the_package_registries_by_default() {
    let (p, _d) = provider();
    let id = create(&p, None).await;
    // A real package download from PyPI (a registry this machine reaches), resolved through
    // the sandbox's own resolver.
    let (code, out) = sh(
        &p,
        &id,
        "user",
        "cat /etc/resolv.conf; pip download --no-deps --no-cache-dir -q -d /tmp/dl six && ls /tmp/dl",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("nameserver 10.0.2.3") && out.contains("six-"), "{out}");
    p.kill(&id).await.unwrap();
}

#[tokio::test]
async fn the_host_its_services_and_other_sandboxes_are_never_reachable() {
    let (p, _d) = provider();
    let port = host_server();
    let loopback_only = TcpListener::bind("127.0.0.1:0").unwrap();
    let lport = loopback_only.local_addr().unwrap().port();
    // Even with every address allowed, by address and by name.
    for network in [None, Some(policy(&["0.0.0.0/0", "*"], &[], None))] {
        let id = create(&p, network.clone()).await;
        let other = create(&p, None).await;
        sh(&p, &other, "user", "nohup python3 -m http.server 8123 >/dev/null 2>&1 &").await;
        let other_url = p.port_url(&other, 8123).await.unwrap();
        let other_port: u16 = other_url.rsplit(':').next().unwrap().parse().unwrap();
        let mut targets: Vec<(String, u16)> = host_addresses().into_iter().map(|a| (a, port)).collect();
        targets.extend([
            ("127.0.0.1".to_string(), lport),
            ("10.0.2.2".to_string(), port),
            ("10.0.2.2".to_string(), lport),
            ("10.0.2.3".to_string(), port),
            ("169.254.169.254".to_string(), 80),
            ("0.0.0.0".to_string(), port),
            ("127.0.0.1".to_string(), other_port),
            ("10.0.2.2".to_string(), other_port),
        ]);
        for (addr, port) in &targets {
            let got = reach(&p, &id, addr, *port).await;
            assert!(refused(&got) && got != "hello", "{addr}:{port} reached from a sandbox ({network:?}): {got}");
        }
        // Through the proxy (port 80 with a name allowed) neither.
        if network.is_some() {
            let got = get(&p, &id, &format!("http://localhost:{lport}/")).await;
            assert!(!got.contains("hello"), "{got}");
        }
        p.kill(&id).await.unwrap();
        p.kill(&other).await.unwrap();
    }
}

#[tokio::test]
async fn addresses_ranges_and_ports_decide_with_allow_winning_over_deny() {
    let net = TestNet::new(2);
    let (a, b) = (net.host(0).to_string(), net.host(1).to_string());
    let (p, _d) = provider();
    // Open: both test hosts, every port.
    let id = create(&p, None).await;
    assert_eq!(reach(&p, &id, &a, 7000).await, format!("banner {a}"));
    assert!(get(&p, &id, &format!("http://{b}/")).await.starts_with(&format!("host {b}")));
    // Allow one address inside a denied range: allow wins.
    let id2 = create(&p, Some(policy(&[&a], &[&net.range()], None))).await;
    assert_eq!(reach(&p, &id2, &a, 7000).await, format!("banner {a}"));
    assert!(refused(&reach(&p, &id2, &b, 7000).await));
    // Deny everything but one port of one host.
    let id3 = create(&p, Some(policy(&[&format!("{b}:7000")], &["0.0.0.0/0"], None))).await;
    assert_eq!(reach(&p, &id3, &b, 7000).await, format!("banner {b}"));
    assert!(refused(&reach(&p, &id3, &b, 80).await));
    assert!(refused(&reach(&p, &id3, &a, 7000).await));
    // Deny one host only: the rest stays open.
    let id4 = create(&p, Some(policy(&[], &[&a], None))).await;
    assert!(refused(&reach(&p, &id4, &a, 7000).await));
    assert_eq!(reach(&p, &id4, &b, 7000).await, format!("banner {b}"));
    // No internet: nothing, and no DNS either (E2B's default nameserver is denied too).
    let id5 = create(&p, Some(policy(&[], &[], Some(false)))).await;
    assert!(refused(&reach(&p, &id5, &a, 7000).await));
    let (code, out) = sh(&p, &id5, "user", "getent hosts pypi.org").await;
    assert_ne!(code, Some(0), "DNS answered with internet access off: {out}");
    for id in [id, id2, id3, id4, id5] {
        p.kill(&id).await.unwrap();
    }
}

/// The sandbox directories in `state` (`sbx-…`) but those named in `skip`.
fn sandbox_dirs(state: &std::path::Path, skip: &[&str]) -> Vec<String> {
    std::fs::read_dir(state)
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("sbx-") && !skip.contains(&n.as_str()))
        .collect()
}

/// A create served by a sandbox booted ahead (issue 23: create latency) is the sandbox a fresh
/// boot gives: the create's own policy and environment, nothing of an earlier sandbox, its own
/// limits only when its shape matches; and every spare ends with the provider.
#[tokio::test]
async fn a_sandbox_booted_ahead_takes_its_creates_policy_and_environment() {
    let net = TestNet::new(1);
    let a = net.host(0).to_string();
    let (p, d) = provider();
    let first = create(&p, None).await;
    sh(&p, &first, "user", "echo left > /home/user/mark").await;
    p.kill(&first).await.unwrap();
    // The second create of one shape makes it wanted: spares of it boot in the background.
    let second = create(&p, None).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let spares = loop {
        let s = sandbox_dirs(d.path(), &[&second]);
        if s.len() >= 2 {
            break s;
        }
        assert!(Instant::now() < deadline, "no spares were booted: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let req = CreateRequest {
        network: Some(policy(&[], &[], Some(false))),
        envs: [("WHO".to_string(), "third".to_string())].into(),
        ..Default::default()
    };
    let third = p.create(req).await.unwrap().id;
    assert!(spares.contains(&third), "the create booted its own: {third} not one of {spares:?}");
    assert!(refused(&reach(&p, &third, &a, 7000).await), "a spare kept the open network");
    assert_eq!(reach(&p, &second, &a, 7000).await, format!("banner {a}"));
    let (code, out) = sh(&p, &third, "user", "echo \"who=$WHO\"; ls -A /home/user; ls /home/user/mark").await;
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("who=third") && !out.contains("left"), "{out}");
    // Another shape (more memory) never takes a spare of this one.
    let before = sandbox_dirs(d.path(), &[]);
    let other = p.create(CreateRequest { memory_mb: Some(700), ..Default::default() }).await.unwrap().id;
    assert!(!before.contains(&other), "a create of another shape took a spare");
    // Its cgroup (v1 here; named after the owner and the id) has the create's limit.
    let group = std::fs::read_dir("/sys/fs/cgroup/memory/scenario-run")
        .unwrap()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(&format!(".{other}")))
        .expect("the sandbox's memory cgroup");
    let limit = std::fs::read_to_string(group.path().join("memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), (700u64 << 20).to_string());
    p.destroy_all().await;
    let left = sandbox_dirs(d.path(), &[]);
    assert!(left.is_empty(), "spares outlived the provider: {left:?}");
}

#[tokio::test]
async fn an_update_replaces_the_policy_of_a_running_sandbox() {
    let net = TestNet::new(1);
    let a = net.host(0).to_string();
    let (p, _d) = provider();
    let id = create(&p, None).await;
    assert_eq!(reach(&p, &id, &a, 7000).await, format!("banner {a}"));
    p.update_network(&id, policy(&[], &[], Some(false))).await.unwrap();
    assert!(refused(&reach(&p, &id, &a, 7000).await));
    p.update_network(&id, policy(&[&format!("{a}/32")], &["0.0.0.0/0"], None)).await.unwrap();
    assert_eq!(reach(&p, &id, &a, 7000).await, format!("banner {a}"));
    p.update_network(&id, NetworkPolicy::default()).await.unwrap();
    assert_eq!(reach(&p, &id, &a, 7000).await, format!("banner {a}"));
    // A bad update changes nothing.
    let e = p.update_network(&id, policy(&[], &["example.com"], None)).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{e:?}");
    assert_eq!(reach(&p, &id, &a, 7000).await, format!("banner {a}"));
    p.kill(&id).await.unwrap();
}

/// A host address that appears after a sandbox's network was made (a VPN, a Docker bridge,
/// here a test network's gateway) is refused as soon as it exists.
#[tokio::test]
async fn an_address_the_host_gains_later_is_refused_too() {
    let (p, _d) = provider();
    let id = create(&p, None).await;
    let net = TestNet::new(1);
    let port = host_server();
    let gw = net.gateway().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = reach(&p, &id, &gw, port).await;
        if refused(&got) && got != "hello" {
            break;
        }
        assert!(Instant::now() < deadline, "the host's new address {gw} stayed reachable: {got}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // While the test host behind it is reachable.
    assert_eq!(reach(&p, &id, &net.host(0).to_string(), 7000).await, format!("banner {}", net.host(0)));
    p.kill(&id).await.unwrap();
}

#[tokio::test]
async fn root_inside_cannot_change_the_rules() {
    let net = TestNet::new(1);
    let a = net.host(0).to_string();
    let (p, _d) = provider();
    let id = create(&p, Some(policy(&[], &["0.0.0.0/0"], None))).await;
    for attack in [
        "nft flush ruleset",
        "nft delete table inet scenario_run",
        "ip route replace default via 10.0.2.2 dev eth0",
        "ip addr add 10.0.2.50/24 dev eth0",
        "ip link set eth0 down",
        "iptables -P OUTPUT ACCEPT",
    ] {
        for user in ["root", "user"] {
            let (code, out) = sh(&p, &id, user, &format!("sudo -n {attack} 2>&1 || {attack} 2>&1")).await;
            assert_ne!(code, Some(0), "`{attack}` as {user} succeeded: {out}");
        }
    }
    assert!(refused(&reach(&p, &id, &a, 7000).await));
    p.kill(&id).await.unwrap();
}

#[tokio::test]
async fn what_e2b_refuses_is_refused() {
    let (p, _d) = provider();
    for (bad, why) in [
        (policy(&[], &["example.com"], None), "allowOut only"),
        (policy(&["10.0.0.0/33"], &[], None), "prefix"),
        (policy(&["a b"], &[], None), "neither an address"),
        (policy(&["1.2.3.4:0"], &[], None), "port"),
    ] {
        let e = p.create(CreateRequest { network: Some(bad.clone()), ..Default::default() }).await.unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{bad:?}: {e:?}");
        assert!(e.message.contains(why), "{bad:?}: {}", e.message);
    }
    assert!(p.list(&Default::default()).await.unwrap().is_empty(), "a refused create left a sandbox");
}

/// A SIGKILLed runner leaves no user-space stack behind: each ends when the runner's end of
/// its exit pipe closes.
#[test]
fn a_sigkill_of_the_runner_leaves_no_stack_behind() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("hold.yaml");
    std::fs::write(&scenario, "name: hold\nsteps:\n  - create: { template: base }\n  - create: { template: base, as: b }\n  - exec: echo ready; sleep 600\n").unwrap();
    let mut child = common::cmd(&[scenario.to_str().unwrap(), "--no-progress", "--isolation", "namespaces"])
        .env("SCENARIO_RUN_STATE_DIR", dir.path().join("state"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stacks = |parent: u32| -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                status.lines().any(|l| l == format!("PPid:\t{parent}"))
                    && std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with(b"slirp4netns"))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mine = loop {
        let s = stacks(child.id());
        if s.len() >= 2 {
            break s;
        }
        assert!(Instant::now() < deadline, "the run never had two sandbox networks");
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while mine.iter().any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()) {
        // Reparented, they are reaped by whoever adopts them; a zombie counts as gone.
        let alive = mine
            .iter()
            .any(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")));
        if !alive {
            break;
        }
        assert!(Instant::now() < deadline, "slirp4netns outlived the SIGKILLed runner: {mine:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Domain entries, through the real binary: HTTP by its `Host`, TLS by its server name, E2B's
/// wildcards, and no spoofing (the proxy connects to the name as the host resolves it, not
/// where the sandbox's own `/etc/hosts` points it). The test names resolve on the host through
/// an `/etc/hosts` of the run's own: the binary runs in a mount namespace of its own where a
/// copy with the test hosts is bound over `/etc/hosts` (nothing of the host changes).
#[test]
fn names_decide_http_and_tls_and_cannot_be_spoofed() {
    let net = TestNet::new(2);
    let (a, b) = (net.host(0).to_string(), net.host(1).to_string());
    let dir = tempfile::tempdir().unwrap();
    let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
    hosts.push_str(&format!("\n{a} allowed.test\n{a} x.wild.test\n{a} wild.test\n{b} other.test\n"));
    std::fs::write(dir.path().join("hosts"), hosts).unwrap();
    let scenario = format!(
        r#"name: names
steps:
  - create: {{ template: base, network: {{ allow_out: ["allowed.test", "*.wild.test"], deny_out: ["0.0.0.0/0"] }} }}
  - exec: {{ cmd: "printf '%s\n' '{a} allowed.test' '{a} x.wild.test' '{a} wild.test' '{b} other.test' >> /etc/hosts", user: root }}
  - exec: curl -sS -m 10 http://allowed.test/
    name: HTTP by its Host
  - assert-stdout: {{ contains: "host {a} for allowed.test" }}
  - exec: curl -sS -k -m 10 https://allowed.test/
    name: TLS by its server name
  - assert-stdout: {{ contains: "host {a} for allowed.test" }}
  - exec: curl -sS -k -m 10 https://x.wild.test/
    name: a wildcard's subdomain
  - assert-stdout: {{ contains: "host {a} for x.wild.test" }}
  - exec: curl -sS -k -m 10 https://wild.test/ 2>&1; echo "rc=$?"
    name: not the wildcard's own name
  - assert-stdout: {{ not_contains: "host " }}
  - exec: curl -sS -m 10 http://other.test/ 2>&1; echo "rc=$?"
    name: another name
  - assert-stdout: {{ not_contains: "host " }}
  - exec: >-
      curl -sS -m 10 -H 'Host: allowed.test' http://{b}/ 2>&1; echo "rc=$?"
    name: an allowed Host sent to another address goes to the name's
  - assert-stdout: {{ contains: "host {a} for allowed.test" }}
  - exec: {{ cmd: "sed -i 's/^{a} allowed.test/{b} allowed.test/' /etc/hosts", user: root }}
  - exec: curl -sS -m 10 http://allowed.test/
    name: the sandbox's hosts file points the name elsewhere
  - assert-stdout: {{ contains: "host {a} for allowed.test" }}
  - exec: >-
      python3 -c "import socket; s = socket.create_connection(('{a}', 7000), 5); print(s.recv(64))" 2>&1; echo "rc=$?"
    name: other ports are decided by address only
  - assert-stdout: {{ not_contains: "banner" }}
  - exec: getent hosts pypi.org
    name: DNS answers while a name is allowed
  - assert-exit: 0
"#
    );
    let file = dir.path().join("names.yaml");
    std::fs::write(&file, scenario).unwrap();
    let script = format!("mount --bind '{}' /etc/hosts && exec \"$@\"", dir.path().join("hosts").display());
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(common::bin())
        .args([file.to_str().unwrap(), "--no-progress", "--isolation", "namespaces"])
        .env("NO_COLOR", "1")
        .env("SCENARIO_RUN_STATE_DIR", dir.path().join("state"))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

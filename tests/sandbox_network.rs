//! Egress policies of local sandboxes (`network.allowOut`/`denyOut`), against real network
//! namespaces, veth pairs and a real server on one of this host's addresses: a sandbox reaches
//! exactly what its allow list names, root inside cannot change that, and nothing stays on the
//! host. They need root and iproute2 (CI runs as root; `scripts/setup` installs iproute2).

mod common;

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::time::{Duration, Instant};

use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ErrorKind, ExecRequest, NetworkPolicy, Provider};

fn provider() -> (LocalProvider, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let opts =
        LocalOptions { state_dir: dir.path().to_path_buf(), isolation: Isolation::Namespaces, ..Default::default() };
    (LocalProvider::new(opts).expect("isolated sandboxes (needs root, bwrap)"), dir)
}

/// This host's first global IPv4 address (not loopback): what the sandboxes are to reach.
fn host_address() -> Ipv4Addr {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .expect("these tests need iproute2's `ip` on the host");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .skip_while(|w| *w != "inet")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("this host has no global IPv4 address to test egress with: {text}"))
}

/// A server on every host address that answers each connection with `hello`.
fn server() -> u16 {
    let l = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"hello");
        }
    });
    port
}

fn policy(allow: &[&str], deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// What a TCP connection from inside to `addr:port` gives: `hello`, or the error's name.
async fn reach(p: &LocalProvider, id: &str, addr: &str, port: u16) -> String {
    let py = format!(
        "import socket, errno\n\
         s = socket.socket(); s.settimeout(3)\n\
         try:\n    s.connect(('{addr}', {port})); print(s.recv(5).decode())\n\
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

/// The host end of the sandbox's veth pair (`sr-x-y` for its address `169.254.x.y`), from its
/// `eth0` inside; `None` if it has none.
async fn link_of(p: &LocalProvider, id: &str) -> Option<String> {
    let py = "import socket, fcntl, struct\n\
              s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
              try:\n    a = fcntl.ioctl(s.fileno(), 0x8915, struct.pack('256s', b'eth0'))[20:24]\n\
              except OSError:\n    print('none')\n\
              else:\n    print('sr-%d-%d' % (a[2], a[3]))\n";
    let req = ExecRequest { cmd: "python3 -".into(), stdin: Some(py.as_bytes().to_vec()), ..Default::default() };
    let r = p.exec(id, req, None).await.unwrap();
    let out = String::from_utf8_lossy(&r.stdout).trim().to_string();
    assert_eq!(r.exit_code, Some(0), "{out}{}", String::from_utf8_lossy(&r.stderr));
    let link = (out != "none").then_some(out)?;
    assert!(std::path::Path::new("/sys/class/net").join(&link).exists(), "no host end {link}");
    Some(link)
}

/// Waits until the link `name` is gone from the host (the kernel deletes a veth pair with
/// its namespace, which takes a moment after the last process).
fn gone(name: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if !std::path::Path::new("/sys/class/net").join(name).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// The gateway of the sandbox whose host link is `link` (`sr-x-y` → `169.254.x.(y-1)`): an
/// address of the host, which no allow list here names.
fn gateway(link: &str) -> String {
    let parts: Vec<u8> = link.trim_start_matches("sr-").split('-').map(|p| p.parse().unwrap()).collect();
    format!("169.254.{}.{}", parts[0], parts[1] - 1)
}

#[tokio::test]
async fn without_a_policy_a_sandbox_reaches_only_its_own_loopback() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let port = server();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    assert_eq!(link_of(&p, &sb.id).await, None, "no link is made without a policy");
    assert_eq!(reach(&p, &sb.id, &host, port).await, "ENETUNREACH");
    // The host's loopback is not the sandbox's: nothing listens on that port there.
    assert_eq!(reach(&p, &sb.id, "127.0.0.1", port).await, "ECONNREFUSED");
    // Root inside still binds low ports and its own loopback works (the namespace is the
    // host's, which would otherwise withhold both).
    let req = ExecRequest {
        cmd: "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1', 80)); s.listen(); \
              c=socket.create_connection(('127.0.0.1', 80)); print('bound')\""
            .into(),
        user: Some("root".into()),
        ..Default::default()
    };
    let r = p.exec(&sb.id, req, None).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "bound", "{}", String::from_utf8_lossy(&r.stderr));
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn an_allow_list_reaches_exactly_what_it_names_and_allow_beats_deny() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let port = server();

    // Allowed: the host address; denied all else (E2B's whitelist form).
    let req = CreateRequest { network: Some(policy(&[&host], &["0.0.0.0/0"])), ..Default::default() };
    let a = p.create(req).await.unwrap();
    let link = link_of(&p, &a.id).await.expect("a veth pair for the allow list");
    assert_eq!(reach(&p, &a.id, &host, port).await, "hello");
    // The gateway is an address of the host too, not named: unreachable, as is the rest.
    assert_eq!(reach(&p, &a.id, &gateway(&link), port).await, "ENETUNREACH");
    assert_eq!(reach(&p, &a.id, "10.255.255.1", port).await, "ENETUNREACH");

    // Allow beats deny: the same address in both lists is reachable.
    let req = CreateRequest { network: Some(policy(&[&format!("{host}/32")], &[&host])), ..Default::default() };
    let b = p.create(req).await.unwrap();
    assert_eq!(reach(&p, &b.id, &host, port).await, "hello");

    // A deny list alone, or an allow list naming other addresses, reaches nothing here.
    let req = CreateRequest { network: Some(policy(&[], &[&host])), ..Default::default() };
    let c = p.create(req).await.unwrap();
    assert_eq!(link_of(&p, &c.id).await, None, "a deny list alone needs no link");
    assert_eq!(reach(&p, &c.id, &host, port).await, "ENETUNREACH");
    let req = CreateRequest { network: Some(policy(&["10.255.255.0/24"], &[])), ..Default::default() };
    let d = p.create(req).await.unwrap();
    assert_eq!(reach(&p, &d.id, &host, port).await, "ENETUNREACH");

    let links = [link, link_of(&p, &b.id).await.unwrap(), link_of(&p, &d.id).await.unwrap()];
    for id in [&a.id, &b.id, &c.id, &d.id] {
        p.kill(id).await.unwrap();
    }
    for l in links {
        assert!(gone(&l), "{l} stays on the host after its sandbox was killed");
    }
}

#[tokio::test]
async fn what_cannot_be_enforced_is_refused() {
    let (p, _d) = provider();
    for (allow, deny, what) in [
        (&["example.com"][..], &[][..], "domain names"),
        (&["::1"][..], &[][..], "IPv6"),
        (&[][..], &["10.0.0.0/40"][..], "prefix"),
    ] {
        let req = CreateRequest { network: Some(policy(allow, deny)), ..Default::default() };
        let e = p.create(req).await.expect_err(what);
        assert!(e.message.contains(what), "{e}");
        assert!(matches!(e.kind, ErrorKind::Unsupported | ErrorKind::Invalid), "{e:?}");
    }
}

#[tokio::test]
async fn an_update_replaces_the_policy_of_a_running_sandbox() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let port = server();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    assert_eq!(reach(&p, &sb.id, &host, port).await, "ENETUNREACH");
    p.update_network(&sb.id, policy(&[&host], &[])).await.unwrap();
    assert_eq!(reach(&p, &sb.id, &host, port).await, "hello");
    let link = link_of(&p, &sb.id).await.expect("a veth pair after the update");
    // Replaced, not added to.
    p.update_network(&sb.id, policy(&["10.255.255.0/24"], &[])).await.unwrap();
    assert_eq!(reach(&p, &sb.id, &host, port).await, "ENETUNREACH");
    // Cleared: the pair goes at once.
    p.update_network(&sb.id, NetworkPolicy::default()).await.unwrap();
    assert!(gone(&link), "an empty policy leaves {link}");
    assert_eq!(link_of(&p, &sb.id).await, None);
    assert_eq!(reach(&p, &sb.id, &host, port).await, "ENETUNREACH");
    p.kill(&sb.id).await.unwrap();
}

/// Root inside a sandbox with an allow list tries to widen it: routes, links, addresses,
/// raw sockets, a namespace of its own, and the firewall tools if the image has them.
/// Everything must fail, and the sandbox must still reach exactly what it did.
#[tokio::test]
async fn root_inside_cannot_change_the_rules() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let port = server();
    let req = CreateRequest { network: Some(policy(&[&host], &[])), ..Default::default() };
    let sb = p.create(req).await.unwrap();
    let link = link_of(&p, &sb.id).await.expect("a veth pair");
    let gw = gateway(&link);
    let py = format!(
        r#"
import socket, struct, errno, os
def nl(kind, flags, payload):
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.bind((0, 0))
    s.send(struct.pack("=IHHII", 16 + len(payload), kind, flags | 1 | 4, 1, 0) + payload)
    d = s.recv(65536)
    if struct.unpack("=H", d[4:6])[0] == 2:
        code = -struct.unpack("=i", d[16:20])[0]
        return errno.errorcode.get(code, "ok") if code else "ok"
    return "ok"
idx = socket.if_nametoindex("eth0")
gw = socket.inet_aton("{gw}")
# a default route via the gateway (RTM_NEWROUTE, create|excl)
rt = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 4, 0, 1, 4)
rt += struct.pack("=HHI", 8, 4, idx) + struct.pack("=HH4s", 8, 5, gw)
print("route", nl(24, 0x600, rt))
# delete the allowed route (RTM_DELROUTE)
rt = struct.pack("=BBBBBBBBI", socket.AF_INET, 32, 0, 0, 254, 0, 0, 1, 0)
rt += struct.pack("=HH4s", 8, 1, socket.inet_aton("{host}"))
print("delroute", nl(25, 0, rt))
# the link down (RTM_NEWLINK)
print("link", nl(16, 0, struct.pack("=BBHiII", 0, 0, 0, idx, 0, 1)))
# another address (RTM_NEWADDR)
ad = struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, idx) + struct.pack("=HH4s", 8, 2, socket.inet_aton("{gw}"))
print("addr", nl(20, 0x400, ad))
try:
    socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP); print("raw ok")
except OSError as e:
    print("raw", errno.errorcode[e.errno])
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print("unshare", "ok" if libc.unshare(0x40000000) == 0 else errno.errorcode[ctypes.get_errno()])
"#
    );
    let req = ExecRequest {
        cmd: "python3 -".into(),
        stdin: Some(py.into_bytes()),
        user: Some("root".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let r = p.exec(&sb.id, req, None).await.unwrap();
    let out = String::from_utf8_lossy(&r.stdout).to_string();
    assert_eq!(r.exit_code, Some(0), "{out}{}", String::from_utf8_lossy(&r.stderr));
    for what in ["route", "delroute", "link", "addr", "raw", "unshare"] {
        assert!(out.lines().any(|l| l == format!("{what} EPERM")), "{what} was not refused:\n{out}");
    }
    // The tools, where the image has them.
    let tools = "for c in 'ip link set eth0 down' 'ip route add default via GW dev eth0 onlink' \
                 'iptables -F' 'iptables -P OUTPUT ACCEPT' 'nft flush ruleset'; do \
                   set -- $c; command -v $1 >/dev/null || continue; \
                   if ${c/GW/GWADDR} 2>/dev/null; then echo \"changed: $c\"; fi; done; echo done"
        .replace("GWADDR", &gw);
    let r = p
        .exec(&sb.id, ExecRequest { cmd: tools, user: Some("root".into()), ..Default::default() }, None)
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "done", "a tool changed the network");
    // Still exactly as allowed.
    assert_eq!(reach(&p, &sb.id, &host, port).await, "hello");
    assert_eq!(reach(&p, &sb.id, &gw, port).await, "ENETUNREACH");
    p.kill(&sb.id).await.unwrap();
    assert!(gone(&link));
}

/// The scenario `create` step's `network` field, on the local provider and through the E2B
/// client against `serve` (create's `network.allowOut` over the wire): the allowed address
/// answers, another does not.
#[test]
fn a_scenario_create_with_an_allow_list_on_local_and_over_serve() {
    let host = host_address().to_string();
    let port = server();
    let dir = tempfile::tempdir().unwrap();
    let probe = |addr: &str| {
        format!(
            "python3 -c \"import socket, errno\ntry:\n  print(socket.create_connection(('{addr}', {port}), 3).recv(5).decode())\nexcept OSError as e:\n  print(errno.errorcode[e.errno])\""
        )
    };
    let scenario = format!(
        "name: egress allow list\nsteps:\n  - create: {{ template: base, network: {{ allow_out: [\"{host}\"], deny_out: [0.0.0.0/0] }} }}\n  \
         - exec: {}\n  - assert-stdout: {{ equals: \"hello\\n\" }}\n  \
         - exec: {}\n  - assert-stdout: {{ equals: \"ENETUNREACH\\n\" }}\n",
        serde_json::to_string(&probe(&host)).unwrap(),
        serde_json::to_string(&probe("10.255.255.1")).unwrap(),
    );
    let file = dir.path().join("egress.yaml");
    std::fs::write(&file, scenario).unwrap();
    let file = file.to_str().unwrap();
    let state = tempfile::tempdir().unwrap();
    let out = common::cmd(&["--provider", "local", "--no-progress", file])
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "local: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "{text}");
    let srv = common::serve::serve();
    let out = common::serve::e2b_cmd(&srv, &[file]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "over serve: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "{text}");
}

/// A SIGKILLed scenario-run leaves no link on the host: the veth pair belongs to the sandbox's
/// network namespace, which goes with the sandbox (`--die-with-parent`).
#[test]
fn a_sigkill_of_scenario_run_leaves_no_link_behind() {
    let dir = tempfile::tempdir().unwrap();
    let name_file = dir.path().join("gateway");
    // The gateway of its first route (one per address of this host), as /proc/net/route shows
    // it (hex, little-endian).
    let scenario = format!(
        "name: killed\nsteps:\n  - create: {{ template: base, network: {{ allow_out: [0.0.0.0/0] }} }}\n  \
         - exec: \"awk 'NR==2 {{printf $3}}' /proc/net/route\"\n    id: route\n  \
         - host: \"echo {{{{ steps.route.stdout }}}} > {}\"\n  - exec: \"sleep 120\"\n",
        name_file.display()
    );
    let file = dir.path().join("killed.yaml");
    std::fs::write(&file, scenario).unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut child = common::cmd(&["--provider", "local", "--no-progress", file.to_str().unwrap()])
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let link = loop {
        let hex = std::fs::read_to_string(&name_file).unwrap_or_default().trim().to_string();
        if let Ok(gw) = u32::from_str_radix(&hex, 16) {
            let [_, _, x, y] = gw.to_le_bytes();
            break format!("sr-{x}-{}", y + 1);
        }
        assert!(Instant::now() < deadline, "the scenario never reported its link");
        assert!(child.try_wait().unwrap().is_none(), "scenario-run ended early");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(link.starts_with("sr-") && std::path::Path::new("/sys/class/net").join(&link).exists(), "{link}");
    // SAFETY: signalling the child we spawned, by its pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    assert!(gone(&link), "{link} stayed on the host after scenario-run was SIGKILLed");
}

/// A sandbox paused filesystem-only boots again with a new namespace on resume: it gets its
/// policy again (a new pair; the old one went with the old namespace).
#[tokio::test]
async fn a_resumed_sandbox_keeps_its_policy() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let port = server();
    let req = CreateRequest { network: Some(policy(&[&host], &[])), ..Default::default() };
    let sb = p.create(req).await.unwrap();
    let first = link_of(&p, &sb.id).await.expect("a veth pair");
    p.pause(&sb.id, false).await.unwrap();
    assert!(gone(&first), "the paused sandbox's pair stays: {first}");
    p.resume(&sb.id, 60).await.unwrap();
    assert!(link_of(&p, &sb.id).await.is_some(), "no pair after the resume");
    assert_eq!(reach(&p, &sb.id, &host, port).await, "hello");
    assert_eq!(reach(&p, &sb.id, "10.255.255.1", port).await, "ENETUNREACH");
    p.kill(&sb.id).await.unwrap();
}

/// The host's loopback services (serve, the local registry) stay out of reach even when the
/// list allows everything: inside, 127.0.0.0/8 is the sandbox's own, and a service bound to
/// the host's loopback does not answer on the host's other addresses.
#[tokio::test]
async fn the_hosts_loopback_stays_out_of_reach_even_with_everything_allowed() {
    let (p, _d) = provider();
    let host = host_address().to_string();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.write_all(b"hello");
        }
    });
    let req = CreateRequest { network: Some(policy(&["0.0.0.0/0"], &[])), ..Default::default() };
    let sb = p.create(req).await.unwrap();
    assert_eq!(reach(&p, &sb.id, "127.0.0.1", port).await, "ECONNREFUSED");
    assert_eq!(reach(&p, &sb.id, &host, port).await, "ECONNREFUSED");
    p.kill(&sb.id).await.unwrap();
}

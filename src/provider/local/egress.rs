//! Egress of an isolated sandbox: what addresses outside its own network namespace it reaches.
//!
//! Every isolated sandbox's network namespace is made by host root (in `sandbox`, before the
//! sandbox's user namespace is entered), so it belongs to the host's initial user namespace:
//! root inside a sandbox has no `CAP_NET_ADMIN` (nor `CAP_NET_RAW`) over it and cannot add,
//! remove or change links, addresses, routes or netfilter rules there, nor open raw sockets.
//! (seccomp also refuses `unshare`/`setns`, so it cannot make a namespace of its own either.)
//! Without a policy the namespace holds only `lo`: the sandbox reaches nothing else.
//!
//! An allow list attaches a veth pair: `eth0` in the sandbox with a `/32` link-local address
//! (`169.254.x.y`), its peer `sr-x-y` on the host with the gateway address `169.254.x.(y-1)`
//! and a host route back to the sandbox. The sandbox gets **one route per allowed range**,
//! `via` the gateway with `onlink` (so it has no route to the gateway address itself, which is
//! an address of the host): whatever has no route is unreachable (`connect` fails at once with
//! `ENETUNREACH`). The routes are the host's own IPv4 addresses inside the allowed ranges, one
//! `/32` each (not loopback, not link-local: those are other sandboxes' gateways), read when the
//! policy is applied: there is no address translation, so nothing but this machine's own
//! addresses could answer, and a route to anything else would only make a `connect` hang until
//! its timeout where the host drops what it does not forward. An allowed public address thus
//! fails at once, as an unreachable network does.
//!
//! E2B's precedence follows: an address is reachable iff an `allowOut` range contains it.
//! `denyOut` and `allowInternetAccess: false` take away only what internet access would give,
//! which a local sandbox never has; they are recorded and reported. The host's loopback
//! (`127.0.0.0/8`) is never reachable: there it is the sandbox's own. Domain names (E2B
//! matches them by SNI or Host in an egress proxy) and IPv6 ranges are refused with a reason.
//!
//! Nothing of it is host-wide: the pair lives in the sandbox's namespace, and the kernel
//! deletes both ends (and the host route with them) when the namespace's last process exits,
//! a SIGKILL of scenario-run included. The configuration is made with iproute2's `ip`.

use std::fmt;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;

/// One allowed IPv4 range (address with host bits cleared, prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Range {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// Parses one `allowOut`/`denyOut` entry: an IPv4 address or CIDR range. Host bits of a range
/// are cleared (`10.0.0.5/24` is `10.0.0.0/24`).
pub(crate) fn parse_range(entry: &str) -> Result<Range, String> {
    let e = entry.trim();
    let (addr, prefix) = match e.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (e, None),
    };
    if addr.contains(':') {
        return Err(format!("`{entry}`: IPv6 destinations are not supported (a local sandbox has IPv4 egress only)"));
    }
    let Ok(ip) = addr.parse::<Ipv4Addr>() else {
        return Err(format!(
            "`{entry}`: domain names are not supported by local sandboxes (E2B filters them in an egress proxy); give IPv4 addresses or CIDR ranges"
        ));
    };
    let prefix = match prefix {
        None => 32,
        Some(p) => match p.parse::<u8>() {
            Ok(n) if n <= 32 => n,
            _ => return Err(format!("`{entry}`: the prefix length must be 0 to 32")),
        },
    };
    Ok(Range { addr: Ipv4Addr::from(u32::from(ip) & mask(prefix)), prefix })
}

/// The network mask of a prefix length (0 to 32).
fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

/// Entries one list may have (each allowed range is a route).
const MAX_ENTRIES: usize = 1024;

/// A create's or update's network options as the local provider applies them.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Plan {
    /// Sorted, without duplicates.
    pub allow: Vec<Range>,
}

/// Checks `policy` and returns what to apply; `Err` names the first entry that cannot be.
pub(crate) fn plan(policy: &crate::provider::NetworkPolicy) -> Result<Plan, String> {
    for (name, list) in [("allowOut", &policy.allow_out), ("denyOut", &policy.deny_out)] {
        if list.len() > MAX_ENTRIES {
            return Err(format!("{name} has {} entries; at most {MAX_ENTRIES} are taken", list.len()));
        }
    }
    let mut allow = Vec::new();
    for e in &policy.allow_out {
        allow.push(parse_range(e).map_err(|m| format!("allowOut {m}"))?);
    }
    for e in &policy.deny_out {
        parse_range(e).map_err(|m| format!("denyOut {m}"))?;
    }
    allow.sort();
    allow.dedup();
    Ok(Plan { allow })
}

/// A [`plan`] error as the provider reports it: what a local sandbox cannot filter on (domain
/// names, IPv6) is unsupported, a malformed entry invalid.
pub(crate) fn plan_error(message: String) -> crate::provider::ProviderError {
    if message.contains("not supported") {
        crate::provider::ProviderError::unsupported(message)
    } else {
        crate::provider::ProviderError::invalid(message)
    }
}

/// The veth pair attached to one boot of a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    /// The host end's name, `sr-x-y`.
    pub host_if: String,
    pub gateway: Ipv4Addr,
    /// The routes the sandbox has now.
    pub routes: Vec<Range>,
}

/// Where `ip` is (service managers' PATHs often lack the sbin directories).
fn ip_binary() -> std::io::Result<&'static str> {
    ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .ok_or_else(|| {
            std::io::Error::other("network policies need iproute2's `ip` command (apt-get install iproute2)")
        })
}

/// Runs `ip -batch -` with `script`, in the network namespace of host pid `netns_of` if given
/// (else in ours). Returns the error text `ip` printed.
fn ip_batch(netns_of: Option<u32>, script: &str) -> std::io::Result<()> {
    use std::io::Write;
    let ns = match netns_of {
        Some(pid) => Some(std::fs::File::open(format!("/proc/{pid}/ns/net"))?),
        None => None,
    };
    let mut cmd = std::process::Command::new(ip_binary()?);
    cmd.args(["-batch", "-"])
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if let Some(ns) = &ns {
        let fd = ns.as_raw_fd();
        // SAFETY: `pre_exec` needs an async-signal-safe closure: one raw system call (setns)
        // on an integer, no allocation; `ns`, which owns the descriptor, outlives the spawn.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        Err(std::io::Error::other(if err.is_empty() { format!("ip failed ({})", out.status) } else { err }))
    }
}

/// A link-local pair (sandbox, gateway) and the host end's name. Third octets 170–250 keep
/// clear of `169.254.169.254` (cloud metadata) and of what DHCP-less hosts pick first.
fn pick_pair() -> (Ipv4Addr, Ipv4Addr, String) {
    let mut b = [0u8; 2];
    crate::random::fill_or_unique(&mut b);
    let x = 170 + (b[0] % 81);
    let y = 2 + 2 * (b[1] % 126) + 1; // odd, 3..=253; the gateway is y - 1
    (Ipv4Addr::new(169, 254, x, y), Ipv4Addr::new(169, 254, x, y - 1), format!("sr-{x}-{y}"))
}

/// Makes the sandbox whose pid 1 is `pid1` reach exactly `plan.allow`, attaching or detaching
/// its veth pair as needed. Blocking (it runs `ip`).
pub(crate) fn apply(pid1: u32, link: &mut Option<Link>, plan: &Plan) -> std::io::Result<()> {
    if plan.allow.is_empty() {
        if let Some(l) = link.take() {
            // Deleting one end deletes the pair, its addresses and routes.
            detach(l)?;
        }
        return Ok(());
    }
    if link.is_none() {
        *link = Some(attach(pid1)?);
    }
    let l = link.as_mut().expect("attached");
    let routes = host_routes(&plan.allow, &host_addresses()?);
    let mut script = String::new();
    for r in &l.routes {
        script.push_str(&format!("route del {r} dev eth0\n"));
    }
    for r in &routes {
        script.push_str(&format!("route add {r} via {} dev eth0 onlink\n", l.gateway));
    }
    l.routes.clear();
    ip_batch(Some(pid1), &script)?;
    l.routes = routes;
    Ok(())
}

impl Range {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.addr)
    }
}

/// The host's own IPv4 addresses (`ip -o -4 addr show`, in our network namespace).
fn host_addresses() -> std::io::Result<Vec<Ipv4Addr>> {
    let out = std::process::Command::new(ip_binary()?).args(["-o", "-4", "addr", "show"]).env_clear().output()?;
    if !out.status.success() {
        return Err(std::io::Error::other(format!("ip -4 addr show failed ({})", out.status)));
    }
    Ok(parse_addresses(&String::from_utf8_lossy(&out.stdout)))
}

/// The `inet A.B.C.D/N` addresses of `ip -o -4 addr show` output.
fn parse_addresses(text: &str) -> Vec<Ipv4Addr> {
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next()?.parse().ok()
        })
        .collect()
}

/// The `/32` routes a sandbox allowed `allow` gets: the host addresses inside those ranges,
/// but never loopback (inside it is the sandbox's own) or link-local (other sandboxes' ends).
fn host_routes(allow: &[Range], host: &[Ipv4Addr]) -> Vec<Range> {
    let mut routes: Vec<Range> = host
        .iter()
        .filter(|ip| !ip.is_loopback() && !ip.is_link_local() && allow.iter().any(|r| r.contains(**ip)))
        .map(|ip| Range { addr: *ip, prefix: 32 })
        .collect();
    routes.sort();
    routes.dedup();
    routes
}

/// Deletes the pair of a boot that ended (its namespace may outlive its processes for as long
/// as descriptors of it are open).
pub(crate) fn detach(link: Link) -> std::io::Result<()> {
    ip_batch(None, &format!("link del {}\n", link.host_if))
}

/// Creates the veth pair of `pid1`'s namespace (retrying another address pair when this host
/// has one in use already). The pair is made inside the sandbox's namespace with its peer sent
/// to ours (named by our own pid, whose main thread never leaves the host's namespace).
fn attach(pid1: u32) -> std::io::Result<Link> {
    let me = std::process::id();
    let mut last = None;
    for _ in 0..8 {
        let (sandbox_ip, gateway, host_if) = pick_pair();
        let inside = format!(
            "link add eth0 type veth peer name {host_if} netns {me}\n\
             addr add {sandbox_ip}/32 dev eth0\n\
             link set eth0 up\n"
        );
        if let Err(e) = ip_batch(Some(pid1), &inside) {
            // The name is taken on the host (another run's sandbox): try another. A pair made
            // before the failure goes with `eth0`.
            let _ = ip_batch(Some(pid1), "link del eth0\n");
            last = Some(e);
            continue;
        }
        let host = format!(
            "addr add {gateway}/32 dev {host_if}\n\
             link set {host_if} up\n\
             route add {sandbox_ip}/32 dev {host_if}\n"
        );
        if let Err(e) = ip_batch(None, &host) {
            // A route to that address exists already: try another pair.
            let _ = ip_batch(None, &format!("link del {host_if}\n"));
            last = Some(e);
            continue;
        }
        return Ok(Link { host_if, gateway, routes: Vec::new() });
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free link-local address pair")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_the_host_addresses_the_ranges_allow() {
        let text = "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever\n\
                    2: eth0    inet 10.0.3.7/24 brd 10.0.3.255 scope global eth0\n\
                    3: dummy0    inet 192.0.2.9/32 scope global dummy0\n\
                    9: sr-170-2    inet 169.254.170.1/32 scope link sr-170-2\n";
        let host = parse_addresses(text);
        assert_eq!(host.len(), 4);
        let r = |s: &str| parse_range(s).unwrap();
        let all = host_routes(&[r("0.0.0.0/0")], &host);
        assert_eq!(all, vec![r("10.0.3.7/32"), r("192.0.2.9/32")], "no loopback, no link-local");
        assert_eq!(host_routes(&[r("10.0.0.0/8")], &host), vec![r("10.0.3.7/32")]);
        // A public address is no address of this machine: no route, so connect fails at once.
        assert!(host_routes(&[r("1.1.1.1")], &host).is_empty());
    }

    #[test]
    fn ranges_parse_and_clear_host_bits() {
        assert_eq!(parse_range("10.0.0.5").unwrap().to_string(), "10.0.0.5/32");
        assert_eq!(parse_range("10.0.0.5/24").unwrap().to_string(), "10.0.0.0/24");
        assert_eq!(parse_range("0.0.0.0/0").unwrap().to_string(), "0.0.0.0/0");
        assert!(parse_range("10.0.0.0/33").unwrap_err().contains("prefix"));
        assert!(parse_range("example.com").unwrap_err().contains("domain names"));
        assert!(parse_range("::1").unwrap_err().contains("IPv6"));
        assert!(parse_range("10.0.0.0/x").is_err());
    }

    #[test]
    fn a_plan_dedups_and_checks_both_lists() {
        let p = crate::provider::NetworkPolicy {
            allow_out: vec!["10.0.0.5/24".into(), "10.0.0.0/24".into()],
            deny_out: vec!["0.0.0.0/0".into()],
            ..Default::default()
        };
        assert_eq!(plan(&p).unwrap().allow.len(), 1);
        let bad = crate::provider::NetworkPolicy { deny_out: vec!["example.com".into()], ..Default::default() };
        assert!(plan(&bad).unwrap_err().starts_with("denyOut"));
        let many = crate::provider::NetworkPolicy { allow_out: vec!["10.0.0.1".into(); 1025], ..Default::default() };
        assert!(plan(&many).unwrap_err().contains("at most 1024"));
    }

    #[test]
    fn pairs_stay_link_local_and_clear_of_metadata() {
        for _ in 0..200 {
            let (s, g, name) = pick_pair();
            assert!(s.is_link_local() && g.is_link_local());
            assert_ne!(s.octets()[2], 169);
            assert_eq!(u32::from(s) - 1, u32::from(g));
            assert!(name.len() <= 15, "{name}");
        }
    }
}

//! What a local sandbox may reach: E2B's egress policy, as the local provider enforces it.
//!
//! A sandbox reaches the internet unless its creator says otherwise, as on E2B and FC (see
//! `netns` for how: a network namespace of its own with a user-space TCP/IP stack as its way
//! out). What it may reach is decided here, with E2B's semantics:
//!
//! * `allowInternetAccess: false` is `denyOut: ["0.0.0.0/0"]`;
//! * `allowOut` and `denyOut` take IPv4 addresses and CIDR ranges, `allowOut` also domain
//!   names (`example.com`, `*.example.com` for any subdomain, `*` for any name), each with an
//!   optional port or port range (`8.8.8.8:53`, `10.0.0.0/8:1-1024`, `example.com:443`);
//! * an address is allowed if an `allowOut` entry matches it, else denied if a `denyOut`
//!   entry does, else allowed: **allow wins over deny**;
//! * domain names are matched only for TCP to ports 80 (the HTTP `Host` header) and 443 (the
//!   TLS server name), as E2B documents: such connections go through an egress proxy
//!   (`proxy`), which for a domain match connects to the name as the host resolves it, never
//!   to the address the sandbox resolved (so a sandbox cannot point an allowed name elsewhere
//!   through its `/etc/hosts`). Other ports and protocols are matched by address only;
//! * `dnsServers` (default `[8.8.8.8]`) are allowed, all traffic, while `allowOut` names a
//!   domain. The sandbox's own resolver stands in for E2B's default nameserver: DNS to it is
//!   allowed when E2B would let a query to 8.8.8.8 through (port 53 by the address rules, or
//!   8.8.8.8 among `dnsServers` while a domain is allowed).
//!
//! Whatever the policy, some destinations are never reachable, denied before any allow:
//! [`FIXED_DENY`], and every destination this host would deliver to itself ([`HostNet`]: the
//! `local` and `broadcast` routes of its routing tables, which hold every interface address
//! and any address it takes by a `local` route (AnyIP), every interface address again, and its
//! nameservers; `netns` reads them from the kernel and follows them). "Never the host" is
//! decided by how the host routes, not by a list of its interfaces. That keeps out this host's
//! own services and loopback, other sandboxes (reached only through host ports), the private,
//! carrier-grade NAT and link-local ranges E2B also always denies (cloud metadata at
//! 169.254.169.254 among them), multicast and reserved ranges. No IPv6 leaves a sandbox: its
//! stack has IPv4 only, and IPv6 entries of a policy are recorded but match nothing. The
//! sandbox's DNS address carries DNS only (`dns`).
//!
//! The rules live in the sandbox's network namespace, which belongs to the host's user
//! namespace: root inside a sandbox has no `CAP_NET_ADMIN` over it and cannot change them.

use std::fmt;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

/// Ranges no sandbox reaches, whatever its policy (E2B's always-denied ranges, and more).
pub(crate) const FIXED_DENY: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),      // "this network"
    (Ipv4Addr::new(10, 0, 0, 0), 8),     // private
    (Ipv4Addr::new(100, 64, 0, 0), 10),  // carrier-grade NAT
    (Ipv4Addr::new(127, 0, 0, 0), 8),    // loopback (inside: the sandbox's own, never routed)
    (Ipv4Addr::new(169, 254, 0, 0), 16), // link-local, cloud metadata
    (Ipv4Addr::new(172, 16, 0, 0), 12),  // private
    (Ipv4Addr::new(192, 0, 0, 0), 24),   // IETF protocol assignments
    (Ipv4Addr::new(192, 168, 0, 0), 16), // private
    (Ipv4Addr::new(198, 18, 0, 0), 15),  // benchmarking
    (Ipv4Addr::new(224, 0, 0, 0), 3),    // multicast, reserved, broadcast
];

/// A range this host delivers to itself (address with host bits cleared, prefix length).
pub(crate) type HostNet = (Ipv4Addr, u8);

/// E2B's default nameserver: DNS is allowed when a query to it would be.
const DEFAULT_NAMESERVER: Ipv4Addr = Ipv4Addr::new(8, 8, 8, 8);

/// Entries one list may have.
const MAX_ENTRIES: usize = 1024;

/// An IPv4 or IPv6 range (address with host bits cleared, prefix length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Net {
    V4(Ipv4Addr, u8),
    V6(std::net::Ipv6Addr, u8),
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self, ip) {
            (Net::V4(a, p), IpAddr::V4(ip)) => u32::from(ip) & mask4(*p) == u32::from(*a),
            (Net::V6(a, p), IpAddr::V6(ip)) => u128::from(ip) & mask6(*p) == u128::from(*a),
            _ => false,
        }
    }
}

impl fmt::Display for Net {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Net::V4(a, p) => write!(f, "{a}/{p}"),
            Net::V6(a, p) => write!(f, "{a}/{p}"),
        }
    }
}

fn mask4(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix))
    }
}

fn mask6(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    }
}

/// What one entry names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Net(Net),
    /// A lowercase name, `*.suffix`, or `*`.
    Domain(String),
}

/// One `allowOut`/`denyOut` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub target: Target,
    /// Inclusive; None: every port.
    pub ports: Option<(u16, u16)>,
}

impl Rule {
    fn port_matches(&self, port: u16) -> bool {
        self.ports.is_none_or(|(lo, hi)| (lo..=hi).contains(&port))
    }

    /// Whether the rule matches a connection to `ip:port`, and (if `host` is known, from the
    /// HTTP Host header or the TLS server name) by that name.
    fn matches(&self, host: Option<&str>, ip: IpAddr, port: u16) -> bool {
        self.port_matches(port)
            && match &self.target {
                Target::Net(n) => n.contains(ip),
                Target::Domain(pattern) => host.is_some_and(|h| domain_matches(pattern, h)),
            }
    }
}

/// E2B's domain patterns: the name itself (any case), `*` (any name), `*.example.com` (any
/// name ending in `.example.com`, not `example.com` itself).
pub(crate) fn domain_matches(pattern: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host.is_empty() {
        return false;
    }
    match pattern.strip_prefix('*') {
        Some("") => true,
        Some(suffix) if suffix.starts_with('.') => host.ends_with(suffix),
        _ => host == pattern,
    }
}

/// Why an entry of `allowOut` or `denyOut` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RuleError {
    #[error("an empty entry")]
    Empty,
    #[error("`{0}`: missing `]`")]
    MissingBracket(String),
    #[error("`{0}`: expected `:` after `]`")]
    NoColonAfterBracket(String),
    #[error("`{entry}`: {problem}")]
    Ports { entry: String, problem: PortsError },
    #[error("`{entry}`: the prefix length must be 0 to {max}")]
    Prefix { entry: String, max: u8 },
    #[error("`{0}`: not an address range")]
    NotARange(String),
    #[error("`{0}`: neither an address, a range nor a domain name")]
    NotAName(String),
}

/// Why the ports of an entry are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PortsError {
    #[error("`{0}` is not a port (1 to 65535)")]
    NotAPort(String),
    #[error("the port range {0}-{1} ends before it starts")]
    Backwards(u16, u16),
}

/// Why a create's or an update's network options are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyError {
    #[error("{list} has {count} entries; at most {MAX_ENTRIES} are taken")]
    TooMany { list: &'static str, count: usize },
    #[error("{list} {rule}")]
    Rule { list: &'static str, rule: RuleError },
    #[error(
        "denyOut `{0}`: domain names are taken in allowOut only (as on E2B): deny everything with `0.0.0.0/0` and allow the names"
    )]
    DeniedName(String),
    #[error("dnsServers `{0}`: not an IPv4 address")]
    Nameserver(String),
}

impl From<PolicyError> for crate::provider::ProviderError {
    fn from(e: PolicyError) -> Self {
        crate::provider::ProviderError::invalid(e.to_string())
    }
}

/// Parses one entry (see the module documentation). IPv4 host bits are cleared
/// (`10.0.0.5/24` is `10.0.0.0/24`).
pub(crate) fn parse_rule(entry: &str) -> Result<Rule, RuleError> {
    let e = entry.trim();
    if e.is_empty() {
        return Err(RuleError::Empty);
    }
    // `[v6]:port`, `v6` (more than one colon: no port), `host:port`, `host:` (every port).
    let (host, ports) = if let Some(rest) = e.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| RuleError::MissingBracket(entry.into()))?;
        match after {
            "" => (h, None),
            a => (h, Some(a.strip_prefix(':').ok_or_else(|| RuleError::NoColonAfterBracket(entry.into()))?)),
        }
    } else if e.matches(':').count() > 1 {
        (e, None)
    } else {
        match e.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (e, None),
        }
    };
    let ports = match ports {
        None | Some("") => None,
        Some(p) => Some(parse_ports(p).map_err(|problem| RuleError::Ports { entry: entry.into(), problem })?),
    };
    let (addr, prefix) = match host.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (host, None),
    };
    let target = if let Ok(ip) = addr.parse::<IpAddr>() {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => return Err(RuleError::Prefix { entry: entry.into(), max }),
            },
        };
        Target::Net(match ip {
            IpAddr::V4(a) => Net::V4(Ipv4Addr::from(u32::from(a) & mask4(prefix)), prefix),
            IpAddr::V6(a) => Net::V6(std::net::Ipv6Addr::from(u128::from(a) & mask6(prefix)), prefix),
        })
    } else if prefix.is_some() {
        return Err(RuleError::NotARange(entry.into()));
    } else {
        Target::Domain(parse_domain(host).ok_or_else(|| RuleError::NotAName(entry.into()))?)
    };
    Ok(Rule { target, ports })
}

fn parse_ports(p: &str) -> Result<(u16, u16), PortsError> {
    let port = |s: &str| match s.trim().parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(PortsError::NotAPort(s.into())),
    };
    match p.split_once('-') {
        Some((a, b)) => {
            let (a, b) = (port(a)?, port(b)?);
            if a > b {
                return Err(PortsError::Backwards(a, b));
            }
            Ok((a, b))
        }
        None => {
            let n = port(p)?;
            Ok((n, n))
        }
    }
}

/// A domain pattern: `*`, `*.name` or a name, made of labels of letters, digits, `-` and `_`;
/// `None` if `d` is none of these.
fn parse_domain(d: &str) -> Option<String> {
    let d = d.trim_end_matches('.').to_ascii_lowercase();
    if d == "*" {
        return Some(d);
    }
    let name = d.strip_prefix("*.").unwrap_or(&d);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    ok.then_some(d)
}

/// How a connection is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Allowed by a domain entry: connect to the name, as the host resolves it.
    AllowName,
    /// Allowed: connect to the address.
    Allow,
    Deny,
}

/// A sandbox's egress policy as the local provider enforces it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Policy {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// The nameservers allowed while a domain is (E2B's `dnsServers`).
    pub dns: Vec<Ipv4Addr>,
}

impl Default for Policy {
    fn default() -> Self {
        Self { allow: Vec::new(), deny: Vec::new(), dns: vec![DEFAULT_NAMESERVER] }
    }
}

impl Policy {
    /// Checks `p` (a create's or an update's options) and returns what to enforce; `Err`
    /// names the first entry that cannot be.
    pub(crate) fn from_request(p: &crate::provider::NetworkPolicy) -> Result<Self, PolicyError> {
        for (list, entries) in [("allowOut", &p.allow_out), ("denyOut", &p.deny_out)] {
            if entries.len() > MAX_ENTRIES {
                return Err(PolicyError::TooMany { list, count: entries.len() });
            }
        }
        let mut policy = Self::default();
        for e in &p.allow_out {
            policy.allow.push(parse_rule(e).map_err(|rule| PolicyError::Rule { list: "allowOut", rule })?);
        }
        for e in &p.deny_out {
            let rule = parse_rule(e).map_err(|rule| PolicyError::Rule { list: "denyOut", rule })?;
            if matches!(rule.target, Target::Domain(_)) {
                return Err(PolicyError::DeniedName(e.clone()));
            }
            policy.deny.push(rule);
        }
        if p.allow_internet_access == Some(false) {
            policy.deny.push(Rule { target: Target::Net(Net::V4(Ipv4Addr::UNSPECIFIED, 0)), ports: None });
        }
        if let Some(list) = &p.dns_servers {
            policy.dns = list
                .iter()
                .map(|e| e.trim().parse::<Ipv4Addr>().map_err(|_| PolicyError::Nameserver(e.clone())))
                .collect::<Result<_, _>>()?;
        }
        // While a domain is allowed, so are the nameservers (all traffic, as on E2B).
        if policy.has_domains() {
            let servers = policy.dns.iter().map(|a| Rule { target: Target::Net(Net::V4(*a, 32)), ports: None });
            policy.allow.extend(servers.collect::<Vec<_>>());
        }
        Ok(policy)
    }

    /// Nothing to enforce beyond [`FIXED_DENY`] and the host's addresses.
    pub(crate) fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }

    pub(crate) fn has_domains(&self) -> bool {
        self.allow.iter().any(|r| matches!(r.target, Target::Domain(_)))
    }

    /// E2B's decision for a connection to `ip:port` (named `host` where the proxy read one):
    /// the first allow entry that matches allows (by name if it is a domain entry), else a
    /// matching deny entry denies, else it is allowed. [`FIXED_DENY`] is not consulted here.
    pub(crate) fn decide(&self, host: Option<&str>, ip: IpAddr, port: u16) -> Verdict {
        if let Some(r) = self.allow.iter().find(|r| r.matches(host, ip, port)) {
            return if matches!(r.target, Target::Domain(_)) { Verdict::AllowName } else { Verdict::Allow };
        }
        if self.deny.iter().any(|r| r.matches(None, ip, port)) {
            Verdict::Deny
        } else {
            Verdict::Allow
        }
    }

    /// Whether the sandbox's resolver answers it (see the module documentation).
    pub(crate) fn dns_allowed(&self) -> bool {
        self.decide(None, IpAddr::V4(DEFAULT_NAMESERVER), 53) != Verdict::Deny
    }

    /// The `nft` statements of chain `user_rules`: each IPv4 address rule in order, allow entries
    /// first (accept), then deny entries (reject). Domain entries are the proxy's.
    fn policy_rules(&self, out: &mut String) {
        for (rules, verdict) in [(&self.allow, "accept"), (&self.deny, "reject with icmp type admin-prohibited")] {
            for r in rules {
                let Target::Net(Net::V4(a, p)) = r.target else { continue };
                let ports = match r.ports {
                    None => String::new(),
                    Some((lo, hi)) if lo == hi => format!(" meta l4proto {{ tcp, udp }} th dport {lo}"),
                    Some((lo, hi)) => format!(" meta l4proto {{ tcp, udp }} th dport {lo}-{hi}"),
                };
                let _ = writeln!(out, "add rule inet scenario_run user_rules ip daddr {a}/{p}{ports} {verdict}");
            }
        }
    }

    /// The whole ruleset of a sandbox's network namespace for this policy, as one `nft -f`
    /// transaction that replaces what was there (so an update is atomic).
    ///
    /// * chain `filter_out` (filter): loopback and the resolver first, then packets of
    ///   connections already allowed (as E2B: an update decides new connections), then all
    ///   IPv6 and [`FIXED_DENY`] and `host` (this host's addresses) refused at once, then
    ///   `user_rules`;
    /// * chain `to_proxy` (nat, only with domain entries): TCP to ports 80 and 443 that no
    ///   address rule decides goes to the proxy listening on `127.0.0.1:proxy_port`;
    /// * chain `to_dns` (nat, while DNS is allowed): UDP and TCP to `dns` port 53 go to the
    ///   resolver that passes on DNS only (`dns`), on `127.0.0.1:dns_ports`.
    pub(crate) fn nft_script(
        &self,
        host: &[HostNet],
        dns: Ipv4Addr,
        dns_ports: super::dns::Ports,
        proxy_port: Option<u16>,
    ) -> String {
        let mut s = String::new();
        // Declaring the table first makes the delete valid on a fresh namespace too.
        s.push_str("add table inet scenario_run\ndelete table inet scenario_run\n");
        s.push_str("add table inet scenario_run\n");
        let mut deny: Vec<String> = FIXED_DENY.iter().map(|(a, p)| format!("{a}/{p}")).collect();
        deny.extend(host.iter().map(|(a, p)| format!("{a}/{p}")));
        let _ = writeln!(
            s,
            "add set inet scenario_run fixed_deny {{ type ipv4_addr; flags interval; auto-merge; elements = {{ {} }}; }}",
            deny.join(", ")
        );
        s.push_str("add chain inet scenario_run filter_out { type filter hook output priority 0; policy accept; }\n");
        s.push_str("add chain inet scenario_run user_rules\n");
        s.push_str("add rule inet scenario_run filter_out oifname \"lo\" accept\n");
        // What the proxy redirect sent to 127.0.0.1 still has the interface it was routed to
        // first (the hook's), so loopback is also told by its address: 127/8 only ever reaches
        // the sandbox's own `lo`.
        s.push_str("add rule inet scenario_run filter_out ip daddr 127.0.0.0/8 accept\n");
        let dns_verdict = if self.dns_allowed() { "accept" } else { "reject with icmp type admin-prohibited" };
        let _ = writeln!(s, "add rule inet scenario_run filter_out ip daddr {dns} udp dport 53 {dns_verdict}");
        let _ = writeln!(s, "add rule inet scenario_run filter_out ip daddr {dns} tcp dport 53 {dns_verdict}");
        s.push_str("add rule inet scenario_run filter_out ct state established,related accept\n");
        s.push_str("add rule inet scenario_run filter_out meta nfproto ipv6 reject with icmpx type admin-prohibited\n");
        s.push_str(
            "add rule inet scenario_run filter_out ip daddr @fixed_deny reject with icmp type admin-prohibited\n",
        );
        s.push_str("add rule inet scenario_run filter_out jump user_rules\n");
        self.policy_rules(&mut s);
        if self.dns_allowed() {
            s.push_str("add chain inet scenario_run to_dns { type nat hook output priority -100; policy accept; }\n");
            let (u, t) = (dns_ports.udp, dns_ports.tcp);
            let _ = writeln!(s, "add rule inet scenario_run to_dns ip daddr {dns} udp dport 53 redirect to :{u}");
            let _ = writeln!(s, "add rule inet scenario_run to_dns ip daddr {dns} tcp dport 53 redirect to :{t}");
        }
        if let (Some(port), true) = (proxy_port, self.has_domains()) {
            s.push_str("add chain inet scenario_run to_proxy { type nat hook output priority -100; policy accept; }\n");
            s.push_str("add rule inet scenario_run to_proxy ip daddr @fixed_deny return\n");
            // An address entry for the port decides by itself: no need to read the name.
            for r in &self.allow {
                let Target::Net(Net::V4(a, p)) = r.target else { continue };
                let ports = match r.ports {
                    None => String::new(),
                    Some((lo, hi)) => format!(" tcp dport {lo}-{hi}"),
                };
                let _ = writeln!(s, "add rule inet scenario_run to_proxy ip daddr {a}/{p}{ports} return");
            }
            let _ = writeln!(s, "add rule inet scenario_run to_proxy tcp dport {{ 80, 443 }} redirect to :{port}");
        }
        s
    }
}

/// Whether `ip` is in [`FIXED_DENY`], in `host` (what this host delivers to itself), or IPv6
/// (which no sandbox reaches).
pub(crate) fn always_denied(ip: IpAddr, host: &[HostNet]) -> bool {
    match ip {
        IpAddr::V4(v4) => FIXED_DENY.iter().chain(host).any(|(a, p)| Net::V4(*a, *p).contains(ip)) || v4.is_broadcast(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => always_denied(IpAddr::V4(v4), host),
            None => true,
        },
    }
}

/// A policy error as the provider reports it: what E2B refuses is an invalid request.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::NetworkPolicy;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str], internet: Option<bool>) -> Policy {
        Policy::from_request(&NetworkPolicy {
            allow_internet_access: internet,
            allow_out: allow.iter().map(|s| s.to_string()).collect(),
            deny_out: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn entries_parse_as_e2b_writes_them() {
        let r = |s: &str| parse_rule(s).unwrap();
        assert_eq!(r("10.0.0.5/24").target, Target::Net(Net::V4(Ipv4Addr::new(10, 0, 0, 0), 24)));
        assert_eq!(r("8.8.8.8").target, Target::Net(Net::V4(Ipv4Addr::new(8, 8, 8, 8), 32)));
        assert_eq!(r("8.8.8.8:53").ports, Some((53, 53)));
        assert_eq!(r("8.8.8.0/24:1-1024").ports, Some((1, 1024)));
        assert_eq!(r("8.8.8.8:").ports, None);
        assert_eq!(r("Example.COM").target, Target::Domain("example.com".into()));
        assert_eq!(r("example.com:443").ports, Some((443, 443)));
        assert_eq!(r("*.example.com").target, Target::Domain("*.example.com".into()));
        assert_eq!(r("*").target, Target::Domain("*".into()));
        assert!(matches!(r("::1").target, Target::Net(Net::V6(_, 128))));
        assert_eq!(r("[2001:db8::]:443").ports, Some((443, 443)));
        for bad in [
            "",
            "10.0.0.0/33",
            "10.0.0.0/x",
            "a b",
            "example.com:0",
            "x.com:70000",
            "a.com:9-3",
            "-a.com",
            "*.*",
            "a.*.com",
            "[::1",
        ] {
            assert!(parse_rule(bad).is_err(), "{bad:?} parsed");
        }
        // The kinds a caller can tell apart, and the text each says.
        let backwards = RuleError::Ports { entry: "a.com:9-3".into(), problem: PortsError::Backwards(9, 3) };
        assert_eq!(parse_rule("a.com:9-3"), Err(backwards));
        assert_eq!(parse_rule("10.0.0.0/33"), Err(RuleError::Prefix { entry: "10.0.0.0/33".into(), max: 32 }));
        assert_eq!(parse_rule("[::1"), Err(RuleError::MissingBracket("[::1".into())));
        assert_eq!(parse_rule("a b").unwrap_err().to_string(), "`a b`: neither an address, a range nor a domain name");
        assert_eq!(
            parse_rule("x.com:70000").unwrap_err().to_string(),
            "`x.com:70000`: `70000` is not a port (1 to 65535)"
        );
    }

    #[test]
    fn wildcards_match_as_e2b_matches_them() {
        assert!(domain_matches("example.com", "EXAMPLE.com"));
        assert!(domain_matches("example.com", "example.com."));
        assert!(!domain_matches("example.com", "www.example.com"));
        assert!(domain_matches("*.example.com", "www.example.com"));
        assert!(domain_matches("*.example.com", "a.b.example.com"));
        assert!(!domain_matches("*.example.com", "example.com"));
        assert!(!domain_matches("*.example.com", "badexample.com"));
        assert!(domain_matches("*", "anything.test"));
        assert!(!domain_matches("*", ""));
    }

    #[test]
    fn allow_wins_over_deny_and_the_default_is_allow() {
        let p = policy(&["1.1.1.1", "203.0.113.0/24:443"], &["0.0.0.0/0"], None);
        assert_eq!(p.decide(None, ip("1.1.1.1"), 80), Verdict::Allow);
        assert_eq!(p.decide(None, ip("203.0.113.9"), 443), Verdict::Allow);
        assert_eq!(p.decide(None, ip("203.0.113.9"), 80), Verdict::Deny);
        assert_eq!(p.decide(None, ip("9.9.9.9"), 80), Verdict::Deny);
        let open = policy(&[], &["8.8.8.8"], None);
        assert_eq!(open.decide(None, ip("8.8.8.8"), 53), Verdict::Deny);
        assert_eq!(open.decide(None, ip("9.9.9.9"), 53), Verdict::Allow);
        assert!(Policy::default().is_open());
    }

    #[test]
    fn names_allow_only_by_name_and_are_refused_in_deny_lists() {
        let p = policy(&["*.allowed.test", "exact.test:443"], &["0.0.0.0/0"], None);
        assert_eq!(p.decide(Some("a.allowed.test"), ip("198.51.100.10"), 443), Verdict::AllowName);
        assert_eq!(p.decide(Some("exact.test"), ip("198.51.100.10"), 443), Verdict::AllowName);
        assert_eq!(p.decide(Some("exact.test"), ip("198.51.100.10"), 80), Verdict::Deny);
        assert_eq!(p.decide(Some("other.test"), ip("198.51.100.10"), 443), Verdict::Deny);
        assert_eq!(p.decide(None, ip("198.51.100.10"), 443), Verdict::Deny);
        let e = Policy::from_request(&NetworkPolicy { deny_out: vec!["example.com".into()], ..Default::default() });
        let e = e.unwrap_err();
        assert_eq!(e, PolicyError::DeniedName("example.com".into()));
        assert!(e.to_string().contains("allowOut only"), "{e}");
    }

    #[test]
    fn internet_access_false_denies_everything_and_dns_follows_e2b() {
        let p = policy(&[], &[], Some(false));
        assert_eq!(p.decide(None, ip("203.0.113.80"), 443), Verdict::Deny);
        assert!(!p.dns_allowed(), "no names, 8.8.8.8 denied");
        assert!(policy(&["allowed.test"], &["0.0.0.0/0"], None).dns_allowed(), "a name in allowOut keeps DNS");
        let none = Policy::from_request(&NetworkPolicy {
            allow_out: vec!["allowed.test".into()],
            deny_out: vec!["0.0.0.0/0".into()],
            dns_servers: Some(vec![]),
            ..Default::default()
        })
        .unwrap();
        assert!(!none.dns_allowed(), "dnsServers: [] allows no nameserver");
        let other = Policy::from_request(&NetworkPolicy {
            allow_out: vec!["allowed.test".into()],
            deny_out: vec!["0.0.0.0/0".into()],
            dns_servers: Some(vec!["1.1.1.1".into()]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(other.decide(None, ip("1.1.1.1"), 853), Verdict::Allow, "a named nameserver, all traffic");
        assert!(!other.dns_allowed());
        assert!(policy(&["8.8.8.8:53"], &["0.0.0.0/0"], None).dns_allowed());
        assert!(Policy::default().dns_allowed());
    }

    #[test]
    fn fixed_deny_holds_the_host_and_private_ranges() {
        let host = [(Ipv4Addr::new(192, 0, 2, 2), 32), (Ipv4Addr::new(198, 51, 100, 0), 30)];
        for a in [
            "198.51.100.3",
            "127.0.0.1",
            "10.0.2.2",
            "169.254.169.254",
            "172.17.0.1",
            "192.168.1.1",
            "192.0.2.2",
            "0.0.0.0",
            "255.255.255.255",
            "::1",
            "::ffff:127.0.0.1",
            "2001:db8::1",
        ] {
            assert!(always_denied(ip(a), &host), "{a}");
        }
        for a in ["203.0.113.80", "198.51.100.10", "198.51.100.4", "8.8.8.8", "192.0.2.9"] {
            assert!(!always_denied(ip(a), &host), "{a}");
        }
    }

    #[test]
    fn the_ruleset_replaces_itself_and_redirects_only_with_names() {
        let host = [(Ipv4Addr::new(192, 0, 2, 2), 32), (Ipv4Addr::new(198, 51, 100, 0), 30)];
        let dns = Ipv4Addr::new(10, 0, 2, 3);
        let ports = super::super::dns::Ports { udp: 5301, tcp: 5302 };
        let open = Policy::default().nft_script(&host, dns, ports, Some(4000));
        assert!(open.contains("192.0.2.2/32") && open.contains("198.51.100.0/30"), "{open}");
        assert!(open.contains("to_dns ip daddr 10.0.2.3 udp dport 53 redirect to :5301"), "{open}");
        assert!(open.contains("to_dns ip daddr 10.0.2.3 tcp dport 53 redirect to :5302"), "{open}");
        assert!(open.contains("delete table inet scenario_run"));
        assert!(!open.contains("to_proxy"), "{open}");
        assert!(open.contains("ip daddr 10.0.2.3 udp dport 53 accept"));
        let named = policy(&["allowed.test", "198.51.100.20:443"], &["0.0.0.0/0"], None).nft_script(
            &host,
            dns,
            ports,
            Some(4000),
        );
        assert!(named.contains("redirect to :4000"), "{named}");
        assert!(named.contains("to_proxy ip daddr 198.51.100.20/32 tcp dport 443-443 return"), "{named}");
        assert!(named.contains("user_rules ip daddr 0.0.0.0/0 reject"), "{named}");
        let closed = policy(&[], &[], Some(false)).nft_script(&host, dns, ports, None);
        assert!(closed.contains("udp dport 53 reject"), "{closed}");
        assert!(!closed.contains("to_dns"), "no DNS, nothing to pass it on: {closed}");
    }
}

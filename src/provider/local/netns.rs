//! A local sandbox's network: a network namespace of its own, with a user-space TCP/IP stack
//! as its way out, and the rules of its egress policy (`egress`).
//!
//! **The namespace** is made by host root (a thread of ours unshares it), so it belongs to the
//! host's user namespace: root inside a sandbox has no `CAP_NET_ADMIN` over it and can change
//! neither its links and routes nor its netfilter rules. It holds `lo` and `eth0`, the
//! sandbox's `10.0.2.100/24` with its gateway at `10.0.2.2` and its resolver at `10.0.2.3`.
//!
//! **The stack** is slirp4netns (Debian's `slirp4netns`): it owns `eth0`'s tap device and turns
//! the sandbox's packets into sockets of its own on the host, so the sandbox's traffic leaves
//! through the host's sockets and goes wherever the host's own traffic goes (a proxy, a VPN).
//! Its own DNS forwarding is off (`--disable-dns`): DNS to `10.0.2.3` goes to a resolver of
//! ours that passes on well-formed queries only (`dns`). Nothing host-wide changes: no
//! bridge, no NAT rule, no route. Why slirp4netns and not pasta (passt), which Debian also
//! ships and rootless Podman also uses: on a namespace owned by host root, Debian 12's pasta
//! has to run as root and keeps `CAP_SYS_ADMIN` in the host's user namespace for as long as it
//! lives (measured: `CapEff 0x200400`), while slirp4netns, the one process here that parses
//! what a sandbox sends, drops to `CAP_NET_BIND_SERVICE` alone once it is set up, inside its
//! own mount namespace with a seccomp filter (`--enable-sandbox --enable-seccomp`). It also
//! says when it is ready (`--ready-fd`, 7 ms here against pasta's 18 ms to daemonize), and
//! ends when we close a pipe (`--exit-fd`), a SIGKILL of scenario-run included. It is started
//! with `--disable-host-loopback`, so the gateway is not the host's loopback.
//!
//! **The rules** (`egress::Policy::nft_script`, loaded with `nft` inside the namespace) refuse
//! what this host delivers to itself ([`host_nets`]: every `local` and `broadcast` route of its
//! routing tables, read over netlink, so an address it takes by a `local` route is refused as
//! its interface addresses are; every interface address; its nameservers), its loopback and
//! the ranges no sandbox reaches, then apply the policy; names are the egress proxy's
//! (`proxy`). What the host delivers to itself changes (a VPN comes up, Docker makes a bridge,
//! a test makes a veth or a `local` route): a thread follows the kernel's address and route
//! events (netlink, `RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE`) and reads it all again every
//! [`REFRESH`] besides (the nameservers change with no event), every taken network reads it
//! again before its sandbox uses it, and every live network reloads its rules when it changes,
//! within milliseconds.
//!
//! Making one costs tens of milliseconds (a thread, slirp4netns, nft), so a [`Pool`] keeps a
//! few ready with the open policy, refilled in the background: a create takes one and only
//! loads rules when its policy is not the open one.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::dns;
use super::egress::{HostNet, Policy};
use super::fds;
use super::pool;
use super::proxy::{self, Proxy};
use super::sys;

/// The sandbox's resolver (slirp4netns's default; the sandbox is 10.0.2.100, its gateway
/// 10.0.2.2).
pub(crate) const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);

/// How long slirp4netns may take to say it is ready, and nft to load rules.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the host's routes, addresses and nameservers are read even with no event.
const REFRESH: Duration = Duration::from_secs(30);
/// What of a helper's stderr an error quotes.
const STDERR_LIMIT: u64 = 8 * 1024;

/// One sandbox's (or build's) network: its namespace, the stack attached to it, the rules in
/// force and the proxy that decides names. Dropping it ends the stack and the proxy; the
/// namespace goes with the last process (or descriptor) in it.
#[derive(Debug)]
pub(crate) struct Net {
    ns: OwnedFd,
    /// slirp4netns (killed on drop), and the pipe whose closing makes it exit.
    _stack: tokio::process::Child,
    _exit: OwnedFd,
    state: tokio::sync::Mutex<State>,
    /// Cancels every proxied connection, the resolver, and the task that follows the host's
    /// addresses, when the network goes.
    conns: tokio_util::sync::CancellationToken,
    /// Where the rules send DNS (`dns`).
    dns: dns::Ports,
    /// The sandbox's connections through its proxies (`proxy::connection_cap`), and how many.
    proxy_conns: Arc<tokio::sync::Semaphore>,
    proxy_cap: usize,
    /// Its place in the descriptor book (`fds`): the network's own, from before it was made.
    _fds: fds::Charge,
}

#[derive(Debug, Default)]
struct State {
    policy: Policy,
    proxy: Option<Proxy>,
    /// The proxy's place in the descriptor book, from its first start for the network's life
    /// (its connections outlive a proxy a policy update drops).
    proxy_fds: Option<fds::Charge>,
    /// What the host delivers to itself, as the rules in force refuse it.
    host: Arc<Vec<HostNet>>,
}

impl Drop for Net {
    fn drop(&mut self) {
        self.conns.cancel();
    }
}

impl Net {
    /// Makes a namespace, attaches the stack and loads the open policy's rules. The network
    /// follows the host's addresses for as long as it lives.
    pub(crate) async fn new() -> io::Result<Arc<Self>> {
        let charge = fds::book().charge(fds::NET_FDS, "a sandbox's network (its resolver)")?;
        let proxy_cap = proxy::connection_cap();
        let ns = make_namespace().await?;
        let (stack, exit) = start_stack(&ns).await?;
        let conns = tokio_util::sync::CancellationToken::new();
        let (udp, tcp) = in_namespace(&ns, || {
            let lo = (Ipv4Addr::LOCALHOST, 0);
            Ok::<_, io::Error>((std::net::UdpSocket::bind(lo)?, std::net::TcpListener::bind(lo)?))
        })
        .await??;
        let dns = dns::start(udp, tcp, conns.child_token())?;
        let mut hosts = host_nets_watch().subscribe();
        let host = hosts.borrow_and_update().clone();
        nft(&ns, Policy::default().nft_script(&host, RESOLVER, dns, None)).await?;
        let net = Arc::new(Self {
            ns,
            _stack: stack,
            _exit: exit,
            state: tokio::sync::Mutex::new(State { host, ..Default::default() }),
            conns,
            dns,
            proxy_conns: Arc::new(tokio::sync::Semaphore::new(proxy_cap)),
            proxy_cap,
            _fds: charge,
        });
        let (weak, done) = (Arc::downgrade(&net), net.conns.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = done.cancelled() => return,
                    changed = hosts.changed() => if changed.is_err() { return },
                }
                let now = hosts.borrow_and_update().clone();
                let Some(net) = weak.upgrade() else { return };
                // A failure leaves the rules it had; the next change tries again.
                let _ = net.reload(None, Some(now)).await;
            }
        });
        Ok(net)
    }

    /// The namespace, for a sandbox's processes to join.
    pub(crate) fn namespace(&self) -> BorrowedFd<'_> {
        self.ns.as_fd()
    }

    /// Enforces `policy` from now on: new connections are decided by it (connections it let
    /// through before go on, as on E2B). Atomic: on an error the previous rules stay.
    pub(crate) async fn apply(&self, policy: Policy) -> io::Result<()> {
        self.reload(Some(policy), None).await
    }

    /// Reads what the host delivers to itself now and reloads the rules if it changed (a
    /// create does this before its sandbox runs anything, not waiting for an event).
    pub(crate) async fn follow_host(&self) -> io::Result<()> {
        let now = refresh_host_nets();
        self.reload(None, Some(now)).await
    }

    /// Loads the rules for `policy` (else the one in force) and `host` (else the addresses
    /// in force).
    async fn reload(&self, policy: Option<Policy>, host: Option<Arc<Vec<HostNet>>>) -> io::Result<()> {
        let mut st = self.state.lock().await;
        let policy = policy.unwrap_or_else(|| st.policy.clone());
        let host = host.unwrap_or_else(|| st.host.clone());
        if st.policy == policy && st.host == host {
            return Ok(());
        }
        let proxy = match (&st.proxy, policy.has_domains()) {
            (Some(p), true) => Some(p.port()),
            (None, true) => {
                if st.proxy_fds.is_none() {
                    let n = 2 * self.proxy_cap as u64;
                    st.proxy_fds = Some(fds::book().charge(n, "the sandbox's egress proxy (names in its policy)")?);
                }
                let listener =
                    in_namespace(&self.ns, || std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).await??;
                let limit = self.proxy_conns.clone();
                let p = proxy::start(listener, policy.clone(), host.clone(), self.conns.clone(), limit)?;
                let port = p.port();
                st.proxy = Some(p);
                Some(port)
            }
            (_, false) => None,
        };
        nft(&self.ns, policy.nft_script(&host, RESOLVER, self.dns, proxy)).await?;
        match &st.proxy {
            Some(p) if policy.has_domains() => p.set_rules(policy.clone(), host.clone()),
            _ => st.proxy = None,
        }
        st.policy = policy;
        st.host = host;
        Ok(())
    }
}

/// What this host delivers to itself ([`host_nets`]), kept current by a thread that listens
/// to the kernel's address and route events and reads it again every [`REFRESH`] (started on
/// first use, for the life of the process).
fn host_nets_watch() -> &'static tokio::sync::watch::Sender<Arc<Vec<HostNet>>> {
    static WATCH: std::sync::OnceLock<tokio::sync::watch::Sender<Arc<Vec<HostNet>>>> = std::sync::OnceLock::new();
    WATCH.get_or_init(|| {
        let (tx, _) = tokio::sync::watch::channel(Arc::new(host_nets()));
        let started = std::thread::Builder::new().name("host-routes".into()).spawn(move || {
            let Ok(events) = RouteEvents::open() else { return };
            while events.wait() {
                refresh_host_nets();
            }
        });
        drop(started);
        tx
    })
}

/// Reads [`host_nets`] now, tells every network that follows it if it changed, and returns it.
fn refresh_host_nets() -> Arc<Vec<HostNet>> {
    let now = host_nets();
    let watch = host_nets_watch();
    watch.send_if_modified(|cur| {
        let changed = **cur != now;
        if changed {
            *cur = Arc::new(now);
        }
        changed
    });
    let now = watch.borrow().clone();
    now
}

/// Every IPv4 destination this host delivers to itself, denied to every sandbox before any
/// allow: each `local` and `broadcast` route of every routing table (the `local` table holds
/// one per interface address, and any address taken by `ip route add local`; other tables
/// count too, as a policy rule may select them), each interface address (as /32, in case the
/// route dump fails), and each nameserver of `/etc/resolv.conf`. Sorted, without repeats.
pub(crate) fn host_nets() -> Vec<HostNet> {
    let mut out: Vec<HostNet> = host_addresses().into_iter().map(|a| (a, 32)).collect();
    out.extend(dns::host_nameservers().into_iter().map(|a| (a, 32)));
    // A failed dump leaves the interface addresses; the next event or refresh tries again.
    out.extend(local_routes().unwrap_or_default());
    out.sort();
    out.dedup();
    out
}

/// The destinations of the `local` and `broadcast` IPv4 routes of every routing table, read
/// from the kernel (an `RTM_GETROUTE` dump over netlink).
fn local_routes() -> io::Result<Vec<HostNet>> {
    const RTM_NEWROUTE: u16 = 24;
    const RTM_GETROUTE: u16 = 26;
    const NLMSG_ERROR: u16 = 2;
    const NLMSG_DONE: u16 = 3;
    const RTN_LOCAL: u8 = 2;
    const RTN_BROADCAST: u8 = 3;
    const RTA_DST: u16 = 1;
    let fd = netlink_socket(0)?;
    set_receive_timeout(&fd, Duration::from_secs(2))?;
    // nlmsghdr (len, type, flags, seq, pid) then rtmsg (family AF_INET, the rest zero).
    let mut req = Vec::with_capacity(28);
    req.extend_from_slice(&28u32.to_ne_bytes());
    req.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    req.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    // SAFETY: sends our buffer, at most its length, on a socket we own.
    if unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: reads into our buffer, at most its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let msgs = &buf[..n as usize];
        if msgs.is_empty() {
            return Err(io::Error::other("the route dump ended early"));
        }
        let mut off = 0;
        while off + 16 <= msgs.len() {
            let (len, kind) = (u32_at(msgs, off) as usize, u16_at(msgs, off + 4));
            if len < 16 || off + len > msgs.len() {
                return Err(io::Error::other("a malformed route message"));
            }
            let body = &msgs[off + 16..off + len];
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = if body.len() >= 4 { u32_at(body, 0) as i32 } else { -libc::EIO };
                    if code != 0 {
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                }
                RTM_NEWROUTE if body.len() >= 12 && i32::from(body[0]) == libc::AF_INET => {
                    let (dst_len, kind) = (body[1].min(32), body[7]);
                    if kind == RTN_LOCAL || kind == RTN_BROADCAST {
                        let mut dst = Ipv4Addr::UNSPECIFIED;
                        let mut attrs = &body[12..];
                        while attrs.len() >= 4 {
                            let (alen, atype) = (usize::from(u16_at(attrs, 0)), u16_at(attrs, 2));
                            if alen < 4 || alen > attrs.len() {
                                break;
                            }
                            if atype == RTA_DST && alen >= 8 {
                                dst = Ipv4Addr::new(attrs[4], attrs[5], attrs[6], attrs[7]);
                            }
                            attrs = &attrs[((alen + 3) & !3).min(attrs.len())..];
                        }
                        let mask = if dst_len == 0 { 0 } else { u32::MAX << (32 - u32::from(dst_len)) };
                        out.push((Ipv4Addr::from(u32::from(dst) & mask), dst_len));
                    }
                }
                _ => {}
            }
            off += (len + 3) & !3;
        }
    }
}

/// A netlink route socket, subscribed to `groups`.
fn netlink_socket(groups: u32) -> io::Result<OwnedFd> {
    // SAFETY: socket and bind with integer arguments and a sockaddr_nl on this stack; the
    // descriptor is owned at once.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let mut addr: libc::sockaddr_nl = std::mem::zeroed();
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = groups;
        let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        if libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_nl).cast(), len) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fd)
    }
}

fn set_receive_timeout(fd: &OwnedFd, d: Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: d.as_secs() as libc::time_t, tv_usec: d.subsec_micros() as libc::suseconds_t };
    // SAFETY: setsockopt reads `tv` (on this stack, its size given) on a socket we own.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A netlink socket subscribed to IPv4 address and route changes.
struct RouteEvents(OwnedFd);

impl RouteEvents {
    fn open() -> io::Result<Self> {
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
        const RTMGRP_IPV4_ROUTE: u32 = 0x40;
        let fd = netlink_socket(RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE)?;
        set_receive_timeout(&fd, REFRESH)?;
        Ok(Self(fd))
    }

    /// Blocks until the next event or [`REFRESH`] (the content is not needed: everything is
    /// read anew). False once the socket fails for good.
    fn wait(&self) -> bool {
        let mut buf = [0u8; 8192];
        loop {
            // SAFETY: reads into our stack buffer, at most its length.
            let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n > 0 {
                return true;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // Events were lost (the buffer overran), or the refresh is due.
                Some(libc::ENOBUFS | libc::EAGAIN) => return true,
                Some(libc::EINTR) => continue,
                _ => return false,
            }
        }
    }
}

/// Runs `f` on a thread of its own that has joined `ns` (sockets made there belong to it).
async fn in_namespace<T: Send + 'static>(ns: &OwnedFd, f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let ns = ns.try_clone()?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("netns".into()).spawn(move || {
        let r = rustix::thread::move_into_link_name_space(ns.as_fd(), Some(rustix::thread::LinkNameSpaceType::Network))
            .map(|()| f());
        let _ = tx.send(r);
    })?;
    Ok(rx.await.map_err(|_| io::Error::other("the namespace thread died"))??)
}

/// A new network namespace, owned by the host's user namespace, with `lo` up: made by a thread
/// of its own (a thread's namespace is its own; the thread then ends).
async fn make_namespace() -> io::Result<OwnedFd> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new().name("netns-new".into()).spawn(move || {
        let _ = tx.send(make_namespace_here());
    })?;
    rx.await.map_err(|_| io::Error::other("the namespace thread died"))?
}

fn make_namespace_here() -> io::Result<OwnedFd> {
    // SAFETY: unshare with CLONE_NEWNET only changes this thread's network namespace (no
    // memory, no other thread); the thread ends right after.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    lo_up()?;
    // Per namespace, read from the opener's thread: ports below 1024 and ping sockets for the
    // sandbox's users, as a container runtime gives them. Best effort: where /proc/sys is
    // read-only (some containers) the sandbox still starts without them.
    for (path, value) in [
        ("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0"),
        ("/proc/sys/net/ipv4/ping_group_range", "0 2147483647"),
    ] {
        let _ = std::fs::write(path, value);
    }
    Ok(std::fs::File::open("/proc/thread-self/ns/net")?.into())
}

/// Brings `lo` up in the calling thread's network namespace.
fn lo_up() -> io::Result<()> {
    let s = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    // SAFETY: an all-zero ifreq is valid; the ioctls read and write only `req`, which lives on
    // this stack across both calls, on a socket we own.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This host's IPv4 interface addresses (every interface's, loopback included).
fn host_addresses() -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a linked list it allocated, which we only read
    // (each entry's `ifa_addr`, checked for null and for AF_INET before the sockaddr_in cast)
    // and free once with freeifaddrs.
    unsafe {
        if libc::getifaddrs(&mut list) != 0 {
            return out;
        }
        let mut cur = list;
        while !cur.is_null() {
            let addr = (*cur).ifa_addr;
            if !addr.is_null() && i32::from((*addr).sa_family) == libc::AF_INET {
                let sin = &*(addr as *const libc::sockaddr_in);
                out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(list);
    }
    out.sort();
    out.dedup();
    out
}

/// Where a program is (service managers' PATHs often lack the sbin directories).
fn binary(name: &str, package: &str) -> io::Result<std::path::PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"]
        .iter()
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::other(format!(
                "sandboxes' networks need `{name}` (apt-get install {package}; scripts/setup installs it)"
            ))
        })
}

/// Starts slirp4netns on `ns` and waits until it is ready. Returns the child and the write end
/// of its exit pipe.
async fn start_stack(ns: &OwnedFd) -> io::Result<(tokio::process::Child, OwnedFd)> {
    let (ready_r, ready_w) = sys::cloexec_pipe()?;
    let (exit_r, exit_w) = sys::cloexec_pipe()?;
    let mut cmd = std::process::Command::new(binary("slirp4netns", "slirp4netns")?);
    cmd.args([
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--disable-dns",
        "--enable-sandbox",
        "--enable-seccomp",
        "--netns-type=path",
        "--ready-fd=3",
        "--exit-fd=4",
        "/proc/self/fd/5",
        "eth0",
    ])
    .env_clear()
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let (ready, exit, netns) = (ready_w.as_raw_fd(), exit_r.as_raw_fd(), ns.as_raw_fd());
    // SAFETY: `pre_exec` needs an async-signal-safe closure: dup2/fcntl, close_range, unshare
    // and one mount call on descriptors that stay open until the spawn returned (their owners
    // live in this function) and a static C string.
    unsafe {
        cmd.pre_exec(move || {
            sys::dup_onto(ready, 3)?;
            sys::dup_onto(exit, 4)?;
            sys::dup_onto(netns, 5)?;
            sys::cloexec_from(6)?;
            // slirp4netns's own sandbox makes `/` private but not what is mounted below it,
            // then detaches the old root: every shared mount under it (a Docker engine's data
            // root and its containers' roots, a systemd host's /run...) was unmounted on the
            // host too, through its peer group. Started from a copy of the host's mounts made
            // slaves, its detaching stays its own.
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            use rustix::mount::MountPropagationFlags;
            rustix::mount::mount_change(c"/", MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM)?;
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| io::Error::other(format!("cannot start slirp4netns: {e}")))?;
    drop((ready_w, exit_r));
    let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(ready_r)?;
    let mut byte = [0u8; 1];
    match tokio::time::timeout(START_TIMEOUT, rx.read(&mut byte)).await {
        Ok(Ok(1)) => Ok((child, exit_w)),
        other => {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            let mut err = String::new();
            if let Some(e) = child.stderr.take() {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), e.take(STDERR_LIMIT).read_to_string(&mut err)).await;
            }
            let why = match other {
                Err(_) => "timed out".to_string(),
                Ok(Err(e)) => e.to_string(),
                Ok(Ok(_)) => "it exited".to_string(),
            };
            Err(io::Error::other(format!("slirp4netns did not start ({why}): {}", err.trim())))
        }
    }
}

/// Loads `script` with `nft -f -` inside `ns`.
async fn nft(ns: &OwnedFd, script: String) -> io::Result<()> {
    let mut cmd = std::process::Command::new(binary("nft", "nftables")?);
    cmd.args(["-f", "-"]).env_clear().stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let fd = ns.as_raw_fd();
    // SAFETY: `pre_exec` needs an async-signal-safe closure: one setns on a descriptor that
    // `ns` keeps open until the spawn returned, and close_range.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            sys::cloexec_from(3)
        });
    }
    let mut child = tokio::process::Command::from(cmd).kill_on_drop(true).spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let run = async {
        stdin.write_all(script.as_bytes()).await?;
        drop(stdin);
        let mut err = String::new();
        (&mut stderr).take(STDERR_LIMIT).read_to_string(&mut err).await?;
        let st = child.wait().await?;
        if st.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("nft failed ({st}): {}", err.trim())))
        }
    };
    tokio::time::timeout(START_TIMEOUT, run).await.map_err(|_| io::Error::other("nft timed out"))?
}

/// Networks made ahead of the creates that take them (see the module documentation).
pub(crate) struct Pool(Arc<pool::Pool<Nets>>);

/// What [`Pool`] keeps: networks with the open policy.
struct Nets;

#[async_trait::async_trait]
impl pool::Maker for Nets {
    type Spare = Arc<Net>;
    type Kind = ();

    fn next(&self, ready: &[&()], target: usize) -> Option<pool::Next<()>> {
        pool::up_to_target(ready, target)
    }

    async fn make(&self, _: &()) -> Option<Arc<Net>> {
        Net::new().await.ok()
    }

    /// Dropping it ends it.
    fn destroy_now(&self, net: Arc<Net>) {
        drop(net);
    }
}

/// Networks kept ready when `SCENARIO_RUN_NET_POOL` does not say.
const DEFAULT_POOL: usize = 3;

impl Pool {
    /// How many to keep ready: `SCENARIO_RUN_NET_POOL`; 0 makes each when it is taken.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self(pool::Pool::new(Nets, pool::target_from_env("SCENARIO_RUN_NET_POOL", DEFAULT_POOL, 64))))
    }

    /// A ready network with the open policy: one made ahead, or a new one. Taking one starts
    /// the refill (the first take starts the pool).
    pub(crate) async fn take(&self) -> io::Result<Arc<Net>> {
        let net = match self.0.take(&()) {
            Some(n) => n,
            None => Net::new().await?,
        };
        // What the host delivers to itself may have changed with no event (its nameservers)
        // or an event not handled yet: read it now, before the sandbox runs anything.
        net.follow_host().await?;
        Ok(net)
    }

    /// Ends every network kept ready; no more are made.
    pub(crate) fn close(&self) {
        drop(self.0.close_now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's own tables, read over netlink: every host has a `local` route for 127/8,
    /// and one for each interface address.
    #[test]
    fn what_the_host_delivers_to_itself_is_read_from_its_routes() {
        let routes = local_routes().expect("a route dump");
        assert!(routes.contains(&(Ipv4Addr::new(127, 0, 0, 0), 8)), "{routes:?}");
        let nets = host_nets();
        for a in host_addresses() {
            assert!(routes.contains(&(a, 32)), "{a} has no local route in {routes:?}");
            assert!(nets.contains(&(a, 32)), "{a}");
        }
        assert!(nets.windows(2).all(|w| w[0] < w[1]), "sorted, without repeats");
    }
}

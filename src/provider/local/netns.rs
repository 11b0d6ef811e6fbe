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
//! through the host's sockets and goes wherever the host's own traffic goes (a proxy, a VPN),
//! and answers DNS at `10.0.2.3` by asking the host's resolver. Nothing host-wide changes: no
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
//! this host's addresses, its loopback and the ranges no sandbox reaches, then apply the
//! policy; names are the egress proxy's (`proxy`). This host's addresses change (a VPN comes
//! up, Docker makes a bridge, a test makes a veth): a thread follows the kernel's address
//! events (netlink, `RTMGRP_IPV4_IFADDR`) and every live network reloads its rules when they
//! change, within milliseconds.
//!
//! Making one costs tens of milliseconds (a thread, slirp4netns, nft), so a [`Pool`] keeps a
//! few ready with the open policy, refilled in the background: a create takes one and only
//! loads rules when its policy is not the open one.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::egress::Policy;
use super::proxy::{self, Proxy};
use super::sys;

/// The sandbox's resolver (slirp4netns's default; the sandbox is 10.0.2.100, its gateway
/// 10.0.2.2).
pub(crate) const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);

/// How long slirp4netns may take to say it is ready, and nft to load rules.
const START_TIMEOUT: Duration = Duration::from_secs(15);
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
    /// Cancels every proxied connection, and the task that follows the host's addresses,
    /// when the network goes.
    conns: tokio_util::sync::CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    policy: Policy,
    proxy: Option<Proxy>,
    /// The host addresses the rules in force refuse.
    host: Arc<Vec<Ipv4Addr>>,
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
        let ns = make_namespace().await?;
        let (stack, exit) = start_stack(&ns).await?;
        let mut hosts = host_addresses_watch().subscribe();
        let host = hosts.borrow_and_update().clone();
        nft(&ns, Policy::default().nft_script(&host, RESOLVER, None)).await?;
        let net = Arc::new(Self {
            ns,
            _stack: stack,
            _exit: exit,
            state: tokio::sync::Mutex::new(State { host, ..Default::default() }),
            conns: tokio_util::sync::CancellationToken::new(),
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

    /// Loads the rules for `policy` (else the one in force) and `host` (else the addresses
    /// in force).
    async fn reload(&self, policy: Option<Policy>, host: Option<Arc<Vec<Ipv4Addr>>>) -> io::Result<()> {
        let mut st = self.state.lock().await;
        let policy = policy.unwrap_or_else(|| st.policy.clone());
        let host = host.unwrap_or_else(|| st.host.clone());
        if st.policy == policy && st.host == host {
            return Ok(());
        }
        let proxy = match (&st.proxy, policy.has_domains()) {
            (Some(p), true) => Some(p.port()),
            (None, true) => {
                let listener =
                    in_namespace(&self.ns, || std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))).await??;
                let p = proxy::start(listener, policy.clone(), host.clone(), self.conns.clone())?;
                let port = p.port();
                st.proxy = Some(p);
                Some(port)
            }
            (_, false) => None,
        };
        nft(&self.ns, policy.nft_script(&host, RESOLVER, proxy)).await?;
        match &st.proxy {
            Some(p) if policy.has_domains() => p.set_rules(policy.clone(), host.clone()),
            _ => st.proxy = None,
        }
        st.policy = policy;
        st.host = host;
        Ok(())
    }
}

/// This host's IPv4 addresses, kept current by a thread that listens to the kernel's address
/// events (started on first use, for the life of the process).
fn host_addresses_watch() -> &'static tokio::sync::watch::Sender<Arc<Vec<Ipv4Addr>>> {
    static WATCH: std::sync::OnceLock<tokio::sync::watch::Sender<Arc<Vec<Ipv4Addr>>>> = std::sync::OnceLock::new();
    WATCH.get_or_init(|| {
        let (tx, _) = tokio::sync::watch::channel(Arc::new(host_addresses()));
        let sender = tx.clone();
        let started = std::thread::Builder::new().name("host-addresses".into()).spawn(move || {
            let Ok(events) = AddressEvents::open() else { return };
            while events.wait() {
                let now = host_addresses();
                sender.send_if_modified(|cur| {
                    let changed = **cur != now;
                    if changed {
                        *cur = Arc::new(now);
                    }
                    changed
                });
            }
        });
        drop(started);
        tx
    })
}

/// A netlink socket subscribed to IPv4 address changes.
struct AddressEvents(OwnedFd);

impl AddressEvents {
    fn open() -> io::Result<Self> {
        const RTMGRP_IPV4_IFADDR: u32 = 0x10;
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
            addr.nl_groups = RTMGRP_IPV4_IFADDR;
            let len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            if libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_nl).cast(), len) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Self(fd))
        }
    }

    /// Blocks until the next event (its content is not needed: the addresses are read anew).
    /// False once the socket fails for good.
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
                // Events were lost (the buffer overran): the addresses are read anew anyway.
                Some(libc::ENOBUFS) => return true,
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

/// This host's IPv4 addresses (every interface's, loopback included).
pub(crate) fn host_addresses() -> Vec<Ipv4Addr> {
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
#[derive(Debug)]
pub(crate) struct Pool {
    ready: Mutex<Vec<Arc<Net>>>,
    /// How many to keep ready; 0 makes each when it is taken.
    target: usize,
    filling: std::sync::atomic::AtomicBool,
    closed: std::sync::atomic::AtomicBool,
}

/// Networks kept ready when `SCENARIO_RUN_NET_POOL` does not say.
const DEFAULT_POOL: usize = 3;

impl Pool {
    pub(crate) fn new() -> Arc<Self> {
        let target = std::env::var("SCENARIO_RUN_NET_POOL").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_POOL);
        Arc::new(Self {
            ready: Mutex::new(Vec::new()),
            target: target.min(64),
            filling: Default::default(),
            closed: Default::default(),
        })
    }

    /// A ready network with the open policy: one made ahead, or a new one. Taking one starts
    /// the refill (the first take starts the pool).
    pub(crate) async fn take(self: &Arc<Self>) -> io::Result<Arc<Net>> {
        let pooled = self.ready.lock().expect("pool").pop();
        self.refill();
        match pooled {
            Some(n) => Ok(n),
            None => Net::new().await,
        }
    }

    fn refill(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::SeqCst;
        if self.target == 0 || self.closed.load(SeqCst) || self.filling.swap(true, SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.filling.store(false, SeqCst);
            return;
        };
        let pool = Arc::downgrade(self);
        rt.spawn(async move {
            loop {
                let Some(p) = pool.upgrade() else { return };
                if p.closed.load(SeqCst) || p.ready.lock().expect("pool").len() >= p.target {
                    p.filling.store(false, SeqCst);
                    return;
                }
                drop(p);
                let made = Net::new().await;
                let Some(p) = pool.upgrade() else { return };
                match made {
                    Ok(n) if !p.closed.load(SeqCst) => p.ready.lock().expect("pool").push(n),
                    // A failure shows on the next take, which makes its own and reports it.
                    _ => {
                        p.filling.store(false, SeqCst);
                        return;
                    }
                }
            }
        });
    }

    /// Ends every network kept ready; no more are made.
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
        self.ready.lock().expect("pool").clear();
    }
}

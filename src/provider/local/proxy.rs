//! The egress proxy: where a sandbox's HTTP (port 80) and TLS (port 443) connections go when
//! its policy names domains, so they can be decided by name, as E2B's egress firewall does.
//!
//! The sandbox's rules redirect such connections (`egress::Policy::nft_script`) to a socket
//! listening inside its network namespace, on `127.0.0.1`; this side of it runs in the runner
//! (or `serve`), on the host. For each connection: the original destination
//! (`SO_ORIGINAL_DST`), then the first bytes the sandbox sends, read (at most
//! [`PEEK_LIMIT`], for at most [`PEEK_TIMEOUT`]) for the name it asks for: the server name of
//! a TLS ClientHello, or an HTTP request's `Host`. The policy decides (`Policy::decide`); a
//! denied connection is closed, which the sandbox sees as a connection accepted and then
//! closed (E2B documents the same). An allowed one is connected from the host: to the name
//! as the host resolves it when a domain entry allowed it (never to the address the sandbox
//! chose, which its `/etc/hosts` could point anywhere), else to the original address; either
//! way never to an address no sandbox may reach (`egress::always_denied`). What was read is
//! passed on, then both directions are copied until either side closes, or nothing has moved
//! either way for [`idle_timeout`] (10 minutes; `SCENARIO_RUN_PROXY_IDLE`, in seconds).
//!
//! Each connection holds two of the runner's (or `serve`'s) descriptors, so a sandbox has at
//! most [`connection_cap`] at once (128; `SCENARIO_RUN_PROXY_CONNS`), counted across every
//! proxy its network starts: one beyond it is reset at once rather than queued.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::egress::{always_denied, HostNet, Policy, Verdict};

/// How much of a connection's start is read for the name.
const PEEK_LIMIT: usize = 16 * 1024;
/// How long the sandbox may take to send it (a client that waits for the server to speak
/// first is decided without a name after this).
const PEEK_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections one sandbox may have through the proxy at once, unless
/// `SCENARIO_RUN_PROXY_CONNS` says.
const MAX_CONNECTIONS: usize = 128;
/// How long a connection may stay without a byte either way, unless `SCENARIO_RUN_PROXY_IDLE`
/// says (seconds).
const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// See [`IDLE_TIMEOUT`].
pub(crate) fn idle_timeout() -> Duration {
    let secs = std::env::var("SCENARIO_RUN_PROXY_IDLE").ok().and_then(|v| v.trim().parse::<f64>().ok());
    match secs {
        Some(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
        _ => IDLE_TIMEOUT,
    }
}

/// See [`MAX_CONNECTIONS`]: the connections one sandbox's network may have, shared by every
/// proxy it starts (an update that drops and restarts the proxy does not reset the count).
pub(crate) fn connection_cap() -> usize {
    let n = std::env::var("SCENARIO_RUN_PROXY_CONNS").ok().and_then(|v| v.trim().parse::<usize>().ok());
    n.filter(|n| *n > 0).unwrap_or(MAX_CONNECTIONS).min(4096)
}

/// A running proxy; dropping it stops accepting (connections already made go on until the
/// network's token ends them).
#[derive(Debug)]
pub(crate) struct Proxy {
    port: u16,
    rules: Arc<RwLock<Rules>>,
    listening: CancellationToken,
}

/// What decides a connection: the policy, and what the host delivers to itself (never
/// reached).
#[derive(Debug)]
struct Rules {
    policy: Policy,
    host: Arc<Vec<HostNet>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.listening.cancel();
    }
}

impl Proxy {
    /// Its port on `127.0.0.1` inside the sandbox.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    pub(crate) fn set_rules(&self, policy: Policy, host: Arc<Vec<HostNet>>) {
        *self.rules.write().expect("rules") = Rules { policy, host };
    }
}

/// Starts the proxy on `listener` (made inside the sandbox's namespace). `host` is what the
/// host delivers to itself; `conns` ends every connection when the sandbox's network goes;
/// `limit` holds the sandbox's connections ([`connection_cap`]).
pub(crate) fn start(
    listener: std::net::TcpListener,
    policy: Policy,
    host: Arc<Vec<HostNet>>,
    conns: CancellationToken,
    limit: Arc<tokio::sync::Semaphore>,
) -> std::io::Result<Proxy> {
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let rules = Arc::new(RwLock::new(Rules { policy, host }));
    let listening = CancellationToken::new();
    let idle = idle_timeout();
    let (r, stop) = (rules.clone(), listening.clone());
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = stop.cancelled() => return,
                _ = conns.cancelled() => return,
                a = listener.accept() => a,
            };
            let Ok((conn, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            // Over the limit: refused (reset) at once rather than queued.
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                reset(conn);
                continue;
            };
            let (rules, conns) = (r.clone(), conns.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = conns.cancelled() => {}
                    _ = handle(conn, rules, idle) => {}
                }
                drop(permit);
            });
        }
    });
    Ok(Proxy { port, rules, listening })
}

/// Closes `conn` with a reset (SO_LINGER 0), so the sandbox sees a refusal, not an answer.
fn reset(conn: TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt reads `linger` (on this stack, its size given) on the stream's own
    // descriptor, which stays open until the drop below.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(conn);
}

async fn handle(mut inside: TcpStream, rules: Arc<RwLock<Rules>>, idle: Duration) {
    let Ok(dst) = original_destination(&inside) else { return };
    let host = rules.read().expect("rules").host.clone();
    if always_denied(dst.ip(), &host) {
        return;
    }
    let mut head = Vec::new();
    let name = tokio::time::timeout(PEEK_TIMEOUT, read_name(&mut inside, &mut head)).await.ok().flatten();
    let verdict = rules.read().expect("rules").policy.decide(name.as_deref(), dst.ip(), dst.port());
    let upstream = match verdict {
        Verdict::Deny => return,
        Verdict::Allow => tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(dst)).await,
        Verdict::AllowName => {
            let name = name.expect("a name allowed it");
            tokio::time::timeout(CONNECT_TIMEOUT, connect_name(&name, dst.port(), &host)).await
        }
    };
    let Ok(Ok(mut upstream)) = upstream else { return };
    let _ = upstream.set_nodelay(true);
    if upstream.write_all(&head).await.is_err() {
        return;
    }
    let activity = Activity::default();
    let mut inside = Watched { inner: inside, activity: &activity };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inside, &mut upstream) => {}
        _ = activity.idle_for(idle) => {}
    }
}

/// When bytes last moved through a connection.
#[derive(Debug)]
struct Activity {
    start: tokio::time::Instant,
    /// Milliseconds since `start`.
    last: std::sync::atomic::AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Self { start: tokio::time::Instant::now(), last: Default::default() }
    }
}

impl Activity {
    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Returns once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last.load(std::sync::atomic::Ordering::Relaxed));
            let deadline = last + idle;
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// The sandbox's side of a connection, noting each read and write in `activity`.
struct Watched<'a> {
    inner: TcpStream,
    activity: &'a Activity,
}

impl tokio::io::AsyncRead for Watched<'_> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl tokio::io::AsyncWrite for Watched<'_> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        r
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connects to `name:port` as the host resolves it, skipping addresses no sandbox reaches.
async fn connect_name(name: &str, port: u16, host: &[HostNet]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::other(format!("{name} resolves to no address a sandbox may reach"));
    for addr in tokio::net::lookup_host((name, port)).await? {
        if always_denied(addr.ip(), host) {
            continue;
        }
        match TcpStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Reads the connection's first bytes into `head` until a name can be told (TLS server name
/// or HTTP `Host`), or there is none, or [`PEEK_LIMIT`] is reached.
async fn read_name(conn: &mut TcpStream, head: &mut Vec<u8>) -> Option<String> {
    let mut buf = [0u8; 4096];
    loop {
        match parse_name(head) {
            Parsed::Name(n) => return Some(n),
            Parsed::None => return None,
            Parsed::More if head.len() >= PEEK_LIMIT => return None,
            Parsed::More => {}
        }
        let n = conn.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
    }
}

#[derive(Debug, PartialEq)]
enum Parsed {
    Name(String),
    /// It cannot have one (not TLS, not HTTP, or without the field).
    None,
    More,
}

/// The name a connection's start asks for: a TLS ClientHello's server name (a first byte of
/// 0x16), else an HTTP request's `Host` (without its port).
fn parse_name(head: &[u8]) -> Parsed {
    match head.first() {
        None => Parsed::More,
        Some(0x16) => tls_server_name(head),
        Some(_) => http_host(head),
    }
}

fn http_host(head: &[u8]) -> Parsed {
    let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
        // A request line starts with a token: anything else never becomes HTTP.
        return if head.iter().take_while(|b| **b != b' ').all(|b| b.is_ascii_uppercase()) {
            Parsed::More
        } else {
            Parsed::None
        };
    };
    let text = String::from_utf8_lossy(&head[..end]);
    for line in text.split("\r\n").skip(1) {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("host") {
                let v = v.trim();
                // `[v6]:port`, `name:port`, `name`.
                let name = match v.strip_prefix('[') {
                    Some(r) => r.split(']').next().unwrap_or(""),
                    None => v.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(v, |(n, _)| n),
                };
                return if name.is_empty() { Parsed::None } else { Parsed::Name(name.to_ascii_lowercase()) };
            }
        }
    }
    Parsed::None
}

/// The `server_name` extension of a TLS ClientHello that starts `head` (RFC 8446 §4.1.2,
/// RFC 6066 §3). A ClientHello spread over several records is read from the first only.
fn tls_server_name(head: &[u8]) -> Parsed {
    if head.len() < 5 {
        return Parsed::More;
    }
    let record_len = usize::from(u16::from_be_bytes([head[3], head[4]]));
    if head.len() < 5 + record_len {
        return Parsed::More;
    }
    let mut r = Reader(&head[5..5 + record_len]);
    let found = (|| {
        if r.u8()? != 1 {
            return None; // not a ClientHello
        }
        r.skip(3)?; // handshake length
        r.skip(2 + 32)?; // version, random
        let n = usize::from(r.u8()?);
        r.skip(n)?; // session id
        let n = usize::from(r.u16()?);
        r.skip(n)?; // cipher suites
        let n = usize::from(r.u8()?);
        r.skip(n)?; // compression methods
        let n = usize::from(r.u16()?);
        let mut ext = Reader(r.take(n)?);
        while !ext.0.is_empty() {
            let (kind, len) = (ext.u16()?, usize::from(ext.u16()?));
            let body = ext.take(len)?;
            if kind != 0 {
                continue;
            }
            let mut list = Reader(body);
            let n = usize::from(list.u16()?);
            let mut names = Reader(list.take(n)?);
            while !names.0.is_empty() {
                let (t, len) = (names.u8()?, usize::from(names.u16()?));
                let name = names.take(len)?;
                if t == 0 {
                    return std::str::from_utf8(name).ok().map(|s| s.to_ascii_lowercase());
                }
            }
        }
        None
    })();
    match found {
        Some(n) if !n.is_empty() => Parsed::Name(n),
        _ => Parsed::None,
    }
}

/// A cursor over bytes that answers None past the end (the TLS and DNS parsers').
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    pub(super) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub(super) fn skip(&mut self, n: usize) -> Option<()> {
        self.take(n).map(|_| ())
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    pub(super) fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

/// Where a redirected connection was going: `SO_ORIGINAL_DST` (the address before the
/// namespace's NAT rewrote it).
fn original_destination(conn: &TcpStream) -> std::io::Result<SocketAddr> {
    const SO_ORIGINAL_DST: libc::c_int = 80;
    let mut addr: libc::sockaddr_in = unsafe_zeroed();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes (a sockaddr_in) into `addr`, which lives
    // on this stack, and the actual length into `len`; the descriptor is the stream's own.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_IP,
            SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let ip = Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr));
    Ok(SocketAddr::new(IpAddr::V4(ip), u16::from_be(addr.sin_port)))
}

/// An all-zero `sockaddr_in` (valid: every field is an integer).
fn unsafe_zeroed() -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain integers and padding; all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello with one server name, as a client would send it.
    fn client_hello(name: &str) -> Vec<u8> {
        let mut sni = Vec::new();
        let entry_len = 3 + name.len();
        sni.extend_from_slice(&(entry_len as u16).to_be_bytes());
        sni.push(0);
        sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
        sni.extend_from_slice(name.as_bytes());
        let mut ext = Vec::new();
        ext.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]); // supported_versions first
        ext.extend_from_slice(&0u16.to_be_bytes());
        ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
        ext.extend_from_slice(&sni);
        let mut body = vec![0x03, 0x03];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0x00, 0x02, 0x13, 0x01]); // one cipher suite
        body.extend_from_slice(&[0x01, 0x00]); // null compression
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut hs = vec![0x01];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn the_tls_server_name_is_read_whole_or_asked_for() {
        let hello = client_hello("Allowed.Test");
        assert_eq!(parse_name(&hello), Parsed::Name("allowed.test".into()));
        for cut in [1, 4, 5, 20, hello.len() - 1] {
            assert_eq!(parse_name(&hello[..cut]), Parsed::More, "cut at {cut}");
        }
        // A record that is no ClientHello, and garbage lengths, have no name and never panic.
        let mut alert = hello.clone();
        alert[5] = 2;
        assert_eq!(parse_name(&alert), Parsed::None);
        let mut broken = hello.clone();
        let n = broken.len();
        broken[n - 20] = 0xff;
        let _ = parse_name(&broken);
        for len in 0..hello.len() {
            let mut b = hello[..len].to_vec();
            b.resize(hello.len(), 0xff);
            let _ = parse_name(&b);
        }
    }

    #[test]
    fn the_http_host_is_read_without_its_port() {
        assert_eq!(
            parse_name(b"GET / HTTP/1.1\r\nHost: Allowed.Test:8080\r\n\r\n"),
            Parsed::Name("allowed.test".into())
        );
        assert_eq!(parse_name(b"GET / HTTP/1.1\r\nhost: a.test\r\nX: y\r\n\r\n"), Parsed::Name("a.test".into()));
        assert_eq!(parse_name(b"GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"), Parsed::Name("2001:db8::1".into()));
        assert_eq!(parse_name(b"GET / HTTP/1.1\r\nHost: a.te"), Parsed::More);
        assert_eq!(parse_name(b"GET / HTTP/1.0\r\n\r\n"), Parsed::None);
        assert_eq!(parse_name(b"SSH-2.0-OpenSSH\r\n"), Parsed::None);
    }
}

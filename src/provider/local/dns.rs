//! The sandbox's DNS address carries DNS only.
//!
//! A sandbox's resolver is `netns::RESOLVER` (10.0.2.3). Its rules redirect UDP and TCP to
//! that address's port 53 (`egress::Policy::nft_script`, while the policy lets DNS through) to
//! two sockets listening inside its network namespace on `127.0.0.1`; this side of them runs in
//! the runner (or `serve`), on the host. Each message is parsed as a DNS query ([`check_query`]:
//! a standard query with one question and at most an EDNS record, nothing after it); only
//! well-formed queries are sent on, from the host, to the host's nameserver (the first of
//! `/etc/resolv.conf`), and only an answer to that query (its id, a response) comes back.
//! Anything else is dropped (UDP) or ends the connection (TCP). slirp4netns's own DNS
//! forwarding is off (`--disable-dns`): it forwarded whatever bytes came to port 53, so the
//! nameserver (a private address no sandbox may otherwise reach) took any protocol.

use super::proxy::Reader;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

/// How long the nameserver may take to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a TCP connection may wait for its next query.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// Queries one sandbox may have waiting for an answer at once (UDP), and TCP connections.
const MAX_IN_FLIGHT: usize = 64;
const MAX_TCP: usize = 16;
/// The largest query taken (a question is at most 255 bytes of name; EDNS options are few).
const MAX_QUERY: usize = 1024;

/// Why bytes are not a DNS query the resolver passes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Malformed {
    #[error("shorter than its header or than what it declares")]
    Short,
    #[error("longer than a query")]
    TooLong,
    #[error("a response, or not a standard query")]
    NotAQuery,
    #[error("not exactly one question and no answer or authority records")]
    Counts,
    #[error("a malformed name")]
    Name,
    #[error("an additional record that is not one EDNS record")]
    Additional,
    #[error("bytes after the message")]
    Trailing,
}

/// Checks that `msg` is one well-formed DNS query (RFC 1035 §4.1, RFC 6891): header with QR=0
/// and opcode QUERY, one question (a name of labels, no compression, at most 255 bytes, then
/// type and class IN or ANY), no answer or authority record, at most one additional record and
/// that an EDNS `OPT` whose options fill its data exactly, and nothing after.
pub(crate) fn check_query(msg: &[u8]) -> Result<(), Malformed> {
    if msg.len() > MAX_QUERY {
        return Err(Malformed::TooLong);
    }
    let mut r = Reader(msg);
    let header = r.take(12).ok_or(Malformed::Short)?;
    let flags = u16::from_be_bytes([header[2], header[3]]);
    let (qr, opcode) = (flags >> 15, (flags >> 11) & 0xf);
    if qr != 0 || opcode != 0 {
        return Err(Malformed::NotAQuery);
    }
    let count = |i: usize| u16::from_be_bytes([header[i], header[i + 1]]);
    let (qd, an, ns, ar) = (count(4), count(6), count(8), count(10));
    if qd != 1 || an != 0 || ns != 0 || ar > 1 {
        return Err(Malformed::Counts);
    }
    let mut name_len = 0usize;
    loop {
        let n = usize::from(r.u8().ok_or(Malformed::Short)?);
        name_len += n + 1;
        if n > 63 || name_len > 255 {
            return Err(Malformed::Name);
        }
        if n == 0 {
            break;
        }
        r.take(n).ok_or(Malformed::Short)?;
    }
    let _qtype = r.u16().ok_or(Malformed::Short)?;
    let qclass = r.u16().ok_or(Malformed::Short)?;
    if qclass != 1 && qclass != 255 {
        return Err(Malformed::NotAQuery);
    }
    if ar == 1 {
        // OPT: the root name, type 41, class (payload size), TTL (flags), options.
        let (root, kind) = (r.u8().ok_or(Malformed::Short)?, r.u16().ok_or(Malformed::Short)?);
        if root != 0 || kind != 41 {
            return Err(Malformed::Additional);
        }
        r.take(6).ok_or(Malformed::Short)?;
        let len = usize::from(r.u16().ok_or(Malformed::Short)?);
        let mut opts = Reader(r.take(len).ok_or(Malformed::Short)?);
        while !opts.0.is_empty() {
            let _code = opts.u16().ok_or(Malformed::Additional)?;
            let n = usize::from(opts.u16().ok_or(Malformed::Additional)?);
            opts.take(n).ok_or(Malformed::Additional)?;
        }
    }
    if r.0.is_empty() {
        Ok(())
    } else {
        Err(Malformed::Trailing)
    }
}

/// Whether `answer` is a response to `query` (same id, QR set).
fn answers(query: &[u8], answer: &[u8]) -> bool {
    answer.len() >= 12 && answer[..2] == query[..2] && answer[2] & 0x80 != 0
}

/// The host's nameserver: the first `nameserver` of `/etc/resolv.conf` (read per query, so a
/// change applies at once), port 53.
fn upstream() -> Option<SocketAddr> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().split('%').next()?.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .next()
}

/// The IPv4 nameservers of `/etc/resolv.conf`: part of "the host" no sandbox reaches but
/// through its DNS address.
pub(crate) fn host_nameservers() -> Vec<Ipv4Addr> {
    let conf = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    conf.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<Ipv4Addr>().ok())
        .collect()
}

/// The resolver's two listeners' ports (UDP, TCP) inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ports {
    pub udp: u16,
    pub tcp: u16,
}

/// Starts the resolver on `udp` and `tcp` (made inside the sandbox's namespace); `stop` ends
/// it and every exchange under way.
pub(crate) fn start(
    udp: std::net::UdpSocket,
    tcp: std::net::TcpListener,
    stop: CancellationToken,
) -> std::io::Result<Ports> {
    udp.set_nonblocking(true)?;
    tcp.set_nonblocking(true)?;
    let ports = Ports { udp: udp.local_addr()?.port(), tcp: tcp.local_addr()?.port() };
    let udp = Arc::new(UdpSocket::from_std(udp)?);
    let tcp = tokio::net::TcpListener::from_std(tcp)?;
    tokio::spawn(serve_udp(udp, stop.clone()));
    tokio::spawn(serve_tcp(tcp, stop));
    Ok(ports)
}

async fn serve_udp(sock: Arc<UdpSocket>, stop: CancellationToken) {
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let mut buf = vec![0u8; 65536];
    loop {
        let got = tokio::select! {
            _ = stop.cancelled() => return,
            g = sock.recv_from(&mut buf) => g,
        };
        let Ok((n, from)) = got else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let query = buf[..n].to_vec();
        if check_query(&query).is_err() {
            continue;
        }
        let Ok(permit) = limit.clone().try_acquire_owned() else { continue };
        let (sock, stop) = (sock.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                a = tokio::time::timeout(ANSWER_TIMEOUT, ask_udp(&query)) => {
                    if let Ok(Some(answer)) = a {
                        let _ = sock.send_to(&answer, from).await;
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Sends `query` to the host's nameserver over UDP, from the host; its answer.
async fn ask_udp(query: &[u8]) -> Option<Vec<u8>> {
    let server = upstream()?;
    let bind: SocketAddr = if server.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { "[::]:0".parse().ok()? };
    let up = UdpSocket::bind(bind).await.ok()?;
    up.connect(server).await.ok()?;
    up.send(query).await.ok()?;
    let mut buf = vec![0u8; 65536];
    loop {
        let n = up.recv(&mut buf).await.ok()?;
        if answers(query, &buf[..n]) {
            buf.truncate(n);
            return Some(buf);
        }
    }
}

async fn serve_tcp(listener: tokio::net::TcpListener, stop: CancellationToken) {
    let limit = Arc::new(tokio::sync::Semaphore::new(MAX_TCP));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((conn, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let Ok(permit) = limit.clone().try_acquire_owned() else { continue };
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = relay_tcp(conn) => {}
            }
            drop(permit);
        });
    }
}

/// Reads one length-prefixed message from `conn`.
async fn read_message(conn: &mut TcpStream, max: usize) -> Option<Vec<u8>> {
    let len = usize::from(conn.read_u16().await.ok()?);
    if len > max {
        return None;
    }
    let mut msg = vec![0u8; len];
    conn.read_exact(&mut msg).await.ok()?;
    Some(msg)
}

/// Queries in, answers out, one at a time, over one connection to the host's nameserver
/// (made at the first well-formed query); the first message that is not a query ends both.
async fn relay_tcp(mut inside: TcpStream) {
    let mut up: Option<TcpStream> = None;
    loop {
        let Ok(Some(query)) = tokio::time::timeout(TCP_IDLE, read_message(&mut inside, MAX_QUERY)).await else {
            return;
        };
        if check_query(&query).is_err() {
            return;
        }
        let exchange = async {
            if up.is_none() {
                up = Some(TcpStream::connect(upstream()?).await.ok()?);
            }
            let conn = up.as_mut()?;
            let mut framed = (query.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&query);
            conn.write_all(&framed).await.ok()?;
            let answer = read_message(conn, usize::from(u16::MAX)).await?;
            answers(&query, &answer).then_some(answer)
        };
        let Ok(Some(answer)) = tokio::time::timeout(ANSWER_TIMEOUT, exchange).await else { return };
        let mut framed = (answer.len() as u16).to_be_bytes().to_vec();
        framed.extend_from_slice(&answer);
        if inside.write_all(&framed).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A query for `name`, type A, class IN, with an EDNS record if `edns`.
    fn query(name: &str, edns: bool) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, u8::from(edns)];
        for label in name.split('.').filter(|l| !l.is_empty()) {
            q.push(label.len() as u8);
            q.extend_from_slice(label.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        if edns {
            // root, OPT, payload 1232, ttl 0, one cookie option of 8 bytes.
            q.extend_from_slice(&[0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0, 0, 12, 0, 10, 0, 8]);
            q.extend_from_slice(&[7; 8]);
        }
        q
    }

    #[test]
    fn well_formed_queries_pass() {
        assert_eq!(check_query(&query("pypi.org", false)), Ok(()));
        assert_eq!(check_query(&query("a.b.example.com.", true)), Ok(()));
        assert_eq!(check_query(&query("", false)), Ok(()), "the root");
        let long = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61)].join(".");
        assert_eq!(check_query(&query(&long, false)), Ok(()), "a 255-byte name");
    }

    #[test]
    fn anything_else_is_refused() {
        let ok = query("pypi.org", true);
        let set = |i: usize, v: u8| {
            let mut q = ok.clone();
            q[i] = v;
            q
        };
        assert_eq!(check_query(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Err(Malformed::NotAQuery));
        assert_eq!(check_query(b"SSH-2.0-OpenSSH_9.2\r\n"), Err(Malformed::NotAQuery));
        assert_eq!(check_query(&[]), Err(Malformed::Short));
        assert_eq!(check_query(&ok[..11]), Err(Malformed::Short));
        assert_eq!(check_query(&set(2, 0x81)), Err(Malformed::NotAQuery), "a response");
        assert_eq!(check_query(&set(2, 0x28)), Err(Malformed::NotAQuery), "an UPDATE");
        assert_eq!(check_query(&set(5, 2)), Err(Malformed::Counts), "two questions");
        assert_eq!(check_query(&set(7, 1)), Err(Malformed::Counts), "an answer");
        assert_eq!(check_query(&set(9, 1)), Err(Malformed::Counts), "an authority record");
        assert_eq!(check_query(&set(11, 2)), Err(Malformed::Counts), "two additional records");
        assert_eq!(check_query(&set(12, 0xc0)), Err(Malformed::Name), "a compression pointer");
        assert_eq!(check_query(&set(12, 64)), Err(Malformed::Name), "a label over 63");
        let long = ["a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(62)].join(".");
        assert_eq!(check_query(&query(&long, false)), Err(Malformed::Name), "a 256-byte name");
        let mut chaos = query("version.bind", false);
        let n = chaos.len();
        chaos[n - 1] = 3;
        assert_eq!(check_query(&chaos), Err(Malformed::NotAQuery), "class CH");
        let mut trailing = ok.clone();
        trailing.extend_from_slice(b"payload");
        assert_eq!(check_query(&trailing), Err(Malformed::Trailing));
        let plain = query("pypi.org", false);
        let mut not_opt = set(11, 1);
        not_opt.truncate(plain.len());
        not_opt.extend_from_slice(&[0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(check_query(&not_opt), Err(Malformed::Additional), "a TXT record, not OPT");
        let mut bad_opts = ok.clone();
        let n = bad_opts.len();
        bad_opts[n - 9] = 20; // the option says 20 bytes in 12 of data
        assert_eq!(check_query(&bad_opts), Err(Malformed::Additional));
        for cut in 0..ok.len() {
            assert!(check_query(&ok[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(check_query(&[0u8; 2000]), Err(Malformed::TooLong));
    }

    #[test]
    fn only_a_response_to_the_query_comes_back() {
        let q = query("pypi.org", false);
        let mut a = q.clone();
        a[2] |= 0x80;
        assert!(answers(&q, &a));
        assert!(!answers(&q, &q), "the query itself");
        a[0] ^= 1;
        assert!(!answers(&q, &a), "another id");
        assert!(!answers(&q, &a[..11]));
    }
}

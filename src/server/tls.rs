//! HTTPS on serve's one port, beside plain HTTP: what the E2B SDKs need to reach a port of a
//! sandbox, which they always address as `https://{port}-{id}.{domain}` (`get_host`; only
//! debug mode uses `http://`).
//!
//! # One port, two protocols
//!
//! Each connection is sniffed: a TLS record starts with the handshake content type, `0x16`,
//! which no HTTP method starts with; anything else is served as plain HTTP, as before. The
//! sniff and the handshake run in a task per connection ([`Listener`]), so a client that
//! connects and sends nothing holds up no one, and is dropped after [`HANDSHAKE_TIMEOUT`].
//! ALPN offers `http/1.1` only: serve's stream semantics (a connection reset when a sandbox
//! dies under a stream, see `reset_on_close`) are HTTP/1.1's.
//!
//! # Certificates
//!
//! A local certificate authority, made once and kept in `--ca-dir` (default
//! `$XDG_STATE_HOME/scenario-run/serve-ca`, else `~/.local/state/scenario-run/serve-ca`):
//! `ca.pem`, the certificate clients trust (`SSL_CERT_FILE`/`REQUESTS_CA_BUNDLE` for Python,
//! `NODE_EXTRA_CA_CERTS` for Node), and `ca-key.pem`, its key (mode 0600, in a 0700
//! directory). The CA is name-constrained to `localhost` and its subdomains: should its key
//! leak, it cannot vouch for any real host name.
//!
//! A server certificate is issued per name asked for (SNI): `localhost` and any
//! `<label>.localhost`, each for exactly that name. A wildcard `*.localhost` would not do:
//! OpenSSL (Python) and Node refuse a wildcard directly under a top-level name. A handshake
//! without SNI (an IP address) gets the certificate for `localhost`, `127.0.0.1`, `::1` and
//! the listen address; other names get that one too, which their clients then refuse.
//! Issued certificates share one key made at start, and are kept ([`CACHE_MAX`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints, SanType, SerialNumber,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The CA's certificate, in the CA directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's private key, in the CA directory.
pub const CA_KEY: &str = "ca-key.pem";
/// How long a connection may take to send its first byte and finish a TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Server certificates kept by name; past it the cache starts over.
const CACHE_MAX: usize = 4096;
/// The name every certificate is for, and the CA's name constraint.
const LOCALHOST: &str = "localhost";

/// The default CA directory: `$XDG_STATE_HOME/scenario-run/serve-ca`, else
/// `$HOME/.local/state/scenario-run/serve-ca`.
pub fn default_ca_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let state = var("XDG_STATE_HOME")
        .unwrap_or_else(|| var("HOME").unwrap_or_else(|| PathBuf::from("/root")).join(".local/state"));
    state.join("scenario-run/serve-ca")
}

fn other(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::other(format!("{what}: {e}"))
}

/// Valid from yesterday (absorbing clock skew) to `days` from today, UTC.
fn set_validity(p: &mut CertificateParams, days: i64) {
    let at = |d: i64| {
        let ts = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * d);
        let date = jiff::tz::Offset::UTC.to_datetime(ts).date();
        rcgen::date_time_ymd(i32::from(date.year()), date.month() as u8, date.day() as u8)
    };
    p.not_before = at(-1);
    p.not_after = at(days);
}

fn random_serial() -> SerialNumber {
    let mut b = [0u8; 16];
    crate::random::fill_or_unique(&mut b);
    b[0] &= 0x7f;
    b[0] |= 0x01;
    SerialNumber::from_slice(&b)
}

/// The CA's distinguished name, a function of its key (so it is known without parsing the
/// stored certificate, and two machines' CAs differ).
fn ca_params(key: &KeyPair) -> CertificateParams {
    use sha2::Digest;
    let fp = sha2::Sha256::digest(key.public_key_raw());
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "scenario-run");
    dn.push(DnType::CommonName, format!("scenario-run serve local CA {}", hex::encode(&fp[..4])));
    let mut p = CertificateParams::default();
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.name_constraints = Some(NameConstraints {
        permitted_subtrees: vec![GeneralSubtree::DnsName(LOCALHOST.into())],
        excluded_subtrees: vec![],
    });
    p
}

/// The local CA: its key, and where its certificate is.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub cert_path: PathBuf,
    pub created: bool,
}

impl Ca {
    /// The CA in `dir`, made there first if it has none (under a lock, so servers starting
    /// together agree on one).
    pub fn load_or_create(dir: &Path) -> io::Result<Ca> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::create_dir_all(dir).map_err(|e| other(&format!("cannot create {}", dir.display()), e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let lock =
            std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(dir.join("lock"))?;
        // Released when `lock` is closed.
        if let Err(e) = rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive) {
            return Err(other("cannot lock the CA directory", io::Error::from(e)));
        }
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        if cert_path.exists() && key_path.exists() {
            let pem = std::fs::read_to_string(&key_path)?;
            let key = KeyPair::from_pem(&pem).map_err(|e| other(&format!("{}", key_path.display()), e))?;
            let issuer = Issuer::new(ca_params(&key), key);
            return Ok(Ca { issuer, cert_path, created: false });
        }
        let key = KeyPair::generate().map_err(|e| other("CA key", e))?;
        let mut params = ca_params(&key);
        set_validity(&mut params, 3650);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(&key).map_err(|e| other("CA certificate", e))?;
        let write = |path: &Path, text: &str, mode: u32| -> io::Result<()> {
            let tmp = path.with_extension("tmp");
            let _ = std::fs::remove_file(&tmp);
            let mut f = std::fs::OpenOptions::new().create_new(true).write(true).mode(mode).open(&tmp)?;
            io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)
        };
        write(&key_path, &key.serialize_pem(), 0o600)?;
        write(&cert_path, &cert.pem(), 0o644)?;
        Ok(Ca { issuer: Issuer::new(ca_params(&key), key), cert_path, created: true })
    }
}

/// Server certificates by name (see the module documentation).
pub struct Certs {
    ca: Ca,
    key: KeyPair,
    signer: Arc<dyn rustls::sign::SigningKey>,
    /// The certificate for handshakes without a name of ours.
    fallback: Arc<CertifiedKey>,
    issued: Mutex<HashMap<String, Arc<CertifiedKey>>>,
}

impl std::fmt::Debug for Certs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certs").field("ca", &self.ca.cert_path).finish_non_exhaustive()
    }
}

/// Whether serve issues a certificate for `name`: `localhost` or one label under it.
fn ours(name: &str) -> bool {
    let label = match name.strip_suffix(".localhost") {
        Some(l) => l,
        None => return name == LOCALHOST,
    };
    !label.is_empty()
        && label.len() <= 63
        && !label.starts_with('-')
        && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

impl Certs {
    /// Certificates from `ca`; the fallback names `listen`'s address too.
    pub fn new(ca: Ca, listen: SocketAddr) -> io::Result<Certs> {
        let key = KeyPair::generate().map_err(|e| other("server key", e))?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signer = rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| other("server key", e))?;
        let mut ips: Vec<IpAddr> = vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
        if !listen.ip().is_unspecified() && !ips.contains(&listen.ip()) {
            ips.push(listen.ip());
        }
        let mut certs = Certs {
            ca,
            key,
            signer,
            fallback: Arc::new(CertifiedKey::new(vec![], Arc::new(NoKey))),
            issued: Default::default(),
        };
        certs.fallback = certs.issue(LOCALHOST, &ips)?;
        Ok(certs)
    }

    pub fn ca_path(&self) -> &Path {
        &self.ca.cert_path
    }

    pub fn ca_created(&self) -> bool {
        self.ca.created
    }

    fn issue(&self, name: &str, ips: &[IpAddr]) -> io::Result<Arc<CertifiedKey>> {
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        p.distinguished_name = dn;
        p.subject_alt_names = vec![SanType::DnsName(name.try_into().map_err(|e| other("name", e))?)];
        p.subject_alt_names.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        p.serial_number = Some(random_serial());
        set_validity(&mut p, 397);
        let cert = p.signed_by(&self.key, &self.ca.issuer).map_err(|e| other("server certificate", e))?;
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        Ok(Arc::new(CertifiedKey::new(chain, self.signer.clone())))
    }

    /// The certificate for a handshake that asked for `name`.
    fn for_name(&self, name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = name.map(str::to_ascii_lowercase).filter(|n| ours(n) && n != LOCALHOST) else {
            return self.fallback.clone();
        };
        if let Some(c) = self.issued.lock().expect("certs").get(&name) {
            return c.clone();
        }
        let Ok(c) = self.issue(&name, &[]) else {
            return self.fallback.clone();
        };
        let mut issued = self.issued.lock().expect("certs");
        if issued.len() >= CACHE_MAX {
            issued.clear();
        }
        issued.insert(name, c.clone());
        c
    }

    /// The rustls server configuration over these certificates.
    pub fn server_config(self: &Arc<Self>) -> io::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| other("TLS", e))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// A placeholder key, replaced before [`Certs::new`] returns.
#[derive(Debug)]
struct NoKey;

impl rustls::sign::SigningKey for NoKey {
    fn choose_scheme(&self, _: &[rustls::SignatureScheme]) -> Option<Box<dyn rustls::sign::Signer>> {
        None
    }
    fn algorithm(&self) -> rustls::SignatureAlgorithm {
        rustls::SignatureAlgorithm::Anonymous
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.for_name(hello.server_name()))
    }
}

/// One accepted connection: plain, or TLS after its handshake.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Conn {
    pub fn is_tls(&self) -> bool {
        matches!(self, Conn::Tls(_))
    }
}

impl AsRawFd for Conn {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Conn::Plain(s) => s.as_raw_fd(),
            Conn::Tls(s) => s.get_ref().0.as_raw_fd(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// serve's listener: accepts TCP connections and hands axum each one once it is known to be
/// plain HTTP, or once its TLS handshake is done (see the module documentation).
pub struct Listener {
    rx: tokio::sync::mpsc::Receiver<(Conn, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The first byte of a TLS record carrying a handshake (a ClientHello, here).
const TLS_HANDSHAKE: u8 = 0x16;

/// Waits for a connection's first byte and, if it starts TLS, for its handshake.
async fn classify(tcp: TcpStream, acceptor: Option<tokio_rustls::TlsAcceptor>) -> Option<Conn> {
    let mut first = [0u8; 1];
    let n = tcp.peek(&mut first).await.ok()?;
    match acceptor {
        Some(a) if n == 1 && first[0] == TLS_HANDSHAKE => Some(Conn::Tls(Box::new(a.accept(tcp).await.ok()?))),
        _ => Some(Conn::Plain(tcp)),
    }
}

impl Listener {
    /// Serves `tcp`, with TLS for connections that start it when `tls` is given.
    pub fn new(tcp: TcpListener, tls: Option<Arc<rustls::ServerConfig>>) -> io::Result<Listener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            loop {
                let (sock, peer) = match tcp.accept().await {
                    Ok(x) => x,
                    Err(_) => {
                        // Out of descriptors, say: what axum's own listener does.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                // Without TCP_NODELAY a streamed response (headers, then each Connect frame in
                // its own write) waits for the client's delayed ACK before every small write
                // after the first: about 40 ms per `commands.run` on loopback. A failure only
                // costs that latency.
                let _ = sock.set_nodelay(true);
                let (tx, acceptor) = (tx.clone(), acceptor.clone());
                tokio::spawn(async move {
                    if let Ok(Some(conn)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, classify(sock, acceptor)).await {
                        let _ = tx.send((conn, peer)).await;
                    }
                });
            }
        });
        Ok(Listener { rx, local, task })
    }
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task only ends when aborted, by dropping this listener.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_ours() {
        for n in ["localhost", "8080-abc123.localhost", "49983-x.localhost"] {
            assert!(ours(n), "{n}");
        }
        for n in ["example.com", "a.b.localhost", ".localhost", "-x.localhost", "localhost.evil", "evillocalhost"] {
            assert!(!ours(n), "{n}");
        }
    }

    #[test]
    fn certificates_are_issued_per_name_of_ours_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certs::new(Ca::load_or_create(dir.path()).unwrap(), "127.0.0.1:3000".parse().unwrap()).unwrap();
        let a = certs.for_name(Some("8080-abc.localhost"));
        assert!(Arc::ptr_eq(&a, &certs.for_name(Some("8080-ABC.localhost"))), "kept, by the lowercase name");
        assert!(!Arc::ptr_eq(&a, &certs.fallback));
        assert!(!Arc::ptr_eq(&a, &certs.for_name(Some("9000-abc.localhost"))));
        for other in [None, Some("localhost"), Some("example.com"), Some("a.b.localhost")] {
            assert!(Arc::ptr_eq(&certs.for_name(other), &certs.fallback), "{other:?}");
        }
        // The issued certificate names exactly the name asked for.
        let der = a.cert[0].as_ref();
        assert!(der.windows(18).any(|w| w == b"8080-abc.localhost"));
        assert!(!der.windows(11).any(|w| w == b"*.localhost"));
    }

    #[test]
    fn the_ca_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let first = Ca::load_or_create(&ca_dir).unwrap();
        assert!(first.created);
        let pem = std::fs::read_to_string(&first.cert_path).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&ca_dir.join(CA_KEY)), 0o600);
        assert_eq!(mode(&ca_dir), 0o700);
        let again = Ca::load_or_create(&ca_dir).unwrap();
        assert!(!again.created);
        assert_eq!(std::fs::read_to_string(&again.cert_path).unwrap(), pem);
        // Same key, same issuer name: what the second one signs chains to the first's cert.
        assert_eq!(
            ca_params(&KeyPair::from_pem(&std::fs::read_to_string(ca_dir.join(CA_KEY)).unwrap()).unwrap())
                .distinguished_name,
            ca_params(again.issuer.key()).distinguished_name
        );
    }
}

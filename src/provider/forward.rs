//! Port forwarding from a host loopback port into a sandbox's network namespace (local
//! sandboxes, and docker containers on `--network none`).
//!
//! A socket belongs to the network namespace it was created in, so each sandbox gets one
//! dedicated OS thread that joins the sandbox's netns once (`setns(CLONE_NEWNET)` on
//! `/proc/<pid1>/ns/net`, where pid1 is any process of the sandbox as the host sees it; the network namespace is per thread, so this does not affect the
//! rest of the process) and then creates connected sockets on request. The connected std
//! `TcpStream` is handed to tokio and spliced with `copy_bidirectional` to a client accepted on
//! a host `127.0.0.1:<ephemeral>` listener. One listener per sandbox and port, created lazily
//! by `port_url`, torn down when the sandbox is killed. A refused connection inside the sandbox
//! closes the client connection.
//!
//! The other way round ([`Forwarder::expose`]): the same thread creates a *listening* socket in
//! the sandbox's netns (`127.0.0.1:<port>` inside), and each connection accepted on it is
//! spliced to a service on the host's loopback, so a program inside reaches something the run
//! serves (a scripted model endpoint) although the sandbox has no network of its own.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::{mpsc as std_mpsc, Mutex};
use std::time::Duration;

use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::provider::{ProviderError, Result};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the netns thread does on request: connect to a port inside, or listen on one.
enum NsReq {
    Connect { port: u16, reply: oneshot::Sender<std::io::Result<std::net::TcpStream>> },
    Listen { port: u16, reply: oneshot::Sender<std::io::Result<std::net::TcpListener>> },
}

/// Forwarders of one sandbox.
#[derive(Debug)]
pub(crate) struct Forwarder {
    pid1: u32,
    inner: Mutex<Option<Active>>,
    cancel: CancellationToken,
}

#[derive(Debug)]
struct Active {
    connector: std_mpsc::Sender<NsReq>,
    /// Sandbox port -> host port.
    ports: HashMap<u16, u16>,
}

impl std::fmt::Debug for NsReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NsReq::Connect { port, .. } => write!(f, "Connect({port})"),
            NsReq::Listen { port, .. } => write!(f, "Listen({port})"),
        }
    }
}

impl Forwarder {
    pub(crate) fn new(pid1: u32) -> Self {
        Self { pid1, inner: Mutex::new(None), cancel: CancellationToken::new() }
    }

    /// The netns thread's request channel, starting the thread if needed.
    fn connector(&self) -> Result<std_mpsc::Sender<NsReq>> {
        if self.cancel.is_cancelled() {
            return Err(ProviderError::infra("sandbox is not running"));
        }
        let mut inner = self.inner.lock().expect("forwarder");
        if inner.is_none() {
            *inner = Some(Active { connector: start_connector(self.pid1)?, ports: HashMap::new() });
        }
        Ok(inner.as_ref().expect("set").connector.clone())
    }

    /// Makes `host` (a service on this machine's loopback) reachable inside the sandbox at
    /// `127.0.0.1:port`, until the sandbox is stopped.
    pub(crate) async fn expose(&self, port: u16, host: SocketAddr) -> Result<()> {
        let connector = self.connector()?;
        let (reply, rx) = oneshot::channel();
        connector
            .send(NsReq::Listen { port, reply })
            .map_err(|_| ProviderError::infra("the sandbox's network namespace is gone"))?;
        let listener = tokio::time::timeout(CONNECT_TIMEOUT, rx)
            .await
            .map_err(|_| ProviderError::infra("the sandbox's network namespace did not answer"))?
            .map_err(|_| ProviderError::infra("the sandbox's network namespace is gone"))?
            .map_err(|e| ProviderError::infra(format!("cannot listen on 127.0.0.1:{port} in the sandbox: {e}")))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        tokio::spawn(expose_loop(listener, host, self.cancel.clone()));
        Ok(())
    }

    /// A connection to `port` inside the sandbox, made in its network namespace for one
    /// caller: nothing listens on the host for it.
    pub(crate) async fn connect(&self, port: u16) -> Result<tokio::net::TcpStream> {
        let connector = self.connector()?;
        let (reply, rx) = oneshot::channel();
        connector
            .send(NsReq::Connect { port, reply })
            .map_err(|_| ProviderError::infra("the sandbox's network namespace is gone"))?;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT * 2, rx)
            .await
            .map_err(|_| ProviderError::infra("the sandbox's network namespace did not answer"))?
            .map_err(|_| ProviderError::infra("the sandbox's network namespace is gone"))?
            .map_err(|e| ProviderError::infra(format!("cannot connect to port {port} in the sandbox: {e}")))?;
        stream.set_nonblocking(true)?;
        Ok(tokio::net::TcpStream::from_std(stream)?)
    }

    /// The host port forwarding to `port` in the sandbox, starting the forwarder if needed.
    /// It listens on the host's loopback, open to every local user: for the CLI run's own
    /// `{{ sandbox.url(port) }}` only (as E2B's public ports are open), never for serve.
    pub(crate) async fn host_port(&self, port: u16) -> Result<u16> {
        if let Some(hp) = self.inner.lock().expect("forwarder").as_ref().and_then(|a| a.ports.get(&port)) {
            return Ok(*hp);
        }
        let connector = self.connector()?;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let host_port = listener.local_addr()?.port();
        {
            let mut inner = self.inner.lock().expect("forwarder");
            let a = inner.as_mut().expect("set");
            // Another caller may have raced us; keep the first listener.
            if let Some(hp) = a.ports.get(&port) {
                return Ok(*hp);
            }
            a.ports.insert(port, host_port);
        }
        tokio::spawn(accept_loop(listener, port, connector, self.cancel.clone()));
        Ok(host_port)
    }

    /// Stops every listener and connection and lets the netns thread end.
    pub(crate) fn stop(&self) {
        self.cancel.cancel();
        self.inner.lock().expect("forwarder").take();
    }
}

/// Starts the thread that lives in the sandbox's network namespace.
fn start_connector(pid1: u32) -> Result<std_mpsc::Sender<NsReq>> {
    let ns = std::fs::File::open(format!("/proc/{pid1}/ns/net"))
        .map_err(|e| ProviderError::infra(format!("cannot open the sandbox network namespace: {e}")))?;
    let (tx, rx) = std_mpsc::channel::<NsReq>();
    let (ready_tx, ready_rx) = std_mpsc::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name(format!("netns-{pid1}"))
        .spawn(move || {
            // Affects this thread only.
            if let Err(e) = move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network)) {
                let _ = ready_tx.send(Err(e.into()));
                return;
            }
            drop(ns);
            let _ = ready_tx.send(Ok(()));
            // Ends when every sender (the forwarder and its accept loops) is gone.
            for req in rx {
                match req {
                    NsReq::Connect { port, reply } => {
                        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
                        let _ = reply.send(std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT));
                    }
                    NsReq::Listen { port, reply } => {
                        let _ = reply.send(std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)));
                    }
                }
            }
        })
        .map_err(|e| ProviderError::infra(format!("cannot start forwarder thread: {e}")))?;
    match ready_rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => Ok(tx),
        Ok(Err(e)) => Err(ProviderError::infra(format!("cannot enter the sandbox network namespace: {e}"))),
        Err(_) => Err(ProviderError::infra("forwarder thread did not start")),
    }
}

/// Accepts inside the sandbox and splices each connection to `host` on this machine.
async fn expose_loop(listener: tokio::net::TcpListener, host: SocketAddr, cancel: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let Ok((mut inside, _)) = accepted else {
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            continue;
        };
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let Ok(Ok(mut upstream)) =
                tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(host)).await
            else {
                return;
            };
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut inside, &mut upstream) => {}
            }
        });
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    port: u16,
    connector: std_mpsc::Sender<NsReq>,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let mut client = match accepted {
            Ok((c, _)) => c,
            // Out of descriptors (EMFILE) and the like: the pending connection stays
            // readable, so retrying at once would spin. Back off, as servers do.
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let (reply, rx) = oneshot::channel();
        if connector.send(NsReq::Connect { port, reply }).is_err() {
            return;
        }
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let upstream = match tokio::time::timeout(CONNECT_TIMEOUT * 2, rx).await {
                Ok(Ok(Ok(s))) => s,
                // Refused or unreachable inside the sandbox: just close the client.
                _ => return,
            };
            if upstream.set_nonblocking(true).is_err() {
                return;
            }
            let Ok(mut upstream) = tokio::net::TcpStream::from_std(upstream) else {
                return;
            };
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
            }
        });
    }
}

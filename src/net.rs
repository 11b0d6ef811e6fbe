//! Name resolution that treats `*.localhost` as loopback (RFC 6761 §6.3), as browsers do.
//!
//! Sandbox port hosts have the form `{port}-{id}.{domain}`; against a local server such as
//! `scenario-run serve` the domain is `localhost:PORT`, and glibc does not resolve
//! `8000-abc.localhost`. Every other name goes to the system resolver.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

#[derive(Debug, Default, Clone, Copy)]
pub struct LoopbackResolver;

pub fn is_localhost(name: &str) -> bool {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    n == "localhost" || n.ends_with(".localhost")
}

impl Resolve for LoopbackResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            if is_localhost(&host) {
                let addrs: Addrs = Box::new(std::iter::once(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)));
                return Ok(addrs);
            }
            let found = tokio::task::spawn_blocking(move || {
                (host.as_str(), 0).to_socket_addrs().map(|a| a.collect::<Vec<_>>())
            })
            .await
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)??;
            let addrs: Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// Every HTTP client of the process starts here. reqwest is built without a TLS crypto
/// provider of its own; this installs rustls's `ring` provider once, before the first client.
pub fn client_builder() -> reqwest::ClientBuilder {
    static TLS: std::sync::Once = std::sync::Once::new();
    TLS.call_once(|| {
        // Fails only if another provider is already installed, which is as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    reqwest::Client::builder()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_names() {
        assert!(is_localhost("localhost"));
        assert!(is_localhost("8000-abc.localhost"));
        assert!(is_localhost("8000-ABC.LOCALHOST."));
        assert!(!is_localhost("localhost.example.com"));
        assert!(!is_localhost("notlocalhost"));
    }

    #[tokio::test]
    async fn subdomains_of_localhost_are_loopback() {
        let addrs: Vec<SocketAddr> =
            LoopbackResolver.resolve("9000-sbx.localhost".parse().unwrap()).await.unwrap().collect();
        assert_eq!(addrs, vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)]);
    }

    #[test]
    fn clients_build_with_the_ring_provider() {
        client_builder().build().unwrap();
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}

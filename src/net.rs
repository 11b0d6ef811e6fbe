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

/// The characters a URL component keeps as they are: RFC 3986's unreserved set.
const UNRESERVED: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Percent-encodes everything in `s` but unreserved characters (a path segment, a query value).
pub fn url_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, UNRESERVED).to_string()
}

/// Percent-decodes `s`; `None` when the bytes it stands for are not UTF-8.
pub fn url_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s).decode_utf8().ok().map(|c| c.into_owned())
}

/// The `key=value` pairs of a raw query string, neither decoded (each caller decodes as its
/// API does); a pair without `=` has an empty value, and empty pairs are skipped.
pub fn query_split(raw: Option<&str>) -> impl Iterator<Item = (&str, &str)> {
    raw.unwrap_or("").split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// A query value as forms send it: `+` is a space, `%XX` a byte; bytes that are not UTF-8
/// are replaced, and a `%` without two hex digits stays as it is.
pub fn form_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned()
}

#[cfg(test)]
mod url_tests {
    use super::*;

    #[test]
    fn query_strings_split_into_raw_pairs() {
        let pairs: Vec<_> = query_split(Some("a=1&&b&c=x=y&d=%20+")).collect();
        assert_eq!(pairs, [("a", "1"), ("b", ""), ("c", "x=y"), ("d", "%20+")]);
        assert_eq!(query_split(None).count(), 0);
    }

    #[test]
    fn encodes_all_but_unreserved_and_decodes_back() {
        let s = "a b/c?d=e&f+g~h-i_j.k%é";
        let e = url_encode(s);
        assert_eq!(e, "a%20b%2Fc%3Fd%3De%26f%2Bg~h-i_j.k%25%C3%A9");
        assert_eq!(url_decode(&e).as_deref(), Some(s));
        assert_eq!(url_decode("%FF"), None, "not UTF-8");
        assert_eq!(form_decode("a+b%2B%C3%A9%zz%4"), "a b+é%zz%4");
        assert_eq!(form_decode("%FF"), "\u{FFFD}", "not UTF-8: replaced");
    }
}

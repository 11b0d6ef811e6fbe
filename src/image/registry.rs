//! A client of the registry HTTP API v2 (CNCF distribution), for pulling images.
//!
//! Enough of the protocol to pull what `docker pull` pulls: plain HTTP for loopback hosts
//! (dockerd's insecure default) and HTTPS otherwise; anonymous access, HTTP basic auth and
//! the bearer token flow (`WWW-Authenticate: Bearer realm=…,service=…,scope=…`, asking the
//! realm with the basic credentials when there are any); Docker v2 schema 2 and OCI
//! manifests, and OCI indexes / Docker manifest lists (linux/amd64 is picked). Every blob is
//! checked against its digest before it is used.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::error::{ImageError, Result};
use super::reference::RegistryRef;

/// Credentials for a registry (basic auth, or the basic credentials a token service takes).
#[derive(Clone)]
pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth").field("username", &self.username).field("password", &"***").finish()
    }
}

pub(crate) const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub(crate) const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// A descriptor: what a manifest says about a blob or another manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    pub architecture: String,
    pub os: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestJson {
    #[serde(default)]
    schema_version: Option<u32>,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// An image manifest (one platform).
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    /// `sha256:…` of the manifest bytes: the image's content address.
    pub digest: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// Talks to one registry about one repository.
pub(crate) struct Client {
    http: reqwest::Client,
    r: RegistryRef,
    auth: Option<RegistryAuth>,
    /// The `Authorization` header that worked, reused for every later request.
    header: Mutex<Option<String>>,
}

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `Bearer realm="…",service="…",scope="…"` -> (scheme, params).
pub(crate) fn parse_challenge(h: &str) -> (String, Vec<(String, String)>) {
    let h = h.trim();
    let (scheme, rest) = h.split_once(' ').unwrap_or((h, ""));
    let mut params = Vec::new();
    let mut rest = rest.trim();
    while !rest.is_empty() {
        let Some((k, after)) = rest.split_once('=') else { break };
        let k = k.trim().trim_start_matches(',').trim().to_ascii_lowercase();
        let after = after.trim_start();
        let (v, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            (q[..end].to_string(), q.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (after[..end].trim().to_string(), &after[end..])
        };
        params.push((k, v));
        rest = next.trim_start().trim_start_matches(',').trim_start();
    }
    (scheme.to_ascii_lowercase(), params)
}

fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

impl Client {
    pub fn new(http: reqwest::Client, r: RegistryRef, auth: Option<RegistryAuth>) -> Self {
        Self { http, r, auth, header: Mutex::new(None) }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.r.base_url(), self.r.repo)
    }

    fn net_err(&self, what: &str, e: impl std::fmt::Display) -> ImageError {
        ImageError::infra(format!("pull {}: {what} from registry {}: {e}", self.r, self.r.host))
    }

    /// Answers the registry's challenge: the header to send from now on.
    async fn authenticate(&self, challenge: &str) -> Result<String> {
        let (scheme, params) = parse_challenge(challenge);
        let get = |k: &str| params.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        match scheme.as_str() {
            "basic" => {
                let a = self.auth.as_ref().ok_or_else(|| {
                    ImageError::auth(format!(
                        "pull {}: registry {} wants a username and password (basic auth) and none were given",
                        self.r, self.r.host
                    ))
                })?;
                Ok(format!("Basic {}", b64(&format!("{}:{}", a.username, a.password))))
            }
            "bearer" => {
                let realm = get("realm").ok_or_else(|| {
                    ImageError::infra(format!("registry {} sent a bearer challenge without a realm", self.r.host))
                })?;
                let mut q: Vec<(String, String)> = Vec::new();
                if let Some(s) = get("service") {
                    q.push(("service".into(), s));
                }
                q.push(("scope".into(), get("scope").unwrap_or_else(|| format!("repository:{}:pull", self.r.repo))));
                if let Some(a) = &self.auth {
                    q.push(("account".into(), a.username.clone()));
                }
                let query: Vec<String> = q.iter().map(|(k, v)| format!("{k}={}", crate::net::url_encode(v))).collect();
                let sep = if realm.contains('?') { '&' } else { '?' };
                let mut req =
                    self.http.get(format!("{realm}{sep}{}", query.join("&"))).timeout(Duration::from_secs(60));
                if let Some(a) = &self.auth {
                    req = req.basic_auth(&a.username, Some(&a.password));
                }
                let resp = req.send().await.map_err(|e| self.net_err("get a token", e))?;
                let status = resp.status();
                if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
                    return Err(ImageError::auth(format!(
                        "pull {}: the token service {realm} refused {} (HTTP {status})",
                        self.r,
                        self.auth
                            .as_ref()
                            .map_or("anonymous access".to_string(), |a| format!("the credentials of {}", a.username))
                    )));
                }
                if !status.is_success() {
                    return Err(self.net_err("get a token", format!("{realm} answered HTTP {status}")));
                }
                #[derive(Deserialize)]
                struct Token {
                    #[serde(default)]
                    token: Option<String>,
                    #[serde(default)]
                    access_token: Option<String>,
                }
                let t: Token = resp.json().await.map_err(|e| self.net_err("read the token", e))?;
                let token = t
                    .token
                    .or(t.access_token)
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| self.net_err("get a token", format!("{realm} answered without a token")))?;
                Ok(format!("Bearer {token}"))
            }
            other => Err(ImageError::infra(format!(
                "registry {} asks for `{other}` authentication, which is not supported (basic and bearer are)",
                self.r.host
            ))),
        }
    }

    /// GET with auth: on a 401 the challenge is answered once and the request repeated.
    async fn get(&self, url: &str, accept: Option<&str>, what: &str) -> Result<reqwest::Response> {
        let send = |auth: Option<String>| {
            let mut req = self.http.get(url).timeout(Duration::from_secs(3600));
            if let Some(a) = accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            if let Some(h) = auth {
                req = req.header(reqwest::header::AUTHORIZATION, h);
            }
            req.send()
        };
        let current = self.header.lock().expect("header").clone();
        let resp = send(current.clone()).await.map_err(|e| self.net_err(what, e))?;
        let resp = if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
            let challenge = resp
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            if challenge.is_empty() {
                return Err(ImageError::auth(format!(
                    "pull {}: registry {} refused access (HTTP 401)",
                    self.r, self.r.host
                )));
            }
            let h = self.authenticate(&challenge).await?;
            let again = send(Some(h.clone())).await.map_err(|e| self.net_err(what, e))?;
            if again.status() == reqwest::StatusCode::UNAUTHORIZED || again.status() == reqwest::StatusCode::FORBIDDEN {
                return Err(ImageError::auth(format!(
                    "pull {}: registry {} refused {} (HTTP {})",
                    self.r,
                    self.r.host,
                    self.auth
                        .as_ref()
                        .map_or("anonymous access".to_string(), |a| format!("the credentials of {}", a.username)),
                    again.status().as_u16()
                )));
            }
            *self.header.lock().expect("header") = Some(h);
            again
        } else {
            resp
        };
        match resp.status() {
            s if s.is_success() => Ok(resp),
            reqwest::StatusCode::NOT_FOUND => Err(ImageError::not_found(format!(
                "pull {}: {what}: registry {} has no such thing",
                self.r, self.r.host
            ))),
            reqwest::StatusCode::FORBIDDEN => {
                Err(ImageError::auth(format!("pull {}: registry {} refused access (HTTP 403)", self.r, self.r.host)))
            }
            s => {
                let body = resp.text().await.unwrap_or_default();
                Err(self.net_err(what, format!("HTTP {s}: {}", body.chars().take(300).collect::<String>())))
            }
        }
    }

    /// The manifest of `reference` (a tag or digest) for linux/amd64.
    pub async fn manifest(&self) -> Result<Manifest> {
        let accept = [OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST].join(", ");
        let mut reference = self.r.manifest_ref().to_string();
        let mut expect = self.r.digest.clone();
        for _ in 0..2 {
            let url = self.url(&format!("manifests/{reference}"));
            let resp = self.get(&url, Some(&accept), &format!("fetch the manifest {reference}")).await?;
            let ctype = resp
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let bytes = resp.bytes().await.map_err(|e| self.net_err("read the manifest", e))?;
            let digest = sha256(&bytes);
            if let Some(want) = &expect {
                if *want != digest {
                    return Err(ImageError::invalid(format!(
                        "pull {}: the manifest's digest is {digest}, not {want}",
                        self.r
                    )));
                }
            }
            let m: ManifestJson = serde_json::from_slice(&bytes)
                .map_err(|e| ImageError::invalid(format!("pull {}: the manifest is not valid JSON: {e}", self.r)))?;
            let media = m.media_type.clone().filter(|t| !t.is_empty()).unwrap_or(ctype);
            if m.schema_version == Some(1) || media.contains("v1+prettyjws") || media.ends_with("manifest.v1+json") {
                return Err(ImageError::invalid(format!(
                    "pull {}: Docker schema 1 manifests are not supported (push the image again with a current client)",
                    self.r
                )));
            }
            if let Some(list) = m.manifests.filter(|_| media == OCI_INDEX || media == DOCKER_LIST || m.layers.is_none())
            {
                let pick = list
                    .iter()
                    .find(|d| d.platform.as_ref().is_some_and(|p| p.os == "linux" && p.architecture == "amd64"))
                    .ok_or_else(|| {
                        let have: Vec<String> = list
                            .iter()
                            .filter_map(|d| d.platform.as_ref().map(|p| format!("{}/{}", p.os, p.architecture)))
                            .collect();
                        ImageError::not_found(format!(
                            "pull {}: the image has no linux/amd64 variant (it has: {})",
                            self.r,
                            have.join(", ")
                        ))
                    })?;
                reference = pick.digest.clone();
                expect = Some(pick.digest.clone());
                continue;
            }
            let config = m
                .config
                .ok_or_else(|| ImageError::invalid(format!("pull {}: the manifest has no config ({media})", self.r)))?;
            return Ok(Manifest { digest, config, layers: m.layers.unwrap_or_default() });
        }
        Err(ImageError::invalid(format!("pull {}: an index points at another index", self.r)))
    }

    /// A small blob (the image config), verified.
    pub async fn blob_bytes(&self, d: &Descriptor) -> Result<Vec<u8>> {
        let resp =
            self.get(&self.url(&format!("blobs/{}", d.digest)), None, &format!("fetch blob {}", d.digest)).await?;
        let bytes = resp.bytes().await.map_err(|e| self.net_err("read a blob", e))?;
        if sha256(&bytes) != d.digest {
            return Err(ImageError::invalid(format!("pull {}: blob {} does not match its digest", self.r, d.digest)));
        }
        Ok(bytes.to_vec())
    }

    /// A blob streamed to `dest`, verified; returns its size.
    pub async fn blob_to_file(&self, d: &Descriptor, dest: &Path) -> Result<u64> {
        use tokio::io::AsyncWriteExt;
        let mut resp =
            self.get(&self.url(&format!("blobs/{}", d.digest)), None, &format!("fetch layer {}", d.digest)).await?;
        let io = |e: std::io::Error| ImageError::infra(format!("write {}: {e}", dest.display()));
        let mut file = tokio::fs::File::create(dest).await.map_err(io)?;
        let mut hasher = Sha256::new();
        let mut n = 0u64;
        while let Some(chunk) = resp.chunk().await.map_err(|e| self.net_err("read a blob", e))? {
            hasher.update(&chunk);
            n += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(io)?;
        }
        file.flush().await.map_err(io)?;
        if d.size > 0 && n != d.size {
            return Err(ImageError::invalid(format!(
                "pull {}: layer {} is {n} bytes, not the {} its manifest says",
                self.r, d.digest, d.size
            )));
        }
        let got = format!("sha256:{}", hex::encode(hasher.finalize()));
        if got != d.digest {
            return Err(ImageError::invalid(format!(
                "pull {}: layer {} does not match its digest (got {got})",
                self.r, d.digest
            )));
        }
        Ok(n)
    }
}

/// How a layer's bytes are compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
}

/// A layer whose media type the unpacker cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LayerTypeError {
    /// zstd-compressed (`…+zstd`): a known type, refused.
    #[error("zstd-compressed layers ({0}) are not supported; push it with gzip")]
    Zstd(String),
    #[error("unsupported layer type `{0}`")]
    Unknown(String),
}

pub(crate) fn layer_compression(media_type: &str) -> std::result::Result<Compression, LayerTypeError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Compression::Gzip),
        "application/vnd.oci.image.layer.v1.tar" | "application/vnd.oci.image.layer.nondistributable.v1.tar" => {
            Ok(Compression::None)
        }
        t if t.ends_with("+zstd") => Err(LayerTypeError::Zstd(t.to_string())),
        t => Err(LayerTypeError::Unknown(t.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let (s, p) = parse_challenge(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:a/b:pull""#,
        );
        assert_eq!(s, "bearer");
        assert_eq!(
            p,
            vec![
                ("realm".to_string(), "https://auth.example.com/token".to_string()),
                ("service".to_string(), "registry.example.com".to_string()),
                ("scope".to_string(), "repository:a/b:pull".to_string())
            ]
        );
        let (s, p) = parse_challenge(r#"Basic realm="Registry Realm""#);
        assert_eq!((s.as_str(), p[0].1.as_str()), ("basic", "Registry Realm"));
        let (_, p) = parse_challenge("Bearer realm=http://x/t, service=s");
        assert_eq!(p[1], ("service".to_string(), "s".to_string()));
    }

    #[test]
    fn layer_types() {
        assert_eq!(layer_compression("application/vnd.docker.image.rootfs.diff.tar.gzip"), Ok(Compression::Gzip));
        assert_eq!(layer_compression("application/vnd.oci.image.layer.v1.tar"), Ok(Compression::None));
        assert!(layer_compression("application/vnd.oci.image.layer.v1.tar+zstd")
            .unwrap_err()
            .to_string()
            .contains("zstd"));
        // Issue 28 item 4: the refusals are kinds, in the words they had.
        let t = "application/vnd.oci.image.layer.v1.tar+zstd";
        assert_eq!(layer_compression(t), Err(LayerTypeError::Zstd(t.into())));
        assert_eq!(
            layer_compression(t).unwrap_err().to_string(),
            format!("zstd-compressed layers ({t}) are not supported; push it with gzip")
        );
        assert_eq!(layer_compression("text/plain"), Err(LayerTypeError::Unknown("text/plain".into())));
        assert_eq!(layer_compression("text/plain").unwrap_err().to_string(), "unsupported layer type `text/plain`");
    }
}

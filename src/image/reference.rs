//! Image references: what a `FROM`, a `fromImage` or a template name asks for.
//!
//! Three shapes, told apart the way the Docker CLI does (a first path component with a `.`
//! or a `:`, or `localhost`, is a registry host):
//!
//! * a name in the offline table (`python:3.11-slim`, `docker.io/library/node:22`, `base`)
//!   or `offline:<recipe>`: built offline;
//! * `host[:port]/repo[:tag][@sha256:…]`: pulled from that registry;
//! * any other Docker Hub name: an error that lists what can be had offline.

use super::error::{ImageError, Result};
use super::offline::{self, Recipe};

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// Built offline by a recipe; `public` is the name it stands for.
    Offline { recipe: &'static Recipe, public: String },
    /// Pulled from a registry.
    Registry(RegistryRef),
}

/// `host/repo:tag@digest` of an image in a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RegistryRef {
    /// `localhost:5000`, `registry.example.com`.
    pub host: String,
    /// `ns/name`.
    pub repo: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>`.
    pub digest: Option<String>,
}

impl RegistryRef {
    /// What the manifest is fetched by: the digest if given, else the tag (default `latest`).
    pub fn manifest_ref(&self) -> &str {
        self.digest.as_deref().or(self.tag.as_deref()).unwrap_or("latest")
    }

    /// Loopback registries speak plain HTTP (as dockerd treats 127.0.0.0/8 as insecure).
    pub fn is_loopback(&self) -> bool {
        let host = match self.host.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => self.host.as_str(),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        crate::net::is_localhost(host) || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    /// `http://host` or `https://host`.
    pub fn base_url(&self) -> String {
        format!("{}://{}", if self.is_loopback() { "http" } else { "https" }, self.host)
    }

    /// `host/repo` pinned to `digest`.
    pub fn pinned(&self, digest: &str) -> String {
        format!("{}/{}@{digest}", self.host, self.repo)
    }
}

impl std::fmt::Display for RegistryRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host, self.repo)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A Docker Hub name without `docker.io/`, `library/`, and with a tag (`:latest` by default).
pub(crate) fn normalize_hub(name: &str) -> String {
    let mut s = name.trim();
    for p in ["docker.io/", "index.docker.io/", "registry-1.docker.io/"] {
        if let Some(rest) = s.strip_prefix(p) {
            s = rest;
            break;
        }
    }
    let s = s.strip_prefix("library/").unwrap_or(s);
    let last = s.rsplit('/').next().unwrap_or(s);
    if s.contains('@') || last.contains(':') || s == "base" {
        s.to_string()
    } else {
        format!("{s}:latest")
    }
}

fn is_host(component: &str) -> bool {
    component.contains('.') || component.contains(':') || component == "localhost"
}

fn valid_repo(repo: &str) -> bool {
    !repo.is_empty()
        && repo.split('/').all(|c| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
                && c.as_bytes()[c.len() - 1].is_ascii_alphanumeric()
        })
}

fn valid_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && (tag.as_bytes()[0].is_ascii_alphanumeric() || tag.starts_with('_'))
        && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(crate) fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Splits `repo[:tag][@digest]` (after the host).
fn split_tag_digest(rest: &str, whole: &str) -> Result<(String, Option<String>, Option<String>)> {
    let bad = |why: &str| ImageError::invalid(format!("parse the image reference `{whole}`: {why}"));
    let (name, digest) = match rest.split_once('@') {
        Some((n, d)) => {
            if !valid_digest(d) {
                return Err(bad("the digest must be sha256:<64 hex digits>"));
            }
            (n, Some(d.to_string()))
        }
        None => (rest, None),
    };
    let (repo, tag) = match name.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => {
            if !valid_tag(t) {
                return Err(bad("the tag may have letters, digits, `_`, `.` and `-` (at most 128)"));
            }
            (r, Some(t.to_string()))
        }
        _ => (name, None),
    };
    if !valid_repo(repo) {
        return Err(bad("the repository must be lowercase letters, digits and `._-` separated by `/`"));
    }
    Ok((repo.to_string(), tag, digest))
}

/// What `reference` asks for.
pub(crate) fn resolve(reference: &str) -> Result<Source> {
    let r = reference.trim();
    if r.is_empty() {
        return Err(ImageError::invalid("resolve an image: the reference is empty"));
    }
    if let Some(name) = r.strip_prefix("offline:") {
        let recipe = offline::recipe(name).ok_or_else(|| {
            let all: Vec<&str> = offline::recipes().iter().map(|r| r.name).collect();
            ImageError::not_found(format!(
                "resolve image `{r}`: there is no offline recipe `{name}` (there are: {})",
                all.join(", ")
            ))
        })?;
        return Ok(Source::Offline { recipe, public: r.to_string() });
    }
    let hub = normalize_hub(r);
    if let Some(recipe) = offline::lookup(&hub) {
        return Ok(Source::Offline { recipe, public: hub });
    }
    let first = r.split('/').next().unwrap_or(r);
    if r.contains('/') && is_host(first) && !first.ends_with("docker.io") {
        let rest = &r[first.len() + 1..];
        let (repo, tag, digest) = split_tag_digest(rest, r)?;
        return Ok(Source::Registry(RegistryRef { host: first.to_ascii_lowercase(), repo, tag, digest }));
    }
    // A Docker Hub name: check it is well formed, then say why it cannot be had.
    split_tag_digest(&hub, r)?;
    Err(ImageError::not_found(format!(
        "resolve image `{r}`: it is a Docker Hub image with no offline equivalent; Docker Hub is not reachable here and \
         images are never taken from the host; names that can be had offline: {}; or push the image to a \
         registry and name it with the registry's host (e.g. localhost:5000/{})",
        offline::names(),
        hub
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(r: &str) -> RegistryRef {
        match resolve(r).unwrap() {
            Source::Registry(x) => x,
            other => panic!("{r}: {other:?}"),
        }
    }

    fn recipe_of(r: &str) -> &'static str {
        match resolve(r).unwrap() {
            Source::Offline { recipe, .. } => recipe.name,
            other => panic!("{r}: {other:?}"),
        }
    }

    #[test]
    fn hub_names_in_the_table_are_offline() {
        assert_eq!(recipe_of("base"), "e2b-base");
        assert_eq!(recipe_of("e2bdev/base"), "e2b-base");
        assert_eq!(recipe_of("docker.io/e2bdev/base:latest"), "e2b-base");
        assert_eq!(recipe_of("python:3.11-slim-bookworm"), "python-3.11");
        assert_eq!(recipe_of("docker.io/library/python:3.11"), "python-3.11");
        assert_eq!(recipe_of("library/debian:12-slim"), "debian-bookworm");
        assert_eq!(recipe_of("node:24-bookworm-slim"), "node-24");
        assert_eq!(recipe_of("offline:node-20"), "node-20");
        assert_eq!(
            resolve("python:3.11-slim").unwrap(),
            Source::Offline { recipe: offline::recipe("python-3.11").unwrap(), public: "python:3.11-slim".into() }
        );
    }

    #[test]
    fn registry_references() {
        let r = reg("localhost:5000/repo:tag");
        assert_eq!(
            (r.host.as_str(), r.repo.as_str(), r.tag.as_deref(), r.digest.as_deref()),
            ("localhost:5000", "repo", Some("tag"), None)
        );
        assert!(r.is_loopback());
        assert_eq!(r.base_url(), "http://localhost:5000");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = reg(&format!("127.0.0.1:5000/x/y@{d}"));
        assert_eq!((r.repo.as_str(), r.tag.as_deref(), r.digest.as_deref()), ("x/y", None, Some(d.as_str())));
        assert_eq!(r.manifest_ref(), d);
        let r = reg("registry.example.com/ns/x");
        assert!(!r.is_loopback());
        assert_eq!(r.base_url(), "https://registry.example.com");
        assert_eq!(r.manifest_ref(), "latest");
        assert_eq!(reg("[::1]:5000/a:b").base_url(), "http://[::1]:5000");
        assert_eq!(reg("localhost/a").to_string(), "localhost/a");
    }

    #[test]
    fn unmapped_hub_names_list_the_offline_ones() {
        let e = resolve("ubuntu:20.04").unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::NotFound);
        assert!(e.message.starts_with("resolve image `ubuntu:20.04`: it is a Docker Hub image"), "{e}");
        assert!(e.message.contains("ubuntu:22.04"), "the Ubuntu names are listed: {e}");
        assert!(e.message.contains("python:3.11-slim") && e.message.contains("node:22"), "{e}");
        assert!(resolve("docker.io/library/python:3.12").is_err());
        assert!(resolve("python").unwrap_err().message.contains("python:latest"));
    }

    #[test]
    fn malformed_references_are_invalid() {
        for bad in ["", "UPPER/x", "localhost:5000/Repo", "localhost:5000/x@sha256:abc", "localhost:5000/x:t@g", "x:"] {
            let e = resolve(bad).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Invalid, "{bad}: {e}");
        }
        assert!(resolve("offline:nope").unwrap_err().message.contains("e2b-base"));
    }
}

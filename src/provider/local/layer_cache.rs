//! Template builds kept by their content across runs, as Docker's build cache keeps layers
//! (issue 37 item 1: a scenario that deploys `code-interpreter-v1` rebuilt it on every run,
//! 2 m 43 s, where the kept build takes seconds).
//!
//! A finished build that is not pinned (`keep: true`, `SCENARIO_RUN_KEEP_BUILDS=1`: those
//! stay in the state directory, as before) moves into `<state_dir>/layers/`, under a key of
//! everything it was made from: the template folder's digest (every file of it) and the build
//! arguments; and its `FROM` image, checked on reuse (the image's content address, as the
//! image store records it now, so a rebuilt or re-pulled image is a miss). The next build of the
//! same key, in this run or a later one, reuses it. A build never reuses a layer whose inputs
//! changed: a changed file is another digest.
//!
//! Each entry is `<name>-<key12>/` holding the build's directory as the state directory would
//! (`layer`, `build.json`, `complete`), and the `used` and `lock` files of [`lru`]: every
//! process using the layer holds it for as long as it may stack it under a sandbox. The cache
//! is held to `SCENARIO_RUN_LAYER_CACHE_MAX` (a size, default [`DEFAULT_MAX`]; `0` turns the
//! cache off: builds are removed at the end of the run), and to what leaves the host
//! [`lru::KEEP_FREE`]: when a run ends, the least recently used entries that no process holds
//! go first.
//! `scenario-run cache` lists the entries; `scenario-run cache prune` removes every entry no
//! process holds.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use super::layer::Layer;
use super::lru;
use crate::templates::BuildSpec;

/// The cache's size when `SCENARIO_RUN_LAYER_CACHE_MAX` does not say.
pub const DEFAULT_MAX: u64 = 8 << 30;
/// The variable that sets it.
pub const MAX_VAR: &str = "SCENARIO_RUN_LAYER_CACHE_MAX";
/// What makes the layers, part of every key: the tool's version and the format of its builds.
/// Bump the number with any change to how a build runs or what it leaves in a layer, so no
/// layer an older builder made is taken for a newer one's.
const BUILDER: &str = concat!("scenario-run ", env!("CARGO_PKG_VERSION"), " layers 1");
const COMPLETE: &str = "complete";

/// The cache's folder in a state directory.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("layers")
}

/// The cache's size limit, bytes (0: off), from `SCENARIO_RUN_LAYER_CACHE_MAX`.
pub fn max_from_env() -> Result<u64, String> {
    lru::max_from_env(MAX_VAR, DEFAULT_MAX)
}

/// The key of what a build is made from (besides its `FROM` image, checked on reuse).
pub(crate) fn key(spec: &BuildSpec) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    // The builder is an input too: a layer made by another way of building is another key.
    h.update(BUILDER.as_bytes());
    h.update([0]);
    h.update(spec.template.digest.as_bytes());
    for (k, v) in &spec.build_args {
        h.update([0]);
        h.update(k.as_bytes());
        h.update([1]);
        h.update(v.as_bytes());
    }
    format!("{:x}", h.finalize())
}

/// The entry of `name` with `key`.
pub(crate) fn entry(state_dir: &Path, name: &str, key: &str) -> PathBuf {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(64)
        .collect();
    dir(state_dir).join(format!("{clean}-{}", &key[..key.len().min(12)]))
}

/// What identifies a `FROM` image's root filesystem: its content address (a pulled image's
/// manifest digest; an offline one's recipe and what was built) and its directory.
pub(crate) fn image_stamp(digest: &str, image: &Path) -> String {
    format!("{digest} {}", image.display())
}

/// Takes the entry at `at` for this process: its lock held shared, its last use now. None
/// when there is no finished entry, or its `FROM` image changed since (the entry is left for
/// eviction).
pub(crate) fn take(at: &Path) -> Option<Layer> {
    let lock = File::open(at.join(lru::LOCK)).ok()?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared).ok()?;
    // Renamed away for eviction while we waited: the name is gone or is another entry's.
    if !at.join(COMPLETE).exists() {
        return None;
    }
    let text = std::fs::read_to_string(at.join("build.json")).ok()?;
    let mut layer: Layer = serde_json::from_str(&text).ok()?;
    if layer.dir != at || !layer.image.is_dir() {
        return None;
    }
    let (digest, stamp) = layer.image_stamp.clone()?;
    if image_stamp(&digest, &layer.image) != stamp || current_image(&layer.image).as_deref() != Some(digest.as_str()) {
        return None;
    }
    lru::touch(at);
    layer.hold = Some(Arc::new(lock));
    Some(layer)
}

/// The content address of the image whose tree is `image` now, from the record the image
/// store keeps beside it (`image.json`).
fn current_image(image: &Path) -> Option<String> {
    let text = std::fs::read_to_string(image.parent()?.join("image.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("digest")?.as_str().map(str::to_string)
}

/// Moves the finished build `layer` (in this process's own directory) into the cache at `at`
/// and takes it there. When another process stored the same key first, this one's build is
/// removed and theirs taken.
pub(crate) fn store(mut layer: Layer, at: &Path) -> io::Result<Layer> {
    std::fs::create_dir_all(dir_of(at))?;
    let own = layer.dir.clone();
    // Ready before it has the entry's name: a lock, a last use and the record of its new place.
    File::create(own.join(lru::LOCK))?;
    lru::touch(&own);
    let _ = std::fs::remove_file(own.join(crate::owner::FILE));
    layer.dir = at.to_path_buf();
    layer.layer = at.join("layer");
    let _ = std::fs::remove_file(own.join(COMPLETE));
    std::fs::write(own.join("build.json"), serde_json::to_string_pretty(&layer).map_err(io::Error::other)?)?;
    std::fs::write(own.join(COMPLETE), "")?;
    match std::fs::rename(&own, at) {
        Ok(()) => take(at).ok_or_else(|| io::Error::other("the stored build went at once")),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&own);
            take(at).ok_or(e)
        }
    }
}

fn dir_of(at: &Path) -> &Path {
    at.parent().unwrap_or(at)
}

/// One entry, as `scenario-run cache` lists it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub name: String,
    pub digest: String,
    pub bytes: u64,
    pub used: SystemTime,
    /// A process holds it (a run or serve may stack it under a sandbox).
    pub held: bool,
}

impl From<lru::Entry> for Entry {
    fn from(e: lru::Entry) -> Self {
        let text = std::fs::read_to_string(e.path.join("build.json")).ok();
        let layer: Option<Layer> = text.and_then(|t| serde_json::from_str(&t).ok());
        Entry {
            name: layer.as_ref().map_or_else(|| "(unfinished)".into(), |l| l.name.clone()),
            digest: layer.map(|l| l.digest).unwrap_or_default(),
            path: e.path,
            bytes: e.bytes,
            used: e.used,
            held: e.held,
        }
    }
}

/// The entries of the cache in `state_dir`, least recently used first.
pub fn list(state_dir: &Path) -> Vec<Entry> {
    lru::list(&dir(state_dir)).into_iter().map(Entry::from).collect()
}

/// Removes the least recently used entries no process holds until the cache takes at most
/// `max` bytes (less where the host's free space needs it: [`lru::budget`]); returns the
/// entries removed.
pub fn evict(state_dir: &Path, max: u64) -> Vec<Entry> {
    lru::evict(&dir(state_dir), max).into_iter().map(Entry::from).collect()
}

/// Every entry no process holds: removed (`scenario-run cache prune`).
pub fn prune(state_dir: &Path) -> Vec<Entry> {
    lru::prune(&dir(state_dir)).into_iter().map(Entry::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_comes_from_the_variable() {
        std::env::set_var(MAX_VAR, "3MiB");
        assert_eq!(max_from_env(), Ok(3 << 20));
        std::env::set_var(MAX_VAR, "lots");
        assert!(max_from_env().unwrap_err().starts_with("SCENARIO_RUN_LAYER_CACHE_MAX=\"lots\""));
        std::env::remove_var(MAX_VAR);
        assert_eq!(max_from_env(), Ok(DEFAULT_MAX));
    }
}

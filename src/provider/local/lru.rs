//! A cache kept as one folder per entry, held to a size by removing the least recently used
//! entries no process is using: the layer cache ([`super::layer_cache`]) and the package
//! caches of builds ([`super::build_cache`]).
//!
//! Each entry holds a `lock` that every process using it holds shared (`flock`) and a `used`
//! file whose modification time is its last use. An entry goes only under an exclusive lock
//! taken without waiting (so never while anyone uses it), renamed away first (`.evict-…`) so a
//! process that looks for it meanwhile finds nothing rather than half of it.
//!
//! **A cache never fills the disk.** Its size is the smaller of its own limit and what keeps
//! [`KEEP_FREE`] free on its filesystem: a cache that grew past what the host can spare (CI
//! with 20 GiB free beside a Docker engine, every run's builds of freshly named templates each
//! adding its own package cache) took the space the sandboxes' disks needed, and every sandbox
//! of the run was refused.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What a cache leaves free on its filesystem (as much as a sandbox's default disk).
pub const KEEP_FREE: u64 = 10 << 30;
pub(crate) const LOCK: &str = "lock";
const USED: &str = "used";
const EVICTING: &str = ".evict-";

/// One entry of a cache.
#[derive(Debug, Clone)]
pub struct Entry {
    pub path: PathBuf,
    pub bytes: u64,
    pub used: SystemTime,
    /// A process holds it.
    pub held: bool,
}

/// The size a cache of `cached` bytes may keep, with `free` bytes free on its filesystem and
/// its own limit `max`.
pub fn budget(max: u64, cached: u64, free: u64) -> u64 {
    max.min((cached + free).saturating_sub(KEEP_FREE))
}

/// Holds the entry at `at` for this process (shared, waiting for an eviction under way) and
/// records its use now. The lock lasts as long as the file returned.
pub(crate) fn hold(at: &Path) -> std::io::Result<File> {
    let lock = File::options().create(true).append(true).open(at.join(LOCK))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared)?;
    touch(at);
    Ok(lock)
}

/// Records a use of the entry at `at` now.
pub(crate) fn touch(at: &Path) {
    let _ = File::create(at.join(USED)).and_then(|f| f.set_modified(SystemTime::now()));
}

/// The entries of the cache in `dir`, least recently used first.
pub fn list(dir: &Path) -> Vec<Entry> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<Entry> = rd
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.') && e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let path = e.path();
            let used = std::fs::metadata(path.join(USED))
                .or_else(|_| std::fs::metadata(&path))
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            Entry { bytes: du(&path), used, held: try_exclusive(&path).is_none(), path }
        })
        .collect();
    out.sort_by_key(|e| e.used);
    out
}

/// The entry's lock, held exclusively, if no process holds it. (An entry from before locks
/// gets one.)
fn try_exclusive(at: &Path) -> Option<File> {
    let lock = File::options().create(true).append(true).open(at.join(LOCK)).ok()?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(lock)
}

/// Bytes the files under `p` take on disk (not following links).
fn du(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// Removes the entry at `at` if no process holds it. True if removed.
fn remove(at: &Path) -> bool {
    let Some(lock) = try_exclusive(at) else { return false };
    let parent = at.parent().unwrap_or(at);
    let gone = parent.join(format!("{EVICTING}{}-{}", std::process::id(), crate::random::hex(6)));
    if std::fs::rename(at, &gone).is_err() {
        return false;
    }
    drop(lock);
    std::fs::remove_dir_all(&gone).is_ok()
}

/// Removes the least recently used entries of the cache in `dir` that no process holds until
/// it takes at most its [`budget`] under `max`, and what an interrupted eviction left; returns
/// the entries removed.
pub fn evict(dir: &Path, max: u64) -> Vec<Entry> {
    sweep_leftovers(dir);
    let entries = list(dir);
    let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
    let free = rustix::fs::statvfs(dir).map_or(u64::MAX / 4, |v| v.f_bavail.saturating_mul(v.f_frsize));
    let keep = budget(max, total, free);
    let mut removed = Vec::new();
    for e in entries {
        if total <= keep {
            break;
        }
        if !e.held && remove(&e.path) {
            total = total.saturating_sub(e.bytes);
            removed.push(e);
        }
    }
    removed
}

/// Every entry of the cache in `dir` that no process holds: removed.
pub fn prune(dir: &Path) -> Vec<Entry> {
    sweep_leftovers(dir);
    list(dir).into_iter().filter(|e| !e.held && remove(&e.path)).collect()
}

fn sweep_leftovers(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy().starts_with(EVICTING) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A size limit from the variable `var`, or `default`.
pub fn max_from_env(var: &str, default: u64) -> Result<u64, String> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => crate::size::parse(v.trim())
            .map(|n| n as u64)
            .map_err(|e| format!("{var}={v:?}: {e} (a size such as 8GiB, or 0 to keep nothing)")),
        _ => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry named `name` of about `kib` KiB, used `age` seconds ago.
    fn entry_of(dir: &Path, name: &str, kib: usize, age: u64) -> PathBuf {
        let at = dir.join(name);
        std::fs::create_dir_all(at.join("data")).unwrap();
        std::fs::write(at.join("data/blob"), vec![7u8; kib << 10]).unwrap();
        let f = File::create(at.join(USED)).unwrap();
        f.set_modified(SystemTime::now() - std::time::Duration::from_secs(age)).unwrap();
        at
    }

    #[test]
    fn eviction_takes_the_least_recently_used_that_no_one_holds() {
        let d = tempfile::tempdir().unwrap();
        let old = entry_of(d.path(), "old", 512, 300);
        let held = entry_of(d.path(), "held", 512, 200);
        let recent = entry_of(d.path(), "recent", 512, 10);
        let lock = hold(&held).unwrap();
        // hold() is a use: make it the middle one again.
        File::create(held.join(USED))
            .unwrap()
            .set_modified(SystemTime::now() - std::time::Duration::from_secs(200))
            .unwrap();
        let listed = list(d.path());
        assert_eq!(
            listed.iter().map(|e| e.path.clone()).collect::<Vec<_>>(),
            [old.clone(), held.clone(), recent.clone()]
        );
        assert!(listed[1].held && !listed[0].held && !listed[2].held);
        // Room for one entry: the old one goes; the held one stays, so the recent one goes too.
        let gone = evict(d.path(), 600 << 10);
        assert_eq!(gone.iter().map(|e| e.path.clone()).collect::<Vec<_>>(), [old.clone(), recent.clone()]);
        assert!(!old.exists() && held.exists() && !recent.exists());
        drop(lock);
        assert_eq!(prune(d.path()).len(), 1);
        assert!(list(d.path()).is_empty());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "nothing left behind");
    }

    #[test]
    fn a_cache_keeps_the_host_its_free_space() {
        const G: u64 = 1 << 30;
        // Plenty of room: the cache's own limit.
        assert_eq!(budget(8 * G, 2 * G, 100 * G), 8 * G);
        // 20 GiB free and 9 GiB cached: it may keep 19, so its limit of 8.
        assert_eq!(budget(8 * G, 9 * G, 20 * G), 8 * G);
        // 3 GiB free and 9 cached: 2 GiB of it may stay, so that 10 are free after.
        assert_eq!(budget(8 * G, 9 * G, 3 * G), 2 * G);
        // A nearly full host keeps nothing.
        assert_eq!(budget(8 * G, G, G), 0);
    }

    #[test]
    fn the_size_comes_from_the_variable() {
        const VAR: &str = "SCENARIO_RUN_LRU_TEST_MAX";
        std::env::set_var(VAR, "3MiB");
        assert_eq!(max_from_env(VAR, 7), Ok(3 << 20));
        std::env::set_var(VAR, "lots");
        assert!(max_from_env(VAR, 7).unwrap_err().starts_with("SCENARIO_RUN_LRU_TEST_MAX=\"lots\""));
        std::env::remove_var(VAR);
        assert_eq!(max_from_env(VAR, 7), Ok(7));
    }
}

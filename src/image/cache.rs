//! The on-disk cache: content-addressed trees, an index from keys to digests, locks.
//!
//! ```text
//! <cache>/images/<host_base>-<len>/<digest hex>/rootfs/   the tree (an overlayfs lowerdir)
//!                                               image.json   what get() returns besides it
//! <cache>/refs/<sha256 of key>.json                         key -> digest (recipe key, or tag)
//! <cache>/locks/<sha256 of key>.lock                        flock: one builder per key
//! <cache>/tmp/<sha256 of key>.<pid>.<n>/                    a build in progress
//! ```
//!
//! A build happens in `tmp/` and is renamed into `images/` only when complete, so an
//! interrupted build never leaves a half image that a later run trusts. The builder holds
//! the key's lock; a `tmp/` entry whose lock nobody holds is a dead build and is swept.
//! Trees are per id map because their owners are shifted.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::ImageConfig;
use super::idmap::IdMap;

/// What is stored next to a tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub resolved: String,
    pub digest: String,
    pub config: ImageConfig,
    /// Bytes of regular files in the tree.
    pub size: u64,
    /// How long it took to make, seconds.
    pub secs: f64,
}

/// A recorded `key -> digest`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Ref {
    pub key: String,
    pub digest: String,
}

pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

#[derive(Debug, Clone)]
pub(crate) struct Cache {
    pub dir: PathBuf,
    pub ids: IdMap,
}

/// An exclusive flock, released when dropped.
pub(crate) struct Lock {
    _file: File,
}

fn flock(file: &File, how: FlockOperation) -> io::Result<()> {
    loop {
        match rustix::fs::flock(file, how) {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

impl Cache {
    pub fn new(dir: PathBuf, ids: IdMap) -> Self {
        Self { dir, ids }
    }

    fn key_hash(key: &str) -> String {
        sha256_hex(key.as_bytes())
    }

    /// The directory of the image with `digest` (`sha256:…`).
    pub fn image_dir(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.dir.join("images").join(format!("{}-{}", self.ids.host_base, self.ids.len)).join(hex)
    }

    /// The stored image with `digest`, if complete.
    pub fn load(&self, digest: &str) -> Option<(PathBuf, Meta)> {
        let dir = self.image_dir(digest);
        let meta: Meta = serde_json::from_slice(&std::fs::read(dir.join("image.json")).ok()?).ok()?;
        let rootfs = dir.join("rootfs");
        rootfs.is_dir().then_some((rootfs, meta))
    }

    /// The digest recorded for `key`.
    pub fn lookup(&self, key: &str) -> Option<String> {
        let path = self.dir.join("refs").join(format!("{}.json", Self::key_hash(key)));
        let r: Ref = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        (r.key == key).then_some(r.digest)
    }

    /// Records `key -> digest` (written whole, then renamed).
    pub fn record(&self, key: &str, digest: &str) -> io::Result<()> {
        let dir = self.dir.join("refs");
        std::fs::create_dir_all(&dir)?;
        let h = Self::key_hash(key);
        let tmp = dir.join(format!(".{h}.{}", std::process::id()));
        let json =
            serde_json::to_vec(&Ref { key: key.to_string(), digest: digest.to_string() }).map_err(io::Error::other)?;
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, dir.join(format!("{h}.json")))
    }

    fn lock_file(&self, key: &str) -> io::Result<File> {
        let dir = self.dir.join("locks");
        std::fs::create_dir_all(&dir)?;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{}.lock", Self::key_hash(key))))
    }

    /// Waits for the lock of `key` (blocking: call from a blocking thread).
    pub fn lock(&self, key: &str) -> io::Result<Lock> {
        let f = self.lock_file(key)?;
        flock(&f, FlockOperation::LockExclusive)?;
        Ok(Lock { _file: f })
    }

    /// The lock of `key` if nobody holds it now.
    pub fn try_lock(&self, key: &str) -> io::Result<Option<Lock>> {
        let f = self.lock_file(key)?;
        match flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Lock { _file: f })),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A fresh build directory for `key` (the caller holds its lock).
    pub fn temp(&self, key: &str) -> io::Result<PathBuf> {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = self.dir.join("tmp");
        std::fs::create_dir_all(&dir)?;
        let p =
            dir.join(format!("{}.{}.{}", Self::key_hash(key), std::process::id(), N.fetch_add(1, Ordering::SeqCst)));
        std::fs::create_dir(&p)?;
        Ok(p)
    }

    /// Moves a finished build (`tmp` holding `rootfs/`) into place as `digest`, with its
    /// metadata. If another builder got there first, ours is dropped.
    pub fn commit(&self, tmp: &Path, meta: &Meta) -> io::Result<PathBuf> {
        let json = serde_json::to_vec_pretty(meta).map_err(io::Error::other)?;
        std::fs::write(tmp.join("image.json"), json)?;
        let dest = self.image_dir(&meta.digest);
        std::fs::create_dir_all(dest.parent().expect("has a parent"))?;
        // The tree's top must be reachable by the namespace's root (ids shifted), not only by
        // the host's: every directory of ours above it is world-traversable.
        for d in [dest.parent().expect("parent"), tmp] {
            let _ = std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755));
        }
        match std::fs::rename(tmp, &dest) {
            Ok(()) => {}
            Err(_) if self.load(&meta.digest).is_some() => {
                let _ = std::fs::remove_dir_all(tmp);
            }
            Err(e) => return Err(e),
        }
        Ok(dest.join("rootfs"))
    }

    /// Removes build directories whose builder is gone (its key's lock is free).
    pub fn sweep(&self) -> usize {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tmp")) else { return 0 };
        let mut n = 0;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(hash) = name.split('.').next().filter(|h| h.len() == 64) else { continue };
            let Ok(f) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(self.dir.join("locks").join(format!("{hash}.lock")))
            else {
                continue;
            };
            if flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() && std::fs::remove_dir_all(e.path()).is_ok()
            {
                n += 1;
            }
        }
        n
    }
}

/// A reader that hashes what passes through it (sha256), for content addresses.
pub(crate) struct HashReader<R> {
    inner: R,
    hasher: Sha256,
    pub count: u64,
}

impl<R> HashReader<R> {
    pub fn new(inner: R) -> Self {
        Self { inner, hasher: Sha256::new(), count: 0 }
    }

    /// `sha256:<hex>` of everything read so far.
    pub fn digest(&self) -> String {
        format!("sha256:{}", hex::encode(self.hasher.clone().finalize()))
    }
}

impl<R: io::Read> io::Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_is_reported_busy_and_free_once_dropped() {
        let t = tempfile::tempdir().unwrap();
        let c = Cache::new(t.path().to_path_buf(), IdMap::default());
        let held = c.lock("k").unwrap();
        assert!(c.try_lock("k").unwrap().is_none(), "held by another open of the lock file");
        assert!(c.try_lock("other").unwrap().is_some(), "keys are locked apart");
        drop(held);
        assert!(c.try_lock("k").unwrap().is_some());
    }

    #[test]
    fn records_commits_and_sweeps() {
        let t = tempfile::tempdir().unwrap();
        let c = Cache::new(t.path().to_path_buf(), IdMap::default());
        assert_eq!(c.lookup("k"), None);
        let lock = c.lock("k").unwrap();
        let tmp = c.temp("k").unwrap();
        std::fs::create_dir(tmp.join("rootfs")).unwrap();
        // Held lock: not swept.
        assert_eq!(c.sweep(), 0);
        let digest = format!("sha256:{}", "ab".repeat(32));
        let meta =
            Meta { resolved: "r".into(), digest: digest.clone(), config: ImageConfig::default(), size: 1, secs: 0.5 };
        let rootfs = c.commit(&tmp, &meta).unwrap();
        assert!(rootfs.ends_with(format!("images/100000000-65536/{}/rootfs", "ab".repeat(32))));
        c.record("k", &digest).unwrap();
        assert_eq!(c.lookup("k").as_deref(), Some(digest.as_str()));
        assert_eq!(c.load(&digest).unwrap().1.resolved, "r");
        // A dead build (lock free) is swept; a live one is not.
        let dead = c.temp("other").unwrap();
        drop(lock);
        let _live = c.lock("k").unwrap();
        let live = c.temp("k").unwrap();
        assert_eq!(c.sweep(), 1);
        assert!(!dead.exists() && live.exists());
    }
}

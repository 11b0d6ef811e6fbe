//! Package caches that template builds keep on this machine between runs: apt's downloaded
//! archives, npm's cache and pip's cache, so a second build of the same template (the next CI
//! run, the next edit of its Dockerfile) does not download them again.
//!
//! **One template's caches are its own.** A build is as untrusted as a sandbox, and what it
//! writes into a cache is what the next build that reads it installs: none of the three tools
//! checks what it finds there against anything a build cannot also write (apt passes a cached
//! `.deb` of the right size to dpkg without its hash; pip's and npm's caches hold the indexes
//! that name the hashes). A cache shared by every template let one template's `RUN` plant a
//! package in another template's image. So each template (its name and folder) has caches of
//! its own: a build can only reach the caches of builds of the same template, which it could
//! change anyway through its own Dockerfile.
//!
//! Where: `$SCENARIO_RUN_BUILD_CACHE`, else `build-cache` beside the image cache (by default
//! `~/.cache/scenario-run/build-cache`), one folder per id map (`<base>-<len>`; what is in it
//! belongs to the sandboxes' root on the host, `userns::host_id(ids, 0)`) and in it one per
//! template (`<name>-<hash of name and folder>/{apt,npm,pip}`).
//! `SCENARIO_RUN_BUILD_CACHE=off` turns them off (to measure a cold build). Delete the folder
//! to reset them.
//!
//! **They never fill the disk.** Each template's caches are an entry of an [`lru`] cache: a
//! build holds its template's caches while it runs, and after each build the least recently
//! used caches no build holds go until the lot takes at most `SCENARIO_RUN_BUILD_CACHE_MAX`
//! (default [`DEFAULT_MAX`]) and leaves the host [`lru::KEEP_FREE`]. Before this bound, every
//! build of a freshly named template (`serve` names them at random; every CI run builds a
//! dozen) added caches of its own that nothing removed: 9 GiB in a day, and a CI run whose
//! sandboxes were refused for want of disk.
//!
//! How a build uses them, without a Dockerfile saying anything (the Dockerfile stays what the
//! cloud builds): npm's and pip's caches are bound read-write at [`NPM_IN`] and [`PIP_IN`], and
//! a RUN as root gets `npm_config_cache`, `npm_config_prefer_offline` and `PIP_CACHE_DIR`
//! pointing there (both tools are safe for concurrent use). apt takes a lock on its archives
//! directory and fails at once when another apt holds it, so two builds at once must not share
//! it: each build gets its own archives directory, filled with hard links to the cached
//! `.deb`s, bound at `/var/cache/apt/archives` (when the image has one), and what it downloaded
//! is linked back into the cache when the build ends. Nothing of this lands in the layer.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::lru;
use super::userns::{self, IdMap};

/// Where the npm and pip caches are inside a build sandbox.
pub(crate) const NPM_IN: &str = "/var/cache/scenario-run/npm";
pub(crate) const PIP_IN: &str = "/var/cache/scenario-run/pip";
const APT_IN: &str = "/var/cache/apt/archives";
/// What the package caches of all templates may take when `SCENARIO_RUN_BUILD_CACHE_MAX` does
/// not say.
pub const DEFAULT_MAX: u64 = 4 << 30;
/// The variable that sets it.
pub const MAX_VAR: &str = "SCENARIO_RUN_BUILD_CACHE_MAX";

/// The caches of one id map.
#[derive(Debug, Clone)]
pub(crate) struct BuildCache {
    pub dir: PathBuf,
}

impl BuildCache {
    /// The caches for builds next to the image cache `image_cache`, or None when turned off.
    pub(crate) fn from_env(image_cache: &Path, ids: IdMap) -> Option<Self> {
        let root = match std::env::var("SCENARIO_RUN_BUILD_CACHE") {
            Ok(v) if v == "off" => return None,
            Ok(v) if !v.is_empty() => PathBuf::from(v),
            _ if image_cache.file_name().is_some_and(|n| n == "images") => {
                image_cache.parent().unwrap_or(image_cache).join("build-cache")
            }
            _ => image_cache.join("build-cache"),
        };
        Some(Self { dir: root.join(format!("{}-{}", ids.host_base, ids.len)) })
    }

    /// The caches of the template `name` built from `folder` (see the module documentation).
    pub(crate) fn for_template(&self, name: &str, folder: &Path) -> Self {
        use sha2::{Digest, Sha256};
        let folder = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
        let mut h = Sha256::new();
        h.update(name.as_bytes());
        h.update([0]);
        h.update(folder.as_os_str().as_encoded_bytes());
        let safe: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
            .take(64)
            .collect();
        Self { dir: self.dir.join(format!("{safe}-{}", &format!("{:x}", h.finalize())[..16])) }
    }

    /// Makes the cache folders, owned by the sandboxes' root, and holds them for this build
    /// (no eviction removes them while the file returned is open).
    pub(crate) fn prepare(&self, ids: IdMap) -> std::io::Result<std::fs::File> {
        std::fs::create_dir_all(&self.dir)?;
        let held = lru::hold(&self.dir)?;
        let root = userns::host_id(ids, 0);
        for sub in ["apt", "npm", "pip"] {
            let d = self.dir.join(sub);
            std::fs::create_dir_all(&d)?;
            let md = std::fs::metadata(&d)?;
            if md.uid() != root || md.gid() != root {
                std::os::unix::fs::lchown(&d, Some(root), Some(root))?;
            }
        }
        Ok(held)
    }

    /// Removes the least recently used caches of other templates, and of this one when no
    /// build holds it, past `SCENARIO_RUN_BUILD_CACHE_MAX` and the host's free space; returns
    /// how many bytes went.
    pub(crate) fn evict(&self) -> Result<u64, String> {
        let max = lru::max_from_env(MAX_VAR, DEFAULT_MAX)?;
        let all = self.dir.parent().unwrap_or(&self.dir);
        Ok(lru::evict(all, max).iter().map(|e| e.bytes).sum())
    }

    /// The read-write binds of a build in `build_dir` over an image whose root is `image`:
    /// npm, pip, and (if the image has apt) a private archives directory seeded from the cache.
    pub(crate) fn binds(&self, build_dir: &Path, image: &Path, ids: IdMap) -> std::io::Result<Vec<(PathBuf, String)>> {
        let mut binds = vec![(self.dir.join("npm"), NPM_IN.to_string()), (self.dir.join("pip"), PIP_IN.to_string())];
        if image.join(APT_IN.trim_start_matches('/')).is_dir() {
            let own = apt_dir(build_dir);
            std::fs::create_dir_all(own.join("partial"))?;
            let root = userns::host_id(ids, 0);
            for d in [&own, &own.join("partial")] {
                std::os::unix::fs::lchown(d, Some(root), Some(root))?;
            }
            for e in std::fs::read_dir(self.dir.join("apt"))?.flatten() {
                let name = e.file_name();
                // An empty .deb is never whole: a download cut short. It is not offered.
                let whole = e.metadata().is_ok_and(|m| m.is_file() && m.len() > 0);
                if whole && name.to_string_lossy().ends_with(".deb") {
                    let _ = place(&e.path(), &own.join(&name));
                }
            }
            binds.push((own, APT_IN.to_string()));
        }
        Ok(binds)
    }

    /// Keeps what the build in `build_dir` downloaded with apt (its `.deb`s not from the cache).
    pub(crate) fn keep_downloads(&self, build_dir: &Path) -> usize {
        let (own, cache) = (apt_dir(build_dir), self.dir.join("apt"));
        let Ok(entries) = std::fs::read_dir(&own) else { return 0 };
        let mut kept = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let fresh = e.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1);
            if !fresh || !name.to_string_lossy().ends_with(".deb") || cache.join(&name).exists() {
                continue;
            }
            // Into the cache under a name of this build's own first: a concurrent build
            // seeding from the cache never links a half-copied file, and two builds keeping
            // the same file never write into each other's.
            static N: AtomicU64 = AtomicU64::new(0);
            let tmp = cache.join(format!(
                ".{}.{}.{}.tmp",
                name.to_string_lossy(),
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            if place(&e.path(), &tmp).is_ok() && std::fs::rename(&tmp, cache.join(&name)).is_ok() {
                kept += 1;
            } else {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        kept
    }

    /// What a RUN as root gets so npm and pip use the caches. (With everything cached, the
    /// one fetch left is the one that stalls: npm gives up on a stalled request after 2 min
    /// instead of 5 and tries it 4 times, so a stuck proxy connection costs minutes, not a
    /// quarter of an hour per attempt.)
    pub(crate) fn env() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("npm_config_cache".to_string(), NPM_IN.to_string()),
            ("npm_config_prefer_offline".to_string(), "true".to_string()),
            ("npm_config_fetch_timeout".to_string(), "120000".to_string()),
            ("npm_config_fetch_retries".to_string(), "4".to_string()),
            ("PIP_CACHE_DIR".to_string(), PIP_IN.to_string()),
        ])
    }
}

/// Puts `from` at `to`, which must not exist: a hard link, or a copy where none can be made
/// (another filesystem). Never opens an existing file for writing: `to` may be another link
/// of `from`'s own inode, and a copy onto it would truncate the cached file for everyone (as
/// `std::fs::copy` over an existing path did, emptying every cached .deb at once).
fn place(from: &Path, to: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(e),
        Err(_) => {
            let mut src = std::fs::File::open(from)?;
            let mut dst = std::fs::OpenOptions::new().write(true).create_new(true).open(to)?;
            std::io::copy(&mut src, &mut dst).map(|_| ()).inspect_err(|_| {
                let _ = std::fs::remove_file(to);
            })
        }
    }
}

fn apt_dir(build_dir: &Path) -> PathBuf {
    build_dir.join("apt-archives")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caller's own ids, so prepare's chown is a no-op in these tests.
    fn own_ids() -> IdMap {
        IdMap { host_base: rustix::process::getuid().as_raw(), len: 65536 }
    }

    /// A cache under `dir` whose apt downloads are `debs` (name, contents), and an image there
    /// that has apt's archives directory.
    fn cache_and_apt_image(dir: &Path, debs: &[(&str, &str)]) -> (BuildCache, PathBuf) {
        let cache = BuildCache { dir: dir.join("cache") };
        std::fs::create_dir_all(cache.dir.join("apt")).unwrap();
        for (name, contents) in debs {
            std::fs::write(cache.dir.join("apt").join(name), contents).unwrap();
        }
        let image = dir.join("image");
        std::fs::create_dir_all(image.join("var/cache/apt/archives")).unwrap();
        (cache, image)
    }

    #[test]
    fn apt_downloads_are_shared_through_the_cache() {
        let t = tempfile::tempdir().unwrap();
        let ids = own_ids();
        let (cache, image) = cache_and_apt_image(t.path(), &[("old_1.0_all.deb", "old")]);
        let build = t.path().join("build");
        let binds = cache.binds(&build, &image, ids).unwrap();
        assert_eq!(binds.last().unwrap().1, "/var/cache/apt/archives");
        let own = &binds.last().unwrap().0;
        assert_eq!(std::fs::read_to_string(own.join("old_1.0_all.deb")).unwrap(), "old");
        std::fs::write(own.join("new_2.0_all.deb"), "new").unwrap();
        std::fs::write(own.join("lock"), "").unwrap();
        assert_eq!(cache.keep_downloads(&build), 1);
        assert_eq!(std::fs::read_to_string(cache.dir.join("apt/new_2.0_all.deb")).unwrap(), "new");
        assert!(!cache.dir.join("apt/lock").exists());
        // An image without apt gets no archives bind.
        let plain = t.path().join("plain");
        std::fs::create_dir_all(&plain).unwrap();
        assert_eq!(cache.binds(&t.path().join("b2"), &plain, ids).unwrap().len(), 2);
    }

    /// Regression: two builds seeding the same archives directory at once (two runs building
    /// one template in one build directory) emptied every cached .deb: the second one's link
    /// failed on the first one's, and its fallback `std::fs::copy` onto that link truncated the
    /// shared inode. Seeding twice, and keeping twice, leaves the cache whole.
    #[test]
    fn seeding_or_keeping_twice_never_empties_the_cache() {
        let t = tempfile::tempdir().unwrap();
        let ids = own_ids();
        let debs = [("pkg_1.0_all.deb", "package bytes"), ("cut_1.0_all.deb", "")];
        let (cache, image) = cache_and_apt_image(t.path(), &debs);
        let build = t.path().join("build");
        cache.binds(&build, &image, ids).unwrap();
        cache.binds(&build, &image, ids).unwrap();
        assert_eq!(std::fs::read_to_string(cache.dir.join("apt/pkg_1.0_all.deb")).unwrap(), "package bytes");
        let own = apt_dir(&build);
        assert_eq!(std::fs::read_to_string(own.join("pkg_1.0_all.deb")).unwrap(), "package bytes");
        assert!(!own.join("cut_1.0_all.deb").exists(), "an empty .deb is not offered");
        // Two builds keeping the same new download: the cache has it whole, no temporaries.
        for b in ["b1", "b2"] {
            let d = apt_dir(&t.path().join(b));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("new_2.0_all.deb"), format!("new from {b}")).unwrap();
        }
        assert_eq!(cache.keep_downloads(&t.path().join("b1")), 1);
        assert_eq!(cache.keep_downloads(&t.path().join("b2")), 0, "already kept");
        assert_eq!(std::fs::read_to_string(cache.dir.join("apt/new_2.0_all.deb")).unwrap(), "new from b1");
        let tmps: Vec<_> = std::fs::read_dir(cache.dir.join("apt"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(tmps.is_empty(), "{tmps:?}");
    }

    #[test]
    fn the_cache_sits_beside_the_image_cache_unless_told() {
        let ids = IdMap { host_base: 100000000, len: 65536 };
        if std::env::var_os("SCENARIO_RUN_BUILD_CACHE").is_some() {
            return;
        }
        let c = BuildCache::from_env(Path::new("/c/scenario-run/images"), ids).unwrap();
        assert_eq!(c.dir, Path::new("/c/scenario-run/build-cache/100000000-65536"));
        let c = BuildCache::from_env(Path::new("/elsewhere"), ids).unwrap();
        assert_eq!(c.dir, Path::new("/elsewhere/build-cache/100000000-65536"));
    }
}

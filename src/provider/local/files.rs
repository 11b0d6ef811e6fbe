//! Files of a sandbox, reached from the host.
//!
//! We are root, so a namespaced sandbox's filesystem is reachable at `/proc/<pid1>/root`. But
//! walking `/proc/<pid1>/root/<path>` with ordinary calls would resolve *absolute symlinks the
//! sandbox made* against the host's root (a sandbox could plant `/home/user/x -> /etc/shadow`
//! and have us write the host's file). So every path is resolved with
//! `openat2(RESOLVE_IN_ROOT)` relative to a descriptor of that root, which treats the sandbox
//! root as `/` for `..` and for symlinks; operations on a final component (stat, mkdir,
//! rename, unlink) use the `*at` calls on its parent's descriptor and never follow it.
//!
//! Without isolation the root is the host's `/`, and `/home/user` and `/tmp` (and what is
//! under them) are rewritten to the sandbox's own directories.
//!
//! In an isolated sandbox every operation runs with the file-system ids of the sandbox user
//! it acts for (`setfsuid`/`setfsgid` on the calling thread, mapped to the host range of the
//! sandbox's user namespace): permissions are checked as that user, and what it creates is
//! owned by it, as if the user had done it inside (E2B's envd does the same for `user`).
//!
//! All functions here block; the provider calls them through `spawn_blocking`.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use super::enter::Identity;
use super::sys;
use super::userns::{self, IdMap};
use crate::provider::{ErrorKind, FileEntry, ProviderError, Result};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

pub(crate) const HOME: &str = crate::provider::SANDBOX_HOME;

/// How the provider reaches a sandbox's root.
#[derive(Debug, Clone)]
pub(crate) enum Root {
    /// Through `/proc/<pid1>/root`, acting as `who`.
    Proc { pid1: u32, ids: IdMap, who: Identity },
    /// The host root with `/home/user` and `/tmp` rewritten.
    Plain { home: PathBuf, tmp: PathBuf },
}

/// Absolute, `.`/`..`-free sandbox paths: one rule for every provider.
pub(crate) use crate::provider::normalize_path as normalize;

impl Root {
    /// The host-side view of absolute sandbox path `abs` for a sandbox without isolation.
    pub(crate) fn plain_path(home: &std::path::Path, tmp: &std::path::Path, abs: &str) -> PathBuf {
        for (prefix, dir) in [(HOME, home), ("/tmp", tmp)] {
            if abs == prefix {
                return dir.to_path_buf();
            }
            if let Some(rest) = abs.strip_prefix(prefix).and_then(|r| r.strip_prefix('/')) {
                return dir.join(rest);
            }
        }
        PathBuf::from(abs)
    }

    /// A descriptor of the root and the path relative to it.
    fn resolve(&self, abs: &str) -> Result<(OwnedFd, String)> {
        let (root, rel) = match self {
            Root::Proc { pid1, .. } => (format!("/proc/{pid1}/root"), abs.trim_start_matches('/').to_string()),
            Root::Plain { home, tmp } => {
                let p = Self::plain_path(home, tmp, abs);
                ("/".to_string(), p.to_string_lossy().trim_start_matches('/').to_string())
            }
        };
        let fd = rustix::fs::open(root.as_str(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|_| ProviderError::infra("sandbox is not running"))?;
        Ok((fd, rel))
    }

    /// Acts as the sandbox user for the rest of the calling scope (isolated sandboxes only).
    fn as_user(&self) -> Option<FsIds> {
        match self {
            // The sandbox's root: the provider's own rights. A host process with a mapped
            // file-system id has no capabilities at all, so it could not act as root inside;
            // what it writes so is given to its user afterwards (`write_file_as`). Paths are
            // resolved in the sandbox's root all the same.
            Root::Proc { who, .. } if who.uid == 0 => None,
            Root::Proc { ids, who, .. } => {
                Some(FsIds::set(userns::host_id(*ids, who.uid), userns::host_id(*ids, who.gid)))
            }
            Root::Plain { .. } => None,
        }
    }

    /// Reads a file with the provider's own rights (for the sandbox's `/etc/passwd`), up to
    /// 1 MiB.
    pub(crate) fn read_as_host(&self, abs: &str) -> Result<Vec<u8>> {
        let f = self.open_regular(abs, libc::O_RDONLY, 0)?;
        read_up_to(f, abs, 1 << 20)
    }

    /// Opens `abs` for its content (`flags`: how), refusing what is not a regular file. The
    /// open never waits: `O_NONBLOCK` makes a FIFO open at once (for reading), or fail with
    /// `ENXIO` (for writing, without a reader), and it is refused by its type before a byte
    /// moves; a sandbox can plant one (or a link to `/dev/zero`) wherever a file is expected.
    fn open_regular(&self, abs: &str, flags: i32, mode: u32) -> Result<std::fs::File> {
        let fd = match self.open(abs, flags | libc::O_NONBLOCK, mode) {
            Ok(fd) => fd,
            Err(e) if e.message.starts_with("no such device or address") => {
                return Err(crate::provider::not_regular("a FIFO", abs))
            }
            Err(e) => return Err(e),
        };
        let st = fstatat(fd.as_fd(), c"", AtFlags::EMPTY_PATH).map_err(|e| fs_err(e, abs))?;
        match crate::provider::special_kind(st.st_mode) {
            None => {}
            Some("a directory") => return Err(fs_err(io::Error::from_raw_os_error(libc::EISDIR), abs)),
            Some(what) => return Err(crate::provider::not_regular(what, abs)),
        }
        // A regular file: back to ordinary blocking I/O.
        let f = std::fs::File::from(fd);
        let fl = rustix::fs::fcntl_getfl(&f).map_err(|e| fs_err(e.into(), abs))?;
        rustix::fs::fcntl_setfl(&f, fl - OFlags::NONBLOCK).map_err(|e| fs_err(e.into(), abs))?;
        Ok(f)
    }

    fn open(&self, abs: &str, flags: i32, mode: u32) -> Result<OwnedFd> {
        let (root, rel) = self.resolve(abs)?;
        sys::open_in_root(root.as_fd(), &rel, flags, mode).map_err(|e| fs_err(e, abs))
    }

    /// The parent directory of `abs` (opened) and the final component.
    fn parent(&self, abs: &str) -> Result<(OwnedFd, CString)> {
        let (root, rel) = self.resolve(abs)?;
        let (dir, name) = match rel.rfind('/') {
            Some(i) => (&rel[..i], &rel[i + 1..]),
            None => ("", rel.as_str()),
        };
        if name.is_empty() {
            return Err(ProviderError::invalid(format!("not a file path: {abs}")));
        }
        // Errors name the path the caller asked about, not its parent.
        let fd =
            sys::open_in_root(root.as_fd(), dir, libc::O_PATH | libc::O_DIRECTORY, 0).map_err(|e| fs_err(e, abs))?;
        Ok((fd, CString::new(name).expect("no NUL")))
    }

    pub(crate) fn stat(&self, abs: &str) -> Result<FileEntry> {
        let _as = self.as_user();
        if abs == "/" {
            let fd = self.open("/", libc::O_PATH | libc::O_DIRECTORY, 0)?;
            let st = fstatat(fd.as_fd(), c"", AtFlags::EMPTY_PATH).map_err(|e| fs_err(e, abs))?;
            return Ok(entry(abs, &st));
        }
        let (dir, name) = self.parent(abs)?;
        let st = fstatat(dir.as_fd(), &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| fs_err(e, abs))?;
        Ok(entry(abs, &st))
    }

    /// The target stored in the symbolic link `abs` (`EINVAL`, "invalid argument", if it is
    /// no link).
    pub(crate) fn read_link(&self, abs: &str) -> Result<String> {
        let _as = self.as_user();
        let (dir, name) = self.parent(abs)?;
        let target = rustix::fs::readlinkat(dir.as_fd(), &name, Vec::new()).map_err(|e| fs_err(e.into(), abs))?;
        Ok(String::from_utf8_lossy(target.as_bytes()).into_owned())
    }

    /// The `user.e2b.*` extended attributes of `abs` (a final symlink followed), without the
    /// prefix: envd's file metadata.
    pub(crate) fn metadata(&self, abs: &str) -> Result<std::collections::BTreeMap<String, String>> {
        let _as = self.as_user();
        let fd = self.open(abs, libc::O_PATH, 0)?;
        let magic = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
        let mut out = std::collections::BTreeMap::new();
        for name in xattr_names(&magic).map_err(|e| fs_err(e, abs))? {
            let Some(key) = name.strip_prefix(METADATA_PREFIX) else { continue };
            let c = CString::new(name.as_str()).expect("no NUL in xattr names");
            match xattr_get(&magic, &c) {
                Ok(v) => {
                    out.insert(key.to_string(), String::from_utf8_lossy(&v).into_owned());
                }
                // Removed while we read.
                Err(Errno::NODATA) => {}
                Err(e) => return Err(fs_err(e.into(), abs)),
            }
        }
        Ok(out)
    }

    /// Makes `metadata` the `user.e2b.*` attributes of `abs`: those not in it are removed.
    pub(crate) fn set_metadata(&self, abs: &str, metadata: &std::collections::BTreeMap<String, String>) -> Result<()> {
        let _as = self.as_user();
        let fd = self.open(abs, libc::O_PATH, 0)?;
        let magic = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL");
        for name in xattr_names(&magic).map_err(|e| fs_err(e, abs))? {
            let stale = name.strip_prefix(METADATA_PREFIX).is_some_and(|k| !metadata.contains_key(k));
            if stale {
                let c = CString::new(name.as_str()).expect("no NUL in xattr names");
                match rustix::fs::removexattr(&magic, &c) {
                    Ok(()) | Err(Errno::NODATA) => {}
                    Err(e) => return Err(fs_err(e.into(), abs)),
                }
            }
        }
        for (k, v) in metadata {
            let name = CString::new(format!("{METADATA_PREFIX}{k}"))
                .map_err(|_| ProviderError::invalid(format!("invalid metadata key {k:?}")))?;
            rustix::fs::setxattr(&magic, &name, v.as_bytes(), rustix::fs::XattrFlags::empty())
                .map_err(|e| fs_err(e.into(), abs))?;
        }
        Ok(())
    }

    /// Gives `abs` (not following a final symlink) to `who`, with the provider's own rights,
    /// as envd gives every upload to the user it was made as.
    pub(crate) fn chown(&self, abs: &str, who: &Identity) -> Result<()> {
        let Root::Proc { ids, .. } = self else {
            // Without isolation files belong to whoever runs the provider.
            return Ok(());
        };
        let (dir, name) = self.parent(abs)?;
        let uid = rustix::fs::Uid::from_raw(userns::host_id(*ids, who.uid));
        let gid = rustix::fs::Gid::from_raw(userns::host_id(*ids, who.gid));
        rustix::fs::chownat(dir.as_fd(), &name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_err(e.into(), abs))
    }

    /// The same root, acting as `who` (isolated sandboxes; without isolation there is only
    /// the invoking user).
    pub(crate) fn acting_as(&self, who: Identity) -> Root {
        match self {
            Root::Proc { pid1, ids, .. } => Root::Proc { pid1: *pid1, ids: *ids, who },
            plain => plain.clone(),
        }
    }

    /// Opens the device `abs` of the sandbox (its terminal multiplexer) with the provider's
    /// own rights.
    pub(crate) fn open_device(&self, abs: &str, flags: i32) -> Result<OwnedFd> {
        self.open(abs, flags, 0)
    }

    /// Opens directory `abs` as the sandbox user, `O_PATH` (for watching it).
    pub(crate) fn open_dir(&self, abs: &str) -> Result<OwnedFd> {
        let _as = self.as_user();
        let fd = self.open(abs, libc::O_PATH, 0)?;
        let st = fstatat(fd.as_fd(), c"", AtFlags::EMPTY_PATH).map_err(|e| fs_err(e, abs))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(ProviderError::invalid(format!("not a directory: {abs}")));
        }
        Ok(fd)
    }

    /// Runs `f` as the sandbox user (its file-system ids), for calls that check permissions
    /// against the caller (adding an inotify watch needs read access).
    pub(crate) fn as_sandbox_user<T>(&self, f: impl FnOnce() -> T) -> T {
        let _as = self.as_user();
        f()
    }

    pub(crate) fn exists(&self, abs: &str) -> Result<bool> {
        match self.stat(abs) {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(false),
            Err(e) if e.message.starts_with("not a directory") => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Opens regular file `abs` as this root's user, and its length then.
    pub(crate) fn open_read(&self, abs: &str) -> Result<(std::fs::File, u64)> {
        let _as = self.as_user();
        let f = self.open_regular(abs, libc::O_RDONLY, 0)?;
        let len = f.metadata().map_err(|e| fs_err(e, abs))?.len();
        Ok((f, len))
    }

    /// The content of regular file `abs`, up to [`MAX_FILE_READ`](crate::provider::MAX_FILE_READ).
    pub(crate) fn read(&self, abs: &str) -> Result<Vec<u8>> {
        let _as = self.as_user();
        let f = self.open_regular(abs, libc::O_RDONLY, 0)?;
        read_up_to(f, abs, crate::provider::MAX_FILE_READ)
    }

    pub(crate) fn write(&self, abs: &str, data: &[u8], mode: Option<u32>) -> Result<FileEntry> {
        let _as = self.as_user();
        if abs == "/" {
            return Err(fs_err(io::Error::from_raw_os_error(libc::EISDIR), abs));
        }
        let (parent, _) = split(abs)?;
        self.mkdir_p(parent)?;
        // Truncated only once it is known to be a regular file (and only if it holds
        // anything: a watcher sees one change for a new file's write, as with O_TRUNC).
        let mut f = self.open_regular(abs, libc::O_WRONLY | libc::O_CREAT, mode.unwrap_or(0o644))?;
        if f.metadata().map_err(|e| fs_err(e, abs))?.len() > 0 {
            f.set_len(0).map_err(|e| fs_err(e, abs))?;
        }
        f.write_all(data).map_err(|e| fs_err(e, abs))?;
        if let Some(m) = mode {
            use std::os::unix::fs::PermissionsExt;
            f.set_permissions(std::fs::Permissions::from_mode(m & 0o7777)).map_err(|e| fs_err(e, abs))?;
        }
        drop(f);
        self.stat(abs)
    }

    pub(crate) fn mkdir_p(&self, abs: &str) -> Result<()> {
        let _as = self.as_user();
        // Walk the host-side path (rewritten without isolation), so that the directories
        // created are the sandbox's, never the host's.
        let (root, rel) = self.resolve(abs)?;
        let mut cur = String::new();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            let dir = sys::open_in_root(root.as_fd(), &cur, libc::O_PATH | libc::O_DIRECTORY, 0)
                .map_err(|e| fs_err(e, abs))?;
            let name = CString::new(part).expect("no NUL");
            match rustix::fs::mkdirat(dir.as_fd(), &name, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(fs_err(e.into(), abs)),
            }
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(part);
        }
        Ok(())
    }

    pub(crate) fn make_dir(&self, abs: &str) -> Result<FileEntry> {
        let _as = self.as_user();
        self.mkdir_p(abs)?;
        // Follow a final symlink to a directory for the check, like `mkdir -p` does.
        let fd = self.open(abs, libc::O_PATH, 0)?;
        let st = fstatat(fd.as_fd(), c"", AtFlags::EMPTY_PATH).map_err(|e| fs_err(e, abs))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            return Err(fs_err(io::Error::from_raw_os_error(libc::EEXIST), abs));
        }
        self.stat(abs)
    }

    pub(crate) fn list(&self, abs: &str) -> Result<Vec<FileEntry>> {
        let _as = self.as_user();
        let fd = self.open(abs, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let rd = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| fs_err(e, abs))?;
        let mut out = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| fs_err(e, abs))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            let c = CString::new(name).expect("no NUL in names");
            let path = if abs == "/" { format!("/{name}") } else { format!("{abs}/{name}") };
            match fstatat(fd.as_fd(), &c, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => out.push(entry(&path, &st)),
                // Removed while we listed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(fs_err(e, &path)),
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub(crate) fn rename(&self, from: &str, to: &str) -> Result<FileEntry> {
        let _as = self.as_user();
        let (fd1, n1) = self.parent(from)?;
        let (fd2, n2) = self.parent(to)?;
        if let Err(e) = rustix::fs::renameat(fd1.as_fd(), &n1, fd2.as_fd(), &n2) {
            let path = if e == Errno::NOENT { from } else { to };
            return Err(fs_err(e.into(), path));
        }
        self.stat(to)
    }

    pub(crate) fn remove(&self, abs: &str) -> Result<()> {
        let _as = self.as_user();
        if abs == "/" {
            return Err(ProviderError::invalid("cannot remove /"));
        }
        let (dir, name) = self.parent(abs)?;
        let st = fstatat(dir.as_fd(), &name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| fs_err(e, abs))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            // std's remove_dir_all never follows symlinks below the directory; the final
            // component is looked up in the parent we resolved inside the sandbox.
            let p = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), name.to_str().expect("utf-8"));
            std::fs::remove_dir_all(p).map_err(|e| fs_err(e, abs))
        } else {
            rustix::fs::unlinkat(dir.as_fd(), &name, AtFlags::empty()).map_err(|e| fs_err(e.into(), abs))
        }
    }
}

/// The calling thread's file-system ids, switched until dropped. (`setfsuid` is per thread;
/// switching away from 0 also clears the thread's file capabilities, and switching back
/// restores them.)
pub(crate) struct FsIds {
    uid: u32,
    gid: u32,
}

impl FsIds {
    fn set(uid: u32, gid: u32) -> Self {
        // SAFETY: per-thread credential calls with plain integers; they return the old value.
        // (rustix has no setfsuid/setfsgid.)
        unsafe {
            let gid_before = libc::setfsgid(gid) as u32;
            let uid_before = libc::setfsuid(uid) as u32;
            Self { uid: uid_before, gid: gid_before }
        }
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        // SAFETY: as in `set`; the uid first, so the capabilities to change the gid are back.
        unsafe {
            libc::setfsuid(self.uid);
            libc::setfsgid(self.gid);
        }
    }
}

/// Reads `f` (regular file `abs`) to its end, refusing it when it holds more than `limit`
/// bytes: by its size before reading, or when it grew past the limit while read.
fn read_up_to(f: std::fs::File, abs: &str, limit: u64) -> Result<Vec<u8>> {
    let too_large = || {
        if limit == crate::provider::MAX_FILE_READ {
            crate::provider::file_too_large(abs)
        } else {
            ProviderError::invalid(format!("is larger than {}: {abs}", crate::size::human(limit)))
        }
    };
    let size = f.metadata().map_err(|e| fs_err(e, abs))?.len();
    if size > limit {
        return Err(too_large());
    }
    let mut data = Vec::with_capacity(size as usize);
    f.take(limit + 1).read_to_end(&mut data).map_err(|e| fs_err(e, abs))?;
    if data.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(data)
}

fn split(abs: &str) -> Result<(&str, &str)> {
    match abs.rfind('/') {
        Some(0) if abs.len() > 1 => Ok(("/", &abs[1..])),
        Some(i) if i + 1 < abs.len() => Ok((&abs[..i], &abs[i + 1..])),
        _ => Err(ProviderError::invalid(format!("not a file path: {abs}"))),
    }
}

fn fstatat(dir: BorrowedFd<'_>, name: &std::ffi::CStr, flags: AtFlags) -> io::Result<Stat> {
    Ok(rustix::fs::statat(dir, name, flags)?)
}

fn entry(abs: &str, st: &Stat) -> FileEntry {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        _ => "file",
    };
    let name = if abs == "/" { "/".to_string() } else { abs.rsplit('/').next().unwrap_or(abs).to_string() };
    FileEntry {
        name,
        path: abs.to_string(),
        kind: kind.to_string(),
        size: st.st_size as u64,
        mode: st.st_mode & 0o7777,
        modified: st.st_mtime.max(0) as u64,
    }
}

/// The extended attribute namespace of envd's file metadata.
const METADATA_PREFIX: &str = "user.e2b.";

/// The names of the extended attributes of `path`.
fn xattr_names(path: &CString) -> io::Result<Vec<String>> {
    let mut buf = vec![0u8; 4096];
    loop {
        match rustix::fs::listxattr(path, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                break;
            }
            Err(Errno::RANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            // A filesystem without extended attributes has none.
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(buf.split(|b| *b == 0).filter(|n| !n.is_empty()).map(|n| String::from_utf8_lossy(n).into_owned()).collect())
}

/// The value of extended attribute `name` of `path`.
fn xattr_get(path: &CString, name: &CString) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; 4096];
    loop {
        match rustix::fs::getxattr(path, name, &mut buf[..]) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(Errno::RANGE) if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            Err(e) => return Err(e),
        }
    }
}

/// Maps a filesystem error on `path` to a provider error: "no such file or directory: /x".
pub(crate) fn fs_err(e: io::Error, path: &str) -> ProviderError {
    let kind = match e.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(
            libc::ENOTDIR
            | libc::EISDIR
            | libc::EEXIST
            | libc::ENOTEMPTY
            | libc::EACCES
            | libc::EPERM
            | libc::EXDEV
            | libc::ELOOP
            | libc::EINVAL
            | libc::ENAMETOOLONG
            | libc::EROFS
            | libc::EBUSY,
        ) => ErrorKind::Invalid,
        _ => ErrorKind::Infra,
    };
    ProviderError::new(kind, format!("{}: {path}", sys::errno_text(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_paths_are_rewritten() {
        let (h, t) = (std::path::Path::new("/s/home"), std::path::Path::new("/s/tmp"));
        assert_eq!(Root::plain_path(h, t, "/home/user"), PathBuf::from("/s/home"));
        assert_eq!(Root::plain_path(h, t, "/home/user/a/b"), PathBuf::from("/s/home/a/b"));
        assert_eq!(Root::plain_path(h, t, "/tmp/x"), PathBuf::from("/s/tmp/x"));
        assert_eq!(Root::plain_path(h, t, "/tmpfoo"), PathBuf::from("/tmpfoo"));
        assert_eq!(Root::plain_path(h, t, "/opt/x"), PathBuf::from("/opt/x"));
    }

    #[test]
    fn errors_map_to_kinds_and_lowercase_messages() {
        let e = fs_err(io::Error::from_raw_os_error(libc::ENOENT), "/home/user/x");
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(e.message, "no such file or directory: /home/user/x");
        assert_eq!(fs_err(io::Error::from_raw_os_error(libc::EISDIR), "/a").kind, ErrorKind::Invalid);
    }

    #[test]
    fn plain_root_roundtrip() {
        let d = tempfile::tempdir().unwrap();
        let root = Root::Plain { home: d.path().join("home"), tmp: d.path().join("tmp") };
        root.mkdir_p("/home/user").unwrap();
        root.write("/home/user/a/b.txt", b"hi", Some(0o600)).unwrap();
        assert_eq!(std::fs::read(d.path().join("home/a/b.txt")).unwrap(), b"hi");
        let st = root.stat("/home/user/a/b.txt").unwrap();
        assert_eq!((st.kind.as_str(), st.size, st.mode), ("file", 2, 0o600));
        assert_eq!(root.list("/home/user/a").unwrap().len(), 1);
        root.rename("/home/user/a/b.txt", "/home/user/c.txt").unwrap();
        assert!(!root.exists("/home/user/a/b.txt").unwrap());
        root.remove("/home/user/a").unwrap();
        assert_eq!(root.read("/home/user/a/x").unwrap_err().kind, ErrorKind::NotFound);
    }
}

//! Directory-descriptor file operations that never follow a symlink and never leave a tree.
//!
//! Image trees are written from untrusted input (registry layers) and later edited (the
//! `user` account): a symlink planted by one layer, such as `etc -> /etc` or `x -> ../../..`,
//! must not redirect a later write onto the host. Every path here is resolved relative to a
//! descriptor of the tree with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, and the
//! final component is created with `O_EXCL`/`O_NOFOLLOW` or changed with
//! `AT_SYMLINK_NOFOLLOW`, so the kernel refuses what a path string check could miss.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::fs::{Gid, Uid};
use rustix::io::Errno;

/// The path as the kernel takes it; a NUL inside is refused with a message of ours.
fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a path contains a NUL byte"))
}

/// `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
fn open_beneath(dir: BorrowedFd<'_>, rel: &[u8], flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    let path = cstr(if rel.is_empty() { b"." } else { rel })?;
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    loop {
        match rustix::fs::openat2(dir, &path, flags | OFlags::CLOEXEC, Mode::from_raw_mode(mode), resolve) {
            Err(Errno::AGAIN | Errno::INTR) => continue,
            r => return Ok(r?),
        }
    }
}

/// A directory of a tree, held open.
#[derive(Debug)]
pub(crate) struct Dir {
    fd: OwnedFd,
}

/// What `lstat` says about a name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Stat {
    pub fn is_dir(&self) -> bool {
        FileType::from_raw_mode(self.mode) == FileType::Directory
    }
}

impl Dir {
    /// The top of a tree (the path is trusted: we made it).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str().as_bytes())?;
        let fd = rustix::fs::open(&c, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(Dir { fd })
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The directory at `rel` below this one, without following any symlink.
    pub fn sub(&self, rel: &[u8]) -> io::Result<Dir> {
        open_beneath(self.fd(), rel, OFlags::PATH | OFlags::DIRECTORY, 0).map(|fd| Dir { fd })
    }

    /// A path naming this directory that the kernel resolves to it (for std's `fs` calls
    /// whose final component is then opened without following symlinks).
    pub fn proc_path(&self, name: &[u8]) -> PathBuf {
        let mut p = PathBuf::from(format!("/proc/self/fd/{}", self.raw()));
        if !name.is_empty() {
            p.push(OsStr::from_bytes(name));
        }
        p
    }

    /// `lstat` of `name` in this directory; None if it does not exist.
    pub fn lstat(&self, name: &[u8]) -> io::Result<Option<Stat>> {
        let c = cstr(name)?;
        match rustix::fs::statat(self.fd(), &c, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(Stat { mode: st.st_mode, uid: st.st_uid, gid: st.st_gid })),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes `name` (a whole tree if it is a directory), never following symlinks.
    pub fn remove(&self, name: &[u8]) -> io::Result<()> {
        match self.lstat(name)? {
            None => Ok(()),
            // std's remove_dir_all opens every level with O_NOFOLLOW (CVE-2022-21658).
            Some(st) if st.is_dir() => std::fs::remove_dir_all(self.proc_path(name)),
            Some(_) => Ok(rustix::fs::unlinkat(self.fd(), &cstr(name)?, AtFlags::empty())?),
        }
    }

    /// Names in this directory.
    pub fn names(&self) -> io::Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(self.proc_path(b""))? {
            out.push(e?.file_name().as_bytes().to_vec());
        }
        Ok(out)
    }

    /// `mkdirat`; false if something is there already.
    pub fn mkdir(&self, name: &[u8], mode: u32) -> io::Result<bool> {
        match rustix::fs::mkdirat(self.fd(), &cstr(name)?, Mode::from_raw_mode(mode)) {
            Ok(()) => Ok(true),
            Err(Errno::EXIST) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates the regular file `name` (which must not exist) for writing.
    pub fn create(&self, name: &[u8]) -> io::Result<std::fs::File> {
        let flags = OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(self.fd(), &cstr(name)?, flags, Mode::from_raw_mode(0o600))?;
        Ok(std::fs::File::from(fd))
    }

    /// Opens the regular file `name` for reading, refusing a symlink.
    pub fn open_file(&self, name: &[u8]) -> io::Result<std::fs::File> {
        let fd = open_beneath(self.fd(), name, OFlags::RDONLY | OFlags::NOFOLLOW, 0)?;
        Ok(std::fs::File::from(fd))
    }

    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::symlinkat(&cstr(target)?, self.fd(), &cstr(name)?)?)
    }

    /// A hard link `name` to `target_name` in `target_dir` (a symlink is linked, not followed).
    pub fn link_from(&self, target_dir: &Dir, target_name: &[u8], name: &[u8]) -> io::Result<()> {
        // No AT_SYMLINK_FOLLOW: a symlink target is not followed.
        let (t, n) = (cstr(target_name)?, cstr(name)?);
        Ok(rustix::fs::linkat(target_dir.fd(), &t, self.fd(), &n, AtFlags::empty())?)
    }

    pub fn mkfifo(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let mode = Mode::from_raw_mode(mode & 0o777);
        Ok(rustix::fs::mknodat(self.fd(), &cstr(name)?, FileType::Fifo, mode, 0)?)
    }

    /// `lchown` of `name` (empty: this directory itself).
    pub fn chown(&self, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
        let mut flags = AtFlags::SYMLINK_NOFOLLOW;
        if name.is_empty() {
            flags |= AtFlags::EMPTY_PATH;
        }
        let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        Ok(rustix::fs::chownat(self.fd(), &cstr(name)?, uid, gid, flags)?)
    }

    /// chmod of a directory or fifo `name` known not to be a symlink (empty: this directory).
    pub fn chmod(&self, name: &[u8], mode: u32) -> io::Result<()> {
        std::fs::set_permissions(self.proc_path(name), std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
    }

    /// Sets the modification (and access) time of `name` without following a symlink.
    pub fn set_mtime(&self, name: &[u8], secs: i64) -> io::Result<()> {
        let t = Timespec { tv_sec: secs, tv_nsec: 0 };
        let times = Timestamps { last_access: t, last_modification: t };
        Ok(rustix::fs::utimensat(self.fd(), &cstr(name)?, &times, AtFlags::SYMLINK_NOFOLLOW)?)
    }

    /// Renames `from` to `to` within this directory (replacing `to`).
    pub fn rename(&self, from: &[u8], to: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::renameat(self.fd(), &cstr(from)?, self.fd(), &cstr(to)?)?)
    }

    /// Writes `data` as `name` (owner and mode given), through a temporary name and a rename,
    /// so a symlink at `name` is replaced, not followed.
    pub fn write_file(&self, name: &[u8], data: &[u8], uid: u32, gid: u32, mode: u32) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::PermissionsExt;
        let mut tmp = b".scenario-run-tmp.".to_vec();
        tmp.extend_from_slice(name);
        let _ = self.remove(&tmp);
        let mut f = self.create(&tmp)?;
        f.write_all(data)?;
        std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))?;
        drop(f);
        self.rename(&tmp, name)
    }

    /// Reads the regular file `name`; None if it does not exist.
    pub fn read_file(&self, name: &[u8]) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        match self.open_file(name) {
            Ok(mut f) => {
                let mut v = Vec::new();
                f.read_to_end(&mut v)?;
                Ok(Some(v))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }
}

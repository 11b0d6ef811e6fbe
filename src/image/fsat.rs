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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a path contains a NUL byte"))
}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;
const RESOLVE_BENEATH: u64 = 0x08;

/// `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`.
pub(crate) fn open_beneath(dir: RawFd, rel: &[u8], flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let path = cstr(if rel.is_empty() { b"." } else { rel })?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve: RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: valid C string and a properly sized open_how; the fd is owned below.
        let fd = unsafe {
            libc::syscall(libc::SYS_openat2, dir, path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
        };
        if fd >= 0 {
            // SAFETY: a fresh descriptor.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) && e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
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
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

impl Dir {
    /// The top of a tree (the path is trusted: we made it).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str().as_bytes())?;
        // SAFETY: valid C string; the fd is owned below.
        let fd = check(unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
        // SAFETY: a fresh descriptor.
        Ok(Dir { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The directory at `rel` below this one, without following any symlink.
    pub fn sub(&self, rel: &[u8]) -> io::Result<Dir> {
        open_beneath(self.raw(), rel, libc::O_PATH | libc::O_DIRECTORY, 0).map(|fd| Dir { fd })
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
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid C string and stat buffer.
        let r = unsafe { libc::fstatat(self.raw(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::NotFound { Ok(None) } else { Err(e) };
        }
        Ok(Some(Stat { mode: st.st_mode, uid: st.st_uid, gid: st.st_gid }))
    }

    /// Removes `name` (a whole tree if it is a directory), never following symlinks.
    pub fn remove(&self, name: &[u8]) -> io::Result<()> {
        match self.lstat(name)? {
            None => Ok(()),
            // std's remove_dir_all opens every level with O_NOFOLLOW (CVE-2022-21658).
            Some(st) if st.is_dir() => std::fs::remove_dir_all(self.proc_path(name)),
            Some(_) => {
                let c = cstr(name)?;
                // SAFETY: valid C string.
                check(unsafe { libc::unlinkat(self.raw(), c.as_ptr(), 0) }).map(|_| ())
            }
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
        let c = cstr(name)?;
        // SAFETY: valid C string.
        match check(unsafe { libc::mkdirat(self.raw(), c.as_ptr(), mode) }) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Creates the regular file `name` (which must not exist) for writing.
    pub fn create(&self, name: &[u8]) -> io::Result<std::fs::File> {
        let c = cstr(name)?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: valid C string; the fd is owned below.
        let fd = check(unsafe { libc::openat(self.raw(), c.as_ptr(), flags, 0o600) })?;
        // SAFETY: a fresh descriptor.
        Ok(unsafe { std::fs::File::from_raw_fd(fd) })
    }

    /// Opens the regular file `name` for reading, refusing a symlink.
    pub fn open_file(&self, name: &[u8]) -> io::Result<std::fs::File> {
        let fd = open_beneath(self.raw(), name, libc::O_RDONLY | libc::O_NOFOLLOW, 0)?;
        Ok(std::fs::File::from(fd))
    }

    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        let (t, n) = (cstr(target)?, cstr(name)?);
        // SAFETY: valid C strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.raw(), n.as_ptr()) }).map(|_| ())
    }

    /// A hard link `name` to `target_name` in `target_dir` (a symlink is linked, not followed).
    pub fn link_from(&self, target_dir: &Dir, target_name: &[u8], name: &[u8]) -> io::Result<()> {
        let (t, n) = (cstr(target_name)?, cstr(name)?);
        // SAFETY: valid C strings; flags 0 do not follow a symlink target.
        check(unsafe { libc::linkat(target_dir.raw(), t.as_ptr(), self.raw(), n.as_ptr(), 0) }).map(|_| ())
    }

    pub fn mkfifo(&self, name: &[u8], mode: u32) -> io::Result<()> {
        let c = cstr(name)?;
        // SAFETY: valid C string.
        check(unsafe { libc::mknodat(self.raw(), c.as_ptr(), libc::S_IFIFO | (mode & 0o777), 0) }).map(|_| ())
    }

    /// `lchown` of `name` (empty: this directory itself).
    pub fn chown(&self, name: &[u8], uid: u32, gid: u32) -> io::Result<()> {
        let c = cstr(name)?;
        let flags = libc::AT_SYMLINK_NOFOLLOW | if name.is_empty() { libc::AT_EMPTY_PATH } else { 0 };
        // SAFETY: valid C string.
        check(unsafe { libc::fchownat(self.raw(), c.as_ptr(), uid, gid, flags) }).map(|_| ())
    }

    /// chmod of a directory or fifo `name` known not to be a symlink (empty: this directory).
    pub fn chmod(&self, name: &[u8], mode: u32) -> io::Result<()> {
        std::fs::set_permissions(self.proc_path(name), std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
    }

    /// Sets the modification (and access) time of `name` without following a symlink.
    pub fn set_mtime(&self, name: &[u8], secs: i64) -> io::Result<()> {
        let c = cstr(name)?;
        let t = libc::timespec { tv_sec: secs, tv_nsec: 0 };
        let times = [t, t];
        // SAFETY: valid C string and two timespecs.
        check(unsafe { libc::utimensat(self.raw(), c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) }).map(|_| ())
    }

    /// Renames `from` to `to` within this directory (replacing `to`).
    pub fn rename(&self, from: &[u8], to: &[u8]) -> io::Result<()> {
        let (f, t) = (cstr(from)?, cstr(to)?);
        // SAFETY: valid C strings.
        check(unsafe { libc::renameat(self.raw(), f.as_ptr(), self.raw(), t.as_ptr()) }).map(|_| ())
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

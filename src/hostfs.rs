//! The one way host-side code touches a directory that a sandbox (or a client) can write.
//!
//! Rule 1 of the threat model (docs/reference.md, "Threat model"): check and act on the same object. A
//! path a sandbox can change is opened once, beneath a directory descriptor, without following
//! links (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`), and
//! every later action is made on that descriptor, never on the name again: a directory is made
//! with `mkdirat` and its mode set with `fchmod` on the new directory's own descriptor, and a
//! mount attaches a clone of the descriptor's tree (`open_tree`, `move_mount`), not the name. Between a check by name and an
//! action by name, a sandbox sharing the directory swaps in a link to `/`; here there is no
//! second lookup to swap anything under.
//!
//! Only the roots are opened by name: directories the operator configured (`serve
//! --host-volume-prefix`, `--volumes-dir`), which no sandbox can write. `tests/hostfs_rule.rs`
//! keeps path-based `std::fs` calls out of the modules that handle sandbox-writable paths.

use std::ffi::CString;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// A directory held open by descriptor. Cloning shares the descriptor.
#[derive(Clone)]
pub struct HostDir(Arc<Inner>);

struct Inner {
    fd: OwnedFd,
    /// The path it was reached by, for messages and logs only: never opened again.
    shown: PathBuf,
}

/// Why a path beneath a directory could not be opened or made.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    /// A component is not a plain name (`.`, `..`, absolute, empty).
    #[error("not a relative path of plain names")]
    NotPlain,
    /// A component is a symbolic link, or the path would leave the directory.
    #[error("a component is a symbolic link or leaves the directory")]
    Link,
    /// A component is not a directory.
    #[error("a component is not a directory")]
    NotDir,
    /// A component is missing and was not to be made.
    #[error("does not exist")]
    Missing,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_SYMLINKS).union(ResolveFlags::NO_MAGICLINKS);

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW
}

impl HostDir {
    /// Opens a directory the operator named (its links are followed: the operator chose it,
    /// and no sandbox can write the path to it).
    pub fn open_trusted(path: &Path) -> std::io::Result<HostDir> {
        let fd = rustix::fs::open(path, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
        Ok(HostDir(Arc::new(Inner { fd, shown: path.to_path_buf() })))
    }

    /// Makes (with its parents) and opens a directory of the tool's own, such as the named
    /// volumes' directory: it lies outside every sandbox.
    pub fn create_trusted(path: &Path) -> std::io::Result<HostDir> {
        // trusted: the tool's own state directory, which no sandbox can write.
        std::fs::create_dir_all(path)?;
        Self::open_trusted(path)
    }

    /// The directory at `rel` beneath this one, reached without following any link and never
    /// leaving it. With `make`, missing components are made with `mkdirat` and given that mode
    /// with `fchmod` on their own descriptor (the umask does not apply).
    pub fn beneath(&self, rel: &Path, make: Option<u32>) -> Result<HostDir, BeneathError> {
        let mut cur: Option<OwnedFd> = None;
        let mut shown = self.0.shown.clone();
        let mut any = false;
        for c in rel.components() {
            let Component::Normal(name) = c else { return Err(BeneathError::NotPlain) };
            any = true;
            let at = cur.as_ref().map_or(self.0.fd.as_fd(), |f| f.as_fd());
            let next = match open_one(at, name) {
                Ok(fd) => fd,
                Err(BeneathError::Missing) if make.is_some() => {
                    let mode = make.expect("checked");
                    match rustix::fs::mkdirat(at, name, Mode::from_raw_mode(0o700)) {
                        Ok(()) => {
                            let fd = open_one(at, name)?;
                            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode)).map_err(std::io::Error::from)?;
                            fd
                        }
                        // Made meanwhile by someone else: open what is there, by the same rules.
                        Err(Errno::EXIST) => open_one(at, name)?,
                        Err(e) => return Err(std::io::Error::from(e).into()),
                    }
                }
                Err(e) => return Err(e),
            };
            shown.push(name);
            cur = Some(next);
        }
        if !any {
            return Err(BeneathError::NotPlain);
        }
        Ok(HostDir(Arc::new(Inner { fd: cur.expect("at least one component"), shown })))
    }

    /// A detached copy of the mount tree at this very directory (`open_tree` with
    /// `OPEN_TREE_CLONE`), to attach with `move_mount` in a sandbox's mount namespace: a bind
    /// by name would look the path up again, and a bind of `/proc/self/fd/N` is refused across
    /// mount namespaces.
    pub fn clone_tree(&self) -> std::io::Result<OwnedFd> {
        use rustix::mount::OpenTreeFlags as F;
        let flags = F::OPEN_TREE_CLONE | F::OPEN_TREE_CLOEXEC | F::AT_RECURSIVE | F::AT_EMPTY_PATH;
        Ok(rustix::mount::open_tree(&self.0.fd, c"", flags)?)
    }

    /// A path naming this very directory through the descriptor (`/proc/self/fd/N`): valid in
    /// this process and in a child forked from it before `exec`.
    pub fn proc_path(&self) -> CString {
        CString::new(format!("/proc/self/fd/{}", self.0.fd.as_raw_fd())).expect("no NUL in a number")
    }

    /// Whether it is still a directory (a descriptor cannot change what it names).
    pub fn is_dir(&self) -> bool {
        rustix::fs::fstat(&self.0.fd).is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
    }

    /// The path it was reached by, for messages only.
    pub fn shown(&self) -> &Path {
        &self.0.shown
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.fd.as_fd()
    }
}

/// One name beneath `at`: a directory, not a link.
fn open_one(at: BorrowedFd<'_>, name: &std::ffi::OsStr) -> Result<OwnedFd, BeneathError> {
    match rustix::fs::openat2(at, name, dir_flags(), Mode::empty(), RESOLVE) {
        Ok(fd) => Ok(fd),
        Err(Errno::NOENT) => Err(BeneathError::Missing),
        // ELOOP: a link (NO_SYMLINKS, NOFOLLOW); EXDEV: it would leave `at` (BENEATH).
        Err(Errno::LOOP) | Err(Errno::XDEV) => Err(BeneathError::Link),
        // O_DIRECTORY is checked before O_NOFOLLOW: a link as the last name is ENOTDIR too.
        Err(Errno::NOTDIR) => match rustix::fs::statat(at, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(BeneathError::Link),
            _ => Err(BeneathError::NotDir),
        },
        // A kernel raced by a rename may refuse the lookup (EAGAIN): refused, never followed.
        Err(Errno::AGAIN) => Err(BeneathError::Link),
        Err(e) => Err(std::io::Error::from(e).into()),
    }
}

impl fmt::Debug for HostDir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostDir({}, fd {})", self.0.shown.display(), self.0.fd.as_raw_fd())
    }
}

impl PartialEq for HostDir {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.shown == other.0.shown
    }
}

impl Eq for HostDir {}

impl serde::Serialize for HostDir {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.shown.serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sr-hostfs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn links_and_escapes_are_refused() {
        let d = tmp("links");
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", d.join("a/root")).unwrap();
        std::os::unix::fs::symlink("b", d.join("a/inside")).unwrap();
        std::fs::write(d.join("a/file"), "x").unwrap();
        let root = HostDir::open_trusted(&d).unwrap();
        assert!(root.beneath(Path::new("a/b"), None).is_ok());
        assert!(matches!(root.beneath(Path::new("a/root"), None), Err(BeneathError::Link)));
        assert!(matches!(root.beneath(Path::new("a/root/etc"), Some(0o777)), Err(BeneathError::Link)));
        assert!(matches!(root.beneath(Path::new("a/inside"), None), Err(BeneathError::Link)), "even a link inside");
        assert!(matches!(root.beneath(Path::new("a/file"), None), Err(BeneathError::NotDir)));
        assert!(matches!(root.beneath(Path::new("a/../a"), None), Err(BeneathError::NotPlain)));
        assert!(matches!(root.beneath(Path::new("/etc"), None), Err(BeneathError::NotPlain)));
        assert!(matches!(root.beneath(Path::new(""), None), Err(BeneathError::NotPlain)));
        assert!(matches!(root.beneath(Path::new("nope"), None), Err(BeneathError::Missing)));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn made_directories_get_the_mode_on_their_descriptor() {
        let d = tmp("make");
        let root = HostDir::open_trusted(&d).unwrap();
        let made = root.beneath(Path::new("x/y/z"), Some(0o777)).unwrap();
        assert!(made.is_dir());
        for p in ["x", "x/y", "x/y/z"] {
            let mode = std::fs::metadata(d.join(p)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o777, "{p}");
        }
        // What exists keeps its mode.
        std::fs::create_dir(d.join("kept")).unwrap();
        std::fs::set_permissions(d.join("kept"), std::fs::Permissions::from_mode(0o700)).unwrap();
        root.beneath(Path::new("kept/new"), Some(0o777)).unwrap();
        assert_eq!(std::fs::metadata(d.join("kept")).unwrap().permissions().mode() & 0o7777, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_descriptor_keeps_naming_what_was_checked() {
        let d = tmp("swap");
        std::fs::create_dir_all(d.join("v")).unwrap();
        std::fs::write(d.join("v/mark"), "checked").unwrap();
        let root = HostDir::open_trusted(&d).unwrap();
        let v = root.beneath(Path::new("v"), None).unwrap();
        // Swapped for a link to / after the check: the descriptor still names the directory.
        std::fs::rename(d.join("v"), d.join("moved")).unwrap();
        std::os::unix::fs::symlink("/", d.join("v")).unwrap();
        let through = std::fs::read_to_string(Path::new(v.proc_path().to_str().unwrap()).join("mark")).unwrap();
        assert_eq!(through, "checked");
        std::fs::remove_dir_all(&d).unwrap();
    }
}

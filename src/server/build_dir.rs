//! A template build's folder, written by serve (as root) from what a request sent: the COPY
//! contexts unpacked into it, then the `Dockerfile` and `template.yaml` the build writes
//! beside them (see `templates`). Nothing written here ever follows a link (issue 23: a
//! context holding `Dockerfile` as a link to a host file had serve overwrite that file).
//!
//! Every write goes through a descriptor of the folder, one path component at a time, each
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`; the
//! final component is made with calls that never follow it (`O_CREAT | O_EXCL | O_NOFOLLOW`,
//! `mkdirat`, `symlinkat`, `linkat` without `AT_SYMLINK_FOLLOW`), after whatever an earlier
//! entry left there is unlinked (a directory is never replaced). So:
//!
//! * a context may hold symbolic links, absolute or dangling (they reach the image as links,
//!   as Docker copies them), but an entry below one, or a link where the build writes its own
//!   `Dockerfile` or `template.yaml`, refuses the context, naming the entry;
//! * entries with an absolute path or a `..` are refused; a hard link must name an earlier
//!   entry of the folder, and is made as a link to it there;
//! * only files, directories and links are taken: a FIFO or a device would block, or reach
//!   the host's devices through, whoever reads the folder next (the digest, the builder);
//! * what one build unpacks is bounded: [`MAX_BYTES`] of file content, [`MAX_ENTRIES`] entries.
//!
//! Owners in the archive are ignored (everything is serve's; COPY gives the image's files to
//! root or to `--chown`'s user); modes keep their permission bits, without set-id bits.

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Most bytes of file content one build's contexts may unpack to.
pub(crate) const MAX_BYTES: u64 = 4 << 30;
/// Most entries one build's contexts may hold.
pub(crate) const MAX_ENTRIES: u64 = 200_000;

/// Why a context cannot be unpacked, or the build's own file written. The refusals that keep
/// a context inside its folder are kinds of their own; failed calls keep the I/O error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildDirError {
    #[error("`{}` is an absolute path: entries are relative to the context", .0.display())]
    Absolute(PathBuf),
    #[error("`{}` climbs out of the context with `..`", .0.display())]
    Climbs(PathBuf),
    /// An entry below a link of the context: nothing is written through one.
    #[error("`{}` is below `{}`, a symbolic link: nothing is written through a link", entry.display(), link.display())]
    BelowLink { entry: PathBuf, link: PathBuf },
    /// An entry below a file, a FIFO, … of the context.
    #[error("`{}` is below `{}`, {kind}", entry.display(), at.display())]
    BelowNonDirectory { entry: PathBuf, at: PathBuf, kind: &'static str },
    #[error("`{}` is a directory in the context already, and cannot be replaced", .0.display())]
    DirectoryInTheWay(PathBuf),
    #[error("`{}`: a symbolic link without a target", .0.display())]
    LinkWithoutTarget(PathBuf),
    #[error("`{}`: a hard link without a target", .0.display())]
    HardLinkWithoutTarget(PathBuf),
    #[error("`{}`: a hard link to the context itself", .0.display())]
    HardLinkToContext(PathBuf),
    #[error("`{}` is a hard link to `{}`, which is no file of the context", entry.display(), target.display())]
    HardLinkOutside { entry: PathBuf, target: PathBuf },
    /// A FIFO, a device, …
    #[error("`{}` is {kind}: a COPY context holds files, directories and links only", entry.display())]
    Unsupported { entry: PathBuf, kind: &'static str },
    /// Something other than a file where the build writes its `Dockerfile` or `template.yaml`.
    #[error(
        "the context's `{name}` is {kind}, where the build writes its own {name}: leave it out of the files copied"
    )]
    OwnFileInTheWay { name: String, kind: &'static str },
    #[error("more than {max} entries", max = MAX_ENTRIES)]
    TooManyEntries,
    #[error("the files unpack to more than {}", crate::size::human(MAX_BYTES))]
    TooLarge,
    #[error("cannot open the uploaded files: {0}")]
    OpenArchive(io::Error),
    #[error("not a valid tar archive: {0}")]
    Archive(io::Error),
    #[error("cannot open the build folder: {0}")]
    OpenFolder(io::Error),
    /// A call on an entry's path failed.
    #[error("`{}`: {}{source}", entry.display(), op.prefix())]
    Entry { entry: PathBuf, op: EntryOp, source: io::Error },
    #[error("cannot replace the context's `{name}`: {source}")]
    ReplaceOwn { name: String, source: io::Error },
    #[error("cannot write `{name}`: {source}")]
    WriteOwn { name: String, source: io::Error },
}

/// What was being done to an entry when a call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EntryOp {
    MakeDir,
    /// Opening the directory `.0` on the way to the entry.
    Open(PathBuf),
    Replace,
    Create,
    Write,
    MakeLink,
    MakeHardLink,
    /// Looking at what is there, setting the mode, flushing.
    Other,
}

impl EntryOp {
    fn prefix(&self) -> String {
        match self {
            EntryOp::MakeDir => "cannot make its directory: ".into(),
            EntryOp::Open(at) => format!("cannot open `{}`: ", at.display()),
            EntryOp::Replace => "cannot replace what is there: ".into(),
            EntryOp::Create => "cannot create it: ".into(),
            EntryOp::Write => "cannot write it: ".into(),
            EntryOp::MakeLink => "cannot make the link: ".into(),
            EntryOp::MakeHardLink => "cannot make the hard link: ".into(),
            EntryOp::Other => String::new(),
        }
    }
}

/// `map_err` for a failed call on `entry`.
fn at_entry<E: Into<io::Error>>(entry: &Path, op: EntryOp) -> impl FnOnce(E) -> BuildDirError + '_ {
    move |e| BuildDirError::Entry { entry: entry.to_path_buf(), op, source: e.into() }
}

/// A build folder, open; see the module documentation.
pub(crate) struct BuildDir {
    dir: OwnedFd,
    path: PathBuf,
    bytes: AtomicU64,
    entries: AtomicU64,
}

/// `openat2` of one component `name` beneath `dir`, never through a link.
fn open_beneath(dir: impl AsFd, name: &OsStr, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    loop {
        match rustix::fs::openat2(dir.as_fd(), name, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, mode, resolve) {
            // A concurrent rename raced the lookup.
            Err(Errno::AGAIN) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// What is at `name` in `dir` (not following it), if anything.
fn kind_at(dir: impl AsFd, name: &OsStr) -> io::Result<Option<FileType>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Socket => "a socket",
        FileType::RegularFile => "a file",
        _ => "an unknown kind of file",
    }
}

/// The components of an entry's path; refused when absolute or climbing with `..`.
fn components(p: &Path) -> Result<Vec<&OsStr>, BuildDirError> {
    let mut out = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(BuildDirError::Absolute(p.to_path_buf())),
            Component::ParentDir => return Err(BuildDirError::Climbs(p.to_path_buf())),
        }
    }
    Ok(out)
}

impl BuildDir {
    /// Makes the folder `path` (in serve's own work directory) and opens it.
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        // trusted: serve's own work directory; what is unpacked into it goes through `dir`.
        std::fs::create_dir_all(path)?;
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { dir, path: path.to_path_buf(), bytes: AtomicU64::new(0), entries: AtomicU64::new(0) })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The directory `comps` below the folder, opened; made (0755) where missing when
    /// `make`. `entry` names the archive entry in errors.
    fn dir(&self, comps: &[&OsStr], make: bool, entry: &Path) -> Result<OwnedFd, BuildDirError> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let mut fd =
            open_beneath(&self.dir, OsStr::new("."), flags, Mode::empty()).map_err(BuildDirError::OpenFolder)?;
        for (i, c) in comps.iter().enumerate() {
            if make {
                match rustix::fs::mkdirat(&fd, *c, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(at_entry(entry, EntryOp::MakeDir)(e)),
                }
            }
            fd = match open_beneath(&fd, c, flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(e) => {
                    let at: PathBuf = comps[..=i].iter().collect();
                    let entry = entry.to_path_buf();
                    return Err(match kind_at(&fd, c) {
                        Ok(Some(FileType::Symlink)) => BuildDirError::BelowLink { entry, link: at },
                        Ok(Some(t)) if t != FileType::Directory => {
                            BuildDirError::BelowNonDirectory { entry, at, kind: kind_name(t) }
                        }
                        _ => BuildDirError::Entry { entry, op: EntryOp::Open(at), source: e },
                    });
                }
            };
        }
        Ok(fd)
    }

    /// Makes room for a new `name` in `dir`: what an earlier entry left there is removed,
    /// unless it is a directory.
    fn clear(dir: &OwnedFd, name: &OsStr, entry: &Path) -> Result<(), BuildDirError> {
        match kind_at(dir, name) {
            Ok(None) => Ok(()),
            Ok(Some(FileType::Directory)) => Err(BuildDirError::DirectoryInTheWay(entry.to_path_buf())),
            Ok(Some(_)) => rustix::fs::unlinkat(dir, name, AtFlags::empty()).map_err(at_entry(entry, EntryOp::Replace)),
            Err(e) => Err(at_entry(entry, EntryOp::Other)(e)),
        }
    }

    /// Unpacks the tar archive (gzipped or not) in file `archive` into the folder.
    pub(crate) fn unpack(&self, archive: &Path) -> Result<(), BuildDirError> {
        // trusted: the archive is serve's own spool file, not a path a client names.
        let mut f = std::fs::File::open(archive).map_err(BuildDirError::OpenArchive)?;
        let mut magic = [0u8; 2];
        let gz = f.read_exact(&mut magic).is_ok() && magic == [0x1f, 0x8b];
        // trusted: as above.
        let f = std::fs::File::open(archive).map_err(BuildDirError::OpenArchive)?;
        if gz {
            self.unpack_from(flate2::read::GzDecoder::new(f))
        } else {
            self.unpack_from(f)
        }
    }

    fn unpack_from(&self, r: impl Read) -> Result<(), BuildDirError> {
        let mut archive = tar::Archive::new(r);
        let bad = BuildDirError::Archive;
        for entry in archive.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            if self.entries.fetch_add(1, Ordering::Relaxed) >= MAX_ENTRIES {
                return Err(BuildDirError::TooManyEntries);
            }
            let path = entry.path().map_err(bad)?.into_owned();
            let comps = components(&path)?;
            let Some((name, parents)) = comps.split_last() else {
                // The context's own directory (`./`).
                continue;
            };
            let kind = entry.header().entry_type();
            let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
            match kind {
                tar::EntryType::Directory => {
                    let fd = self.dir(&comps, true, &path)?;
                    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode | 0o700))
                        .map_err(at_entry(&path, EntryOp::Other))?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let dir = self.dir(parents, true, &path)?;
                    Self::clear(&dir, name, &path)?;
                    let fd = open_beneath(
                        &dir,
                        name,
                        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
                        Mode::from_raw_mode(0o600),
                    )
                    .map_err(at_entry(&path, EntryOp::Create))?;
                    let mut file = std::fs::File::from(fd);
                    let left = MAX_BYTES.saturating_sub(self.bytes.load(Ordering::Relaxed));
                    let n = io::copy(&mut (&mut entry).take(left + 1), &mut file)
                        .map_err(at_entry(&path, EntryOp::Write))?;
                    if self.bytes.fetch_add(n, Ordering::Relaxed) + n > MAX_BYTES {
                        return Err(BuildDirError::TooLarge);
                    }
                    file.flush().map_err(at_entry(&path, EntryOp::Other))?;
                    rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(at_entry(&path, EntryOp::Other))?;
                    if let Ok(mtime) = entry.header().mtime() {
                        let t = rustix::fs::Timespec { tv_sec: mtime.min(i64::MAX as u64) as i64, tv_nsec: 0 };
                        let _ = rustix::fs::futimens(
                            &file,
                            &rustix::fs::Timestamps { last_access: t, last_modification: t },
                        );
                    }
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .ok_or_else(|| BuildDirError::LinkWithoutTarget(path.clone()))?
                        .into_owned();
                    let dir = self.dir(parents, true, &path)?;
                    Self::clear(&dir, name, &path)?;
                    rustix::fs::symlinkat(OsStr::from_bytes(&target), &dir, *name)
                        .map_err(at_entry(&path, EntryOp::MakeLink))?;
                }
                tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(bad)?
                        .ok_or_else(|| BuildDirError::HardLinkWithoutTarget(path.clone()))?
                        .into_owned();
                    let tcomps = components(&target)?;
                    let Some((tname, tparents)) = tcomps.split_last() else {
                        return Err(BuildDirError::HardLinkToContext(path.clone()));
                    };
                    let from = self.dir(tparents, false, &target)?;
                    match kind_at(&from, tname) {
                        Ok(Some(FileType::RegularFile | FileType::Symlink)) => {}
                        _ => return Err(BuildDirError::HardLinkOutside { entry: path.clone(), target }),
                    }
                    let dir = self.dir(parents, true, &path)?;
                    Self::clear(&dir, name, &path)?;
                    rustix::fs::linkat(&from, *tname, &dir, *name, AtFlags::empty())
                        .map_err(at_entry(&path, EntryOp::MakeHardLink))?;
                }
                // Extended headers are read by the archive itself; these carry nothing to write.
                tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
                other => {
                    let what = match other {
                        tar::EntryType::Fifo => "a FIFO",
                        tar::EntryType::Char => "a character device",
                        tar::EntryType::Block => "a block device",
                        _ => "an entry of an unknown kind",
                    };
                    return Err(BuildDirError::Unsupported { entry: path.clone(), kind: what });
                }
            }
        }
        Ok(())
    }

    /// Writes the build's own file `name` (`Dockerfile`, `template.yaml`) at the top of the
    /// folder: a file the context left there is replaced (a project copied whole brings its
    /// own Dockerfile), anything else there refuses the context.
    pub(crate) fn write_own(&self, name: &str, data: &[u8]) -> Result<(), BuildDirError> {
        let n = OsStr::new(name);
        let write = |source| BuildDirError::WriteOwn { name: name.to_string(), source };
        match kind_at(&self.dir, n) {
            Ok(None) => {}
            Ok(Some(FileType::RegularFile)) => rustix::fs::unlinkat(&self.dir, n, AtFlags::empty())
                .map_err(|e| BuildDirError::ReplaceOwn { name: name.to_string(), source: e.into() })?,
            Ok(Some(t)) => return Err(BuildDirError::OwnFileInTheWay { name: name.to_string(), kind: kind_name(t) }),
            Err(e) => return Err(write(e)),
        }
        let fd = open_beneath(&self.dir, n, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, Mode::from_raw_mode(0o644))
            .map_err(write)?;
        std::fs::File::from(fd).write_all(data).map_err(write)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum E<'a> {
        File(&'a str, &'a [u8]),
        Dir(&'a str),
        Link(&'a str, &'a str),
        Hard(&'a str, &'a str),
        Fifo(&'a str),
    }

    fn tarball(entries: &[E]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(0);
            match e {
                E::File(p, data) => {
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, p, *data).unwrap();
                }
                E::Dir(p) => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(0o755);
                    b.append_data(&mut h, p, &[][..]).unwrap();
                }
                E::Link(p, t) => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    b.append_link(&mut h, p, t).unwrap();
                }
                E::Hard(p, t) => {
                    h.set_entry_type(tar::EntryType::Link);
                    b.append_link(&mut h, p, t).unwrap();
                }
                E::Fifo(p) => {
                    h.set_entry_type(tar::EntryType::Fifo);
                    b.append_data(&mut h, p, &[][..]).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    /// A raw tar header for `name` (the tar crate refuses to write `..` or absolute names).
    fn raw_entry(name: &str) -> Vec<u8> {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(1);
        h.set_mode(0o644);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.extend_from_slice(b"x");
        out.resize(1024, 0);
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    fn unpack(entries: &[E]) -> (tempfile::TempDir, Result<(), BuildDirError>) {
        let d = tempfile::tempdir().unwrap();
        let bd = BuildDir::create(&d.path().join("build")).unwrap();
        let r = bd.unpack_from(&tarball(entries)[..]);
        (d, r)
    }

    #[test]
    fn files_directories_and_links_are_unpacked_links_as_links() {
        let (d, r) = unpack(&[
            E::Dir("a"),
            E::File("a/b/c.txt", b"c"),
            E::Link("a/abs", "/etc/shadow"),
            E::Link("rel", "a/b/c.txt"),
            E::Hard("a/hard", "a/b/c.txt"),
            E::File("./top.txt", b"top"),
        ]);
        r.unwrap();
        let b = d.path().join("build");
        assert_eq!(std::fs::read(b.join("a/b/c.txt")).unwrap(), b"c");
        assert_eq!(std::fs::read_link(b.join("a/abs")).unwrap(), Path::new("/etc/shadow"));
        assert_eq!(std::fs::read(b.join("rel")).unwrap(), b"c");
        assert_eq!(std::fs::read(b.join("a/hard")).unwrap(), b"c");
        assert_eq!(std::fs::read(b.join("top.txt")).unwrap(), b"top");
    }

    #[test]
    fn nothing_is_written_through_a_link() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().to_str().unwrap();
        let (_d, r) = unpack(&[E::Link("sub", outside), E::File("sub/planted", b"x")]);
        assert!(r.unwrap_err().to_string().contains("`sub/planted` is below `sub`, a symbolic link"));
        let (_d, r) = unpack(&[E::Link("sub", outside), E::Dir("sub/deeper")]);
        assert!(r.is_err());
        assert!(std::fs::read_dir(host.path()).unwrap().next().is_none(), "written into the host directory");
        // A file entry where a link was replaces the link, never writes through it.
        let victim = host.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        let (d, r) = unpack(&[E::Link("x", victim.to_str().unwrap()), E::File("x", b"mine")]);
        r.unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        assert_eq!(std::fs::read(d.path().join("build/x")).unwrap(), b"mine");
        // A hard link may name only an entry of the folder.
        let (_d, r) = unpack(&[E::Hard("h", victim.to_str().unwrap())]);
        assert!(r.unwrap_err().to_string().contains("absolute path"));
        let (_d, r) = unpack(&[E::Link("l", outside), E::Hard("h", "l/victim")]);
        assert!(r.unwrap_err().to_string().contains("a symbolic link"));
    }

    #[test]
    fn escaping_and_special_entries_are_refused() {
        for name in ["../up.txt", "/abs.txt", "a/../../up.txt"] {
            let d = tempfile::tempdir().unwrap();
            let bd = BuildDir::create(&d.path().join("build")).unwrap();
            let e = bd.unpack_from(&raw_entry(name)[..]).unwrap_err().to_string();
            assert!(e.contains("absolute path") || e.contains("climbs out"), "{name}: {e}");
            assert!(!d.path().join("up.txt").exists() && !Path::new("/abs.txt").exists());
        }
        let (_d, r) = unpack(&[E::Fifo("pipe")]);
        assert_eq!(
            r.unwrap_err().to_string(),
            "`pipe` is a FIFO: a COPY context holds files, directories and links only"
        );
        let (_d, r) = unpack(&[E::Dir("d"), E::File("d", b"x")]);
        assert!(r.unwrap_err().to_string().contains("is a directory in the context already"));
    }

    #[test]
    fn the_builds_own_files_replace_files_and_refuse_anything_else() {
        let host = tempfile::tempdir().unwrap();
        let victim = host.path().join("victim");
        std::fs::write(&victim, "secret").unwrap();
        let (d, r) = unpack(&[E::Link("Dockerfile", victim.to_str().unwrap()), E::File("template.yaml", b"x")]);
        r.unwrap();
        let bd = BuildDir::create(&d.path().join("build")).unwrap();
        let e = bd.write_own("Dockerfile", b"FROM base\n").unwrap_err().to_string();
        assert!(e.contains("the context's `Dockerfile` is a symbolic link"), "{e}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "secret");
        bd.write_own("template.yaml", b"name: t\n").unwrap();
        assert_eq!(std::fs::read(bd.path().join("template.yaml")).unwrap(), b"name: t\n");
    }

    /// Issue 28 item 4: each refusal is a kind a caller can match, naming the entries.
    #[test]
    fn refusals_have_kinds() {
        let host = tempfile::tempdir().unwrap();
        let outside = host.path().to_str().unwrap();
        let (_d, r) = unpack(&[E::Link("sub", outside), E::File("sub/planted", b"x")]);
        assert!(
            matches!(r, Err(BuildDirError::BelowLink { ref entry, ref link }) if entry == Path::new("sub/planted") && link == Path::new("sub")),
            "{r:?}"
        );
        let (_d, r) = unpack(&[E::File("f", b"x"), E::File("f/g", b"y")]);
        let e = r.unwrap_err();
        assert!(matches!(e, BuildDirError::BelowNonDirectory { kind: "a file", .. }), "{e:?}");
        assert_eq!(e.to_string(), "`f/g` is below `f`, a file");
        let (_d, r) = unpack(&[E::Hard("h", "/etc/passwd")]);
        assert!(matches!(r, Err(BuildDirError::Absolute(ref p)) if p == Path::new("/etc/passwd")), "{r:?}");
        let (_d, r) = unpack(&[E::Hard("h", "missing")]);
        assert!(matches!(r, Err(BuildDirError::HardLinkOutside { .. })), "{r:?}");
        let (_d, r) = unpack(&[E::Fifo("pipe")]);
        assert!(matches!(r, Err(BuildDirError::Unsupported { kind: "a FIFO", .. })), "{r:?}");
        let (_d, r) = unpack(&[E::Dir("d"), E::File("d", b"x")]);
        assert!(matches!(r, Err(BuildDirError::DirectoryInTheWay(_))), "{r:?}");
        let d = tempfile::tempdir().unwrap();
        let bd = BuildDir::create(&d.path().join("build")).unwrap();
        let e = bd.unpack_from(&raw_entry("a/../../up.txt")[..]).unwrap_err();
        assert!(matches!(e, BuildDirError::Climbs(_)), "{e:?}");
        let e = bd.unpack_from(&b"not a tar archive, and long enough to be read as a header"[..]).unwrap_err();
        assert!(matches!(e, BuildDirError::Archive(_)), "{e:?}");
        assert!(e.to_string().starts_with("not a valid tar archive: "), "{e}");
        let e = bd.unpack(&d.path().join("nope.tar")).unwrap_err();
        assert!(matches!(&e, BuildDirError::OpenArchive(io) if io.kind() == io::ErrorKind::NotFound), "{e:?}");
        std::fs::create_dir(bd.path().join("Dockerfile")).unwrap();
        let e = bd.write_own("Dockerfile", b"FROM base\n").unwrap_err();
        assert!(matches!(e, BuildDirError::OwnFileInTheWay { kind: "a directory", .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the context's `Dockerfile` is a directory, where the build writes its own Dockerfile: leave it out of the files copied"
        );
        let e = BuildDirError::Entry {
            entry: "a/b".into(),
            op: EntryOp::Open("a".into()),
            source: io::Error::from_raw_os_error(libc::EACCES),
        };
        assert_eq!(e.to_string(), "`a/b`: cannot open `a`: Permission denied (os error 13)");
        let e = BuildDirError::Entry { entry: "a".into(), op: EntryOp::Other, source: io::Error::other("boom") };
        assert_eq!(e.to_string(), "`a`: boom");
    }

    #[test]
    fn unpacked_contexts_are_bounded() {
        let d = tempfile::tempdir().unwrap();
        let bd = BuildDir::create(&d.path().join("build")).unwrap();
        bd.bytes.store(MAX_BYTES - 1, Ordering::Relaxed);
        let e = bd.unpack_from(&tarball(&[E::File("a", b"ab")])[..]).unwrap_err().to_string();
        assert!(e.contains("unpack to more than 4 GiB"), "{e}");
        bd.entries.store(MAX_ENTRIES, Ordering::Relaxed);
        let e = bd.unpack_from(&tarball(&[E::Dir("x")])[..]).unwrap_err().to_string();
        assert!(e.contains("more than 200000 entries"), "{e}");
    }
}

//! Applying a layer (a tar stream) onto a tree: whiteouts, shifted owners, no escapes.
//!
//! Used for both kinds of image: a registry image is its layers applied in order; an offline
//! image is the single tar mmdebstrap writes. Rules, from the OCI image spec and what
//! container engines do, plus this project's:
//!
//! * `.wh.<name>` removes `<name>` of lower layers; `.wh..wh..opq` empties its directory of
//!   what lower layers put there. Neither is written. Entries of the same layer stay.
//! * Owners are shifted into the sandbox range ([`IdMap`]); ids beyond it become `nobody`
//!   (counted, the caller logs it). Modes keep setuid/setgid/sticky bits (chmod after
//!   chown, which would clear them). Regular files and symlinks keep their mtime (Python
//!   checks `.pyc` files against their sources' mtimes).
//! * Device nodes are skipped (sandboxes get their `/dev` elsewhere); fifos are kept.
//! * An entry with an absolute path or a `..` component is refused, and so is one whose
//!   parent path passes through a symlink (a layer that plants `x -> /` and then writes
//!   `x/etc/passwd`); hard link targets obey the same rules. Refusing fails the image: a
//!   layer that tries this is hostile or broken, and half of it is not an image.

use std::collections::HashSet;
use std::io::{self, Read};
use std::path::Path;

use tar::EntryType;

use super::fsat::Dir;
use super::idmap::IdMap;

/// What was unpacked, for the log.
#[derive(Debug, Default, Clone)]
pub(crate) struct UnpackStats {
    pub entries: u64,
    /// Bytes of regular files written.
    pub bytes: u64,
    pub devices_skipped: u64,
    /// Entries whose owner was beyond the id map (now `nobody`), and the first of them.
    pub clamped: u64,
    pub first_clamped: Option<String>,
}

/// Applies layers onto the tree at `root` (which exists and is ours).
pub(crate) struct Unpacker {
    root: Dir,
    ids: IdMap,
    pub stats: UnpackStats,
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The components of an entry path: `./a/b/` -> [a, b]. Absolute paths and `..` are refused.
pub(crate) fn components(raw: &[u8]) -> io::Result<Vec<&[u8]>> {
    if raw.first() == Some(&b'/') {
        return Err(bad(format!("entry `{}` has an absolute path", show(raw))));
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(bad(format!("entry `{}` climbs out of the image root with `..`", show(raw)))),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

/// What a whiteout entry name means.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Whiteout<'a> {
    /// Not a whiteout.
    None,
    /// `.wh..wh..opq`: hide everything lower layers put in the directory.
    Opaque,
    /// `.wh.<name>`: hide `<name>`.
    Remove(&'a [u8]),
}

pub(crate) fn whiteout(name: &[u8]) -> Whiteout<'_> {
    if name == b".wh..wh..opq" {
        Whiteout::Opaque
    } else if let Some(n) = name.strip_prefix(b".wh.") {
        Whiteout::Remove(n)
    } else {
        Whiteout::None
    }
}

impl Unpacker {
    pub fn new(root: &Path, ids: IdMap) -> io::Result<Self> {
        Ok(Self { root: Dir::open(root)?, ids, stats: UnpackStats::default() })
    }

    fn host_ids(&mut self, uid: u64, gid: u64, path: &[u8]) -> (u32, u32) {
        let (u, cu) = self.ids.to_host_clamped(u32::try_from(uid).unwrap_or(u32::MAX));
        let (g, cg) = self.ids.to_host_clamped(u32::try_from(gid).unwrap_or(u32::MAX));
        if cu || cg {
            self.stats.clamped += 1;
            if self.stats.first_clamped.is_none() {
                self.stats.first_clamped = Some(format!("{} (uid {uid}, gid {gid})", show(path)));
            }
        }
        (u, g)
    }

    /// The parent directory of an entry, creating missing directories (root-owned, 0755)
    /// when `create`; never through a symlink.
    fn parent(&self, parts: &[&[u8]], create: bool, what: &[u8]) -> io::Result<Option<Dir>> {
        let through_link = || bad(format!("entry `{}` passes through a symlink or a non-directory", show(what)));
        match self.root.sub(&join(parts)) {
            Ok(d) => return Ok(Some(d)),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) => {
                return Err(through_link())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let root = self.ids.host_base;
        let mut cur = self.root.sub(b"")?;
        for c in parts {
            if cur.mkdir(c, 0o755)? {
                cur.chown(c, root, root)?;
            }
            cur = cur.sub(c).map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
                    through_link()
                } else {
                    e
                }
            })?;
        }
        Ok(Some(cur))
    }

    /// Applies one layer (an uncompressed tar stream).
    pub fn apply<R: Read>(&mut self, reader: R) -> io::Result<()> {
        self.apply_mapped(reader, &|p| Some(p.to_vec()), false)
    }

    /// Applies a tar stream whose paths `map` rewrites (None: skip the entry), owned by root
    /// when `force_root` (a package tarball's owners mean nothing in the image).
    pub fn apply_mapped<R: Read>(
        &mut self,
        reader: R,
        map: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
        force_root: bool,
    ) -> io::Result<()> {
        let mut archive = tar::Archive::new(reader);
        // Paths of this layer: whiteouts apply only to what lower layers made.
        let mut made: HashSet<Vec<u8>> = HashSet::new();
        let mut dirs: Vec<(Vec<u8>, u32)> = Vec::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let kind = entry.header().entry_type();
            if matches!(
                kind,
                EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink
            ) {
                continue;
            }
            let Some(raw) = map(&entry.path_bytes()) else { continue };
            let parts = components(&raw)?;
            self.stats.entries += 1;
            // Package tarballs (npm's) leave the id fields blank: that is root.
            let (mut uid, mut gid) = (entry.header().uid().unwrap_or(0), entry.header().gid().unwrap_or(0));
            if let Ok(Some(pax)) = entry.pax_extensions() {
                for ext in pax.flatten() {
                    let v = || ext.value().ok().and_then(|v| v.parse::<u64>().ok());
                    match ext.key() {
                        Ok("uid") => uid = v().unwrap_or(uid),
                        Ok("gid") => gid = v().unwrap_or(gid),
                        _ => {}
                    }
                }
            }
            if force_root {
                (uid, gid) = (0, 0);
            }
            let mode = entry.header().mode()? & 0o7777;
            let mtime = entry.header().mtime().unwrap_or(0) as i64;
            let Some((name, dir_parts)) = parts.split_last() else {
                // The root itself (`./`): its owner and mode.
                if kind == EntryType::Directory {
                    let (u, g) = self.host_ids(uid, gid, &raw);
                    self.root.chown(b"", u, g)?;
                    self.root.chmod(b"", mode)?;
                }
                continue;
            };
            let rel = join(&parts);
            match whiteout(name) {
                Whiteout::Opaque => {
                    if let Some(dir) = self.parent(dir_parts, true, &raw)? {
                        let prefix = join(dir_parts);
                        for child in dir.names()? {
                            let mut p = prefix.clone();
                            if !p.is_empty() {
                                p.push(b'/');
                            }
                            p.extend_from_slice(&child);
                            if !made.contains(&p) {
                                dir.remove(&child)?;
                            }
                        }
                    }
                    continue;
                }
                Whiteout::Remove(target) => {
                    let mut p = join(dir_parts);
                    if !p.is_empty() {
                        p.push(b'/');
                    }
                    p.extend_from_slice(target);
                    if target.is_empty() || target == b"." || target == b".." {
                        return Err(bad(format!("entry `{}` is not a valid whiteout", show(&raw))));
                    }
                    if !made.contains(&p) {
                        if let Some(dir) = self.parent(dir_parts, false, &raw)? {
                            dir.remove(target)?;
                        }
                    }
                    continue;
                }
                Whiteout::None => {}
            }
            if kind.is_character_special() || kind.is_block_special() {
                self.stats.devices_skipped += 1;
                continue;
            }
            let dir = self.parent(dir_parts, true, &raw)?.expect("created");
            let existing = dir.lstat(name)?;
            // A directory over a directory merges; anything else replaces what is there.
            let keep_dir = kind == EntryType::Directory && existing.is_some_and(|s| s.is_dir());
            if existing.is_some() && !keep_dir {
                dir.remove(name)?;
            }
            made.insert(rel.clone());
            let (u, g) = self.host_ids(uid, gid, &raw);
            match kind {
                EntryType::Directory => {
                    if !keep_dir {
                        dir.mkdir(name, 0o700)?;
                    }
                    dir.chown(name, u, g)?;
                    dirs.push((rel, mode));
                }
                EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                    let mut f = dir.create(name)?;
                    self.stats.bytes += io::copy(&mut entry, &mut f)?;
                    std::os::unix::fs::fchown(&f, Some(u), Some(g))?;
                    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
                    drop(f);
                    dir.set_mtime(name, mtime)?;
                }
                EntryType::Symlink => {
                    let target = entry
                        .link_name_bytes()
                        .ok_or_else(|| bad(format!("symlink `{}` has no target", show(&raw))))?
                        .into_owned();
                    dir.symlink(&target, name)?;
                    dir.chown(name, u, g)?;
                    dir.set_mtime(name, mtime)?;
                }
                EntryType::Link => {
                    let target = entry
                        .link_name_bytes()
                        .and_then(|t| map(&t))
                        .ok_or_else(|| bad(format!("hard link `{}` has no target", show(&raw))))?;
                    let tparts = components(&target)
                        .map_err(|e| bad(format!("hard link `{}` -> `{}`: {e}", show(&raw), show(&target))))?;
                    let Some((tname, tdir)) = tparts.split_last() else {
                        return Err(bad(format!("hard link `{}` points at the image root", show(&raw))));
                    };
                    let from = self.parent(tdir, false, &target)?.ok_or_else(|| {
                        bad(format!("hard link `{}` -> `{}`: the target does not exist", show(&raw), show(&target)))
                    })?;
                    dir.link_from(&from, tname, name).map_err(|e| {
                        io::Error::new(e.kind(), format!("hard link `{}` -> `{}`: {e}", show(&raw), show(&target)))
                    })?;
                }
                EntryType::Fifo => {
                    dir.mkfifo(name, mode)?;
                    dir.chown(name, u, g)?;
                    dir.chmod(name, mode)?;
                }
                other => {
                    return Err(bad(format!("entry `{}` has an unsupported type {other:?}", show(&raw))));
                }
            }
        }
        // Directory modes last, so a read-only directory is filled first (cheap either way
        // for root, but right for what the tree says).
        for (rel, mode) in dirs {
            if let Ok(d) = self.root.sub(&rel) {
                d.chmod(b"", mode)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_and_refuse_escapes() {
        assert_eq!(components(b"./a/b/").unwrap(), vec![&b"a"[..], b"b"]);
        assert!(components(b"./").unwrap().is_empty());
        assert!(components(b"/etc/passwd").unwrap_err().to_string().contains("absolute"));
        assert!(components(b"a/../../x").unwrap_err().to_string().contains(".."));
    }

    #[test]
    fn whiteout_names() {
        assert_eq!(whiteout(b".wh..wh..opq"), Whiteout::Opaque);
        assert_eq!(whiteout(b".wh.gone"), Whiteout::Remove(b"gone"));
        assert_eq!(whiteout(b"plain"), Whiteout::None);
        assert_eq!(whiteout(b".whx"), Whiteout::None);
    }

    /// A tar layer built in memory: (path, kind, mode, uid, link target or content).
    fn layer(entries: &[(&str, EntryType, u32, u64, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, mode, uid, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(*mode);
            h.set_uid(*uid);
            h.set_gid(*uid);
            h.set_mtime(1_700_000_000);
            // Raw names: the builder's own path checks would refuse the hostile ones.
            h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
            match kind {
                EntryType::Symlink | EntryType::Link => {
                    h.set_link_name(data).unwrap();
                    h.set_size(0);
                    h.set_cksum();
                    b.append(&h, std::io::empty()).unwrap();
                }
                EntryType::Regular => {
                    h.set_size(data.len() as u64);
                    h.set_cksum();
                    b.append(&h, data.as_bytes()).unwrap();
                }
                _ => {
                    h.set_size(0);
                    h.set_cksum();
                    b.append(&h, std::io::empty()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    use std::os::unix::fs::MetadataExt;
    use EntryType::{Block, Char, Directory as D, Link, Regular as F, Symlink};

    const IDS: IdMap = IdMap { host_base: 400_000, len: 65536 };

    #[test]
    fn layers_stack_with_whiteouts_shifted_owners_and_kept_modes() {
        let t = tempfile::tempdir().unwrap();
        let mut u = Unpacker::new(t.path(), IDS).unwrap();
        u.apply(
            &layer(&[
                ("./", D, 0o755, 0, ""),
                ("a/", D, 0o755, 0, ""),
                ("a/keep", F, 0o644, 0, "keep"),
                ("a/gone", F, 0o644, 0, "gone"),
                ("b/x", F, 0o644, 0, "x"),
                ("b/sub/y", F, 0o644, 0, "y"),
                ("usr/bin/sudo", F, 0o4755, 0, "sudo"),
                ("home/user/f", F, 0o600, 1000, "mine"),
                ("dev/null", Char, 0o666, 0, ""),
                ("dev/sda", Block, 0o660, 0, ""),
                ("a/hl", Link, 0o644, 0, "a/keep"),
                ("s", Symlink, 0o777, 0, "/a/keep"),
                ("far", F, 0o644, 70_000, "far"),
            ])[..],
        )
        .unwrap();
        u.apply(
            &layer(&[
                ("a/.wh.gone", F, 0o644, 0, ""),
                ("b/new", F, 0o644, 0, "new"),
                ("b/.wh..wh..opq", F, 0o644, 0, ""),
                ("a/keep", F, 0o640, 0, "kept, replaced"),
                ("s/", D, 0o700, 1000, ""),
            ])[..],
        )
        .unwrap();
        let p = |x: &str| t.path().join(x);
        assert!(!p("a/gone").exists() && !p("a/.wh.gone").exists());
        assert_eq!(std::fs::read_to_string(p("a/keep")).unwrap(), "kept, replaced");
        // The hard link of layer 1 still has the old content: replacing a/keep made a new file.
        assert_eq!(std::fs::read_to_string(p("a/hl")).unwrap(), "keep");
        let names: Vec<String> =
            std::fs::read_dir(p("b")).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert_eq!(names, vec!["new".to_string()], "the opaque dir keeps only this layer's entries");
        let sudo = std::fs::metadata(p("usr/bin/sudo")).unwrap();
        assert_eq!((sudo.mode() & 0o7777, sudo.uid(), sudo.gid()), (0o4755, 400_000, 400_000));
        let f = std::fs::metadata(p("home/user/f")).unwrap();
        assert_eq!((f.uid(), f.mode() & 0o777), (401_000, 0o600));
        assert_eq!(f.mtime(), 1_700_000_000);
        assert!(!p("dev/null").exists() && !p("dev/sda").exists());
        assert_eq!(u.stats.devices_skipped, 2);
        assert_eq!(std::fs::metadata(p("far")).unwrap().uid(), 400_000 + 65534);
        assert_eq!(u.stats.clamped, 1);
        // A directory replaced the symlink `s` (and was not created through it).
        let s = std::fs::symlink_metadata(p("s")).unwrap();
        assert!(s.is_dir());
        assert_eq!((s.uid(), s.mode() & 0o777), (401_000, 0o700));
        let root = std::fs::metadata(t.path()).unwrap();
        assert_eq!((root.uid(), root.mode() & 0o777), (400_000, 0o755));
    }

    #[test]
    fn hostile_entries_are_refused_and_write_nothing_outside() {
        let outside = tempfile::tempdir().unwrap();
        let o = outside.path().display().to_string();
        let cases: Vec<(Vec<Vec<u8>>, &str)> = vec![
            (vec![layer(&[("../escape", F, 0o644, 0, "x")])], ".."),
            (vec![layer(&[("/abs", F, 0o644, 0, "x")])], "absolute"),
            (vec![layer(&[("link", Symlink, 0o777, 0, &o)]), layer(&[("link/pwned", F, 0o644, 0, "x")])], "symlink"),
            (
                vec![layer(&[("d/up", Symlink, 0o777, 0, "../..")]), layer(&[("d/up/x/pwned", F, 0o644, 0, "x")])],
                "symlink",
            ),
            (vec![layer(&[("hl", Link, 0o644, 0, "../../etc/passwd")])], ".."),
            (vec![layer(&[("ln", Symlink, 0o777, 0, "/etc"), ("hl", Link, 0o644, 0, "ln/passwd")])], "symlink"),
        ];
        for (layers, why) in cases {
            let t = tempfile::tempdir().unwrap();
            let root = t.path().join("root");
            std::fs::create_dir(&root).unwrap();
            let mut u = Unpacker::new(&root, IDS).unwrap();
            let mut err = None;
            for l in &layers {
                if let Err(e) = u.apply(&l[..]) {
                    err = Some(e);
                    break;
                }
            }
            let e = err.unwrap_or_else(|| panic!("{why}: accepted"));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{why}: {e}");
            assert!(e.to_string().contains(why), "{why}: {e}");
            assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "{why}: wrote outside");
            assert!(!t.path().join("escape").exists() && !t.path().join("pwned").exists());
        }
    }
}

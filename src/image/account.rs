//! What every sandbox image has, whatever it was built from: the `user` account and `/tmp`.
//!
//! E2B adds `user` (uid 1000, home `/home/user`) to templates built from any image, and
//! sandboxes run commands as it; scenarios and the SDK tests rely on it. So every tree gets,
//! when it lacks them: `user` and its group in `/etc/passwd`, `/etc/group` and
//! `/etc/shadow`, a home directory owned by it (with `/etc/skel`'s files), and a `/tmp` of
//! mode 1777. The files are edited here rather than by running the image's `useradd`, so
//! images without one (or hostile ones) are handled alike, through [`Dir`] (no symlink in
//! the image can redirect these writes).

use std::io;

use super::fsat::Dir;
use super::idmap::IdMap;

pub(crate) const USER: &str = "user";
pub(crate) const UID: u32 = 1000;
pub(crate) const HOME: &str = "/home/user";

/// What was added, for the log.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Added {
    pub user: bool,
    pub home: bool,
    pub sudo: bool,
}

fn lines(text: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(text).lines().map(str::to_string).collect()
}

fn has_name(lines: &[String], name: &str) -> bool {
    lines.iter().any(|l| l.split(':').next() == Some(name))
}

fn field(lines: &[String], name: &str, i: usize) -> Option<String> {
    lines.iter().find(|l| l.split(':').next() == Some(name)).and_then(|l| l.split(':').nth(i).map(str::to_string))
}

fn joined(lines: &[String]) -> Vec<u8> {
    let mut s = lines.join("\n");
    s.push('\n');
    s.into_bytes()
}

/// Writes `etc/<name>` keeping the owner and mode of what was there (or the defaults).
fn rewrite(etc: &Dir, name: &str, lines: &[String], ids: IdMap, default_gid: u32, default_mode: u32) -> io::Result<()> {
    let (uid, gid, mode) = match etc.lstat(name.as_bytes())? {
        Some(st) if st.mode & libc::S_IFMT == libc::S_IFREG => (st.uid, st.gid, st.mode & 0o7777),
        _ => (ids.host_base, ids.host_base + default_gid, default_mode),
    };
    etc.write_file(name.as_bytes(), &joined(lines), uid, gid, mode)
}

/// Makes sure the tree at `root` has the `user` account, its home and a 1777 `/tmp`; with
/// `sudo`, also passwordless sudo for it (`/etc/sudoers.d/user`, 0440).
pub(crate) fn ensure(root: &Dir, ids: IdMap, sudo: bool) -> io::Result<Added> {
    let mut added = Added::default();
    let (r, u) = (ids.host_base, ids.host_base + UID);
    // /tmp: a directory (replacing anything else), mode 1777, owned by root.
    match root.lstat(b"tmp")? {
        Some(st) if st.is_dir() => {}
        Some(_) => {
            root.remove(b"tmp")?;
            root.mkdir(b"tmp", 0o700)?;
        }
        None => {
            root.mkdir(b"tmp", 0o700)?;
        }
    }
    root.chown(b"tmp", r, r)?;
    root.chmod(b"tmp", 0o1777)?;

    if root.mkdir(b"etc", 0o755)? {
        root.chown(b"etc", r, r)?;
    }
    let etc = root.sub(b"etc")?;
    let mut passwd = lines(&etc.read_file(b"passwd")?.unwrap_or_default());
    let mut group = lines(&etc.read_file(b"group")?.unwrap_or_default());
    let mut shadow = lines(&etc.read_file(b"shadow")?.unwrap_or_default());
    if passwd.is_empty() {
        passwd.push("root:x:0:0:root:/root:/bin/sh".into());
    }
    if group.is_empty() {
        group.push("root:x:0:".into());
    }
    if !has_name(&group, USER) {
        group.push(format!("{USER}:x:{UID}:"));
    }
    if !has_name(&passwd, USER) {
        let shell = if root.sub(b"bin").is_ok_and(|b| b.lstat(b"bash").ok().flatten().is_some())
            || root.sub(b"usr/bin").is_ok_and(|b| b.lstat(b"bash").ok().flatten().is_some())
        {
            "/bin/bash"
        } else {
            "/bin/sh"
        };
        passwd.push(format!("{USER}:x:{UID}:{UID}::{HOME}:{shell}"));
        added.user = true;
    }
    if !has_name(&shadow, USER) {
        // Days since the epoch, as useradd writes it; no password (sudo is passwordless).
        let days = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() / 86400)
            .unwrap_or(0);
        shadow.push(format!("{USER}:*:{days}:0:99999:7:::"));
    }
    if sudo {
        // Also in the `sudo` group, as E2B's image has it.
        for l in group.iter_mut() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() == 4 && f[0] == "sudo" && !f[3].split(',').any(|m| m == USER) {
                *l = format!(
                    "{}:{}:{}:{}",
                    f[0],
                    f[1],
                    f[2],
                    if f[3].is_empty() { USER.to_string() } else { format!("{},{USER}", f[3]) }
                );
            }
        }
    }
    let shadow_gid = field(&group, "shadow", 2).and_then(|g| g.parse().ok()).unwrap_or(0);
    rewrite(&etc, "passwd", &passwd, ids, 0, 0o644)?;
    rewrite(&etc, "group", &group, ids, 0, 0o644)?;
    rewrite(&etc, "shadow", &shadow, ids, shadow_gid, 0o640)?;

    // The home directory, with /etc/skel's files when it is new.
    if root.mkdir(b"home", 0o755)? {
        root.chown(b"home", r, r)?;
    }
    let home = root.sub(b"home")?;
    match home.lstat(USER.as_bytes())? {
        Some(st) if st.is_dir() => {}
        other => {
            if other.is_some() {
                home.remove(USER.as_bytes())?;
            }
            home.mkdir(USER.as_bytes(), 0o700)?;
            home.chown(USER.as_bytes(), u, u)?;
            home.chmod(USER.as_bytes(), 0o750)?;
            added.home = true;
            let dst = home.sub(USER.as_bytes())?;
            if let Ok(skel) = etc.sub(b"skel") {
                for name in skel.names()? {
                    if let Some(data) = skel.read_file(&name).ok().flatten() {
                        dst.write_file(&name, &data, u, u, 0o644)?;
                    }
                }
            }
        }
    }

    if sudo {
        if etc.mkdir(b"sudoers.d", 0o755)? {
            etc.chown(b"sudoers.d", r, r)?;
        }
        let d = etc.sub(b"sudoers.d")?;
        d.write_file(USER.as_bytes(), format!("{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n").as_bytes(), r, r, 0o440)?;
        added.sudo = true;
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn adds_the_user_to_a_bare_tree_and_keeps_what_is_there() {
        let t = tempfile::tempdir().unwrap();
        let ids = IdMap { host_base: 300_000, len: 65536 };
        std::fs::create_dir_all(t.path().join("etc/skel")).unwrap();
        std::fs::write(t.path().join("etc/skel/.bashrc"), "# hi\n").unwrap();
        std::fs::write(t.path().join("etc/group"), "root:x:0:\nsudo:x:27:\nshadow:x:42:\n").unwrap();
        // A symlink planted where /tmp goes is replaced, not followed.
        std::os::unix::fs::symlink("/", t.path().join("tmp")).unwrap();
        let root = Dir::open(t.path()).unwrap();
        let added = ensure(&root, ids, true).unwrap();
        assert_eq!(added, Added { user: true, home: true, sudo: true });
        let passwd = std::fs::read_to_string(t.path().join("etc/passwd")).unwrap();
        assert!(passwd.contains("user:x:1000:1000::/home/user:/bin/sh"), "{passwd}");
        let group = std::fs::read_to_string(t.path().join("etc/group")).unwrap();
        assert!(group.contains("sudo:x:27:user") && group.contains("user:x:1000:"), "{group}");
        let shadow = t.path().join("etc/shadow");
        assert_eq!(std::fs::metadata(&shadow).unwrap().gid(), 300_042);
        let home = std::fs::metadata(t.path().join("home/user")).unwrap();
        assert_eq!((home.uid(), home.gid()), (301_000, 301_000));
        assert_eq!(std::fs::metadata(t.path().join("home/user/.bashrc")).unwrap().uid(), 301_000);
        let tmp = std::fs::symlink_metadata(t.path().join("tmp")).unwrap();
        assert!(tmp.is_dir());
        assert_eq!(tmp.mode() & 0o7777, 0o1777);
        let sudoers = std::fs::metadata(t.path().join("etc/sudoers.d/user")).unwrap();
        assert_eq!(sudoers.mode() & 0o7777, 0o440);
        // Idempotent.
        assert_eq!(ensure(&root, ids, false).unwrap(), Added::default());
        assert_eq!(std::fs::read_to_string(t.path().join("etc/passwd")).unwrap(), passwd);
    }
}

//! serve's work directory: where `/files` uploads are spooled and template builds keep their
//! uploaded contexts and folders, `$TMPDIR/scenario-run-serve-<pid>-<port>`.
//!
//! It is made when serve starts (0700, refused if the name is taken by anything but a stale
//! work directory of ours, so no one can have serve write into a directory they prepared),
//! with an `owner` file naming this process as `<pid>:<start time>`, and removed when serve
//! stops. A serve that is SIGKILLed cannot remove it (one left 191 MB, issue 23): the next
//! serve, and the next run on the local provider, remove every work directory whose owner
//! process is gone ([`sweep_stale`]), as the local provider sweeps its sandbox directories.
//! A live serve's directory is never touched: its owner's start time still matches. One
//! without an owner file (made by an older serve) is stale when the pid in its name is gone.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::owner;

/// The start of every work directory's name.
const PREFIX: &str = "scenario-run-serve-";
/// Whether the work directory `dir` belongs to no live process.
fn is_stale(dir: &Path) -> bool {
    match std::fs::read_to_string(dir.join(owner::FILE)) {
        Ok(token) => owner::token_gone(&token),
        // An older serve's (no owner file): `<prefix><pid>-<port>`.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let pid = name.strip_prefix(PREFIX).and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok());
            pid.is_none_or(owner::pid_gone)
        }
        // Unreadable: not ours to judge.
        Err(_) => false,
    }
}

/// Whether `path` is a directory (not a link) that this user owns: the only kind swept.
fn own_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.uid() == rustix::process::geteuid().as_raw())
}

/// Removes the work directories under `tmp` whose serve is gone; returns how many.
pub(crate) fn sweep_in(tmp: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(tmp) else { return 0 };
    let mut swept = 0;
    for e in entries.flatten() {
        let path = e.path();
        if !e.file_name().to_string_lossy().starts_with(PREFIX) || !own_dir(&path) || !is_stale(&path) {
            continue;
        }
        // std's remove_dir_all never follows a link below the directory.
        if std::fs::remove_dir_all(&path).is_ok() {
            swept += 1;
        }
    }
    swept
}

/// Removes the work directories whose serve is gone (SIGKILLed, say) from the temporary
/// directory serve uses.
pub fn sweep_stale() -> usize {
    sweep_in(&std::env::temp_dir())
}

/// Makes this serve's work directory under `tmp` for `port`; see the module documentation.
pub(crate) fn create_in(tmp: &Path, port: u16) -> io::Result<PathBuf> {
    let dir = tmp.join(format!("{PREFIX}{}-{port}", std::process::id()));
    let make = || std::fs::DirBuilder::new().mode(0o700).create(&dir);
    match make() {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && own_dir(&dir) && is_stale(&dir) => {
            std::fs::remove_dir_all(&dir)?;
            make()?;
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(io::Error::new(
                e.kind(),
                format!("serve's work directory {} exists and is not a stale one of serve's; remove it", dir.display()),
            ))
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("cannot make {}: {e}", dir.display()))),
    }
    owner::mark(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_owners_directories_are_swept_and_live_ones_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = create_in(tmp.path(), 1).unwrap();
        assert!(!is_stale(&mine));
        // A dead owner, an older serve's without an owner file whose pid is gone, and one
        // whose pid lives.
        let dead = tmp.path().join(format!("{PREFIX}1-2"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(owner::FILE), format!("{}:0", u32::MAX - 1)).unwrap();
        let old = tmp.path().join(format!("{PREFIX}{}-3", u32::MAX - 1));
        std::fs::create_dir_all(old.join("spool")).unwrap();
        let old_live = tmp.path().join(format!("{PREFIX}{}-4", std::process::id()));
        std::fs::create_dir(&old_live).unwrap();
        let other = tmp.path().join("unrelated");
        std::fs::create_dir(&other).unwrap();
        assert_eq!(sweep_in(tmp.path()), 2);
        assert!(mine.exists() && old_live.exists() && other.exists());
        assert!(!dead.exists() && !old.exists());
    }

    #[test]
    fn a_name_taken_by_anything_but_a_stale_work_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let planted = tmp.path().join(format!("{PREFIX}{}-5", std::process::id()));
        std::os::unix::fs::symlink(target.path(), &planted).unwrap();
        let e = create_in(tmp.path(), 5).unwrap_err();
        assert!(e.to_string().contains("is not a stale one of serve's"), "{e}");
        assert!(std::fs::read_dir(target.path()).unwrap().next().is_none());
        // A stale one of ours is replaced.
        let stale = tmp.path().join(format!("{PREFIX}{}-6", std::process::id()));
        std::fs::create_dir(&stale).unwrap();
        std::fs::write(stale.join(owner::FILE), format!("{}:0", u32::MAX - 1)).unwrap();
        std::fs::write(stale.join("left"), "x").unwrap();
        let made = create_in(tmp.path(), 6).unwrap();
        assert!(!made.join("left").exists());
        assert_eq!(std::fs::read_to_string(made.join(owner::FILE)).unwrap(), owner::token());
    }
}

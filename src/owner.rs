//! Who made a leftover. Every directory, cgroup and mount point the local provider makes, and
//! serve's work directory, carries the identity of the process that made it, `<pid>:<start
//! time>` (the start time tells a reused pid apart), so that the next run sweeps what a
//! killed one left, and never what a live run sharing the directory still uses.
//!
//! * A directory holds it in its [`FILE`] ([`mark`]).
//! * A cgroup or a mount point is named `<pid>.<start time>.<id>` ([`name`], [`name_gone`]).

use std::path::Path;

/// In each directory a run makes: `<pid>:<start time>` of the process that made it.
pub(crate) const FILE: &str = "owner";

/// This process as `<pid>:<start time in clock ticks>`.
pub(crate) fn token() -> String {
    let pid = std::process::id();
    format!("{pid}:{}", start_time(pid).unwrap_or_default())
}

/// Writes this process's [`token`] into `dir`'s [`FILE`].
pub(crate) fn mark(dir: &Path) -> std::io::Result<()> {
    std::fs::write(dir.join(FILE), token())
}

/// Makes directory `dir` carrying this process's [`FILE`], with no moment at which it exists
/// unowned: it is made beside its place under a name that says its owner (`.<pid>.<start
/// time>.new-<random>`, see [`name`]), marked, and renamed into place. (Made and then marked, a
/// run SIGKILLed between the two left a directory no sweep could tell was dead.) A `dir` that
/// exists already is only marked.
pub(crate) fn create_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return mark(dir);
    }
    let parent = dir.parent().ok_or_else(|| std::io::Error::other(format!("{} has no parent", dir.display())))?;
    std::fs::create_dir_all(parent)?;
    let new = parent.join(format!(".{}", name(&format!("new-{}", crate::random::hex(6)))));
    std::fs::create_dir(&new)?;
    let placed = mark(&new).and_then(|()| std::fs::rename(&new, dir));
    if placed.is_err() {
        let _ = std::fs::remove_dir_all(&new);
    }
    placed
}

/// Whether the directory named `file_name` is one [`create_dir`] was making when its process
/// died (`Some(false)` while that process runs; `None` for any other name).
pub(crate) fn unfinished_gone(file_name: &str) -> Option<bool> {
    file_name.strip_prefix('.').filter(|n| n.contains(".new-")).and_then(name_gone)
}

/// The name of this process's `what` (a cgroup's, a mount point's): `<pid>.<start time>.<what>`.
pub(crate) fn name(what: &str) -> String {
    format!("{}.{what}", token().replace(':', "."))
}

/// Whether the process a [`token`] names is gone (a token that names no pid counts as gone).
pub(crate) fn token_gone(token: &str) -> bool {
    let token = token.trim();
    let (pid, start) = token.split_once(':').unwrap_or((token, ""));
    match pid.parse::<u32>() {
        Ok(pid) => start_time(pid).is_none_or(|s| s != start),
        Err(_) => true,
    }
}

/// Whether the process that made `name` (see [`name`]) is gone; `None` for a name this
/// program does not give.
pub(crate) fn name_gone(name: &str) -> Option<bool> {
    let mut parts = name.splitn(3, '.');
    let (Some(pid), Some(start), Some(_)) =
        (parts.next().and_then(|p| p.parse::<u32>().ok()), parts.next(), parts.next())
    else {
        return None;
    };
    Some(start_time(pid).is_none_or(|s| s != start))
}

/// Whether no process `pid` runs.
pub(crate) fn pid_gone(pid: u32) -> bool {
    start_time(pid).is_none()
}

/// Process `pid`'s start time in clock ticks since boot.
fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the parenthesised command name (which may contain spaces).
    stat.rsplit_once(')')?.1.split_whitespace().nth(19).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_never_unowned_and_a_dead_runs_unfinished_one_is_told_apart() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/sbx-1");
        create_dir(&dir).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join(FILE)).unwrap(), token());
        // Nothing is left beside it.
        let beside: Vec<_> =
            std::fs::read_dir(root.path().join("a")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(beside, ["sbx-1"]);
        // Again: marked, kept.
        std::fs::write(dir.join("x"), "1").unwrap();
        create_dir(&dir).unwrap();
        assert!(dir.join("x").exists());
        // What a run dies leaving is named for it; a live run's is not gone.
        let live = format!(".{}", name("new-abc"));
        assert_eq!(unfinished_gone(&live), Some(false));
        assert_eq!(unfinished_gone(".1.2.new-abc"), Some(true));
        assert_eq!(unfinished_gone("sbx-1"), None);
        assert_eq!(unfinished_gone(".cache"), None);
    }

    #[test]
    fn names_and_tokens_of_this_process_are_live_and_others_are_gone() {
        assert_eq!(name_gone(&name("x")), Some(false));
        assert_eq!(name_gone(&format!("{}.1.x", std::process::id())), Some(true), "a reused pid");
        assert_eq!(name_gone("4294967295.1.x"), Some(true));
        assert_eq!(name_gone("lost+found"), None);
        assert_eq!(name_gone("1.2"), None);
        assert!(!token_gone(&format!("{}\n", token())));
        assert!(token_gone(&format!("{}:1", std::process::id())), "a reused pid");
        assert!(token_gone("4294967295:1"));
        assert!(token_gone("garbage"));
        assert!(!pid_gone(std::process::id()) && pid_gone(u32::MAX));
    }
}

//! User namespaces: how root inside a sandbox is nobody on the host.
//!
//! Every sandbox (and build sandbox) gets a user namespace of its own whose ids `0..len` map to
//! the host ids `host_base..host_base+len` (one whole range, as Docker's userns-remap does, so
//! `apt-get`, `chown` and `sudo` work inside). Root inside holds every capability *in that
//! namespace only*: over the sandbox's own mounts, network and processes, and over no host
//! resource. Files of the sandbox's images are stored shifted into that range (see
//! `crate::image`), so they show their image owners inside.
//!
//! The namespace is made by a short-lived holder child that `unshare(CLONE_NEWUSER)`s and
//! waits; as host root we write its `uid_map`/`gid_map` directly (no `newuidmap` needed),
//! keep a descriptor of the namespace, and kill the holder. The sandbox's processes enter the
//! namespace through that descriptor (`setns`), and it lives as long as they do.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

pub(crate) use crate::image::IdMap;

/// The host id of id `inside` of a sandbox (clamped to the range).
pub(crate) fn host_id(map: IdMap, inside: u32) -> u32 {
    map.host_base.saturating_add(inside.min(map.len.saturating_sub(1)))
}

/// A fresh user namespace with `map` for both uids and gids.
pub(crate) fn create(map: IdMap) -> io::Result<OwnedFd> {
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("30").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: `pre_exec` needs an async-signal-safe closure: one raw system call, no
    // allocation. (libc's `unshare`: rustix marks its own unshare as needing care too, for
    // CLONE_FILES, which this does not pass.)
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // spawn() returns once the child has exec'd, so it has unshared by then.
    let mut child = cmd.spawn()?;
    let pid = child.id();
    let result = (|| {
        let line = format!("0 {} {}\n", map.host_base, map.len);
        std::fs::write(format!("/proc/{pid}/uid_map"), &line)?;
        std::fs::write(format!("/proc/{pid}/gid_map"), &line)?;
        let f = std::fs::File::open(format!("/proc/{pid}/ns/user"))?;
        Ok(OwnedFd::from(f))
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_root_to_the_host_base() {
        if !rustix::process::getuid().is_root() {
            panic!("this test needs root (user namespaces with a full id map)");
        }
        let fd = create(IdMap { host_base: 100_000_000, len: 65536 }).unwrap();
        // A process in the namespace sees the map.
        use std::os::fd::AsRawFd;
        let raw = fd.as_raw_fd();
        let mut cmd = Command::new("/bin/cat");
        cmd.arg("/proc/self/uid_map");
        // SAFETY: `pre_exec` needs an async-signal-safe closure: one raw system call on an
        // integer, no allocation; `fd` (the namespace) outlives `output()`, which waits.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(raw, libc::CLONE_NEWUSER) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(fields, ["0", "100000000", "65536"]);
    }
}

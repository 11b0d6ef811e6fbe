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
//! namespace through that descriptor (`setns`), and it lives as long as they do. The holder
//! starts with an empty environment and no inherited descriptor: nothing of the runner is in
//! it even for the moment it lives.
//!
//! **The owner.** The kernel charges a namespace's use of per-user limits (inotify instances
//! and watches, processes, pending signals, message queues: its "ucounts") to each user in it
//! *and*, in every ancestor namespace, to the namespace's owner, the effective uid that
//! created it. Made by host root, every sandbox's inotify instances counted against host
//! root's 128, so one sandbox could starve the host's root (and every other sandbox) of
//! inotify. So the holder creates the namespace under an effective uid of its own, one drawn
//! for each sandbox just above its id range ([`owner_for`]), keeping its capabilities across
//! the change (`SECBIT_NO_SETUID_FIXUP`; it still writes nothing but the namespace). That uid
//! runs no process on the host (a process in the parent namespace with the owner's uid would
//! have every capability in the sandbox's), and each sandbox's use is charged to its own.
//!
//! **Made ahead.** The holder's fork, exec and id maps cost a create 4–5 ms, and the namespace
//! nested in it that commands run in (`enter`) about as much again, so a [`Pool`] keeps a few
//! pairs ready (`SCENARIO_RUN_USERNS_POOL`, default 3), as the networks and disks are. A
//! namespace held only by our descriptor has no process in it and nothing mapped but ids; each
//! has an owner of its own, drawn when it was made, and is handed to one sandbox only (taking
//! it moves the descriptors out of the pool).

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

use super::pool;

pub(crate) use crate::image::IdMap;

/// The host id of id `inside` of a sandbox (clamped to the range).
pub(crate) fn host_id(map: IdMap, inside: u32) -> u32 {
    map.host_base.saturating_add(inside.min(map.len.saturating_sub(1)))
}

/// How many host uids the namespaces' owners are drawn from.
const OWNER_SPAN: u32 = 1 << 20;

/// A host uid to own one sandbox's user namespace: drawn at random from the [`OWNER_SPAN`]
/// uids just above the map (below it where the map ends too close to 2^32), so neither root
/// nor any id a sandbox runs as, and (but for a rare draw) not another live sandbox's.
pub(crate) fn owner_for(map: IdMap) -> u32 {
    let mut b = [0u8; 4];
    crate::random::fill_or_unique(&mut b);
    let r = u32::from_ne_bytes(b);
    let above = map.host_base.saturating_add(map.len);
    // u32::MAX is "no uid" to the kernel; keep clear of it.
    if u32::MAX - 1 - above >= OWNER_SPAN {
        above + r % OWNER_SPAN
    } else {
        let span = OWNER_SPAN.min(map.host_base.saturating_sub(1)).max(1);
        map.host_base.saturating_sub(1 + r % span).max(1)
    }
}

/// A fresh user namespace with `map` for both uids and gids, owned by host uid `owner`
/// (see the module documentation).
pub(crate) fn create(map: IdMap, owner: u32) -> io::Result<OwnedFd> {
    let mut cmd = Command::new("/bin/sleep");
    cmd.arg("30").env_clear().stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    // SAFETY: `pre_exec` needs an async-signal-safe closure: raw system calls on integers, no
    // allocation. (libc's `unshare`: rustix marks its own unshare as needing care too, for
    // CLONE_FILES, which this does not pass.)
    unsafe {
        cmd.pre_exec(move || {
            super::sys::cloexec_from(3)?;
            // The effective uid becomes the owner; the capabilities stay (no fixup), so the
            // kernel creates the namespace for a privileged caller (as it did for root).
            const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
            if libc::prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setresuid(u32::MAX, owner, u32::MAX) != 0 {
                return Err(io::Error::last_os_error());
            }
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

/// What a sandbox's boot answers when its user namespace cannot be made.
pub(crate) fn failed(e: &io::Error) -> crate::provider::ProviderError {
    crate::provider::ProviderError::infra(format!("cannot create a user namespace: {}", super::sys::errno_text(e)))
}

/// A sandbox's user namespace, and the one nested in it that its commands run in when that was
/// made ahead too (else the sandbox's entry makes it once the sandbox runs).
pub(crate) struct Users {
    pub outer: OwnedFd,
    pub inner: Option<OwnedFd>,
}

/// User namespaces of one id map made ahead (see the module documentation).
pub(crate) struct Pool(Arc<pool::Pool<Namespaces>>);

/// What [`Pool`] keeps: namespaces with the sandboxes' id map, each owned by a uid of its own.
struct Namespaces(IdMap);

#[async_trait::async_trait]
impl pool::Maker for Namespaces {
    type Spare = Users;
    type Kind = ();

    fn next(&self, ready: &[&()], target: usize) -> Option<pool::Next<()>> {
        pool::up_to_target(ready, target)
    }

    async fn make(&self, _: &()) -> Option<Users> {
        let map = self.0;
        let outer = tokio::task::spawn_blocking(move || create(map, owner_for(map)).ok()).await.ok().flatten()?;
        let inner = super::enter::make_inner(&outer, map.len).await.ok()?;
        Some(Users { outer, inner: Some(inner) })
    }

    /// Closing the last descriptors ends the namespaces.
    fn destroy_now(&self, users: Users) {
        drop(users);
    }
}

/// Namespaces kept ready when `SCENARIO_RUN_USERNS_POOL` does not say.
const DEFAULT_POOL: usize = 3;

impl Pool {
    /// How many to keep ready: `SCENARIO_RUN_USERNS_POOL`; 0 makes each when it is taken.
    pub(crate) fn new(map: IdMap) -> Arc<Self> {
        let target = pool::target_from_env("SCENARIO_RUN_USERNS_POOL", DEFAULT_POOL, 64);
        Arc::new(Self(pool::Pool::new(Namespaces(map), target)))
    }

    /// A fresh namespace of the pool's map, owned by a uid of its own: one made ahead with its
    /// nested one, or a new one alone (blocking: a fork and an exec). Taking one starts the
    /// refill.
    pub(crate) fn take(&self) -> io::Result<Users> {
        match self.0.take(&()) {
            Some(users) => Ok(users),
            None => {
                let map = self.0.maker().0;
                Ok(Users { outer: create(map, owner_for(map))?, inner: None })
            }
        }
    }

    /// Ends every namespace kept ready; no more are made.
    pub(crate) fn close(&self) {
        drop(self.0.close_now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_root_to_the_host_base() {
        if !rustix::process::getuid().is_root() {
            panic!("this test needs root (user namespaces with a full id map)");
        }
        let map = IdMap { host_base: 100_000_000, len: 65536 };
        let owner = owner_for(map);
        let fd = create(map, owner).unwrap();
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
        // Its owner is the uid drawn for it, not host root (whose per-user limits every
        // sandbox's use would otherwise be charged to).
        const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
        let mut uid: libc::uid_t = 0;
        // SAFETY: the ioctl writes one uid_t into `uid`, which outlives the call.
        assert_eq!(unsafe { libc::ioctl(raw, NS_GET_OWNER_UID, &mut uid) }, 0);
        assert_eq!(uid, owner);
        assert!(uid >= map.host_base + map.len, "owner {uid} is inside the map or root");
    }

    #[test]
    fn owners_stay_clear_of_root_the_map_and_no_uid() {
        for map in [IdMap { host_base: 100_000_000, len: 65536 }, IdMap { host_base: u32::MAX - 70_000, len: 65536 }] {
            for _ in 0..1000 {
                let o = owner_for(map);
                assert!(o != 0 && o != u32::MAX, "{o}");
                assert!(o < map.host_base || o >= map.host_base + map.len, "{o} is inside {map}");
            }
        }
    }
}

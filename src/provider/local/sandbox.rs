//! Starting, probing and stopping one isolated sandbox.
//!
//! A sandbox is a bubblewrap (`bwrap`) process tree whose root is an overlay of its image
//! (and of the template layers built on it, `lowerdir=<layers>:<image>`) with a per-sandbox
//! upper directory. It runs in a **user namespace of its own** (see `userns`): root inside is
//! an unprivileged id range on the host. bwrap then unshares the mount, PID, IPC, UTS and
//! cgroup namespaces (the network namespace, with only `lo` up, is made by host root before,
//! see `egress`), mounts a fresh `/proc` and a
//! minimal `/dev`, pivots into the overlay (so nothing of the host's filesystem is visible),
//! drops every capability of its keep-alive child, and reaps zombies as the namespace's pid 1.
//! `/sys` is not mounted. bwrap mounts the root `nosuid`; `enter::inner_namespace` lifts
//! that for `/` alone, so `sudo` works inside.
//!
//! Why bubblewrap: it is the field's standard sandbox launcher (Flatpak, many agent
//! sandboxes), packaged by Debian, and gets the fiddly parts right: `/dev`, a `/proc` for the
//! new PID namespace, `lo`, pid 1's reaping, `--info-fd` to report the host pid of that pid 1,
//! and `--die-with-parent`, so a crashed scenario-run takes its sandboxes with it. bwrap 0.8
//! (Debian 12) has no overlay options and would map only one id in a user namespace of its own
//! making, so the forked child (in `pre_exec`), still host root, first joins the sandbox's
//! control groups, unshares a private mount namespace and mounts the overlay there (`nodev`);
//! then it enters the prepared user namespace as its root and exec's bwrap. The overlay exists
//! only in that namespace and vanishes with the sandbox's last process: no host mount can
//! leak, not even on SIGKILL of scenario-run. Mounts made by host root and carried into the
//! sandbox's (less privileged) mount namespace are locked: they cannot be unmounted to reveal
//! what is below.
//!
//! The namespace's pid 1 is bwrap's reaper; its child is `sleep infinity`, which only keeps
//! the sandbox alive. Commands enter from outside (`enter`). Killing pid 1 makes the kernel
//! kill every process in the PID namespace; the outer bwrap then exits and we reap it; what is
//! left in the sandbox's control group is killed too, and the group removed.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::process::{Gid, Uid};

use super::process::{BASH_ENV_IN_SANDBOX, BASH_ENV_SCRIPT};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

use super::cgroup::{Cgroup, Limits};
use super::enter::Entry;
use super::sys::{self, Pidfd};
use super::userns::{self, IdMap};
use crate::provider::{ProviderError, Result};

/// Seconds to wait for bwrap to report and the sandbox to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(15);
/// Seconds to wait for the outer bwrap to exit after pid 1 was killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Where sandbox roots are mounted (each in its own private mount namespace only; on the host
/// these are empty directories). bwrap, already the namespace's root when it binds the root,
/// must be able to walk to it, which a state directory inside a 0700 home or temporary
/// directory would not allow; this path is traversable (0711) and each entry is the sandbox
/// root's own (0700).
pub(crate) const ROOTS: &str = "/run/scenario-run/roots";

/// A fresh mount point under [`ROOTS`], named `<owner pid>.<start time>.<random>` so the next
/// run can sweep what a killed one left.
fn mount_point() -> PathBuf {
    Path::new(ROOTS).join(crate::owner::name(&crate::random::hex(6)))
}

/// Removes mount points whose owner process is gone (empty directories a SIGKILLed run left).
pub(crate) fn sweep_mount_points() {
    let Ok(entries) = std::fs::read_dir(ROOTS) else { return };
    for e in entries.flatten() {
        // Only mount points named the way this program names them.
        if crate::owner::name_gone(&e.file_name().to_string_lossy()) == Some(true) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Where a sandbox keeps its state on the host (all under `<state_dir>/<id>`, but for its
/// mount point), and what it is made of.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    /// Read-only layers, topmost first; the last is the image's root filesystem.
    pub lowers: Vec<PathBuf>,
    /// The network the sandbox joins (see `netns`); None: a namespace of its own with only
    /// `lo` (the isolation probe).
    pub net: Option<Arc<super::netns::Net>>,
    /// Host directories bound read-only at a path inside.
    pub ro_binds: Vec<(PathBuf, String)>,
    /// Host directories bound read-write at a path inside (a build's package caches). Like the
    /// read-only ones they are mounted by host root before the user namespace is entered, so
    /// they may live where the sandbox's root could not reach (under a 0700 home); what is in
    /// them must belong to the sandbox's ids to be usable inside. Their mount points are made in
    /// the upper directory (see [`Layout::create`]) and removed by [`Layout::remove_mount_points`].
    pub rw_binds: Vec<(PathBuf, String)>,
    /// Host directories a create asked to bind (serve's OpenSandbox volumes), read-only or
    /// not. Unlike the binds above their mount points are made in the mounted root just
    /// before binding (the upper directory may be on a disk not mounted here), refusing a
    /// path that goes through a symbolic link (which would resolve on the host); what the
    /// sandbox writes there is the host directory's business (its owner and mode decide).
    pub volumes: Vec<crate::provider::Mount>,
    pub ids: IdMap,
    pub limits: Limits,
    /// The disk the upper and work directories live on (see `disk`); None: on the host's
    /// filesystem in `dir` (template builds, whose upper directory becomes their layer).
    pub disk: Option<super::disk::Disk>,
}

impl Layout {
    pub(crate) fn new(dir: &Path, ids: IdMap, limits: Limits) -> Self {
        Self {
            dir: dir.to_path_buf(),
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: mount_point(),
            lowers: Vec::new(),
            net: None,
            ro_binds: Vec::new(),
            rw_binds: Vec::new(),
            volumes: Vec::new(),
            ids,
            limits,
            disk: None,
        }
    }

    /// Puts the upper and work directories on `disk` (whose image the caller makes).
    pub(crate) fn on_disk(&mut self, disk: super::disk::Disk) {
        self.upper = disk.upper();
        self.work = disk.work();
        self.disk = Some(disk);
    }

    /// Creates the directories, owned by the sandbox's root (so `/` inside is root's and
    /// bwrap, already inside the user namespace, can reach `merged`), and, without a disk, the
    /// upper layer's first files ([`seed_upper`]). With a disk only its mount point is made:
    /// the image (seeded the same way) is the caller's.
    pub(crate) fn create(&self) -> std::io::Result<()> {
        let root = userns::host_id(self.ids, 0);
        for d in [Path::new("/run/scenario-run"), Path::new(ROOTS)] {
            std::fs::create_dir_all(d)?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711))?;
        }
        for d in [&self.dir, &self.merged] {
            std::fs::create_dir_all(d)?;
            std::os::unix::fs::lchown(d, Some(root), Some(root))?;
        }
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(disk) = &self.disk {
            return std::fs::create_dir_all(&disk.mount);
        }
        for d in [&self.upper, &self.work] {
            std::fs::create_dir_all(d)?;
            std::os::unix::fs::lchown(d, Some(root), Some(root))?;
        }
        let binds: Vec<&str> = self.ro_binds.iter().chain(&self.rw_binds).map(|(_, inside)| inside.as_str()).collect();
        seed_upper(&self.upper, self.ids, self.net.is_some(), &binds, &self.lowers)
    }

    /// Removes the read-write binds' mount points from the upper directory, and the parents
    /// they needed, as far as they are empty: what stays is what the sandbox itself wrote.
    pub(crate) fn remove_mount_points(&self) {
        for (_, inside) in &self.rw_binds {
            let mut d = self.upper.join(inside.trim_start_matches('/'));
            while d != self.upper && std::fs::remove_dir(&d).is_ok() {
                if !d.pop() {
                    break;
                }
            }
        }
    }

    /// The same sandbox for its next boot (a resume from a filesystem-only pause): the same
    /// layers and limits, a fresh mount point (the last one went with the last boot).
    pub(crate) fn for_reboot(&self) -> std::io::Result<Self> {
        let next = Self { merged: mount_point(), ..self.clone() };
        let root = userns::host_id(self.ids, 0);
        std::fs::create_dir_all(&next.merged)?;
        std::os::unix::fs::lchown(&next.merged, Some(root), Some(root))?;
        Ok(next)
    }
}

fn bad_path(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("unusable {what} path"))
}

/// What of bwrap's stderr a failed start reports.
const STDERR_LIMIT: usize = 16 * 1024;

/// At most `limit` bytes of `from`, as text, within `within` (the writers may outlive us).
async fn read_bounded(from: impl tokio::io::AsyncRead + Unpin, limit: usize, within: Duration) -> String {
    let mut buf = Vec::new();
    let mut take = from.take(limit as u64);
    let _ = tokio::time::timeout(within, take.read_to_end(&mut buf)).await;
    String::from_utf8_lossy(&buf).into_owned()
}

/// Writes an upper layer's first files into `upper` (an existing directory), all the sandbox
/// root's: the mount points of `binds` (paths inside; a directory `lowers` have keeps its mode
/// and owner), the login-shell hook (see `process`) and, as a container runtime writes them,
/// `/etc/hosts`, `/etc/hostname` and (with a network) `/etc/resolv.conf`.
pub(crate) fn seed_upper(
    upper: &Path,
    ids: IdMap,
    resolver: bool,
    binds: &[&str],
    lowers: &[PathBuf],
) -> std::io::Result<()> {
    let root = userns::host_id(ids, 0);
    std::fs::set_permissions(upper, std::fs::Permissions::from_mode(0o755))?;
    std::os::unix::fs::lchown(upper, Some(root), Some(root))?;
    for inside in binds {
        let mut d = upper.to_path_buf();
        let mut rel = PathBuf::new();
        for part in Path::new(inside.trim_start_matches('/')).iter() {
            d.push(part);
            rel.push(part);
            if !d.exists() {
                // A directory the image has keeps its mode and owner (`/tmp` stays 1777); a
                // new one is root's.
                use std::os::unix::fs::MetadataExt;
                let below = lowers.iter().find_map(|l| std::fs::symlink_metadata(l.join(&rel)).ok());
                std::fs::create_dir(&d)?;
                let (mode, uid, gid) =
                    below.filter(|m| m.is_dir()).map_or((0o755, root, root), |m| (m.mode() & 0o7777, m.uid(), m.gid()));
                std::os::unix::fs::lchown(&d, Some(uid), Some(gid))?;
                std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode))?;
            }
        }
    }
    let rc = upper.join(BASH_ENV_IN_SANDBOX.trim_start_matches('/'));
    let mut d = upper.to_path_buf();
    for part in Path::new(BASH_ENV_IN_SANDBOX.trim_start_matches('/')).parent().into_iter().flat_map(|p| p.iter()) {
        d.push(part);
        if !d.exists() {
            std::fs::create_dir(&d)?;
            std::os::unix::fs::lchown(&d, Some(root), Some(root))?;
        }
    }
    std::fs::write(&rc, BASH_ENV_SCRIPT)?;
    std::os::unix::fs::lchown(&rc, Some(root), Some(root))?;
    // As a container runtime does: the sandbox's own name resolves whatever the image ships,
    // and names are asked of the resolver its network answers at.
    let mut files = vec![("hosts", HOSTS.to_string()), ("hostname", format!("{HOSTNAME}\n"))];
    if resolver {
        files.push(("resolv.conf", format!("nameserver {}\n", super::netns::RESOLVER)));
    }
    let etc = upper.join("etc");
    for (name, text) in files {
        let p = etc.join(name);
        std::fs::write(&p, text)?;
        std::os::unix::fs::lchown(&p, Some(root), Some(root))?;
    }
    Ok(())
}

/// Writes the seed of a sandbox's disk image into `seed`: `upper` as [`seed_upper`] makes it
/// for a sandbox with a network and no binds, and an empty `work`, both the sandbox root's.
pub(crate) fn write_disk_seed(seed: &Path, ids: IdMap) -> std::io::Result<()> {
    let root = userns::host_id(ids, 0);
    let _ = std::fs::remove_dir_all(seed);
    for d in [seed.join("upper"), seed.join("work")] {
        std::fs::create_dir_all(&d)?;
        std::os::unix::fs::lchown(&d, Some(root), Some(root))?;
    }
    seed_upper(&seed.join("upper"), ids, true, &[], &[])
}

/// Where the kernel tells a boot apart (`/proc/sys/kernel/random/boot_id`). A sandbox shares
/// the host's kernel, so each of its boots gets one of its own, bound read-only over it.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// A pipe whose read end yields a fresh boot id (for `--ro-bind-data`).
fn boot_id_pipe() -> std::io::Result<OwnedFd> {
    let (r, w) = sys::cloexec_pipe()?;
    std::fs::File::from(w).write_all(format!("{}\n", crate::random::uuid_v4()).as_bytes())?;
    Ok(r)
}

/// The sandbox's hostname, and the `/etc/hosts` that resolves it.
const HOSTNAME: &str = "localhost";
const HOSTS: &str = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";

/// The `bwrap` command line for `layout`, with the `pre_exec` hook described in the module
/// documentation. `info_fd` becomes fd 3 (`--info-fd 3`), `seccomp_fd` fd 4, `boot_id_fd`
/// (if any) fd 5, whose contents become the sandbox's boot id. `disk_dev` is the loop device
/// of the layout's disk (mounted at its mount point before the overlay).
#[allow(clippy::too_many_arguments)]
fn bwrap_command(
    layout: &Layout,
    userns: &OwnedFd,
    cgroup: Option<&Cgroup>,
    info_fd: i32,
    seccomp_fd: i32,
    boot_id_fd: Option<i32>,
    disk_dev: Option<&std::ffi::CStr>,
    argv: &[&str],
    probe: bool,
) -> std::io::Result<std::process::Command> {
    use std::ffi::CString;
    let disk = match (&layout.disk, disk_dev) {
        (Some(d), Some(dev)) => {
            let at = CString::new(d.mount.as_os_str().as_encoded_bytes()).map_err(|_| bad_path("disk"))?;
            Some((dev.to_owned(), at))
        }
        (None, None) => None,
        _ => return Err(std::io::Error::other("a disk needs its loop device")),
    };
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("unusable {what} path"));
    if layout.lowers.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a sandbox needs an image"));
    }
    for p in [&layout.upper, &layout.work].into_iter().chain(&layout.lowers) {
        let s = p.to_str().ok_or_else(|| bad("state"))?;
        // overlayfs splits its options at ',' and lowerdir at ':'.
        if s.contains([',', ':']) {
            return Err(bad("layer (contains ',' or ':')"));
        }
    }
    let lower = layout.lowers.iter().map(|l| l.display().to_string()).collect::<Vec<_>>().join(":");
    let opts = format!("lowerdir={lower},upperdir={},workdir={}", layout.upper.display(), layout.work.display());
    let c_merged = CString::new(layout.merged.to_str().ok_or_else(|| bad("state"))?).map_err(|_| bad("state"))?;
    let c_opts = CString::new(opts).map_err(|_| bad("state"))?;
    let c_overlay = CString::new("overlay").expect("static");
    let c_root = CString::new("/").expect("static");
    let procs: Vec<CString> = cgroup.map(|c| c.procs.clone()).unwrap_or_default();
    let userns = userns.as_raw_fd();

    let mut cmd = std::process::Command::new("bwrap");
    // Built from nothing: the runner's environment (keys, tokens) never reaches pid 1, and bwrap
    // passes its own to the sandbox's keep-alive.
    cmd.env_clear().env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    if probe {
        // The host's root, read-only, stands in for an image; the overlay is bound below it.
        cmd.args(["--ro-bind", "/", "/", "--tmpfs", "/tmp", "--bind"]).arg(&layout.merged).arg("/tmp/probe");
    } else {
        cmd.arg("--bind").arg(&layout.merged).arg("/");
    }
    cmd.args(["--dev", "/dev", "--proc", "/proc"]);
    if boot_id_fd.is_some() {
        cmd.args(["--perms", "0444", "--ro-bind-data", "5", BOOT_ID]);
    }
    // The binds are mounted into the root by the child, as host root (bwrap, as the
    // namespace's root, might not reach their host paths: a 0700 home holds the build caches).
    let mut binds = Vec::new();
    let ro = layout.ro_binds.iter().map(|b| (b, true));
    for ((host, inside), read_only) in ro.chain(layout.rw_binds.iter().map(|b| (b, false))) {
        let target = layout.merged.join(inside.trim_start_matches('/'));
        binds.push((
            CString::new(host.to_str().ok_or_else(|| bad("bind"))?).map_err(|_| bad("bind"))?,
            CString::new(target.to_str().ok_or_else(|| bad("bind"))?).map_err(|_| bad("bind"))?,
            read_only,
        ));
    }
    // The volumes: each component of the mount point (made if missing, the sandbox root's),
    // then the bind.
    let mut volumes = Vec::new();
    for m in &layout.volumes {
        let mut parts = Vec::new();
        let mut at = layout.merged.clone();
        for part in Path::new(m.path.trim_start_matches('/')).components() {
            let std::path::Component::Normal(part) = part else { return Err(bad("volume mount")) };
            at.push(part);
            parts.push(CString::new(at.as_os_str().as_encoded_bytes()).map_err(|_| bad("volume mount"))?);
        }
        if parts.is_empty() {
            return Err(bad("volume mount (the root)"));
        }
        // The directory checked when the volume was opened, as a detached mount tree cloned
        // from its descriptor (inherited by the child below, which attaches it): never its
        // name again, which a sandbox sharing it may have swapped.
        let tree = m.host.clone_tree().map_err(|e| {
            std::io::Error::new(e.kind(), format!("volume {}: cannot clone its mount: {e}", m.host.shown().display()))
        })?;
        volumes.push((tree, parts, m.read_only));
    }
    let root_id = userns::host_id(layout.ids, 0);
    // The hostname resolves in any image (`sudo` looks it up).
    cmd.args(["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup", "--hostname", HOSTNAME]);
    // The network namespace is joined (or, for the probe, made) by the child below, as host
    // root (see `netns`).
    let join_net = layout.net.as_ref().map(|n| n.namespace().as_raw_fd());
    cmd.args(["--die-with-parent", "--cap-drop", "ALL", "--info-fd", "3", "--seccomp", "4", "--chdir", "/", "--"])
        .args(argv);
    // Own process group: a Ctrl-C on the terminal reaches scenario-run, which then tears the
    // sandboxes down in order, instead of killing them under its feet.
    cmd.process_group(0);
    // SAFETY: `pre_exec` needs an async-signal-safe closure: it makes raw system calls only
    // (through rustix where it has a safe form, each one `syscall` instruction without
    // allocating, paths passed as `&CStr`) on data prepared above and owned by the closure;
    // `userns` is the raw number of a descriptor the caller keeps open until the spawn
    // returned. `own_network` holds to the same.
    unsafe {
        cmd.pre_exec(move || {
            use rustix::mount::{MountFlags, MountPropagationFlags};
            for p in &procs {
                super::enter::join_cgroup(p)?;
            }
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Slave, not private: this namespace lives as long as the sandbox (bwrap's outer
            // process stays in it) and starts as a copy of the host's mounts. A private copy
            // kept every mount the host had at that instant, and went on holding it after the
            // host unmounted it: a Docker engine's container root being written to at that
            // moment (`docker cp`, a build step) stayed mounted here, and the engine's next
            // mount of the same upper directory ("upperdir is in-use") gave the container an
            // empty root (exit 127, "no matching entries in passwd file"). As a slave, the
            // host's unmounts reach this copy; nothing mounted here reaches the host.
            rustix::mount::mount_change(
                c_root.as_c_str(),
                MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM,
            )?;
            // The disk first: the overlay's upper and work directories are on it.
            if let Some((dev, at)) = &disk {
                let flags = MountFlags::NODEV | MountFlags::NOSUID | MountFlags::NOATIME;
                rustix::mount::mount(dev.as_c_str(), at.as_c_str(), c"ext4", flags, c"")?;
            }
            let (overlay, merged) = (c_overlay.as_c_str(), c_merged.as_c_str());
            rustix::mount::mount(overlay, merged, overlay, MountFlags::NODEV, c_opts.as_c_str())?;
            // Still host root, in the private mount namespace: bwrap's recursive bind of the
            // root carries these along. Read-only ones (the build context) and read-write ones
            // (a build's package caches) alike are nosuid and nodev.
            for (src, dst, read_only) in &binds {
                rustix::mount::mount_bind_recursive(src.as_c_str(), dst.as_c_str())?;
                let ro = if *read_only { MountFlags::RDONLY } else { MountFlags::empty() };
                // A bind remount takes no options: the empty data string is as NULL was.
                let flags = MountFlags::BIND | ro | MountFlags::NOSUID | MountFlags::NODEV;
                rustix::mount::mount_remount(dst.as_c_str(), flags, c"")?;
            }
            for (src, parts, read_only) in &volumes {
                for p in parts {
                    // Nothing of the sandbox runs yet: what lstat sees is what mkdir and the
                    // bind below find.
                    let mut st: libc::stat = std::mem::zeroed();
                    if libc::lstat(p.as_ptr(), &mut st) == 0 {
                        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
                        }
                    } else {
                        if libc::mkdir(p.as_ptr(), 0o755) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        if libc::lchown(p.as_ptr(), root_id, root_id) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
                let dst = parts.last().expect("a volume has a mount point");
                rustix::mount::move_mount(
                    src,
                    c"",
                    rustix::fs::CWD,
                    dst.as_c_str(),
                    rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
                )?;
                let ro = if *read_only { MountFlags::RDONLY } else { MountFlags::empty() };
                let flags = MountFlags::BIND | ro | MountFlags::NOSUID | MountFlags::NODEV;
                rustix::mount::mount_remount(dst.as_c_str(), flags, c"")?;
            }
            match join_net {
                Some(fd) => {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                None => own_network()?,
            }
            if libc::setns(userns, libc::CLONE_NEWUSER) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            rustix::thread::set_thread_groups(&[])?;
            rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT)?;
            rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT)?;
            sys::dup_onto(info_fd, 3)?;
            sys::dup_onto(seccomp_fd, 4)?;
            if let Some(fd) = boot_id_fd {
                sys::dup_onto(fd, 5)?;
            }
            // Nothing else crosses: no descriptor the runner inherited or holds.
            sys::cloexec_from(6)
        });
    }
    Ok(cmd)
}

/// In the forked child of the isolation probe, still host root: a network namespace of its
/// own with `lo` up (sandboxes and builds join the one `netns` made for them). Only
/// async-signal-safe system calls.
///
/// # Safety
/// Called between fork and exec.
unsafe fn own_network() -> std::io::Result<()> {
    let err = std::io::Error::last_os_error;
    // An all-zero ifreq is valid; this is the stack, no allocation.
    let mut lo: libc::ifreq = std::mem::zeroed();
    lo.ifr_name[0] = b'l' as libc::c_char;
    lo.ifr_name[1] = b'o' as libc::c_char;
    let lo = &mut lo;
    if libc::unshare(libc::CLONE_NEWNET) != 0 {
        return Err(err());
    }
    let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
    if s < 0 {
        return Err(err());
    }
    if libc::ioctl(s, libc::SIOCGIFFLAGS, lo as *mut libc::ifreq) != 0 {
        libc::close(s);
        return Err(err());
    }
    lo.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    let up = libc::ioctl(s, libc::SIOCSIFFLAGS, lo as *mut libc::ifreq);
    libc::close(s);
    if up != 0 {
        return Err(err());
    }
    Ok(())
}

/// A pipe whose read end yields the seccomp program's bytes (for `--seccomp`).
fn seccomp_pipe() -> std::io::Result<OwnedFd> {
    let (r, w) = sys::cloexec_pipe()?;
    let bytes = super::seccomp::to_bytes(&super::seccomp::program());
    std::fs::File::from(w).write_all(&bytes)?;
    Ok(r)
}

/// A running namespace tree (bubblewrap's pid 1 and what it holds): one boot of a local
/// provider's `Sandbox`, or a template build's scratch sandbox.
#[derive(Debug)]
pub(crate) struct NsSandbox {
    /// The namespace's pid 1 (bwrap's reaper), by host pid.
    pub pid1: Pidfd,
    /// What commands join.
    pub entry: Arc<Entry>,
    /// The outer bwrap process, our direct child, and its pid: it lives in the private mount
    /// namespace that holds the sandbox's disk and overlay (see `disk`).
    bwrap: tokio::sync::Mutex<tokio::process::Child>,
    outer: u32,
    cgroup: Option<Cgroup>,
    /// The (host-side empty) mount point of its root, removed when it stops.
    mount_point: PathBuf,
    /// Set once `stop` ran; a sandbox dropped without it is killed by `Drop`.
    stopped: std::sync::atomic::AtomicBool,
}

impl Drop for NsSandbox {
    /// A sandbox whose owner was dropped mid-way (a cancelled build, an interrupted create)
    /// must not outlive it: kill pid 1 and whatever the cgroup holds, and remove the cgroup.
    /// (The outer bwrap is a `kill_on_drop` child, which tokio reaps.) Removing the cgroup
    /// waits for the processes to go: a cleanup thread does it (see `reaper`), as a drop may
    /// run on a runtime worker.
    fn drop(&mut self) {
        if !self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            self.stop_now();
            let (cgroup, mount_point) = (self.cgroup.take(), std::mem::take(&mut self.mount_point));
            super::reaper::run(move || {
                if let Some(c) = cgroup {
                    c.remove();
                }
                let _ = std::fs::remove_dir(mount_point);
            });
        }
    }
}

impl NsSandbox {
    /// Starts the sandbox and waits until its root is in place. `name` names its cgroup;
    /// `users` is the fresh user namespace it runs in (see `userns`), made here when None.
    pub(crate) async fn start(layout: Layout, name: &str, users: Option<userns::Users>) -> Result<Self> {
        let (users, inner) = match users {
            Some(u) => (Some(u.outer), u.inner),
            None => (None, None),
        };
        let infra = |what: &str, e: std::io::Error| ProviderError::infra(format!("{what}: {}", sys::errno_text(&e)));
        // Directories and files of the cgroup filesystem: off the runtime.
        let (group, limits) = (super::cgroup::group_name(name), layout.limits);
        let created = tokio::task::spawn_blocking(move || Cgroup::create(&group, limits))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        let cgroup = match created {
            Ok(c) => c,
            Err(e) => {
                let _ = tokio::fs::remove_dir(&layout.merged).await;
                return Err(infra("cannot create the sandbox's cgroup", e));
            }
        };
        let (pid1, mut child) = match Self::start_in(&layout, cgroup.as_ref(), users).await {
            Ok(started) => started,
            Err(e) => {
                if let Some(c) = &cgroup {
                    c.kill_all().await;
                    c.remove_async().await;
                }
                let _ = tokio::fs::remove_dir(&layout.merged).await;
                return Err(e);
            }
        };
        let rlimits = cgroup.is_none().then_some(layout.limits);
        let procs = cgroup.as_ref().map(|c| c.procs.clone()).unwrap_or_default();
        let opened = Entry::open(pid1.pid(), layout.ids.len, procs, rlimits, inner).await.map(Arc::new);
        match opened {
            Ok(entry) => Ok(Self {
                pid1,
                entry,
                outer: child.id().unwrap_or(0),
                bwrap: tokio::sync::Mutex::new(child),
                cgroup,
                mount_point: layout.merged.clone(),
                stopped: std::sync::atomic::AtomicBool::new(false),
            }),
            Err(e) => {
                let _ = pid1.signal(libc::SIGKILL);
                let _ = tokio::time::timeout(STOP_TIMEOUT, child.wait()).await;
                if let Some(c) = &cgroup {
                    c.kill_all().await;
                    c.remove_async().await;
                }
                let _ = tokio::fs::remove_dir(&layout.merged).await;
                Err(infra("sandbox namespaces vanished", e))
            }
        }
    }

    async fn start_in(
        layout: &Layout,
        cgroup: Option<&Cgroup>,
        users: Option<OwnedFd>,
    ) -> Result<(Pidfd, tokio::process::Child)> {
        let ns = match users {
            Some(ns) => ns,
            None => userns::create(layout.ids, userns::owner_for(layout.ids)).map_err(|e| userns::failed(&e))?,
        };
        let (info_r, info_w) = sys::cloexec_pipe()?;
        let seccomp = seccomp_pipe()?;
        let boot_id = boot_id_pipe()?;
        // The disk's loop device (the sandbox's, attached once: see `disk`).
        let dev = match &layout.disk {
            Some(d) => Some(d.dev.clone().ok_or_else(|| ProviderError::infra("the sandbox's disk is not attached"))?),
            None => None,
        };
        let mut cmd = bwrap_command(
            layout,
            &ns,
            cgroup,
            info_w.as_raw_fd(),
            seccomp.as_raw_fd(),
            Some(boot_id.as_raw_fd()),
            dev.as_ref().map(|d| d.path.as_c_str()),
            &["/bin/sh", "-c", "echo ready && exec sleep infinity"],
            false,
        )?;
        // stderr is a pipe read only while the sandbox starts (for bwrap's own errors), then
        // closed: a file would stay open for writing in pid 1 and its keep-alive, which the
        // sandbox's root could write into (it once filled a root-owned host log that way).
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        // Safety net: if we drop the child before it is tracked, the outer bwrap is killed
        // and `--die-with-parent` takes the sandbox with it.
        cmd.kill_on_drop(true);
        let handle = tokio::runtime::Handle::current();
        let spawned = sys::on_spawner(move || {
            let _guard = handle.enter();
            let r = cmd.spawn();
            drop((ns, seccomp, boot_id, dev));
            r
        })
        .await?;
        drop(info_w);
        let mut child =
            spawned.map_err(|e| ProviderError::infra(format!("cannot start bwrap: {}", sys::errno_text(&e))))?;

        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let ready = async {
            let mut info = Vec::new();
            let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(info_r)?;
            rx.read_to_end(&mut info).await?;
            let v: serde_json::Value = serde_json::from_slice(&info).map_err(std::io::Error::other)?;
            let pid = v
                .get("child-pid")
                .and_then(|p| p.as_u64())
                .ok_or_else(|| std::io::Error::other("bwrap reported no child-pid"))?;
            let mut line = String::new();
            if let Some(out) = stdout {
                BufReader::new(out).read_line(&mut line).await?;
            }
            if line.trim() != "ready" {
                return Err(std::io::Error::other("sandbox init did not start (does the image have /bin/sh?)"));
            }
            Ok::<u32, std::io::Error>(pid as u32)
        };
        let outcome = tokio::time::timeout(START_TIMEOUT, ready).await;
        let pid = match outcome {
            Ok(Ok(pid)) => pid,
            other => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(STOP_TIMEOUT, child.wait()).await;
                let log = match stderr {
                    Some(e) => read_bounded(e, STDERR_LIMIT, STOP_TIMEOUT).await,
                    None => String::new(),
                };
                let why = match other {
                    Err(_) => "timed out waiting for the sandbox to start".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    Ok(Ok(_)) => unreachable!(),
                };
                let log = log.trim();
                return Err(ProviderError::infra(if log.is_empty() {
                    format!("cannot start sandbox: {why}")
                } else {
                    format!("cannot start sandbox: {why}: {log}")
                }));
            }
        };
        drop(stderr);
        let pid1 = Pidfd::open(pid).map_err(|e| ProviderError::infra(format!("sandbox pid 1 vanished: {e}")))?;
        Ok((pid1, child))
    }

    pub(crate) fn alive(&self) -> bool {
        !self.pid1.exited()
    }

    /// SIGKILLs pid 1 (and with it the whole PID namespace), waits for bwrap to exit, kills
    /// what the sandbox's cgroup still holds and removes the cgroup.
    pub(crate) async fn stop(&self) {
        self.stopped.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = self.pid1.signal(libc::SIGKILL);
        // A paused sandbox's processes die only once thawed.
        if let Some(c) = &self.cgroup {
            c.thaw_now();
        }
        let mut child = self.bwrap.lock().await;
        if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_err() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(STOP_TIMEOUT, child.wait()).await;
        }
        let _ = self.pid1.wait_exit(STOP_TIMEOUT).await;
        if let Some(c) = &self.cgroup {
            c.kill_all().await;
            c.remove_async().await;
        }
        let _ = tokio::fs::remove_dir(&self.mount_point).await;
    }

    /// Last resort: SIGKILL pid 1 and everything in the cgroup, without waiting.
    pub(crate) fn stop_now(&self) {
        let _ = self.pid1.signal(libc::SIGKILL);
        if let Some(c) = &self.cgroup {
            c.thaw_now();
            for p in c.pids() {
                super::cgroup::kill(p);
            }
        }
    }

    /// Where `path` (a host path mounted only in the sandbox's private mount namespace, such as
    /// its disk) is seen from the host while the sandbox runs.
    pub(crate) fn host_view(&self, path: &Path) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.outer)).join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Its cgroup, where limits are enforced with one (usage, pause).
    pub(crate) fn cgroup(&self) -> Option<&Cgroup> {
        self.cgroup.as_ref()
    }

    /// Removes the cgroup and the mount point after `stop_now` (best effort, bounded).
    pub(crate) fn remove_leftovers(&self) {
        if let Some(c) = &self.cgroup {
            c.remove();
        }
        let _ = std::fs::remove_dir(&self.mount_point);
    }
}

/// Why isolated sandboxes cannot run here: the isolation probe's answer. Cloned, as the
/// answer is kept for each state directory (the provider probes once).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("cannot prepare {dir}: {source}")]
    Prepare { dir: String, source: Arc<std::io::Error> },
    #[error("cannot create a user namespace: {0}")]
    UserNamespace(String),
    #[error("cannot start bwrap: {0}")]
    Spawn(String),
    /// bwrap ran and failed; its stderr says why.
    #[error("bwrap failed ({status}): {stderr}")]
    Bwrap { status: String, stderr: String },
    #[error("bwrap probe timed out")]
    TimedOut,
    /// A pipe, the seccomp filter, the command or waiting for it.
    #[error("{0}")]
    Io(Arc<std::io::Error>),
}

impl From<std::io::Error> for ProbeError {
    fn from(e: std::io::Error) -> Self {
        ProbeError::Io(Arc::new(e))
    }
}

/// Checks once that isolated sandboxes work here: a user namespace with a full id map, an
/// overlay mounted for it, and bwrap starting inside it. Returns why not.
pub(crate) fn probe(state_dir: &Path, ids: IdMap) -> std::result::Result<(), ProbeError> {
    let dir = state_dir.join(format!("probe-{}", crate::random::hex(4)));
    let limits = Limits { cpus: 1, memory_mb: 64, pids: 64 };
    let mut layout = Layout::new(&dir, ids, limits);
    layout.lowers.push(dir.join("lower"));
    let result = (|| {
        let prepare = |e| ProbeError::Prepare { dir: dir.display().to_string(), source: Arc::new(e) };
        // Owned from the start, so a run killed while it probes leaves nothing the next one keeps.
        crate::owner::create_dir(&dir).map_err(prepare)?;
        layout.create().map_err(prepare)?;
        std::fs::create_dir_all(dir.join("lower"))?;
        let ns =
            userns::create(ids, userns::owner_for(ids)).map_err(|e| ProbeError::UserNamespace(sys::errno_text(&e)))?;
        let (_r, w) = sys::cloexec_pipe()?;
        let seccomp = seccomp_pipe()?;
        let mut cmd =
            bwrap_command(&layout, &ns, None, w.as_raw_fd(), seccomp.as_raw_fd(), None, None, &["/bin/true"], true)?;
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let run = sys::on_spawner_blocking(move || -> std::result::Result<(), ProbeError> {
            let mut child = cmd.spawn().map_err(|e| ProbeError::Spawn(sys::errno_text(&e)))?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(st)) if st.success() => return Ok(()),
                    Ok(Some(st)) => {
                        let mut err = String::new();
                        if let Some(mut e) = child.stderr.take() {
                            use std::io::Read;
                            let _ = e.read_to_string(&mut err);
                        }
                        return Err(ProbeError::Bwrap { status: st.to_string(), stderr: err.trim().to_string() });
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                    Ok(None) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Err(ProbeError::TimedOut);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        })?;
        drop((w, ns));
        run
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir(&layout.merged);
    result
}

//! Entering a sandbox: how every command starts inside one.
//!
//! A command is a child of scenario-run that, between fork and exec, does what `nsenter`
//! would do and what a container runtime adds to it:
//!
//! 1. joins the sandbox's control groups (writes itself into their `tasks`, or `cgroup.procs`
//!    on cgroup v2: `cgroup::join_file`), so it is limited before it runs anything;
//! 2. joins, still as host root, the sandbox's network, cgroup, IPC, UTS, PID and mount
//!    namespaces (the last one also makes the sandbox's root its root), then the sandbox's
//!    *inner* user namespace (gaining capabilities in it only, none on the host, none over
//!    the sandbox's own pid 1);
//! 3. forks, because a PID namespace only takes effect for children. The intermediate
//!    process reports the host pid of its child, closes every descriptor it holds (so the
//!    command's pipes end when the command's do, and the parent sees the exec succeed), waits
//!    for the child and exits the same way it did (re-raising a fatal signal), as nsenter does;
//! 4. the child starts a session of its own (so a kill reaches its whole process group),
//!    narrows the capability bounding set to Docker's default set, installs the seccomp
//!    filter (`seccomp`), becomes the requested user (`user`, uid 1000, unless `root` was
//!    asked for; either is unprivileged on the host), applies the rlimit fallback where no
//!    cgroup enforces the limits, enters its working directory, reports its pid *inside* the
//!    sandbox, and returns, so std exec's the command.
//!
//! All of it runs between fork and exec of a multi-threaded program, so it only makes raw,
//! async-signal-safe system calls on data prepared beforehand: no allocation, no locks.
//! Compared with running `nsenter` and a shell prelude it saves two execs per command.
//!
//! The system calls go through rustix where it has a safe form: its Linux backend issues
//! each as one raw `syscall` instruction, without allocating (paths are passed as `&CStr`,
//! which it hands over as they are) and without libc's locks. The per-thread id calls
//! (`set_thread_res_uid` and friends) are what libc's process-wide ones amount to here: the
//! forked child has a single thread. What rustix has no safe form for stays libc, in the
//! few blocks below that say why each is sound: `clone` (a fork), `close_range`, `close` and
//! `write` on bare descriptor numbers, signal dispositions and masks, `_exit`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::process::{Gid, Pid, Uid};
use rustix::thread::{move_into_link_name_space, CapabilitySet, LinkNameSpaceType as NsType};

use super::cgroup::{self, Limits};
use super::seccomp;

/// # Two user namespaces
///
/// bubblewrap, the sandbox's pid 1 and its keep-alive run in the sandbox's user namespace
/// (`outer`, see `userns`); every command runs in a namespace nested in it (`inner`), whose
/// ids are the outer one's, one for one. So ids, files and `sudo` are as before, but a process
/// of the sandbox has no capability over pid 1 (which runs outside the seccomp filter with the
/// whole bounding set): ptrace, `/proc/1/mem` and `/proc/1/environ` need `CAP_SYS_PTRACE` in
/// the outer namespace, which nothing inside can have. The inner namespace is made once per
/// boot by [`inner_namespace`].
/// Capabilities root inside a sandbox keeps (Docker's default set); the rest leave the
/// bounding set, so not even `sudo` gets them back.
const KEPT_CAPS: [u32; 14] = [
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    13, // CAP_NET_RAW
    18, // CAP_SYS_CHROOT
    27, // CAP_MKNOD
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

/// Exit status of a command whose working directory cannot be entered (as the shell prelude
/// used before, and `env -C`).
pub(crate) const BAD_CWD_EXIT: i32 = 125;

/// Who a command runs as, inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

impl Identity {
    pub(crate) fn root() -> Self {
        Self { name: "root".into(), uid: 0, gid: 0, groups: vec![0], home: "/root".into() }
    }

    /// The sandbox's default user, when its `/etc/passwd` does not say otherwise.
    pub(crate) fn user() -> Self {
        Self { name: "user".into(), uid: 1000, gid: 1000, groups: vec![1000], home: "/home/user".into() }
    }

    /// `name` (or a numeric uid) looked up in the sandbox's `passwd` and `group` contents.
    pub(crate) fn lookup(name: &str, passwd: &str, group: &str) -> Option<Self> {
        let numeric = name.parse::<u32>().ok();
        let entry = passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 {
                return None;
            }
            let uid = f[2].parse::<u32>().ok()?;
            (f[0] == name || numeric == Some(uid)).then(|| (f[0].to_string(), uid, f[3].parse::<u32>().ok(), f[5]))
        });
        let (user, uid, gid, home) = match entry {
            Some((u, uid, gid, home)) => (u, uid, gid?, home.to_string()),
            None => {
                let uid = numeric?;
                (uid.to_string(), uid, uid, "/".to_string())
            }
        };
        let mut groups = vec![gid];
        for l in group.lines() {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() >= 4 && f[3].split(',').any(|m| m == user) {
                if let Ok(g) = f[2].parse::<u32>() {
                    if !groups.contains(&g) {
                        groups.push(g);
                    }
                }
            }
        }
        Some(Self { name: user, uid, gid, groups, home })
    }
}

/// What every command of one sandbox joins: prepared once, when the sandbox starts.
#[derive(Debug)]
pub(crate) struct Entry {
    /// Namespace descriptors with their `CLONE_NEW*` type, in the order they are joined: the
    /// network, cgroup, IPC, UTS, PID and mount namespaces (joined as host root), then the
    /// inner user namespace, last.
    ns: Vec<(OwnedFd, NsType)>,
    /// The join file (`tasks` or `cgroup.procs`) of each of the sandbox's groups.
    cgroup_procs: Vec<CString>,
    /// Applied when no cgroup enforces the limits.
    rlimits: Option<Limits>,
    /// Capabilities to drop from the bounding set, one bit each.
    drop_caps: Vec<CapabilitySet>,
    seccomp: Vec<seccomp::Insn>,
}

impl Drop for Entry {
    /// Closing the last descriptor of a sandbox's mount namespace unmounts its root and disk
    /// there and then (an ext4 on a loop device writes out its journal): up to 100 ms measured
    /// on a loaded host, on whichever thread drops the last command of a killed sandbox. They
    /// are closed on a cleanup thread (see `reaper`), never on a runtime worker.
    fn drop(&mut self) {
        let ns = std::mem::take(&mut self.ns);
        if !ns.is_empty() {
            super::reaper::run(move || drop(ns));
        }
    }
}

impl Entry {
    /// Opens the namespaces of the sandbox whose pid 1 is `pid1` (a host pid), lets `sudo` work
    /// in it (see [`inner_namespace`]) and makes the inner user namespace commands run in, with
    /// ids `0..len`, unless `inner` is one made ahead (nested in the namespace pid 1 runs in).
    pub(crate) async fn open(
        pid1: u32,
        len: u32,
        cgroup_procs: Vec<CString>,
        rlimits: Option<Limits>,
        inner: Option<OwnedFd>,
    ) -> io::Result<Self> {
        let kinds = [
            ("net", NsType::Network),
            ("cgroup", NsType::ControlGroup),
            ("ipc", NsType::InterProcessCommunication),
            ("uts", NsType::HostNameAndNISDomainName),
            ("pid", NsType::ProcessID),
            ("mnt", NsType::Mount),
        ];
        let mut ns = Vec::new();
        for (name, kind) in kinds {
            // A namespace the sandbox shares with us (a build's network) is not joined: we are
            // in it already, and after joining the user namespace we could not.
            use std::os::unix::fs::MetadataExt;
            let target = std::fs::metadata(format!("/proc/{pid1}/ns/{name}"))?;
            let ours = std::fs::metadata(format!("/proc/self/ns/{name}"))?;
            if (target.dev(), target.ino()) == (ours.dev(), ours.ino()) {
                continue;
            }
            let f = std::fs::File::open(format!("/proc/{pid1}/ns/{name}"))?;
            ns.push((OwnedFd::from(f), kind));
        }
        let outer = OwnedFd::from(std::fs::File::open(format!("/proc/{pid1}/ns/user"))?);
        let mnt = std::fs::File::open(format!("/proc/{pid1}/ns/mnt"))?;
        let inner = match inner {
            // Made ahead in the namespace the sandbox was booted in: its root is only remounted.
            Some(made) => {
                if !nested_in(&made, &outer)? {
                    return Err(io::Error::other("the user namespace made ahead is not nested in the sandbox's"));
                }
                inner_namespace(outer, Some(mnt.into()), len, false).await?;
                made
            }
            None => inner_namespace(outer, Some(mnt.into()), len, true)
                .await?
                .ok_or_else(|| io::Error::other("the inner user namespace was not made"))?,
        };
        ns.push((inner, NsType::User));
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(40);
        // The kernel's capability sets are 64 bits wide: a number past 63 names none (its
        // PR_CAPBSET_DROP would fail with EINVAL, which is ignored below anyway).
        let drop_caps = (0..=last.min(63))
            .filter(|c| !KEPT_CAPS.contains(c))
            .map(|c| CapabilitySet::from_bits_retain(1 << c))
            .collect();
        Ok(Self { ns, cgroup_procs, rlimits, drop_caps, seccomp: seccomp::program() })
    }

    /// Makes `cmd` start inside the sandbox as `who` in `cwd` (see the module documentation).
    /// The pid reports (`h<host pid>` from the intermediate, `n<pid inside>` from the
    /// command) are written to `report`, which must be a pipe's write end.
    pub(crate) fn prepare(self: &Arc<Self>, cmd: &mut std::process::Command, who: &Identity, cwd: &str, report: RawFd) {
        let entry = self.clone();
        // Unchecked: an id the sandbox's `/etc/passwd` gives as 4294967295 reaches the kernel
        // as it did through libc (which reads it as "leave unchanged" or rejects it).
        let groups: Vec<Gid> = who.groups.iter().map(|&g| Gid::from_raw_unchecked(g)).collect();
        let (uid, gid) = (Uid::from_raw_unchecked(who.uid), Gid::from_raw_unchecked(who.gid));
        let cwd = CString::new(cwd).unwrap_or_else(|_| CString::from(c"/"));
        // SAFETY: `pre_exec` needs an async-signal-safe closure, and the `clone` below is a
        // fork of a multi-threaded process. The closure only makes raw system calls on data
        // prepared above and owned by it (`entry` keeps the namespace descriptors open, the
        // strings and the id list are built before the fork): no allocation, no locks. `clone`
        // with only SIGCHLD is `fork` without libc's atfork handlers; both processes go on
        // with the same async-signal-safe code, and neither returns to anything but an exec
        // or `_exit` (see `intermediate` and `become_command`).
        unsafe {
            cmd.pre_exec(move || {
                for p in &entry.cgroup_procs {
                    join_cgroup(p)?;
                }
                for (fd, kind) in &entry.ns {
                    move_into_link_name_space(fd.as_fd(), Some(*kind))?;
                }
                super::sys::dup_onto(report, 3)?;
                let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
                if pid < 0 {
                    return Err(io::Error::last_os_error());
                }
                if let Some(child) = Pid::from_raw(pid as libc::pid_t) {
                    intermediate(child);
                }
                become_command(&entry, &groups, uid, gid, &cwd)
            });
        }
    }
}

/// bubblewrap makes every bind mount `nosuid`, the sandbox's root included, which would keep
/// `sudo` (setuid root *inside*) from working; and commands must run in a user namespace
/// nested in the sandbox's (see [`Entry`]). One short-lived process does both, as the outer
/// namespace's root in the sandbox's mount namespace:
///
/// 1. it remounts `/` without `nosuid` (keeping `nodev`, which the overlay's mount locks;
///    `/dev` and `/proc` stay `nosuid`). A setuid program gains root in the user namespace
///    only, under the same bounding set, filter and limits;
/// 2. it forks a child that unshares the inner user namespace, and, as its parent in the outer
///    namespace (the only place a map may be written from), writes the child's `uid_map` and
///    `gid_map` (`0 0 len`);
/// 3. it reports the child's pid and waits for the child to end; we open
///    `/proc/<child>/ns/user` and kill the child, and the process exits through `/bin/true`.
///
/// Nothing waits for a pipe to close (a descriptor copied into a process forked meanwhile
/// could hold it open): only for the child's one byte, the report's line and the child's end.
/// The child ends itself after [`CHILD_LIFETIME_SECS`] should we never kill it.
///
/// Either step may be done alone: the inner namespace can be made ahead, before the sandbox
/// boots (`mnt` None: no mount namespace joined, nothing remounted; see `userns::Pool`), and
/// then the sandbox's root is only remounted (`make_inner` false; the answer is None).
async fn inner_namespace(
    outer: OwnedFd,
    mnt: Option<OwnedFd>,
    len: u32,
    make_inner: bool,
) -> io::Result<Option<OwnedFd>> {
    let (report_r, report_w) = super::sys::cloexec_pipe()?;
    let map = format!("0 0 {len}\n").into_bytes();
    let report_fd = report_w.as_raw_fd();
    let mut cmd = std::process::Command::new("/bin/true");
    cmd.env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let (outer_fd, mnt_fd) = (outer.as_raw_fd(), mnt.as_ref().map_or(-1, |m| m.as_raw_fd()));
    // SAFETY: `pre_exec` needs an async-signal-safe closure. This one makes raw system calls
    // only (setns, setres*id, mount, pipe2, clone, unshare, open/write/read/close, alarm,
    // pause, waitpid), on descriptors whose owners (`outer`, `mnt`, the pipe end) live until
    // the spawn returned, and on the map and paths in buffers prepared before the fork or on
    // the stack: no allocation, no locks. The forked grandchild only unshares, writes one byte
    // and pauses until it is killed (or its alarm ends it); it never returns into std.
    unsafe {
        cmd.pre_exec(move || {
            // This process waits for its child before it execs: it must hold nothing but its
            // own descriptors (see `close_all_but`; a copy of another spawn's exec-check pipe
            // once held up the runtime that was to kill its child).
            super::sys::close_all_but(&[outer_fd, mnt_fd, report_fd]);
            // The host's /proc, where the child's maps are: after joining the sandbox's mount
            // namespace, `/proc` is the sandbox's, which shows its own PID namespace only.
            let proc_fd = libc::open(c"/proc".as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC);
            if proc_fd < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::setns(outer_fd, libc::CLONE_NEWUSER) != 0 {
                return Err(io::Error::last_os_error());
            }
            if mnt_fd >= 0 && libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            rustix::thread::set_thread_res_gid(Gid::ROOT, Gid::ROOT, Gid::ROOT)?;
            rustix::thread::set_thread_res_uid(Uid::ROOT, Uid::ROOT, Uid::ROOT)?;
            if mnt_fd >= 0 {
                // mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_NODEV | MS_RELATIME, ""): a
                // bind remount takes no options, so the empty data string is as NULL was.
                use rustix::mount::MountFlags;
                let flags = MountFlags::BIND | MountFlags::NODEV | MountFlags::RELATIME;
                rustix::mount::mount_remount(c"/", flags, c"")?;
            }
            if !make_inner {
                return Ok(());
            }
            let mut sync = [0 as libc::c_int; 2];
            if libc::pipe2(sync.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(io::Error::last_os_error());
            }
            let child = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
            if child < 0 {
                return Err(io::Error::last_os_error());
            }
            if child == 0 {
                libc::alarm(CHILD_LIFETIME_SECS);
                super::sys::close_all_but(&[sync[1]]);
                // The id change above made this process non-dumpable, which makes its /proc
                // files root's, out of its parent's reach: its maps must be writable by its
                // parent. (It lives in the host's PID namespace: nothing in the sandbox can
                // name it, and it is killed within milliseconds.)
                if libc::unshare(libc::CLONE_NEWUSER) != 0 || libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
                    super::sys::exit_now(1);
                }
                libc::write(sync[1], b"x".as_ptr().cast(), 1);
                loop {
                    libc::pause();
                }
            }
            let child = child as libc::pid_t;
            libc::close(sync[1]);
            let mut byte = 0u8;
            let unshared = libc::read(sync[0], (&mut byte as *mut u8).cast(), 1) == 1;
            libc::close(sync[0]);
            let reap = || {
                let mut status = 0;
                while libc::waitpid(child, &mut status, 0) < 0 && *libc::__errno_location() == libc::EINTR {}
            };
            if !unshared {
                reap();
                return Err(io::Error::other("the inner user namespace could not be made"));
            }
            for file in [&b"uid_map"[..], &b"gid_map"[..]] {
                let mut path = [0u8; 64];
                proc_path(&mut path, child as u32, file);
                let fd = libc::openat(proc_fd, path.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
                let written = fd >= 0 && libc::write(fd, map.as_ptr().cast(), map.len()) == map.len() as isize;
                let err = io::Error::last_os_error();
                if fd >= 0 {
                    libc::close(fd);
                }
                if !written {
                    libc::kill(child, libc::SIGKILL);
                    reap();
                    return Err(err);
                }
            }
            report_to(report_fd, b'c', child as u32);
            // We kill it once its namespace is open (or its alarm does).
            reap();
            Ok(())
        });
    }
    let spawned = tokio::task::spawn_blocking(move || {
        let r = cmd.status();
        drop((outer, mnt, report_w));
        r
    });
    if !make_inner {
        drop(report_r);
        let status = spawned.await.map_err(io::Error::other)??;
        if !status.success() {
            return Err(io::Error::other(format!("remounting the sandbox's root failed ({status})")));
        }
        return Ok(None);
    }
    let opened = async {
        let mut rx = tokio::net::unix::pipe::Receiver::from_owned_fd(report_r)?;
        let mut text = Vec::new();
        use tokio::io::AsyncReadExt;
        let mut line = [0u8; 32];
        while !text.ends_with(b"\n") {
            let n = rx.read(&mut line).await?;
            if n == 0 {
                break;
            }
            text.extend_from_slice(&line[..n]);
        }
        let pid: u32 = std::str::from_utf8(&text)
            .ok()
            .and_then(|t| t.trim().strip_prefix('c'))
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::other("the inner user namespace was not made"))?;
        // A pidfd first: the pid stays this process's while we hold it (it cannot end
        // before we kill it: it only pauses).
        let child = super::sys::Pidfd::open(pid)?;
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/user"));
        let _ = child.signal(libc::SIGKILL);
        Ok::<_, io::Error>(OwnedFd::from(ns?))
    };
    let inner = tokio::time::timeout(std::time::Duration::from_secs(u64::from(CHILD_LIFETIME_SECS)), opened).await;
    let status = spawned.await.map_err(io::Error::other)??;
    let inner = inner.map_err(|_| io::Error::other("timed out making the inner user namespace"))??;
    if !status.success() {
        return Err(io::Error::other(format!("/bin/true in the sandbox failed ({status})")));
    }
    Ok(Some(inner))
}

/// Whether user namespace `inner` is a child of `outer` (the kernel's `NS_GET_PARENT`).
fn nested_in(inner: &OwnedFd, outer: &OwnedFd) -> io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    // SAFETY: an ioctl without argument on a descriptor we own; it answers a new descriptor.
    let parent = unsafe { libc::ioctl(inner.as_raw_fd(), NS_GET_PARENT) };
    if parent < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just opened `parent` for us; nothing else owns it.
    let parent = std::fs::File::from(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(parent) });
    let outer = std::fs::File::from(outer.try_clone()?);
    let (p, o) = (parent.metadata()?, outer.metadata()?);
    Ok((p.dev(), p.ino()) == (o.dev(), o.ino()))
}

/// Makes the user namespace commands run in (see [`inner_namespace`]) nested in `outer`, ahead
/// of the sandbox's boot.
pub(crate) async fn make_inner(outer: &OwnedFd, len: u32) -> io::Result<OwnedFd> {
    inner_namespace(outer.try_clone()?, None, len, true)
        .await?
        .ok_or_else(|| io::Error::other("the inner user namespace was not made"))
}

/// How long the inner namespace's holder lives at most (it is killed as soon as its namespace
/// is open).
const CHILD_LIFETIME_SECS: u32 = 10;

/// Writes `<pid>/<file>` (a path under `/proc`) and a NUL into `buf` without allocating;
/// returns the length without the NUL.
fn proc_path(buf: &mut [u8; 64], pid: u32, file: &[u8]) -> usize {
    let mut n = write_decimal(&mut buf[..], pid);
    buf[n] = b'/';
    n += 1;
    for &b in file {
        buf[n] = b;
        n += 1;
    }
    buf[n] = 0;
    n
}

/// Writes `v` in decimal at the start of `out`; returns how many bytes.
fn write_decimal(out: &mut [u8], v: u32) -> usize {
    let mut digits = [0u8; 10];
    let (mut len, mut v) = (0, v);
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    len
}

/// Writes "0" (this process, which has one thread) into a group's join file. Async-signal-
/// safe: open, write and close, no allocation.
pub(crate) fn join_cgroup(path: &CString) -> io::Result<()> {
    let fd = rustix::fs::open(path.as_c_str(), OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    match rustix::io::write(&fd, b"0") {
        Ok(1) => Ok(()),
        Ok(_) => Err(io::ErrorKind::WriteZero.into()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `tag` and `n` in decimal and a newline to fd 3, without allocating.
fn report(tag: u8, n: u32) {
    report_to(3, tag, n);
}

/// Writes `tag` and `n` in decimal and a newline to `fd`, without allocating.
fn report_to(fd: RawFd, tag: u8, n: u32) {
    let mut buf = [0u8; 16];
    buf[0] = tag;
    let len = write_decimal(&mut buf[1..], n);
    buf[1 + len] = b'\n';
    // SAFETY: writes our own stack buffer to `fd`, a bare number (a report pipe that nothing
    // in this forked child owns, so rustix could only borrow it unchecked); a failure only
    // loses the report, which the parent then does without.
    unsafe { libc::write(fd, buf.as_ptr().cast(), len + 2) };
}

/// The intermediate process: report, let go of every descriptor, wait, mirror the exit.
fn intermediate(child: Pid) -> ! {
    let child = child.as_raw_pid();
    report(b'h', child as u32);
    // SAFETY: raw system calls only; this process never returns to std. None of these has a
    // safe rustix form: `close_range` closes every descriptor (first, so the command's pipes
    // end when the command's do), the signal calls change the process's disposition and
    // mask, and `_exit` skips the parent's destructors and atexit handlers, which must not
    // run in a forked child. (Kept together, in this order, as one block.)
    unsafe {
        libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32);
        let mut status = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                break;
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(255);
            }
        }
        if libc::WIFEXITED(status) {
            libc::_exit(libc::WEXITSTATUS(status));
        }
        let sig = if libc::WIFSIGNALED(status) { libc::WTERMSIG(status) } else { libc::SIGKILL };
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
        libc::_exit(128 + sig);
    }
}

/// The command's own process, inside every namespace: see step 4 of the module documentation.
fn become_command(entry: &Entry, groups: &[Gid], uid: Uid, gid: Gid, cwd: &CString) -> io::Result<()> {
    // Nothing but the command's own stdin, stdout and stderr crosses into the sandbox: not a
    // descriptor the runner inherited (a directory would let the command open host files
    // through it), nor one of the harness's own. (Fd 3, the report pipe, is closed below.)
    super::sys::cloexec_from(3)?;
    rustix::process::setsid()?;
    // A command given a terminal (a PTY session) makes it its controlling terminal, so it
    // gets job control and the terminal's signals.
    let stdin = rustix::stdio::stdin();
    if rustix::termios::isatty(stdin) {
        rustix::process::ioctl_tiocsctty(stdin)?;
    }
    for &cap in &entry.drop_caps {
        match rustix::thread::remove_capability_from_bounding_set(cap) {
            // EINVAL: a capability this kernel does not know.
            Ok(()) | Err(Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    seccomp::install(&entry.seccomp)?;
    rustix::thread::set_thread_groups(groups)?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)?;
    if let Some(l) = &entry.rlimits {
        cgroup::apply_rlimits(l)?;
    }
    if rustix::process::chdir(cwd.as_c_str()).is_err() {
        let msg = b"scenario-run: cannot enter the working directory (no such directory, or no permission)\n";
        let _ = rustix::io::write(rustix::stdio::stderr(), msg);
        super::sys::exit_now(BAD_CWD_EXIT);
    }
    report(b'n', rustix::process::getpid().as_raw_nonzero().get() as u32);
    // SAFETY: fd 3 is the report pipe's copy that `dup_onto` made (not close-on-exec, so it
    // must be closed by hand); nothing in this process owns it as an `OwnedFd`.
    unsafe { libc::close(3) };
    Ok(())
}

/// The two reports read from the pipe: (host pid, pid inside).
pub(crate) fn parse_reports(text: &str) -> (Option<u32>, Option<u32>) {
    let (mut host, mut inside) = (None, None);
    for line in text.lines() {
        if let Some(v) = line.strip_prefix('h') {
            host = v.parse().ok();
        } else if let Some(v) = line.strip_prefix('n') {
            inside = v.parse().ok();
        }
    }
    (host, inside)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_come_from_passwd_and_group() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n";
        let group = "root:x:0:\nsudo:x:27:user\nuser:x:1000:\n";
        let u = Identity::lookup("user", passwd, group).unwrap();
        assert_eq!((u.uid, u.gid, u.groups.clone(), u.home.as_str()), (1000, 1000, vec![1000, 27], "/home/user"));
        assert_eq!(Identity::lookup("0", passwd, group).unwrap().name, "root");
        assert_eq!(Identity::lookup("4242", passwd, group).unwrap().uid, 4242);
        assert!(Identity::lookup("nobody-here", passwd, group).is_none());
    }

    #[test]
    fn reports_parse_in_any_order() {
        assert_eq!(parse_reports("n7\nh12345\n"), (Some(12345), Some(7)));
        assert_eq!(parse_reports("h1\n"), (Some(1), None));
    }
}

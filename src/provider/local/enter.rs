//! Entering a sandbox: how every command starts inside one.
//!
//! A command is a child of scenario-run that, between fork and exec, does what `nsenter`
//! would do and what a container runtime adds to it:
//!
//! 1. joins the sandbox's control groups (writes itself into their `tasks`, or `cgroup.procs`
//!    on cgroup v2: `cgroup::join_file`), so it is limited before it runs anything;
//! 2. joins the sandbox's user namespace first (gaining capabilities *in it*, none on the
//!    host), then its cgroup, IPC, UTS, network, PID and mount namespaces (the last one also
//!    makes the sandbox's root its root);
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

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::sync::Arc;

use super::cgroup::{self, Limits};
use super::seccomp;

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
    /// Namespace descriptors with their `CLONE_NEW*` type: the network namespace first (it
    /// belongs to the host's user namespace, so it is joined while still host root), then the
    /// user namespace, then the others.
    ns: Vec<(OwnedFd, libc::c_int)>,
    /// The join file (`tasks` or `cgroup.procs`) of each of the sandbox's groups.
    cgroup_procs: Vec<CString>,
    /// Applied when no cgroup enforces the limits.
    rlimits: Option<Limits>,
    /// Capabilities to drop from the bounding set.
    drop_caps: Vec<u32>,
    seccomp: Vec<seccomp::Insn>,
}

impl Entry {
    /// Opens the namespaces of the sandbox whose pid 1 is `pid1` (a host pid).
    pub(crate) fn open(pid1: u32, cgroup_procs: Vec<CString>, rlimits: Option<Limits>) -> io::Result<Self> {
        let kinds = [
            ("net", libc::CLONE_NEWNET),
            ("user", libc::CLONE_NEWUSER),
            ("cgroup", libc::CLONE_NEWCGROUP),
            ("ipc", libc::CLONE_NEWIPC),
            ("uts", libc::CLONE_NEWUTS),
            ("pid", libc::CLONE_NEWPID),
            ("mnt", libc::CLONE_NEWNS),
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
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(40);
        let drop_caps = (0..=last).filter(|c| !KEPT_CAPS.contains(c)).collect();
        Ok(Self { ns, cgroup_procs, rlimits, drop_caps, seccomp: seccomp::program() })
    }

    /// Makes `cmd` start inside the sandbox as `who` in `cwd` (see the module documentation).
    /// The pid reports (`h<host pid>` from the intermediate, `n<pid inside>` from the
    /// command) are written to `report`, which must be a pipe's write end.
    pub(crate) fn prepare(self: &Arc<Self>, cmd: &mut std::process::Command, who: &Identity, cwd: &str, report: RawFd) {
        let entry = self.clone();
        let groups: Vec<libc::gid_t> = who.groups.clone();
        let (uid, gid) = (who.uid, who.gid);
        let cwd = CString::new(cwd).unwrap_or_else(|_| CString::from(c"/"));
        // SAFETY: the closure only makes async-signal-safe system calls on data prepared
        // above (see the module documentation).
        unsafe {
            cmd.pre_exec(move || {
                for p in &entry.cgroup_procs {
                    join_cgroup(p)?;
                }
                for (fd, kind) in &entry.ns {
                    if libc::setns(fd.as_raw_fd(), *kind) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                super::sys::dup_onto(report, 3)?;
                let pid = libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0);
                if pid < 0 {
                    return Err(io::Error::last_os_error());
                }
                if pid > 0 {
                    intermediate(pid as libc::pid_t);
                }
                become_command(&entry, &groups, uid, gid, &cwd)
            });
        }
    }
}

impl Entry {
    /// bubblewrap makes every bind mount `nosuid`, the sandbox's root included, which would
    /// keep `sudo` (setuid root *inside*) from working. As the sandbox's root we remount `/`
    /// without it (keeping `nodev`, which the overlay's mount locks); `/dev` and `/proc` stay
    /// `nosuid`. A setuid program gains root in the user namespace only, under the same
    /// bounding set, filter and limits.
    pub(crate) fn allow_setuid_root(&self) -> io::Result<()> {
        let ns: Vec<(libc::c_int, libc::c_int)> = self
            .ns
            .iter()
            .filter(|(_, k)| matches!(*k, libc::CLONE_NEWUSER | libc::CLONE_NEWNS))
            .map(|(fd, k)| (fd.as_raw_fd(), *k))
            .collect();
        let mut cmd = std::process::Command::new("/bin/true");
        cmd.env_clear().stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null());
        // SAFETY: only setns/setres*id/mount between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for (fd, kind) in &ns {
                    if libc::setns(*fd, *kind) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                if libc::setresgid(0, 0, 0) != 0 || libc::setresuid(0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_NODEV | libc::MS_RELATIME;
                let none = std::ptr::null::<libc::c_char>();
                if libc::mount(none, c"/".as_ptr(), none, flags, std::ptr::null()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let st = cmd.status()?;
        if !st.success() {
            return Err(io::Error::other(format!("/bin/true in the sandbox failed ({st})")));
        }
        Ok(())
    }
}

/// Writes "0" (this process, which has one thread) into a group's join file.
fn join_cgroup(path: &CString) -> io::Result<()> {
    // SAFETY: open/write/close on a valid C string and a one-byte buffer.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let r = libc::write(fd, b"0".as_ptr().cast(), 1);
        let e = io::Error::last_os_error();
        libc::close(fd);
        if r != 1 {
            return Err(e);
        }
    }
    Ok(())
}

/// Writes `tag` and `n` in decimal and a newline to fd 3, without allocating.
fn report(tag: u8, n: u32) {
    let mut buf = [0u8; 16];
    buf[0] = tag;
    let mut digits = [0u8; 10];
    let mut len = 0;
    let mut v = n;
    loop {
        digits[len] = b'0' + (v % 10) as u8;
        len += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[1 + i] = digits[len - 1 - i];
    }
    buf[1 + len] = b'\n';
    // SAFETY: writing our own stack buffer to a descriptor.
    unsafe { libc::write(3, buf.as_ptr().cast(), len + 2) };
}

/// The intermediate process: report, let go of every descriptor, wait, mirror the exit.
fn intermediate(child: libc::pid_t) -> ! {
    report(b'h', child as u32);
    // SAFETY: raw system calls only; this process never returns to std.
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
fn become_command(entry: &Entry, groups: &[libc::gid_t], uid: u32, gid: u32, cwd: &CString) -> io::Result<()> {
    // SAFETY: raw system calls on prepared data.
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        // A command given a terminal (a PTY session) makes it its controlling terminal, so
        // it gets job control and the terminal's signals.
        if libc::isatty(0) == 1 && libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        for &cap in &entry.drop_caps {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) != 0
                && *libc::__errno_location() != libc::EINVAL
            {
                return Err(io::Error::last_os_error());
            }
        }
        seccomp::install(&entry.seccomp)?;
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setresgid(gid, gid, gid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(io::Error::last_os_error());
        }
        if let Some(l) = &entry.rlimits {
            cgroup::apply_rlimits(l)?;
        }
        if libc::chdir(cwd.as_ptr()) != 0 {
            let msg = b"scenario-run: cannot enter the working directory (no such directory, or no permission)\n";
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(BAD_CWD_EXIT);
        }
        report(b'n', libc::getpid() as u32);
        libc::close(3);
    }
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

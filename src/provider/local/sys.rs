//! Thin, safe wrappers over the few Linux system calls the local provider needs and `std`
//! does not offer: pidfds (signal a process without racing pid reuse, and learn from epoll
//! when it ends), `openat2(RESOLVE_IN_ROOT)` (resolve a path inside a sandbox's root even
//! through its own symlinks), and a long-lived "spawner" thread.
//!
//! Why a spawner thread: bubblewrap's `--die-with-parent` (and `PR_SET_PDEATHSIG` in general)
//! fires when the *thread* that forked the child exits, not the process. Tokio's blocking-pool
//! threads exit after a few idle seconds, and worker threads are replaced around
//! `block_in_place`; a sandbox forked from such a thread would be SIGKILLed at a random moment.
//! So every child that carries a parent-death signal is forked from one thread that lives as
//! long as the process.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::process::{Pid, PidfdFlags};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Maps `-1` returns to the current `errno`.
pub(crate) fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pidfd: a handle on one process that cannot be confused with a later process that reuses
/// its pid.
#[derive(Debug)]
pub(crate) struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    pub(crate) fn open(pid: u32) -> io::Result<Self> {
        // pid 0 and pids past `i32::MAX` name no process: EINVAL, as the kernel answers.
        let p = i32::try_from(pid).ok().and_then(Pid::from_raw).ok_or(rustix::io::Errno::INVAL)?;
        let fd = rustix::process::pidfd_open(p, PidfdFlags::empty())?;
        Ok(Self { fd, pid })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig`; `ESRCH` (already gone) is reported as an error of kind NotFound-ish `Other`.
    ///
    /// Stays a raw call: `sig` is whatever number a scenario or client asked for (0 to probe,
    /// a realtime signal, an unknown one the kernel rejects), and rustix's `Signal` holds only
    /// the named signals (any other number needs its unchecked constructor).
    pub(crate) fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: a descriptor we own, a plain integer, a null siginfo (the kernel fills in
        // one of its own), no flags; nothing is read or written through our memory.
        cvt(unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        })?;
        Ok(())
    }

    /// Whether the process has ended (a pidfd polls readable once it has).
    pub(crate) fn exited(&self) -> bool {
        let mut pfd = [PollFd::new(&self.fd, PollFlags::IN)];
        matches!(rustix::event::poll(&mut pfd, Some(&Timespec::default())), Ok(n) if n > 0)
    }

    /// Waits (without blocking the runtime) until the process ends or `timeout` passes.
    /// Returns whether it ended.
    pub(crate) async fn wait_exit(&self, timeout: Duration) -> bool {
        if self.exited() {
            return true;
        }
        let Ok(dup) = self.fd.try_clone() else {
            return false;
        };
        // SAFETY: tokio requires the descriptor to stay open and the same while registered:
        // `dup` is an `OwnedFd` moved into the AsyncFd, which closes it only when dropped, and
        // nothing else can reach it.
        let Ok(afd) = (unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }) else {
            return false;
        };
        matches!(tokio::time::timeout(timeout, afd.readable()).await, Ok(Ok(_)))
    }
}

/// Sends `sig` to the process group `pgid` (negative-pid `kill`). Errors are ignored: the group
/// may already be gone. A raw call for the reason given at [`Pidfd::signal`]: `sig` is any
/// number a scenario asked for.
pub(crate) fn kill_group(pgid: u32, sig: i32) {
    if pgid > 1 {
        // SAFETY: integer arguments only; `pgid > 1` keeps it from meaning "every process"
        // (-1) or "our own group" (0).
        unsafe { libc::kill(-(pgid as libc::pid_t), sig) };
    }
}

/// `openat2(dirfd, path, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: `path` is
/// resolved as if `dirfd` were `/`, so neither `..` nor absolute symlinks inside the sandbox
/// can reach the host.
pub(crate) fn open_in_root(dirfd: BorrowedFd<'_>, path: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(if path.is_empty() { "." } else { path })
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let oflags = OFlags::from_bits_retain((flags | libc::O_CLOEXEC) as u32);
    let mode = Mode::from_bits_retain(if flags & libc::O_CREAT != 0 { mode } else { 0 });
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS;
    loop {
        match rustix::fs::openat2(dirfd, c.as_c_str(), oflags, mode, resolve) {
            Ok(fd) => return Ok(fd),
            // RESOLVE_IN_ROOT returns EAGAIN when a concurrent rename raced the lookup.
            Err(rustix::io::Errno::AGAIN) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

fn spawner() -> &'static mpsc::Sender<Job> {
    static SPAWNER: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("scenario-run-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("cannot start the spawner thread");
        tx
    })
}

/// Runs `f` on the process-lifetime spawner thread and returns its result asynchronously.
pub(crate) async fn on_spawner<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    spawner()
        .send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    rx.await.map_err(|_| io::Error::other("spawner thread dropped the job"))
}

/// Runs `f` on the spawner thread and blocks the caller until it is done (for the one-off
/// isolation probe in the synchronous constructor).
pub(crate) fn on_spawner_blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> io::Result<T> {
    let (tx, rx) = mpsc::channel();
    spawner()
        .send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    rx.recv().map_err(|_| io::Error::other("spawner thread dropped the job"))
}

/// A pipe with both ends close-on-exec; the write end is meant to be `dup2`ed onto a fixed fd
/// number in a child's `pre_exec`.
pub(crate) fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// In a forked child: make `fd` available as `target` across exec (async-signal-safe).
///
/// Stays raw: `target` is a bare descriptor number that nothing owns yet (rustix's `dup2`
/// wants an `OwnedFd` to replace), and the child never returns to code that could own it.
pub(crate) fn dup_onto(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: fcntl/dup2 take and return integers only, and are async-signal-safe. `fd` is
    // open (the caller keeps its owner alive until the spawn returned); `target` is a fixed
    // number the exec'd program expects, overwritten on purpose.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Marks every descriptor from `first` up close-on-exec (`close_range` with
/// `CLOSE_RANGE_CLOEXEC`): what a process inherited or opened without the flag then never
/// crosses an exec. Async-signal-safe (one system call), so a forked child may call it right
/// before exec; descriptors it meant to pass on must be below `first`.
///
/// Stays raw: rustix has no `close_range`. Kernels before 5.11 answer EINVAL for the flag;
/// the caller decides whether that is fatal.
pub(crate) fn cloexec_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: integer arguments only; the call changes descriptor flags, never memory.
    cvt(unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) })?;
    Ok(())
}

/// In a forked child that will live a while before it execs (or never will): closes every
/// descriptor above stderr but those in `keep` (at most 8). Such a process must hold nothing
/// else: a copy of another command's pipe end would keep that pipe from ending, and a parent
/// waiting for that end (the exec check of a spawn, a reader waiting for end of file) would
/// wait for this process. Async-signal-safe: `close_range` over the gaps, no allocation.
pub(crate) fn close_all_but(keep: &[RawFd]) {
    // A negative number names no descriptor: nothing to keep for it (it once closed the
    // range above the last kept one and overflowed `from`).
    let mut sorted = [u32::MAX; 8];
    let mut n = 0;
    for fd in keep.iter().filter_map(|fd| u32::try_from(*fd).ok()).take(8) {
        sorted[n] = fd;
        n += 1;
    }
    sorted[..n].sort_unstable();
    let mut from = 3u32;
    for &k in &sorted[..n] {
        if k >= from {
            if k > from {
                // SAFETY: integer arguments; closes descriptors this forked child does not use.
                unsafe { libc::syscall(libc::SYS_close_range, from, k - 1, 0u32) };
            }
            from = k + 1;
        }
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, u32::MAX, 0u32) };
}

/// `_exit(code)`: ends a forked child at once, without the parent's destructors, stdio
/// flushes or atexit handlers (none of which may run between fork and exec).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` takes an integer and does not return; skipping every destructor is
    // the point (what they would free belongs to the parent's copy of memory).
    unsafe { libc::_exit(code) }
}

/// The `NSpid:` line of `/proc/<pid>/status`: the pid in each nested PID namespace, outermost
/// first.
pub(crate) fn ns_pids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line["NSpid:".len()..].split_whitespace().map(|s| s.parse().ok()).collect()
}

/// Lowercase description of an errno, e.g. "no such file or directory".
pub(crate) fn errno_text(e: &io::Error) -> String {
    let s = match e.raw_os_error() {
        Some(code) => {
            let msg = io::Error::from_raw_os_error(code).to_string();
            // std formats as "No such file or directory (os error 2)".
            msg.split(" (os error").next().unwrap_or(&msg).to_string()
        }
        None => e.to_string(),
    };
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn errno_text_is_lowercase_without_code() {
        let e = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(errno_text(&e), "no such file or directory");
    }

    #[test]
    fn ns_pids_of_self_ends_with_own_pid() {
        let pids = ns_pids(std::process::id()).unwrap();
        assert_eq!(pids[0], std::process::id());
    }

    #[test]
    fn pidfd_open_refuses_numbers_that_name_no_process_without_panicking() {
        // 0, and values that are negative as a pid_t (-1 would be "every process").
        for pid in [0, u32::MAX, i32::MAX as u32 + 1] {
            let e = Pidfd::open(pid).unwrap_err();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "pid {pid}");
        }
    }

    #[test]
    fn a_pidfd_signals_its_process_and_sees_it_end() {
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let fd = Pidfd::open(child.id()).unwrap();
        assert!(!fd.exited(), "sleep is still running");
        fd.signal(0).expect("signal 0 probes a live process");
        fd.signal(libc::SIGKILL).unwrap();
        let st = child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL));
        assert!(fd.exited(), "a reaped process polls readable");
        let e = fd.signal(libc::SIGTERM).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH));
    }

    #[tokio::test]
    async fn wait_exit_returns_when_the_process_ends_and_not_before() {
        let mut child = std::process::Command::new("/bin/sleep").arg("30").spawn().unwrap();
        let fd = Pidfd::open(child.id()).unwrap();
        assert!(!fd.wait_exit(Duration::from_millis(200)).await, "still running after 200 ms");
        fd.signal(libc::SIGKILL).unwrap();
        assert!(fd.wait_exit(Duration::from_secs(10)).await);
        child.wait().unwrap();
    }

    #[test]
    fn cloexec_pipe_ends_are_close_on_exec_and_connected() {
        use std::io::{Read, Write};
        let (r, w) = cloexec_pipe().unwrap();
        for fd in [&r, &w] {
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
        std::fs::File::from(w).write_all(b"ping").unwrap();
        let mut got = String::new();
        std::fs::File::from(r).read_to_string(&mut got).unwrap();
        assert_eq!(got, "ping");
    }

    #[test]
    fn open_in_root_confines_dotdot_and_absolute_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("jail")).unwrap();
        std::fs::write(dir.path().join("secret"), b"host").unwrap();
        std::fs::write(dir.path().join("jail/secret"), b"jail").unwrap();
        std::os::unix::fs::symlink("/secret", dir.path().join("jail/link")).unwrap();
        let root = std::fs::File::open(dir.path().join("jail")).unwrap();
        for p in ["../secret", "link", "/secret"] {
            let fd = open_in_root(root.as_fd(), p, libc::O_RDONLY, 0).unwrap();
            let s = std::fs::read_to_string(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            assert_eq!(s, "jail", "path {p}");
        }
    }
}

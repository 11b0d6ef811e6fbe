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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

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
        // SAFETY: plain syscall with integer arguments.
        let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) })?;
        // SAFETY: pidfd_open returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok(Self { fd, pid })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig`; `ESRCH` (already gone) is reported as an error of kind NotFound-ish `Other`.
    pub(crate) fn signal(&self, sig: i32) -> io::Result<()> {
        // SAFETY: valid fd, null siginfo, no flags.
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
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0
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
        // SAFETY: `dup` is an owned descriptor that the AsyncFd keeps open until it is dropped.
        let Ok(afd) = (unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE) }) else {
            return false;
        };
        matches!(tokio::time::timeout(timeout, afd.readable()).await, Ok(Ok(_)))
    }
}

/// Sends `sig` to the process group `pgid` (negative-pid `kill`). Errors are ignored: the group
/// may already be gone.
pub(crate) fn kill_group(pgid: u32, sig: i32) {
    if pgid > 1 {
        // SAFETY: plain syscall.
        unsafe { libc::kill(-(pgid as libc::pid_t), sig) };
    }
}

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dirfd, path, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: `path` is
/// resolved as if `dirfd` were `/`, so neither `..` nor absolute symlinks inside the sandbox
/// can reach the host.
pub(crate) fn open_in_root(dirfd: RawFd, path: &str, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let c = CString::new(if path.is_empty() { "." } else { path })
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: if flags & libc::O_CREAT != 0 { mode as u64 } else { 0 },
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: valid C string and struct of the size we pass.
        let r = unsafe {
            libc::syscall(libc::SYS_openat2, dirfd, c.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
        };
        match cvt(r) {
            // SAFETY: fresh descriptor we own.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
            // RESOLVE_IN_ROOT returns EAGAIN when a concurrent rename raced the lookup.
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(e),
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
    let mut fds = [0 as RawFd; 2];
    // SAFETY: two-element array as pipe2 expects.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: pipe2 returned two fresh descriptors.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// In a forked child: make `fd` available as `target` across exec (async-signal-safe).
pub(crate) fn dup_onto(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: only fcntl/dup2 on descriptors we own; allowed between fork and exec.
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
    fn open_in_root_confines_dotdot_and_absolute_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("jail")).unwrap();
        std::fs::write(dir.path().join("secret"), b"host").unwrap();
        std::fs::write(dir.path().join("jail/secret"), b"jail").unwrap();
        std::os::unix::fs::symlink("/secret", dir.path().join("jail/link")).unwrap();
        let root = std::fs::File::open(dir.path().join("jail")).unwrap();
        for p in ["../secret", "link", "/secret"] {
            let fd = open_in_root(root.as_raw_fd(), p, libc::O_RDONLY, 0).unwrap();
            let s = std::fs::read_to_string(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap();
            assert_eq!(s, "jail", "path {p}");
        }
    }
}

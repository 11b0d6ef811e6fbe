//! Watching a sandbox's directories with inotify (envd's `WatchDir` and watchers).
//!
//! The inotify instance is the provider's, but every watch is added on a directory opened
//! inside the sandbox's root (`openat2(RESOLVE_IN_ROOT)`, as the sandbox user, so a symlink
//! cannot point a watch at the host and a directory the user may not read cannot be
//! watched), through its `/proc/self/fd` link. The watched inode is the overlay's, so changes
//! made by the sandbox's processes and through the file API both show.
//!
//! Events are read by whoever comes first: a thread that waits for them (and adds watches
//! on directories made under a recursive watch at once, so what is then written into them is
//! seen), or [`DirWatch::drain`], which reads what the kernel has queued before answering,
//! so a change made before a call is always in its answer. The mapping is Go fsnotify's,
//! which envd uses: `IN_CREATE`/`IN_MOVED_TO` create, `IN_MODIFY` write, `IN_DELETE`/
//! `IN_DELETE_SELF` remove, `IN_MOVED_FROM`/`IN_MOVE_SELF` rename, `IN_ATTRIB` chmod.

use std::collections::{HashMap, VecDeque};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify;

use super::files::{fs_err, Root};
use crate::provider::{DirWatch, FsEvent, FsOp, ProviderError, Result};

const MASK: u32 = libc::IN_CREATE
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVED_FROM
    | libc::IN_MOVE_SELF
    | libc::IN_ATTRIB;
/// Most events kept unread; past it the oldest are dropped (a client that never asks).
const MAX_QUEUED: usize = 65_536;
/// Most directories one recursive watch follows.
const MAX_WATCHES: usize = 8192;

struct State {
    /// Watch descriptor → directory relative to the watched one ("" for itself).
    dirs: HashMap<i32, String>,
    queue: VecDeque<FsEvent>,
}

struct Shared {
    fd: OwnedFd,
    root: Root,
    /// The watched directory, absolute in the sandbox.
    top: String,
    recursive: bool,
    state: Mutex<State>,
    stop: AtomicBool,
    arrived: Arc<tokio::sync::Notify>,
}

pub(crate) struct Watch {
    shared: Arc<Shared>,
}

impl Watch {
    /// Starts watching `abs` in `root`.
    pub(crate) fn start(root: Root, abs: &str, recursive: bool) -> Result<Watch> {
        let fd = inotify::init(inotify::CreateFlags::NONBLOCK | inotify::CreateFlags::CLOEXEC)
            .map_err(|e| ProviderError::infra(format!("inotify: {}", std::io::Error::from(e))))?;
        let shared = Arc::new(Shared {
            fd,
            root,
            top: abs.to_string(),
            recursive,
            state: Mutex::new(State { dirs: HashMap::new(), queue: VecDeque::new() }),
            stop: AtomicBool::new(false),
            arrived: Arc::new(tokio::sync::Notify::new()),
        });
        {
            let mut st = shared.state.lock().expect("watch");
            shared.add(&mut st, "", false)?;
        }
        let s = shared.clone();
        std::thread::Builder::new()
            .name("sandbox-watch".into())
            .spawn(move || s.run())
            .map_err(|e| ProviderError::infra(format!("cannot start a watch thread: {e}")))?;
        Ok(Watch { shared })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

impl DirWatch for Watch {
    fn drain(&self) -> Vec<FsEvent> {
        let mut st = self.shared.state.lock().expect("watch");
        self.shared.read(&mut st);
        st.queue.drain(..).collect()
    }

    fn arrived(&self) -> Arc<tokio::sync::Notify> {
        self.shared.arrived.clone()
    }
}

impl Shared {
    /// Watches directory `rel` (relative to the top) and, when recursive, those below it.
    /// With `announce`, what is found below is reported as created (it was made before its
    /// watch could be added).
    fn add(&self, st: &mut State, rel: &str, announce: bool) -> Result<()> {
        let abs = if rel.is_empty() { self.top.clone() } else { format!("{}/{rel}", self.top.trim_end_matches('/')) };
        let dir = self.root.open_dir(&abs)?;
        let link = std::ffi::CString::new(format!("/proc/self/fd/{}", dir.as_raw_fd())).expect("no NUL");
        let wd = self
            .root
            .as_sandbox_user(|| {
                inotify::add_watch(&self.fd, link.as_c_str(), inotify::WatchFlags::from_bits_retain(MASK))
            })
            .map_err(|e| fs_err(e.into(), &abs))?;
        st.dirs.insert(wd, rel.to_string());
        if !self.recursive {
            return Ok(());
        }
        let Ok(entries) = self.root.list(&abs) else { return Ok(()) };
        for e in entries {
            let child = if rel.is_empty() { e.name.clone() } else { format!("{rel}/{}", e.name) };
            if announce {
                st.queue.push_back(FsEvent { name: child.clone(), op: FsOp::Create });
            }
            if e.kind == "dir" && st.dirs.len() < MAX_WATCHES {
                // A directory that vanished meanwhile is no error.
                let _ = self.add(st, &child, announce);
            }
        }
        Ok(())
    }

    /// Reads every event the kernel has queued.
    fn read(&self, st: &mut State) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 << 10];
        let mut events = inotify::Reader::new(&self.fd, &mut buf);
        let mut got = false;
        // Until the kernel has nothing more (EAGAIN: the descriptor does not block).
        while let Ok(ev) = events.next() {
            let name = ev.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            got |= self.event(st, ev.wd(), ev.events().bits(), &name);
        }
        while st.queue.len() > MAX_QUEUED {
            st.queue.pop_front();
        }
        if got {
            self.arrived.notify_waiters();
        }
    }

    /// Records one event; true if it was kept.
    fn event(&self, st: &mut State, wd: i32, mask: u32, name: &str) -> bool {
        if mask & libc::IN_IGNORED != 0 {
            st.dirs.remove(&wd);
            return false;
        }
        let Some(dir) = st.dirs.get(&wd).cloned() else { return false };
        let path = match (dir.is_empty(), name.is_empty()) {
            (_, true) => dir.clone(),
            (true, false) => name.to_string(),
            (false, false) => format!("{dir}/{name}"),
        };
        // A watched subdirectory's own removal is reported by its parent.
        if name.is_empty() && !dir.is_empty() {
            return false;
        }
        let op = if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
            FsOp::Create
        } else if mask & libc::IN_MODIFY != 0 {
            FsOp::Write
        } else if mask & (libc::IN_DELETE | libc::IN_DELETE_SELF) != 0 {
            FsOp::Remove
        } else if mask & (libc::IN_MOVED_FROM | libc::IN_MOVE_SELF) != 0 {
            FsOp::Rename
        } else if mask & libc::IN_ATTRIB != 0 {
            FsOp::Chmod
        } else {
            return false;
        };
        st.queue.push_back(FsEvent { name: path.clone(), op });
        if op == FsOp::Create && mask & libc::IN_ISDIR != 0 && self.recursive && st.dirs.len() < MAX_WATCHES {
            let _ = self.add(st, &path, true);
        }
        true
    }

    /// The thread: waits for events and reads them until the watch is dropped.
    fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::SeqCst) {
            let mut pfd = [PollFd::new(&self.fd, PollFlags::IN)];
            let wait = Timespec { tv_sec: 0, tv_nsec: 100_000_000 };
            if matches!(rustix::event::poll(&mut pfd, Some(&wait)), Ok(n) if n > 0) {
                let mut st = self.state.lock().expect("watch");
                self.read(&mut st);
            }
        }
    }
}

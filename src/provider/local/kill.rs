//! The last resort: every sandbox, spare and boot under way killed at once (a second Ctrl-C,
//! a provider dropped without `destroy_all`), and what is left removed once the processes are
//! gone.

use super::*;

impl Inner {
    /// The synchronous last resort: kills everything at once, then removes what is left
    /// (waiting a moment for the processes to go) and waits for the cleanups drops handed
    /// off. Blocks: callers on a runtime call it through `spawn_blocking`.
    pub(super) fn kill_all_now(&self) {
        self.kill_now().remove();
        reaper::wait(CLEANUP_WAIT);
    }

    /// What [`Inner::kill_all_now`] does at once (signals; nothing waits): SIGKILLs every
    /// sandbox, spare and boot under way, and closes the pools. Returns what is left to remove.
    fn kill_now(&self) -> Leftovers {
        let spares = self.warm.close_now();
        for b in &spares {
            b.ns.stop_now();
        }
        let abandoned = self.booter.stop_booting_now();
        self.nets.close();
        self.booter.users.close();
        let building: Vec<PathBuf> = self.building.lock().expect("building").drain().collect();
        let all = self.core.everything();
        for sb in &all {
            sb.kill_now();
        }
        Leftovers { spares, abandoned, all, building, disks: self.disks.clone() }
    }
}

/// How long the synchronous ways out wait for handed-off cleanups: a cgroup's removal retries
/// for half a second per controller.
const CLEANUP_WAIT: Duration = Duration::from_secs(10);

/// What is left of a provider killed at once: directories, cgroups and mount points, removed
/// once the processes are gone.
struct Leftovers {
    spares: Vec<warm::Booted>,
    abandoned: Vec<warm::Abandoned>,
    all: Vec<Arc<Sandbox>>,
    building: Vec<PathBuf>,
    disks: Arc<disk::Pool>,
}

impl Leftovers {
    /// Removes them all. Blocks (bounded): on a thread that may wait.
    fn remove(self) {
        self.disks.close();
        for dir in &self.building {
            let _ = std::fs::remove_dir_all(dir);
        }
        if !(self.all.is_empty() && self.spares.is_empty() && self.abandoned.is_empty()) {
            // SIGKILL is delivered at once; the PID namespaces are gone within milliseconds.
            // Give them a moment, then remove the state directories so nothing is left on
            // disk. Bounded: this runs on the way out after a second Ctrl-C.
            std::thread::sleep(Duration::from_millis(150));
        }
        for sb in &self.all {
            if let Some(b) = sb.boot() {
                b.ns.remove_leftovers();
            }
            let _ = std::fs::remove_dir_all(&sb.dir);
        }
        for b in &self.spares {
            b.ns.remove_leftovers();
            let _ = std::fs::remove_dir_all(&b.layout.dir);
        }
        for a in &self.abandoned {
            a.remove();
        }
    }
}

impl Drop for Inner {
    /// Dropped without destroy_all: do not leave processes behind. Kills at once, and removes
    /// the rest on a cleanup thread (see `reaper`): a drop may run on a runtime worker, which
    /// must not sleep while the processes go.
    fn drop(&mut self) {
        let left = self.kill_now();
        reaper::run(move || left.remove());
    }
}

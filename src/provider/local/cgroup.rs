//! Resource limits for sandboxes: one control group per sandbox.
//!
//! A sandbox's `cpu` and `memory` (from `create`, else its template, else the defaults) and a
//! process-count limit are enforced by the kernel through control groups, v1 or v2, whichever
//! the host has (on a hybrid host, the v1 controllers):
//!
//! | limit | v1 | v2 |
//! |---|---|---|
//! | memory | `memory.limit_in_bytes` (+ `memory.memsw.limit_in_bytes` where swap is accounted) | `memory.max`, `memory.swap.max = 0` |
//! | cpu time | `cpu.cfs_quota_us` / `cpu.cfs_period_us` | `cpu.max` |
//! | cpus seen (`nproc`) | `cpuset.cpus` (the sandbox's own cpus, handed out in turn) | `cpuset.cpus` |
//! | processes | `pids.max` | `pids.max` |
//!
//! The groups live at `<controller mount>/scenario-run/<sandbox id>`. Every process of a
//! sandbox joins before it runs anything (its launcher writes itself into `tasks` on v1,
//! `cgroup.procs` on v2, between fork and exec: see [`join_file`]), so nothing in a sandbox
//! is ever outside its group. Killing a sandbox also kills whatever its group still holds,
//! and removes the group; groups a killed run left behind are swept by the next one.
//!
//! Where no group can be made (not root, no cgroup filesystem) the limits fall back to
//! rlimits, which are weaker (see [`Enforcement`]); the provider says so once.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Name of the parent group of every sandbox group.
const PARENT: &str = "scenario-run";

/// What a sandbox may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Limits {
    pub cpus: u32,
    pub memory_mb: u64,
    pub pids: u64,
}

/// How limits are enforced on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Enforcement {
    /// cgroup v1 controllers by name, with their mount points.
    V1(BTreeMap<String, PathBuf>),
    /// The cgroup v2 mount point.
    V2(PathBuf),
    /// No usable cgroups: rlimits (`RLIMIT_DATA` for memory, `RLIMIT_NPROC` for processes,
    /// nothing for cpu). Why, for the warning.
    Rlimits(String),
}

impl Enforcement {
    /// Probed once per process.
    pub(crate) fn get() -> &'static Enforcement {
        static E: OnceLock<Enforcement> = OnceLock::new();
        E.get_or_init(probe)
    }

    /// A sentence for docs/reference.md's table and the start-up line.
    pub(crate) fn describe(&self) -> String {
        match self {
            Enforcement::V1(c) => {
                format!("cgroup v1 ({})", c.keys().cloned().collect::<Vec<_>>().join(", "))
            }
            Enforcement::V2(_) => "cgroup v2 (memory, cpu, cpuset, pids)".into(),
            Enforcement::Rlimits(why) => format!(
                "rlimits only ({why}): memory as RLIMIT_DATA per process, processes as RLIMIT_NPROC shared by \
                 every sandbox, no cpu limit"
            ),
        }
    }
}

/// `cpuacct` counts a group's CPU time (E2B's metrics); `freezer` pauses it.
const V1_CONTROLLERS: [&str; 6] = ["memory", "cpu", "cpuacct", "cpuset", "pids", "freezer"];

fn probe() -> Enforcement {
    if !rustix::process::geteuid().is_root() {
        return Enforcement::Rlimits("not running as root".into());
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Enforcement::Rlimits("cannot read /proc/self/mountinfo".into());
    };
    let mut v1 = BTreeMap::new();
    let mut v2 = None;
    for line in mountinfo.lines() {
        // "<id> <parent> <dev> <root> <mount point> <opts> … - <fstype> <source> <super opts>"
        let Some((left, right)) = line.split_once(" - ") else { continue };
        let mount_point = left.split(' ').nth(4).unwrap_or("");
        let mut r = right.split(' ');
        let (fstype, super_opts) = (r.next().unwrap_or(""), r.nth(1).unwrap_or(""));
        match fstype {
            "cgroup" => {
                for c in super_opts.split(',') {
                    if V1_CONTROLLERS.contains(&c) {
                        v1.entry(c.to_string()).or_insert_with(|| PathBuf::from(mount_point));
                    }
                }
            }
            "cgroup2" => v2 = Some(PathBuf::from(mount_point)),
            _ => {}
        }
    }
    if ["memory", "cpu", "pids"].iter().all(|c| v1.contains_key(*c)) {
        return Enforcement::V1(v1);
    }
    if let Some(root) = v2 {
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let have: Vec<&str> = controllers.split_whitespace().collect();
        if ["memory", "cpu", "pids"].iter().all(|c| have.contains(c)) {
            return Enforcement::V2(root);
        }
    }
    Enforcement::Rlimits("no cgroup hierarchy with the memory, cpu and pids controllers".into())
}

/// The file of a group that a process joins by writing "0" into it, between fork and exec
/// (so it has one thread). On v1 that is `tasks`: it moves the writing thread, which is then
/// the whole process, and the kernel does not take the thread-group lock. `cgroup.procs`
/// moves a thread group, under `cgroup_threadgroup_rwsem`, whose write side waits for an RCU
/// grace period once the lock has been idle for a while: measured here, 9–20 ms per command that
/// came more than about 20 ms after the previous one (`commands.run("true")` 4 ms back to
/// back, 14–21 ms with gaps), against 0.6 ms through `tasks`. v2 has no `tasks` file (its
/// `cgroup.threads` only works in threaded groups), so it keeps `cgroup.procs`.
fn join_file(e: &Enforcement) -> &'static str {
    match e {
        Enforcement::V1(_) => "tasks",
        _ => "cgroup.procs",
    }
}

/// One sandbox's groups.
#[derive(Debug)]
pub(crate) struct Cgroup {
    /// The group directories (one per v1 controller, or the one v2 group).
    dirs: Vec<PathBuf>,
    /// The files a process writes itself into to join them, between fork and exec
    /// ([`join_file`]).
    pub procs: Vec<CString>,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// The cpus of a cpuset list like "0-3,6".
fn parse_cpus(list: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    out.extend(a..=b.min(a.saturating_add(4096)));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// `n` of `all`, starting at the next turn, so sandboxes spread over the cpus.
fn pick_cpus(all: &[u32], n: u32) -> String {
    static TURN: AtomicUsize = AtomicUsize::new(0);
    if all.is_empty() || n as usize >= all.len() {
        return all.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    }
    let start = TURN.fetch_add(n as usize, Ordering::Relaxed);
    (0..n as usize).map(|i| all[(start + i) % all.len()].to_string()).collect::<Vec<_>>().join(",")
}

impl Cgroup {
    /// Makes the groups of sandbox `name` with `limits`. None when limits are rlimits.
    pub(crate) fn create(name: &str, limits: Limits) -> io::Result<Option<Cgroup>> {
        match Enforcement::get() {
            Enforcement::Rlimits(_) => Ok(None),
            Enforcement::V1(ctrls) => {
                let mut dirs = Vec::new();
                let result = (|| {
                    for (c, mount) in ctrls {
                        let parent = mount.join(PARENT);
                        let dir = parent.join(name);
                        std::fs::create_dir_all(&dir)?;
                        dirs.push(dir.clone());
                        match c.as_str() {
                            "memory" => {
                                let bytes = (limits.memory_mb.saturating_mul(1 << 20)).to_string();
                                write(&dir.join("memory.limit_in_bytes"), &bytes)?;
                                let memsw = dir.join("memory.memsw.limit_in_bytes");
                                if memsw.exists() {
                                    write(&memsw, &bytes)?;
                                }
                                let _ = std::fs::write(dir.join("memory.swappiness"), "0");
                            }
                            "cpu" => {
                                write(&dir.join("cpu.cfs_period_us"), "100000")?;
                                write(&dir.join("cpu.cfs_quota_us"), &(u64::from(limits.cpus) * 100_000).to_string())?;
                            }
                            "pids" => write(&dir.join("pids.max"), &limits.pids.to_string())?,
                            "cpuset" => {
                                // A new v1 cpuset starts empty: fill the parent from the root first.
                                for f in ["cpuset.cpus", "cpuset.mems"] {
                                    let cur = std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                                    if cur.trim().is_empty() {
                                        write(&parent.join(f), std::fs::read_to_string(mount.join(f))?.trim())?;
                                    }
                                }
                                let all = parse_cpus(&std::fs::read_to_string(parent.join("cpuset.cpus"))?);
                                write(&dir.join("cpuset.cpus"), &pick_cpus(&all, limits.cpus))?;
                                write(
                                    &dir.join("cpuset.mems"),
                                    std::fs::read_to_string(parent.join("cpuset.mems"))?.trim(),
                                )?;
                            }
                            _ => {}
                        }
                    }
                    Ok(())
                })();
                let cg = Cgroup::from_dirs(dirs);
                match result {
                    Ok(()) => Ok(Some(cg)),
                    Err(e) => {
                        cg.remove();
                        Err(e)
                    }
                }
            }
            Enforcement::V2(root) => {
                let parent = root.join(PARENT);
                std::fs::create_dir_all(&parent)?;
                for d in [root.as_path(), parent.as_path()] {
                    let have = std::fs::read_to_string(d.join("cgroup.subtree_control")).unwrap_or_default();
                    for c in ["memory", "cpu", "cpuset", "pids"] {
                        if !have.split_whitespace().any(|h| h == c) {
                            let _ = std::fs::write(d.join("cgroup.subtree_control"), format!("+{c}"));
                        }
                    }
                }
                let dir = parent.join(name);
                std::fs::create_dir_all(&dir)?;
                let cg = Cgroup::from_dirs(vec![dir.clone()]);
                let result = (|| {
                    write(&dir.join("memory.max"), &(limits.memory_mb.saturating_mul(1 << 20)).to_string())?;
                    let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                    write(&dir.join("cpu.max"), &format!("{} 100000", u64::from(limits.cpus) * 100_000))?;
                    write(&dir.join("pids.max"), &limits.pids.to_string())?;
                    if let Ok(all) = std::fs::read_to_string(parent.join("cpuset.cpus.effective")) {
                        let _ = std::fs::write(dir.join("cpuset.cpus"), pick_cpus(&parse_cpus(&all), limits.cpus));
                    }
                    Ok(())
                })();
                match result {
                    Ok(()) => Ok(Some(cg)),
                    Err(e) => {
                        cg.remove();
                        Err(e)
                    }
                }
            }
        }
    }

    /// The groups named `name` that exist now (those of a sandbox still booting, found for
    /// the synchronous last resort); None if there are none.
    pub(crate) fn named(name: &str) -> Option<Cgroup> {
        let dirs: Vec<PathBuf> = match Enforcement::get() {
            Enforcement::Rlimits(_) => return None,
            Enforcement::V1(ctrls) => {
                ctrls.values().map(|m| m.join(PARENT).join(name)).filter(|d| d.is_dir()).collect()
            }
            Enforcement::V2(root) => Some(root.join(PARENT).join(name)).filter(|d| d.is_dir()).into_iter().collect(),
        };
        (!dirs.is_empty()).then(|| Cgroup::from_dirs(dirs))
    }

    fn from_dirs(dirs: Vec<PathBuf>) -> Self {
        let file = join_file(Enforcement::get());
        let procs =
            dirs.iter().filter_map(|d| CString::new(d.join(file).into_os_string().into_encoded_bytes()).ok()).collect();
        Self { dirs, procs }
    }

    /// `name`, a file of `controller` in this group (v2: of the one group).
    fn file(&self, controller: &str, name: &str) -> Option<PathBuf> {
        match Enforcement::get() {
            Enforcement::V1(ctrls) => {
                let mount = ctrls.get(controller)?;
                self.dirs.iter().find(|d| d.starts_with(mount)).map(|d| d.join(name))
            }
            Enforcement::V2(_) => self.dirs.first().map(|d| d.join(name)),
            Enforcement::Rlimits(_) => None,
        }
    }

    fn read_u64(&self, controller: &str, name: &str) -> Option<u64> {
        std::fs::read_to_string(self.file(controller, name)?).ok()?.trim().parse().ok()
    }

    /// CPU time used by the group in microseconds, and memory in use and its limit in bytes.
    pub(crate) fn usage(&self) -> (u64, u64, u64) {
        match Enforcement::get() {
            Enforcement::V2(_) => {
                let stat =
                    self.file("cpu", "cpu.stat").and_then(|f| std::fs::read_to_string(f).ok()).unwrap_or_default();
                let cpu = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec ").and_then(|v| v.trim().parse().ok()))
                    .unwrap_or(0);
                (
                    cpu,
                    self.read_u64("memory", "memory.current").unwrap_or(0),
                    self.read_u64("memory", "memory.max").unwrap_or(0),
                )
            }
            _ => (
                self.read_u64("cpuacct", "cpuacct.usage").unwrap_or(0) / 1000,
                self.read_u64("memory", "memory.usage_in_bytes").unwrap_or(0),
                self.read_u64("memory", "memory.limit_in_bytes").unwrap_or(0),
            ),
        }
    }

    /// Freezes (or thaws) every process of the group and waits until the kernel says it is
    /// done: v1 `freezer.state` (`FREEZING` until all are stopped), v2 `cgroup.freeze` (and
    /// `frozen 1` in `cgroup.events`). A frozen process gets no CPU and keeps its memory.
    pub(crate) async fn freeze(&self, frozen: bool) -> io::Result<()> {
        let unsupported = || io::Error::new(io::ErrorKind::Unsupported, "no freezer controller on this host");
        let (file, value, done, status): (PathBuf, &str, &str, PathBuf) = match Enforcement::get() {
            Enforcement::V2(_) => {
                let f = self.file("cpu", "cgroup.freeze").ok_or_else(unsupported)?;
                let events = self.file("cpu", "cgroup.events").ok_or_else(unsupported)?;
                (f, if frozen { "1" } else { "0" }, if frozen { "frozen 1" } else { "frozen 0" }, events)
            }
            _ => {
                let f = self.file("freezer", "freezer.state").ok_or_else(unsupported)?;
                let state = if frozen { "FROZEN" } else { "THAWED" };
                (f.clone(), state, state, f)
            }
        };
        write(&file, value)?;
        for _ in 0..500 {
            let now = std::fs::read_to_string(&status)?;
            if now.lines().any(|l| l.trim() == done) {
                return Ok(());
            }
            // v1: a group stuck in FREEZING is asked again.
            tokio::time::sleep(Duration::from_millis(10)).await;
            if frozen && now.trim() == "FREEZING" {
                write(&file, value)?;
            }
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, format!("{} did not become {done}", status.display())))
    }

    /// Thaws the group without waiting (before killing it: a frozen v1 task dies only once
    /// thawed). Best effort.
    pub(crate) fn thaw_now(&self) {
        let f = match Enforcement::get() {
            Enforcement::V2(_) => self.file("cpu", "cgroup.freeze").map(|f| (f, "0")),
            _ => self.file("freezer", "freezer.state").map(|f| (f, "THAWED")),
        };
        if let Some((f, v)) = f {
            let _ = std::fs::write(f, v);
        }
    }

    /// The pids in the group now.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut out: Vec<u32> = Vec::new();
        for d in &self.dirs {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                out.extend(s.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// SIGKILLs everything in the group until it is empty (bounded).
    pub(crate) async fn kill_all(&self) {
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for p in pids {
                // A pid that is already gone is harmless (ESRCH).
                kill(p);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// [`Cgroup::remove`] without blocking the runtime: retried with async sleeps while the
    /// last processes exit (a group is busy until its zombies are reaped).
    pub(crate) async fn remove_async(&self) {
        for d in &self.dirs {
            for attempt in 0..200 {
                // A v1 memory group's rmdir moves its charges to the parent: milliseconds.
                let dir = d.clone();
                let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir(dir))
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e.to_string())));
                match removed {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if attempt < 199 => tokio::time::sleep(Duration::from_millis(10)).await,
                    Err(_) => {}
                }
            }
        }
    }

    /// Removes the groups (they must be empty; retried briefly while the last processes exit).
    /// Blocks: for the synchronous last-resort paths only.
    pub(crate) fn remove(&self) {
        for d in &self.dirs {
            for attempt in 0..50 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    Err(_) if attempt < 49 => std::thread::sleep(Duration::from_millis(10)),
                    Err(_) => {}
                }
            }
        }
    }
}

/// The group name of sandbox `id` of this process: `<pid>.<start time>.<id>`, so a later run
/// can tell whether the process that made it is gone.
pub(crate) fn group_name(id: &str) -> String {
    crate::owner::name(id)
}

/// Removes sandbox groups whose owner process is gone (what a SIGKILLed run leaves): kills
/// what they still hold, thaws them (a run killed while a sandbox was paused leaves its group
/// frozen, and a frozen v1 task dies of SIGKILL only once thawed), then removes them. A group
/// is taken whole, across every controller, so the freezer is thawed before the other
/// controllers' directories are removed. Groups of live runs are left alone.
pub(crate) fn sweep() {
    let parents: Vec<PathBuf> = match Enforcement::get() {
        Enforcement::V1(c) => c.values().map(|m| m.join(PARENT)).collect(),
        Enforcement::V2(root) => vec![root.join(PARENT)],
        Enforcement::Rlimits(_) => return,
    };
    let mut stale: std::collections::BTreeMap<String, Vec<PathBuf>> = std::collections::BTreeMap::new();
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(&parent) else { continue };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            // Only groups named the way this program names them: `<pid>.<start time>.<id>`.
            let Some(gone) = crate::owner::name_gone(&name) else { continue };
            if e.path().is_dir() && gone {
                stale.entry(name).or_default().push(e.path());
            }
        }
    }
    for dirs in stale.into_values() {
        let cg = Cgroup::from_dirs(dirs);
        for p in cg.pids() {
            kill(p);
        }
        cg.thaw_now();
        cg.remove();
    }
}

/// SIGKILLs host pid `pid` (as read from a group's `cgroup.procs`); errors are ignored.
pub(crate) fn kill(pid: u32) {
    // Pid 0 or one past `i32::MAX` cannot be in a group: nothing to kill.
    if let Some(p) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// The rlimit fallback, applied between fork and exec of each sandbox process (only
/// `setrlimit`, a raw system call that does not allocate: async-signal-safe).
pub(crate) fn apply_rlimits(limits: &Limits) -> io::Result<()> {
    use rustix::process::{setrlimit, Resource, Rlimit};
    let set = |res, v: u64| setrlimit(res, Rlimit { current: Some(v), maximum: Some(v) });
    set(Resource::Data, limits.memory_mb.saturating_mul(1 << 20))?;
    Ok(set(Resource::Nproc, limits.pids)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpus("0-3,6\n"), [0, 1, 2, 3, 6]);
        assert_eq!(parse_cpus(""), Vec::<u32>::new());
        assert_eq!(parse_cpus("1"), [1]);
    }

    #[test]
    fn cpus_are_handed_out_in_turn() {
        let all = [0, 1];
        assert_eq!(pick_cpus(&all, 2), "0,1");
        assert_eq!(pick_cpus(&all, 5), "0,1");
        let a = pick_cpus(&all, 1);
        let b = pick_cpus(&all, 1);
        assert_ne!(a, b, "two one-cpu sandboxes get different cpus");
    }

    #[test]
    fn the_sweep_leaves_groups_it_did_not_name_and_those_of_live_runs() {
        let Enforcement::V1(ctrls) = Enforcement::get() else { return };
        let parent = ctrls["pids"].join(PARENT);
        std::fs::create_dir_all(&parent).unwrap();
        let foreign = parent.join(format!("someone-else-{}", std::process::id()));
        let live = parent.join(group_name(&format!("sbx-test-{}", std::process::id())));
        let dead = parent.join(format!("0.0.sbx-dead-{}", std::process::id()));
        for d in [&foreign, &live, &dead] {
            std::fs::create_dir_all(d).unwrap();
        }
        sweep();
        let (f, l, d) = (foreign.exists(), live.exists(), dead.exists());
        for dir in [&foreign, &live, &dead] {
            let _ = std::fs::remove_dir(dir);
        }
        assert!(f, "a group named by someone else was removed");
        assert!(l, "a group of a live run was removed");
        assert!(!d, "a group of a dead run was kept");
    }

    #[test]
    fn this_host_enforces_with_cgroups() {
        // CI runs as root on a host with cgroups: the strong path must be the one in force.
        let e = Enforcement::get();
        assert!(!matches!(e, Enforcement::Rlimits(_)), "limits fall back to rlimits here: {}", e.describe());
    }
}

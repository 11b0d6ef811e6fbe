//! Sandboxes booted ahead: a warm pool, as the clouds keep one.
//!
//! Booting an isolated sandbox takes a user namespace, a loop device, a mount namespace with a
//! disk and an overlay, and bubblewrap's start: 20–45 ms, most of a `create`. Two sandboxes of
//! the same [`Shape`] (the same layers, limits and disk size) boot identically: nothing of a
//! create's own (its id aside, which is drawn ahead too) goes into the boot. Its environment,
//! metadata, working directory and timeout live in the provider's record and reach each
//! command as it starts; its network policy is applied to the booted sandbox's network, as a
//! live update is, before the create returns and before any command of the user's runs.
//!
//! So once a shape has been created twice in a run (a run that creates one sandbox pays for
//! no spare), up to `SCENARIO_RUN_SANDBOX_POOL` (default 2; 0 turns the pool off) sandboxes of
//! that shape are kept booted, and a create takes one and returns. A create with host mounts
//! is never pooled (its mounts are part of its boot). At most twice that many are kept over
//! all shapes: a shape asked for lately pushes out the oldest spare of another. Spares are
//! sandboxes like any other on the host (a state directory with the owner file, a cgroup
//! named by their id), so a run killed with SIGKILL leaves nothing the next run's sweep does
//! not find; on every other way out the provider ends them with its own sandboxes.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::cgroup::{Cgroup, Limits};
use super::sandbox::{Layout, NsSandbox};
use super::userns::{self, IdMap};
use super::{disk, netns, pool};
use crate::provider::{Mount, ProviderError, Result};

/// What a sandbox's boot is made of: two creates of the same shape boot the same sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Shape {
    /// Its read-only layers, topmost first (paths named by content digest).
    pub lowers: Vec<PathBuf>,
    pub limits: Limits,
    pub disk_mb: u64,
}

/// A booted sandbox no create owns yet (or a fresh one a create just made).
pub(super) struct Booted {
    pub id: String,
    /// Its directory is `layout.dir`.
    pub layout: Layout,
    pub ns: NsSandbox,
    pub net: Arc<netns::Net>,
}

impl Booted {
    /// Ends it: every process, its cgroup and mount point, then its directory (its loop device
    /// and network go with their last user).
    pub(super) async fn discard(self) {
        self.ns.stop().await;
        let dir = self.layout.dir;
        let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir));
        let _ = tokio::time::timeout(Duration::from_secs(10), rm).await;
    }
}

/// What boots a sandbox: the pieces of the provider a boot needs, shared with the pool's
/// refill task (which must not keep the provider itself alive).
pub(super) struct Booter {
    pub state_dir: PathBuf,
    pub ids: IdMap,
    pub nets: Arc<netns::Pool>,
    pub disks: Arc<disk::Pool>,
    /// User namespaces made ahead (for reboots too).
    pub users: Arc<userns::Pool>,
    /// Boots under way: id and mount point (see [`Booter::stop_booting_now`]).
    pub booting: Mutex<HashMap<String, PathBuf>>,
}

/// Takes a boot off the list of those under way when it ends, however it ends.
struct Booting<'a>(&'a Booter, String);

impl Drop for Booting<'_> {
    fn drop(&mut self) {
        self.0.booting.lock().expect("booting").remove(&self.1);
    }
}

/// What a boot under way had made when the provider had to stop at once.
pub(super) struct Abandoned {
    dir: PathBuf,
    mount_point: PathBuf,
    cgroup: Option<Cgroup>,
}

impl Abandoned {
    /// Removes what is left once its processes are gone.
    pub(super) fn remove(&self) {
        if let Some(c) = &self.cgroup {
            c.remove();
        }
        let _ = std::fs::remove_dir(&self.mount_point);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Booter {
    pub(super) fn new(state_dir: PathBuf, ids: IdMap, nets: Arc<netns::Pool>, disks: Arc<disk::Pool>) -> Self {
        let users = userns::Pool::new(ids);
        Self { state_dir, ids, nets, disks, users, booting: Mutex::new(HashMap::new()) }
    }

    /// The synchronous last resort for boots under way (a spare's refill, a create): kills
    /// what each has started; the caller removes the rest once they are gone. (The boot's own
    /// task may finish after this and ends what it made itself: a closed pool takes nothing.)
    pub(super) fn stop_booting_now(&self) -> Vec<Abandoned> {
        let booting: Vec<(String, PathBuf)> =
            self.booting.lock().expect("booting").iter().map(|(i, m)| (i.clone(), m.clone())).collect();
        booting
            .into_iter()
            .map(|(id, mount_point)| {
                let cgroup = Cgroup::named(&super::cgroup::group_name(&id));
                if let Some(c) = &cgroup {
                    c.thaw_now();
                    for p in c.pids() {
                        super::cgroup::kill(p);
                    }
                }
                Abandoned { dir: self.state_dir.join(&id), mount_point, cgroup }
            })
            .collect()
    }

    /// Boots a sandbox of `shape` with `volumes` bound in, under a new id.
    pub(super) async fn boot(&self, shape: &Shape, volumes: &[Mount]) -> Result<Booted> {
        let id = format!("sbx-{}", crate::random::hex(6));
        let dir = self.state_dir.join(&id);
        // Who owns it, so a later run can sweep it if this process dies without cleaning up.
        let d = dir.clone();
        super::errors::blocking(move || {
            crate::owner::create_dir(&d)
                .map_err(|e| ProviderError::infra(format!("cannot prepare sandbox directory: {e}")))
        })
        .await?;
        let mut layout = Layout::new(&dir, self.ids, shape.limits);
        self.booting.lock().expect("booting").insert(id.clone(), layout.merged.clone());
        let _booting = Booting(self, id.clone());
        layout.volumes = volumes.to_vec();
        layout.on_disk(disk::Disk::new(&dir, shape.disk_mb));
        layout.lowers.clone_from(&shape.lowers);
        let abandon = |layout: &Layout| {
            let (merged, dir) = (layout.merged.clone(), dir.clone());
            tokio::task::spawn_blocking(move || {
                let _ = std::fs::remove_dir(merged);
                let _ = std::fs::remove_dir_all(dir);
            })
        };
        let net = match self.nets.take().await {
            Ok(n) => n,
            Err(e) => {
                let _ = abandon(&layout).await;
                return Err(super::errors::net_error("cannot make the sandbox's network".into(), e));
            }
        };
        layout.net = Some(net.clone());
        let (l, disks) = (layout.clone(), self.disks.clone());
        let prepared = tokio::task::spawn_blocking(move || {
            let d = l.disk.as_ref().expect("a sandbox has a disk");
            let dev = disks.take(&d.image, d.size_mb)?;
            l.create()?;
            Ok::<_, std::io::Error>(dev)
        })
        .await
        .map_err(|e| ProviderError::infra(e.to_string()))
        .and_then(|r| r.map_err(|e| ProviderError::infra(format!("cannot prepare sandbox directory: {e}"))));
        match prepared {
            Ok(dev) => layout.disk.as_mut().expect("a sandbox has a disk").dev = Some(Arc::new(dev)),
            Err(e) => {
                let _ = abandon(&layout).await;
                return Err(e);
            }
        }
        let users = match self.users.take() {
            Ok(ns) => ns,
            Err(e) => {
                let _ = abandon(&layout).await;
                return Err(userns::failed(&e));
            }
        };
        match NsSandbox::start(layout.clone(), &id, Some(users)).await {
            Ok(ns) => Ok(Booted { id, layout, ns, net }),
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                Err(e)
            }
        }
    }
}

/// Spares kept per shape when `SCENARIO_RUN_SANDBOX_POOL` does not say.
const DEFAULT_TARGET: usize = 2;

/// The spares, by shape (see the module documentation).
pub(super) struct Pool(Arc<pool::Pool<Spares>>);

/// What [`Pool`] keeps: sandboxes of the shapes wanted, booted by the booter.
struct Spares {
    booter: Arc<Booter>,
    asked: Mutex<Asked>,
}

#[derive(Default)]
struct Asked {
    /// How often each shape was created.
    counts: HashMap<Shape, u32>,
    /// Shapes to keep spares of (asked for at least twice), most recently asked last.
    wanted: Vec<Shape>,
}

/// At most this many spares are kept over all shapes, for `target` per shape.
fn cap(target: usize) -> usize {
    target * 2
}

#[async_trait::async_trait]
impl pool::Maker for Spares {
    type Spare = Booted;
    type Kind = Shape;

    /// The most recently asked shape short of spares, making room for it from the oldest
    /// spare of another shape if the pool is full (or none, if there is none to be had).
    fn next(&self, ready: &[&Shape], target: usize) -> Option<pool::Next<Shape>> {
        let asked = self.asked.lock().expect("warm pool");
        let short = asked.wanted.iter().rev().find(|s| ready.iter().filter(|r| **r == *s).count() < target)?;
        let evict = if ready.len() >= cap(target) { Some(ready.iter().position(|r| *r != short)?) } else { None };
        Some(pool::Next { kind: short.clone(), evict })
    }

    /// A failure shows on the next create, which boots its own and reports it.
    async fn make(&self, shape: &Shape) -> Option<Booted> {
        self.booter.boot(shape, &[]).await.ok()
    }

    fn usable(&self, b: &Booted) -> bool {
        b.ns.alive()
    }

    fn destroy_now(&self, b: Booted) {
        b.ns.stop_now();
        b.ns.remove_leftovers();
        let _ = std::fs::remove_dir_all(&b.layout.dir);
    }

    async fn destroy(&self, b: Booted) {
        b.discard().await;
    }
}

impl Pool {
    /// Spares booted by `booter`, `SCENARIO_RUN_SANDBOX_POOL` of each shape wanted.
    pub(super) fn new(booter: Arc<Booter>) -> Self {
        let target = pool::target_from_env("SCENARIO_RUN_SANDBOX_POOL", DEFAULT_TARGET, 16);
        Self(pool::Pool::new(Spares { booter, asked: Mutex::default() }, target))
    }

    /// A spare of `shape` if one is ready and alive; counts the create either way, and starts
    /// the refill once the shape is wanted.
    pub(super) fn take(&self, shape: &Shape) -> Option<Booted> {
        let target = self.0.target();
        if target == 0 {
            return None;
        }
        {
            let mut asked = self.0.maker().asked.lock().expect("warm pool");
            let n = asked.counts.entry(shape.clone()).or_insert(0);
            *n = n.saturating_add(1);
            if *n >= 2 {
                asked.wanted.retain(|s| s != shape);
                asked.wanted.push(shape.clone());
                if asked.wanted.len() > cap(target) {
                    asked.wanted.remove(0);
                }
            }
        }
        self.0.take(shape)
    }

    /// Ends the spares of every shape and forgets what was asked (their layers are going
    /// away): a spare booting now is ended when its boot returns, and no shape is wanted again
    /// until it is created twice more.
    pub(super) async fn clear(&self) {
        {
            let mut asked = self.0.maker().asked.lock().expect("warm pool");
            asked.counts.clear();
            asked.wanted.clear();
        }
        self.0.clear().await;
    }

    /// No more spares: waits (bounded) for a boot under way, then ends every spare.
    pub(super) async fn close(&self) {
        self.0.close().await;
    }

    /// No more spares; hands back those ready, for the caller to end at once (the synchronous
    /// last resort). A boot under way ends its sandbox itself when it finds the pool closed.
    pub(super) fn close_now(&self) -> Vec<Booted> {
        self.0.close_now()
    }
}

//! One boot of an isolated sandbox (a sandbox paused filesystem-only is booted again on
//! resume), and what pauses it.

use std::sync::Arc;

use super::sandbox::NsSandbox;
use crate::provider::forward;

/// One boot of an isolated sandbox: its namespaces and what forwards ports into them.
pub(super) struct Boot {
    pub ns: NsSandbox,
    pub fwd: forward::Forwarder,
}

impl Boot {
    pub(super) fn new(ns: NsSandbox) -> Arc<Self> {
        Arc::new(Self { fwd: forward::Forwarder::new(ns.pid1.pid()), ns })
    }
}

impl Boot {
    /// Ends this boot: its port forwarding, every process in it, its cgroup and mount point.
    pub(super) async fn shut_down(&self) {
        self.fwd.stop();
        self.ns.stop().await;
    }
}

/// What pauses a sandbox with its memory kept: the freezer of its current boot's cgroup.
pub(super) struct Freezer(pub Arc<Boot>);

impl Freezer {
    pub(super) async fn freeze(&self, frozen: bool) -> std::io::Result<()> {
        self.0.ns.cgroup().expect("a freezer has a cgroup").freeze(frozen).await
    }
}

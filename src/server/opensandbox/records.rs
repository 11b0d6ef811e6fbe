//! What OpenSandbox's side keeps, as data: its state beside serve's ([`State`], held in
//! `AppState`), the OpenSandbox record of a sandbox ([`OsSandbox`]) and what it is made of
//! (execd's commands and sessions, code contexts, the egress policy), its snapshots and the
//! templates built from images. Below every handler of the room, it names none of them; the
//! handlers' behaviour (`impl` blocks) stays with them.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use tokio::sync::oneshot;

use super::volumes::VolumeConfig;

/// What OpenSandbox adds to serve's sandboxes, and the answers' shared helpers.
#[derive(Default)]
pub(crate) struct State {
    pub(super) sandboxes: Mutex<HashMap<String, Arc<OsSandbox>>>,
    pub(super) snapshots: Snapshots,
    pub(super) images: Images,
    pub(super) routers: OnceLock<Routers>,
    pub(super) volumes: VolumeConfig,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("opensandbox::State").finish_non_exhaustive()
    }
}

pub(super) struct Routers {
    pub(super) lifecycle: Router,
    pub(super) execd: Router,
    pub(super) egress: Router,
}

impl State {
    pub(crate) fn new(volumes: VolumeConfig) -> Self {
        Self { volumes, ..Default::default() }
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<OsSandbox>> {
        self.sandboxes.lock().expect("opensandbox").get(id).cloned()
    }

    pub(super) fn insert(&self, sb: Arc<OsSandbox>) {
        self.sandboxes.lock().expect("opensandbox").insert(sb.id.clone(), sb);
    }

    pub(super) fn remove(&self, id: &str) -> Option<Arc<OsSandbox>> {
        self.sandboxes.lock().expect("opensandbox").remove(id)
    }

    pub(super) fn all(&self) -> Vec<Arc<OsSandbox>> {
        self.sandboxes.lock().expect("opensandbox").values().cloned().collect()
    }

    /// Templates made for OpenSandbox (images, snapshots): removed when serve stops.
    pub(crate) fn template_ids(&self) -> Vec<String> {
        let mut ids = self.images.template_ids();
        ids.extend(self.snapshots.template_ids());
        ids
    }
}

/// What a sandbox was started from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Image(String),
    Snapshot(String),
    Template(String),
}

/// The OpenSandbox side of one of serve's sandboxes (same id).
pub(crate) struct OsSandbox {
    pub id: String,
    pub source: Source,
    pub entrypoint: Vec<String>,
    /// No automatic expiration (a create with a null timeout): `expiresAt` is left out.
    pub manual_cleanup: std::sync::atomic::AtomicBool,
    /// create's `platform`, echoed.
    pub platform: Option<serde_json::Value>,
    /// Its metadata as create and the patches since made it (the E2B view keeps create's).
    pub metadata: Mutex<std::collections::BTreeMap<String, String>>,
    /// The expiry (unix seconds) it had when paused: a paused sandbox does not expire, and a
    /// resume gives it back.
    pub paused_expiry: Mutex<Option<u64>>,
    /// A note on the state (`status.reason`, `status.message`), e.g. why the entrypoint ended.
    pub note: Mutex<Option<(String, String)>>,
    /// When the state last changed (unix microseconds).
    pub transition_us: std::sync::atomic::AtomicI64,
    /// `access.renew.extend.seconds`: traffic through the proxy moves the expiry this far out.
    pub renew_on_access: Option<u64>,
    pub execd: Execd,
    pub code: Contexts,
    pub egress: Mutex<Policy>,
}

/// execd's state for one sandbox.
#[derive(Default)]
pub(crate) struct Execd {
    pub(super) commands: Mutex<HashMap<String, Arc<Command>>>,
    pub(super) sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// The last CPU sample for `/metrics` (unix microseconds, CPU microseconds).
    pub(super) cpu_sample: Mutex<Option<(i64, u64)>>,
}

impl Execd {
    /// The sandbox is going: forget its commands and sessions.
    pub(crate) fn end_all(&self) {
        self.commands.lock().expect("commands").clear();
        self.sessions.lock().expect("sessions").clear();
    }
}

/// One command run through `/command`.
pub(super) struct Command {
    pub(super) content: String,
    pub(super) background: bool,
    pub(super) started_us: i64,
    pub(super) pid: Mutex<Option<u32>>,
    pub(super) state: Mutex<CommandState>,
}

#[derive(Default)]
pub(super) struct CommandState {
    pub(super) running: bool,
    pub(super) exit_code: Option<i64>,
    pub(super) error: Option<String>,
    pub(super) finished_us: Option<i64>,
    /// A background command's combined output: what is kept, and how many bytes came before.
    pub(super) log: Vec<u8>,
    pub(super) log_base: u64,
}

/// A bash session: the environment and directory its next run starts from.
pub(super) struct Session {
    pub(super) env: Mutex<BTreeMap<String, String>>,
    pub(super) cwd: Mutex<Option<String>>,
    /// The run going on, if any (its pid), for delete and interrupt.
    pub(super) running: Mutex<Option<u32>>,
}

/// The code contexts of one sandbox.
#[derive(Default)]
pub(crate) struct Contexts {
    /// Context id → language.
    pub(super) by_id: Mutex<HashMap<String, String>>,
    /// Executions under way, by context id: firing interrupts it.
    pub(super) running: Mutex<HashMap<String, oneshot::Sender<()>>>,
}

/// A sandbox's egress policy as OpenSandbox states it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Policy {
    /// `defaultAction`: false is `allow`.
    pub deny_by_default: bool,
    pub rules: Vec<Rule>,
}

impl Default for Policy {
    /// An empty policy: everything allowed.
    fn default() -> Self {
        Self { deny_by_default: false, rules: Vec::new() }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    pub allow: bool,
    pub target: String,
}

/// Snapshots taken through this API: by id, the template serve made of each.
#[derive(Default)]
pub(crate) struct Snapshots {
    pub(super) by_id: Mutex<HashMap<String, SnapshotRecord>>,
}

#[derive(Debug, Clone)]
pub(super) struct SnapshotRecord {
    pub(super) id: String,
    pub(super) sandbox_id: String,
    pub(super) name: Option<String>,
    pub(super) template: String,
    pub(super) created_us: i64,
}

/// Templates built from images, by image and login.
#[derive(Default)]
pub(crate) struct Images {
    pub(super) built: Mutex<HashMap<String, String>>,
}

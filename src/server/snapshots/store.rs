//! The snapshots of this server, as data (held in `AppState`). What is done with them is in
//! `super` (the snapshot and fork API).

use std::sync::Mutex;

#[derive(Debug, Clone)]
pub(super) struct Snapshot {
    /// Its ID, also the provider's template name.
    pub(super) id: String,
    pub(super) names: Vec<String>,
    /// The E2B ID of the sandbox it was taken of.
    pub(super) sandbox: String,
    /// Taken for a fork: never listed nor found by name.
    pub(super) hidden: bool,
}

/// The snapshots of this server. `deleted` holds IDs deleted while sandboxes still ran on
/// them, for the provider to remove at shutdown.
#[derive(Debug, Default)]
pub(crate) struct Store {
    pub(super) live: Mutex<Vec<Snapshot>>,
    pub(super) deleted: Mutex<Vec<String>>,
}

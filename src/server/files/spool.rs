//! Where `/files` uploads wait on disk, as data (held in `AppState`). Spooling is in `super`.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Where uploads wait on disk, and the memory budget for handing them to the provider.
pub(crate) struct Spool {
    pub(super) dir: PathBuf,
    pub(super) next: AtomicU64,
    /// KiB of upload bytes that may be held in memory at once, over all requests.
    pub(super) budget: Arc<tokio::sync::Semaphore>,
    pub(super) budget_kib: u32,
}

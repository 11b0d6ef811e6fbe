//! What a provider counts about itself: a leaf, so the result model reports it without
//! importing the provider seam.

use serde::Serialize;

/// Counters a provider keeps about itself, for reports and tests.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ProviderStats {
    pub created: u64,
    pub destroyed: u64,
    pub live: u64,
    /// Highest number of sandboxes alive at one moment.
    pub peak_live: u64,
}

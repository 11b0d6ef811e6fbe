//! The errors the provider's pieces share: a network's failure, a policy without a network of
//! its own, a blocking task's.

use crate::provider::{ErrorKind, ProviderError, Result};

/// A network's failure: a refusal of the descriptor book (`fds`) is one for want of capacity.
pub(super) fn net_error(what: String, e: std::io::Error) -> ProviderError {
    let kind = match e.kind() {
        std::io::ErrorKind::QuotaExceeded => ErrorKind::Capacity,
        _ => ErrorKind::Infra,
    };
    ProviderError::new(kind, format!("{what}: {e}"))
}

pub(super) fn no_policy_without_isolation() -> ProviderError {
    ProviderError::unsupported(
        "network policies need isolated sandboxes (a network namespace of their own): without isolation a sandbox shares the host's network",
    )
}

pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ProviderError::infra(format!("file operation failed: {e}")))?
}

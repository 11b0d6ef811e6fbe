//! The Docker engine's API errors, as the provider reports them.

use bollard::errors::Error as DockerError;

use crate::provider::{ErrorKind, ProviderError};

/// Maps an engine error to a provider error; `what` reads after "failed to".
pub(crate) fn api_err(e: DockerError, what: &str) -> ProviderError {
    match &e {
        DockerError::DockerResponseServerError { status_code, message } => {
            let msg = format!("{what}: {}", message.trim());
            match status_code {
                404 => ProviderError::not_found(msg),
                400 | 409 | 403 => ProviderError::invalid(msg),
                _ => ProviderError::infra(msg),
            }
        }
        DockerError::RequestTimeoutError => {
            ProviderError::new(ErrorKind::Timeout, format!("{what}: the Docker engine did not answer in time"))
        }
        _ => ProviderError::infra(format!("{what}: {e}")),
    }
}

/// Whether the engine answered `e` with HTTP status `code`.
pub(crate) fn is_status(e: &DockerError, code: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

//! The one error type of the image layer.
//!
//! Images fail for reasons a QA author must tell apart: a reference nobody can resolve
//! offline (their scenario or template is wrong), credentials a registry refused, and
//! infrastructure that broke (mmdebstrap, the mirror, a full disk). The kind carries that
//! difference to the provider seam, where it decides whether a scenario FAILs or ERRORs;
//! the message is a lowercase fragment that reads after "failed to …".

use std::fmt;

use crate::error::{ErrorKind, ProviderError};

/// Why an image could not be had: a kind (as the providers use it) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ImageError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    /// The infrastructure broke (build tool, network, disk).
    pub fn infra(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Infra, message)
    }
    /// The reference or the image is malformed (or hostile).
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    /// The reference names nothing that can be had.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    /// A registry refused the credentials (or wanted some).
    pub fn auth(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Auth, message)
    }

    /// The same error with `what` put in front of its message (`what: message`).
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ImageError {}

impl From<ImageError> for ProviderError {
    fn from(e: ImageError) -> Self {
        ProviderError::new(e.kind, e.message)
    }
}

impl From<std::io::Error> for ImageError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::InvalidInput => Self::invalid(e.to_string()),
            _ => Self::infra(e.to_string()),
        }
    }
}

pub type Result<T, E = ImageError> = std::result::Result<T, E>;

//! The error every layer that talks to a sandbox shares: a kind the runner decides the
//! outcome by (a missing file is a step failure; a broken provider is an ERROR) and a message.
//! A leaf, so the layers below the provider seam (`image`, `connect`) report in it without
//! importing the seam.

use std::fmt;

use serde::Serialize;

/// What went wrong, as far as the runner needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The thing asked for does not exist (file, sandbox, process). A step failure.
    NotFound,
    /// The request was wrong (bad path, bad argument). A step failure.
    Invalid,
    /// The operation ran out of time.
    Timeout,
    /// Credentials were refused.
    Auth,
    /// The provider or its infrastructure broke. Makes the scenario ERROR.
    Infra,
    /// The provider does not support the operation.
    Unsupported,
    /// The host has no room for what was declared (a sandbox's disk past the free space of
    /// the filesystem it lives on): refused before anything was made. Makes the scenario
    /// ERROR, as the environment, not the platform's behaviour, is what fell short.
    Capacity,
}

/// An error from a provider: a kind and a lowercase message that reads after "failed to …".
#[derive(Debug, Clone)]
pub struct ProviderError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ProviderError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    pub fn infra(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Infra, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ProviderError {}

impl From<std::io::Error> for ProviderError {
    fn from(e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => ErrorKind::Invalid,
            std::io::ErrorKind::TimedOut => ErrorKind::Timeout,
            _ => ErrorKind::Infra,
        };
        Self::new(kind, e.to_string())
    }
}

//! The typed, spanned scenario model, and the loader that builds it from files.
//!
//! `load` reads every file, parses and validates all of them, and returns either the
//! scenarios or every diagnostic at once; nothing runs if anything is invalid.

pub mod areas;
pub mod args;
pub mod capability;
pub mod kinds;
mod load;
pub mod local_file;
mod scenario;
mod validate;

pub use capability::PROVIDERS;
pub use load::{expand, expand_paths, load, load_found, Expanded, Loaded, PathsError};
pub use scenario::{
    text, Case, ErrorClass, Eventually, ExpectError, IncludeFrame, KnownIssue, Requires, Retry, Scenario, Step,
};
pub use validate::LoadOptions;
pub use validate::{MAX_ATTEMPTS, MAX_BACKOFF, MAX_CASES};

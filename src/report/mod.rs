//! Reporters: the live terminal view, the summary table, and the JUnit, JSON and evidence files.

pub mod events;
pub mod evidence;
pub mod format;
pub mod human;
pub mod json;
pub mod junit;
pub mod summary;

#[cfg(test)]
pub(crate) mod fixture;

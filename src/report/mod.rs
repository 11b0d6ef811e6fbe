//! Reporters: the live terminal view, the summary, and the JUnit, JSON, evidence and HTML files.

pub mod evidence;
pub mod format;
pub mod github;
pub mod html;
pub mod human;
pub mod json;
pub mod junit;
pub mod summary;

#[cfg(test)]
pub(crate) mod fixture;

use crate::results::Event;

/// A consumer of events. Exactly one reporter owns the terminal.
pub trait Reporter: Send {
    fn handle(&mut self, event: &Event);
}

//! Reporters: the live terminal view, the summary table, and the JUnit, JSON and evidence files.

pub mod events;

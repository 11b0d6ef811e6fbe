//! scenario-run: end-to-end scenarios for agent sandbox platforms, as data.

pub mod diag;
pub mod mask;
pub mod provider;
pub mod report;

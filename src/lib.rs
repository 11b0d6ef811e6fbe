//! scenario-run: end-to-end scenarios for agent sandbox platforms, as data.

pub mod diag;
pub mod duration;
pub mod matcher;
pub mod provider;
pub mod report;
pub mod select;
pub mod template;
pub mod yaml;

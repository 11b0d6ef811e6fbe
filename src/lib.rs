//! scenario-run: end-to-end scenarios for agent sandbox platforms, as data.

pub mod config;
pub mod diag;
pub mod duration;
pub mod mask;
pub mod matcher;
pub mod model;
pub mod provider;
pub mod runner;
pub mod report;
pub mod schema;
pub mod select;
pub mod steps;
pub mod template;
pub mod yaml;

//! scenario-run: end-to-end scenarios for agent sandbox platforms, as data.
//!
//! Flow: load -> parse -> validate (all diagnostics at once) -> plan -> execute (events) ->
//! report -> exit code. `check` stops after the plan.

pub mod bench;
pub mod cli;
pub mod config;
pub mod connect;
pub mod cpu_bound;
pub mod diag;
pub mod duration;
pub mod error;
pub mod exit;
pub mod expr;
pub mod hostfs;
pub mod image;
pub mod janitor;
pub mod mask;
pub mod matcher;
pub mod model;
pub mod net;
pub mod out;
pub(crate) mod owner;
pub mod provider;
pub mod random;
pub mod report;
pub mod results;
pub mod runner;
pub mod schema;
pub mod select;
pub mod server;
pub mod size;
pub mod stats;
pub mod steps;
pub mod templates;
pub mod yaml;

//! What each command of `scenario-run` does, as calls `main` makes once it has parsed the
//! flags: the run (loading, selection, the provider, the terminal view, signals, reports), the
//! checks, the janitor, the CI matrix, image preparation and `serve`. Each returns the
//! [`crate::exit::Exit`] the process ends with; `main` only parses and exits.
//!
//! Also the command line's two-pass parse: a flag that reads a variable takes it from the
//! `--env-file`s and `./.env` as well as from the environment ([`parse_with_env_files`]).

mod bench;
mod commands;
mod compat;
mod keep;
mod last_run;
mod run;
mod serve;
mod shell;
mod wiring;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;

use crate::config;

pub use crate::bench::Mode as BenchMode;
pub use bench::{bench, BenchArgs};
pub use commands::{cache, cleanup, image, matrix, steps, write_schema};
pub use compat::{compat, CompatArgs};
pub use last_run::Rerun;
pub use run::{check, run, NoScenarios, RunRequest, View};
pub use serve::{exec_serve, serve, SERVE_BIN};
pub use shell::shell;
pub use wiring::block_on;

/// Parse the command line. Flags with an `env = …` default take it, in this order: the flag,
/// the process environment, the last `--env-file` that sets it, `./.env`, the built-in
/// default (docs/reference.md, "Configuration and secrets"). The files are read here, not copied into
/// the process environment: a copy would count as a shell variable and beat `--env-file`.
/// `env_files` names the `--env-file`s a first parse found.
pub fn parse_with_env_files<C: clap::Parser>(args: &[OsString], env_files: impl FnOnce(C) -> Vec<String>) -> C {
    // A first pass only to learn the --env-file flags; a bad command line is reported by
    // the second, and a bad file by the command that reads the environment.
    let named = C::try_parse_from(args).map(env_files).unwrap_or_default();
    let files = config::file_layer(Path::new(".env"), &named).unwrap_or_default();
    let cmd = with_file_defaults(C::command(), &files);
    let matches = cmd.get_matches_from(args);
    C::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Give every flag that reads a variable the files' value of it as its default, unless the
/// process environment has it (then clap's own `env` lookup wins).
fn with_file_defaults(cmd: clap::Command, files: &BTreeMap<String, String>) -> clap::Command {
    let from_files: Vec<(clap::Id, String)> = cmd
        .get_arguments()
        .filter_map(|a| {
            let name = a.get_env()?.to_str()?;
            if std::env::var_os(name).is_some_and(|v| !v.is_empty()) {
                return None;
            }
            let value = files.get(name).filter(|v| !v.is_empty())?;
            Some((a.get_id().clone(), value.clone()))
        })
        .collect();
    let mut cmd = from_files.into_iter().fold(cmd, |c, (id, v)| c.mut_arg(id, |a| a.default_value(v)));
    let subs: Vec<String> = cmd.get_subcommands().map(|s| s.get_name().to_string()).collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, |s| with_file_defaults(s, files));
    }
    cmd
}

//! `scenario-run-serve`: the E2B- and OpenSandbox-compatible server over local sandboxes, what
//! `scenario-run serve` becomes. A binary of its own so that the client, `scenario-run`,
//! carries none of the server's code ([`scenario_run::cli::exec_serve`]).

use std::process::ExitCode;

use clap::Parser;

use scenario_run::cli;
use scenario_run::server::ServeArgs;

/// Serve the E2B API (control plane and envd on one port) and OpenSandbox's over local
/// sandboxes, for the unmodified SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR,
/// E2B_DOMAIN=localhost:PORT.
#[derive(Parser)]
#[command(name = "scenario-run serve", bin_name = "scenario-run serve", version)]
struct ServeCli {
    #[command(flatten)]
    args: ServeArgs,
}

fn main() -> ExitCode {
    // Before anything starts a child: no descriptor the server inherited reaches one.
    scenario_run::provider::local::seal_inherited_descriptors();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli: ServeCli = cli::parse_with_env_files(&argv, |_| Vec::new());
    ExitCode::from(cli::serve(&cli.args).code())
}

//! The command line: flags in, a library call, its exit out. What each command does lives in
//! [`scenario_run::cli`]; the exit codes in [`scenario_run::exit`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use scenario_run::cli::{self, NoScenarios, RunRequest, View};
use scenario_run::provider::factory::ProviderKind;
use scenario_run::report::ReportFiles;
use scenario_run::schema;
use scenario_run::select::Shard;

/// Under `--help` of a run (docs/reference.md, "Outcomes and exit codes"; [`scenario_run::exit`]).
const EXIT_CODES_HELP: &str = "\
Exit codes:
  0    all good: passed, xfail, non-strict xpass, skipped (see --fail-on-skip)
  1    a scenario failed, a strict xpass, or a skip under --fail-on-skip
  2    command-line usage, or a selection that matches no scenario
  3    invalid scenario files
  4    infrastructure error and no failure, or a report not written
  130  interrupted (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT)";

#[derive(Parser)]
#[command(
    name = "scenario-run",
    version,
    about = "End-to-end scenarios for agent sandbox platforms, written as YAML data",
    after_help = EXIT_CODES_HELP
)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios (the default when no command is given).
    #[command(after_help = EXIT_CODES_HELP)]
    Run(Box<RunArgs>),
    /// Validate scenario files without running anything (exit 3 if any is invalid).
    Check(CheckArgs),
    /// List step kinds with their fields, outputs and an example.
    Steps {
        /// Show only this kind.
        kind: Option<String>,
    },
    /// Write the JSON Schema for scenario files (default: schema/scenario.schema.json).
    Schema {
        /// Where to write it; `-` for standard output.
        #[arg(long, default_value = schema::SCHEMA_PATH)]
        out: String,
        /// Do not write: exit 1 if the file differs from what would be written.
        #[arg(long)]
        check: bool,
    },
    /// Find sandboxes left behind by runs (tagged e2e=<run id>) and delete them. Dry run
    /// unless --yes; never touches a sandbox without the tag.
    Cleanup {
        /// Where to look.
        #[arg(long, value_enum, default_value = "local", env = "SCENARIO_RUN_PROVIDER")]
        provider: ProviderKind,
        /// Only sandboxes of this run (default: $E2E_RUN_ID).
        #[arg(long, env = "E2E_RUN_ID", conflicts_with = "all_tagged")]
        run_id: Option<String>,
        /// Every sandbox tagged by any run.
        #[arg(long)]
        all_tagged: bool,
        /// Only sandboxes older than this (`30m`, `2h`).
        #[arg(long, value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Delete them (without it, only list what would be deleted).
        #[arg(long)]
        yes: bool,
        /// More variables from a dotenv file (after ./.env; the environment still wins).
        #[arg(long = "env-file", value_name = "FILE")]
        env_files: Vec<String>,
    },
    /// Print the CI matrix of scenario folders (for GitHub Actions: --emit github).
    Matrix {
        /// Output format.
        #[arg(long, default_value = "github", value_parser = ["github", "lines"])]
        emit: String,
        /// The folder whose sub-folders are the matrix.
        #[arg(default_value = "scenarios")]
        root: String,
        /// Also fan out over these providers (comma-separated): one entry per provider and folder.
        #[arg(long, value_delimiter = ',')]
        providers: Vec<String>,
    },
    /// Build or pull an image for local sandboxes (`base`, a public name from the offline
    /// table, or a registry reference) and print where its root filesystem is. Useful to
    /// prepare a CI machine's cache before a run.
    Image {
        /// The image: `base`, `python:3.11-slim-bookworm`, `localhost:5000/x:tag`, ...
        reference: String,
        /// Registry login for a private registry (or REGISTRY_USERNAME / REGISTRY_PASSWORD).
        #[arg(long, env = "REGISTRY_USERNAME")]
        username: Option<String>,
        #[arg(long, env = "REGISTRY_PASSWORD", hide_env_values = true)]
        password: Option<String>,
    },
    /// List the template builds the local provider keeps by content between runs (in the
    /// state directory's `layers/`), or prune them.
    Cache {
        #[command(subcommand)]
        action: Option<CacheAction>,
    },
    /// A terminal in a sandbox (one --keep-on-failure kept), through the provider's `pty`
    /// capability; with `-- CMD`, one command instead (needed when stdin is no terminal).
    /// Exits with the command's code.
    #[command(after_help = "On local, a sandbox lives as long as the run that kept it: that run waits after its \
summary until Ctrl-C, and `shell` reaches the sandbox through it. A kept sandbox on another provider \
ends after 30m, or with `scenario-run cleanup --provider P --run-id RUN --yes`.")]
    Shell {
        /// The sandbox's id, as the run printed it.
        sandbox: String,
        /// Where the sandbox lives.
        #[arg(long, value_enum, default_value = "local", env = "SCENARIO_RUN_PROVIDER")]
        provider: ProviderKind,
        /// More variables from a dotenv file (after ./.env; the environment still wins).
        #[arg(long = "env-file", value_name = "FILE")]
        env_files: Vec<String>,
        /// Run this command (through `sh -c`, words joined by spaces) instead of a terminal.
        #[arg(last = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// How fast a platform is: time to interactive (create until a first command returns)
    /// and a command's round trip, over N iterations, as ComputeSDK's sandbox benchmarks
    /// measure them (5 % trimmed from each end; p50, p95, p99; the success rate).
    Bench {
        /// Where the sandboxes are made.
        #[arg(long, value_enum, default_value = "local", env = "SCENARIO_RUN_PROVIDER")]
        provider: ProviderKind,
        /// The template each sandbox starts from.
        #[arg(long, default_value = "base")]
        template: String,
        /// How many sandboxes.
        #[arg(short = 'n', long, default_value_t = 100)]
        iterations: usize,
        /// One after another, one started every --stagger, or all at once.
        #[arg(long, value_enum, default_value = "sequential")]
        mode: scenario_run::cli::BenchMode,
        /// The time between two starts in the staggered mode.
        #[arg(long, default_value = "200ms", value_parser = parse_duration)]
        stagger: Duration,
        /// Every figure and sample as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<std::path::PathBuf>,
        /// Fail (exit 1) when the time to interactive's p95 is over this.
        #[arg(long, value_parser = parse_duration)]
        max_p95: Option<Duration>,
        /// More variables from a dotenv file (after ./.env; the environment still wins).
        #[arg(long = "env-file", value_name = "FILE")]
        env_files: Vec<String>,
        /// Local provider isolation: auto (namespaces when the host allows), namespaces, none.
        #[arg(long, default_value = "auto", value_parser = ["auto", "namespaces", "none"], env = "SCENARIO_RUN_ISOLATION")]
        isolation: String,
    },
    /// What a platform supports, measured: run the probe scenarios (`compat/`) and print a
    /// table of each feature (yes, no, fails), its score, and with --json/--html the same.
    Compat {
        /// The platform probed.
        #[arg(long, value_enum, default_value = "local", env = "SCENARIO_RUN_PROVIDER")]
        provider: ProviderKind,
        /// The folder of probe scenarios.
        #[arg(long, default_value = "compat")]
        probes: String,
        /// Only probes whose name matches: words are substrings; and, or, not, ( ).
        #[arg(short = 'k', value_name = "EXPR")]
        name_expr: Option<String>,
        /// Probes in flight at once.
        #[arg(short = 'j', long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
        concurrency: u16,
        /// The table as JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<std::path::PathBuf>,
        /// The table as one self-contained HTML page.
        #[arg(long, value_name = "FILE")]
        html: Option<std::path::PathBuf>,
        /// Print each probe's steps as they finish.
        #[arg(short, long)]
        verbose: bool,
        /// More variables from a dotenv file (after ./.env; the environment still wins).
        #[arg(long = "env-file", value_name = "FILE")]
        env_files: Vec<String>,
        /// Local provider isolation: auto (namespaces when the host allows), namespaces, none.
        #[arg(long, default_value = "auto", value_parser = ["auto", "namespaces", "none"], env = "SCENARIO_RUN_ISOLATION")]
        isolation: String,
    },
    /// Serve the E2B API (control plane and envd on one port) over local sandboxes, for the
    /// unmodified E2B SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR, E2B_DOMAIN=localhost:PORT.
    /// `scenario-run serve --help` lists its flags.
    #[command(disable_help_flag = true)]
    Serve {
        /// serve's flags, parsed by the server binary this command becomes.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "FLAGS")]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand)]
enum CacheAction {
    /// List the cached builds, least recently used first (the default).
    List,
    /// Remove every cached build no run or serve holds now.
    Prune,
}

#[derive(Args, Clone)]
struct CheckArgs {
    /// Scenario files, folders (searched recursively) or globs.
    #[arg(default_value = "scenarios")]
    paths: Vec<String>,
    /// Set a variable: `--var name=value` (visible as `vars.name`).
    #[arg(long = "var", value_name = "K=V")]
    vars: Vec<String>,
}

#[derive(Args, Clone)]
struct RunArgs {
    /// Scenario files, folders (searched recursively) or globs.
    #[arg(default_value = "scenarios")]
    paths: Vec<String>,
    /// Scenarios in flight at once; also the most sandboxes alive at once.
    #[arg(short = 'j', long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..))]
    concurrency: u16,
    /// Only scenarios whose name matches: words are substrings; and, or, not, ( ).
    #[arg(short = 'k', value_name = "EXPR")]
    name_expr: Option<String>,
    /// Only scenarios whose tags satisfy the expression, e.g. 'commands and not slow'.
    #[arg(short = 't', long = "tags", value_name = "EXPR")]
    tags: Option<String>,
    /// Run only shard K of N (1-based); stable across machines.
    #[arg(long, value_name = "K/N")]
    shard: Option<Shard>,
    /// Print the selected scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Stop at the first failure or error (pytest's -x): nothing new starts, and running
    /// scenarios are stopped at once (their step interrupted, `finally` run within
    /// --grace-period, sandboxes destroyed) and reported SKIPPED with why.
    #[arg(short = 'x', long = "fail-fast", visible_alias = "exitfirst")]
    fail_fast: bool,
    /// A scenario or step that would be SKIPPED for `missing credentials [...]` is an ERROR
    /// instead (exit 4): for CI jobs whose secrets must be there. Other skips stay skips.
    #[arg(long)]
    require_credentials: bool,
    /// Any SKIPPED scenario, or step skipped for its key, fails the run (exit 1).
    #[arg(long)]
    fail_on_skip: bool,
    /// Keep the sandboxes of a FAILED or ERROR scenario (for 30m at most) and print how to
    /// reach them (`scenario-run shell ID`) and kill them. On local the run then waits until
    /// Ctrl-C, since its sandboxes die with it. An interrupted run still cleans everything.
    #[arg(long)]
    keep_on_failure: bool,
    /// Run only the scenarios that failed (FAILED or ERROR) in the last run here
    /// (.scenario-run/last-run.json); all of them if none did or there is no last run.
    #[arg(long = "lf", visible_alias = "last-failed", conflicts_with = "failed_first")]
    last_failed: bool,
    /// Run the scenarios that failed in the last run first, then the rest.
    #[arg(long = "ff", visible_alias = "failed-first")]
    failed_first: bool,
    /// Where sandboxes live.
    #[arg(long, value_enum, default_value = "local", env = "SCENARIO_RUN_PROVIDER")]
    provider: ProviderKind,
    /// When -k, -t or --shard select no scenario: fail (exit 2), warn, or pass.
    #[arg(long, value_enum, default_value = "fail", env = "SCENARIO_RUN_NO_SCENARIOS", value_name = "WHAT")]
    no_scenarios: NoScenarios,
    /// Write a JUnit XML report.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Write a JSON report (versioned schema).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write one evidence file per scenario into DIR.
    #[arg(long, value_name = "DIR")]
    evidence: Option<PathBuf>,
    /// Write a self-contained HTML report (totals, filterable scenarios with every step, a
    /// timeline of sandboxes) for CI artifacts.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Plain lines instead of the live progress view.
    #[arg(long)]
    no_progress: bool,
    /// Print each scenario's start as well as its end, every finished step, and that the
    /// provider's images were cached.
    #[arg(short, long)]
    verbose: bool,
    /// Colour: auto, always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    color: String,
    /// More variables from a dotenv file (after ./.env; the environment still wins).
    #[arg(long = "env-file", value_name = "FILE")]
    env_files: Vec<String>,
    /// Set a variable: `--var name=value` (visible as `vars.name`).
    #[arg(long = "var", value_name = "K=V")]
    vars: Vec<String>,
    /// Default per-step limit.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    step_timeout: Duration,
    /// Default per-scenario limit (a scenario's `timeout:` wins).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    scenario_timeout: Duration,
    /// Default limit for one foreground command.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    exec_timeout: Duration,
    /// Output kept of each stream of one command, and of an HTTP body (`16MiB`, `1GiB`,
    /// bytes); the rest is counted, and an assertion that fails on cut output says so.
    #[arg(long, default_value = "64MiB", env = "SCENARIO_RUN_MAX_OUTPUT", value_parser = scenario_run::size::parse)]
    max_output: usize,
    /// Lifetime of a sandbox whose `create` names no `timeout` (seconds, or `5m`): the
    /// provider destroys it by itself after this, even if this run dies.
    #[arg(long, default_value = "300", env = "E2E_SANDBOX_TTL", value_parser = parse_duration)]
    sandbox_ttl: Duration,
    /// Time for `finally` and cleanup after Ctrl-C or a scenario timeout.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    grace_period: Duration,
    /// Local provider isolation: auto (namespaces when the host allows), namespaces, none.
    #[arg(long, default_value = "auto", value_parser = ["auto", "namespaces", "none"], env = "SCENARIO_RUN_ISOLATION")]
    isolation: String,
}

fn parse_duration(s: &str) -> Result<Duration, scenario_run::duration::ParseDurationError> {
    scenario_run::duration::parse(s)
}

/// The `--env-file`s a first parse of the command line names.
fn env_files(cli: Cli) -> Vec<String> {
    match cli {
        Cli { command: None, run } => run.env_files,
        Cli { command: Some(Command::Run(run)), .. } => run.env_files,
        Cli { command: Some(Command::Cleanup { env_files, .. }), .. } => env_files,
        Cli { command: Some(Command::Shell { env_files, .. }), .. } => env_files,
        Cli { command: Some(Command::Bench { env_files, .. }), .. } => env_files,
        Cli { command: Some(Command::Compat { env_files, .. }), .. } => env_files,
        _ => Vec::new(),
    }
}

impl RunArgs {
    fn into_request(self) -> RunRequest {
        RunRequest {
            paths: self.paths,
            vars: self.vars,
            env_files: self.env_files,
            name_expr: self.name_expr,
            tags: self.tags,
            shard: self.shard,
            list: self.list,
            no_scenarios: self.no_scenarios,
            provider: self.provider,
            isolation: self.isolation,
            concurrency: usize::from(self.concurrency),
            fail_fast: self.fail_fast,
            require_credentials: self.require_credentials,
            fail_on_skip: self.fail_on_skip,
            keep_on_failure: self.keep_on_failure,
            rerun: if self.last_failed {
                Some(cli::Rerun::LastFailed)
            } else if self.failed_first {
                Some(cli::Rerun::FailedFirst)
            } else {
                None
            },
            step_timeout: self.step_timeout,
            scenario_timeout: self.scenario_timeout,
            exec_timeout: self.exec_timeout,
            max_output: self.max_output,
            sandbox_ttl: self.sandbox_ttl,
            grace_period: self.grace_period,
            reports: ReportFiles { junit: self.junit, json: self.json, evidence: self.evidence, html: self.html },
            view: View { no_progress: self.no_progress, verbose: self.verbose, color: self.color, to_stderr: false },
            record_last_run: true,
        }
    }
}

fn main() -> ExitCode {
    // Before anything starts a child: no descriptor the runner inherited reaches one.
    scenario_run::provider::local::seal_inherited_descriptors();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli: Cli = cli::parse_with_env_files(&args, env_files);
    let exit = match cli.command {
        Some(Command::Check(args)) => cli::check(&args.paths, &args.vars),
        Some(Command::Steps { kind }) => cli::steps(kind.as_deref()),
        Some(Command::Schema { out, check }) => cli::write_schema(&out, check),
        Some(Command::Run(args)) => cli::run(args.into_request()),
        Some(Command::Cleanup { provider, run_id, all_tagged, older_than, yes, env_files }) => {
            cli::cleanup(provider, run_id, all_tagged, older_than, yes, &env_files)
        }
        Some(Command::Matrix { emit, root, providers }) => cli::matrix(&emit, &root, &providers),
        Some(Command::Image { reference, username, password }) => cli::image(&reference, username, password),
        Some(Command::Serve { args }) => cli::exec_serve(&args),
        Some(Command::Cache { action }) => cli::cache(matches!(action, Some(CacheAction::Prune))),
        Some(Command::Bench { provider, template, iterations, mode, stagger, json, max_p95, env_files, isolation }) => {
            cli::bench(cli::BenchArgs {
                provider,
                isolation,
                template,
                iterations,
                mode,
                stagger,
                json,
                max_p95,
                env_files,
            })
        }
        Some(Command::Compat {
            provider,
            probes,
            name_expr,
            concurrency,
            json,
            html,
            verbose,
            env_files,
            isolation,
        }) => cli::compat(cli::CompatArgs {
            provider,
            isolation,
            probes,
            name_expr,
            concurrency: usize::from(concurrency),
            json,
            html,
            env_files,
            verbose,
        }),
        Some(Command::Shell { sandbox, provider, env_files, command }) => {
            return ExitCode::from(cli::shell(&sandbox, provider, &command, &env_files));
        }
        None => cli::run(cli.run.into_request()),
    };
    ExitCode::from(exit.code())
}

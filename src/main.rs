//! The command line: parsing, wiring, exit codes. Everything else lives in the library.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;

use scenario_run::diag::Diagnostic;
use scenario_run::mask::Masker;
use scenario_run::model::{self, LoadOptions};
use scenario_run::provider::factory::{self, local_options, prepare, ProviderKind};
use scenario_run::provider::local::LocalProvider;
use scenario_run::report::human::{HumanOptions, HumanReporter};
use scenario_run::report::{ReportFiles, Reporter};
use scenario_run::results::Event;
use scenario_run::runner::{self, RunConfig};
use scenario_run::select::{Selection, Shard};
use scenario_run::{config, errln, out, outln, schema};

const EXIT_USAGE: u8 = 2;
const EXIT_INVALID: u8 = 3;
const EXIT_INFRA: u8 = 4;
const EXIT_INTERRUPTED: u8 = 130;

/// What a run whose selection matched no scenario does (`--no-scenarios`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum NoScenarios {
    /// Exit 2 with a message: a typo in -k or -t must not pass in CI.
    Fail,
    /// Say so on stderr and run nothing (exit 0).
    Warn,
    /// Run nothing, quietly (exit 0).
    Pass,
}

#[derive(Parser)]
#[command(
    name = "scenario-run",
    version,
    about = "End-to-end scenarios for agent sandbox platforms, written as YAML data"
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
    /// Serve the E2B API (control plane and envd on one port) over local sandboxes, for the
    /// unmodified E2B SDKs: E2B_API_URL=E2B_SANDBOX_URL=http://ADDR, E2B_DOMAIN=localhost:PORT.
    Serve(scenario_run::server::ServeArgs),
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
    /// Print each scenario's start as well as its end.
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

fn parse_duration(s: &str) -> Result<Duration, String> {
    scenario_run::duration::parse(s)
}

/// Parse the command line. Flags with an `env = …` default take it, in this order: the flag,
/// the process environment, the last `--env-file` that sets it, `./.env`, the built-in
/// default (README, "Configuration and secrets"). The files are read here, not copied into
/// the process environment: a copy would count as a shell variable and beat `--env-file`.
fn parse_cli() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // A first pass only to learn the --env-file flags; a bad command line is reported by
    // the second, and a bad file by the command that reads the environment.
    let env_files = match Cli::try_parse_from(&args) {
        Ok(Cli { command: None, run }) => run.env_files,
        Ok(Cli { command: Some(Command::Run(run)), .. }) => run.env_files,
        Ok(Cli { command: Some(Command::Cleanup { env_files, .. }), .. }) => env_files,
        _ => Vec::new(),
    };
    let files = config::file_layer(Path::new(".env"), &env_files).unwrap_or_default();
    let cmd = with_file_defaults(Cli::command(), &files);
    let matches = cmd.get_matches_from(&args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Give every flag that reads a variable the files' value of it as its default, unless the
/// process environment has it (then clap's own `env` lookup wins).
fn with_file_defaults(cmd: clap::Command, files: &std::collections::BTreeMap<String, String>) -> clap::Command {
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

/// Write a command's whole output to stdout: exit 0, also when the reader has gone.
fn emit(text: &str) -> u8 {
    match out::stdout(text) {
        Ok(()) => 0,
        Err(e) => {
            errln!("error: cannot write to standard output: {e}");
            1
        }
    }
}

fn main() -> ExitCode {
    // Before anything starts a child: no descriptor the runner inherited reaches one.
    scenario_run::provider::local::seal_inherited_descriptors();
    let cli = parse_cli();
    let code = match cli.command {
        Some(Command::Check(args)) => check(args),
        Some(Command::Steps { kind }) => match schema::steps_reference(kind.as_deref()) {
            Ok(text) => emit(&text),
            Err(e) => {
                errln!("error: {e}");
                EXIT_USAGE
            }
        },
        Some(Command::Schema { out, check }) => write_schema(&out, check),
        Some(Command::Run(args)) => run(*args),
        Some(Command::Cleanup { provider, run_id, all_tagged, older_than, yes, env_files }) => {
            cleanup(provider, run_id, all_tagged, older_than, yes, &env_files)
        }
        Some(Command::Matrix { emit, root, providers }) => matrix(&emit, &root, &providers),
        Some(Command::Image { reference, username, password }) => image(&reference, username, password),
        Some(Command::Serve(args)) => serve(&args),
        None => run(cli.run),
    };
    ExitCode::from(code)
}

fn write_schema(out: &str, check: bool) -> u8 {
    let text = schema::schema_text();
    if out == "-" {
        return emit(&text);
    }
    if check {
        return match std::fs::read_to_string(out) {
            Ok(existing) if existing == text => 0,
            _ => {
                errln!("error: {out} is stale: run `scenario-run schema`");
                1
            }
        };
    }
    if let Some(dir) = Path::new(out).parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(out, text) {
        Ok(()) => {
            errln!("wrote {out}");
            0
        }
        Err(e) => {
            errln!("error: cannot write {out}: {e}");
            EXIT_USAGE
        }
    }
}

fn print_diagnostics(diags: &[Diagnostic], masker: &Masker) {
    let files: BTreeSet<&str> = diags.iter().map(|d| d.location.file.as_str()).collect();
    for d in diags {
        errln!("{}", masker.mask(&d.render()));
    }
    let n = diags.len();
    errln!(
        "error: {n} problem{} in {} file{}; nothing was run",
        if n == 1 { "" } else { "s" },
        files.len(),
        if files.len() == 1 { "" } else { "s" }
    );
}

/// Parse `--var`s, expand paths and validate. Err is the exit code.
fn load(
    paths: &[String],
    vars: &[String],
    masker: &Masker,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<(model::Loaded, serde_json::Map<String, serde_json::Value>), u8> {
    let mut cli_vars = serde_json::Map::new();
    for v in vars {
        match config::parse_var(v) {
            Ok((k, val)) => {
                cli_vars.insert(k, val);
            }
            Err(e) => {
                errln!("error: --var {e}");
                return Err(EXIT_USAGE);
            }
        }
    }
    let files = model::expand_paths(paths).map_err(|e| {
        errln!("error: {e}");
        EXIT_USAGE
    })?;
    let opts = LoadOptions {
        cli_vars: cli_vars.keys().cloned().collect(),
        today: config::today(),
        templates_dir: env.get(scenario_run::templates::TEMPLATES_DIR_ENV).cloned(),
    };
    match model::load(&files, &opts) {
        Ok(loaded) => Ok((loaded, cli_vars)),
        Err(diags) => {
            print_diagnostics(&diags, masker);
            Err(EXIT_INVALID)
        }
    }
}

fn check(args: CheckArgs) -> u8 {
    let env = config::environment(Path::new(".env"), &[]).unwrap_or_default();
    let masker = Masker::from_env(&env, &[]);
    match load(&args.paths, &args.vars, &masker, &env) {
        Ok((loaded, _)) => {
            // Not invalid, but each such scenario will fail: said here, at the date.
            for d in loaded.scenarios.iter().filter_map(|s| s.known_issue.as_ref()?.expired.as_ref()) {
                errln!("{}", masker.mask(&d.render_warning()));
            }
            outln!(
                "ok: {} ({}) in {}",
                count(loaded.scenarios.len(), "scenario"),
                count(loaded.cases.len(), "case"),
                count(loaded.files, "file")
            );
            0
        }
        Err(code) => code,
    }
}

/// `1 scenario`, `2 scenarios`.
fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// `scenario-run image REF`: the root filesystem of an image, built or pulled on first use.
fn image(reference: &str, username: Option<String>, password: Option<String>) -> u8 {
    use scenario_run::image::{ImageStore, RegistryAuth};
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let store = ImageStore::from_vars(&env);
    let auth = match (username, password) {
        (Some(username), Some(password)) => Some(RegistryAuth { username, password }),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    rt.block_on(async move {
        let (log, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
        let printer = tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                errln!("{line}");
            }
        });
        let got = store.get(reference, auth.as_ref(), &log).await;
        drop(log);
        let _ = printer.await;
        match got {
            Ok(rootfs) => {
                outln!("{}", rootfs.dir.display());
                errln!("{} ({}, {})", rootfs.reference, rootfs.resolved, rootfs.digest);
                0
            }
            Err(e) => {
                errln!("error: {e}");
                EXIT_INFRA
            }
        }
    })
}

fn cleanup(
    provider: ProviderKind,
    run_id: Option<String>,
    all_tagged: bool,
    older_than: Option<Duration>,
    yes: bool,
    env_files: &[String],
) -> u8 {
    use scenario_run::janitor;
    let env = match config::environment(Path::new(".env"), env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let run_id = run_id.filter(|r| !r.is_empty());
    if run_id.is_none() && !all_tagged {
        errln!("error: say which sandboxes: --run-id ID (or E2E_RUN_ID), or --all-tagged");
        return EXIT_USAGE;
    }
    let masker = Masker::from_env(&env, &[]);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    rt.block_on(async move {
        let p = match factory::make(provider, "auto", &env) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: {e}");
                return EXIT_INFRA;
            }
        };
        let missing = p.required_credentials();
        if !missing.is_empty() {
            errln!("error: missing credentials [{}]", missing.join(", "));
            return EXIT_INFRA;
        }
        if p.name() == "local" {
            outln!("local sandboxes die with the run that made them (even on SIGKILL): nothing to clean up");
            return 0;
        }
        let sel = janitor::Selection { run_id, all_tagged, older_than };
        match janitor::clean(p.as_ref(), &sel, yes, &masker, runner::now_ms() / 1000).await {
            Ok(()) => 0,
            Err(()) => EXIT_INFRA,
        }
    })
}

/// The CI matrix: one entry per folder under `root` that holds scenario files.
fn matrix(emit: &str, root: &str, providers: &[String]) -> u8 {
    let folders = match model::areas::folders(root) {
        Ok(f) => f,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    if emit == "lines" {
        let text: String = folders.iter().map(|f| format!("{f}\n")).collect();
        self::emit(&text)
    } else {
        self::emit(&format!("{}\n", model::areas::github_matrix(&folders, providers)))
    }
}

fn run(args: RunArgs) -> u8 {
    runner::arm_early_signals();
    let env = match config::environment(Path::new(".env"), &args.env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let base_masker = Masker::from_env(&env, &[]);
    let (loaded, cli_vars) = match load(&args.paths, &args.vars, &base_masker, &env) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let secret_names: Vec<String> = loaded.scenarios.iter().flat_map(|s| s.secrets.iter().cloned()).collect();
    let masker = Arc::new(Masker::from_env(&env, &secret_names));
    // A panic is reported as the scenario's ERROR (with its message, masked); what the default
    // hook would print on stderr could hold a secret, so it goes through the masker too.
    let hook_masker = masker.clone();
    std::panic::set_hook(Box::new(move |info| {
        errln!("scenario-run: internal error: {}", hook_masker.mask(&info.to_string()));
    }));
    let loaded_cases = loaded.cases.len();
    let selection = match Selection::new(args.name_expr.as_deref(), args.tags.as_deref(), args.shard) {
        Ok(s) => s,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let cases = selection.apply(loaded.cases);
    // `--list` answers as the run would: a selection a run refuses is refused when listed too,
    // so a CI step that lists before it runs fails at the same typo.
    if cases.is_empty() {
        let what = format!("no scenario matches {} (of {loaded_cases} loaded)", selection.describe());
        match args.no_scenarios {
            NoScenarios::Fail => {
                errln!("error: {what}; nothing was {}\n  = help: check the expression for a typo, or pass --no-scenarios=pass (or warn) if an empty selection is expected", if args.list { "listed" } else { "run" });
                return EXIT_USAGE;
            }
            NoScenarios::Warn => errln!("warning: {what}"),
            NoScenarios::Pass => {}
        }
    }
    if args.list {
        let mut text = String::new();
        for c in &cases {
            let tags =
                if c.scenario.tags.is_empty() { String::new() } else { format!("  [{}]", c.scenario.tags.join(", ")) };
            text.push_str(&format!("{}  {}{tags}\n", c.name, c.scenario.location));
        }
        let code = emit(&text);
        errln!("{} selected", count(cases.len(), "scenario"));
        return code;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    rt.block_on(async move {
        let signals = runner::Signals::install();
        let provider = match factory::make(args.provider, &args.isolation, &env) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: {e}");
                return EXIT_INFRA;
            }
        };
        // What `provider.env` hands to host-side clients is masked as well, including a key
        // the provider holds under another name than the shell's (alicloud's E2B_API_KEY).
        let masker = {
            let mut all = env.clone();
            for (k, v) in provider.client_env() {
                all.insert(format!("SCENARIO_RUN_PROVIDER_ENV_{k}"), v);
            }
            Arc::new(Masker::from_env(&all, &secret_names))
        };
        // In GitHub Actions: annotations and the job summary after the run.
        let github = scenario_run::report::github::in_actions(&env).then(|| scenario_run::report::github::GithubOut {
            step_summary: env.get("GITHUB_STEP_SUMMARY").filter(|p| !p.is_empty()).map(PathBuf::from),
            workspace: env.get("GITHUB_WORKSPACE").cloned(),
        });
        let cfg = Arc::new(RunConfig {
            provider: provider.clone(),
            concurrency: args.concurrency as usize,
            fail_fast: args.fail_fast,
            require_credentials: args.require_credentials,
            fail_on_skip: args.fail_on_skip,
            run_id: config::run_id(&env),
            env,
            cli_vars,
            masker: masker.clone(),
            step_timeout: args.step_timeout,
            scenario_timeout: args.scenario_timeout,
            exec_timeout: args.exec_timeout,
            max_output: args.max_output,
            sandbox_ttl: args.sandbox_ttl,
            grace: args.grace_period,
        });
        let tty = std::io::stdout().is_terminal();
        let color = match args.color.as_str() {
            "always" => true,
            "never" => false,
            _ => tty && std::env::var_os("NO_COLOR").is_none(),
        };
        let mut reporter = HumanReporter::new(
            HumanOptions {
                progress: tty && !args.no_progress,
                color,
                verbose: args.verbose,
                width: out::terminal_width(),
            },
            Box::new(std::io::stdout()),
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let cancel = CancellationToken::new();
        runner::spawn_signal_handler(signals, cancel.clone(), provider.clone(), tx.clone(), cfg.run_id.clone());
        let printer = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                reporter.handle(&ev);
                if matches!(ev, Event::RunFinished { .. }) {
                    break;
                }
            }
        });
        if !cases.is_empty() {
            match prepare(provider.as_ref(), &cancel).await {
                Ok(()) => {}
                Err(e) => {
                    errln!("error: {e}");
                    return if cancel.is_cancelled() { EXIT_INTERRUPTED } else { EXIT_INFRA };
                }
            }
        }
        let summary = runner::run(cfg, cases, tx, cancel).await;
        let mut code = summary.exit_code as u8;
        if printer.await.is_err() {
            // The terminal view panicked (the hook printed why): the run is not good, and its
            // summary is still shown, plainly.
            errln!("error: the terminal view failed (a bug in scenario-run); the summary follows without it");
            let _ = out::stdout(&format!(
                "\n{}",
                masker.mask(&scenario_run::report::summary::render_summary(&summary, Default::default()))
            ));
            if code == 0 {
                code = EXIT_INFRA;
            }
        }
        let files = ReportFiles {
            junit: args.junit.clone(),
            json: args.json.clone(),
            evidence: args.evidence.clone(),
            html: args.html.clone(),
        };
        if let Err(e) = files.write(&summary, &masker) {
            errln!("error: {e}");
            if code == 0 {
                code = EXIT_INFRA;
            }
        }
        if let Some(gh) = github {
            // The job summary is a report like the others: one that cannot be written fails.
            if let Err(e) = gh.write(&summary, &masker) {
                errln!("error: {e}");
                if code == 0 {
                    code = EXIT_INFRA;
                }
            }
        }
        code
    })
}

/// `serve`: the E2B-compatible server over the local provider until SIGINT, SIGTERM, SIGHUP
/// or SIGQUIT, then
/// every sandbox it made is destroyed.
fn serve(args: &scenario_run::server::ServeArgs) -> u8 {
    use std::io::Write;
    use tokio::signal::unix::{signal, SignalKind};
    let mut opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            errln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let (listen, isolation) = (args.listen, args.isolation.as_str());
    let ca_dir_given = args.ca_dir.is_some();
    let ca_dir = args.ca_dir.clone().unwrap_or_else(scenario_run::server::tls::default_ca_dir);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    rt.block_on(async move {
        let isolation = factory::isolation(isolation);
        let env = config::environment(Path::new(".env"), &[]).unwrap_or_default();
        let provider = match LocalProvider::new(local_options(isolation, &env)) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: local provider: {e}");
                return EXIT_INFRA;
            }
        };
        if let Some(w) = provider.warning() {
            errln!("warning: {w}");
        }
        // Build `base` before listening, so no client's first create waits a minute on it.
        if let Err(e) = prepare(&provider, &CancellationToken::new()).await {
            errln!("error: {e}");
            return EXIT_INFRA;
        }
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                errln!("error: cannot listen on {listen}: {e}");
                return EXIT_USAGE;
            }
        };
        let (Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut quit)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            signal(SignalKind::quit()),
        ) else {
            errln!("error: cannot install signal handlers");
            return EXIT_INFRA;
        };
        let addr = listener.local_addr().unwrap_or(listen);
        let certs = scenario_run::server::tls::Ca::load_or_create(&ca_dir)
            .and_then(|ca| scenario_run::server::tls::Certs::new(ca, addr));
        let certs = match certs {
            Ok(c) => Some(Arc::new(c)),
            // Asked for by name: that directory or nothing.
            Err(e) if ca_dir_given => {
                errln!("error: serve's certificate authority in {}: {e}", ca_dir.display());
                return EXIT_INFRA;
            }
            Err(e) => {
                errln!("warning: no https (serve's certificate authority in {}: {e}); name another with --ca-dir", ca_dir.display());
                None
            }
        };
        outln!("listening on http://{addr}");
        match &certs {
            Some(c) => {
                outln!(
                    "https on the same port; ca certificate: {} ({}; trust it with SSL_CERT_FILE or REQUESTS_CA_BUNDLE (Python), NODE_EXTRA_CA_CERTS (Node))",
                    c.ca_path().display(),
                    if c.ca_created() { "made now" } else { "kept from before" }
                );
            }
            None => {
                outln!("no https");
            }
        }
        opts.tls = certs;
        let _ = std::io::stdout().flush();
        let shutdown = async move {
            // A closed terminal (SIGHUP) or SIGQUIT stops serve as SIGTERM does: every sandbox
            // it made is destroyed.
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
                _ = quit.recv() => {}
            }
        };
        match scenario_run::server::serve(listener, Arc::new(provider), opts, shutdown).await {
            Ok(n) => {
                errln!("serve: stopped; destroyed {n} sandbox{}", if n == 1 { "" } else { "es" });
                0
            }
            Err(e) => {
                errln!("error: serve: {e}");
                EXIT_INFRA
            }
        }
    })
}

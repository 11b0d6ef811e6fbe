//! `run` and `check`: load and validate the scenarios, select them, and (for a run) start the
//! provider, the terminal view and the signal handler, run, and write the reports.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::keep;
use super::last_run::{self, Rerun};
use super::wiring::{block_on, count, emit, make_provider};
use crate::diag::Diagnostic;
use crate::exit::Exit;
use crate::mask::Masker;
use crate::model::{self, LoadOptions};
use crate::provider::factory::{prepare, ProviderKind, SetupError};
use crate::report::github::{self, GithubOut};
use crate::report::human::{HumanOptions, HumanReporter};
use crate::report::{ReportFiles, Reporter};
use crate::results::Event;
use crate::runner::{self, RunConfig};
use crate::select::{Selection, Shard};
use crate::{config, errln, out, outln};

/// What a run whose selection matched no scenario does (`--no-scenarios`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NoScenarios {
    /// Exit 2 with a message: a typo in -k or -t must not pass in CI.
    Fail,
    /// Say so on stderr and run nothing (exit 0).
    Warn,
    /// Run nothing, quietly (exit 0).
    Pass,
}

/// How the run shows itself in the terminal.
pub struct View {
    /// `--no-progress`: plain lines instead of the live view.
    pub no_progress: bool,
    pub verbose: bool,
    /// `auto`, `always` or `never`.
    pub color: String,
    /// The view on stderr, so stdout carries only what the command makes of the run
    /// (`compat`'s table).
    pub to_stderr: bool,
}

/// What `scenario-run run` was asked to do: its flags, parsed.
pub struct RunRequest {
    pub paths: Vec<String>,
    pub vars: Vec<String>,
    pub env_files: Vec<String>,
    pub name_expr: Option<String>,
    pub tags: Option<String>,
    pub shard: Option<Shard>,
    /// Print the selection instead of running it.
    pub list: bool,
    pub no_scenarios: NoScenarios,
    pub provider: ProviderKind,
    pub isolation: String,
    pub concurrency: usize,
    pub fail_fast: bool,
    pub require_credentials: bool,
    pub fail_on_skip: bool,
    /// `--keep-on-failure`: keep a failing scenario's sandboxes, say how to reach them.
    pub keep_on_failure: bool,
    /// `--lf` / `--ff`: the last run's failures only, or first.
    pub rerun: Option<Rerun>,
    pub step_timeout: Duration,
    pub scenario_timeout: Duration,
    pub exec_timeout: Duration,
    pub max_output: usize,
    pub sandbox_ttl: Duration,
    pub grace_period: Duration,
    pub reports: ReportFiles,
    pub view: View,
    /// Record the run for `--lf`/`--ff` (a `compat` run of probes is not the last run).
    pub record_last_run: bool,
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

/// Parse `--var`s, expand paths and validate. Err is the exit.
fn load(
    paths: &[String],
    vars: &[String],
    masker: &Masker,
    env: &BTreeMap<String, String>,
) -> Result<(model::Loaded, serde_json::Map<String, serde_json::Value>), Exit> {
    let mut cli_vars = serde_json::Map::new();
    for v in vars {
        match config::parse_var(v) {
            Ok((k, val)) => {
                cli_vars.insert(k, val);
            }
            Err(e) => {
                errln!("error: --var {e}");
                return Err(Exit::Usage);
            }
        }
    }
    let found = model::expand(paths).map_err(|e| {
        errln!("error: {e}");
        Exit::Usage
    })?;
    let opts = LoadOptions {
        cli_vars: cli_vars.keys().cloned().collect(),
        today: config::today(),
        templates_dir: env.get(crate::templates::TEMPLATES_DIR_ENV).cloned(),
    };
    match model::load_found(&found, &opts) {
        Ok(loaded) => {
            for note in &loaded.passed_over {
                errln!("note: passed over {note}");
            }
            Ok((loaded, cli_vars))
        }
        Err(diags) => {
            print_diagnostics(&diags, masker);
            Err(Exit::Invalid)
        }
    }
}

/// `check`: validate without running anything.
pub fn check(paths: &[String], vars: &[String]) -> Exit {
    let env = config::environment(Path::new(".env"), &[]).unwrap_or_default();
    let masker = Masker::from_env(&env, &[]);
    match load(paths, vars, &masker, &env) {
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
            Exit::Ok
        }
        Err(exit) => exit,
    }
}

/// `run`: load, select, run and report.
pub fn run(req: RunRequest) -> Exit {
    // From the first line: a Ctrl-C while scenarios load or the provider starts is kept for
    // the signal handler (tests/interrupt_storm.rs).
    runner::arm_early_signals();
    let env = match config::environment(Path::new(".env"), &req.env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    let base_masker = Masker::from_env(&env, &[]);
    let (loaded, cli_vars) = match load(&req.paths, &req.vars, &base_masker, &env) {
        Ok(l) => l,
        Err(exit) => return exit,
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
    let selection = match Selection::new(req.name_expr.as_deref(), req.tags.as_deref(), req.shard) {
        Ok(s) => s,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    let unknown_tags = selection.unknown_tags(&loaded.cases);
    let mut cases = selection.apply(loaded.cases);
    let last_run = last_run::path(&env);
    if let Some(rerun) = req.rerun.filter(|_| !cases.is_empty()) {
        let (picked, note) = last_run::apply(rerun, cases, &last_run);
        cases = picked;
        errln!("{note}");
    }
    // `--list` answers as the run would: a selection a run refuses is refused when listed too,
    // so a CI step that lists before it runs fails at the same typo.
    if cases.is_empty() {
        let what = format!("no scenario matches {} (of {loaded_cases} loaded)", selection.describe());
        let help = if unknown_tags.is_empty() {
            "check the expression for a typo".to_string()
        } else {
            unknown_tags.join("; ")
        };
        match req.no_scenarios {
            NoScenarios::Fail => {
                errln!("error: {what}; nothing was {}\n  = help: {help}, or pass --no-scenarios=pass (or warn) if an empty selection is expected", if req.list { "listed" } else { "run" });
                return Exit::Usage;
            }
            NoScenarios::Warn => errln!("warning: {what}"),
            NoScenarios::Pass => {}
        }
    } else {
        for t in &unknown_tags {
            errln!("warning: -t: {t}");
        }
    }
    if req.list {
        let mut text = String::new();
        for c in &cases {
            let tags =
                if c.scenario.tags.is_empty() { String::new() } else { format!("  [{}]", c.scenario.tags.join(", ")) };
            text.push_str(&format!("{}  {}{tags}\n", c.name, c.scenario.location));
        }
        let exit = emit(&text);
        errln!("{} selected", count(cases.len(), "scenario"));
        return exit;
    }
    block_on(async move {
        let signals = runner::Signals::install();
        let provider = match make_provider(req.provider, &req.isolation, &env) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: {e}");
                return Exit::Infra;
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
        let github = github::in_actions(&env).then(|| GithubOut {
            step_summary: env.get("GITHUB_STEP_SUMMARY").filter(|p| !p.is_empty()).map(PathBuf::from),
            workspace: env.get("GITHUB_WORKSPACE").cloned(),
        });
        let cfg = Arc::new(RunConfig {
            provider: provider.clone(),
            concurrency: req.concurrency,
            fail_fast: req.fail_fast,
            require_credentials: req.require_credentials,
            fail_on_skip: req.fail_on_skip,
            keep_on_failure: req.keep_on_failure,
            run_id: config::run_id(&env),
            env: env.clone(),
            cli_vars,
            masker: masker.clone(),
            step_timeout: req.step_timeout,
            scenario_timeout: req.scenario_timeout,
            exec_timeout: req.exec_timeout,
            max_output: req.max_output,
            sandbox_ttl: req.sandbox_ttl,
            grace: req.grace_period,
        });
        let tty = if req.view.to_stderr { std::io::stderr().is_terminal() } else { std::io::stdout().is_terminal() };
        let color = match req.view.color.as_str() {
            "always" => true,
            "never" => false,
            _ => tty && std::env::var_os("NO_COLOR").is_none(),
        };
        let mut reporter = HumanReporter::new(
            HumanOptions {
                progress: tty && !req.view.no_progress,
                color,
                verbose: req.view.verbose,
                width: out::terminal_width(),
            },
            if req.view.to_stderr { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) },
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
        let cancel = CancellationToken::new();
        runner::spawn_signal_handler(signals, cancel.clone(), provider.clone(), tx.clone(), cfg.run_id.clone());
        // Under `--keep-on-failure` the sandboxes kept outlive the run's own teardown.
        let interrupt = cancel.clone();
        let printer = tokio::spawn(async move {
            while let Some(ev) = rx.recv().await {
                reporter.handle(&ev);
                if matches!(ev, Event::RunFinished { .. }) {
                    break;
                }
            }
        });
        if !cases.is_empty() {
            match prepare(provider.as_ref(), &cancel, req.view.verbose).await {
                Ok(()) => {}
                Err(e) => {
                    errln!("error: {e}");
                    // A preparation cut short by the Ctrl-C may fail before it sees the token.
                    return match e {
                        SetupError::Interrupted => Exit::Interrupted,
                        _ if cancel.is_cancelled() => Exit::Interrupted,
                        _ => Exit::Infra,
                    };
                }
            }
        }
        let summary = runner::run(cfg, cases, tx, cancel).await;
        let mut exit = Exit::from_code(summary.exit_code);
        if printer.await.is_err() {
            // The terminal view panicked (the hook printed why): the run is not good, and its
            // summary is still shown, plainly.
            errln!("error: the terminal view failed (a bug in scenario-run); the summary follows without it");
            let _ = out::stdout(&format!(
                "\n{}",
                masker.mask(&crate::report::summary::render_summary(&summary, Default::default()))
            ));
            if exit == Exit::Ok {
                exit = Exit::Infra;
            }
        }
        if let Err(e) = req.reports.write(&summary, &masker) {
            errln!("error: {e}");
            if exit == Exit::Ok {
                exit = Exit::Infra;
            }
        }
        if req.record_last_run && !summary.results.is_empty() {
            if let Err(e) = last_run::record(&summary, &last_run) {
                errln!("warning: cannot record this run for --lf/--ff in {}: {e}", last_run.display());
            }
        }
        if let Some(gh) = github {
            // The job summary is a report like the others: one that cannot be written fails.
            if let Err(e) = gh.write(&summary, &masker) {
                errln!("error: {e}");
                if exit == Exit::Ok {
                    exit = Exit::Infra;
                }
            }
        }
        keep::after_run(provider.clone(), req.provider, &summary, &env, &req.isolation, &masker, interrupt).await;
        exit
    })
}

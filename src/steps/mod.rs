//! Step kinds: how each runs ([`registry`]: the model's table of kinds, each with its function)
//! and one file per family of steps.
//!
//! A step function receives its arguments rendered (`{{ }}` expressions expanded) and converted by its
//! registry fields ([`args::Args`]: a value of the wrong type never reaches it) and the
//! scenario's [`StepCtx`]; it returns its outputs, or a [`StepError`] that is data: a failed
//! expectation or a broken provider, never a panic.

pub mod asserts;
pub mod build;
pub mod code;
pub mod exec;
pub mod files;
pub mod host;
pub mod http;
pub mod lifecycle;
pub mod misc;
pub mod pty;
pub mod registry;
pub mod scripted;
pub mod scripted_model;
pub mod watch;

/// The typed arguments of a step ([`crate::model::args`]), as the step functions read them.
pub use crate::model::args;

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value as JsonValue};

use crate::matcher::MatchFailure;
use crate::provider::{ErrorKind, Provider, ProviderError};
use crate::results::Mismatch;

pub use crate::model::kinds::{FieldType, StepKind, REGISTRY};

/// Failed (an expectation did not hold) or Error (the step could not be carried out); Skip
/// is the `skip` step's: the scenario cannot run here, for the reason given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Fail,
    Error,
    Skip,
}

#[derive(Debug, Clone)]
pub struct StepError {
    pub severity: Severity,
    pub message: String,
    pub mismatch: Option<Box<Mismatch>>,
    /// Outputs gathered before the failure (e.g. the HTTP response that did not match).
    pub outputs: Option<Box<JsonValue>>,
    /// The step refused its own arguments (or what the scenario gave it) before it did
    /// anything: the operation never ran, so `expect_error` cannot be met by this error.
    pub bad_args: bool,
    /// The streams of the command an assertion checked (`stdout`, `stderr`: those worth
    /// showing), so its failure shows what that command printed (see `results::Captured`).
    pub shown: Option<Box<JsonValue>>,
    /// What went wrong, where it is known: the provider's kind of error, or `Timeout` when a
    /// limit stopped the step (its command's `timeout`, the step's, the interpreter's
    /// client). `expect_error` takes an ordinary failure by default, never a timeout or an
    /// ERROR of the platform unless the scenario names that kind.
    pub kind: Option<ErrorKind>,
}

impl StepError {
    pub fn fail(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Fail,
            message: message.into(),
            mismatch: None,
            outputs: None,
            bad_args: false,
            shown: None,
            kind: None,
        }
    }
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            severity: Severity::Error,
            message: message.into(),
            mismatch: None,
            outputs: None,
            bad_args: false,
            shown: None,
            kind: None,
        }
    }
    /// The step's arguments are wrong (a value of the wrong type, fields that contradict each
    /// other, nothing to act on): an ERROR that `expect_error` does not take for the
    /// operation's failure.
    pub fn bad_args(message: impl Into<String>) -> Self {
        Self { bad_args: true, ..Self::error(message) }
    }
    /// The scenario is SKIPPED with this reason (the `skip` step).
    pub fn skip(reason: impl Into<String>) -> Self {
        Self {
            severity: Severity::Skip,
            message: reason.into(),
            mismatch: None,
            outputs: None,
            bad_args: false,
            shown: None,
            kind: None,
        }
    }
    /// A limit stopped the step: a failure of kind `Timeout`.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self { kind: Some(ErrorKind::Timeout), ..Self::fail(message) }
    }
    /// This kind of error (an unreachable service, a broken protocol: `Infra`).
    pub fn of_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = Some(kind);
        self
    }
    pub fn with_outputs(mut self, outputs: JsonValue) -> Self {
        self.outputs = Some(Box::new(outputs));
        self
    }
    /// Show these streams (`{ stdout, stderr }`, or one of them) under the failure.
    pub fn showing(mut self, streams: JsonValue) -> Self {
        self.shown = Some(Box::new(streams));
        self
    }
}

impl From<MatchFailure> for StepError {
    fn from(f: MatchFailure) -> Self {
        Self {
            severity: Severity::Fail,
            message: f.message,
            mismatch: f.mismatch.map(Box::new),
            outputs: None,
            bad_args: false,
            shown: None,
            kind: None,
        }
    }
}

impl From<ProviderError> for StepError {
    fn from(e: ProviderError) -> Self {
        let severity = match e.kind {
            ErrorKind::NotFound | ErrorKind::Invalid | ErrorKind::Timeout => Severity::Fail,
            ErrorKind::Auth | ErrorKind::Infra | ErrorKind::Unsupported | ErrorKind::Capacity => Severity::Error,
        };
        let message = if e.kind == ErrorKind::Auth && !e.message.contains("authentication failed") {
            format!("authentication failed: {}", e.message)
        } else {
            e.message
        };
        Self { severity, message, mismatch: None, outputs: None, bad_args: false, shown: None, kind: Some(e.kind) }
    }
}

pub type StepResult = Result<JsonValue, StepError>;

/// A sandbox the scenario created or connected to: the runner's handle on it (alias,
/// whether it is kept or already killed, port URLs); expressions see it as a `SandboxView`.
#[derive(Debug, Clone)]
pub struct SandboxRef {
    pub alias: Option<String>,
    pub id: String,
    pub template: String,
    /// `create { keep: true }`: not destroyed at the end.
    pub keep: bool,
    /// Killed by a `kill` step already.
    pub killed: bool,
    /// Port URLs resolved so far.
    pub urls: HashMap<u16, String>,
    /// `run-code` contexts made in it: the scenario's name -> the interpreter's context id.
    pub code_contexts: HashMap<String, String>,
}

/// A snapshot a `snapshot` step made: deleted when the scenario ends (after its sandboxes)
/// unless `keep`.
#[derive(Debug, Clone)]
pub struct SnapshotRef {
    /// What the provider returned: what `create { template: }` takes.
    pub id: String,
    pub keep: bool,
}

/// A directory watch a `watch` step started; it stops when the scenario ends.
pub struct WatchRef {
    pub name: String,
    /// The sandbox and the directory watched, for messages.
    pub sandbox: String,
    pub path: String,
    pub watch: Box<dyn crate::provider::DirWatch>,
}

/// Per-scenario state the steps read and change.
pub struct StepCtx {
    pub provider: Arc<dyn Provider>,
    pub http: reqwest::Client,
    pub sandboxes: Vec<SandboxRef>,
    /// The sandbox a step uses by default: the most recently created.
    pub current: Option<usize>,
    /// The sandbox chosen for the running step (its `sandbox:` key, else `current`).
    pub target: Option<usize>,
    /// Outputs of the most recent `exec`/`run-code`/`wait`, for `assert-stdout` and friends.
    pub last_exec: Option<JsonValue>,
    /// `steps.<id>` outputs.
    pub outputs: BTreeMap<String, JsonValue>,
    /// `vars`, including those bound by `set`.
    pub vars: serde_json::Map<String, JsonValue>,
    /// The run's metadata tag (`e2e`, run id).
    pub run_tag: (String, String),
    /// Folder of the scenario file, for `write-file { from: }`.
    pub scenario_dir: PathBuf,
    /// Default limit for a foreground command.
    pub exec_timeout: Duration,
    /// Bytes kept of each stream of one command.
    pub max_output: usize,
    /// Lifetime of a sandbox whose `create` names no `timeout`.
    pub sandbox_ttl: Duration,
    /// The template context as of this step, for expression steps (`assert`).
    pub expr_ctx: minijinja::Value,
    /// The step's main argument as written (before rendering), for messages.
    pub current_source: Option<String>,
    /// The step is polled (`eventually`): one attempt should give up soon and let the next
    /// one try, rather than spend the whole window on one stuck request.
    pub polling: bool,
    /// Services the scenario started (scripted model endpoints); they stop when it ends.
    pub services: Vec<Arc<scripted_model::ScriptedModel>>,
    /// Snapshots the scenario made.
    pub snapshots: Vec<SnapshotRef>,
    /// Directory watches the scenario started, by name.
    pub watches: Vec<WatchRef>,
    /// The run's environment (files and process), for the settings steps read:
    /// `SCENARIO_RUN_KEEP_BUILDS`, `SCENARIO_RUN_TEMPLATES_DIR`.
    pub env: Arc<BTreeMap<String, String>>,
    /// Where a long step reports what it is doing (a build's log lines), for the live view;
    /// the runner masks them and turns them into `Event::StepProgress`.
    pub progress: Option<Progress>,
    /// What bounds the running attempt (see [`StepLimit`]); `None` outside the runner.
    pub step_limit: Option<StepLimit>,
    /// The templates this scenario deployed, by name: their ids, which `create` sends for the
    /// name (one way to name a template, whatever the provider calls it).
    pub deployed: BTreeMap<String, String>,
}

/// What bounds the running attempt of a step, set by the runner: a command step gives its
/// command no more than this, so the command is stopped by its own timeout (keeping what it
/// printed) rather than abandoned, and the message names the setting that bounded it.
#[derive(Debug, Clone, Copy)]
pub struct StepLimit {
    pub limit: Duration,
    /// The setting it comes from: [`STEP_TIMEOUT`], [`STEP_TIMEOUT_FLAG`] or [`WINDOW`].
    pub setting: &'static str,
}

/// The step's `timeout:` (beside its kind).
pub const STEP_TIMEOUT: &str = "the step's `timeout:`";
/// `--step-timeout`, the default of a step without `timeout:`.
pub const STEP_TIMEOUT_FLAG: &str = "--step-timeout";
/// What was left of an `eventually` window for its last attempt.
pub const WINDOW: &str = "what was left of `eventually`'s window";

/// A sink for a running step's progress lines.
pub type Progress = Arc<dyn Fn(&str) + Send + Sync>;

impl StepCtx {
    /// A scenario's context before its first step: no sandbox, outputs, services, snapshots or
    /// watches yet, no vars or environment, the scenario folder `.`; the limits are the run
    /// flags' defaults (`--exec-timeout 60s`, `--max-output`, `--sandbox-ttl 300s`). The
    /// runner sets what its flags and the scenario give with struct-update syntax.
    pub fn new(provider: Arc<dyn Provider>, http: reqwest::Client, run_id: String) -> Self {
        StepCtx {
            provider,
            http,
            sandboxes: Vec::new(),
            current: None,
            target: None,
            last_exec: None,
            outputs: BTreeMap::new(),
            vars: serde_json::Map::new(),
            run_tag: ("e2e".into(), run_id),
            scenario_dir: PathBuf::from("."),
            exec_timeout: Duration::from_secs(60),
            max_output: crate::provider::MAX_OUTPUT,
            sandbox_ttl: Duration::from_secs(300),
            expr_ctx: minijinja::Value::UNDEFINED,
            current_source: None,
            polling: false,
            services: Vec::new(),
            snapshots: Vec::new(),
            watches: Vec::new(),
            env: Default::default(),
            progress: None,
            step_limit: None,
            deployed: BTreeMap::new(),
        }
    }

    /// The sandbox this step works on, or a clear error if there is none.
    pub fn sandbox(&self) -> Result<&SandboxRef, StepError> {
        let i = self.target.ok_or_else(|| StepError::bad_args("no sandbox: add a `create` step first"))?;
        Ok(&self.sandboxes[i])
    }

    pub fn sandbox_id(&self) -> Result<String, StepError> {
        Ok(self.sandbox()?.id.clone())
    }
}

pub use crate::model::text;

/// Bytes as a string for outputs: UTF-8 when valid, lossy otherwise.
pub fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The note a failing check on cut output gets: what was kept and dropped of `what`.
pub(crate) fn cut_note(what: &str, kept: usize, dropped: u64) -> String {
    format!(
        " ({what} was cut: its first {} were kept and {} more dropped; raise --max-output)",
        crate::size::human(kept as u64),
        crate::size::human(dropped)
    )
}

pub fn exec_outputs(r: &crate::provider::ExecResult, duration: Duration) -> JsonValue {
    json!({
        "stdout": lossy(&r.stdout),
        "stderr": lossy(&r.stderr),
        "exit_code": r.exit_code,
        "signal": r.signal,
        "timed_out": r.timed_out,
        "pid": r.pid,
        "duration_ms": duration.as_millis() as u64,
        "stdout_dropped": r.stdout_dropped,
        "stderr_dropped": r.stderr_dropped,
    })
}

//! The result model: what a run found, step by step and scenario by scenario, and the events
//! that carry it from the runner to the reporters.
//!
//! It sits below the steps, the matcher, the runner and the reporters, so each of them imports
//! it and none of them imports another's module for a result type. Workers never print: the
//! runner turns what happens into [`Event`]s, already masked (no secret value reaches this
//! type), and the reporters (`crate::report`) render them. The final [`RunSummary`] is also what
//! the JUnit, JSON and evidence writers read.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::diag::Location;
use crate::stats::ProviderStats;

/// How a scenario ended (§5 of the language).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Passed,
    Failed,
    Error,
    Skipped,
    Xfail,
    Xpass,
}

impl Outcome {
    pub const ALL: [Outcome; 6] =
        [Outcome::Passed, Outcome::Failed, Outcome::Error, Outcome::Skipped, Outcome::Xfail, Outcome::Xpass];

    /// The name in the JSON report and the HTML classes: `passed`, `xfail`, ...
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Failed => "failed",
            Outcome::Error => "error",
            Outcome::Skipped => "skipped",
            Outcome::Xfail => "xfail",
            Outcome::Xpass => "xpass",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Passed => "PASSED",
            Outcome::Failed => "FAILED",
            Outcome::Error => "ERROR",
            Outcome::Skipped => "SKIPPED",
            Outcome::Xfail => "XFAIL",
            Outcome::Xpass => "XPASS",
        }
    }

    /// Order of attention in summaries: what needs looking at first sorts first.
    pub fn attention_rank(self) -> u8 {
        match self {
            Outcome::Failed => 0,
            Outcome::Error => 1,
            Outcome::Xpass => 2,
            Outcome::Xfail => 3,
            Outcome::Skipped => 4,
            Outcome::Passed => 5,
        }
    }
}

/// Which list of the scenario a step came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Setup,
    Steps,
    Finally,
    /// Work the runner does itself: destroying sandboxes at the end.
    Cleanup,
}

impl Phase {
    /// The name in the JSON report (`setup`, `steps`, `finally`, `cleanup`).
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Steps => "steps",
            Phase::Finally => "finally",
            Phase::Cleanup => "cleanup",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    Passed,
    /// An assertion or expectation did not hold.
    Failed,
    /// Infrastructure broke, or the step could not be carried out.
    Error,
    /// `if:` was false, or an earlier failure stopped the scenario.
    Skipped,
}

impl StepStatus {
    /// The name in the JSON report (`passed`, `failed`, `error`, `skipped`).
    pub fn name(self) -> &'static str {
        match self {
            StepStatus::Passed => "passed",
            StepStatus::Failed => "failed",
            StepStatus::Error => "error",
            StepStatus::Skipped => "skipped",
        }
    }
}

/// Expected vs found for a failed comparison; reporters show a diff when either is multi-line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Mismatch {
    pub expected: String,
    /// What was found (`actual` in the JSON schema, version 1).
    pub actual: String,
    /// A pointed hint when the two differ only in a way that is hard to see: a trailing
    /// newline, line endings, letter case or whitespace (see `matcher::difference`).
    pub hint: Option<String>,
}

impl Mismatch {
    pub fn new(expected: impl Into<String>, actual: impl Into<String>) -> Self {
        Mismatch { expected: expected.into(), actual: actual.into(), hint: None }
    }

    pub fn with_hint(mut self, hint: Option<String>) -> Self {
        self.hint = hint;
        self
    }
}

/// Everything known about one executed (or skipped) step.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub index: usize,
    pub phase: Phase,
    /// Step kind, e.g. `exec`.
    pub kind: String,
    /// Display label: the step's `name`, else a short rendering such as `exec: echo hi`.
    pub label: String,
    pub id: Option<String>,
    pub location: Location,
    pub status: StepStatus,
    /// Arguments after their `{{ }}` expressions were rendered.
    pub args: serde_json::Value,
    /// Outputs, as later steps see them under `steps.<id>`.
    pub outputs: serde_json::Value,
    /// Why it failed or was skipped.
    pub message: Option<String>,
    pub mismatch: Option<Mismatch>,
    /// 1 unless `retry`/`eventually` ran it more than once.
    pub attempts: u32,
    /// Milliseconds since the scenario started.
    pub start_ms: u64,
    pub duration_ms: u64,
    /// true when `continue_on_error` let the scenario go on after this failure.
    pub continued: bool,
    /// The variables of the step's `requires.env` that were unset: it was SKIPPED for them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing_env: Vec<String>,
    /// A failed or errored step's kind of error, in `expect_error: { kind }`'s words
    /// (`timeout`, `unsupported`, …): `compat` tells a feature the provider refuses from one
    /// that breaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<&'static str>,
}

impl StepRecord {
    /// A failure `continue_on_error` let the scenario go on after: it does not decide the
    /// outcome, but every report shows it (as GitHub shows a `continue-on-error` step).
    pub fn soft_failed(&self) -> bool {
        self.continued && matches!(self.status, StepStatus::Failed | StepStatus::Error)
    }

    /// Skipped because its `requires.env` was not met (a model's key was not given).
    pub fn skipped_for_env(&self) -> bool {
        self.status == StepStatus::Skipped && !self.missing_env.is_empty()
    }
}

impl ScenarioResult {
    /// How many of its steps were skipped for unset `requires.env` variables, and which.
    pub fn skipped_steps(&self) -> (usize, Vec<String>) {
        let mut names: Vec<String> = Vec::new();
        let mut n = 0;
        for s in self.steps.iter().filter(|s| s.skipped_for_env()) {
            n += 1;
            for v in &s.missing_env {
                if !names.contains(v) {
                    names.push(v.clone());
                }
            }
        }
        (n, names)
    }

    /// Its failures under `continue_on_error`, in the order they happened.
    pub fn soft_failure_steps(&self) -> impl Iterator<Item = &StepRecord> {
        self.steps.iter().filter(|s| s.soft_failed())
    }

    /// `1 soft failure`, `2 soft failures`, when any.
    pub fn soft_failures_note(&self) -> Option<String> {
        soft_failures_count(self.soft_failures)
    }

    /// `2 steps skipped: missing credentials [OPENAI_API_KEY]`, when any were.
    pub fn skipped_steps_note(&self) -> Option<String> {
        let (n, names) = self.skipped_steps();
        (n > 0).then(|| {
            format!("{n} step{} skipped: missing credentials [{}]", if n == 1 { "" } else { "s" }, names.join(", "))
        })
    }
}

/// The failing step of a scenario, for the summary table and JUnit.
#[derive(Debug, Clone, Serialize)]
pub struct Failure {
    pub step: String,
    pub location: Location,
    pub message: String,
    pub mismatch: Option<Mismatch>,
    /// The end of what the failing command printed (or the command an assertion checked),
    /// shown under the failure in the terminal. The reports have the whole outputs already.
    #[serde(skip)]
    pub captured: Option<Captured>,
}

/// The most lines of each stream [`Captured`] keeps: the last ones.
pub const CAPTURED_LINES: usize = 20;
/// The most characters of one captured line (the reports have it whole).
pub const CAPTURED_LINE: usize = 400;

/// The tail of a command's streams for the terminal, as pytest's "captured stdout": masked
/// (it is made from masked outputs) and bounded ([`CAPTURED_LINES`], [`CAPTURED_LINE`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Captured {
    pub streams: Vec<CapturedStream>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CapturedStream {
    /// `stdout` or `stderr`.
    pub name: String,
    /// Its last lines, each at most [`CAPTURED_LINE`] characters.
    pub lines: Vec<String>,
    /// How many lines came before them.
    pub earlier: usize,
}

impl Captured {
    /// From a command's outputs (`stdout`, `stderr`), those of them it has; `None` when it
    /// has neither (an HTTP step, a file step).
    pub fn from_outputs(outputs: &serde_json::Value) -> Option<Captured> {
        let streams: Vec<CapturedStream> = ["stdout", "stderr"]
            .iter()
            .filter_map(|name| {
                let text = outputs.get(*name)?.as_str()?;
                let all: Vec<&str> = text.lines().collect();
                let earlier = all.len().saturating_sub(CAPTURED_LINES);
                let lines = all[earlier..]
                    .iter()
                    .map(|l| match l.char_indices().nth(CAPTURED_LINE) {
                        Some((at, _)) => format!("{}…", &l[..at]),
                        None => l.to_string(),
                    })
                    .collect();
                Some(CapturedStream { name: name.to_string(), lines, earlier })
            })
            .collect();
        (!streams.is_empty()).then_some(Captured { streams })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct KnownIssueInfo {
    pub id: Option<String>,
    pub reason: String,
    pub strict: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Position in the plan; reports are ordered by it.
    pub index: usize,
    /// Full name including the matrix cell, e.g. `exit codes[template=base]`.
    pub name: String,
    pub description: Option<String>,
    pub location: Location,
    pub tags: Vec<String>,
    pub matrix: BTreeMap<String, String>,
    pub outcome: Outcome,
    /// Skip reason, or the failure message, or the XFAIL reason.
    pub reason: Option<String>,
    pub failure: Option<Failure>,
    pub known_issue: Option<KnownIssueInfo>,
    pub steps: Vec<StepRecord>,
    /// Ids of every sandbox the scenario created.
    pub sandboxes: Vec<String>,
    /// Those `--keep-on-failure` left alive because the scenario FAILED or was an ERROR.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_sandboxes: Vec<String>,
    /// Unix milliseconds.
    pub started_at_ms: u64,
    pub duration_ms: u64,
    /// The run was interrupted while this scenario ran (or before it started).
    pub interrupted: bool,
    /// How many of its steps failed under `continue_on_error` (see
    /// [`StepRecord::soft_failed`]): a PASSED scenario with any is `PASSED with 1 soft failure`.
    pub soft_failures: usize,
}

/// `1 soft failure`, `3 soft failures`; `None` for none.
pub fn soft_failures_count(n: usize) -> Option<String> {
    (n > 0).then(|| format!("{n} soft failure{}", if n == 1 { "" } else { "s" }))
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub error: usize,
    pub skipped: usize,
    pub xfail: usize,
    pub xpass: usize,
    /// Steps (of scenarios that ran) skipped because their `requires.env` was unset.
    #[serde(skip_serializing_if = "is_zero")]
    pub skipped_steps: usize,
    /// Step failures `continue_on_error` let scenarios go on after (in any outcome).
    pub soft_failures: usize,
    /// Scenarios that PASSED with soft failures: counted in `passed`, and said beside it.
    pub passed_with_soft_failures: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl Totals {
    /// What `--fail-on-skip` fails a run for: skipped scenarios and steps skipped for their key.
    pub fn skips(&self) -> usize {
        self.skipped + self.skipped_steps
    }

    /// Each outcome with its count, in the order every report prints them.
    pub fn by_outcome(&self) -> [(Outcome, usize); 6] {
        [
            (Outcome::Passed, self.passed),
            (Outcome::Failed, self.failed),
            (Outcome::Error, self.error),
            (Outcome::Skipped, self.skipped),
            (Outcome::Xfail, self.xfail),
            (Outcome::Xpass, self.xpass),
        ]
    }

    pub fn from_results(results: &[ScenarioResult]) -> Self {
        let mut t = Totals { total: results.len(), ..Default::default() };
        for r in results {
            match r.outcome {
                Outcome::Passed => t.passed += 1,
                Outcome::Failed => t.failed += 1,
                Outcome::Error => t.error += 1,
                Outcome::Skipped => t.skipped += 1,
                Outcome::Xfail => t.xfail += 1,
                Outcome::Xpass => t.xpass += 1,
            }
            t.skipped_steps += r.skipped_steps().0;
            t.soft_failures += r.soft_failures;
            if r.outcome == Outcome::Passed && r.soft_failures > 0 {
                t.passed_with_soft_failures += 1;
            }
        }
        t
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub run_id: String,
    pub provider: String,
    pub concurrency: usize,
    /// Unix milliseconds.
    pub started_at_ms: u64,
    pub duration_ms: u64,
    pub interrupted: bool,
    pub totals: Totals,
    pub exit_code: i32,
    /// `--fail-on-skip`: a SKIPPED scenario, or a step skipped for its key, fails the run.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fail_on_skip: bool,
    pub provider_stats: ProviderStats,
    /// Ordered by plan index.
    pub results: Vec<ScenarioResult>,
}

/// What the runner tells the reporters, in order.
#[derive(Debug, Clone)]
pub enum Event {
    RunStarted {
        run_id: String,
        provider: String,
        total: usize,
        concurrency: usize,
    },
    ScenarioStarted {
        index: usize,
        name: String,
    },
    StepStarted {
        index: usize,
        step: usize,
        phase: Phase,
        label: String,
    },
    /// A running step says what it is doing (a line of a build's log), for the live view.
    StepProgress {
        index: usize,
        line: String,
    },
    StepFinished {
        index: usize,
        record: StepRecord,
    },
    ScenarioFinished {
        result: ScenarioResult,
    },
    /// First Ctrl-C/SIGTERM: no new scenarios start; running ones clean up.
    Interrupted {
        signal: String,
    },
    /// `-x` after a failure: no new scenarios start; running ones are stopped, run `finally`
    /// and clean up, and end SKIPPED.
    Stopping {
        /// `-x: `name` failed`.
        why: String,
    },
    RunFinished {
        summary: RunSummary,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names the reporters print are the names the JSON report serializes.
    #[test]
    fn names_are_the_serialized_names() {
        for o in Outcome::ALL {
            assert_eq!(serde_json::to_value(o).unwrap(), o.name());
        }
        for p in [Phase::Setup, Phase::Steps, Phase::Finally, Phase::Cleanup] {
            assert_eq!(serde_json::to_value(p).unwrap(), p.name());
        }
        for s in [StepStatus::Passed, StepStatus::Failed, StepStatus::Error, StepStatus::Skipped] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }
}

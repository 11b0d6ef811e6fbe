//! One case from start to end: requirements, steps, `finally`, cleanup, outcome.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt as _;

use minijinja::value::{Serde, Value as MValue};
use serde_json::{json, Value as JsonValue};
use tokio::sync::mpsc;
use tokio::time::Instant as TInstant;
use tokio_util::sync::CancellationToken;

use super::{now_ms, Halt, RunConfig};
use crate::cpu_bound;
use crate::expr::{self, SandboxView};
use crate::model::{Case, Step};
use crate::provider::Capability;
use crate::results::{
    Captured, Event, Failure, KnownIssueInfo, Outcome, Phase, ScenarioResult, StepRecord, StepStatus,
};
use crate::steps::{Severity, StepCtx, StepError, StepLimit, STEP_TIMEOUT, STEP_TIMEOUT_FLAG, WINDOW};

/// What a missing credential says under `--require-credentials`.
const STRICT_CREDENTIALS: &str = "(an error under --require-credentials)";

/// How long past the step's limit a command step (`exec`, `host`) gets to stop its command
/// itself and return what it printed, before the runner abandons it.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// The least time an attempt of a polled step gets, however little of the window is left.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// How long a sandbox `--keep-on-failure` kept lives from the end of its scenario (its
/// provider's timeout is set to it): long enough to look, bounded so a forgotten one ends.
pub const KEPT_TTL: Duration = Duration::from_secs(30 * 60);

/// A result for a case that did not run.
pub fn skipped_result(case: &Case, index: usize, reason: String) -> ScenarioResult {
    let sc = &case.scenario;
    ScenarioResult {
        index,
        name: case.name.clone(),
        description: sc.description.clone(),
        location: sc.location.clone(),
        tags: sc.tags.clone(),
        matrix: case.matrix.iter().map(|(k, v)| (k.clone(), crate::steps::text(v))).collect(),
        outcome: Outcome::Skipped,
        reason: Some(reason),
        failure: None,
        known_issue: sc.known_issue.as_ref().map(|k| KnownIssueInfo {
            id: k.id.clone(),
            reason: k.reason.clone(),
            strict: k.strict,
        }),
        steps: Vec::new(),
        sandboxes: Vec::new(),
        kept_sandboxes: Vec::new(),
        started_at_ms: now_ms(),
        duration_ms: 0,
        interrupted: false,
        soft_failures: 0,
    }
}

/// The text of a panic's payload (`panic!` with a message gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// An ERROR result for a case whose task died (a panic outside any step), so the run never
/// loses a scenario: totals, reports and the exit code all see it.
pub fn panicked_result(case: &Case, index: usize, message: String) -> ScenarioResult {
    let failure = Failure {
        step: "scenario".into(),
        location: case.scenario.location.clone(),
        message: message.clone(),
        mismatch: None,
        captured: None,
    };
    ScenarioResult { outcome: Outcome::Error, failure: Some(failure), ..skipped_result(case, index, message) }
}

/// Why a case cannot run here, if it cannot, and whether that is a missing credential.
fn unmet_requirements(cfg: &RunConfig, case: &Case) -> Option<(String, bool)> {
    let req = &case.scenario.requires;
    let provider = cfg.provider.name();
    if !req.providers.is_empty() && !req.providers.iter().any(|p| p == provider) {
        return Some((format!("requires provider {} (running on {provider})", req.providers.join(" or ")), false));
    }
    let mut missing: Vec<String> = cfg.provider.required_credentials();
    missing.extend(req.env.iter().cloned());
    missing.retain(|name| cfg.env.get(name).is_none_or(|v| v.is_empty()));
    missing.dedup();
    if !missing.is_empty() {
        return Some((format!("missing credentials [{}]", missing.join(", ")), true));
    }
    let caps = cfg.provider.capabilities();
    let lacking: Vec<&str> = req
        .capabilities
        .iter()
        .filter(|c| Capability::parse(c).is_none_or(|c| !caps.contains(&c)))
        .map(String::as_str)
        .collect();
    if !lacking.is_empty() {
        return Some((format!("provider {provider} lacks capability [{}]", lacking.join(", ")), false));
    }
    None
}

/// How a step list ended.
enum Stop {
    /// Ran to the end (failures may have been continued past).
    Done,
    Failed,
    TimedOut,
    Interrupted,
}

struct CaseRun<'a> {
    cfg: &'a RunConfig,
    case: &'a Case,
    index: usize,
    events: &'a mpsc::UnboundedSender<Event>,
    ctx: StepCtx,
    records: Vec<StepRecord>,
    /// The first failure decides the outcome: (severity, failure).
    failure: Option<(Severity, Failure)>,
    /// A `skip` step's reason: SKIPPED, unless something failed as well.
    skipped: Option<String>,
    started: Instant,
    base: BTreeMap<&'static str, MValue>,
    step_values: BTreeMap<String, MValue>,
    /// `params` of the step that runs, when a steps file brought it in (`include:`).
    params: Option<MValue>,
    /// Whose step ids `step_values` and `ctx.outputs` hold now: the scenario's (`None`) or an
    /// include's (its frame id); the others wait here. An included file's ids are its own.
    frame: Option<usize>,
    other_frames: BTreeMap<Option<usize>, FrameIds>,
    /// Each include's parameters, evaluated when its first step ran, by frame id.
    frame_params: BTreeMap<usize, MValue>,
    /// The last lines the running step streamed (a build's log), masked: a step that times out
    /// says what it was doing when it was stopped.
    progress_tail: ProgressTail,
    /// Ctrl-C or `-x`: what stops the case's steps, and why.
    halt: Halt,
}

/// One frame's step ids: their values for templates, and their outputs for `of:`.
type FrameIds = (BTreeMap<String, MValue>, BTreeMap<String, JsonValue>);

/// The last [`TAIL_LINES`] progress lines of the step that is running.
type ProgressTail = Arc<Mutex<std::collections::VecDeque<String>>>;
const TAIL_LINES: usize = 8;

/// The kind of a step's error as `expect_error: { kind: }` names it: the provider's kind or a
/// timeout where known, else an ordinary failure, or `infra` for an ERROR.
fn error_class(e: &StepError) -> crate::model::ErrorClass {
    use crate::model::ErrorClass as C;
    use crate::provider::ErrorKind as K;
    match e.kind {
        Some(K::Timeout) => C::Timeout,
        Some(K::NotFound) => C::NotFound,
        Some(K::Invalid) => C::Invalid,
        Some(K::Auth) => C::Auth,
        Some(K::Unsupported) => C::Unsupported,
        Some(K::Infra) => C::Infra,
        Some(K::Capacity) => C::Capacity,
        None if e.severity == Severity::Fail => C::Failed,
        None => C::Infra,
    }
}

/// `a timeout`, for the note of an error `expect_error` does not take.
fn class_phrase(c: crate::model::ErrorClass) -> &'static str {
    use crate::model::ErrorClass as C;
    match c {
        C::Failed => "an ordinary failure",
        C::NotFound => "a not-found error",
        C::Invalid => "an invalid request",
        C::Timeout => "a timeout",
        C::Infra => "an error of the platform",
        C::Auth => "a refusal of the credentials",
        C::Unsupported => "an unsupported operation",
        C::Capacity => "a refusal for want of capacity",
    }
}

/// `step timed out after … (the setting)`, with the last lines the step streamed, if any.
fn timed_out_message(limit: Duration, setting: &str, tail: &ProgressTail) -> String {
    let mut msg = format!("step timed out after {} ({setting})", crate::duration::human(limit));
    let tail = tail.lock().expect("progress tail");
    let lines: Vec<&str> = tail.iter().map(|l| l.trim_end()).filter(|l| !l.trim().is_empty()).collect();
    if !lines.is_empty() {
        msg.push_str("\nthe last lines it wrote:\n");
        msg.push_str(&lines.join("\n"));
    }
    msg
}

pub async fn run_case(
    cfg: &RunConfig,
    case: Case,
    index: usize,
    events: &mpsc::UnboundedSender<Event>,
    halt: &Halt,
) -> ScenarioResult {
    let sc = case.scenario.clone();
    // A pin past its `until` fails its scenario alone, at the date, without running it: the
    // file's other scenarios still run.
    if let Some(d) = sc.known_issue.as_ref().and_then(|k| k.expired.as_ref()) {
        let message = format!("{} ({}); {}", d.message, d.location, d.help.as_deref().unwrap_or_default());
        let failure = Failure {
            step: "known_issue".into(),
            location: d.location.clone(),
            message: message.clone(),
            mismatch: None,
            captured: None,
        };
        return ScenarioResult {
            outcome: Outcome::Failed,
            failure: Some(failure),
            ..skipped_result(&case, index, message)
        };
    }
    if let Some((reason, credentials)) = unmet_requirements(cfg, &case) {
        if credentials && cfg.require_credentials {
            let message = format!("{reason} {STRICT_CREDENTIALS}");
            // At the `requires.env` it did not meet (the provider's own key: at the scenario).
            let location = sc.requires.env_location.clone().unwrap_or_else(|| sc.location.clone());
            let failure =
                Failure { step: "requires".into(), location, message: message.clone(), mismatch: None, captured: None };
            return ScenarioResult {
                outcome: Outcome::Error,
                failure: Some(failure),
                ..skipped_result(&case, index, message)
            };
        }
        return skipped_result(&case, index, reason);
    }
    let _ = events.send(Event::ScenarioStarted { index, name: case.name.clone() });
    let started_at_ms = now_ms();
    let mut vars = sc.vars.clone();
    for (k, v) in &cfg.cli_vars {
        vars.insert(k.clone(), v.clone());
    }
    let scenario_dir = std::path::Path::new(&sc.source.path).parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let mut base = BTreeMap::new();
    base.insert("env", MValue::from(Serde(&cfg.env)));
    base.insert("matrix", MValue::from(Serde(&case.matrix)));
    base.insert("provider", MValue::from(Serde(json!({ "name": cfg.provider.name(), "env": provider_env(cfg) }))));
    base.insert("run", MValue::from(Serde(json!({ "id": cfg.run_id, "tag": format!("e2e={}", cfg.run_id) }))));
    base.insert(
        "scenario",
        MValue::from(Serde(json!({ "name": case.name, "file": sc.source.path, "description": sc.description }))),
    );
    let progress_tail = ProgressTail::default();
    let ctx = StepCtx {
        vars,
        scenario_dir,
        exec_timeout: cfg.exec_timeout,
        max_output: cfg.max_output,
        sandbox_ttl: cfg.sandbox_ttl,
        env: std::sync::Arc::new(cfg.env.clone()),
        progress: Some({
            let (events, masker, tail) = (events.clone(), cfg.masker.clone(), progress_tail.clone());
            std::sync::Arc::new(move |line: &str| {
                let line = masker.mask(line).into_owned();
                {
                    let mut tail = tail.lock().expect("progress tail");
                    if tail.len() == TAIL_LINES {
                        tail.pop_front();
                    }
                    tail.push_back(line.clone());
                }
                let _ = events.send(Event::StepProgress { index, line });
            })
        }),
        ..StepCtx::new(cfg.provider.clone(), http_client(), cfg.run_id.clone())
    };
    let mut run = CaseRun {
        cfg,
        case: &case,
        index,
        events,
        ctx,
        records: Vec::new(),
        failure: None,
        skipped: None,
        started: Instant::now(),
        base,
        step_values: BTreeMap::new(),
        params: None,
        frame: None,
        other_frames: BTreeMap::new(),
        frame_params: BTreeMap::new(),
        progress_tail,
        halt: halt.clone(),
    };
    let limit = sc.timeout.unwrap_or(cfg.scenario_timeout);
    let deadline = TInstant::now() + limit;

    let timed_out = format!("scenario timed out after {}", crate::duration::human(limit));
    let cancel = &halt.token;
    let mut stop = run.list(&sc.setup, Phase::Setup, deadline, &timed_out, cancel).await;
    if matches!(stop, Stop::Done) {
        stop = run.list(&sc.steps, Phase::Steps, deadline, &timed_out, cancel).await;
    } else {
        let why = match &run.skipped {
            Some(reason) => format!("skipped: {reason}"),
            None => "setup did not complete".into(),
        };
        run.skip_all(&sc.steps, Phase::Steps, &why);
    }
    // `finally` always runs; after an interrupt or timeout it gets the grace period. A case
    // stopped by `-x` was not interrupted: it ends SKIPPED, saying why.
    let interrupted = (matches!(stop, Stop::Interrupted) || cancel.is_cancelled()) && halt.by_x().is_none();
    let finally_deadline = if matches!(stop, Stop::TimedOut | Stop::Interrupted) {
        TInstant::now() + cfg.grace
    } else {
        TInstant::now() + cfg.grace.max(Duration::from_secs(300))
    };
    let never = CancellationToken::new();
    let finally_late = format!("finally did not finish within {}", crate::duration::human(cfg.grace));
    run.list(&sc.finally, Phase::Finally, finally_deadline, &finally_late, &never).await;
    // `--keep-on-failure`: a FAILED or ERROR scenario's sandboxes outlive it, for a look
    // inside (`scenario-run shell`); not after Ctrl-C (an interrupt cleans everything), nor
    // for an expected failure (a known issue's FAILED is its XFAIL).
    let expected_failure = sc.known_issue.is_some() && run.failure.as_ref().is_some_and(|(s, _)| *s == Severity::Fail);
    let kept_sandboxes =
        if cfg.keep_on_failure && run.failure.is_some() && !interrupted && !expected_failure && halt.by_x().is_none() {
            run.keep_for_debugging().await
        } else {
            Vec::new()
        };
    run.cleanup().await;

    let sandboxes = run.ctx.sandboxes.iter().map(|s| s.id.clone()).collect();
    let (mut outcome, mut reason, failure) = match run.failure.take() {
        None if run.skipped.is_some() => (Outcome::Skipped, run.skipped.take(), None),
        None => (Outcome::Passed, None, None),
        Some((sev, f)) => {
            let o = if sev == Severity::Fail { Outcome::Failed } else { Outcome::Error };
            (o, Some(f.message.clone()), Some(f))
        }
    };
    if interrupted && outcome == Outcome::Passed {
        outcome = Outcome::Error;
        reason = Some("interrupted".into());
    }
    let known_issue = sc.known_issue.as_ref().map(|k| KnownIssueInfo {
        id: k.id.clone(),
        reason: k.reason.clone(),
        strict: k.strict,
    });
    if let Some(ki) = &known_issue {
        match outcome {
            Outcome::Failed => {
                outcome = Outcome::Xfail;
                let id = ki.id.as_ref().map(|i| format!("{i}: ")).unwrap_or_default();
                reason = Some(format!("{id}{} (failed: {})", ki.reason, reason.unwrap_or_default()));
            }
            Outcome::Passed if !interrupted => {
                outcome = Outcome::Xpass;
                let id = ki.id.as_ref().map(|i| format!("{i} ")).unwrap_or_default();
                reason = Some(format!("known issue {id}did not reproduce{}", if ki.strict { " (strict)" } else { "" }));
            }
            _ => {}
        }
    }
    ScenarioResult {
        outcome,
        reason: reason.map(|r| cfg.masker.mask(&r).into_owned()),
        failure,
        soft_failures: run.records.iter().filter(|s| s.soft_failed()).count(),
        steps: run.records,
        sandboxes,
        kept_sandboxes,
        started_at_ms,
        duration_ms: run.started.elapsed().as_millis() as u64,
        interrupted,
        ..skipped_result(&case, index, String::new())
    }
}

/// `provider.env`: what a client on this machine reads to reach the provider (its
/// [`crate::provider::Provider::client_env`]), plus `E2E_RUN_TAG` (`e2e=<run id>`), the
/// metadata every sandbox it creates should carry so the session-end sweep finds it, and
/// `SCENARIO_RUN_PROVIDER` (the provider's name).
pub fn provider_env(cfg: &RunConfig) -> BTreeMap<String, String> {
    let mut env = cfg.provider.client_env();
    env.insert("E2E_RUN_TAG".into(), format!("e2e={}", cfg.run_id));
    env.insert("SCENARIO_RUN_PROVIDER".into(), cfg.provider.name().to_string());
    env
}

fn http_client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            crate::net::client_builder()
                .connect_timeout(Duration::from_secs(10))
                .dns_resolver(crate::net::LoopbackResolver)
                .no_proxy()
                .build()
                .expect("HTTP client builds with static settings")
        })
        .clone()
}

/// The case while one of its steps is polled (`eventually`): `ctx.polling` is set for as long
/// as this lives, and cleared when it goes, also when the step's future is dropped half-way (a
/// scenario timeout, Ctrl-C, a panic). Otherwise `finally`'s requests would run as polled
/// ones, with the 5-second limit.
struct Polling<'r, 'a>(&'r mut CaseRun<'a>);

impl<'r, 'a> Polling<'r, 'a> {
    fn start(run: &'r mut CaseRun<'a>) -> Self {
        run.ctx.polling = true;
        Polling(run)
    }
}

impl Drop for Polling<'_, '_> {
    fn drop(&mut self) {
        self.0.ctx.polling = false;
    }
}

impl<'a> std::ops::Deref for Polling<'_, 'a> {
    type Target = CaseRun<'a>;
    fn deref(&self) -> &CaseRun<'a> {
        self.0
    }
}

impl<'a> std::ops::DerefMut for Polling<'_, 'a> {
    fn deref_mut(&mut self) -> &mut CaseRun<'a> {
        self.0
    }
}

impl CaseRun<'_> {
    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn fail_scenario(&mut self, sev: Severity, message: String) {
        if self.failure.is_none() {
            let step = self.records.last().map(|r| r.label.clone()).unwrap_or_else(|| "scenario".into());
            let location =
                self.records.last().map(|r| r.location.clone()).unwrap_or_else(|| self.case.scenario.location.clone());
            self.failure = Some((sev, Failure { step, location, message, mismatch: None, captured: None }));
        }
    }

    fn skip_all(&mut self, steps: &[Step], phase: Phase, why: &str) {
        for (i, step) in steps.iter().enumerate() {
            let rec = self.skipped(step, i, phase, why.to_string(), 0, 0);
            self.push_record(rec);
        }
    }

    /// The record of `step` skipped for `why` with no arguments or outputs, taking no time.
    fn skipped(
        &self,
        step: &Step,
        index: usize,
        phase: Phase,
        why: String,
        attempts: u32,
        start_ms: u64,
    ) -> StepRecord {
        let (args, outputs) = (JsonValue::Null, JsonValue::Null);
        self.record(step, index, phase, StepStatus::Skipped, args, outputs, Some(why), attempts, start_ms, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        step: &Step,
        index: usize,
        phase: Phase,
        status: StepStatus,
        mut args: JsonValue,
        mut outputs: JsonValue,
        message: Option<String>,
        attempts: u32,
        start_ms: u64,
        duration_ms: u64,
    ) -> StepRecord {
        let m = &self.cfg.masker;
        m.mask_json(&mut args);
        m.mask_json(&mut outputs);
        StepRecord {
            index,
            phase,
            kind: step.kind.name.to_string(),
            label: m.mask(&step.label).into_owned(),
            id: step.id.clone(),
            location: step.location.clone(),
            status,
            args,
            outputs,
            message: message.map(|s| {
                // Which include brought a failing step in (a skip says why on its own).
                let s = match &step.include {
                    Some(frame) if matches!(status, StepStatus::Failed | StepStatus::Error) => {
                        format!("{s} ({})", frame.chain())
                    }
                    _ => s,
                };
                m.mask(&s).into_owned()
            }),
            mismatch: None,
            attempts,
            start_ms,
            duration_ms,
            continued: false,
            missing_env: Vec::new(),
            error_kind: None,
        }
    }

    fn push_record(&mut self, rec: StepRecord) {
        let _ = self.events.send(Event::StepFinished { index: self.index, record: rec.clone() });
        self.records.push(rec);
    }

    /// The template context as of now.
    fn expr_ctx(&self) -> MValue {
        let mut map: BTreeMap<&str, MValue> = self.base.clone();
        map.insert("vars", MValue::from(Serde(&self.ctx.vars)));
        map.insert("steps", MValue::from(self.step_values.clone()));
        let views: Vec<MValue> = self.ctx.sandboxes.iter().map(|s| MValue::from_object(view(s))).collect();
        let aliases: BTreeMap<String, MValue> = self
            .ctx
            .sandboxes
            .iter()
            .zip(&views)
            .filter_map(|(s, v)| s.alias.clone().map(|a| (a, v.clone())))
            .collect();
        map.insert("sandboxes", MValue::from(aliases));
        if let Some(i) = self.ctx.target {
            map.insert("sandbox", views[i].clone());
        }
        if let Some(p) = &self.params {
            map.insert("params", p.clone());
        }
        MValue::from(map)
    }

    /// Make `frame`'s step ids the ones `steps.<id>` and `of:` see.
    fn enter(&mut self, frame: Option<usize>) {
        if frame == self.frame {
            return;
        }
        let (values, outputs) = self.other_frames.remove(&frame).unwrap_or_default();
        let values = std::mem::replace(&mut self.step_values, values);
        let outputs = std::mem::replace(&mut self.ctx.outputs, outputs);
        self.other_frames.insert(self.frame, (values, outputs));
        self.frame = frame;
    }

    /// The parameters of an include, evaluated once (when its first step runs) in the context
    /// of the include step: the variables and outputs known then, and the params of the file
    /// holding the include.
    fn include_params(&mut self, frame: &crate::model::IncludeFrame) -> Result<MValue, String> {
        if let Some(p) = self.frame_params.get(&frame.id) {
            return Ok(p.clone());
        }
        let outer = match &frame.parent {
            Some(parent) => Some(self.include_params(parent)?),
            None => None,
        };
        let saved = std::mem::replace(&mut self.params, outer);
        let here = self.frame;
        self.enter(frame.parent.as_ref().map(|p| p.id));
        let tctx = self.expr_ctx();
        self.enter(here);
        self.params = saved;
        let mut values = serde_json::Map::new();
        for (name, node, file) in &frame.params {
            let v = expr::render_node(node, &tctx).map_err(|(e, line, col)| {
                format!("template error in parameter `{name}` at {file}:{line}:{col}: {}", e.message)
            })?;
            values.insert(name.clone(), v);
        }
        let p = MValue::from(Serde(JsonValue::Object(values)));
        self.frame_params.insert(frame.id, p.clone());
        Ok(p)
    }

    async fn list(
        &mut self,
        steps: &[Step],
        phase: Phase,
        deadline: TInstant,
        late: &str,
        cancel: &CancellationToken,
    ) -> Stop {
        for (i, step) in steps.iter().enumerate() {
            if cancel.is_cancelled() {
                let why = match self.halt.by_x() {
                    Some(why) => {
                        self.skipped.get_or_insert_with(|| why.clone());
                        why
                    }
                    None => "interrupted".to_string(),
                };
                self.skip_all(&steps[i..], phase, &why);
                return Stop::Interrupted;
            }
            let _ = self.events.send(Event::StepStarted {
                index: self.index,
                step: i,
                phase,
                label: self.cfg.masker.mask(&step.label).into_owned(),
            });
            let outcome = tokio::select! {
                r = AssertUnwindSafe(self.step(step, i, phase)).catch_unwind() => match r {
                    Ok(failed) => Some(failed),
                    // A bug in a step is this scenario's ERROR, never a lost result; the
                    // step's state is abandoned, and `finally` and cleanup still run.
                    Err(panic) => {
                        let why = format!("internal error: the step panicked: {}", panic_message(&*panic));
                        let rec =
                            self.record(step, i, phase, StepStatus::Error, JsonValue::Null, JsonValue::Null, Some(why), 1, self.elapsed_ms(), 0);
                        if self.failure.is_none() {
                            let failure = Failure {
                                step: rec.label.clone(),
                                location: rec.location.clone(),
                                message: rec.message.clone().unwrap_or_default(),
                                mismatch: None,
                                captured: None,
                            };
                            self.failure = Some((Severity::Error, failure));
                        }
                        self.push_record(rec);
                        if phase != Phase::Finally {
                            self.skip_all(&steps[i + 1..], phase, "an earlier step failed");
                            return Stop::Failed;
                        }
                        continue;
                    }
                },
                _ = tokio::time::sleep_until(deadline) => None,
                _ = cancel.cancelled() => None,
            };
            let Some(failed) = outcome else {
                // `-x` stopped the run for another scenario's failure: this one is SKIPPED
                // from here, with why (its `finally` and cleanup still run).
                if let Some(why) = self.halt.by_x().filter(|_| cancel.is_cancelled()) {
                    let rec = self.skipped(step, i, phase, why.clone(), 1, self.elapsed_ms());
                    self.push_record(rec);
                    self.skip_all(&steps[i + 1..], phase, &why);
                    self.skipped.get_or_insert(why);
                    return Stop::Interrupted;
                }
                // The step was dropped mid-flight: it is where the scenario failed.
                let interrupted = cancel.is_cancelled();
                let (status, severity, why) = if interrupted {
                    (StepStatus::Error, Severity::Error, "interrupted")
                } else {
                    (StepStatus::Failed, if phase == Phase::Finally { Severity::Error } else { Severity::Fail }, late)
                };
                let rec = self.record(
                    step,
                    i,
                    phase,
                    status,
                    JsonValue::Null,
                    JsonValue::Null,
                    Some(why.into()),
                    1,
                    self.elapsed_ms(),
                    0,
                );
                if self.failure.is_none() {
                    let failure = Failure {
                        step: rec.label.clone(),
                        location: rec.location.clone(),
                        message: why.into(),
                        mismatch: None,
                        captured: None,
                    };
                    self.failure = Some((severity, failure));
                }
                self.push_record(rec);
                self.skip_all(&steps[i + 1..], phase, why);
                return if interrupted { Stop::Interrupted } else { Stop::TimedOut };
            };
            if failed && phase != Phase::Finally {
                let why = match &self.skipped {
                    Some(reason) if self.failure.is_none() => format!("skipped: {reason}"),
                    _ => "an earlier step failed".into(),
                };
                self.skip_all(&steps[i + 1..], phase, &why);
                return Stop::Failed;
            }
        }
        Stop::Done
    }

    /// Run one step with `if`, rendering, `retry`/`eventually` and its timeout. Returns true
    /// when the step failed and the scenario must stop.
    async fn step(&mut self, step: &Step, index: usize, phase: Phase) -> bool {
        self.enter(step.include.as_ref().map(|f| f.id));
        let start_ms = self.elapsed_ms();
        let t0 = Instant::now();
        // Which sandbox.
        self.ctx.target = match &step.sandbox {
            Some(alias) => match self.ctx.sandboxes.iter().rposition(|s| s.alias.as_deref() == Some(alias)) {
                Some(i) => Some(i),
                None => {
                    let e = StepError::error(format!(
                        "unknown sandbox alias `{alias}` (not created yet, or its create failed)"
                    ));
                    return self.finish(step, index, phase, JsonValue::Null, Err(e), 1, start_ms, t0);
                }
            },
            None => self.ctx.current,
        };
        // `requires.env`: without them (a model's key) the step is skipped, visibly, and the
        // scenario goes on; whatever else it checks still decides the outcome.
        let missing: Vec<String> = step
            .requires_env
            .iter()
            .filter(|name| self.cfg.env.get(name.as_str()).is_none_or(|v| v.is_empty()))
            .cloned()
            .collect();
        if !missing.is_empty() {
            let why = format!("missing credentials [{}]", missing.join(", "));
            if self.cfg.require_credentials {
                let e = StepError::error(format!("{why} {STRICT_CREDENTIALS}"));
                return self.finish(step, index, phase, JsonValue::Null, Err(e), 0, start_ms, t0);
            }
            let mut rec = self.skipped(step, index, phase, why, 0, start_ms);
            rec.missing_env = missing;
            self.push_record(rec);
            return false;
        }
        self.resolve_ports(step).await;
        // Local files (`from:`, `equals_file`, `build: { path }`) are found beside the file
        // the step is written in: a steps file's own folder.
        self.ctx.scenario_dir =
            std::path::Path::new(&step.location.file).parent().map(|p| p.to_path_buf()).unwrap_or_default();
        self.params = match &step.include {
            None => None,
            Some(frame) => match self.include_params(frame) {
                Ok(p) => Some(p),
                Err(message) => {
                    let err = StepError::error(message);
                    return self.finish(step, index, phase, JsonValue::Null, Err(err), 1, start_ms, t0);
                }
            },
        };
        let tctx = self.expr_ctx();
        if let Some((expr, node)) = &step.condition {
            match expr::eval_bool(expr, &tctx) {
                Ok(true) => {}
                Ok(false) => {
                    let rec = self.skipped(step, index, phase, format!("if: {expr} is false"), 0, start_ms);
                    self.push_record(rec);
                    return false;
                }
                Err(e) => {
                    let (line, col) = expr::position(node, e.line_in_expr);
                    let err = StepError::error(format!(
                        "cannot evaluate `if: {expr}` at {}:{line}:{col}: {}",
                        step.location.file, e.message
                    ));
                    return self.finish(step, index, phase, JsonValue::Null, Err(err), 1, start_ms, t0);
                }
            }
        }
        let args = match expr::render_node(&step.args, &tctx) {
            Ok(a) => a,
            Err((e, line, col)) => {
                let err =
                    StepError::error(format!("template error at {}:{line}:{col}: {}", step.location.file, e.message));
                return self.finish(step, index, phase, JsonValue::Null, Err(err), 1, start_ms, t0);
            }
        };
        self.ctx.expr_ctx = tctx;
        self.ctx.current_source =
            step.kind.main.and_then(|m| step.args.get(m)).and_then(|n| n.as_str()).map(str::to_string);
        let limit = step.timeout.unwrap_or(self.cfg.step_timeout);
        let mut attempts = 0u32;
        // The rendered arguments are checked and converted by the rules `check` applies to
        // literal ones, with the same message: a value of the wrong type never reaches the step.
        let result = match crate::steps::args::convert_step(step.kind, &args) {
            Err(e) => {
                attempts = 1;
                Err(StepError::bad_args(e.message))
            }
            Ok(typed) => {
                let setting = if step.timeout.is_some() { STEP_TIMEOUT } else { STEP_TIMEOUT_FLAG };
                self.attempts(step, &typed, StepLimit { limit, setting }, &mut attempts).await
            }
        };
        let result = match &step.expect_error {
            None => result,
            // A skip is not a failure to expect.
            Some(_) if matches!(&result, Err(e) if e.severity == Severity::Skip) => result,
            Some(expect) => self.expected_error(expect, &step.location.file, &self.ctx.expr_ctx.clone(), result),
        };
        self.finish(step, index, phase, args, result, attempts, start_ms, t0)
    }

    /// The attempts of one step: polled under `eventually`, else tried under `retry`.
    async fn attempts(
        &mut self,
        step: &Step,
        typed: &crate::steps::args::Args,
        limit: StepLimit,
        attempts: &mut u32,
    ) -> Result<JsonValue, StepError> {
        if let Some(ev) = step.eventually {
            // tokio's clock, so the window can be tested on a paused one.
            let until = TInstant::now() + ev.within;
            let mut this = Polling::start(self);
            loop {
                *attempts += 1;
                // No attempt outlives the window (but each gets a moment, even the last).
                let left = until.saturating_duration_since(TInstant::now()).max(MIN_ATTEMPT);
                let bound = if left < limit.limit { StepLimit { limit: left, setting: WINDOW } } else { limit };
                let r = this.attempt(step, typed, bound).await;
                if r.is_ok() || TInstant::now() + ev.every >= until {
                    break r.map_err(|mut e| {
                        e.message = format!(
                            "did not pass within {} ({} attempts): {}",
                            crate::duration::human(ev.within),
                            *attempts,
                            e.message
                        );
                        e
                    });
                }
                tokio::time::sleep(ev.every).await;
            }
        } else {
            let retry = step.retry.unwrap_or(crate::model::Retry { attempts: 1, delay: Duration::ZERO, backoff: 1.0 });
            let mut delay = retry.delay;
            loop {
                *attempts += 1;
                let r = self.attempt(step, typed, limit).await;
                let skipped = matches!(&r, Err(e) if e.severity == Severity::Skip);
                if r.is_ok() || skipped || *attempts >= retry.attempts {
                    break r;
                }
                tokio::time::sleep(delay).await;
                delay = crate::duration::saturating_mul_f64(delay, retry.backoff);
            }
        }
    }

    /// `expect_error`: a failure of the operation that matches is a pass (its message becomes
    /// the `error` output); a success is a failure, and so is an argument the step refused.
    /// A timeout or an ERROR of the platform meets it only if it names that kind: otherwise
    /// the error stands as it is, with a note saying why it was not the one expected.
    fn expected_error(
        &self,
        expect: &crate::model::ExpectError,
        file: &str,
        tctx: &MValue,
        result: Result<JsonValue, StepError>,
    ) -> Result<JsonValue, StepError> {
        let e = match result {
            Ok(_) => return Err(StepError::fail("expected this step to fail, but it succeeded")),
            // The step refused its own arguments: nothing was tried, so nothing failed as
            // expected (a typo in a rendered value must not pass as the platform's error).
            Err(mut e) if e.bad_args => {
                e.message = format!(
                    "{} (the step did not run: `expect_error` is met only by the operation's own error, not by the step's arguments)",
                    e.message
                );
                return Err(e);
            }
            Err(e) => e,
        };
        let class = error_class(&e);
        if !expect.kinds.iter().any(|k| k.admits(class)) {
            let mut e = e;
            let wanted: Vec<&str> = expect.kinds.iter().map(|k| k.name()).collect();
            e.message = format!(
                "{} (`expect_error` wants {}, but this is {}: write `expect_error: {{ kind: {} }}` if that is the error this step must give)",
                e.message,
                wanted.join(" or "),
                class_phrase(class),
                class.name()
            );
            return Err(e);
        }
        if let Some(node) = &expect.matcher {
            let rendered = expr::render_node(node, tctx).map_err(|(e, line, col)| {
                StepError::error(format!("template error at {file}:{line}:{col}: {}", e.message))
            })?;
            let m = crate::matcher::Matcher::from_json(&rendered).map_err(|e| StepError::error(e.to_string()))?;
            if let Err(f) = m.check_text(&e.message) {
                return Err(StepError::fail(format!(
                    "failed as expected, but the error does not match: {}",
                    f.message
                )));
            }
        }
        let severity = if e.severity == Severity::Fail { "failed" } else { "error" };
        Ok(json!({ "error": e.message, "severity": severity, "kind": class.name() }))
    }

    async fn attempt(
        &mut self,
        step: &Step,
        args: &crate::steps::args::Args,
        bound: StepLimit,
    ) -> Result<JsonValue, StepError> {
        self.progress_tail.lock().expect("progress tail").clear();
        self.ctx.step_limit = Some(bound);
        // A command step stops its command at the limit itself (and keeps what it printed);
        // it is abandoned only if it has not a moment later.
        let outer =
            if crate::steps::registry::stops_itself(step.kind) { bound.limit + STOP_MARGIN } else { bound.limit };
        let r =
            match tokio::time::timeout(outer, (crate::steps::registry::run_fn(step.kind))(&mut self.ctx, args)).await {
                Ok(r) => r,
                Err(_) => Err(StepError::timeout(timed_out_message(bound.limit, bound.setting, &self.progress_tail))),
            };
        self.ctx.step_limit = None;
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        step: &Step,
        index: usize,
        phase: Phase,
        args: JsonValue,
        result: Result<JsonValue, StepError>,
        attempts: u32,
        start_ms: u64,
        t0: Instant,
    ) -> bool {
        let duration_ms = t0.elapsed().as_millis() as u64;
        match result {
            Ok(outputs) => {
                // Copying, converting and masking a big output (a 100 MiB file read back) takes
                // seconds: done so that other scenarios' tasks do not wait for it.
                let size = cpu_bound::json_text_bytes(&outputs, cpu_bound::OFF_RUNTIME_BYTES)
                    + cpu_bound::json_text_bytes(&args, cpu_bound::OFF_RUNTIME_BYTES);
                cpu_bound::off_runtime(size, || {
                    let background =
                        args.get("background").is_some_and(|b| b.as_bool() == Some(true) || b.as_str() == Some("true"));
                    if step.kind.sets_last && !background {
                        self.ctx.last_exec = Some(outputs.clone());
                    }
                    if let Some(id) = &step.id {
                        self.ctx.outputs.insert(id.clone(), outputs.clone());
                        self.step_values.insert(id.clone(), MValue::from(Serde(&outputs)));
                    }
                    let rec = self.record(
                        step,
                        index,
                        phase,
                        StepStatus::Passed,
                        args,
                        outputs,
                        None,
                        attempts,
                        start_ms,
                        duration_ms,
                    );
                    self.push_record(rec);
                });
                false
            }
            // `skip`: the scenario ends here as SKIPPED (in `finally`, only the step is).
            Err(e) if e.severity == Severity::Skip => {
                let rec = self.record(
                    step,
                    index,
                    phase,
                    StepStatus::Skipped,
                    args,
                    JsonValue::Null,
                    Some(e.message.clone()),
                    attempts,
                    start_ms,
                    duration_ms,
                );
                self.push_record(rec);
                if phase == Phase::Finally {
                    return false;
                }
                self.skipped.get_or_insert(e.message);
                true
            }
            Err(e) => {
                let outputs = e.outputs.clone().map_or(JsonValue::Null, |b| *b);
                if step.kind.sets_last && !outputs.is_null() {
                    self.ctx.last_exec = Some(outputs.clone());
                }
                if let (Some(id), false) = (&step.id, outputs.is_null()) {
                    self.ctx.outputs.insert(id.clone(), outputs.clone());
                    self.step_values.insert(id.clone(), MValue::from(Serde(&outputs)));
                }
                let status = if e.severity == Severity::Fail { StepStatus::Failed } else { StepStatus::Error };
                let mut rec = self.record(
                    step,
                    index,
                    phase,
                    status,
                    args,
                    outputs,
                    Some(e.message.clone()),
                    attempts,
                    start_ms,
                    duration_ms,
                );
                rec.error_kind = Some(error_class(&e).name());
                rec.mismatch = e.mismatch.map(|m| {
                    let mut m = *m;
                    m.expected = self.cfg.masker.mask(&m.expected).into_owned();
                    m.actual = self.cfg.masker.mask(&m.actual).into_owned();
                    m
                });
                rec.continued = step.continue_on_error;
                // `continue_on_error`: recorded, but it does not decide the outcome.
                if self.failure.is_none() && !step.continue_on_error {
                    // What the command printed: the failing step's own streams, or those of
                    // the command an assertion checked; masked like everything recorded.
                    let captured = match e.shown {
                        Some(shown) => {
                            let mut shown = *shown;
                            self.cfg.masker.mask_json(&mut shown);
                            Captured::from_outputs(&shown)
                        }
                        None => Captured::from_outputs(&rec.outputs),
                    };
                    self.failure = Some((
                        e.severity,
                        Failure {
                            step: rec.label.clone(),
                            location: rec.location.clone(),
                            message: rec.message.clone().unwrap_or_default(),
                            mismatch: rec.mismatch.clone(),
                            captured,
                        },
                    ));
                }
                self.push_record(rec);
                !step.continue_on_error
            }
        }
    }

    /// Resolve the literal ports a step's templates use (`url(8000)`), since providers are
    /// async and templates are not.
    async fn resolve_ports(&mut self, step: &Step) {
        let mut ports = Vec::new();
        collect_ports(&step.args, &mut ports);
        if ports.is_empty() {
            return;
        }
        for sb in self.ctx.sandboxes.iter_mut().filter(|s| !s.killed) {
            for &p in &ports {
                if let std::collections::hash_map::Entry::Vacant(e) = sb.urls.entry(p) {
                    if let Ok(Ok(url)) =
                        tokio::time::timeout(Duration::from_secs(30), self.ctx.provider.sandbox(&sb.id).port_url(p))
                            .await
                    {
                        e.insert(url);
                    }
                }
            }
        }
    }

    /// Destroy every sandbox this case made, unless kept; then stop its watches and delete
    /// its snapshots (after the sandboxes, which may run on them).
    async fn cleanup(&mut self) {
        self.ctx.watches.clear();
        self.destroy_sandboxes().await;
        self.delete_snapshots().await;
    }

    /// Delete the snapshots this case made, unless kept (or a kept sandbox runs on one).
    async fn delete_snapshots(&mut self) {
        let snapshots = std::mem::take(&mut self.ctx.snapshots);
        for snap in snapshots {
            let in_use = self.ctx.sandboxes.iter().any(|s| !s.killed && s.template == snap.id);
            if snap.keep || in_use {
                continue;
            }
            let (t0, start_ms) = (Instant::now(), self.elapsed_ms());
            let id = snap.id;
            let r = tokio::time::timeout(Duration::from_secs(60), self.ctx.provider.delete_snapshot(&id)).await;
            let message = match r {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(format!("failed to delete snapshot {id}: {e}")),
                Err(_) => Some(format!("deleting snapshot {id} timed out")),
            };
            self.cleanup_record("delete-snapshot", format!("delete snapshot {id}"), &id, (start_ms, t0), message);
        }
    }

    /// The record of one piece of the runner's own cleanup (destroying a sandbox, deleting a
    /// snapshot): a failure is the scenario's ERROR.
    fn cleanup_record(
        &mut self,
        kind: &str,
        label: String,
        id: &str,
        started: (u64, Instant),
        message: Option<String>,
    ) {
        let (start_ms, t0) = started;
        let status = if message.is_some() { StepStatus::Error } else { StepStatus::Passed };
        let rec = StepRecord {
            index: self.records.len(),
            phase: Phase::Cleanup,
            kind: kind.into(),
            label,
            id: None,
            location: self.case.scenario.location.clone(),
            status,
            args: json!({ "id": id }),
            outputs: JsonValue::Null,
            message: message.clone(),
            mismatch: None,
            attempts: 1,
            // When the cleanup started (the timeline of the HTML report draws from it).
            start_ms,
            duration_ms: t0.elapsed().as_millis() as u64,
            continued: false,
            missing_env: Vec::new(),
            error_kind: None,
        };
        self.push_record(rec);
        if let Some(m) = message {
            self.fail_scenario(Severity::Error, m);
        }
    }

    /// `--keep-on-failure`: marks every live sandbox this case made (and did not keep on its
    /// own) kept, so neither the case, the run's end nor its sweep destroys it, and gives it
    /// [`KEPT_TTL`] to live; returns their ids.
    async fn keep_for_debugging(&mut self) -> Vec<String> {
        let mut kept: Vec<String> = Vec::new();
        for sb in self.ctx.sandboxes.iter_mut().filter(|s| !s.killed && !s.keep) {
            sb.keep = true;
            if !kept.contains(&sb.id) {
                kept.push(sb.id.clone());
            }
        }
        for id in &kept {
            self.ctx.provider.keep(id);
            // Bounded: a kept sandbox nobody comes back to still ends by itself.
            let _ =
                tokio::time::timeout(Duration::from_secs(30), self.ctx.provider.set_timeout(id, KEPT_TTL.as_secs()))
                    .await;
        }
        kept
    }

    /// Destroy every sandbox this case made, unless kept.
    async fn destroy_sandboxes(&mut self) {
        // One sandbox may be known under several aliases: destroy it once, and keep it if
        // any of its entries says so.
        let mut doomed: Vec<(String, bool)> = Vec::new();
        for sb in self.ctx.sandboxes.iter().filter(|s| !s.killed) {
            match doomed.iter_mut().find(|(id, _)| *id == sb.id) {
                Some((_, keep)) => *keep |= sb.keep,
                None => doomed.push((sb.id.clone(), sb.keep)),
            }
        }
        for (id, keep) in doomed {
            if keep {
                continue;
            }
            let (t0, start_ms) = (Instant::now(), self.elapsed_ms());
            let r = tokio::time::timeout(Duration::from_secs(60), self.ctx.provider.kill(&id)).await;
            let message = match r {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(format!("failed to destroy sandbox {id}: {e}")),
                Err(_) => Some(format!("destroying sandbox {id} timed out")),
            };
            for sb in self.ctx.sandboxes.iter_mut().filter(|s| s.id == id) {
                sb.killed = true;
            }
            self.cleanup_record("destroy", format!("destroy {id}"), &id, (start_ms, t0), message);
        }
    }
}

fn view(s: &crate::steps::SandboxRef) -> SandboxView {
    SandboxView { id: s.id.clone(), template: s.template.clone(), alias: s.alias.clone(), urls: s.urls.clone() }
}

fn collect_ports(node: &crate::yaml::Node, out: &mut Vec<u16>) {
    use crate::yaml::Value;
    match &node.value {
        Value::Str(s) => out.extend(expr::ports_in(s)),
        Value::Seq(items) => items.iter().for_each(|n| collect_ports(n, out)),
        Value::Map(m) => m.iter().for_each(|(_, v)| collect_ports(v, out)),
        _ => {}
    }
}

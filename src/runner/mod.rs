//! The runner: schedules cases under a concurrency limit, runs their steps in order, and
//! destroys every sandbox on every path.
//!
//! Concurrency is a weighted semaphore: a case takes as many permits as it can have sandboxes
//! alive (its number of `create` steps, at least one, at most the limit) before it starts, so
//! the number of live sandboxes never exceeds `-j`, and a case never waits for a second permit
//! while holding the first (no deadlock). Cancellation is a token tree: the run's token is
//! cancelled by the first SIGINT/SIGTERM; each case's current step is dropped, its `finally`
//! runs under the grace period, and its sandboxes are destroyed.
//!
//! A panic is a bug of ours, and never a lost result: a step that panics is that scenario's
//! ERROR with the panic's message (its `finally` and cleanup still run), and a task that dies
//! anyway becomes an ERROR result of its case, so totals, reports and the exit code see it.

mod scenario;

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::FutureExt as _;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::exit::Exit;
use crate::mask::Masker;
use crate::model::Case;
use crate::provider::Provider;
use crate::results::{Event, Outcome, RunSummary, ScenarioResult, Totals};

pub use scenario::{skipped_result, KEPT_TTL};

/// Everything a run needs besides the cases.
pub struct RunConfig {
    pub provider: Arc<dyn Provider>,
    pub concurrency: usize,
    /// `-x`/`--fail-fast`: the first FAILED or ERROR scenario stops the run, as pytest's `-x`:
    /// nothing new starts, and running scenarios are stopped (see [`Halt`]).
    pub fail_fast: bool,
    /// `--require-credentials`: a scenario or step that would be SKIPPED for `missing
    /// credentials [...]` is an ERROR instead.
    pub require_credentials: bool,
    /// `--fail-on-skip`: any skip fails the run (exit 1); outcomes stay as they are.
    pub fail_on_skip: bool,
    /// `--keep-on-failure`: a FAILED or ERROR scenario's sandboxes are kept (see
    /// [`KEPT_TTL`]) instead of destroyed.
    pub keep_on_failure: bool,
    pub run_id: String,
    /// Process environment plus `.env` files (the environment wins).
    pub env: BTreeMap<String, String>,
    /// `--var k=v`, over file vars.
    pub cli_vars: serde_json::Map<String, serde_json::Value>,
    pub masker: Arc<Masker>,
    pub step_timeout: Duration,
    pub scenario_timeout: Duration,
    pub exec_timeout: Duration,
    /// Bytes kept of each stream of one command (`--max-output`).
    pub max_output: usize,
    /// Lifetime of a sandbox whose `create` has no `timeout` (`E2E_SANDBOX_TTL`).
    pub sandbox_ttl: Duration,
    /// Time allowed for `finally` and cleanup after an interrupt or a scenario timeout.
    pub grace: Duration,
}

/// What tells running cases to stop: the run's Ctrl-C, or `-x` after a failure. A case stopped
/// by `-x` has its current step interrupted, runs `finally` within the grace period, destroys
/// its sandboxes, and ends SKIPPED with why; one interrupted by Ctrl-C ends as before.
#[derive(Clone)]
pub(crate) struct Halt {
    /// Cancelled by either: a child of the run's token.
    pub token: CancellationToken,
    /// Under `-x`, the name of the scenario whose failure stopped the run.
    pub first_failure: Arc<OnceLock<String>>,
}

impl Halt {
    /// `stopped by -x: `name` failed`, when `-x` stopped the run.
    pub fn by_x(&self) -> Option<String> {
        self.first_failure.get().map(|name| format!("stopped by -x: `{name}` failed"))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A run's exit code (§5, [`Exit`]): interrupted; else a scenario failed or strict-xpassed;
/// else an infrastructure error; else all good.
pub fn exit_code(results: &[ScenarioResult], interrupted: bool) -> i32 {
    if interrupted {
        return Exit::Interrupted.into();
    }
    let failed = results.iter().any(|r| {
        r.outcome == Outcome::Failed
            || (r.outcome == Outcome::Xpass && r.known_issue.as_ref().is_some_and(|k| k.strict))
    });
    if failed {
        Exit::Failed.into()
    } else if results.iter().any(|r| r.outcome == Outcome::Error) {
        Exit::Infra.into()
    } else {
        Exit::Ok.into()
    }
}

/// Run every case; events go to `events` in order; returns the summary.
pub async fn run(
    cfg: Arc<RunConfig>,
    cases: Vec<Case>,
    events: mpsc::UnboundedSender<Event>,
    cancel: CancellationToken,
) -> RunSummary {
    let started = Instant::now();
    let started_at_ms = now_ms();
    let _ = events.send(Event::RunStarted {
        run_id: cfg.run_id.clone(),
        provider: cfg.provider.name().to_string(),
        total: cases.len(),
        concurrency: cfg.concurrency,
    });
    let limit = cfg.concurrency.max(1);
    let sem = Arc::new(Semaphore::new(limit));
    let halt = Halt { token: cancel.child_token(), first_failure: Arc::new(OnceLock::new()) };
    // Why a case did not start: Ctrl-C, or `-x` after a failure.
    let not_started = |halt: &Halt| match halt.first_failure.get() {
        Some(name) if !cancel.is_cancelled() => (format!("not run: -x stopped the run after `{name}` failed"), false),
        _ => ("interrupted before it started".to_string(), true),
    };
    let mut set = JoinSet::new();
    // The case of every task still running, so a task that dies still gets its result.
    let mut running: HashMap<tokio::task::Id, (Case, usize)> = HashMap::new();
    let mut results: Vec<ScenarioResult> = Vec::new();
    let mut pending = cases.into_iter().enumerate();
    for (index, case) in pending.by_ref() {
        let need = case.scenario.sandbox_need.clamp(1, limit) as u32;
        let permit = tokio::select! {
            p = sem.clone().acquire_many_owned(need) => p.expect("semaphore is never closed"),
            _ = halt.token.cancelled() => {
                let (why, interrupted) = not_started(&halt);
                results.push(not_run(&case, index, &why, interrupted, &events));
                break;
            }
        };
        if halt.token.is_cancelled() {
            let (why, interrupted) = not_started(&halt);
            results.push(not_run(&case, index, &why, interrupted, &events));
            break;
        }
        let task_cfg = cfg.clone();
        let task_events = events.clone();
        let task_halt = halt.clone();
        let task_case = case.clone();
        let handle = set.spawn(async move {
            let (cfg, events, halt) = (task_cfg, task_events, task_halt);
            let this = case.clone();
            let run = AssertUnwindSafe(scenario::run_case(&cfg, case, index, &events, &halt)).catch_unwind();
            let result = match run.await {
                Ok(result) => result,
                Err(panic) => {
                    let why = format!("internal error: the scenario panicked: {}", scenario::panic_message(&*panic));
                    scenario::panicked_result(&this, index, cfg.masker.mask(&why).into_owned())
                }
            };
            // Report before freeing the permit, so with -j 1 lines come in plan order.
            let _ = events.send(Event::ScenarioFinished { result: result.clone() });
            if cfg.fail_fast && matches!(result.outcome, Outcome::Failed | Outcome::Error) {
                // The first failure stops the run (a later one, or one that ended as the run
                // stopped, changes nothing). Said after its own line, before the others'.
                if halt.first_failure.set(result.name.clone()).is_ok() && !halt.token.is_cancelled() {
                    let _ = events.send(Event::Stopping { why: format!("-x: `{}` failed", result.name) });
                    halt.token.cancel();
                }
            }
            drop(permit);
            result
        });
        running.insert(handle.id(), (task_case, index));
        // Reap finished tasks as we go so memory stays flat on long runs.
        while let Some(done) = set.try_join_next_with_id() {
            results.push(joined(done, &mut running, &events, &cfg.masker));
        }
    }
    let (why, interrupted_left) = not_started(&halt);
    for (index, case) in pending {
        results.push(not_run(&case, index, &why, interrupted_left, &events));
    }
    while let Some(done) = set.join_next_with_id().await {
        results.push(joined(done, &mut running, &events, &cfg.masker));
    }
    // Belt and braces: anything a case could not destroy (a dropped create, a failed kill).
    let leftovers = cfg.provider.destroy_all().await;
    if leftovers > 0 {
        crate::errln!("scenario-run: destroyed {leftovers} sandbox(es) left behind at the end of the run");
    }
    // Then by the run's tag: sandboxes this process never tracked (made by an SDK or CLI a
    // scenario drove, or by a create whose answer was lost) carry it too.
    let swept = sweep_run(cfg.provider.as_ref(), &cfg.run_id, Duration::from_secs(60)).await;
    if swept > 0 {
        crate::errln!(
            "scenario-run: swept {swept} sandbox(es) tagged e2e={} that the run had not destroyed",
            cfg.run_id
        );
    }
    // Template builds and deployments of this run, unless they were asked to be kept.
    cfg.provider.remove_builds().await;
    results.sort_by_key(|r| r.index);
    let interrupted = cancel.is_cancelled();
    let totals = Totals::from_results(&results);
    let mut code = exit_code(&results, interrupted);
    // `--fail-on-skip` makes a skip a failure: over a pass or an error, under an interrupt.
    if cfg.fail_on_skip && totals.skips() > 0 && matches!(Exit::from_code(code), Exit::Ok | Exit::Infra) {
        code = Exit::Failed.into();
    }
    let summary = RunSummary {
        run_id: cfg.run_id.clone(),
        provider: cfg.provider.name().to_string(),
        concurrency: cfg.concurrency,
        started_at_ms,
        duration_ms: started.elapsed().as_millis() as u64,
        interrupted,
        totals,
        exit_code: code,
        fail_on_skip: cfg.fail_on_skip,
        provider_stats: cfg.provider.stats(),
        results,
    };
    let _ = events.send(Event::RunFinished { summary: summary.clone() });
    summary
}

/// The result of a finished task. A task that died (it panics outside the guard in it, or is
/// aborted) becomes an ERROR result of its case, reported like any other: a scenario never
/// vanishes from the totals, the reports and the exit code.
fn joined(
    done: Result<(tokio::task::Id, ScenarioResult), tokio::task::JoinError>,
    running: &mut HashMap<tokio::task::Id, (Case, usize)>,
    events: &mpsc::UnboundedSender<Event>,
    masker: &Masker,
) -> ScenarioResult {
    match done {
        Ok((id, r)) => {
            running.remove(&id);
            r
        }
        Err(e) => {
            let (case, index) = running.remove(&e.id()).expect("every task is in the table");
            let why = if e.is_panic() {
                format!("internal error: the scenario panicked: {}", scenario::panic_message(&*e.into_panic()))
            } else {
                format!("internal error: the scenario task ended early: {e}")
            };
            let r = scenario::panicked_result(&case, index, masker.mask(&why).into_owned());
            let _ = events.send(Event::ScenarioFinished { result: r.clone() });
            r
        }
    }
}

fn not_run(
    case: &Case,
    index: usize,
    reason: &str,
    interrupted: bool,
    events: &mpsc::UnboundedSender<Event>,
) -> ScenarioResult {
    let mut r = skipped_result(case, index, reason.to_string());
    r.interrupted = interrupted;
    let _ = events.send(Event::ScenarioFinished { result: r.clone() });
    r
}

/// Kills every sandbox the provider lists with this run's tag (`e2e=<run id>`) but those a
/// scenario kept (`create { keep: true }`), within `within`; returns how many. The session-end sweep, and the last act of a second Ctrl-C.
pub async fn sweep_run(provider: &dyn crate::provider::Provider, run_id: &str, within: Duration) -> usize {
    let work = async {
        let tag: std::collections::BTreeMap<String, String> = [("e2e".to_string(), run_id.to_string())].into();
        let Ok(found) = provider.list(&tag).await else { return 0 };
        let mut swept = 0;
        for sb in found.into_iter().filter(|sb| !provider.is_kept(&sb.id)) {
            if matches!(provider.kill(&sb.id).await, Ok(true)) {
                swept += 1;
            }
        }
        swept
    };
    tokio::time::timeout(within, work).await.unwrap_or(0)
}

/// The signals a run answers, caught from the moment this is made (inside a runtime): made
/// before the provider, an interrupt while it starts (probing, filling its pools) is kept for
/// [`spawn_signal_handler`] instead of killing the process with its default action.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    /// The one kept before these were installed (0: none).
    early: i32,
}

/// A signal that came before [`Signals::install`] (0: none), kept by [`arm_early_signals`].
static EARLY_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Whether [`keep_early_signal`] still keeps: tokio's handler calls it after its own (it
/// chains to the previous action), which must not count a signal twice.
static EARLY_ARMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn keep_early_signal(sig: libc::c_int) {
    // Async-signal-safe: atomic loads and stores only.
    if EARLY_ARMED.load(std::sync::atomic::Ordering::SeqCst) {
        EARLY_SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
    }
}

/// From the first line of a run until the runtime's handlers are installed, SIGINT, SIGTERM,
/// SIGHUP and SIGQUIT are kept rather than killing the process: a Ctrl-C while scenarios load
/// or the provider starts ends the run as one during it does (exit 130, nothing left behind).
pub fn arm_early_signals() {
    EARLY_ARMED.store(true, std::sync::atomic::Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: a zeroed sigaction with a handler that only stores an integer atomically
        // (async-signal-safe); the previous action is not needed (tokio's handler replaces
        // this one and chains to it, disarmed by then).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = keep_early_signal as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "SIGQUIT",
    }
}

impl Signals {
    /// None if a handler cannot be installed.
    pub fn install() -> Option<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let installed = (|| {
            Some((
                signal(SignalKind::interrupt()).ok()?,
                signal(SignalKind::terminate()).ok()?,
                signal(SignalKind::hangup()).ok()?,
                signal(SignalKind::quit()).ok()?,
            ))
        })();
        let Some((int, term, hup, quit)) = installed else {
            // No handler: a signal must at least end the run, as it did before any was armed.
            EARLY_ARMED.store(false, std::sync::atomic::Ordering::SeqCst);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                // SAFETY: restoring a signal's default action.
                unsafe { libc::signal(sig, libc::SIG_DFL) };
            }
            return None;
        };
        // From here tokio has them. (One arriving while the four were being installed may be
        // seen by both: a second interrupt before anything was created.)
        EARLY_ARMED.store(false, std::sync::atomic::Ordering::SeqCst);
        let early = EARLY_SIGNAL.swap(0, std::sync::atomic::Ordering::SeqCst);
        Some(Self { int, term, hup, quit, early })
    }
}

/// First SIGINT, SIGTERM, SIGHUP (a closed terminal, an SSH drop) or SIGQUIT: stop
/// scheduling, let cases run `finally` and destroy their sandboxes, write the reports. Second:
/// destroy what is left without waiting and exit 130 at once.
pub fn spawn_signal_handler(
    signals: Option<Signals>,
    cancel: CancellationToken,
    provider: Arc<dyn Provider>,
    tx: tokio::sync::mpsc::UnboundedSender<Event>,
    run_id: String,
) {
    tokio::spawn(async move {
        let Some(Signals { mut int, mut term, mut hup, mut quit, mut early }) = signals else {
            crate::errln!("warning: cannot install signal handlers: an interrupt will not run finally or cleanup");
            return;
        };
        let mut count = 0;
        // One that came while the run was starting counts as the first.
        loop {
            let name = if early != 0 {
                signal_name(std::mem::take(&mut early))
            } else {
                tokio::select! {
                    _ = int.recv() => "SIGINT",
                    _ = term.recv() => "SIGTERM",
                    _ = hup.recv() => "SIGHUP",
                    _ = quit.recv() => "SIGQUIT",
                }
            };
            count += 1;
            if count == 1 {
                let _ = tx.send(Event::Interrupted { signal: name.to_string() });
                cancel.cancel();
            } else {
                crate::errln!("\nscenario-run: second {name}: destroying sandboxes and exiting now");
                // Synchronous and waiting (for the processes to go before their cgroups
                // can): off the runtime's workers.
                let p = provider.clone();
                let _ = tokio::task::spawn_blocking(move || p.destroy_all_now()).await;
                // Host commands (SDK and CLI clients) go with their whole process groups.
                crate::steps::host::kill_all();
                // A create under way when the signal came may still land on a remote provider:
                // what carries this run's tag goes too (bounded: this exit is meant to be quick).
                for _ in 0..2 {
                    sweep_run(provider.as_ref(), &run_id, Duration::from_secs(2)).await;
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                std::process::exit(Exit::Interrupted.code().into());
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steps::fake::FakeProvider;

    fn config(provider: Arc<FakeProvider>) -> Arc<RunConfig> {
        config_j(provider, 2)
    }

    /// With `-j j`.
    fn config_j(provider: Arc<FakeProvider>, j: usize) -> Arc<RunConfig> {
        Arc::new(RunConfig {
            provider,
            concurrency: j,
            fail_fast: false,
            require_credentials: false,
            fail_on_skip: false,
            keep_on_failure: false,
            run_id: "run-1".into(),
            env: BTreeMap::new(),
            cli_vars: serde_json::Map::new(),
            masker: Arc::new(Masker::default()),
            step_timeout: Duration::from_secs(10),
            scenario_timeout: Duration::from_secs(30),
            exec_timeout: Duration::from_secs(10),
            max_output: 1 << 20,
            sandbox_ttl: Duration::from_secs(300),
            grace: Duration::from_secs(5),
        })
    }

    /// The run of `cases`, its events unread.
    async fn run_unwatched(cfg: Arc<RunConfig>, cases: Vec<Case>) -> RunSummary {
        let (tx, _rx) = mpsc::unbounded_channel();
        run(cfg, cases, tx, CancellationToken::new()).await
    }

    /// The run of `yaml`'s scenarios one at a time (`-j 1`), and how long it took on tokio's
    /// clock.
    async fn run_in_turn(provider: Arc<FakeProvider>, yaml: &str) -> (RunSummary, Duration) {
        let cases = cases(yaml);
        let started = tokio::time::Instant::now();
        let summary = run_unwatched(config_j(provider, 1), cases).await;
        (summary, started.elapsed())
    }

    fn cases(yaml: &str) -> Vec<Case> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.yaml");
        std::fs::write(&path, yaml).unwrap();
        crate::model::load(&[path], &crate::model::LoadOptions::default()).expect("valid").cases
    }

    /// A port on 127.0.0.1 where nothing listens (bound, then closed).
    fn closed_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Issue 26 item 7: a polled step (`eventually`) cut off by the scenario's timeout left the
    /// scenario "polling", so `finally`'s HTTP steps ran with the 5-second polled request limit
    /// (and the polled wording). On tokio's paused clock: the hour-long window and the timeout
    /// take no real time.
    #[tokio::test(start_paused = true)]
    async fn a_polled_step_cut_off_by_the_scenario_timeout_leaves_finally_unpolled() {
        let provider = Arc::new(FakeProvider::new());
        provider.script(|_, _| crate::steps::fake::done("", "", 1));
        let port = closed_port();
        let cases = cases(&format!(
            "name: cut off\ntimeout: 3s\nsteps:\n  - create: base\n  - exec: {{ cmd: 'false', exit_code: 0 }}\n    eventually: {{ within: 1h, every: 1s }}\nfinally:\n  - http-get: {{ port: {port}, path: / }}\n"
        ));
        let started = tokio::time::Instant::now();
        let summary = run_unwatched(config(provider.clone()), cases).await;
        let r = &summary.results[0];
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the scenario timeout cut the window: {:?}",
            started.elapsed()
        );
        let finally = r.steps.iter().find(|s| s.phase == crate::results::Phase::Finally).expect("finally ran");
        let message = finally.message.as_deref().unwrap_or_default();
        assert!(message.contains("nothing is listening on port"), "{message}");
        assert!(
            message.contains("give this step `eventually: 10s`"),
            "finally's request is not a polled one (its limit and its words): {message}"
        );
    }

    /// Issue 26 item 14: the runner's limits on tokio's paused clock. A step's `timeout` cuts
    /// it at exactly its limit; a scenario's `timeout` cuts its steps, then `finally` gets the
    /// grace period and no more.
    #[tokio::test(start_paused = true)]
    async fn step_timeout_scenario_timeout_and_grace_on_a_paused_clock() {
        let provider = Arc::new(FakeProvider::new());
        let yaml = concat!(
            "name: step limit\nsteps:\n  - sleep: 1h\n    timeout: 2s\n",
            "---\nname: scenario limit\ntimeout: 3s\nsteps:\n  - sleep: 1h\nfinally:\n  - sleep: 1h\n",
        );
        let (summary, took) = run_in_turn(provider, yaml).await;
        let r0 = &summary.results[0];
        assert_eq!(r0.outcome, Outcome::Failed);
        assert_eq!(r0.reason.as_deref(), Some("step timed out after 2.00s (the step's `timeout:`)"), "{r0:?}");
        let r1 = &summary.results[1];
        assert_eq!(r1.reason.as_deref(), Some("scenario timed out after 3.00s"), "{r1:?}");
        let finally = r1.steps.iter().find(|s| s.phase == crate::results::Phase::Finally).unwrap();
        assert_eq!(finally.message.as_deref(), Some("finally did not finish within 5.00s"), "{finally:?}");
        // 2 s, then 3 s and the 5 s grace, one after the other; nothing waited an hour.
        assert!(took >= Duration::from_secs(10) && took < Duration::from_secs(11), "{took:?}");
    }

    /// Issue 26 item 14: `eventually` on a paused clock: attempts every `every` until one
    /// passes, or until the window would end before the next, with the count in the message.
    #[tokio::test(start_paused = true)]
    async fn eventually_attempts_on_a_paused_clock() {
        let provider = Arc::new(FakeProvider::new());
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = calls.clone();
        provider.script(move |req, _| {
            if req.cmd.contains("third") && seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2 {
                return crate::steps::fake::done("", "", 1);
            }
            crate::steps::fake::done("", "", i32::from(req.cmd.contains("never")))
        });
        let yaml = concat!(
            "name: third time\nsteps:\n  - create: base\n  - exec: { cmd: third, exit_code: 0 }\n    eventually: { within: 10s, every: 1s }\n",
            "---\nname: never\nsteps:\n  - create: base\n  - exec: { cmd: never, exit_code: 0 }\n    eventually: { within: 5s, every: 1s }\n",
        );
        let (summary, took) = run_in_turn(provider, yaml).await;
        let third = &summary.results[0];
        assert_eq!(third.outcome, Outcome::Passed, "{third:?}");
        assert_eq!(third.steps[1].attempts, 3);
        let never = &summary.results[1];
        assert_eq!(never.steps[1].attempts, 5, "at 0, 1, 2, 3 and 4 s; a sixth would start at the window's end");
        let reason = never.reason.as_deref().unwrap();
        assert!(
            reason.starts_with("did not pass within 5.00s (5 attempts): expected exit code 0, found 1"),
            "{reason}"
        );
        assert!(took >= Duration::from_secs(6) && took < Duration::from_secs(7), "2 s, then 4 s: {took:?}");
    }

    /// Issue 26 item 3: `expect_error` took a rendered argument of the wrong type (refused
    /// before anything was sent) for the failure it expects, and the step PASSED. Only the
    /// operation's own error satisfies it; an argument the step refuses is the step's ERROR.
    #[tokio::test]
    async fn expect_error_is_not_satisfied_by_the_steps_own_argument_errors() {
        let provider = Arc::new(FakeProvider::new());
        let cases = cases(concat!(
            "name: rendered wrong type\nvars: { port: not-a-port }\nsteps:\n  - create: base\n",
            "  - http-get: { port: \"{{ vars.port }}\", path: / }\n    expect_error: true\n",
            "---\nname: refused inside the step\nsteps:\n  - create: base\n",
            "  - write-file: { path: /a, content: x, content_base64: eA== }\n    expect_error: true\n",
            "---\nname: the operation fails\nsteps:\n  - create: base\n",
            "  - read-file: /no/such/file\n    expect_error: { contains: /no/such/file }\n",
        ));
        let summary = run_unwatched(config(provider.clone()), cases).await;
        let got: Vec<(&str, Outcome, String)> = summary
            .results
            .iter()
            .map(|r| (r.name.as_str(), r.outcome, r.reason.clone().unwrap_or_default()))
            .collect();
        assert_eq!(got[0].1, Outcome::Error, "{got:?}");
        assert!(got[0].2.contains("`port` must be an integer from 1 to 65535"), "{got:?}");
        assert!(got[0].2.contains("`expect_error` is met only by the operation's own error"), "{got:?}");
        assert_eq!(got[1].1, Outcome::Error, "{got:?}");
        assert!(got[1].2.contains("give only one of"), "{got:?}");
        assert_eq!(got[2].1, Outcome::Passed, "the operation's own failure still satisfies it: {got:?}");
    }

    /// Issue 13: a panic in a step was only logged; the scenario vanished from the totals and
    /// the reports, and the run exited 0.
    #[tokio::test]
    async fn a_panicking_step_is_an_error_result_and_fails_the_run() {
        let provider = Arc::new(FakeProvider::new());
        provider.script(|req, _| {
            if req.cmd.contains("boom") {
                panic!("step blew up on purpose");
            }
            crate::steps::fake::done("ok\n", "", 0)
        });
        let cases = cases(concat!(
            "name: panics\nsteps:\n  - create: base\n  - exec: boom\n  - exec: never runs\n",
            "finally:\n  - exec: echo finally\n",
            "---\nname: passes\nsteps:\n  - create: base\n  - exec: echo fine\n",
        ));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let summary = run(config(provider.clone()), cases, tx, CancellationToken::new()).await;
        let outcomes: Vec<(&str, Outcome)> = summary.results.iter().map(|r| (r.name.as_str(), r.outcome)).collect();
        assert_eq!(outcomes, [("panics", Outcome::Error), ("passes", Outcome::Passed)]);
        let r = &summary.results[0];
        let reason = r.reason.as_deref().unwrap();
        assert!(reason.contains("panicked: step blew up on purpose"), "{reason}");
        assert_eq!(r.failure.as_ref().unwrap().location.line, 4, "the failure points at the step");
        // `finally` still ran and the sandbox was destroyed by the case itself.
        let kinds: Vec<(&str, StepStatus)> = r.steps.iter().map(|s| (s.kind.as_str(), s.status)).collect();
        use crate::results::StepStatus;
        assert_eq!(
            kinds,
            [
                ("create", StepStatus::Passed),
                ("exec", StepStatus::Error),
                ("exec", StepStatus::Skipped),
                ("exec", StepStatus::Passed),
                ("destroy", StepStatus::Passed)
            ]
        );
        assert_eq!(summary.totals.error, 1);
        assert_ne!(summary.exit_code, 0);
        let mut finished = 0;
        while let Ok(ev) = rx.try_recv() {
            finished += usize::from(matches!(ev, Event::ScenarioFinished { .. }));
        }
        assert_eq!(finished, 2, "every scenario is reported");
    }
}

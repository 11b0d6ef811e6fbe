//! The runner: schedules cases under a concurrency limit, runs their steps in order, and
//! destroys every sandbox on every path.
//!
//! Concurrency is a weighted semaphore: a case takes as many permits as it can have sandboxes
//! alive (its number of `create` steps, at least one, at most the limit) before it starts, so
//! the number of live sandboxes never exceeds `-j`, and a case never waits for a second permit
//! while holding the first (no deadlock). Cancellation is a token tree: the run's token is
//! cancelled by the first SIGINT/SIGTERM; each case's current step is dropped, its `finally`
//! runs under the grace period, and its sandboxes are destroyed.

mod scenario;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::mask::Masker;
use crate::model::Case;
use crate::provider::Provider;
use crate::report::events::{Event, Outcome, RunSummary, ScenarioResult, Totals};

pub use scenario::skipped_result;

/// Everything a run needs besides the cases.
pub struct RunConfig {
    pub provider: Arc<dyn Provider>,
    pub concurrency: usize,
    pub fail_fast: bool,
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

pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Exit codes (§5): 0 all good; 1 a scenario failed or strict-xpassed; 4 an infrastructure
/// error and no failure; 130 interrupted.
pub fn exit_code(results: &[ScenarioResult], interrupted: bool) -> i32 {
    if interrupted {
        return 130;
    }
    let failed = results.iter().any(|r| {
        r.outcome == Outcome::Failed
            || (r.outcome == Outcome::Xpass && r.known_issue.as_ref().is_some_and(|k| k.strict))
    });
    if failed {
        1
    } else if results.iter().any(|r| r.outcome == Outcome::Error) {
        4
    } else {
        0
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
    let stop_scheduling = Arc::new(AtomicBool::new(false));
    let mut set = JoinSet::new();
    let mut results: Vec<ScenarioResult> = Vec::new();
    let mut pending = cases.into_iter().enumerate();
    for (index, case) in pending.by_ref() {
        let need = case.scenario.sandbox_need.clamp(1, limit) as u32;
        let permit = tokio::select! {
            p = sem.clone().acquire_many_owned(need) => p.expect("semaphore is never closed"),
            _ = cancel.cancelled() => {
                results.push(not_run(&case, index, "interrupted before it started", true, &events));
                break;
            }
        };
        if cancel.is_cancelled() {
            results.push(not_run(&case, index, "interrupted before it started", true, &events));
            break;
        }
        if stop_scheduling.load(Ordering::SeqCst) {
            results.push(not_run(&case, index, "not run: --fail-fast stopped the run", false, &events));
            continue;
        }
        let cfg = cfg.clone();
        let events = events.clone();
        let cancel = cancel.clone();
        let stop = stop_scheduling.clone();
        set.spawn(async move {
            let result = scenario::run_case(&cfg, case, index, &events, &cancel).await;
            if cfg.fail_fast && matches!(result.outcome, Outcome::Failed | Outcome::Error) {
                stop.store(true, Ordering::SeqCst);
            }
            // Report before freeing the permit, so with -j 1 lines come in plan order.
            let _ = events.send(Event::ScenarioFinished { result: result.clone() });
            drop(permit);
            result
        });
        // Reap finished tasks as we go so memory stays flat on long runs.
        while let Some(done) = set.try_join_next() {
            if let Ok(r) = done {
                results.push(r);
            }
        }
    }
    let interrupted_left = cancel.is_cancelled();
    for (index, case) in pending {
        let reason =
            if interrupted_left { "interrupted before it started" } else { "not run: --fail-fast stopped the run" };
        results.push(not_run(&case, index, reason, interrupted_left, &events));
    }
    while let Some(done) = set.join_next().await {
        match done {
            Ok(r) => results.push(r),
            Err(e) => eprintln!("scenario-run: internal error: a scenario task failed: {e}"),
        }
    }
    // Belt and braces: anything a case could not destroy (a dropped create, a failed kill).
    let leftovers = cfg.provider.destroy_all().await;
    if leftovers > 0 {
        eprintln!("scenario-run: destroyed {leftovers} sandbox(es) left behind at the end of the run");
    }
    // Template builds and deployments of this run, unless they were asked to be kept.
    cfg.provider.remove_builds().await;
    results.sort_by_key(|r| r.index);
    let interrupted = cancel.is_cancelled();
    let summary = RunSummary {
        run_id: cfg.run_id.clone(),
        provider: cfg.provider.name().to_string(),
        concurrency: cfg.concurrency,
        started_at_ms,
        duration_ms: started.elapsed().as_millis() as u64,
        interrupted,
        totals: Totals::from_results(&results),
        exit_code: exit_code(&results, interrupted),
        provider_stats: cfg.provider.stats(),
        results,
    };
    let _ = events.send(Event::RunFinished { summary: summary.clone() });
    summary
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

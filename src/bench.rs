//! How fast a platform is, measured as the public ComputeSDK sandbox benchmarks measure it
//! (issue 38 item 6), so a figure here stands beside theirs: `scenario-run bench` prints it,
//! and the `bench` step hands it to a scenario's assertions (`p95 < 800`).
//!
//! Each iteration creates a sandbox, runs a first command (`true`) and takes the time from the
//! create's request until that command returned: **time to interactive**. A second command's
//! round trip follows, then the sandbox is killed. N iterations run **sequentially**,
//! **staggered** (one started every `stagger`, each on its own) or in a **burst** (all at
//! once). The fastest and slowest 5 % of each series are trimmed before its percentiles (p50,
//! p95, p99 by nearest rank), and the success rate counts every iteration whose create and both
//! commands succeeded. Every sandbox carries the caller's tag, so a run's sweep finds any an
//! interruption left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::provider::{CreateRequest, ExecRequest, Provider};

/// How the iterations are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One after another.
    Sequential,
    /// One started every `--stagger`, each on its own.
    Staggered,
    /// All at once.
    Burst,
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    pub template: String,
    pub iterations: usize,
    pub mode: Mode,
    pub stagger: Duration,
}

/// One iteration: the time to interactive and the second command's round trip, or why not.
pub type Sample = Result<(Duration, Duration), String>;

/// The share trimmed from each end of a series before its percentiles.
pub const TRIM: f64 = 0.05;

/// Percentiles of one series, in milliseconds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    /// How many samples are left after the trim.
    pub kept: usize,
}

/// The trimmed percentiles of `samples` (milliseconds), or None without any.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    let mut s: Vec<f64> = samples.iter().copied().filter(|v| v.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let cut = (s.len() as f64 * TRIM).floor() as usize;
    let s = &s[cut..s.len() - cut];
    // Nearest rank: the smallest value with at least p of the samples at or below it.
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Some(Summary {
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        min: s[0],
        max: s[s.len() - 1],
        mean: s.iter().sum::<f64>() / s.len() as f64,
        kept: s.len(),
    })
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One iteration on `provider`.
async fn iteration(provider: Arc<dyn Provider>, template: String, tag: (String, String)) -> Sample {
    if provider.features().processes.is_none() {
        return Err(format!("{} runs no commands", provider.name()));
    }
    let started = Instant::now();
    let req =
        CreateRequest { template, timeout_secs: Some(300), metadata: BTreeMap::from([tag]), ..Default::default() };
    let info = provider.create(req).await.map_err(|e| format!("create: {e}"))?;
    let run = |what: &'static str| {
        let (p, id) = (provider.clone(), info.id.clone());
        async move {
            let procs = p.features().processes.ok_or_else(|| format!("{what}: no processes"))?;
            let cmd = ExecRequest { cmd: "true".into(), timeout: Some(Duration::from_secs(60)), ..Default::default() };
            let r = procs.exec(&id, cmd, None).await.map_err(|e| format!("{what}: {e}"))?;
            if r.exit_code != Some(0) {
                return Err(format!("{what}: `true` ended with {:?} (timed out: {})", r.exit_code, r.timed_out));
            }
            Ok::<(), String>(())
        }
    };
    let result = async {
        run("first command").await?;
        let tti = started.elapsed();
        let t = Instant::now();
        run("second command").await?;
        Ok((tti, t.elapsed()))
    }
    .await;
    let _ = provider.kill(&info.id).await;
    result
}

/// All iterations, started as `mode` says.
pub async fn iterations(provider: &Arc<dyn Provider>, a: &Plan, tag: &(String, String)) -> Vec<Sample> {
    if a.mode == Mode::Sequential {
        let mut out = Vec::with_capacity(a.iterations);
        for _ in 0..a.iterations {
            out.push(iteration(provider.clone(), a.template.clone(), tag.clone()).await);
        }
        return out;
    }
    let start = tokio::time::Instant::now();
    let tasks: Vec<_> = (0..a.iterations)
        .map(|i| {
            let (p, t, tag) = (provider.clone(), a.template.clone(), tag.clone());
            let at = if a.mode == Mode::Staggered { start + a.stagger * i as u32 } else { start };
            tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                iteration(p, t, tag).await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(format!("the iteration panicked: {e}"))));
    }
    out
}

/// The report of a run: the table's figures and every sample.
pub fn report(a: &Plan, provider: &str, samples: &[Sample], wall: Duration) -> serde_json::Value {
    let ok: Vec<&(Duration, Duration)> = samples.iter().filter_map(|s| s.as_ref().ok()).collect();
    let tti: Vec<f64> = ok.iter().map(|(t, _)| ms(*t)).collect();
    let exec: Vec<f64> = ok.iter().map(|(_, e)| ms(*e)).collect();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for e in samples.iter().filter_map(|s| s.as_ref().err()) {
        *errors.entry(e.clone()).or_default() += 1;
    }
    json!({
        "provider": provider, "template": a.template, "mode": a.mode, "iterations": a.iterations,
        "stagger_ms": ms(a.stagger), "trim": TRIM, "wall_s": wall.as_secs_f64(),
        "succeeded": ok.len(), "failed": samples.len() - ok.len(),
        "success_rate": if samples.is_empty() { 0.0 } else { ok.len() as f64 / samples.len() as f64 },
        "time_to_interactive_ms": summarize(&tti), "command_round_trip_ms": summarize(&exec),
        "errors": errors,
        "samples": { "time_to_interactive_ms": tti, "command_round_trip_ms": exec },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_after_trimming_five_percent_each_end() {
        // 1..=100: 5 trimmed from each end leaves 6..=95.
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = summarize(&s).unwrap();
        assert_eq!((p.kept, p.min, p.max), (90, 6.0, 95.0));
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 91.0, 95.0));
        assert!((p.mean - 50.5).abs() < 1e-9);
        // Under 20 samples nothing is trimmed; one sample is every percentile.
        let one = summarize(&[7.0]).unwrap();
        assert_eq!((one.p50, one.p99, one.kept), (7.0, 7.0, 1));
        assert_eq!(summarize(&[]), None);
        // An outlier at each end does not move the trimmed figures.
        let mut s: Vec<f64> = vec![10.0; 40];
        s.push(10_000.0);
        s.push(0.001);
        let p = summarize(&s).unwrap();
        assert_eq!((p.p99, p.min), (10.0, 10.0));
    }
}

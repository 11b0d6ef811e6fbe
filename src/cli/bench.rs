//! `scenario-run bench`: how fast a platform is, measured as the public ComputeSDK sandbox
//! benchmarks measure it (issue 38 item 6), so a figure here stands beside theirs.
//!
//! Each iteration creates a sandbox, runs a first command (`true`) and takes the time from the
//! create's request until that command returned: **time to interactive**. A second command's
//! round trip follows, then the sandbox is killed. N iterations (100 by default) run
//! **sequentially**, **staggered** (one started every `--stagger`, 200 ms, each on its own) or
//! in a **burst** (all at once). The fastest and slowest 5 % of each series are trimmed before
//! its percentiles (p50, p95, p99 by nearest rank), and the success rate counts every iteration
//! whose create and both commands succeeded. A table on stdout; `--json FILE` keeps every sample.
//! `--max-p95 DURATION` makes the run fail when the time to interactive's p95 is over it, so a CI
//! job can hold a platform to a budget.
//!
//! Every sandbox carries the run tag (`e2e=<run id>`), and all that are left are destroyed on
//! every way out: the end, a failure, Ctrl-C.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::wiring::{block_on, make_provider};
use crate::errln;
use crate::exit::Exit;
use crate::outln;
use crate::provider::factory::{self, ProviderKind};
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

/// What `scenario-run bench` was asked.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    pub provider: ProviderKind,
    pub isolation: String,
    pub template: String,
    pub iterations: usize,
    pub mode: Mode,
    pub stagger: Duration,
    pub json: Option<PathBuf>,
    pub max_p95: Option<Duration>,
    pub env_files: Vec<String>,
}

/// One iteration: the time to interactive and the second command's round trip, or why not.
type Sample = Result<(Duration, Duration), String>;

/// The share trimmed from each end of a series before its percentiles.
const TRIM: f64 = 0.05;

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

fn ms(d: Duration) -> f64 {
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
async fn iterations(provider: &Arc<dyn Provider>, a: &BenchArgs, tag: &(String, String)) -> Vec<Sample> {
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
pub fn report(a: &BenchArgs, provider: &str, samples: &[Sample], wall: Duration) -> serde_json::Value {
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

/// The table for the terminal.
pub fn table(r: &serde_json::Value) -> String {
    let mut t = format!(
        "{} iterations on {} ({}{}), template {}: {} succeeded ({:.1} %) in {:.1} s\n",
        r["iterations"],
        r["provider"].as_str().unwrap_or_default(),
        r["mode"].as_str().unwrap_or_default(),
        if r["mode"] == "staggered" { format!(", one every {} ms", r["stagger_ms"]) } else { String::new() },
        r["template"].as_str().unwrap_or_default(),
        r["succeeded"],
        r["success_rate"].as_f64().unwrap_or(0.0) * 100.0,
        r["wall_s"].as_f64().unwrap_or(0.0),
    );
    t.push_str(&format!(
        "{:<22}{:>10}{:>10}{:>10}{:>10}{:>10}  (ms; {} % trimmed from each end)\n",
        "",
        "p50",
        "p95",
        "p99",
        "min",
        "max",
        TRIM * 100.0
    ));
    for (name, key) in
        [("time to interactive", "time_to_interactive_ms"), ("command round trip", "command_round_trip_ms")]
    {
        let s = &r[key];
        if s.is_null() {
            t.push_str(&format!("{name:<22}{:>10}\n", "-"));
            continue;
        }
        let f = |k: &str| format!("{:.1}", s[k].as_f64().unwrap_or(f64::NAN));
        t.push_str(&format!(
            "{name:<22}{:>10}{:>10}{:>10}{:>10}{:>10}\n",
            f("p50"),
            f("p95"),
            f("p99"),
            f("min"),
            f("max")
        ));
    }
    for (e, n) in r["errors"].as_object().into_iter().flatten() {
        t.push_str(&format!("failed {n} ×: {}\n", e));
    }
    t
}

/// `scenario-run bench`.
pub fn bench(a: BenchArgs) -> Exit {
    if a.iterations == 0 {
        errln!("error: --iterations must be at least 1");
        return Exit::Usage;
    }
    let env = match crate::config::environment(std::path::Path::new(".env"), &a.env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    let provider = match make_provider(a.provider, &a.isolation, &env) {
        Ok(p) => p,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Infra;
        }
    };
    let missing: Vec<String> =
        provider.required_credentials().into_iter().filter(|k| env.get(k).is_none_or(|v| v.is_empty())).collect();
    if !missing.is_empty() {
        errln!("error: {} needs {}", provider.name(), missing.join(", "));
        return Exit::Usage;
    }
    let run_id = format!("bench-{}", crate::random::hex(8));
    let tag = ("e2e".to_string(), run_id.clone());
    block_on(async move {
        let cancel = tokio_util::sync::CancellationToken::new();
        if let Err(e) = factory::prepare(provider.as_ref(), &cancel, false).await {
            errln!("error: {e}");
            return Exit::Infra;
        }
        errln!(
            "bench {run_id}: {} × create + `true` + `true` + kill on {}, {}",
            a.iterations,
            provider.name(),
            serde_json::to_value(a.mode).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
        );
        let started = Instant::now();
        let samples = tokio::select! {
            s = iterations(&provider, &a, &tag) => s,
            _ = tokio::signal::ctrl_c() => {
                let n = provider.destroy_all().await;
                errln!("interrupted: {n} sandbox(es) destroyed");
                return Exit::Interrupted;
            }
        };
        let wall = started.elapsed();
        provider.destroy_all().await;
        let r = report(&a, provider.name(), &samples, wall);
        outln!("{}", table(&r).trim_end());
        if let Some(path) = &a.json {
            let text = serde_json::to_string_pretty(&r).unwrap_or_default();
            if let Err(e) = std::fs::write(path, text + "\n") {
                errln!("error: cannot write {}: {e}", path.display());
                return Exit::Infra;
            }
        }
        let failed = r["failed"].as_u64().unwrap_or(0);
        let p95 = r["time_to_interactive_ms"]["p95"].as_f64();
        if let (Some(budget), Some(p95)) = (a.max_p95, p95) {
            if p95 > ms(budget) {
                errln!("FAILED: time to interactive p95 {p95:.1} ms is over --max-p95 {:.1} ms", ms(budget));
                return Exit::Failed;
            }
        }
        if failed > 0 {
            errln!("FAILED: {failed} of {} iterations did not succeed", a.iterations);
            return Exit::Failed;
        }
        Exit::Ok
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

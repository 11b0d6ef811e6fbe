//! `scenario-run bench`: the measurement of [`crate::bench`] on a provider, as a table on
//! stdout, every sample with `--json FILE`, and `--max-p95 DURATION` to fail the run over a
//! budget. Every sandbox carries the run tag (`e2e=<run id>`), and all that are left are
//! destroyed on every way out: the end, a failure, Ctrl-C.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::wiring::{block_on, make_provider, unmet_credentials};
use crate::bench::{iterations, ms, report, Mode, Plan, TRIM};
use crate::errln;
use crate::exit::Exit;
use crate::outln;
use crate::provider::factory::{self, ProviderKind};

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

impl BenchArgs {
    fn plan(&self) -> Plan {
        Plan { template: self.template.clone(), iterations: self.iterations, mode: self.mode, stagger: self.stagger }
    }
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
    if let Some(why) = unmet_credentials(provider.as_ref(), &env) {
        errln!("error: {why}");
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
        let plan = a.plan();
        let samples = tokio::select! {
            s = iterations(&provider, &plan, &tag) => s,
            _ = tokio::signal::ctrl_c() => {
                let n = provider.destroy_all().await;
                errln!("interrupted: {n} sandbox(es) destroyed");
                return Exit::Interrupted;
            }
        };
        let wall = started.elapsed();
        provider.destroy_all().await;
        let r = report(&plan, provider.name(), &samples, wall);
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

//! The terminal reporter: a live indicatif view when stdout is a terminal, plain lines
//! otherwise, and the summary table at the end.
//!
//! Live view (`progress`): one spinner line per running scenario, `name › current step`, above
//! an overall bar with done/total, pass/fail counts and elapsed time. When a scenario ends its
//! line goes away and a permanent `PASSED name (1.20s)` line is printed above the bars. The bars
//! are drawn on stdout by indicatif; `out` receives the final summary.
//!
//! Plain mode: one line per finished scenario, written to `out` and flushed at once, so CI
//! logs stream:
//!
//! ```text
//! PASSED  hello  1.20s
//! FAILED  write file  0.30s  scenarios/files.yaml:12  stdout did not match
//! SKIPPED needs ports  0.00s  provider lacks capability `ports`
//! ```
//!
//! `verbose` adds a `START name` line per scenario and one line per finished step. Write
//! errors (a closed pipe) are ignored: reporting must never take the run down.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::events::{Event, Outcome, Phase, Reporter, ScenarioResult, StepRecord, StepStatus, Totals};
use super::format::{self, paint, Color};
use super::summary::render_summary;

#[derive(Debug, Clone, Copy, Default)]
pub struct HumanOptions {
    /// Show the live indicatif view (stdout is a terminal and no `--no-progress`).
    pub progress: bool,
    /// Use ANSI colours.
    pub color: bool,
    /// Also show scenario starts and every finished step.
    pub verbose: bool,
}

pub struct HumanReporter {
    opts: HumanOptions,
    out: Box<dyn Write + Send>,
    live: Option<Live>,
    names: HashMap<usize, String>,
    total: usize,
    counts: Totals,
}

struct Live {
    mp: MultiProgress,
    overall: ProgressBar,
    running: HashMap<usize, ProgressBar>,
}

impl HumanReporter {
    pub fn new(opts: HumanOptions, out: Box<dyn Write + Send>) -> Self {
        Self::with_draw_target(opts, out, ProgressDrawTarget::stdout())
    }

    /// As [`new`](Self::new), drawing the live view on `target` instead of stdout.
    pub fn with_draw_target(opts: HumanOptions, out: Box<dyn Write + Send>, target: ProgressDrawTarget) -> Self {
        let live = opts.progress.then(|| {
            let mp = MultiProgress::with_draw_target(target);
            let overall = mp.add(ProgressBar::new(0).with_style(overall_style(opts.color)));
            overall.enable_steady_tick(Duration::from_millis(250));
            Live { mp, overall, running: HashMap::new() }
        });
        HumanReporter { opts, out, live, names: HashMap::new(), total: 0, counts: Totals::default() }
    }

    /// A permanent line: above the bars in live mode, else straight to `out`.
    fn line(&mut self, text: &str) {
        match &self.live {
            Some(live) => {
                let _ = live.mp.println(text);
            }
            None => {
                let _ = writeln!(self.out, "{text}");
                let _ = self.out.flush();
            }
        }
    }

    fn counts_message(&self) -> String {
        let c = &self.counts;
        let mut msg = format!("{} passed, {} failed", c.passed, c.failed);
        for (n, what) in [(c.error, "error"), (c.skipped, "skipped"), (c.xfail, "xfail"), (c.xpass, "xpass")] {
            if n > 0 {
                msg.push_str(&format!(", {n} {what}"));
            }
        }
        msg
    }

    fn scenario_started(&mut self, index: usize, name: &str) {
        self.names.insert(index, name.to_string());
        let color = self.opts.color;
        if let Some(live) = &mut self.live {
            let pb = live.mp.insert_before(&live.overall, ProgressBar::new_spinner().with_style(spinner_style(color)));
            pb.set_prefix(format::sanitize(name));
            pb.set_message("starting");
            pb.enable_steady_tick(Duration::from_millis(120));
            live.running.insert(index, pb);
        }
        if self.opts.verbose {
            self.line(&format!("{} {}", paint(&format!("{:<7}", "START"), Color::Cyan, color), format::sanitize(name)));
        }
    }

    fn step_started(&mut self, index: usize, phase: Phase, label: &str) {
        let Some(pb) = self.live.as_ref().and_then(|l| l.running.get(&index)) else { return };
        let label = format::sanitize(label);
        match phase {
            Phase::Steps => pb.set_message(label),
            Phase::Setup => pb.set_message(format!("setup: {label}")),
            Phase::Finally => pb.set_message(format!("finally: {label}")),
            Phase::Cleanup => pb.set_message(format!("cleanup: {label}")),
        }
    }

    fn step_finished(&mut self, index: usize, record: &StepRecord) {
        if !self.opts.verbose {
            return;
        }
        let name = self.names.get(&index).map_or_else(|| format!("#{index}"), |n| format::sanitize(n));
        let (status, c) = match record.status {
            StepStatus::Passed => ("passed", Color::Green),
            StepStatus::Failed => ("failed", Color::Red),
            StepStatus::Error => ("error", Color::Red),
            StepStatus::Skipped => ("skipped", Color::Yellow),
        };
        let mut text = format!(
            "  {name} › {} {}  {}",
            paint(&format!("{status:<7}"), c, self.opts.color),
            format::sanitize(&record.label),
            format::duration(record.duration_ms)
        );
        if matches!(record.status, StepStatus::Failed | StepStatus::Error) {
            text.push_str(&format!("  {}:{}", record.location.file, record.location.line));
        }
        if let Some(m) = &record.message {
            text.push_str("  ");
            text.push_str(&format::sanitize(format::first_line(m)));
        }
        self.line(&text);
    }

    fn scenario_finished(&mut self, r: &ScenarioResult) {
        match r.outcome {
            Outcome::Passed => self.counts.passed += 1,
            Outcome::Failed => self.counts.failed += 1,
            Outcome::Error => self.counts.error += 1,
            Outcome::Skipped => self.counts.skipped += 1,
            Outcome::Xfail => self.counts.xfail += 1,
            Outcome::Xpass => self.counts.xpass += 1,
        }
        self.counts.total += 1;
        self.names.remove(&r.index);
        let text = finished_line(r, self.opts.color, self.live.is_some());
        if let Some(live) = &mut self.live {
            if let Some(pb) = live.running.remove(&r.index) {
                pb.finish_and_clear();
                live.mp.remove(&pb);
            }
        }
        self.line(&text);
        let msg = self.counts_message();
        if let Some(live) = &self.live {
            live.overall.inc(1);
            live.overall.set_message(msg);
        }
    }

    fn finish_live(&mut self) {
        if let Some(live) = self.live.take() {
            for pb in live.running.values() {
                pb.finish_and_clear();
            }
            live.overall.finish_and_clear();
            let _ = live.mp.clear();
        }
    }
}

impl Reporter for HumanReporter {
    fn handle(&mut self, event: &Event) {
        match event {
            Event::RunStarted { run_id, provider, total, concurrency } => {
                self.total = *total;
                if let Some(live) = &self.live {
                    live.overall.set_length(*total as u64);
                    live.overall.set_message(self.counts_message());
                }
                if self.opts.verbose {
                    self.line(&format!(
                        "run {run_id}: {total} scenario{} on {provider}, concurrency {concurrency}",
                        if *total == 1 { "" } else { "s" }
                    ));
                }
            }
            Event::ScenarioStarted { index, name } => self.scenario_started(*index, name),
            Event::StepStarted { index, phase, label, .. } => self.step_started(*index, *phase, label),
            Event::StepFinished { index, record } => self.step_finished(*index, record),
            Event::ScenarioFinished { result } => self.scenario_finished(result),
            Event::Interrupted { signal } => {
                let text = format!("interrupted by {signal}: finishing cleanup, press Ctrl-C again to exit at once");
                self.line(&paint(&text, Color::Yellow, self.opts.color));
                if let Some(live) = &self.live {
                    live.overall.set_message(format!("{}, interrupted: cleaning up", self.counts_message()));
                }
            }
            Event::RunFinished { summary } => {
                self.finish_live();
                let _ = writeln!(self.out);
                let _ = self.out.write_all(render_summary(summary, self.opts.color).as_bytes());
                let _ = self.out.flush();
            }
        }
    }
}

impl Drop for HumanReporter {
    /// Take the live view off the terminal even if the run never finished (e.g. a panic).
    fn drop(&mut self) {
        self.finish_live();
    }
}

/// `PASSED  name  1.20s`, or `PASSED  name (1.20s)` above the live view; then for a
/// non-pass the `file:line` of the failing step and the reason.
fn finished_line(r: &ScenarioResult, color: bool, live: bool) -> String {
    let label = paint(&format!("{:<7}", r.outcome.label()), format::outcome_color(r.outcome), color);
    let name = format::sanitize(&r.name);
    let duration = format::duration(r.duration_ms);
    let mut text = if live { format!("{label} {name} ({duration})") } else { format!("{label} {name}  {duration}") };
    let failure_message = r.failure.as_ref().map(|f| f.message.as_str());
    let reason = match r.outcome {
        Outcome::Passed => None,
        Outcome::Failed | Outcome::Error => failure_message.or(r.reason.as_deref()),
        Outcome::Skipped | Outcome::Xfail | Outcome::Xpass => r.reason.as_deref().or(failure_message),
    };
    if r.outcome != Outcome::Passed {
        if let Some(f) = &r.failure {
            text.push_str(&format!("  {}:{}", f.location.file, f.location.line));
        }
    }
    if let Some(reason) = reason {
        text.push_str("  ");
        text.push_str(&format::sanitize(format::first_line(reason)));
    }
    // Steps skipped for a missing key are said, whatever the outcome.
    if let Some(note) = r.skipped_steps_note() {
        text.push_str(&format!("  ({note})"));
    }
    text
}

fn overall_style(color: bool) -> ProgressStyle {
    let template = if color {
        "{spinner:.cyan} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg}"
    } else {
        "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}"
    };
    ProgressStyle::with_template(template).expect("static template").progress_chars("=> ")
}

fn spinner_style(color: bool) -> ProgressStyle {
    let template =
        if color { "{spinner:.cyan} {prefix:.bold} › {wide_msg}" } else { "{spinner} {prefix} › {wide_msg}" };
    ProgressStyle::with_template(template).expect("static template")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::report::fixture;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buf {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    fn events(interrupt: bool) -> Vec<Event> {
        let summary = fixture::summary();
        let mut results = summary.results.clone();
        results.sort_by_key(|r| r.index);
        let mut ev = vec![Event::RunStarted {
            run_id: summary.run_id.clone(),
            provider: summary.provider.clone(),
            total: results.len(),
            concurrency: 4,
        }];
        for r in &results {
            ev.push(Event::ScenarioStarted { index: r.index, name: r.name.clone() });
            for s in &r.steps {
                ev.push(Event::StepStarted { index: r.index, step: s.index, phase: s.phase, label: s.label.clone() });
                ev.push(Event::StepFinished { index: r.index, record: s.clone() });
            }
            ev.push(Event::ScenarioFinished { result: r.clone() });
            if interrupt && r.index == 2 {
                ev.push(Event::Interrupted { signal: "SIGINT".into() });
            }
        }
        ev.push(Event::RunFinished { summary });
        ev
    }

    fn run(opts: HumanOptions, interrupt: bool) -> String {
        let buf = Buf::default();
        let mut rep = HumanReporter::with_draw_target(opts, Box::new(buf.clone()), ProgressDrawTarget::hidden());
        for e in events(interrupt) {
            rep.handle(&e);
        }
        buf.text()
    }

    const PLAIN: &str = "\
PASSED  hello  1.20s
FAILED  write file[template=base]  0.30s  scenarios/files.yaml:12  stdout did not match
FAILED  multi line  1m03s  scenarios/files.yaml:30  stdout did not match
interrupted by SIGINT: finishing cleanup, press Ctrl-C again to exit at once
ERROR   broken provider  0.05s  scenarios/net.yaml:3  connection refused <&> \"q\" 'a' \\0\\u{1b}[31m
SKIPPED needs ports  0.00s  provider lacks capability `ports`
XFAIL   known bug  0.80s  scenarios/bugs.yaml:8  issue #12: exit code lost
XPASS   fixed bug  0.40s  known issue #7 passed
";

    #[test]
    fn plain_mode_lines_then_summary() {
        let opts = HumanOptions { progress: false, color: false, verbose: false };
        let text = run(opts, true);
        let summary = render_summary(&fixture::summary(), false);
        assert_eq!(text, format!("{PLAIN}\n{summary}"), "\n--- got ---\n{text}");
    }

    #[test]
    fn verbose_adds_start_and_step_lines() {
        let opts = HumanOptions { progress: false, color: false, verbose: true };
        let text = run(opts, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "run r-20240101-abcd: 7 scenarios on local, concurrency 4");
        assert_eq!(lines[1], "START   hello");
        assert_eq!(lines[2], "  hello › passed  exec: echo hi  0.10s");
        assert_eq!(lines[4], "PASSED  hello  1.20s");
        assert_eq!(lines[5], "START   write file[template=base]");
        assert!(
            lines.contains(
                &"  write file[template=base] › failed  check content  0.10s  scenarios/files.yaml:12  stdout did not match"
            ),
            "{text}"
        );
        assert_eq!(text.matches("START ").count(), 7);
    }

    #[test]
    fn not_verbose_has_no_start_lines() {
        let text = run(HumanOptions::default(), false);
        assert!(!text.contains("START"), "{text}");
        assert!(!text.contains("interrupted by"), "{text}");
    }

    #[test]
    fn colour_codes_only_with_colour() {
        let text = run(HumanOptions { progress: false, color: true, verbose: false }, false);
        assert!(text.starts_with("\x1b[32mPASSED \x1b[0m hello  1.20s\n"), "{text}");
    }

    #[test]
    fn live_mode_tracks_running_scenarios_and_writes_summary() {
        let buf = Buf::default();
        let opts = HumanOptions { progress: true, color: false, verbose: false };
        let mut rep = HumanReporter::with_draw_target(opts, Box::new(buf.clone()), ProgressDrawTarget::hidden());
        let ev = events(false);
        let mut max_running = 0;
        for e in &ev[..ev.len() - 1] {
            rep.handle(e);
            let live = rep.live.as_ref().unwrap();
            max_running = max_running.max(live.running.len());
            if let Event::StepStarted { index, label, .. } = e {
                let msg = live.running[index].message();
                assert!(msg.ends_with(label.as_str()), "{msg}");
            }
        }
        assert_eq!(max_running, 1);
        let live = rep.live.as_ref().unwrap();
        assert!(live.running.is_empty());
        assert_eq!(live.overall.position(), 7);
        assert_eq!(live.overall.length(), Some(7));
        assert_eq!(live.overall.message(), "1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass");
        // Permanent lines went to the (hidden) live view, not to `out`.
        assert_eq!(buf.text(), "");
        rep.handle(ev.last().unwrap());
        assert!(rep.live.is_none());
        assert_eq!(buf.text(), format!("\n{}", render_summary(&fixture::summary(), false)));
    }

    #[test]
    fn live_line_format() {
        let s = fixture::summary();
        let r = s.results.iter().find(|r| r.index == 1).unwrap();
        assert_eq!(
            finished_line(r, false, true),
            "FAILED  write file[template=base] (0.30s)  scenarios/files.yaml:12  stdout did not match"
        );
    }
}

//! The terminal reporter: a live indicatif view when stdout is a terminal, plain lines
//! otherwise, and the summary at the end.
//!
//! Live view (`progress`): one spinner line per running scenario, `name › current step`, above
//! an overall bar with done/total, pass/fail counts and elapsed time. A step that reports
//! progress (a template build) shows its current build step and the last line of its log:
//! `name › build: python-hello › #4 RUN pip install flask │ Successfully installed flask`.
//! When a scenario ends its line goes away and a permanent `PASSED name (1.20s)` line is
//! printed above the bars, cut to the terminal's width. Nothing is drawn before the run starts
//! (the provider's preparation prints on stderr), and the view goes when the last scenario
//! ends, before the run's cleanup. The bars are drawn on stdout by
//! indicatif; `out` receives the final summary. On Ctrl-C the live view is taken down at once
//! and the rest of the run is reported in lines cut to the width as above it (the notice
//! wrapped between words): cleanup may print, and a spinner redrawn over that left a stale line
//! behind. While the view is up the terminal does not echo `^C` ([`out::NoEchoCtl`]).
//!
//! Plain mode: one line per finished scenario, written to `out` and flushed at once, so CI
//! logs stream:
//!
//! ```text
//! PASSED  hello  1.20s
//! FAILED  write file  0.30s  scenarios/files.yaml:12  stdout: expected "hi", found "hi\n" (…)
//! SKIPPED needs ports  0.00s  provider lacks capability `ports`
//! ```
//!
//! `verbose` adds a `START name` line per scenario, one line per finished step, and the
//! steps of a build as they start. Write errors (a closed pipe) are ignored: reporting must
//! never take the run down.

use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::format::{self, paint, Color};
use super::summary::{self, render_summary, SummaryOptions};
use super::Reporter;
use crate::out;
use crate::results::{Event, Outcome, Phase, ScenarioResult, StepRecord, StepStatus, Totals};

#[derive(Debug, Clone, Copy, Default)]
pub struct HumanOptions {
    /// Show the live indicatif view (stdout is a terminal and no `--no-progress`).
    pub progress: bool,
    /// Use ANSI colours.
    pub color: bool,
    /// Also show scenario starts and every finished step.
    pub verbose: bool,
    /// The terminal's width in columns, to fit lines and the summary; `None`: never cut.
    pub width: Option<usize>,
}

pub struct HumanReporter {
    opts: HumanOptions,
    out: Box<dyn Write + Send>,
    live: Option<Live>,
    names: HashMap<usize, String>,
    /// What each running scenario is doing, for the live line.
    doing: HashMap<usize, Doing>,
    total: usize,
    counts: Totals,
    /// The live view was taken down (an interrupt, or the last scenario's end): the lines that
    /// follow are still for a terminal of `opts.width` columns, which would break them mid-word.
    after_live: bool,
    /// The live view is drawn on the process's own terminal (not a test's).
    terminal: bool,
}

struct Live {
    mp: MultiProgress,
    overall: ProgressBar,
    running: HashMap<usize, ProgressBar>,
    /// Where the view is drawn once the run starts. Until then nothing is drawn: the
    /// provider's preparation prints on stderr, and a bar drawn then (`0/0`) was cut by its
    /// lines and left behind on screen.
    target: Option<ProgressDrawTarget>,
    /// Ctrl-C is not echoed while the view is on the real terminal (see [`out::NoEchoCtl`]).
    _no_echo: Option<out::NoEchoCtl>,
}

/// The current step of a running scenario and, for a build, its current build step and the
/// last line of its log.
#[derive(Default)]
struct Doing {
    step: String,
    stage: Option<String>,
    /// When the current build step started (plain mode prints its time when it ends).
    stage_since: Option<std::time::Instant>,
    tail: Option<String>,
    /// The log that follows is an earlier build's, replayed (`cached: …`): its steps are not
    /// this run's, so plain mode does not print them as such.
    replay: bool,
}

impl Doing {
    fn message(&self) -> String {
        let mut msg = self.step.clone();
        if let Some(stage) = &self.stage {
            msg.push_str(" › ");
            msg.push_str(stage);
        }
        if let Some(tail) = self.tail.as_ref().filter(|t| Some(*t) != self.stage.as_ref()) {
            msg.push_str(" │ ");
            msg.push_str(tail);
        }
        msg
    }
}

/// A build step shorter than this gets no `DONE` line of its own in plain mode (its start
/// line says enough; a Dockerfile's `ENV` and `WORKDIR` lines take milliseconds).
const DONE_AFTER: Duration = Duration::from_secs(1);

/// Whether `stage` is a Dockerfile step (numbered), not a build's header line.
fn is_numbered_stage(stage: &str) -> bool {
    let t = stage.trim_start();
    t.starts_with('#') || t.starts_with('[') || t.starts_with("Step ")
}

/// What names a build step in its `DONE` line: its number (`#4`, `[2/5]`, `Step 3/7`), else
/// its line cut to 60 characters.
fn stage_tag(stage: &str) -> String {
    let t = stage.trim();
    if t.starts_with('#') || t.starts_with('[') {
        return t.split_whitespace().next().unwrap_or(t).to_string();
    }
    if let Some(rest) = t.strip_prefix("Step ") {
        return format!("Step {}", rest.split_whitespace().next().unwrap_or("").trim_end_matches(':'));
    }
    let cut: String = t.chars().take(60).collect();
    if cut.len() < t.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

/// A build's log line worth a line of its own in plain mode: a kept or cached build reused, a
/// build cached for the next run.
fn is_build_notice(line: &str) -> bool {
    ["reusing the kept build ", "reusing the cached build ", "cached: ", "cached as "]
        .iter()
        .any(|p| line.starts_with(p))
}

/// A build log line that starts a build step: `#4 RUN …` (local), `Step 3/7 : RUN …`
/// (Docker's builder), `[2/5] …` (BuildKit and the template build API), or the first line.
pub fn is_build_stage(line: &str) -> bool {
    let t = line.trim_end();
    let numbered = |rest: &str| rest.chars().next().is_some_and(|c| c.is_ascii_digit());
    (t.starts_with('#') && numbered(&t[1..]))
        || (t.starts_with("Step ") && numbered(&t[5..]))
        || (t.starts_with('[') && numbered(&t[1..]) && t.contains('/'))
        || t.starts_with("building template ")
        || t.starts_with("FROM ")
}

impl HumanReporter {
    pub fn new(opts: HumanOptions, out: Box<dyn Write + Send>) -> Self {
        let mut r = Self::with_draw_target(opts, out, ProgressDrawTarget::stdout());
        r.terminal = true;
        r
    }

    /// As [`new`](Self::new), drawing the live view on `target` instead of stdout.
    pub fn with_draw_target(opts: HumanOptions, out: Box<dyn Write + Send>, target: ProgressDrawTarget) -> Self {
        let live = opts.progress.then(|| {
            let mp = MultiProgress::with_draw_target(ProgressDrawTarget::hidden());
            let overall = mp.add(ProgressBar::new(0).with_style(overall_style(opts.color)));
            Live { mp, overall, running: HashMap::new(), target: Some(target), _no_echo: None }
        });
        HumanReporter {
            opts,
            out,
            live,
            names: HashMap::new(),
            doing: HashMap::new(),
            total: 0,
            counts: Totals::default(),
            after_live: false,
            terminal: false,
        }
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

    /// A yellow line about the run itself; on a terminal wrapped between words (the terminal
    /// would break it anywhere), the lines after the first indented.
    fn notice(&mut self, text: &str) {
        let width = if self.live.is_some() || self.after_live { self.opts.width } else { None };
        let text = summary::wrap(text, "", "  ", width);
        // Each line painted on its own: the live view draws between them.
        let painted: Vec<String> = text.lines().map(|l| paint(l, Color::Yellow, self.opts.color)).collect();
        self.line(&painted.join("\n"));
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
        self.doing.insert(index, Doing { step: "starting".into(), ..Default::default() });
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

    fn redraw(&self, index: usize) {
        let (Some(pb), Some(doing)) = (self.live.as_ref().and_then(|l| l.running.get(&index)), self.doing.get(&index))
        else {
            return;
        };
        pb.set_message(doing.message());
    }

    fn step_started(&mut self, index: usize, phase: Phase, label: &str) {
        let label = format::sanitize(label);
        let step = match phase {
            Phase::Steps => label,
            Phase::Setup => format!("setup: {label}"),
            Phase::Finally => format!("finally: {label}"),
            Phase::Cleanup => format!("cleanup: {label}"),
        };
        self.doing.insert(index, Doing { step, ..Default::default() });
        self.redraw(index);
    }

    fn step_progress(&mut self, index: usize, line: &str) {
        let line = format::sanitize(line.trim());
        if line.is_empty() {
            return;
        }
        let stage = is_build_stage(&line);
        let Some(doing) = self.doing.get_mut(&index) else { return };
        let mut ended = None;
        if line.starts_with("cached: ") {
            doing.replay = true;
            ended = doing.stage.take().zip(doing.stage_since.take());
        }
        let replay = doing.replay;
        if stage {
            ended = doing.stage.take().zip(doing.stage_since.take());
            doing.stage = Some(line.clone());
            doing.stage_since = Some(std::time::Instant::now());
            doing.tail = None;
        } else {
            doing.tail = Some(line.clone());
        }
        let step = doing.step.clone();
        self.redraw(index);
        // Plain mode (CI): a build is never silent: each of its steps as it starts, and its
        // time when it ends, as BuildKit's plain progress does; and a build reused.
        if self.live.is_none() {
            let name = self.names.get(&index).map_or_else(|| format!("#{index}"), |n| format::sanitize(n));
            let ended = ended.filter(|(prev, since)| {
                (!replay || !stage) && is_numbered_stage(prev) && since.elapsed() >= DONE_AFTER
            });
            if let Some((prev, since)) = ended {
                self.line(&format!(
                    "  {name} › {step} › {} DONE {}",
                    stage_tag(&prev),
                    format::duration(since.elapsed().as_millis() as u64)
                ));
            }
            if (stage && !replay) || is_build_notice(&line) {
                self.line(&format!("  {name} › {step} › {line}"));
            }
        }
    }

    /// Plain mode: the time of the build step still open when its step ends.
    fn end_stage(&mut self, index: usize) {
        let Some(doing) = self.doing.get_mut(&index) else { return };
        let Some((prev, since)) = doing.stage.take().zip(doing.stage_since.take()) else { return };
        if self.live.is_none() && !doing.replay && is_numbered_stage(&prev) && since.elapsed() >= DONE_AFTER {
            let step = doing.step.clone();
            let name = self.names.get(&index).map_or_else(|| format!("#{index}"), |n| format::sanitize(n));
            self.line(&format!(
                "  {name} › {step} › {} DONE {}",
                stage_tag(&prev),
                format::duration(since.elapsed().as_millis() as u64)
            ));
        }
    }

    fn step_finished(&mut self, index: usize, record: &StepRecord) {
        self.end_stage(index);
        if !self.opts.verbose {
            return;
        }
        let name = self.names.get(&index).map_or_else(|| format!("#{index}"), |n| format::sanitize(n));
        let status = record.status.name();
        let c = match record.status {
            StepStatus::Passed => Color::Green,
            StepStatus::Failed | StepStatus::Error => Color::Red,
            StepStatus::Skipped => Color::Yellow,
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
        if matches!(record.status, StepStatus::Failed | StepStatus::Error) {
            if let Some(exchange) = http_exchange(record) {
                self.line(exchange.trim_end());
            }
        }
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
        self.doing.remove(&r.index);
        // After an interrupt took the live view down, lines stay as they were above it: cut
        // to the terminal's width, not broken by it.
        let live = self.live.is_some() || self.after_live;
        let mut text = finished_line(r, false, live);
        if live {
            if let Some(w) = self.opts.width {
                text = summary::fit(&text, w);
            }
        }
        if self.opts.color {
            // Coloured after cutting, so the escape codes are never cut in half; a line cut
            // inside its label (a terminal of a few columns) is coloured whole.
            let (label, color) = (format!("{:<7}", r.outcome.label()), format::outcome_color(r.outcome));
            text = match text.strip_prefix(&label) {
                Some(rest) => format!("{}{rest}", paint(&label, color, true)),
                None => paint(&text, color, true),
            };
        }
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
        // The last scenario is done: the view goes now, not after the run's cleanup (sweeping
        // sandboxes, removing builds), where a full bar idled and any line cleanup printed on
        // stderr cut through it and left it behind.
        if self.total > 0 && self.counts.total >= self.total && self.live.is_some() {
            self.after_live = true;
            self.finish_live();
        }
    }

    fn finish_live(&mut self) {
        if let Some(live) = self.live.take() {
            for pb in live.running.values() {
                pb.finish_and_clear();
                live.mp.remove(pb);
            }
            live.overall.finish_and_clear();
            live.mp.remove(&live.overall);
            let _ = live.mp.clear();
        }
    }
}

impl Reporter for HumanReporter {
    fn handle(&mut self, event: &Event) {
        match event {
            Event::RunStarted { run_id, provider, total, concurrency } => {
                self.total = *total;
                let counts = self.counts_message();
                if let Some(live) = &mut self.live {
                    live.overall.set_length(*total as u64);
                    live.overall.set_message(counts);
                    if let Some(target) = live.target.take() {
                        if self.terminal {
                            live._no_echo = Some(out::NoEchoCtl::new());
                        }
                        live.mp.set_draw_target(target);
                        live.overall.enable_steady_tick(Duration::from_millis(250));
                    }
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
            Event::StepProgress { index, line } => self.step_progress(*index, line),
            Event::StepFinished { index, record } => self.step_finished(*index, record),
            Event::ScenarioFinished { result } => self.scenario_finished(result),
            Event::Interrupted { signal } => {
                // Plain lines from here on: nothing left on screen to go stale.
                self.after_live |= self.live.is_some();
                self.finish_live();
                let running = self.names.len();
                let text = format!(
                    "interrupted by {signal}: finishing cleanup of {running} running scenario{}, press Ctrl-C again to exit at once",
                    if running == 1 { "" } else { "s" }
                );
                self.notice(&text);
            }
            Event::Stopping { why } => {
                let running = self.names.len();
                let text = match running {
                    0 => format!("stopping after {why}"),
                    1 => format!(
                        "stopping after {why}; 1 running scenario is stopped (its finally and cleanup still run)"
                    ),
                    n => format!(
                        "stopping after {why}; {n} running scenarios are stopped (their finally and cleanup still run)"
                    ),
                };
                self.notice(&text);
            }
            Event::RunFinished { summary } => {
                self.finish_live();
                let _ = writeln!(self.out);
                let opts = SummaryOptions { color: self.opts.color, width: self.opts.width };
                let _ = self.out.write_all(render_summary(summary, opts).as_bytes());
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
    // A pass with failures under `continue_on_error` says so where it says PASSED, in yellow.
    let label = match r.soft_failures_note() {
        Some(note) if r.outcome == Outcome::Passed => paint(&format!("PASSED with {note}"), Color::Yellow, color),
        _ => paint(&format!("{:<7}", r.outcome.label()), format::outcome_color(r.outcome), color),
    };
    let name = format::sanitize(&r.name);
    let duration = format::duration(r.duration_ms);
    let mut text = if live { format!("{label} {name} ({duration})") } else { format!("{label} {name}  {duration}") };
    if r.outcome != Outcome::Passed {
        if let Some(f) = &r.failure {
            text.push_str(&format!("  {}:{}", f.location.file, f.location.line));
        }
    }
    if let Some(reason) = summary::reason(r) {
        text.push_str("  ");
        text.push_str(&format::sanitize(format::first_line(reason)));
    }
    // The first soft failure: where, and why.
    if let (Outcome::Passed, Some(s)) = (r.outcome, r.soft_failure_steps().next()) {
        text.push_str(&format!("  {}:{}", s.location.file, s.location.line));
        if let Some(m) = &s.message {
            text.push_str("  ");
            text.push_str(&format::sanitize(format::first_line(m)));
        }
    } else if let Some(note) = r.soft_failures_note() {
        text.push_str(&format!("  (also {note})"));
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

/// How much of a response body `-v` shows under a failing HTTP step.
const SHOWN_RESPONSE_BODY: usize = 2048;

/// A failing HTTP step's request and response, as `curl -v` shows them (`>` sent, `<`
/// received): method, URL, headers and body each way, bodies cut at 2 KiB. Everything in a
/// record is masked already, and a credential header's value is `***` whatever it was.
fn http_exchange(record: &StepRecord) -> Option<String> {
    if !record.kind.starts_with("http") {
        return None;
    }
    let req = record.outputs.get("request")?;
    let s = |v: &serde_json::Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
    let mut out = String::new();
    let mut line = |prefix: &str, text: &str| {
        out.push_str(&format!("      {prefix} {}\n", format::sanitize(text)));
    };
    line(">", &format!("{} {}", s(&req["method"]), s(&req["url"])));
    for (k, v) in req["headers"].as_object().into_iter().flatten() {
        line(">", &format!("{k}: {}", s(v)));
    }
    if let Some(body) = req["body"].as_str() {
        line(">", "");
        for l in body.lines() {
            line(">", l);
        }
    }
    let Some(status) = record.outputs.get("status") else {
        line("<", "(no response)");
        return Some(out);
    };
    line("<", &format!("{} ({} ms)", s(status), s(&record.outputs["duration_ms"])));
    for (k, v) in record.outputs["headers"].as_object().into_iter().flatten() {
        line("<", &format!("{k}: {}", s(v)));
    }
    let body = record.outputs["body"].as_str().unwrap_or_default();
    if !body.is_empty() {
        line("<", "");
        let mut end = body.len().min(SHOWN_RESPONSE_BODY);
        while !body.is_char_boundary(end) {
            end -= 1;
        }
        for l in body[..end].lines() {
            line("<", l);
        }
        let more = (body.len() - end) as u64 + record.outputs["body_dropped"].as_u64().unwrap_or(0);
        if more > 0 {
            line("<", &format!("… ({more} more bytes)"));
        }
    }
    Some(out)
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
interrupted by SIGINT: finishing cleanup of 0 running scenarios, press Ctrl-C again to exit at once
ERROR   broken provider  0.05s  scenarios/net.yaml:3  connection refused <&> \"q\" 'a' \\0\\u{1b}[31m
SKIPPED needs ports  0.00s  provider lacks capability `ports`
XFAIL   known bug  0.80s  scenarios/bugs.yaml:8  issue #12: exit code lost
XPASS   fixed bug  0.40s  known issue #7 passed
";

    #[test]
    fn plain_mode_lines_then_summary() {
        let opts = HumanOptions { progress: false, color: false, verbose: false, width: None };
        let text = run(opts, true);
        let summary = render_summary(&fixture::summary(), SummaryOptions::default());
        assert_eq!(text, format!("{PLAIN}\n{summary}"), "\n--- got ---\n{text}");
    }

    #[test]
    fn verbose_adds_start_and_step_lines() {
        let opts = HumanOptions { progress: false, color: false, verbose: true, width: None };
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
        let text = run(HumanOptions { progress: false, color: true, verbose: false, width: None }, false);
        assert!(text.starts_with("\x1b[32mPASSED \x1b[0m hello  1.20s\n"), "{text}");
    }

    #[test]
    fn live_mode_tracks_running_scenarios_and_writes_summary() {
        let buf = Buf::default();
        let opts = HumanOptions { progress: true, color: false, verbose: false, width: None };
        let mut rep = HumanReporter::with_draw_target(opts, Box::new(buf.clone()), ProgressDrawTarget::hidden());
        let ev = events(false);
        let mut max_running = 0;
        // Up to the last scenario's end (then the view goes, see below).
        for e in &ev[..ev.len() - 2] {
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
        assert_eq!(live.running.len(), 1);
        assert_eq!(live.overall.position(), 6);
        assert_eq!(live.overall.length(), Some(7));
        assert_eq!(live.overall.message(), "1 passed, 2 failed, 1 error, 1 skipped, 1 xfail");
        // The last scenario's end takes the view down, before the run's cleanup.
        rep.handle(&ev[ev.len() - 2]);
        assert!(rep.live.is_none());
        // Permanent lines went to the (hidden) live view, not to `out`.
        assert_eq!(buf.text(), "");
        rep.handle(ev.last().unwrap());
        assert!(rep.live.is_none());
        assert_eq!(buf.text(), format!("\n{}", render_summary(&fixture::summary(), SummaryOptions::default())));
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

    /// A terminal that keeps what is on screen, as far as indicatif draws: lines, a cursor
    /// row, clearing and moving up.
    #[derive(Debug, Clone, Default)]
    struct Screen(Arc<Mutex<(Vec<String>, usize)>>);

    impl Screen {
        fn visible(&self) -> Vec<String> {
            let s = self.0.lock().unwrap();
            s.0.iter().filter(|l| !l.is_empty()).cloned().collect()
        }
        fn put(&self, text: &str, newline: bool) {
            let mut s = self.0.lock().unwrap();
            let row = s.1;
            while s.0.len() <= row {
                s.0.push(String::new());
            }
            s.0[row].push_str(text);
            if newline {
                s.1 += 1;
            }
        }
    }

    impl indicatif::TermLike for Screen {
        fn width(&self) -> u16 {
            100
        }
        fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            s.1 = s.1.saturating_sub(n);
            Ok(())
        }
        fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
            self.0.lock().unwrap().1 += n;
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, text: &str) -> std::io::Result<()> {
            self.put(text, true);
            Ok(())
        }
        fn write_str(&self, text: &str) -> std::io::Result<()> {
            self.put(text, false);
            Ok(())
        }
        fn clear_line(&self) -> std::io::Result<()> {
            let mut s = self.0.lock().unwrap();
            let row = s.1;
            if let Some(l) = s.0.get_mut(row) {
                l.clear();
            }
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn live_on(screen: &Screen) -> (HumanReporter, Buf) {
        live_at(screen, 100)
    }

    fn live_at(screen: &Screen, width: usize) -> (HumanReporter, Buf) {
        let opts = HumanOptions { progress: true, color: false, verbose: false, width: Some(width) };
        let target = ProgressDrawTarget::term_like_with_hz(Box::new(screen.clone()), 200);
        let out = Buf::default();
        (HumanReporter::with_draw_target(opts, Box::new(out.clone()), target), out)
    }

    /// Issue 18: a stale spinner line stayed on screen after Ctrl-C. The first interrupt
    /// takes the live view down; what follows is plain lines.
    #[test]
    fn ctrl_c_leaves_no_spinner_on_screen() {
        let screen = Screen::default();
        let (mut rep, out) = live_on(&screen);
        rep.handle(&Event::RunStarted { run_id: "r".into(), provider: "local".into(), total: 3, concurrency: 2 });
        for (i, name) in ["first", "second"].iter().enumerate() {
            rep.handle(&Event::ScenarioStarted { index: i, name: name.to_string() });
            rep.handle(&Event::StepStarted { index: i, step: 0, phase: Phase::Steps, label: "exec: sleep 60".into() });
        }
        std::thread::sleep(Duration::from_millis(50));
        let before = screen.visible();
        assert!(before.iter().any(|l| l.contains("first › exec: sleep 60")), "{before:?}");
        rep.handle(&Event::Interrupted { signal: "SIGINT".into() });
        assert!(rep.live.is_none(), "the live view is gone");
        std::thread::sleep(Duration::from_millis(300));
        let after = screen.visible();
        assert!(after.is_empty(), "stale lines: {after:?}");
        // The rest of the run is plain lines on stdout.
        rep.handle(&Event::ScenarioFinished { result: fixture::scenario(0, "first", "a.yaml", Outcome::Error, 10) });
        assert_eq!(
            out.text(),
            "interrupted by SIGINT: finishing cleanup of 2 running scenarios, press Ctrl-C again to exit at once\n\
             ERROR   first (0.01s)\n"
        );
        assert!(screen.visible().is_empty());
    }

    /// Issue 27 item 7: the overall bar was drawn (`0/0`) while the provider prepared, and
    /// the preparation's lines on stderr cut through it, leaving a stray bar on screen.
    /// Nothing is drawn until the run starts.
    #[test]
    fn nothing_is_drawn_before_the_run_starts() {
        let screen = Screen::default();
        let (mut rep, _out) = live_on(&screen);
        std::thread::sleep(Duration::from_millis(600));
        assert!(screen.visible().is_empty(), "drawn before the run started: {:?}", screen.visible());
        rep.handle(&Event::RunStarted { run_id: "r".into(), provider: "local".into(), total: 2, concurrency: 2 });
        std::thread::sleep(Duration::from_millis(600));
        assert!(screen.visible().iter().any(|l| l.contains("0/2")), "{:?}", screen.visible());
    }

    /// Issue 27 item 7: the full bar stayed on screen while the run cleaned up after its last
    /// scenario (sweeping sandboxes, removing builds), and a line cleanup printed on stderr left
    /// it behind. The view goes with the last scenario's end; its line stays.
    #[test]
    fn no_bar_is_left_once_the_last_scenario_ends() {
        let screen = Screen::default();
        let (mut rep, _out) = live_on(&screen);
        rep.handle(&Event::RunStarted { run_id: "r".into(), provider: "local".into(), total: 1, concurrency: 1 });
        rep.handle(&Event::ScenarioStarted { index: 0, name: "only".into() });
        std::thread::sleep(Duration::from_millis(300));
        assert!(screen.visible().iter().any(|l| l.contains("0/1")), "{:?}", screen.visible());
        rep.handle(&Event::ScenarioFinished { result: fixture::scenario(0, "only", "a.yaml", Outcome::Passed, 10) });
        std::thread::sleep(Duration::from_millis(300));
        assert!(rep.live.is_none());
        let after = screen.visible();
        assert!(!after.iter().any(|l| l.contains("1/1") || l.contains("passed, 0 failed")), "a bar is left: {after:?}");
    }

    /// Issue 27 item 7: after Ctrl-C the lines were plain and longer than the terminal, which
    /// broke them mid-word (`press Ctrl-C ag` / `ain to exit`). The notice is wrapped between
    /// words and the scenario lines are cut to the width, as they were above the live view.
    #[test]
    fn after_ctrl_c_no_line_is_wider_than_the_terminal() {
        let screen = Screen::default();
        let (mut rep, out) = live_at(&screen, 60);
        rep.handle(&Event::RunStarted { run_id: "r".into(), provider: "local".into(), total: 2, concurrency: 2 });
        for i in 0..2 {
            rep.handle(&Event::ScenarioStarted { index: i, name: format!("sleeper number {i} with a long name") });
        }
        rep.handle(&Event::Interrupted { signal: "SIGINT".into() });
        let mut r =
            fixture::scenario(0, "sleeper number 0 with a long name", "scenarios/sleepers.yaml", Outcome::Error, 3910);
        r.failure = fixture::summary().results.iter().find(|r| r.outcome == Outcome::Error).unwrap().failure.clone();
        rep.handle(&Event::ScenarioFinished { result: r });
        let text = out.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [
                "interrupted by SIGINT: finishing cleanup of 2 running",
                "  scenarios, press Ctrl-C again to exit at once",
                "ERROR   sleeper number 0 with a long name (3.91s)  scenario…",
            ],
            "{text}"
        );
        // Without a terminal (a CI log) nothing is cut or wrapped.
        let plain = run(HumanOptions { progress: false, color: false, verbose: false, width: Some(60) }, true);
        assert!(plain.contains("of 0 running scenarios, press Ctrl-C again to exit at once\n"), "{plain}");
    }

    /// Item 3 of issue 18: a build shows its current build step and the last line of its log.
    #[test]
    fn a_build_shows_its_current_step_and_log_tail() {
        let screen = Screen::default();
        let (mut rep, _out) = live_on(&screen);
        rep.handle(&Event::RunStarted { run_id: "r".into(), provider: "local".into(), total: 1, concurrency: 1 });
        rep.handle(&Event::ScenarioStarted { index: 0, name: "custom".into() });
        rep.handle(&Event::StepStarted { index: 0, step: 0, phase: Phase::Setup, label: "build: python-hello".into() });
        let message = |rep: &HumanReporter| rep.live.as_ref().unwrap().running[&0].message();
        assert_eq!(message(&rep), "setup: build: python-hello");
        for line in
            ["building template python-hello (sha256:ab) from templates/python-hello", "#3 RUN pip install flask"]
        {
            rep.handle(&Event::StepProgress { index: 0, line: line.into() });
        }
        assert_eq!(message(&rep), "setup: build: python-hello › #3 RUN pip install flask");
        rep.handle(&Event::StepProgress { index: 0, line: "  Collecting flask".into() });
        rep.handle(&Event::StepProgress { index: 0, line: "  Successfully installed flask-3.0".into() });
        assert_eq!(
            message(&rep),
            "setup: build: python-hello › #3 RUN pip install flask │ Successfully installed flask-3.0"
        );
        rep.handle(&Event::StepProgress { index: 0, line: "Step 4/7 : COPY app.py /app/".into() });
        assert_eq!(message(&rep), "setup: build: python-hello › Step 4/7 : COPY app.py /app/");
        // The next step starts clean.
        rep.handle(&Event::StepStarted {
            index: 0,
            step: 1,
            phase: Phase::Steps,
            label: "create: python-hello".into(),
        });
        assert_eq!(message(&rep), "create: python-hello");
        std::thread::sleep(Duration::from_millis(50));
        rep.handle(&Event::StepProgress { index: 0, line: "#1 FROM base".into() });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            screen.visible().iter().any(|l| l.contains("custom › create: python-hello › #1 FROM base")),
            "{:?}",
            screen.visible()
        );
    }

    #[test]
    fn build_stages() {
        for yes in
            ["#4 RUN x", "Step 3/7 : RUN x", "[2/5] RUN x", "building template a (b) from c", "FROM base maps to x"]
        {
            assert!(is_build_stage(yes), "{yes}");
        }
        for no in ["  output", "#!/bin/sh", "Successfully built", "[notice] pip", "# comment"] {
            assert!(!is_build_stage(no), "{no}");
        }
    }

    /// Issue 37 item 2: with `--no-progress` (CI) a 2-minute build printed nothing. Plain mode
    /// shows each step of a build as it starts and its time when it ends, -v or not, and says
    /// when a kept build is reused; a build's other log lines stay out.
    #[test]
    fn plain_mode_prints_build_steps_with_their_times() {
        for verbose in [true, false] {
            let buf = Buf::default();
            let opts = HumanOptions { progress: false, color: false, verbose, width: None };
            let mut rep = HumanReporter::with_draw_target(opts, Box::new(buf.clone()), ProgressDrawTarget::hidden());
            rep.handle(&Event::ScenarioStarted { index: 0, name: "custom".into() });
            rep.handle(&Event::StepStarted { index: 0, step: 0, phase: Phase::Steps, label: "build: web".into() });
            rep.handle(&Event::StepProgress { index: 0, line: "building template web (sha256:ab) from /t".into() });
            rep.handle(&Event::StepProgress { index: 0, line: "#1 ENV A=1".into() });
            rep.handle(&Event::StepProgress { index: 0, line: "#2 RUN make".into() });
            rep.handle(&Event::StepProgress { index: 0, line: "  cc -o app app.c".into() });
            std::thread::sleep(DONE_AFTER);
            rep.handle(&Event::StepProgress { index: 0, line: "#3 COPY app /usr/bin/".into() });
            rep.handle(&Event::StepProgress { index: 0, line: "reusing the kept build /x of sha256:ab".into() });
            std::thread::sleep(DONE_AFTER);
            let record = fixture::step(0, "build: web", StepStatus::Passed, fixture::loc("s.yaml", 3, 5));
            rep.handle(&Event::StepFinished { index: 0, record });
            let text = buf.text();
            assert!(text.contains("  custom › build: web › #2 RUN make\n"), "{text}");
            assert!(text.contains("  custom › build: web › #2 DONE 1."), "{text}");
            assert!(text.contains("  custom › build: web › #1 ENV A=1\n"), "{text}");
            assert!(
                !text.contains("#1 DONE") && !text.contains("(sha256:ab) from /t DONE"),
                "quick steps and headers: {text}"
            );
            assert!(text.contains("  custom › build: web › #3 COPY app /usr/bin/\n"), "{text}");
            assert!(text.contains("  custom › build: web › reusing the kept build /x of sha256:ab\n"), "{text}");
            assert!(text.contains("  custom › build: web › #3 DONE "), "the last step's time, at the end: {text}");
            assert!(text.find("#2 DONE").unwrap() < text.find("#3 COPY").unwrap(), "{text}");
            // A build made before: its replayed log is not shown as this run's steps.
            let buf = Buf::default();
            let mut rep = HumanReporter::with_draw_target(opts, Box::new(buf.clone()), ProgressDrawTarget::hidden());
            rep.handle(&Event::ScenarioStarted { index: 0, name: "again".into() });
            rep.handle(&Event::StepStarted { index: 0, step: 0, phase: Phase::Steps, label: "build: web".into() });
            rep.handle(&Event::StepProgress {
                index: 0,
                line: "cached: web (sha256:ab) was built before; its log:".into(),
            });
            rep.handle(&Event::StepProgress { index: 0, line: "#2 RUN make".into() });
            let record = fixture::step(0, "build: web", StepStatus::Passed, fixture::loc("s.yaml", 3, 5));
            rep.handle(&Event::StepFinished { index: 0, record });
            let text = buf.text();
            assert!(
                text.contains("  again › build: web › cached: web (sha256:ab) was built before; its log:\n"),
                "{text}"
            );
            assert!(!text.contains("#2"), "{text}");
            assert!(!text.contains("cc -o app"), "{text}");
        }
    }
}

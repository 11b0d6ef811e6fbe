//! The HTML report (`--html FILE`): one self-contained page a CI job can upload as an
//! artifact and a reviewer can open anywhere. No network: the style and the little script
//! (filters, links from the timeline) are inline, and the timeline is inline SVG drawn here.
//!
//! What it shows, top to bottom:
//!
//! * the run: id, provider, concurrency, start, duration, sandboxes created and the peak alive;
//!   the totals, each a button that filters the list;
//! * a timeline: one lane per scenario (waiting for a permit, then running, its steps as
//!   segments), and the sandboxes packed into as few lanes as their lives allow, so the number
//!   of sandbox lanes is the most that were alive at once, next to the concurrency limit;
//!   a legend for every colour (step families, outcomes); the filters below hide the lanes
//!   of the scenarios they hide, and move the rest up;
//! * the scenarios, filterable by text (name, tag, file) and by outcome: each with its
//!   outcome, duration and failing step (`file:line`), the failure with expected/found (a diff
//!   for several lines) and its hint, and every step with its rendered arguments, outputs,
//!   message and timings.
//!
//! The filter state lives in the URL's fragment (`#outcome=failed,error&q=files`), so a link
//! can point at a filtered view. Everything in the summary is masked by the runner already;
//! the caller masks the whole page once more (`Masker::mask`), as for every other output.
//! Long output values are cut at [`MAX_VALUE`] characters here; the JSON report and the
//! evidence have them whole.

use std::fmt::Write as _;

use serde_json::Value as JsonValue;
use similar::{ChangeTag, TextDiff};

use super::format;
use super::summary;
use crate::results::{Mismatch, Outcome, RunSummary, ScenarioResult, StepRecord, StepStatus};

/// Longest string value shown in arguments and outputs.
pub const MAX_VALUE: usize = 64 * 1024;

/// Escape text for HTML element content and double-quoted attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.extend(c.escape_debug()),
            c => out.push(c),
        }
    }
    out
}

/// `2024-01-01 12:00:00 UTC` of Unix milliseconds.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let rem = secs % 86_400;
    format!("{} {:02}:{:02}:{:02} UTC", crate::config::utc_date(secs), rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// The page for a run.
pub fn render_html(summary: &RunSummary) -> String {
    let mut results: Vec<&ScenarioResult> = summary.results.iter().collect();
    results.sort_by_key(|r| r.index);
    let t = &summary.totals;
    let lives = sandbox_lives(summary);
    let peak = peak(&lives);
    let bad = t.failed + t.error;
    let title = if bad > 0 {
        format!("scenario-run {}: {} failed, {} error", summary.run_id, t.failed, t.error)
    } else {
        format!("scenario-run {}: {} passed", summary.run_id, t.passed)
    };

    let mut h = String::with_capacity(64 * 1024);
    let _ = write!(
        h,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"generator\" content=\"scenario-run {}\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&title)
    );

    // The run and its totals.
    let _ = write!(
        h,
        "<header>\n<h1>scenario-run <span class=\"run-id\">{}</span>{}</h1>\n<p class=\"meta\">provider <b>{}</b> · concurrency <b>{}</b> · started {} · took <b>{}</b> · {} sandboxes created, at most <b>{}</b> alive at once</p>\n",
        esc(&summary.run_id),
        if summary.interrupted { " <span class=\"badge error\">INTERRUPTED</span>" } else { "" },
        esc(&summary.provider),
        summary.concurrency,
        esc(&utc(summary.started_at_ms)),
        format::duration(summary.duration_ms),
        summary.provider_stats.created,
        peak.max(summary.provider_stats.peak_live as usize)
    );
    h.push_str("<nav class=\"totals\" aria-label=\"totals\">\n");
    let _ = writeln!(h, "<button type=\"button\" class=\"total all\" data-only=\"\">{} total</button>", t.total);
    for (o, n) in t.by_outcome() {
        let _ = writeln!(
            h,
            "<button type=\"button\" class=\"total {c}{zero}\" data-only=\"{c}\">{n} {c}</button>",
            c = o.name(),
            zero = if n == 0 { " zero" } else { "" }
        );
    }
    if let Some(line) = summary::soft_failures_line(t) {
        let _ = writeln!(h, "<span class=\"total soft\">{}</span>", esc(&line));
    }
    h.push_str("</nav>\n</header>\n<main>\n");

    h.push_str(&timeline(summary, &results, &lives, peak));

    // The scenarios.
    h.push_str("<section id=\"scenarios\">\n<h2>Scenarios</h2>\n<div class=\"filters\">\n");
    h.push_str("<input id=\"q\" type=\"search\" placeholder=\"filter by name, tag or file\" aria-label=\"filter by name, tag or file\">\n");
    for o in Outcome::ALL {
        let c = o.name();
        let _ = writeln!(
            h,
            "<label class=\"chip {c}\"><input type=\"checkbox\" name=\"outcome\" value=\"{c}\" checked> {}</label>",
            o.label()
        );
    }
    let _ = writeln!(h, "<span id=\"shown\" aria-live=\"polite\">{n} of {n} shown</span>\n</div>", n = results.len());
    // What needs attention first: failures and errors, then the rest in plan order.
    let mut ordered = results.clone();
    ordered.sort_by_key(|r| (!matches!(r.outcome, Outcome::Failed | Outcome::Error | Outcome::Xpass), r.index));
    for r in &ordered {
        h.push_str(&scenario(r));
    }
    h.push_str("<p id=\"none\" hidden>No scenario matches the filter.</p>\n</section>\n</main>\n");
    let _ = write!(
        h,
        "<footer>scenario-run {} · run {} · secrets are masked as in every report</footer>\n<script>{SCRIPT}</script>\n</body>\n</html>\n",
        env!("CARGO_PKG_VERSION"),
        esc(&summary.run_id)
    );
    h
}

fn scenario(r: &ScenarioResult) -> String {
    let c = r.outcome.name();
    let search = format!("{} {} {} {}", r.name, r.tags.join(" "), r.location.file, r.outcome.label()).to_lowercase();
    let open = matches!(r.outcome, Outcome::Failed | Outcome::Error);
    let mut h = String::new();
    let _ = write!(
        h,
        "<details class=\"scenario {c}\" id=\"s{}\" data-outcome=\"{c}\" data-search=\"{}\"{}>\n<summary><span class=\"badge {c}\">{}</span> <span class=\"name\">{}</span> <span class=\"dur\">{}</span>",
        r.index,
        esc(&search),
        if open { " open" } else { "" },
        r.outcome.label(),
        esc(&r.name),
        format::duration(r.duration_ms)
    );
    // Failures under `continue_on_error`: beside the outcome, as in the terminal.
    if let Some(note) = r.soft_failures_note() {
        let how = if r.outcome == Outcome::Passed { "with" } else { "also" };
        let _ = write!(h, " <span class=\"badge soft\">{how} {}</span>", esc(&note));
    }
    match &r.failure {
        Some(f) => {
            let _ = write!(
                h,
                " <span class=\"where\">{} <code>{}:{}</code></span>",
                esc(&f.step),
                esc(&f.location.file),
                f.location.line
            );
        }
        None => {
            let _ =
                write!(h, " <span class=\"where\"><code>{}:{}</code></span>", esc(&r.location.file), r.location.line);
        }
    }
    h.push_str("</summary>\n<div class=\"body\">\n");
    if let Some(d) = &r.description {
        let _ = writeln!(h, "<p class=\"desc\">{}</p>", esc(d));
    }
    let mut facts = Vec::new();
    if !r.tags.is_empty() {
        facts.push(format!(
            "tags {}",
            r.tags.iter().map(|t| format!("<span class=\"tag\">{}</span>", esc(t))).collect::<String>()
        ));
    }
    if !r.matrix.is_empty() {
        let cells: Vec<String> = r.matrix.iter().map(|(k, v)| format!("{}={}", esc(k), esc(v))).collect();
        facts.push(format!("matrix <code>{}</code>", cells.join(", ")));
    }
    if !r.sandboxes.is_empty() {
        let ids: Vec<String> = r.sandboxes.iter().map(|s| format!("<code>{}</code>", esc(s))).collect();
        facts.push(format!("sandboxes {}", ids.join(" ")));
    }
    if let Some(ki) = &r.known_issue {
        facts.push(format!(
            "known issue {}{}",
            ki.id.as_deref().map(|i| format!("<b>{}</b> ", esc(i))).unwrap_or_default(),
            esc(&ki.reason)
        ));
    }
    if !facts.is_empty() {
        let _ = writeln!(h, "<p class=\"facts\">{}</p>", facts.join(" · "));
    }
    if let Some(reason) = summary::reason(r) {
        let _ = write!(h, "<div class=\"reason {c}\">");
        if let Some(f) = &r.failure {
            let _ = write!(h, "<p class=\"at\">{} at <code>{}</code></p>", esc(&f.step), esc(&f.location.to_string()));
        }
        let _ = write!(h, "<pre class=\"message\">{}</pre>", esc(reason));
        if let Some(m) = r.failure.as_ref().and_then(|f| f.mismatch.as_ref()) {
            h.push_str(&mismatch(m));
        }
        h.push_str("</div>\n");
    }
    if !r.steps.is_empty() {
        h.push_str("<ol class=\"steps\">\n");
        for s in &r.steps {
            h.push_str(&step(s));
        }
        h.push_str("</ol>\n");
    }
    h.push_str("</div>\n</details>\n");
    h
}

fn step(s: &StepRecord) -> String {
    let c = s.status.name();
    let mut h = String::new();
    let attempts = if s.attempts > 1 { format!(" · {} attempts", s.attempts) } else { String::new() };
    let _ = write!(
        h,
        "<li class=\"step {c}\"><details{}><summary><span class=\"status {c}\">{}</span> <span class=\"phase\">{}</span> <span class=\"label\">{}</span> <code class=\"loc\">{}:{}</code> <span class=\"time\">at +{} · {}{attempts}</span></summary>\n<div class=\"step-body\">",
        if matches!(s.status, StepStatus::Failed | StepStatus::Error) { " open" } else { "" },
        c,
        s.phase.name(),
        esc(&s.label),
        esc(&s.location.file),
        s.location.line,
        format::duration(s.start_ms),
        format::duration(s.duration_ms)
    );
    if let Some(m) = &s.message {
        let _ = write!(h, "<pre class=\"message\">{}</pre>", esc(m));
    }
    if let Some(m) = &s.mismatch {
        h.push_str(&mismatch(m));
    }
    if s.kind == "bench" {
        h.push_str(&bench_chart(&s.outputs));
    }
    for (name, value) in [("arguments", &s.args), ("outputs", &s.outputs)] {
        if value.is_null() || value.as_object().is_some_and(|o| o.is_empty()) {
            continue;
        }
        let _ = write!(h, "<h4>{name}</h4>{}", value_html(value));
    }
    h.push_str("</div></details></li>\n");
    h
}

/// A `bench` step's figures as bars (issue 38 item 6): p50, p95 and p99 of the time to
/// interactive and of a command's round trip, on one scale, each labelled in ms.
fn bench_chart(outputs: &JsonValue) -> String {
    let series = [("time to interactive", &outputs["tti"]), ("command round trip", &outputs["round_trip"])];
    let bars: Vec<(String, f64)> = series
        .iter()
        .flat_map(|(name, s)| {
            ["p50", "p95", "p99"].into_iter().filter_map(move |p| Some((format!("{name} {p}"), s[p].as_f64()?)))
        })
        .filter(|(_, v)| v.is_finite() && *v >= 0.0)
        .collect();
    let max = bars.iter().map(|(_, v)| *v).fold(0.0, f64::max);
    if bars.is_empty() || max <= 0.0 {
        return String::new();
    }
    let (row, label_w, bar_w) = (18.0, 190.0, 320.0);
    let height = row * bars.len() as f64 + 4.0;
    let mut svg = format!(
        "<h4>figures</h4><svg class=\"bench-chart\" role=\"img\" aria-label=\"bench percentiles\" width=\"{}\" height=\"{height}\">",
        label_w + bar_w + 90.0
    );
    for (i, (label, v)) in bars.iter().enumerate() {
        let y = i as f64 * row + 2.0;
        let w = (v / max * bar_w).max(1.0);
        let _ = write!(
            svg,
            "<text x=\"0\" y=\"{ty}\" class=\"bench-label\">{}</text><rect x=\"{label_w}\" y=\"{y}\" width=\"{w:.1}\" height=\"{bh}\" class=\"bench-bar\"><title>{} {v:.1} ms</title></rect><text x=\"{tx:.1}\" y=\"{ty}\" class=\"bench-value\">{v:.1} ms</text>",
            esc(label),
            esc(label),
            ty = y + 12.0,
            bh = row - 5.0,
            tx = label_w + w + 4.0,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A value: a table of fields for an object (multi-line strings as blocks), JSON otherwise.
fn value_html(v: &JsonValue) -> String {
    match v {
        JsonValue::Object(map) => {
            let mut h = String::from("<table class=\"kv\">");
            for (k, val) in map {
                let cell = match val {
                    JsonValue::String(s) if s.contains('\n') || s.len() > 120 => format!("<pre>{}</pre>", esc(&cut(s))),
                    JsonValue::String(s) => format!("<code>{}</code>", esc(&format::quote(s))),
                    JsonValue::Object(_) | JsonValue::Array(_) => format!("<pre>{}</pre>", esc(&cut(&pretty(val)))),
                    other => format!("<code>{}</code>", esc(&other.to_string())),
                };
                let _ = write!(h, "<tr><th>{}</th><td>{cell}</td></tr>", esc(k));
            }
            h.push_str("</table>");
            h
        }
        other => format!("<pre>{}</pre>", esc(&cut(&pretty(other)))),
    }
}

fn pretty(v: &JsonValue) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_VALUE {
        return s.to_string();
    }
    let mut end = MAX_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… {} more bytes (in --json and --evidence)", &s[..end], s.len() - end)
}

/// Expected and found: side by side for one-liners, a diff for several lines; then the hint.
fn mismatch(m: &Mismatch) -> String {
    let mut h = String::from("<div class=\"mismatch\">");
    if format::is_multiline(&m.expected) || format::is_multiline(&m.actual) {
        h.push_str("<pre class=\"diff\"><span class=\"hdr\">--- expected</span><span class=\"hdr\">+++ found</span>");
        for change in TextDiff::from_lines(&m.expected, &m.actual).iter_all_changes() {
            let (class, sign) = match change.tag() {
                ChangeTag::Delete => ("del", '-'),
                ChangeTag::Insert => ("ins", '+'),
                ChangeTag::Equal => ("same", ' '),
            };
            let line = change.value();
            let shown = line.strip_suffix('\n').unwrap_or(line);
            let eol = if line.ends_with('\n') { "" } else { " ⏎ no newline at end" };
            // Block spans: one per line, no newline between them (it would be a blank line).
            let _ = write!(h, "<span class=\"{class}\">{sign}{}{eol}</span>", esc(shown));
        }
        h.push_str("</pre>");
    } else {
        let _ = write!(
            h,
            "<table class=\"kv\"><tr><th>expected</th><td><code class=\"exp\">{}</code></td></tr><tr><th>found</th><td><code class=\"got\">{}</code></td></tr></table>",
            esc(&format::quote(&m.expected)),
            esc(&format::quote(&m.actual))
        );
    }
    if let Some(hint) = &m.hint {
        let _ = write!(h, "<p class=\"hint\"><b>hint</b> {}</p>", esc(hint));
    }
    h.push_str("</div>");
    h
}

/// One sandbox's life on the run's clock (milliseconds since the run started).
#[derive(Debug, Clone, PartialEq)]
pub struct Life {
    pub id: String,
    pub scenario: usize,
    pub name: String,
    pub outcome: Outcome,
    pub from: u64,
    pub to: u64,
}

/// Every sandbox of the run: from the start of the `create` (or `connect`) that made it to
/// the end of the `destroy` or `kill` that ended it (a `kill` without an id ends the most
/// recent one alive), else to the end of its scenario.
pub fn sandbox_lives(summary: &RunSummary) -> Vec<Life> {
    let mut lives = Vec::new();
    for r in &summary.results {
        let base = r.started_at_ms.saturating_sub(summary.started_at_ms);
        let end = base + r.duration_ms;
        let mut alive: Vec<Life> = Vec::new();
        for s in &r.steps {
            if s.status != StepStatus::Passed {
                continue;
            }
            match s.kind.as_str() {
                "create" | "connect" => {
                    let Some(id) = s.outputs.get("id").and_then(JsonValue::as_str) else { continue };
                    if alive.iter().chain(&lives).any(|l: &Life| l.id == id && l.scenario == r.index) {
                        continue;
                    }
                    alive.push(Life {
                        id: id.to_string(),
                        scenario: r.index,
                        name: r.name.clone(),
                        outcome: r.outcome,
                        from: base + s.start_ms,
                        to: end,
                    });
                }
                "destroy" | "kill" => {
                    let at = match s.args.get("id").and_then(JsonValue::as_str) {
                        Some(id) => alive.iter().position(|l| l.id == id),
                        None => alive.len().checked_sub(1),
                    };
                    if let Some(i) = at {
                        let mut l = alive.remove(i);
                        l.to = (base + s.start_ms + s.duration_ms).max(l.from);
                        lives.push(l);
                    }
                }
                _ => {}
            }
        }
        lives.extend(alive);
    }
    lives.sort_by_key(|l| (l.from, l.to));
    lives
}

/// The most sandboxes alive at one moment.
pub fn peak(lives: &[Life]) -> usize {
    let mut edges: Vec<(u64, i32)> = lives.iter().flat_map(|l| [(l.from, 1), (l.to, -1)]).collect();
    // An end at the same moment as a start frees its slot first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most.max(0) as usize
}

/// Lives packed into lanes, first fit in order of start: no two lives in a lane overlap, and
/// there are as many lanes as the most lives alive at once.
pub fn lanes(lives: &[Life]) -> Vec<Vec<&Life>> {
    let mut lanes: Vec<Vec<&Life>> = Vec::new();
    for l in lives {
        match lanes.iter_mut().find(|lane| lane.last().is_some_and(|last| last.to <= l.from)) {
            Some(lane) => lane.push(l),
            None => lanes.push(vec![l]),
        }
    }
    lanes
}

/// Tick spacing for about `n` ticks over `span` milliseconds: 1, 2 or 5 times a power of ten.
fn tick_step(span: u64, n: u64) -> u64 {
    let raw = (span / n.max(1)).max(1);
    let mut p = 1u64;
    while p * 10 <= raw {
        p *= 10;
    }
    [1, 2, 5, 10].iter().map(|m| m * p).find(|s| *s >= raw).unwrap_or(10 * p)
}

const LEFT: f64 = 230.0;
const WIDTH: f64 = 1200.0;
const ROW: f64 = 18.0;

fn timeline(summary: &RunSummary, results: &[&ScenarioResult], lives: &[Life], peak: usize) -> String {
    let ran: Vec<&&ScenarioResult> = results.iter().filter(|r| !r.steps.is_empty()).collect();
    let mut h = String::from("<section id=\"timeline\">\n<h2>Timeline</h2>\n");
    if ran.is_empty() {
        h.push_str("<p>No scenario ran.</p>\n</section>\n");
        return h;
    }
    let span = ran
        .iter()
        .map(|r| r.started_at_ms.saturating_sub(summary.started_at_ms) + r.duration_ms)
        .chain(lives.iter().map(|l| l.to))
        .chain([summary.duration_ms])
        .max()
        .unwrap_or(1)
        .max(1);
    let chart = WIDTH - LEFT - 10.0;
    let x = |ms: u64| LEFT + chart * ms as f64 / span as f64;
    let w = |from: u64, to: u64| (chart * to.saturating_sub(from) as f64 / span as f64).max(1.5);
    let packed = lanes(lives);
    let over = peak > summary.concurrency;
    let _ = writeln!(
        h,
        "<p class=\"legend\"><span class=\"key wait\"></span> waiting for a permit <span class=\"key run\"></span> running (steps as segments) <span class=\"key sbx\"></span> a sandbox alive · <b class=\"{}\">at most {peak} sandbox{} alive at once</b>, limit <b>-j {}</b>{}</p>",
        if over { "over" } else { "ok" },
        if peak == 1 { "" } else { "es" },
        summary.concurrency,
        if over { " <b class=\"over\">(over the limit)</b>" } else { "" }
    );
    // What the colours of the step segments and of the bars mean.
    h.push_str("<p class=\"legend steps-legend\">steps:");
    for (family, what) in KIND_FAMILIES {
        let _ = write!(h, " <span class=\"key seg-key k-{family}\"></span> {what}");
    }
    h.push_str(" <span class=\"key seg-key k-failed\"></span> a step that failed or errored</p>\n");
    h.push_str("<p class=\"legend outcomes-legend\">bars and sandboxes take their scenario's outcome:");
    for o in Outcome::ALL {
        let _ = write!(h, " <span class=\"key out-key {}\"></span> {}", o.name(), o.name());
    }
    let _ = writeln!(
        h,
        " · <span id=\"tl-shown\">{n} of {n} scenarios</span> (the filters below apply here too)</p>",
        n = ran.len()
    );

    let rows = ran.len() + packed.len() + 2;
    let height = 30.0 + rows as f64 * ROW + 10.0;
    let _ = writeln!(
        h,
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" aria-label=\"timeline of scenarios and sandboxes\">"
    );
    h.push_str("<defs><pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" class=\"wait\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" class=\"hatch\"/></pattern></defs>\n");
    // Axis.
    let step = tick_step(span, 8);
    let mut t = 0;
    while t <= span {
        let _ = writeln!(
            h,
            "<line class=\"grid\" x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"18\" y2=\"{1:.1}\"/><text class=\"tick\" x=\"{0:.1}\" y=\"13\">{2}</text>",
            x(t),
            height - 6.0,
            format::duration(t)
        );
        t += step;
    }
    let mut y = 24.0;
    let _ = writeln!(h, "<text class=\"group\" x=\"4\" y=\"{:.1}\">scenarios</text>", y + 12.0);
    y += ROW;
    // Each lane in a row of its own, which the filters hide and move up (the script);
    // the sandboxes below move up with them.
    let _ = writeln!(h, "<g class=\"rows\" data-row-height=\"{ROW}\" data-height=\"{height}\">");
    for (row, r) in ran.iter().enumerate() {
        let _ = write!(h, "<g class=\"row\" data-row=\"{row}\" data-scenario=\"s{}\">", r.index);
        let start = r.started_at_ms.saturating_sub(summary.started_at_ms);
        let c = r.outcome.name();
        let label = summary::fit(&r.name, 34);
        let _ = write!(
            h,
            "<a href=\"#s{idx}\" class=\"lane\" data-scenario=\"s{idx}\"><title>{name}: {outcome}, waited {wait}, ran {dur}</title><text class=\"lbl\" x=\"4\" y=\"{ty:.1}\">{label}</text>",
            idx = r.index,
            name = esc(&r.name),
            outcome = r.outcome.label(),
            wait = format::duration(start),
            dur = format::duration(r.duration_ms),
            ty = y + 12.0,
            label = esc(&label)
        );
        if start > 0 {
            let _ = write!(
                h,
                "<rect class=\"waitbar\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"12\" fill=\"url(#hatch)\"/>",
                x(0),
                y + 2.0,
                w(0, start)
            );
        }
        let _ = write!(
            h,
            "<rect class=\"runbar {c}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"14\" rx=\"2\"/>",
            x(start),
            y + 1.0,
            w(start, start + r.duration_ms)
        );
        for s in r.steps.iter().filter(|s| s.status != StepStatus::Skipped && s.duration_ms > 0) {
            let _ = write!(
                h,
                "<rect class=\"seg {} {}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"8\"><title>{} ({}): {}, {}</title></rect>",
                esc(&kind_class(&s.kind)),
                s.status.name(),
                x(start + s.start_ms),
                y + 4.0,
                w(start + s.start_ms, start + s.start_ms + s.duration_ms),
                esc(&s.label),
                s.phase.name(),
                s.status.name(),
                format::duration(s.duration_ms)
            );
        }
        h.push_str("</a></g>\n");
        y += ROW;
    }
    h.push_str("</g>\n<g class=\"sandboxes\">\n");
    let _ = writeln!(
        h,
        "<text class=\"group\" x=\"4\" y=\"{:.1}\">sandboxes ({} lane{})</text>",
        y + 12.0,
        packed.len(),
        if packed.len() == 1 { "" } else { "s" }
    );
    y += ROW;
    for (i, lane) in packed.iter().enumerate() {
        let _ = write!(h, "<text class=\"lbl\" x=\"4\" y=\"{:.1}\">slot {}</text>", y + 12.0, i + 1);
        for l in lane {
            let _ = write!(
                h,
                "<a href=\"#s{idx}\" class=\"life\" data-scenario=\"s{idx}\"><rect class=\"sbx {c}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"14\" rx=\"2\"><title>{id} of {name}: alive {dur} (+{from} to +{to})</title></rect></a>",
                x(l.from),
                y + 1.0,
                w(l.from, l.to),
                idx = l.scenario,
                c = l.outcome.name(),
                id = esc(&l.id),
                name = esc(&l.name),
                dur = format::duration(l.to - l.from),
                from = format::duration(l.from),
                to = format::duration(l.to)
            );
        }
        h.push('\n');
        y += ROW;
    }
    h.push_str("</g>\n</svg>\n</section>\n");
    h
}

/// The families of step kinds the timeline colours apart, as the legend names them.
const KIND_FAMILIES: [(&str, &str); 6] = [
    ("life", "sandbox lifecycle (create, kill, pause, …)"),
    ("build", "build, deploy"),
    ("cmd", "commands (exec, run-code, pty, …)"),
    ("http", "HTTP"),
    ("file", "files"),
    ("check", "checks and the rest"),
];

/// A CSS class for a step kind's colour in the timeline.
fn kind_class(kind: &str) -> String {
    let family = match kind {
        "create" | "connect" | "kill" | "destroy" | "info" | "list" | "set-timeout" | "pause" | "resume"
        | "snapshot" | "delete-snapshot" => "life",
        "build" | "deploy" => "build",
        "exec" | "run-code" | "wait" | "signal" | "process-list" | "pty" => "cmd",
        "http" | "http-get" => "http",
        "write-file" | "read-file" | "files" | "watch" | "watch-events" => "file",
        _ => "check",
    };
    format!("k-{family}")
}

const STYLE: &str = r#"
.bench-chart{display:block;margin:4px 0}.bench-bar{fill:var(--passed)}.bench-label,.bench-value{font-size:12px;fill:var(--fg)}
:root{--passed:#1a7f37;--failed:#cf222e;--error:#a40e26;--skipped:#6e7781;--xfail:#9a6700;--xpass:#8250df;--bg:#fff;--fg:#1f2328;--muted:#59636e;--line:#d1d9e0;--soft:#f6f8fa}
*{box-sizing:border-box}body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header,main,footer{padding:12px 20px}header{border-bottom:1px solid var(--line);background:var(--soft)}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:18px 0 8px}h4{margin:8px 0 2px;font-size:12px;color:var(--muted);text-transform:uppercase}
.run-id{font-family:ui-monospace,monospace;font-weight:normal}.meta{margin:0 0 8px;color:var(--muted)}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{margin:4px 0;padding:6px 8px;background:var(--soft);border:1px solid var(--line);border-radius:4px;white-space:pre-wrap;word-break:break-word;max-height:420px;overflow:auto}
.totals{display:flex;flex-wrap:wrap;gap:6px}.total{border:1px solid var(--line);background:#fff;border-radius:14px;padding:3px 12px;font-weight:600;cursor:pointer}
.total.zero{opacity:.45}.total.passed{color:var(--passed)}.total.failed{color:var(--failed)}.total.error{color:var(--error)}.total.skipped{color:var(--skipped)}.total.xfail{color:var(--xfail)}.total.xpass{color:var(--xpass)}
.badge,.status{display:inline-block;min-width:64px;text-align:center;border-radius:3px;padding:0 5px;color:#fff;font-weight:700;font-size:11.5px;letter-spacing:.3px}
.status{min-width:54px;text-transform:uppercase;font-size:10.5px}
.passed.badge,.status.passed{background:var(--passed)}.failed.badge,.status.failed{background:var(--failed)}.error.badge,.status.error{background:var(--error)}
.skipped.badge,.status.skipped{background:var(--skipped)}.xfail.badge{background:var(--xfail)}.xpass.badge{background:var(--xpass)}
.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin-bottom:10px}#q{flex:1 1 260px;max-width:420px;padding:5px 8px;border:1px solid var(--line);border-radius:4px;font:inherit}
.chip{border:1px solid var(--line);border-radius:12px;padding:1px 8px;font-size:12px;cursor:pointer;user-select:none}#shown{color:var(--muted);font-size:12px}
.scenario{border:1px solid var(--line);border-left:4px solid var(--line);border-radius:4px;margin:6px 0;background:#fff}
.scenario.passed{border-left-color:var(--passed)}.scenario.failed{border-left-color:var(--failed)}.scenario.error{border-left-color:var(--error)}.scenario.skipped{border-left-color:var(--skipped)}.scenario.xfail{border-left-color:var(--xfail)}.scenario.xpass{border-left-color:var(--xpass)}
.scenario>summary{padding:6px 10px;cursor:pointer;display:flex;gap:8px;align-items:baseline;flex-wrap:wrap}.scenario .name{font-weight:600}.dur{color:var(--muted);font-variant-numeric:tabular-nums}.where{color:var(--muted)}
.body{padding:4px 12px 10px}.desc{margin:2px 0 6px}.facts{color:var(--muted);margin:2px 0 6px}.tag{display:inline-block;background:var(--soft);border:1px solid var(--line);border-radius:10px;padding:0 6px;margin:0 2px;font-size:12px}
.reason{border-left:3px solid var(--line);padding:2px 10px;margin:6px 0}.reason.failed,.reason.error{border-left-color:var(--failed)}.reason .at{margin:2px 0}
.badge.soft,.total.soft{background:#fff8c5;color:#7d4e00;border:1px solid #d4a72c}.message{background:#fff5f5;border-color:#ffd7d5}.reason.skipped .message,.reason.xfail .message,.reason.xpass .message{background:var(--soft);border-color:var(--line)}
.mismatch .hint{margin:4px 0;padding:4px 8px;background:#ddf4ff;border:1px solid #b6e3ff;border-radius:4px}
.diff span{display:block;min-height:1.2em}.diff .del{color:var(--failed);background:#ffebe9}.diff .ins{color:var(--passed);background:#dafbe1}.diff .hdr{color:var(--muted)}
code.exp{color:var(--passed)}code.got{color:var(--failed)}
.kv{border-collapse:collapse;margin:2px 0;width:100%}.kv th{text-align:left;vertical-align:top;color:var(--muted);font-weight:500;padding:2px 10px 2px 0;width:1%;white-space:nowrap}.kv td{padding:2px 0}
.steps{list-style:none;padding:0;margin:6px 0}.step>details>summary{cursor:pointer;padding:2px 0}.step .phase{color:var(--muted);font-size:12px;min-width:48px;display:inline-block}.loc,.time{color:var(--muted);font-size:12px}
.step-body{padding:2px 0 6px 24px}
#timeline .chart{width:100%;height:auto;border:1px solid var(--line);border-radius:4px;background:#fff}
.tick{font-size:10px;fill:var(--muted);text-anchor:middle}.grid{stroke:#eaeef2}.group{font-size:11px;font-weight:700;fill:var(--muted);text-transform:uppercase}.lbl{font-size:11px;fill:var(--fg)}
.wait{fill:#eaeef2}.hatch{stroke:#c8d1da;stroke-width:2}.runbar{opacity:.28}.runbar.passed,.sbx.passed{fill:var(--passed)}.runbar.failed,.sbx.failed{fill:var(--failed)}.runbar.error,.sbx.error{fill:var(--error)}
.runbar.skipped,.sbx.skipped{fill:var(--skipped)}.runbar.xfail,.sbx.xfail{fill:var(--xfail)}.runbar.xpass,.sbx.xpass{fill:var(--xpass)}.sbx{opacity:.8}
.seg{fill:#57606a}.seg.k-life{fill:#0969da}.seg.k-build{fill:#bf8700}.seg.k-cmd{fill:#1f2328}.seg.k-http{fill:#8250df}.seg.k-file{fill:#1b7c83}.seg.k-check{fill:#6e7781}.seg.failed,.seg.error{fill:var(--failed)}
a.lane:hover .runbar{opacity:.5}a.life:hover .sbx{opacity:1}
.legend{color:var(--muted);font-size:12.5px}.key{display:inline-block;width:14px;height:10px;border-radius:2px;margin:0 3px 0 10px;vertical-align:middle}.key.wait{background:repeating-linear-gradient(45deg,#eaeef2,#eaeef2 3px,#c8d1da 3px,#c8d1da 5px)}.key.run{background:#1a7f3747}.key.sbx{background:#1a7f37cc}
.key.k-life{background:#0969da}.key.k-build{background:#bf8700}.key.k-cmd{background:#1f2328}.key.k-http{background:#8250df}.key.k-file{background:#1b7c83}.key.k-check{background:#6e7781}.key.k-failed{background:var(--failed)}
.key.out-key{opacity:.8}.key.passed{background:var(--passed)}.key.failed{background:var(--failed)}.key.error{background:var(--error)}.key.skipped{background:var(--skipped)}.key.xfail{background:var(--xfail)}.key.xpass{background:var(--xpass)}
.legend{margin:4px 0}.ok{color:var(--passed)}.over{color:var(--failed)}footer{color:var(--muted);font-size:12px;border-top:1px solid var(--line)}
:target{outline:2px solid #0969da}
"#;

const SCRIPT: &str = r#"
(function(){
  var q=document.getElementById('q'), shown=document.getElementById('shown'), none=document.getElementById('none');
  var boxes=[].slice.call(document.querySelectorAll('input[name=outcome]'));
  var items=[].slice.call(document.querySelectorAll('details.scenario'));
  function apply(save){
    var text=q.value.toLowerCase().trim(), on={}, n=0;
    boxes.forEach(function(b){ if(b.checked) on[b.value]=1; });
    items.forEach(function(s){
      var ok=on[s.dataset.outcome] && (!text || s.dataset.search.indexOf(text)>=0);
      s.hidden=!ok; if(ok) n++;
    });
    shown.textContent=n+' of '+items.length+' shown';
    none.hidden=n>0;
    timeline();
    if(save){
      var picked=boxes.filter(function(b){return b.checked;}).map(function(b){return b.value;});
      var parts=[];
      if(picked.length<boxes.length) parts.push('outcome='+picked.join(','));
      if(text) parts.push('q='+encodeURIComponent(text));
      history.replaceState(null,'',parts.length?'#'+parts.join('&'):location.pathname+location.search);
    }
  }
  // The timeline shows the scenarios the list shows: a hidden one's lane goes and the lanes
  // below move up; its sandboxes go from their slots.
  var svg=document.querySelector('#timeline svg.chart'), tlShown=document.getElementById('tl-shown');
  function timeline(){
    if(!svg) return;
    var rowsG=svg.querySelector('g.rows'), rowH=parseFloat(rowsG.dataset.rowHeight), height=parseFloat(rowsG.dataset.height);
    var rows=[].slice.call(svg.querySelectorAll('g.row')), k=0;
    function visible(id){ var d=document.getElementById(id); return !d || !d.hidden; }
    rows.forEach(function(g){
      var ok=visible(g.dataset.scenario);
      g.style.display=ok?'':'none';
      if(ok){ g.setAttribute('transform','translate(0,'+((k-parseInt(g.dataset.row,10))*rowH)+')'); k++; }
    });
    var gone=(rows.length-k)*rowH;
    svg.querySelector('g.sandboxes').setAttribute('transform','translate(0,'+(-gone)+')');
    [].slice.call(svg.querySelectorAll('a.life')).forEach(function(a){ a.style.display=visible(a.dataset.scenario)?'':'none'; });
    var vb=svg.viewBox.baseVal; svg.setAttribute('viewBox','0 0 '+vb.width+' '+(height-gone));
    if(tlShown) tlShown.textContent=k+' of '+rows.length+' scenarios';
  }
  function load(){
    var h=location.hash.slice(1); if(!h || h.charAt(0)==='s' && /^s\d+$/.test(h)) return;
    h.split('&').forEach(function(p){
      var kv=p.split('='), v=decodeURIComponent(kv[1]||'');
      if(kv[0]==='q') q.value=v;
      if(kv[0]==='outcome'){ var want=v.split(','); boxes.forEach(function(b){ b.checked=want.indexOf(b.value)>=0; }); }
    });
  }
  q.addEventListener('input',function(){apply(true);});
  boxes.forEach(function(b){ b.addEventListener('change',function(){apply(true);}); });
  [].slice.call(document.querySelectorAll('button.total')).forEach(function(btn){
    btn.addEventListener('click',function(){
      var only=btn.dataset.only; boxes.forEach(function(b){ b.checked=!only || b.value===only; }); apply(true);
    });
  });
  [].slice.call(document.querySelectorAll('[data-scenario]')).forEach(function(a){
    a.addEventListener('click',function(){ var d=document.getElementById(a.dataset.scenario); if(d){ d.hidden=false; d.open=true; } });
  });
  load(); apply(false);
  document.documentElement.dataset.ready='1';
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn life(id: &str, from: u64, to: u64) -> Life {
        Life { id: id.into(), scenario: 0, name: "s".into(), outcome: Outcome::Passed, from, to }
    }

    #[test]
    fn lanes_pack_lives_and_count_the_peak() {
        let lives = vec![life("a", 0, 10), life("b", 2, 6), life("c", 6, 12), life("d", 10, 20), life("e", 11, 13)];
        assert_eq!(peak(&lives), 3, "a, c and e overlap at 11");
        let packed = lanes(&lives);
        let ids: Vec<Vec<&str>> = packed.iter().map(|l| l.iter().map(|x| x.id.as_str()).collect()).collect();
        assert_eq!(ids, [vec!["a", "d"], vec!["b", "c"], vec!["e"]]);
        assert_eq!(packed.len(), peak(&lives));
        // Back to back is not overlap.
        assert_eq!(peak(&[life("a", 0, 5), life("b", 5, 9)]), 1);
        assert_eq!(peak(&[]), 0);
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(1234, 8), 200);
        assert_eq!(tick_step(63_000, 8), 10_000);
        assert_eq!(tick_step(5, 8), 1);
    }

    #[test]
    fn a_bench_step_shows_its_percentiles_as_bars() {
        let mut st = fixture::step(0, "bench: 4", StepStatus::Passed, fixture::loc("b.yaml", 3, 5));
        st.kind = "bench".into();
        st.outputs = serde_json::json!({
            "tti": { "p50": 80.0, "p95": 160.0, "p99": 200.0 },
            "round_trip": { "p50": 4.0, "p95": 9.5, "p99": 12.0 },
        });
        let h = step(&st);
        assert_eq!(h.matches("<rect ").count(), 6, "{h}");
        assert!(h.contains("time to interactive p99") && h.contains(">200.0 ms</text>"), "{h}");
        // One scale: the largest figure has the whole width, a smaller one its share.
        assert!(h.contains("width=\"320.0\"") && h.contains("width=\"256.0\""), "{h}");
        // No figures (every iteration failed): no chart.
        st.outputs = serde_json::json!({ "tti": null, "round_trip": null });
        assert!(!step(&st).contains("<svg"));
    }

    #[test]
    fn escaping() {
        assert_eq!(esc("<a href=\"x\">&'</a>\u{1b}"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;\\u{1b}");
    }

    /// The page for the fixture run: every scenario, its outcome as a filterable attribute,
    /// failures open with their file:line, the mismatch, the hint, the steps, and the timeline.
    #[test]
    fn page_has_everything_a_reviewer_needs() {
        let mut s = fixture::summary();
        // Sandbox ids and times, as the runner records them.
        for r in &mut s.results {
            for st in &mut r.steps {
                if st.kind == "create" && st.status == StepStatus::Passed {
                    st.outputs = serde_json::json!({ "id": format!("sb-{}", r.index), "template": "base" });
                }
            }
            if let Some(m) = r.failure.as_mut().and_then(|f| f.mismatch.as_mut()) {
                m.hint = Some("only letter case differs".into());
            }
        }
        let html = render_html(&s);
        assert!(html.starts_with("<!doctype html>"));
        // No network: nothing is fetched (no links, sources, imports or external URLs).
        for needle in ["<link", " src=", "@import", "url(http", "http://", "https://"] {
            assert!(!html.contains(needle), "{needle} in the page");
        }
        assert_eq!(html.matches("<details class=\"scenario ").count(), 7);
        assert!(html.contains("data-outcome=\"failed\""));
        assert!(
            html.contains("<span class=\"where\">check content <code>scenarios/files.yaml:12</code></span>"),
            "{html}"
        );
        assert!(html.contains("<p class=\"hint\"><b>hint</b> only letter case differs</p>"));
        assert!(html.contains("<span class=\"del\">-b</span>") && html.contains("<span class=\"ins\">+B</span>"));
        assert!(html.contains("&lt;&amp;&gt;"), "markup in messages is escaped");
        assert!(!html.contains("<&>"));
        assert!(html.contains("log line 25"), "finally output is there");
        assert!(html.contains("<th>cmd</th><td><code>&quot;cat /tmp/out.txt&quot;</code></td>"), "rendered arguments");
        assert!(html.contains("sandboxes (4 lanes)"), "{html}");
        assert!(html.contains("<b class=\"ok\">at most 4 sandboxes alive at once</b>, limit <b>-j 4</b>"), "{html}");
        // Issue 27 item 6: a legend for every colour a step segment can take, and each
        // scenario's lane in a row the filters can hide.
        for (family, _) in KIND_FAMILIES {
            assert!(html.contains(&format!("<span class=\"key seg-key k-{family}\"></span>")), "{family}");
        }
        for kind in ["create", "build", "exec", "http-get", "write-file", "assert", "set"] {
            let class = kind_class(kind);
            assert!(html.contains(&format!("key seg-key {class}\"")), "{kind}: no legend for {class}");
            assert!(
                STYLE.contains(&format!(".seg.{class}{{")) && STYLE.contains(&format!(".key.{class}{{")),
                "{class}"
            );
        }
        assert!(html.contains("key seg-key k-failed"));
        assert_eq!(
            html.matches("<g class=\"row\" data-row=").count(),
            html.matches("<a href=\"#s").count() - html.matches("class=\"life\"").count()
        );
        // Failures come first in the list.
        let first = html.find("<details class=\"scenario ").unwrap();
        assert!(html[first..].starts_with("<details class=\"scenario failed\""), "{}", &html[first..first + 80]);
    }
}

//! The end-of-run summary, in the order a reader needs it (pytest's shape): the details of
//! every failure, then one line per scenario that did not pass, then the totals.
//!
//! ```text
//! FAILED echo hi › assert-stdout: hi (a.yaml:5:5)
//!   stdout: expected "hi", found "hi\n" (only a trailing newline differs)
//!   expected: "hi"
//!   found:    "hi\n"
//!   hint: only a trailing newline differs: …
//!   finally › exec: cat /tmp/app.log (a.yaml:9:5)
//!     | Serving HTTP on 0.0.0.0 port 8000
//!
//! FAILED   echo hi            0.75s  a.yaml:5  stdout: expected "hi", found "hi\n" (only a…
//! SKIPPED  needs credentials  0.00s            missing credentials [E2B_API_KEY]
//!
//! 0 passed, 1 failed, 0 error, 1 skipped, 0 xfail, 0 xpass in 1.23s
//! ```
//!
//! Passed scenarios are not repeated: the streamed lines (or the live view) showed them. The
//! rows are sorted by outcome (FAILED, ERROR, XPASS, XFAIL, SKIPPED), then by name, so what
//! needs attention comes first and names are easy to find. Rows fit the terminal's width:
//! when the reason would have less than [`MIN_REASON`] columns it goes on a line of its own,
//! and whatever does not fit is cut with `…` (the details above have it in full, wrapped).
//! Without a width (not a terminal, no `COLUMNS`) nothing is cut or wrapped.
//!
//! The details show what `finally` printed (the tail of its commands' output), since
//! `finally: exec: cat /tmp/app.log` is how a scenario says what to look at when it fails.
//!
//! The totals line has a fixed format that tests and CI parse:
//!
//! ```text
//! 3 passed, 2 failed, 1 error, 1 skipped, 0 xfail, 1 xpass in 1.23s
//! ```
//!
//! Every count is always present, in that order. The duration uses the same format as the
//! rows (`0.42s`, `1m03s`, `1h02m03s`). When the run was interrupted a further line
//! `run <run_id> interrupted` follows.

use std::fmt::Write as _;

use super::format::{self, paint, Color};
use crate::results::{
    Captured, CapturedStream, Mismatch, Outcome, Phase, RunSummary, ScenarioResult, StepRecord, Totals,
};

/// Narrower than this, a row's reason goes on a line of its own.
pub const MIN_REASON: usize = 40;
/// The most lines of one `finally` output shown in the details (the tail).
pub const FINALLY_TAIL: usize = 20;

/// How the summary is drawn.
#[derive(Debug, Clone, Copy, Default)]
pub struct SummaryOptions {
    /// ANSI colours.
    pub color: bool,
    /// The terminal's width in columns; `None`: never cut or wrap.
    pub width: Option<usize>,
}

/// Render the summary as text ending with `\n`. With `color` false the text has no ANSI codes.
pub fn render_summary(summary: &RunSummary, opts: SummaryOptions) -> String {
    let color = opts.color;
    let mut results: Vec<&ScenarioResult> = summary.results.iter().filter(|r| r.outcome != Outcome::Passed).collect();
    results
        .sort_by(|a, b| a.outcome.attention_rank().cmp(&b.outcome.attention_rank()).then_with(|| a.name.cmp(&b.name)));

    let mut out = String::new();
    for r in results.iter().filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::Error)) {
        out.push_str(&details(r, opts));
        out.push('\n');
    }
    if !results.is_empty() {
        out.push_str(&rows(&results, opts));
        out.push('\n');
    }
    let line = totals_line(&summary.totals, summary.duration_ms);
    let strict = fail_on_skip_line(summary);
    let bad = summary.totals.failed + summary.totals.error > 0 || summary.interrupted || strict.is_some();
    let _ = writeln!(out, "{}", paint(&line, if bad { Color::Red } else { Color::Green }, color));
    if let Some(line) = skipped_steps_line(&summary.totals) {
        let _ = writeln!(out, "{}", paint(&line, Color::Yellow, color));
    }
    if let Some(line) = soft_failures_line(&summary.totals) {
        let _ = writeln!(out, "{}", paint(&line, Color::Yellow, color));
    }
    if let Some(line) = strict {
        let _ = writeln!(out, "{}", paint(&line, Color::Red, color));
    }
    if summary.interrupted {
        let _ = writeln!(out, "{}", paint(&format!("run {} interrupted", summary.run_id), Color::Yellow, color));
    }
    out
}

/// `N passed, N failed, N error, N skipped, N xfail, N xpass in 1.23s`, without newline;
/// `1 passed (1 with soft failures), …` when passes had failures under `continue_on_error`.
pub fn totals_line(t: &Totals, duration_ms: u64) -> String {
    let counts: Vec<String> = t
        .by_outcome()
        .iter()
        .map(|(o, n)| match o {
            Outcome::Passed if t.passed_with_soft_failures > 0 => {
                format!("{n} passed ({} with soft failures)", t.passed_with_soft_failures)
            }
            _ => format!("{n} {}", o.name()),
        })
        .collect();
    format!("{} in {}", counts.join(", "), format::duration(duration_ms))
}

/// `2 soft failures (steps with continue_on_error)`, when any: failures that did not decide
/// an outcome, said so that a green run does not hide them.
pub fn soft_failures_line(t: &Totals) -> Option<String> {
    crate::results::soft_failures_count(t.soft_failures).map(|n| format!("{n} (steps with continue_on_error)"))
}

/// `3 steps skipped: missing credentials (steps with requires.env)`, when any were: the
/// totals line keeps its fixed format, this one follows it.
pub fn skipped_steps_line(t: &Totals) -> Option<String> {
    let n = t.skipped_steps;
    (n > 0).then(|| {
        format!("{n} step{} skipped: missing credentials (steps with requires.env)", if n == 1 { "" } else { "s" })
    })
}

/// `--fail-on-skip: 1 skipped scenario and 2 skipped steps fail this run`, when the flag was
/// given and anything was skipped.
pub fn fail_on_skip_line(summary: &RunSummary) -> Option<String> {
    let t = &summary.totals;
    if !summary.fail_on_skip || t.skips() == 0 {
        return None;
    }
    let count = |n: usize, what: &str| format!("{n} skipped {what}{}", if n == 1 { "" } else { "s" });
    let mut parts = Vec::new();
    if t.skipped > 0 {
        parts.push(count(t.skipped, "scenario"));
    }
    if t.skipped_steps > 0 {
        parts.push(count(t.skipped_steps, "step"));
    }
    Some(format!("--fail-on-skip: {} fail{} this run", parts.join(" and "), if t.skips() == 1 { "s" } else { "" }))
}

/// The reason shown for a scenario that did not pass: the failure for FAILED and ERROR, the
/// known issue or skip reason for the others.
pub fn reason(r: &ScenarioResult) -> Option<&str> {
    let failure_message = r.failure.as_ref().map(|f| f.message.as_str());
    match r.outcome {
        Outcome::Passed => None,
        Outcome::Failed | Outcome::Error => failure_message.or(r.reason.as_deref()),
        Outcome::Skipped | Outcome::Xfail | Outcome::Xpass => r.reason.as_deref().or(failure_message),
    }
}

/// `text` cut to `width` characters, the last one `…` when cut.
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut t: String = text.chars().take(width.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// One line per scenario that did not pass: outcome, name, duration, `file:line`, reason.
fn rows(results: &[&ScenarioResult], opts: SummaryOptions) -> String {
    let cells: Vec<[String; 5]> = results
        .iter()
        .map(|r| {
            let location = r.failure.as_ref().map(|f| format!("{}:{}", f.location.file, f.location.line));
            [
                r.outcome.label().to_string(),
                format::sanitize(&r.name),
                format::duration(r.duration_ms),
                location.unwrap_or_default(),
                format::sanitize(format::first_line(reason(r).unwrap_or(""))),
            ]
        })
        .collect();
    let widest = |c: usize| cells.iter().map(|row| row[c].chars().count()).max().unwrap_or(0);
    let mut w = [widest(0), widest(1), widest(2), widest(3)];
    // A long name may take at most 40% of a narrow terminal.
    if let Some(width) = opts.width {
        w[1] = w[1].min((width * 2 / 5).max(12));
    }
    let has_location = w[3] > 0;
    let lead = w[0] + 2 + w[1] + 2 + w[2] + if has_location { 2 + w[3] } else { 0 } + 2;
    // Narrow: `file:line` and the reason go on a line of their own, under the name.
    let own_line = opts.width.is_some_and(|width| width < lead + MIN_REASON);
    let indent = w[0] + 2;

    let mut out = String::new();
    for (r, row) in results.iter().zip(&cells) {
        let pad = |s: &str, n: usize| format!("{s}{}", " ".repeat(n.saturating_sub(s.chars().count())));
        let mut line = paint(&pad(&row[0], w[0]), format::outcome_color(r.outcome), opts.color);
        line.push_str("  ");
        let name = match opts.width {
            Some(_) => fit(&row[1], w[1]),
            None => row[1].clone(),
        };
        line.push_str(&pad(&name, w[1]));
        line.push_str("  ");
        line.push_str(&format!("{}{}", " ".repeat(w[2] - row[2].chars().count()), row[2]));
        if has_location && !own_line {
            line.push_str("  ");
            line.push_str(&pad(&row[3], w[3]));
        }
        let reason = &row[4];
        if own_line {
            out.push_str(line.trim_end());
            out.push('\n');
            let below =
                [row[3].as_str(), reason.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>();
            if !below.is_empty() {
                let room = opts.width.unwrap_or(usize::MAX).saturating_sub(indent).max(MIN_REASON);
                let _ = writeln!(out, "{}{}", " ".repeat(indent), fit(&below.join("  "), room));
            }
        } else if reason.is_empty() {
            out.push_str(line.trim_end());
            out.push('\n');
        } else {
            let room = opts.width.map_or(usize::MAX, |width| width.saturating_sub(lead).max(1));
            line.push_str("  ");
            line.push_str(&fit(reason, room));
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

/// The details of a failure: where, the whole message, expected/found with the hint, and
/// what `finally` printed.
fn details(r: &ScenarioResult, opts: SummaryOptions) -> String {
    let color = opts.color;
    let mut out = String::new();
    let title = paint(&format::sanitize(&r.name), Color::Bold, color);
    match &r.failure {
        Some(f) => {
            let head = format!(
                "{} {title} › {} ({})",
                format::outcome_label(r.outcome, color),
                format::sanitize(&f.step),
                f.location
            );
            out.push_str(&wrap(&head, "", "    ", opts.width));
            for line in f.message.lines() {
                out.push_str(&wrap(&format::sanitize(line), "  ", "    ", opts.width));
            }
            if let Some(m) = &f.mismatch {
                let block = format::mismatch(&Mismatch { hint: None, ..m.clone() }, color);
                for line in block.lines() {
                    let _ = writeln!(out, "  {line}");
                }
                if let Some(h) = &m.hint {
                    let hint = format!("{} {}", paint("hint:", Color::Cyan, color), format::sanitize(h));
                    out.push_str(&wrap(&hint, "  ", "        ", opts.width));
                }
            }
            if let Some(c) = &f.captured {
                out.push_str(&captured_output(c, opts));
            }
        }
        None => {
            let head = format!("{} {title} ({})", format::outcome_label(r.outcome, color), r.location);
            out.push_str(&wrap(&head, "", "    ", opts.width));
            if let Some(reason) = &r.reason {
                out.push_str(&wrap(&format::sanitize(reason), "  ", "    ", opts.width));
            }
        }
    }
    for s in r.steps.iter().filter(|s| s.phase == Phase::Finally) {
        out.push_str(&finally_output(s, opts));
    }
    out
}

/// `text` after `first` (the first line's indent), wrapped at spaces to `width` with `rest`
/// before every further line; a word longer than a line stays whole. Ends with `\n`.
pub(crate) fn wrap(text: &str, first: &str, rest: &str, width: Option<usize>) -> String {
    let Some(width) = width else { return format!("{first}{text}\n") };
    // Colour codes take no columns.
    let visible = |s: &str| {
        let (mut n, mut esc) = (0, false);
        for c in s.chars() {
            match (esc, c) {
                (false, '\x1b') => esc = true,
                (true, 'm') => esc = false,
                (true, _) => {}
                _ => n += 1,
            }
        }
        n
    };
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split(' ') {
        if !empty && visible(&line) + 1 + visible(word) > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// What the failing command printed (pytest's "captured stdout"): the tail of each stream
/// that has anything, or one line saying both were empty.
fn captured_output(c: &Captured, opts: SummaryOptions) -> String {
    let mut out = String::new();
    let printed: Vec<&CapturedStream> = c.streams.iter().filter(|s| !s.lines.is_empty()).collect();
    if printed.is_empty() {
        if c.streams.len() > 1 {
            out.push_str("  captured stdout and stderr: empty\n");
        }
        return out;
    }
    for s in printed {
        let _ = writeln!(out, "  {}", paint(&format!("captured {}:", s.name), Color::Cyan, opts.color));
        out.push_str(&tail_lines(&s.lines, s.earlier, opts));
    }
    out
}

/// `    | line` for each line, cut to the width (all of it is in the reports), after a line
/// saying how many came before.
fn tail_lines<S: AsRef<str>>(lines: &[S], earlier: usize, opts: SummaryOptions) -> String {
    let mut out = String::new();
    if earlier > 0 {
        let _ = writeln!(
            out,
            "    | … {earlier} earlier line{} (all of it in --json, --evidence and --html)",
            if earlier == 1 { "" } else { "s" }
        );
    }
    for line in lines {
        let line = format!("    | {}", format::sanitize(line.as_ref()));
        let _ = writeln!(out, "{}", opts.width.map_or_else(|| line.clone(), |w| fit(&line, w)));
    }
    out
}

/// The tail of what a `finally` step printed, or nothing when it printed nothing.
fn finally_output(s: &StepRecord, opts: SummaryOptions) -> String {
    let color = opts.color;
    let streams: Vec<(&str, &str)> = ["stdout", "stderr"]
        .iter()
        .filter_map(|k| s.outputs.get(*k).and_then(|v| v.as_str()).filter(|t| !t.is_empty()).map(|t| (*k, t)))
        .collect();
    let mut out = String::new();
    if streams.is_empty() && s.message.is_none() {
        return out;
    }
    let head = format!("{} › {} ({})", paint("finally", Color::Cyan, color), format::sanitize(&s.label), s.location);
    out.push_str(&wrap(&head, "  ", "      ", opts.width));
    if let Some(m) = &s.message {
        out.push_str(&wrap(&format::sanitize(format::first_line(m)), "    ", "      ", opts.width));
    }
    for (name, text) in &streams {
        if streams.len() > 1 {
            let _ = writeln!(out, "    {name}:");
        }
        let lines: Vec<&str> = text.lines().collect();
        let skip = lines.len().saturating_sub(FINALLY_TAIL);
        // A log line is cut to the width, not wrapped: all of it is in the reports.
        out.push_str(&tail_lines(&lines[skip..], skip, opts));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn plain(width: Option<usize>) -> SummaryOptions {
        SummaryOptions { color: false, width }
    }

    /// Issue 18: the exact summary at 160 columns: details first, then one row per scenario
    /// that did not pass (passed ones are not repeated), sorted by outcome then name.
    #[test]
    fn snapshot_at_160_columns() {
        let text = render_summary(&fixture::summary(), plain(Some(160)));
        let want = "\
FAILED multi line › exec: ls (scenarios/files.yaml:30:7)
  stdout did not match
  see diff
  --- expected
  +++ found
  @@ -1,3 +1,3 @@
   a
  -b
  +B
   c

FAILED write file[template=base] › check content (scenarios/files.yaml:12:7)
  stdout did not match
  expected: \"hello\"
  found:    \"world\"
  finally › exec: cat /tmp/app.log (scenarios/files.yaml:40:5)
    | … 5 earlier lines (all of it in --json, --evidence and --html)
    | log line 6
    | log line 7
    | log line 8
    | log line 9
    | log line 10
    | log line 11
    | log line 12
    | log line 13
    | log line 14
    | log line 15
    | log line 16
    | log line 17
    | log line 18
    | log line 19
    | log line 20
    | log line 21
    | log line 22
    | log line 23
    | log line 24
    | log line 25

ERROR broken provider › create: base (scenarios/net.yaml:3:5)
  connection refused <&> \"q\" 'a' \\0\\u{1b}[31m

FAILED   multi line                 1m03s  scenarios/files.yaml:30  stdout did not match
FAILED   write file[template=base]  0.30s  scenarios/files.yaml:12  stdout did not match
ERROR    broken provider            0.05s  scenarios/net.yaml:3     connection refused <&> \"q\" 'a' \\0\\u{1b}[31m
XPASS    fixed bug                  0.40s                           known issue #7 passed
XFAIL    known bug                  0.80s  scenarios/bugs.yaml:8    issue #12: exit code lost
SKIPPED  needs ports                0.00s                           provider lacks capability `ports`

1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s
";
        assert_eq!(text, want, "\n--- got ---\n{text}");
        assert!(!text.contains("\x1b[1m") && !text.contains("\x1b[0m"));
    }

    /// At 80 columns no line is longer than 80: the reasons go on their own lines, cut to
    /// fit, and the details wrap.
    #[test]
    fn snapshot_at_80_columns() {
        let mut s = fixture::summary();
        for r in &mut s.results {
            if r.name == "needs ports" {
                r.reason =
                    Some("missing credentials [ABX_SANDBOX_API_KEY, ALIBABA_CLOUD_ACCESS_KEY_ID, E2B_API_KEY]".into());
            }
            if let Some(f) = r.failure.as_mut().filter(|_| r.name == "broken provider") {
                f.message = "connection refused: the provider at http://127.0.0.1:3000 did not answer within 30s; is `scenario-run serve` running?".into();
            }
        }
        let text = render_summary(&s, plain(Some(80)));
        let want = "\
ERROR broken provider › create: base (scenarios/net.yaml:3:5)
  connection refused: the provider at http://127.0.0.1:3000 did not answer
    within 30s; is `scenario-run serve` running?

FAILED   multi line                 1m03s
         scenarios/files.yaml:30  stdout did not match
FAILED   write file[template=base]  0.30s
         scenarios/files.yaml:12  stdout did not match
ERROR    broken provider            0.05s
         scenarios/net.yaml:3  connection refused: the provider at http://127.0…
XPASS    fixed bug                  0.40s
         known issue #7 passed
XFAIL    known bug                  0.80s
         scenarios/bugs.yaml:8  issue #12: exit code lost
SKIPPED  needs ports                0.00s
         missing credentials [ABX_SANDBOX_API_KEY, ALIBABA_CLOUD_ACCESS_KEY_ID,…

1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s
";
        let tail = &text[text.find("ERROR broken provider").unwrap()..];
        assert_eq!(tail, want, "\n--- got ---\n{text}");
        for line in text.lines() {
            assert!(line.chars().count() <= 80, "longer than 80 columns: {line:?}");
        }
    }

    #[test]
    fn long_names_are_cut_on_a_narrow_terminal() {
        let mut s = fixture::summary();
        s.results.retain(|r| r.outcome == Outcome::Skipped);
        s.results[0].name = "a scenario whose name is much longer than a narrow terminal allows".into();
        let text = render_summary(&s, plain(Some(60)));
        assert!(text.starts_with("SKIPPED  a scenario whose name i…  0.00s\n         provider lacks"), "{text}");
        let rows = text.split("\n\n").next().unwrap();
        assert!(rows.lines().all(|l| l.chars().count() <= 60), "{text}");
        let unlimited = render_summary(&s, plain(None));
        assert!(
            unlimited.starts_with(
                "SKIPPED  a scenario whose name is much longer than a narrow terminal allows  0.00s  provider"
            ),
            "{unlimited}"
        );
    }

    #[test]
    fn totals_line_format_is_stable() {
        let s = fixture::summary();
        let line = render_summary(&s, plain(None)).lines().last().unwrap().to_string();
        assert_eq!(line, "1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s");
        let t = Totals { total: 0, ..Default::default() };
        assert_eq!(totals_line(&t, 63_000), "0 passed, 0 failed, 0 error, 0 skipped, 0 xfail, 0 xpass in 1m03s");
    }

    #[test]
    fn interrupted_run_says_so() {
        let mut s = fixture::summary();
        s.interrupted = true;
        let text = render_summary(&s, plain(None));
        assert!(text.ends_with("in 1.23s\nrun r-20240101-abcd interrupted\n"), "{text}");
    }

    #[test]
    fn an_all_passing_run_is_only_the_totals() {
        let mut s = fixture::summary();
        s.results.retain(|r| r.outcome == Outcome::Passed);
        s.totals = Totals::from_results(&s.results);
        let text = render_summary(&s, plain(Some(80)));
        assert_eq!(text, "1 passed, 0 failed, 0 error, 0 skipped, 0 xfail, 0 xpass in 1.23s\n");
    }

    #[test]
    fn colour_only_when_asked() {
        let text = render_summary(&fixture::summary(), SummaryOptions { color: true, width: Some(160) });
        assert!(text.contains("\x1b[31mFAILED \x1b[0m"), "{text}");
        assert!(text.contains("\x1b[31m-b\x1b[0m"), "{text}");
        // Alignment is computed before colouring: stripping codes gives the plain summary.
        let stripped = regex::Regex::new("\x1b\\[[0-9;]*m").unwrap().replace_all(&text, "");
        assert_eq!(stripped, render_summary(&fixture::summary(), plain(Some(160))));
    }

    #[test]
    fn fit_cuts_with_an_ellipsis() {
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("héllo wörld", 5), "héll…");
    }

    #[test]
    fn wrap_keeps_long_words_and_indents() {
        assert_eq!(wrap("aa bb cc", "> ", "  ", Some(7)), "> aa bb\n  cc\n");
        assert_eq!(wrap("averyveryverylongword x", "> ", "  ", Some(6)), "> averyveryverylongword\n  x\n");
        assert_eq!(wrap("aa bb cc", "> ", "  ", None), "> aa bb cc\n");
        assert_eq!(wrap("\x1b[36mhint:\x1b[0m ab cd", "", "", Some(8)), "\x1b[36mhint:\x1b[0m ab\ncd\n");
    }
}

//! The end-of-run summary: a table of scenarios, expected-vs-actual blocks for failed
//! comparisons, and the totals line.
//!
//! The totals line has a fixed format that tests and CI parse:
//!
//! ```text
//! 3 passed, 2 failed, 1 error, 1 skipped, 0 xfail, 1 xpass in 1.23s
//! ```
//!
//! Every count is always present, in that order. The duration uses the same format as the
//! table (`0.42s`, `1m03s`, `1h02m03s`). When the run was interrupted a further line
//! `run <run_id> interrupted` follows.

use std::fmt::Write as _;

use super::events::{Outcome, RunSummary, ScenarioResult, Totals};
use super::format::{self, paint, Color};

/// Render the summary as text ending with `\n`. With `color` false the text has no ANSI codes.
pub fn render_summary(summary: &RunSummary, color: bool) -> String {
    let mut results: Vec<&ScenarioResult> = summary.results.iter().collect();
    results.sort_by_key(|r| r.index);

    let mut out = String::new();
    if !results.is_empty() {
        out.push_str(&table(&results, color));
    }

    for r in &results {
        let Some(f) = &r.failure else { continue };
        let Some(m) = &f.mismatch else { continue };
        out.push('\n');
        let _ = writeln!(
            out,
            "{} {} › {} ({})",
            format::outcome_label(r.outcome, color),
            paint(&r.name, Color::Bold, color),
            f.step,
            f.location
        );
        out.push_str(&format::mismatch(m, color));
    }

    if !out.is_empty() {
        out.push('\n');
    }
    let line = totals_line(&summary.totals, summary.duration_ms);
    let bad = summary.totals.failed + summary.totals.error > 0 || summary.interrupted;
    let _ = writeln!(out, "{}", paint(&line, if bad { Color::Red } else { Color::Green }, color));
    if let Some(line) = skipped_steps_line(&summary.totals) {
        let _ = writeln!(out, "{}", paint(&line, Color::Yellow, color));
    }
    if summary.interrupted {
        let _ = writeln!(out, "{}", paint(&format!("run {} interrupted", summary.run_id), Color::Yellow, color));
    }
    out
}

/// `N passed, N failed, N error, N skipped, N xfail, N xpass in 1.23s`, without newline.
pub fn totals_line(t: &Totals, duration_ms: u64) -> String {
    format!(
        "{} passed, {} failed, {} error, {} skipped, {} xfail, {} xpass in {}",
        t.passed,
        t.failed,
        t.error,
        t.skipped,
        t.xfail,
        t.xpass,
        format::duration(duration_ms)
    )
}

/// `3 steps skipped: missing credentials (steps with requires.env)`, when any were: the
/// totals line keeps its fixed format, this one follows it.
pub fn skipped_steps_line(t: &Totals) -> Option<String> {
    let n = t.skipped_steps;
    (n > 0).then(|| {
        format!("{n} step{} skipped: missing credentials (steps with requires.env)", if n == 1 { "" } else { "s" })
    })
}

/// The step, `file:line` and reason cells of a scenario; empty for a clean pass.
fn detail(r: &ScenarioResult) -> [String; 3] {
    let (step, location) = match &r.failure {
        Some(f) => (f.step.clone(), format!("{}:{}", f.location.file, f.location.line)),
        None => (String::new(), String::new()),
    };
    let failure_message = r.failure.as_ref().map(|f| f.message.as_str());
    let note = r.skipped_steps_note();
    let reason = match r.outcome {
        Outcome::Passed => note.as_deref(),
        Outcome::Failed | Outcome::Error => failure_message.or(r.reason.as_deref()),
        Outcome::Skipped | Outcome::Xfail | Outcome::Xpass => r.reason.as_deref().or(failure_message),
    };
    [format::sanitize(&step), location, format::sanitize(format::first_line(reason.unwrap_or("")))]
}

fn table(results: &[&ScenarioResult], color: bool) -> String {
    const HEADER: [&str; 6] = ["scenario", "outcome", "duration", "step", "location", "reason"];
    let rows: Vec<[String; 6]> = results
        .iter()
        .map(|r| {
            let [step, location, reason] = detail(r);
            [
                format::sanitize(&r.name),
                r.outcome.label().to_string(),
                format::duration(r.duration_ms),
                step,
                location,
                reason,
            ]
        })
        .collect();

    // Drop the trailing detail columns when no row has anything in them.
    let mut ncols = HEADER.len();
    while ncols > 3 && rows.iter().all(|row| row[ncols - 1].is_empty()) {
        ncols -= 1;
    }
    let width = |c: usize| rows.iter().map(|row| row[c].chars().count()).chain([HEADER[c].len()]).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols).map(width).collect();

    let mut out = String::new();
    let render_row = |out: &mut String, cells: &[&str], outcome: Option<Outcome>| {
        let mut line = String::new();
        for (c, cell) in cells.iter().enumerate().take(ncols) {
            if c > 0 {
                line.push_str("  ");
            }
            let pad = widths[c].saturating_sub(cell.chars().count());
            let last = c + 1 == ncols;
            // Durations are right-aligned; the last column is never padded.
            let padded = if c == 2 {
                format!("{}{cell}", " ".repeat(pad))
            } else if last {
                cell.to_string()
            } else {
                format!("{cell}{}", " ".repeat(pad))
            };
            let painted = match (c, outcome) {
                (1, Some(o)) => paint(&padded, format::outcome_color(o), color),
                (_, None) => paint(&padded, Color::Bold, color),
                _ => padded,
            };
            line.push_str(&painted);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    };
    render_row(&mut out, &HEADER, None);
    for (r, row) in results.iter().zip(&rows) {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        render_row(&mut out, &cells, Some(r.outcome));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    const EXPECTED: &str = "\
scenario                   outcome  duration  step           location                 reason
hello                      PASSED      1.20s
write file[template=base]  FAILED      0.30s  check content  scenarios/files.yaml:12  stdout did not match
multi line                 FAILED      1m03s  exec: ls       scenarios/files.yaml:30  stdout did not match
broken provider            ERROR       0.05s  create: base   scenarios/net.yaml:3     connection refused <&> \"q\" 'a' \\0\\u{1b}[31m
needs ports                SKIPPED     0.00s                                          provider lacks capability `ports`
known bug                  XFAIL       0.80s  exec: exit 3   scenarios/bugs.yaml:8    issue #12: exit code lost
fixed bug                  XPASS       0.40s                                          known issue #7 passed

FAILED write file[template=base] › check content (scenarios/files.yaml:12:7)
expected: \"hello\"
actual:   \"world\"

FAILED multi line › exec: ls (scenarios/files.yaml:30:7)
--- expected
+++ actual
@@ -1,3 +1,3 @@
 a
-b
+B
 c

1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s
";

    #[test]
    fn snapshot_without_colour() {
        let text = render_summary(&fixture::summary(), false);
        assert_eq!(text, EXPECTED, "\n--- got ---\n{text}");
        assert!(!text.contains("\x1b[1m") && !text.contains("\x1b[0m"));
    }

    #[test]
    fn totals_line_format_is_stable() {
        let s = fixture::summary();
        let line = render_summary(&s, false).lines().last().unwrap().to_string();
        assert_eq!(line, "1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s");
        let t = Totals { total: 0, ..Default::default() };
        assert_eq!(totals_line(&t, 63_000), "0 passed, 0 failed, 0 error, 0 skipped, 0 xfail, 0 xpass in 1m03s");
    }

    #[test]
    fn interrupted_run_says_so() {
        let mut s = fixture::summary();
        s.interrupted = true;
        let text = render_summary(&s, false);
        assert!(text.ends_with("in 1.23s\nrun r-20240101-abcd interrupted\n"), "{text}");
    }

    #[test]
    fn all_passing_table_has_no_detail_columns() {
        let mut s = fixture::summary();
        s.results.retain(|r| r.outcome == Outcome::Passed);
        s.totals = Totals::from_results(&s.results);
        let text = render_summary(&s, false);
        assert_eq!(
            text,
            "scenario  outcome  duration\nhello     PASSED      1.20s\n\n\
             1 passed, 0 failed, 0 error, 0 skipped, 0 xfail, 0 xpass in 1.23s\n"
        );
    }

    #[test]
    fn colour_only_when_asked() {
        let text = render_summary(&fixture::summary(), true);
        assert!(text.contains("\x1b[32mPASSED \x1b[0m"), "{text}");
        assert!(text.contains("\x1b[31m-b\x1b[0m"), "{text}");
        // Alignment is computed before colouring: stripping codes gives the plain table.
        let stripped = regex::Regex::new("\x1b\\[[0-9;]*m").unwrap().replace_all(&text, "");
        assert_eq!(stripped, EXPECTED);
    }
}

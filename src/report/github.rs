//! GitHub Actions: failures as workflow annotations and the run as a job summary.
//!
//! When a run happens in GitHub Actions (`GITHUB_ACTIONS=true`), every FAILED or ERROR
//! scenario (and a strict XPASS) becomes an `::error file=…,line=…,col=…,title=…::message`
//! line on stdout, so the failure shows on the pull request's diff at the step that failed; a
//! non-strict XPASS is a `::warning`, and so is each step that failed under
//! `continue_on_error` (at that step), as GitHub's own `continue-on-error` shows. The job summary (markdown, appended to the file
//! `$GITHUB_STEP_SUMMARY` names) has the totals, a table of what did not pass with
//! `file:line`, and each failure's details (expected/found, hint, what `finally` printed).
//!
//! Both are built from the run summary, which the runner masked; the caller masks them once
//! more before writing. Workflow commands escape `%`, CR and LF in the message (and `:` and
//! `,` in properties) as GitHub documents; markdown table cells escape `|` and take no line
//! breaks, and code blocks use a fence longer than any run of backticks inside.

use std::fmt::Write as _;

use super::format;
use super::summary::{self, totals_line};
use crate::mask::Masker;
use crate::results::{Mismatch, Outcome, Phase, RunSummary, ScenarioResult};
use std::path::PathBuf;

/// The most bytes of job summary written for one run (GitHub takes 1 MiB per step).
pub const MAX_SUMMARY: usize = 900 * 1024;
/// The most bytes of one failure's details in the job summary.
const MAX_DETAILS: usize = 32 * 1024;

/// True when the run's environment says it is a GitHub Actions job.
pub fn in_actions(env: &std::collections::BTreeMap<String, String>) -> bool {
    env.get("GITHUB_ACTIONS").is_some_and(|v| v == "true")
}

/// Escape the message of a workflow command.
fn data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// Escape a property of a workflow command.
fn property(s: &str) -> String {
    data(s).replace(':', "%3A").replace(',', "%2C")
}

/// A path as GitHub wants it in an annotation: relative to the workspace.
fn repo_path(file: &str, workspace: Option<&str>) -> String {
    let file = file.trim_start_matches("./");
    match workspace.and_then(|w| file.strip_prefix(w.trim_end_matches('/'))) {
        Some(rest) => rest.trim_start_matches('/').to_string(),
        None => file.to_string(),
    }
}

/// What a failure says in full: the message, expected/found and the hint.
fn failure_text(r: &ScenarioResult) -> String {
    let mut text = summary::reason(r).unwrap_or_default().to_string();
    if let Some(m) = r.failure.as_ref().and_then(|f| f.mismatch.as_ref()) {
        text.push('\n');
        text.push_str(&format::mismatch(m, false));
    }
    // Control characters shown escaped: a log line cannot drive the runner's terminal.
    text.trim_end().lines().map(format::sanitize).collect::<Vec<_>>().join("\n")
}

/// One workflow command per scenario that failed, in plan order; empty when all passed.
pub fn annotations(summary: &RunSummary, workspace: Option<&str>) -> String {
    let mut results: Vec<&ScenarioResult> = summary.results.iter().collect();
    results.sort_by_key(|r| r.index);
    let mut out = String::new();
    for r in results {
        let strict = r.known_issue.as_ref().is_some_and(|k| k.strict);
        let level = match r.outcome {
            Outcome::Failed | Outcome::Error => "error",
            Outcome::Xpass if strict => "error",
            Outcome::Xpass => "warning",
            _ => continue,
        };
        let (location, step) = match &r.failure {
            Some(f) => (&f.location, format!(" › {}", f.step)),
            None => (&r.location, String::new()),
        };
        let title = format!("{} {}{step}", r.outcome.label(), r.name);
        let _ = writeln!(
            out,
            "::{level} file={},line={},col={},title={}::{}",
            property(&repo_path(&location.file, workspace)),
            location.line,
            location.col,
            property(&title),
            data(&failure_text(r))
        );
    }
    // A step that failed under `continue_on_error` is a warning at that step, as GitHub
    // annotates its own `continue-on-error` steps: the run stays green, the failure is seen.
    let mut soft: Vec<&ScenarioResult> = summary.results.iter().filter(|r| r.soft_failures > 0).collect();
    soft.sort_by_key(|r| r.index);
    for r in soft {
        for s in r.soft_failure_steps() {
            let title = format!("soft failure (continue_on_error) {} › {}", r.name, s.label);
            let message = s.message.as_deref().unwrap_or_default();
            let message: Vec<String> = message.trim_end().lines().map(format::sanitize).collect();
            let _ = writeln!(
                out,
                "::warning file={},line={},col={},title={}::{}",
                property(&repo_path(&s.location.file, workspace)),
                s.location.line,
                s.location.col,
                property(&title),
                data(&message.join("\n"))
            );
        }
    }
    out
}

/// A markdown table cell: one line, `|` escaped, HTML inert.
fn cell(s: &str) -> String {
    let one = summary::fit(&format::sanitize(format::first_line(s)), 300);
    one.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('|', "\\|")
}

/// `text` in a fenced code block whose fence no backtick run inside can close.
fn fenced(text: &str, lang: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}{lang}\n{}\n{fence}\n", text.trim_end())
}

fn cut_bytes(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n… {} more bytes (in the JSON and HTML reports)", &s[..end], s.len() - end)
}

/// The job summary: a markdown page for `$GITHUB_STEP_SUMMARY`.
pub fn step_summary(summary: &RunSummary) -> String {
    let t = &summary.totals;
    let mut md = String::new();
    let state = if t.failed + t.error > 0 {
        format!("❌ {} failed, {} error", t.failed, t.error)
    } else if summary.interrupted {
        "⚠️ interrupted".to_string()
    } else {
        format!("✅ {} passed", t.passed)
    };
    let _ = writeln!(
        md,
        "## scenario-run: {state}\n\nrun `{}` on **{}**, concurrency {}, {}{}\n",
        summary.run_id,
        summary.provider,
        summary.concurrency,
        totals_line(t, summary.duration_ms),
        if summary.interrupted { " (interrupted)" } else { "" }
    );
    md.push_str("| passed | failed | error | skipped | xfail | xpass | time |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (_, n) in t.by_outcome() {
        let _ = write!(md, "| {n} ");
    }
    let _ = writeln!(md, "| {} |\n", format::duration(summary.duration_ms));
    if let Some(line) = summary::soft_failures_line(t) {
        let _ = writeln!(md, "⚠️ {line}\n");
    }
    let mut rows: Vec<&ScenarioResult> = summary.results.iter().filter(|r| r.outcome != Outcome::Passed).collect();
    rows.sort_by_key(|r| (r.outcome.attention_rank(), r.name.clone()));
    if !rows.is_empty() {
        md.push_str("| outcome | scenario | step | where | reason |\n|---|---|---|---|---|\n");
        for r in &rows {
            let (step, at) = match &r.failure {
                Some(f) => (cell(&f.step), format!("`{}:{}`", f.location.file, f.location.line)),
                None => (String::new(), String::new()),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {step} | {at} | {} |",
                r.outcome.label(),
                cell(&r.name),
                cell(summary::reason(r).unwrap_or(""))
            );
        }
        md.push('\n');
    }
    for r in rows.iter().filter(|r| matches!(r.outcome, Outcome::Failed | Outcome::Error)) {
        let mut body = failure_text(r);
        for s in r.steps.iter().filter(|s| s.phase == Phase::Finally) {
            for stream in ["stdout", "stderr"] {
                if let Some(text) = s.outputs.get(stream).and_then(|v| v.as_str()).filter(|t| !t.is_empty()) {
                    let lines: Vec<&str> = text.lines().collect();
                    let tail = lines[lines.len().saturating_sub(summary::FINALLY_TAIL)..].join("\n");
                    let _ = write!(body, "\n\nfinally › {} ({stream}):\n{tail}", s.label);
                }
            }
        }
        let title = match &r.failure {
            Some(f) => format!("{} {} › {} ({})", r.outcome.label(), r.name, f.step, f.location),
            None => format!("{} {}", r.outcome.label(), r.name),
        };
        let lang =
            if r.failure.as_ref().and_then(|f| f.mismatch.as_ref()).is_some_and(is_diff) { "diff" } else { "text" };
        let _ = write!(
            md,
            "<details><summary>{}</summary>\n\n{}\n</details>\n\n",
            cell(&title),
            fenced(&cut_bytes(&body, MAX_DETAILS), lang)
        );
        if md.len() > MAX_SUMMARY {
            md.push_str("… more failures in the JUnit, JSON and HTML reports\n");
            break;
        }
    }
    md
}

fn is_diff(m: &Mismatch) -> bool {
    format::is_multiline(&m.expected) || format::is_multiline(&m.actual)
}

/// Where a run in GitHub Actions reports besides the terminal.
pub struct GithubOut {
    /// `$GITHUB_STEP_SUMMARY`: the job summary is appended to it.
    pub step_summary: Option<PathBuf>,
    /// `$GITHUB_WORKSPACE`: annotation paths are relative to it.
    pub workspace: Option<String>,
}

impl GithubOut {
    /// Failures as workflow commands on stdout, the run as markdown in the job summary; both
    /// masked like every other output.
    pub fn write(&self, summary: &RunSummary, masker: &Masker) -> Result<(), super::ReportError> {
        let _ = crate::out::stdout(&masker.mask(&annotations(summary, self.workspace.as_deref())));
        if let Some(path) = &self.step_summary {
            let md = step_summary(summary);
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| super::ReportError::JobSummary { path: path.clone(), source })?;
            std::io::Write::write_all(&mut f, masker.mask(&md).as_bytes())
                .and_then(|()| std::io::Write::flush(&mut f))
                .map_err(|source| super::ReportError::JobSummary { path: path.clone(), source })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    /// Issue 18: the exact annotations GitHub gets for the fixture run.
    #[test]
    fn annotations_snapshot() {
        let text = annotations(&fixture::summary(), None);
        let want = "\
::error file=scenarios/files.yaml,line=12,col=7,title=FAILED write file[template=base] › check content::stdout did not match%0Aexpected: \"hello\"%0Afound:    \"world\"
::error file=scenarios/files.yaml,line=30,col=7,title=FAILED multi line › exec%3A ls::stdout did not match%0Asee diff%0A--- expected%0A+++ found%0A@@ -1,3 +1,3 @@%0A a%0A-b%0A+B%0A c
::error file=scenarios/net.yaml,line=3,col=5,title=ERROR broken provider › create%3A base::connection refused <&> \"q\" 'a' \\0\\u{1b}[31m
::error file=scenarios/bugs.yaml,line=1,col=1,title=XPASS fixed bug::known issue #7 passed
";
        assert_eq!(text, want, "\n--- got ---\n{text}");
    }

    #[test]
    fn escaping_and_paths() {
        assert_eq!(data("50% a\r\nb"), "50%25 a%0D%0Ab");
        assert_eq!(property("a:b,c%"), "a%3Ab%2Cc%25");
        assert_eq!(
            repo_path("/home/runner/work/r/r/scenarios/a.yaml", Some("/home/runner/work/r/r")),
            "scenarios/a.yaml"
        );
        assert_eq!(repo_path("./scenarios/a.yaml", Some("/w")), "scenarios/a.yaml");
    }

    #[test]
    fn a_non_strict_xpass_is_a_warning() {
        let mut s = fixture::summary();
        for r in &mut s.results {
            if let Some(k) = &mut r.known_issue {
                k.strict = false;
            }
        }
        assert!(
            annotations(&s, None).contains("::warning file=scenarios/bugs.yaml,line=1,col=1,title=XPASS fixed bug::")
        );
    }

    /// The job summary: totals, a table of what did not pass, each failure's details.
    #[test]
    fn step_summary_snapshot() {
        let md = step_summary(&fixture::summary());
        let head = "\
## scenario-run: ❌ 2 failed, 1 error

run `r-20240101-abcd` on **local**, concurrency 4, 1 passed, 2 failed, 1 error, 1 skipped, 1 xfail, 1 xpass in 1.23s

| passed | failed | error | skipped | xfail | xpass | time |
|---:|---:|---:|---:|---:|---:|---:|
| 1 | 2 | 1 | 1 | 1 | 1 | 1.23s |

| outcome | scenario | step | where | reason |
|---|---|---|---|---|
| FAILED | multi line | exec: ls | `scenarios/files.yaml:30` | stdout did not match |
| FAILED | write file[template=base] | check content | `scenarios/files.yaml:12` | stdout did not match |
| ERROR | broken provider | create: base | `scenarios/net.yaml:3` | connection refused &lt;&amp;&gt; \"q\" 'a' \\0\\u{1b}[31m |
| XPASS | fixed bug |  |  | known issue #7 passed |
| XFAIL | known bug | exec: exit 3 | `scenarios/bugs.yaml:8` | issue #12: exit code lost |
| SKIPPED | needs ports |  |  | provider lacks capability `ports` |

<details><summary>FAILED multi line › exec: ls (scenarios/files.yaml:30:7)</summary>

```diff
stdout did not match
see diff
--- expected
+++ found
@@ -1,3 +1,3 @@
 a
-b
+B
 c
```

</details>

<details><summary>FAILED write file[template=base] › check content (scenarios/files.yaml:12:7)</summary>

```text
stdout did not match
expected: \"hello\"
found:    \"world\"

finally › exec: cat /tmp/app.log (stdout):
log line 6
";
        assert!(md.starts_with(head), "\n--- got ---\n{md}");
        assert!(md.contains("log line 25\n```\n\n</details>\n"), "{md}");
    }

    #[test]
    fn a_fence_outlasts_backticks_inside() {
        assert_eq!(fenced("a ``` b", "text"), "````text\na ``` b\n````\n");
        assert_eq!(fenced("plain", ""), "```\nplain\n```\n");
    }
}

//! JUnit XML for CI systems (Jenkins, GitLab, GitHub test reporters), in the common
//! Ant/Surefire dialect, written by hand.
//!
//! Shape:
//!
//! ```text
//! <testsuites name="scenario-run" tests failures errors skipped time>
//!   <testsuite name="scenario-run" tests failures errors skipped time timestamp hostname>
//!     <properties> run_id, provider, interrupted, skipped_steps </properties>
//!     <testcase name classname file line time>        one per scenario, by index
//!       <failure message type>…</failure>              FAILED, and XPASS of a strict known issue
//!       <error message type>…</error>                  ERROR
//!       <skipped message="…"/>                         SKIPPED; XFAIL as `xfail: reason`
//!       <system-out>step log, captured stdout</system-out>
//!       <system-err>captured stderr</system-err>        when the failing command wrote any
//!     </testcase>
//!   </testsuite>
//! </testsuites>
//! ```
//!
//! A non-strict XPASS counts as a pass (its system-out says so). `classname` is the scenario
//! file without extension, `/` replaced by `.`. `timestamp` is UTC without a zone suffix, as
//! the Ant schema requires. Text and attributes are escaped and characters illegal in XML 1.0
//! (most C0 controls, U+FFFE, U+FFFF) are dropped; no CDATA is used.

use std::io::{self, Write};

use super::format;
use crate::results::{Outcome, Phase, RunSummary, ScenarioResult, StepStatus};

/// Write the whole JUnit document for a run.
pub fn write_junit(summary: &RunSummary, w: &mut impl Write) -> io::Result<()> {
    let mut results: Vec<&ScenarioResult> = summary.results.iter().collect();
    results.sort_by_key(|r| r.index);

    let tests = results.len();
    let failures = results.iter().filter(|r| kind(r) == Kind::Failure).count();
    let errors = results.iter().filter(|r| kind(r) == Kind::Error).count();
    let skipped = results.iter().filter(|r| kind(r) == Kind::Skipped).count();
    let time = seconds(summary.duration_ms);

    writeln!(w, r#"<?xml version="1.0" encoding="UTF-8"?>"#)?;
    writeln!(
        w,
        r#"<testsuites name="scenario-run" tests="{tests}" failures="{failures}" errors="{errors}" skipped="{skipped}" time="{time}">"#
    )?;
    write!(
        w,
        r#"  <testsuite name="scenario-run" tests="{tests}" failures="{failures}" errors="{errors}" skipped="{skipped}" time="{time}" timestamp="{}""#,
        timestamp(summary.started_at_ms)
    )?;
    if let Some(host) = hostname() {
        write!(w, r#" hostname="{}""#, attr(&host))?;
    }
    writeln!(w, ">")?;
    writeln!(w, "    <properties>")?;
    let skipped_steps = summary.totals.skipped_steps.to_string();
    let soft_failures = summary.totals.soft_failures.to_string();
    for (name, value) in [
        ("run_id", summary.run_id.as_str()),
        ("provider", summary.provider.as_str()),
        ("interrupted", if summary.interrupted { "true" } else { "false" }),
        ("skipped_steps", skipped_steps.as_str()),
        ("soft_failures", soft_failures.as_str()),
    ] {
        writeln!(w, r#"      <property name="{name}" value="{}"/>"#, attr(value))?;
    }
    writeln!(w, "    </properties>")?;
    for r in results {
        testcase(r, w)?;
    }
    writeln!(w, "  </testsuite>")?;
    writeln!(w, "</testsuites>")?;
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Pass,
    Failure,
    Error,
    Skipped,
}

fn kind(r: &ScenarioResult) -> Kind {
    match r.outcome {
        Outcome::Passed => Kind::Pass,
        Outcome::Failed => Kind::Failure,
        Outcome::Xpass if r.known_issue.as_ref().is_some_and(|k| k.strict) => Kind::Failure,
        Outcome::Xpass => Kind::Pass,
        Outcome::Error => Kind::Error,
        Outcome::Skipped | Outcome::Xfail => Kind::Skipped,
    }
}

fn testcase(r: &ScenarioResult, w: &mut impl Write) -> io::Result<()> {
    writeln!(
        w,
        r#"    <testcase name="{}" classname="{}" file="{}" line="{}" time="{}">"#,
        attr(&r.name),
        attr(&classname(&r.location.file)),
        attr(&r.location.file),
        r.location.line,
        seconds(r.duration_ms)
    )?;
    // Failures under `continue_on_error`: JUnit has no "passed with warnings", so a property
    // readers can count, and the steps at the top of its log.
    if r.soft_failures > 0 {
        writeln!(w, "      <properties>")?;
        writeln!(w, r#"        <property name="soft_failures" value="{}"/>"#, r.soft_failures)?;
        writeln!(w, "      </properties>")?;
    }
    let reason = r.reason.as_deref().unwrap_or("");
    match kind(r) {
        Kind::Pass => {}
        Kind::Skipped => {
            let message = if r.outcome == Outcome::Xfail { format!("xfail: {reason}") } else { reason.to_string() };
            writeln!(w, r#"      <skipped message="{}"/>"#, attr(&message))?;
        }
        k @ (Kind::Failure | Kind::Error) => {
            let tag = if k == Kind::Error { "error" } else { "failure" };
            let (message, text) = failure_text(r);
            let ty = failure_type(r);
            writeln!(
                w,
                r#"      <{tag} message="{}" type="{}">{}</{tag}>"#,
                attr(&message),
                attr(&ty),
                text_escape(&text)
            )?;
        }
    }
    let mut out = step_log(r);
    out.push_str(&captured(r, "stdout"));
    writeln!(w, "      <system-out>{}</system-out>", text_escape(&out))?;
    let err = captured(r, "stderr");
    if !err.is_empty() {
        writeln!(w, "      <system-err>{}</system-err>", text_escape(&err))?;
    }
    writeln!(w, "    </testcase>")?;
    Ok(())
}

/// The `message` attribute (one line) and the element text (location, message, mismatch).
fn failure_text(r: &ScenarioResult) -> (String, String) {
    match &r.failure {
        Some(f) => {
            let mut text = format!("{}: {}\n{}\n", f.location, f.step, f.message);
            if let Some(m) = &f.mismatch {
                text.push_str(&format::mismatch(m, false));
            }
            (format::first_line(&f.message).to_string(), text)
        }
        None => {
            let message = r.reason.clone().unwrap_or_else(|| format!("scenario {}", r.outcome.label()));
            let text = format!("{}: {}\n{message}\n", r.location, r.name);
            (format::first_line(&message).to_string(), text)
        }
    }
}

/// The failing step's kind (`exec`, `create`…), else the outcome.
fn failure_type(r: &ScenarioResult) -> String {
    let step = r.failure.as_ref().and_then(|f| r.steps.iter().find(|s| s.location == f.location));
    match (step, r.outcome) {
        (Some(s), _) => s.kind.clone(),
        (None, Outcome::Xpass) => "xpass".to_string(),
        (None, o) => o.label().to_lowercase(),
    }
}

/// One line per step, then the outputs of the steps that did not pass.
fn step_log(r: &ScenarioResult) -> String {
    let mut out = String::new();
    if let Some(note) = r.skipped_steps_note() {
        out.push_str(&format!("{note}\n"));
    }
    if let Some(note) = r.soft_failures_note() {
        let how = if r.outcome == Outcome::Passed { "PASSED with" } else { "also" };
        out.push_str(&format!("{how} {note} (continue_on_error):\n"));
        for s in r.soft_failure_steps() {
            out.push_str(&format!("  {} ({}): {}\n", s.label, s.location, s.message.as_deref().unwrap_or_default()));
        }
    }
    if r.outcome == Outcome::Xpass {
        let strict = r.known_issue.as_ref().is_some_and(|k| k.strict);
        out.push_str(&format!(
            "XPASS: passed although marked as a known issue{}\n",
            if strict { " (strict: counted as a failure)" } else { "" }
        ));
    }
    for s in &r.steps {
        let status = format!("{:?}", s.status).to_uppercase();
        out.push_str(&format!(
            "{status:<7} [{}] {} ({}, {})",
            format!("{:?}", s.phase).to_lowercase(),
            s.label,
            s.location,
            format::duration(s.duration_ms)
        ));
        if s.attempts > 1 {
            out.push_str(&format!(" ({} attempts)", s.attempts));
        }
        if let Some(m) = &s.message {
            out.push_str(": ");
            out.push_str(m);
        }
        out.push('\n');
    }
    // A step with no outputs (an assertion) has nothing to show here: its command's streams
    // are under "captured" below.
    for s in
        r.steps.iter().filter(|s| matches!(s.status, StepStatus::Failed | StepStatus::Error) && !s.outputs.is_null())
    {
        out.push_str(&format!("\n--- outputs of {} ({}) ---\n", s.label, s.location));
        out.push_str(&serde_json::to_string_pretty(&s.outputs).unwrap_or_default());
        out.push('\n');
    }
    // What `finally` printed (`finally: exec: cat /tmp/app.log` is how a scenario says what to
    // look at), as text, for every scenario.
    for s in r.steps.iter().filter(|s| s.phase == Phase::Finally) {
        for stream in ["stdout", "stderr"] {
            let Some(text) = s.outputs.get(stream).and_then(|v| v.as_str()).filter(|t| !t.is_empty()) else {
                continue;
            };
            out.push_str(&format!("\n--- finally › {} ({}): {stream} ---\n{text}", s.label, s.location));
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out
}

/// What the terminal shows under the failure as "captured stdout" (or stderr): the tail of
/// what the failing command printed, or the command an assertion checked; empty when nothing.
fn captured(r: &ScenarioResult, stream: &str) -> String {
    let Some((f, c)) = r.failure.as_ref().and_then(|f| Some((f, f.captured.as_ref()?))) else { return String::new() };
    let Some(s) = c.streams.iter().find(|s| s.name == stream && !s.lines.is_empty()) else { return String::new() };
    let mut out = format!("\n--- captured {stream} of {} ({}) ---\n", f.step, f.location);
    if s.earlier > 0 {
        out.push_str(&format!("… {} earlier lines (all of it in --json, --evidence and --html)\n", s.earlier));
    }
    for line in &s.lines {
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// `scenarios/net/dns.yaml` → `scenarios.net.dns`.
fn classname(file: &str) -> String {
    let file = file.trim_start_matches("./").replace('\\', "/");
    let stem = match file.rfind('.') {
        Some(dot) if dot > file.rfind('/').map_or(0, |s| s + 1) => &file[..dot],
        _ => &file[..],
    };
    stem.trim_matches('/').replace('/', ".")
}

fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Unix milliseconds → `YYYY-MM-DDTHH:MM:SS` in UTC.
fn timestamp(ms: u64) -> String {
    let secs = ms / 1000;
    let rem = secs % 86_400;
    let date = crate::config::utc_date(secs);
    format!("{date}T{:02}:{:02}:{:02}", rem / 3600, (rem % 3600) / 60, rem % 60)
}

fn hostname() -> Option<String> {
    // What gethostname(2) reads on Linux: the UTS node name.
    let name = rustix::system::uname().nodename().to_string_lossy().into_owned();
    (!name.is_empty()).then_some(name)
}

fn legal_xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// `s` without the characters XML does not allow, each character of `refs` written as its
/// reference.
fn escape(s: &str, refs: &[(char, &str)]) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().filter(|&c| legal_xml_char(c)) {
        match refs.iter().find(|(r, _)| *r == c) {
            Some((_, reference)) => out.push_str(reference),
            None => out.push(c),
        }
    }
    out
}

/// Escape element text.
fn text_escape(s: &str) -> String {
    // A bare CR would be normalised away by parsers.
    escape(s, &[('&', "&amp;"), ('<', "&lt;"), ('>', "&gt;"), ('\r', "&#13;")])
}

/// Escape an attribute value (double-quoted); whitespace controls kept as character
/// references so attribute normalisation does not turn them into spaces.
fn attr(s: &str) -> String {
    let refs = [
        ('&', "&amp;"),
        ('<', "&lt;"),
        ('>', "&gt;"),
        ('"', "&quot;"),
        ('\'', "&apos;"),
        ('\n', "&#10;"),
        ('\r', "&#13;"),
        ('\t', "&#9;"),
    ];
    escape(s, &refs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn render(summary: &RunSummary) -> String {
        let mut buf = Vec::new();
        write_junit(summary, &mut buf).unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn parses_with_correct_counts() {
        let xml = render(&fixture::summary());
        let doc = roxmltree::Document::parse(&xml).unwrap_or_else(|e| panic!("{e}\n{xml}"));
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "testsuites");
        // 7 scenarios: 2 FAILED + strict XPASS = 3 failures, 1 error, SKIPPED + XFAIL = 2 skipped.
        for el in [root, root.first_element_child().unwrap()] {
            assert_eq!(el.attribute("tests"), Some("7"));
            assert_eq!(el.attribute("failures"), Some("3"));
            assert_eq!(el.attribute("errors"), Some("1"));
            assert_eq!(el.attribute("skipped"), Some("2"));
            assert_eq!(el.attribute("time"), Some("1.234"));
        }
        let suite = root.first_element_child().unwrap();
        assert_eq!(suite.attribute("name"), Some("scenario-run"));
        assert_eq!(suite.attribute("timestamp"), Some("2023-11-14T22:13:20"));

        let cases: Vec<_> = suite.children().filter(|n| n.has_tag_name("testcase")).collect();
        assert_eq!(cases.len(), 7);
        let names: Vec<_> = cases.iter().map(|c| c.attribute("name").unwrap()).collect();
        assert_eq!(names[0], "hello");
        assert_eq!(names[6], "fixed bug");
        let count = |tag: &str| cases.iter().filter(|c| c.children().any(|n| n.has_tag_name(tag))).count();
        assert_eq!(count("failure"), 3);
        assert_eq!(count("error"), 1);
        assert_eq!(count("skipped"), 2);
        assert_eq!(count("system-out"), 7);

        let props: Vec<_> = suite
            .descendants()
            .filter(|n| n.has_tag_name("property"))
            .map(|n| (n.attribute("name").unwrap(), n.attribute("value").unwrap()))
            .collect();
        assert_eq!(
            props,
            [
                ("run_id", "r-20240101-abcd"),
                ("provider", "local"),
                ("interrupted", "false"),
                ("skipped_steps", "0"),
                ("soft_failures", "0")
            ]
        );
    }

    #[test]
    fn failure_names_the_step_location_and_the_mismatch() {
        let xml = render(&fixture::summary());
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let case = doc.descendants().find(|n| n.attribute("name") == Some("write file[template=base]")).unwrap();
        assert_eq!(case.attribute("classname"), Some("scenarios.files"));
        assert_eq!(case.attribute("file"), Some("scenarios/files.yaml"));
        assert_eq!(case.attribute("line"), Some("1"));
        assert_eq!(case.attribute("time"), Some("0.300"));
        let failure = case.children().find(|n| n.has_tag_name("failure")).unwrap();
        assert_eq!(failure.attribute("message"), Some("stdout did not match"));
        let text = failure.text().unwrap();
        assert!(text.starts_with("scenarios/files.yaml:12:7: check content\n"), "{text}");
        assert!(text.contains("expected: \"hello\"\nfound:    \"world\""), "{text}");
        let out = case.children().find(|n| n.has_tag_name("system-out")).unwrap().text().unwrap();
        assert!(
            out.contains("FAILED  [steps] check content (scenarios/files.yaml:12:7, 0.10s): stdout did not match"),
            "{out}"
        );
        assert!(out.contains("--- outputs of check content"), "{out}");
        assert!(out.contains("\"stdout\": \"world\\n\""), "{out}");
        // Issue 18: what `finally` printed is in <system-out>, as text.
        assert!(
            out.contains(
                "\n--- finally › exec: cat /tmp/app.log (scenarios/files.yaml:40:5): stdout ---\nlog line 1\n"
            ),
            "{out}"
        );
        assert!(out.ends_with("log line 25\n"), "{out}");
    }

    /// Issue 37 item 8: what the terminal shows under a failure ("captured stdout/stderr") is in
    /// <system-out> and <system-err>, and an assertion's `null` outputs are not.
    #[test]
    fn captured_streams_go_to_system_out_and_system_err() {
        let mut summary = fixture::summary();
        let r = summary.results.iter_mut().find(|r| r.name == "write file[template=base]").unwrap();
        let f = r.steps.iter_mut().find(|s| s.label == "check content").unwrap();
        f.outputs = serde_json::Value::Null;
        r.failure.as_mut().unwrap().captured = Some(crate::results::Captured {
            streams: vec![
                crate::results::CapturedStream { name: "stdout".into(), lines: vec!["compiling".into()], earlier: 0 },
                crate::results::CapturedStream {
                    name: "stderr".into(),
                    lines: vec!["error: no such file".into()],
                    earlier: 3,
                },
            ],
        });
        let xml = render(&summary);
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let case = doc.descendants().find(|n| n.attribute("name") == Some("write file[template=base]")).unwrap();
        let text = |tag: &str| case.children().find(|n| n.has_tag_name(tag)).and_then(|n| n.text()).unwrap_or_default();
        let out = text("system-out");
        assert!(
            out.contains("\n--- captured stdout of check content (scenarios/files.yaml:12:7) ---\ncompiling\n"),
            "{out}"
        );
        assert!(!out.contains("null"), "{out}");
        assert_eq!(
            text("system-err"),
            "\n--- captured stderr of check content (scenarios/files.yaml:12:7) ---\n… 3 earlier lines (all of it in --json, --evidence and --html)\nerror: no such file\n"
        );
        // A scenario with nothing captured has no <system-err>.
        let hello = doc.descendants().find(|n| n.attribute("name") == Some("hello")).unwrap();
        assert!(!hello.children().any(|n| n.has_tag_name("system-err")));
    }

    #[test]
    fn skipped_xfail_and_error_elements() {
        let xml = render(&fixture::summary());
        let doc = roxmltree::Document::parse(&xml).unwrap();
        let child = |name: &str, tag: &str| {
            let case = doc.descendants().find(|n| n.attribute("name") == Some(name)).unwrap();
            case.children().find(|n| n.has_tag_name(tag)).map(|n| (n.attribute("message").map(str::to_string), n))
        };
        assert_eq!(child("needs ports", "skipped").unwrap().0.as_deref(), Some("provider lacks capability `ports`"));
        assert_eq!(child("known bug", "skipped").unwrap().0.as_deref(), Some("xfail: issue #12: exit code lost"));
        let (msg, error) = child("broken provider", "error").unwrap();
        // Markup characters survive escaping; NUL is dropped; ESC too (illegal in XML 1.0).
        assert_eq!(msg.as_deref(), Some("connection refused <&> \"q\" 'a' [31m"));
        assert_eq!(error.attribute("type"), Some("create"));
        assert!(child("hello", "failure").is_none());
        let (_, xpass) = child("fixed bug", "failure").unwrap();
        assert_eq!(xpass.attribute("type"), Some("xpass"));
    }

    #[test]
    fn non_strict_xpass_passes() {
        let mut s = fixture::summary();
        for r in &mut s.results {
            if let Some(k) = &mut r.known_issue {
                k.strict = false;
            }
        }
        let xml = render(&s);
        let doc = roxmltree::Document::parse(&xml).unwrap();
        assert_eq!(doc.root_element().attribute("failures"), Some("2"));
    }

    #[test]
    fn escaping() {
        assert_eq!(attr("a\"b'<c>&\n\t\u{1}\u{FFFF}"), "a&quot;b&apos;&lt;c&gt;&amp;&#10;&#9;");
        assert_eq!(text_escape("<x>&\u{8}é\r\n"), "&lt;x&gt;&amp;é&#13;\n");
    }

    #[test]
    fn helpers() {
        assert_eq!(classname("scenarios/net/dns.yaml"), "scenarios.net.dns");
        assert_eq!(classname("./a.b/c"), "a.b.c");
        assert_eq!(classname("top.yml"), "top");
        assert_eq!(seconds(63_005), "63.005");
        assert_eq!(timestamp(0), "1970-01-01T00:00:00");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29T00:00:00");
        assert_eq!(timestamp(1_709_251_199_999), "2024-02-29T23:59:59");
    }
}

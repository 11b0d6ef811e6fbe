//! Issue 18, what a QA author sees: the real binary on the local provider, its output
//! compared with expected files (durations, ids and ports redacted).

mod common;

use common::*;

/// The summary of the failing fixtures on an 80-column terminal: nothing longer than 80,
/// reasons on lines of their own, details wrapped.
#[test]
fn failing_summary_at_80_columns() {
    let out = cmd(&["tests/fixtures/failing", "--no-progress", "-j", "1"]).env("COLUMNS", "80").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    // The streamed lines are the log (uncut); the summary after them fits.
    let summary = &stdout[stdout.find("\n\n").expect("a summary after the streamed lines") + 2..];
    for line in summary.lines() {
        assert!(line.chars().count() <= 80, "longer than 80 columns: {line:?}");
    }
    expect_file(&root().join("tests/fixtures/failing.80.out"), &stdout);
}

/// In GitHub Actions: one `::error` per failure with file, line and column, and a job summary.
#[test]
fn github_annotations_and_job_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let md = tmp.path().join("summary.md");
    std::fs::write(&md, "earlier step's summary\n").unwrap();
    let out = cmd(&["tests/fixtures/failing", "--no-progress", "-j", "1"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &md)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    let annotations: String = stdout.lines().filter(|l| l.starts_with("::")).map(|l| format!("{l}\n")).collect();
    expect_file(&root().join("tests/fixtures/failing.github.out"), &annotations);
    assert!(stdout.ends_with(&annotations), "annotations come last, after the summary");
    let summary = std::fs::read_to_string(&md).unwrap();
    assert!(
        summary.starts_with("earlier step's summary\n## scenario-run: ❌ 3 failed, 0 error\n"),
        "appended: {summary}"
    );
    expect_file(&root().join("tests/fixtures/failing.github.md"), &redact(&summary));
    // Not in Actions: none of it.
    let plain = run(&["tests/fixtures/failing", "--no-progress", "-j", "1"]);
    assert!(!text(&plain.stdout).contains("::error"), "{}", text(&plain.stdout));
}

/// The README's first example, copied as a new user would: it must pass. It failed on an
/// `http-get` to port 8000 where nothing listened.
#[test]
fn the_readme_example_passes() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let at = readme.find("## A scenario").expect("README has `## A scenario`");
    let block = &readme[at..];
    let start = block.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &block[start..start + block[start..].find("```").unwrap()];
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("example.yaml");
    std::fs::write(&file, yaml).unwrap();
    let report = tmp.path().join("r.json");
    let out = run(&[file.to_str().unwrap(), "--no-progress", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out.stdout), text(&out.stderr));
    // Its `finally` reads the server's log: the request is in it.
    let finally = step_outputs(&report, "exec").into_iter().last().unwrap();
    assert!(finally["stdout"].as_str().unwrap().contains("\"GET / HTTP/1.1\" 200"), "{finally}");
}

/// `check` and `--list` count in words a reader would write: "1 scenario", not "1 scenarios".
#[test]
fn counts_are_singular_for_one() {
    let out = run(&["check", "tests/fixtures/passing/simple.yaml"]);
    assert_eq!(text(&out.stdout), "ok: 1 scenario (1 case) in 1 file\n");
    let out = run(&["check", "tests/fixtures/passing"]);
    assert_eq!(text(&out.stdout), "ok: 2 scenarios (2 cases) in 2 files\n");
    let out = run(&["tests/fixtures/passing/simple.yaml", "--list"]);
    assert_eq!(text(&out.stderr), "1 scenario selected\n");
}

/// Issue 27 item 1: a command that failed (a non-zero exit, a timeout) showed the expectation
/// and nothing of what it printed, and its two timeouts said "timed out" naming no setting.
/// Under the failure now: the tail of both streams (masked, at most 20 lines each, cut to the
/// width), pytest's "captured stdout"; and the setting that bounded it.
#[test]
fn a_failing_command_shows_the_tail_of_what_it_printed_and_names_its_timeout() {
    let secret = "captured-secret-value-27";
    let out = cmd(&["tests/fixtures/captured", "--no-progress", "-j", "1", "--exec-timeout", "1s"])
        .env("COLUMNS", "80")
        .env("FIXTURE_CAPTURED_TOKEN", secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    assert!(!stdout.contains(secret), "the secret is masked:\n{stdout}");
    let summary = &stdout[stdout.find("\n\n").expect("a summary after the streamed lines") + 2..];
    for line in summary.lines() {
        assert!(line.chars().count() <= 80, "longer than 80 columns: {line:?}");
    }
    expect_file(&root().join("tests/fixtures/captured.80.out"), &stdout);
}

/// Issue 27 item 2: a false `assert: { that: }` printed only its expression, and a multi-line
/// one only its first line (cut mid-value in the summary). It shows the expression on one line
/// and the value of each operand, as pytest's assertion rewriting does.
#[test]
fn a_failing_assert_shows_the_value_of_each_operand() {
    let out = cmd(&["tests/fixtures/asserts", "--no-progress", "-j", "1"]).env("COLUMNS", "80").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    let summary = &stdout[stdout.find("\n\n").expect("a summary after the streamed lines") + 2..];
    for line in summary.lines() {
        assert!(line.chars().count() <= 80, "longer than 80 columns: {line:?}");
    }
    expect_file(&root().join("tests/fixtures/asserts.80.out"), &stdout);
}

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

/// Runs `args` on a real terminal of `cols` columns (`script` gives it a pty); with
/// `ctrl_c_after`, types Ctrl-C on that terminal after so long, as a person does. Returns the
/// exit code and what the terminal was sent, escape codes removed, split into lines.
fn on_terminal(cols: u16, args: &[&str], ctrl_c_after: Option<std::time::Duration>) -> (Option<i32>, Vec<String>) {
    use std::io::{Read, Write};
    let mut line = format!("stty cols {cols}; exec {}", bin().display());
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let mut child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(root())
        .env("NO_COLOR", "1")
        .env_remove("COLUMNS")
        .env_remove("E2E_RUN_ID")
        .env_remove("GITHUB_ACTIONS")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout.read_to_end(&mut bytes);
        bytes
    });
    let mut stdin = child.stdin.take().unwrap();
    if let Some(after) = ctrl_c_after {
        std::thread::sleep(after);
        stdin.write_all(b"\x03").unwrap();
        stdin.flush().unwrap();
    }
    let bytes = reader.join().unwrap();
    drop(stdin);
    let code = child.wait().unwrap().code();
    let shown = regex::Regex::new(r"\x1b\[[0-9;?]*[A-Za-z]").unwrap().replace_all(&text(&bytes), "").into_owned();
    // A carriage return starts the line over: keep what was written after the last one.
    let lines = shown.split('\n').map(|l| l.trim_end_matches('\r').rsplit('\r').next().unwrap_or("").to_string());
    (code, lines.collect())
}

/// Issue 27 item 7: `image base: cached (…)` is printed only with -v (or when something
/// was built), and no progress bar is drawn while the provider prepares.
#[test]
fn a_run_that_builds_nothing_starts_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("quick.yaml");
    std::fs::write(&file, "name: quick\nsteps:\n  - create: base\n  - exec: echo hi\n").unwrap();
    let file = file.to_str().unwrap();
    // The first run builds `base` if this machine has never had it.
    let (code, _) = on_terminal(80, &[file], None);
    assert_eq!(code, Some(0));
    let (code, shown) = on_terminal(80, &[file], None);
    assert_eq!(code, Some(0), "{shown:#?}");
    assert!(!shown.iter().any(|l| l.contains("image base")), "{shown:#?}");
    assert!(!shown.iter().any(|l| l.contains("0/0")), "a bar drawn before the run started: {shown:#?}");
    let (code, shown) = on_terminal(80, &[file, "-v"], None);
    assert_eq!(code, Some(0), "{shown:#?}");
    assert!(shown.iter().any(|l| l.starts_with("image base: cached (")), "{shown:#?}");
}

/// Issue 27 item 7: after Ctrl-C on an 80-column terminal no line was broken mid-word (the
/// notice and the scenario lines were wider than the terminal), and the `^C` the terminal
/// echoed pushed the live view down a line, so its top line stayed on screen.
#[test]
fn ctrl_c_on_an_80_column_terminal_breaks_no_line() {
    let tmp = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for n in 1..=2 {
        let file = tmp.path().join(format!("sleeper{n}.yaml"));
        std::fs::write(
            &file,
            format!("name: sleeper number {n} with a long name\nsteps:\n  - create: base\n  - exec: sleep 30\n"),
        )
        .unwrap();
        files.push(file.to_str().unwrap().to_string());
    }
    let args: Vec<&str> = files.iter().map(String::as_str).collect();
    let (code, shown) = on_terminal(80, &args, Some(std::time::Duration::from_secs(5)));
    assert_eq!(code, Some(130), "{shown:#?}");
    let from = shown.iter().position(|l| l.starts_with("interrupted by SIGINT")).expect("the notice");
    let after = &shown[from..];
    for line in after {
        assert!(line.chars().count() <= 80, "wider than the terminal: {line:?}\n{after:#?}");
    }
    assert!(after[1].starts_with("  ") && after[1].ends_with("to exit at once"), "{after:#?}");
    assert!(!shown.iter().any(|l| l.contains("^C")), "Ctrl-C was echoed under the live view: {after:#?}");
}

/// Issue 27 item 7: `--help` (and `run --help`) list the exit codes, each line within 80
/// columns.
#[test]
fn help_lists_the_exit_codes() {
    for args in [&["--help"][..], &["run", "--help"], &["-h"]] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0));
        let help = text(&out.stdout);
        let codes = &help[help.find("Exit codes:").unwrap_or_else(|| panic!("{args:?}: {help}"))..];
        for code in ["  0 ", "  1 ", "  2 ", "  3 ", "  4 ", "  130 "] {
            assert!(codes.lines().any(|l| l.starts_with(code)), "{args:?}: {code:?} missing\n{codes}");
        }
        assert!(codes.lines().all(|l| l.chars().count() <= 80), "{codes}");
    }
}

/// Issue 27 item 4: a sandbox file compared with a file beside the scenario (`equals_file`),
/// text and binary: where they first differ, the sizes, and a diff for text.
#[test]
fn a_sandbox_file_compared_with_a_file_beside_the_scenario() {
    let out = cmd(&["tests/fixtures/local-files", "--no-progress", "-j", "1"]).env("COLUMNS", "80").output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    assert!(stdout.contains("PASSED  local file equal"), "{stdout}");
    let summary = &stdout[stdout.find("\n\n").expect("a summary after the streamed lines") + 2..];
    for line in summary.lines() {
        assert!(line.chars().count() <= 80, "longer than 80 columns: {line:?}");
    }
    expect_file(&root().join("tests/fixtures/local-files.80.out"), &stdout);
}

/// Issue 27 item 4: a templated `equals_file` cannot be checked before the run; at run time a
/// path outside the scenario's folder is the step's ERROR with the same words `check` uses.
#[test]
fn a_templated_equals_file_outside_the_scenario_folder_is_an_error_at_run_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("suite");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(tmp.path().join("elsewhere.txt"), "x").unwrap();
    let file = dir.join("s.yaml");
    std::fs::write(
        &file,
        "name: templated\nsteps:\n  - create: base\n  - exec: printf x > /tmp/x\n  - assert-file: { path: /tmp/x, equals_file: \"{{ vars.f }}\" }\n",
    )
    .unwrap();
    let out = run(&[file.to_str().unwrap(), "--no-progress", "--var", "f=../elsewhere.txt"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    assert!(stdout.contains("ERROR   templated"), "{stdout}");
    assert!(stdout.contains("../elsewhere.txt is outside the scenario's folder"), "{stdout}");
}

/// Issue 27 item 7's Ctrl-C fix changes the terminal (no `^C` echo) while the live view is
/// up: a run started in the background of an interactive shell (`scenario-run … &`) must not
/// touch it, or the kernel stops the run with SIGTTOU and `wait` never returns.
#[test]
fn a_run_in_the_background_of_a_shell_is_not_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("quick.yaml");
    std::fs::write(&file, "name: quick\nsteps:\n  - create: base\n  - exec: echo hi\n").unwrap();
    let inner = format!("{} '{}' & wait $!; echo waited=$?", bin().display(), file.display());
    let mut child = std::process::Command::new("script")
        .args(["-qec", &format!("bash --norc --noprofile -ic \"{inner}\""), "/dev/null"])
        .current_dir(root())
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the backgrounded run never ended (stopped by SIGTTOU?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let shown = text(&out.stdout);
    assert!(shown.contains("waited=0"), "{shown}");
    assert!(shown.contains("1 passed"), "{shown}");
}

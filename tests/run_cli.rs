//! Runs of the real binary on fixture scenarios, on the real local provider: the summary and
//! JUnit compared with expected output, interrupts, secrets, and the concurrency limit.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

fn junit_doc(path: &Path) -> String {
    std::fs::read_to_string(path).expect("junit written")
}

#[test]
fn passing_run_summary_and_junit_match_expected() {
    let tmp = tempfile::tempdir().unwrap();
    let junit = tmp.path().join("junit.xml");
    let out = cmd(&["tests/fixtures/passing", "--no-progress", "-j", "1", "--junit", junit.to_str().unwrap()])
        .env_remove("FIXTURE_ONLY_API_KEY")
        .env_remove("FIXTURE_ONLY_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    expect_file(&root().join("tests/fixtures/passing.out"), &redact(&text(&out.stdout)));
    let xml = junit_doc(&junit);
    expect_file(&root().join("tests/fixtures/passing.junit.xml"), &redact(&xml));
    let doc = roxmltree::Document::parse(&xml).expect("JUnit is well-formed XML");
    let cases: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("testcase")).collect();
    assert_eq!(cases.len(), 2);
    let skipped = cases.iter().find(|c| c.attribute("name") == Some("passing skipped for credentials")).unwrap();
    let reason = skipped.children().find(|n| n.has_tag_name("skipped")).unwrap().attribute("message").unwrap();
    assert_eq!(reason, "missing credentials [FIXTURE_ONLY_API_KEY, FIXTURE_ONLY_TOKEN]");
}

#[test]
fn failing_runs_show_diffs_and_exit_1() {
    let tmp = tempfile::tempdir().unwrap();
    let junit = tmp.path().join("junit.xml");
    // -j 1: plain lines come in completion order; one at a time makes that the plan order.
    let out = run(&["tests/fixtures/failing", "--no-progress", "-j", "1", "--junit", junit.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let stdout = redact(&text(&out.stdout));
    expect_file(&root().join("tests/fixtures/failing.out"), &stdout);
    assert!(stdout.contains("  -BETA\n  +beta"), "multi-line diff missing:\n{stdout}");
    let xml = junit_doc(&junit);
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let failures: Vec<_> = doc.descendants().filter(|n| n.has_tag_name("failure")).collect();
    assert_eq!(failures.len(), 4, "{xml}");
    let diff =
        failures.iter().find(|f| f.text().unwrap_or("").contains("assertions.yaml:")).expect("failure names file:line");
    assert!(diff.text().unwrap().contains("tests/fixtures/failing/assertions.yaml:5:5"), "{:?}", diff.text());
}

/// Every process, mount and namespace a run made must be gone when it ends.
fn assert_nothing_left(state_dir: &Path, mark: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut leftovers = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
                if env.windows(mark.len()).any(|w| w == mark.as_bytes()) {
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                    leftovers.push(format!("process {pid}: {}", String::from_utf8_lossy(&cmdline).replace('\0', " ")));
                }
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let state = state_dir.to_string_lossy();
        leftovers.extend(mounts.lines().filter(|l| l.contains(&*state)).map(|l| format!("mount: {l}")));
        let entries: Vec<_> =
            std::fs::read_dir(state_dir).map(|d| d.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        leftovers.extend(entries.iter().map(|e| format!("state left: {e:?}")));
        if leftovers.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!("left behind:\n{}", leftovers.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn count_sandboxes(state_dir: &Path) -> usize {
    std::fs::read_dir(state_dir).map(|d| d.flatten().count()).unwrap_or(0)
}

/// Pids of the processes running `cmdline` (arguments joined by spaces) whose environment
/// holds `mark`.
fn marked_processes(mark: &str, cmdline: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).trim_end_matches('\0').replace('\0', " ") != cmdline {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        if env.windows(mark.len()).any(|w| w == mark.as_bytes()) {
            found.push(pid);
        }
    }
    found
}

/// Starts the long-running interrupt fixture (3 at a time) and returns once three sandboxes
/// run their foreground command (its `sleep 800` is seen in the process table): an event, not
/// a guess at how long that takes. Stdout comes line by line on the returned channel.
fn start_long_run(
    state: &Path,
    mark: &str,
    extra: &[&str],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut args = vec!["tests/fixtures/interrupt", "--no-progress", "-j", "3"];
    args.extend_from_slice(extra);
    let mut child = cmd(&args)
        .env("SCENARIO_RUN_STATE_DIR", state)
        .env("SR_TEST_MARK", mark)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stdout).map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while marked_processes(mark, "sleep 800").len() < 3 {
        assert!(Instant::now() < deadline, "the three foreground commands never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, lines)
}

/// Waits for a line of the run's output that contains `what`; returns the lines seen so far.
fn wait_for_line(lines: &std::sync::mpsc::Receiver<String>, what: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains(what) {
                    return seen;
                }
            }
            Err(_) => panic!("no line with {what:?} came; the output so far:\n{seen}"),
        }
    }
}

/// Interrupts the fixture run with `signal`, `count` times (each after the run said it took
/// the one before), and checks that nothing is left.
fn interrupt_run(signal: i32, count: usize) -> (std::process::ExitStatus, String, tempfile::TempDir, String) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let report = tmp.path().join("report.json");
    let mark = format!("sr-test-{}-{signal}-{count}", std::process::id());
    let (mut child, lines) =
        start_long_run(&state, &mark, &["--json", report.to_str().unwrap(), "--grace-period", "10s"]);
    let started = Instant::now();
    let mut stdout = String::new();
    for i in 0..count {
        // SAFETY: signalling the child we spawned, by its pid.
        unsafe { libc::kill(child.id() as i32, signal) };
        if i + 1 < count {
            // The next signal only once this one was taken (two at once may arrive as one).
            stdout.push_str(&wait_for_line(&lines, "interrupted by"));
        }
    }
    let status = child.wait().unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "interrupt took {took:?}");
    stdout.extend(lines.iter().map(|l| l + "\n"));
    assert_nothing_left(&state, &mark);
    let json = std::fs::read_to_string(&report).unwrap_or_default();
    (status, stdout, tmp, json)
}

/// After one SIGINT (or SIGTERM, SIGHUP, SIGQUIT): `finally` ran in each running case, every
/// sandbox was destroyed, the report says interrupted, and the exit code is 130.
fn assert_interrupted_cleanly(signal: i32) {
    let (status, stdout, _tmp, json) = interrupt_run(signal, 1);
    assert_eq!(status.code(), Some(130), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&json).expect("report written on interrupt");
    assert_eq!(report["interrupted"], true);
    let results = report["results"].as_array().unwrap();
    assert_eq!(results.len(), 6, "every case is in the report");
    let ran: Vec<_> = results.iter().filter(|r| !r["steps"].as_array().unwrap().is_empty()).collect();
    assert_eq!(ran.len(), 3, "three were running");
    for r in &ran {
        let finally = r["steps"].as_array().unwrap().iter().find(|s| s["phase"] == "finally").unwrap();
        assert_eq!(finally["status"], "passed", "finally ran after the interrupt: {finally}");
        assert_eq!(finally["outputs"]["stdout"], "finally ran\n");
        assert!(r["steps"].as_array().unwrap().iter().any(|s| s["phase"] == "cleanup" && s["status"] == "passed"));
    }
    assert!(results.iter().all(|r| r["interrupted"] == true));
    assert_eq!(report["provider_stats"]["live"], 0);
    assert!(stdout.contains("passed, "), "the summary is printed: {stdout}");
}

#[test]
fn sigint_runs_finally_destroys_everything_and_exits_130() {
    assert_interrupted_cleanly(libc::SIGINT);
}

/// Issue 26 item 8: a closed terminal or an SSH drop (SIGHUP), and SIGQUIT, ended the run
/// at once: no `finally`, no reports, cloud sandboxes left to their TTL.
#[test]
fn sighup_is_an_interrupt_like_sigterm_finally_reports_and_cleanup_run() {
    assert_interrupted_cleanly(libc::SIGHUP);
}

#[test]
fn sigquit_is_an_interrupt_like_sigterm_finally_reports_and_cleanup_run() {
    assert_interrupted_cleanly(libc::SIGQUIT);
}

#[test]
fn sigterm_runs_finally_destroys_everything_and_exits_130() {
    assert_interrupted_cleanly(libc::SIGTERM);
}

#[test]
fn second_sigint_exits_at_once_and_still_leaves_nothing() {
    let (status, _stdout, _tmp, _json) = interrupt_run(libc::SIGINT, 2);
    assert_eq!(status.code(), Some(130));
}

#[test]
fn canary_secret_appears_in_no_output() {
    let tmp = tempfile::tempdir().unwrap();
    let canary = format!("canary-{}-s3cr3t-value", std::process::id());
    let b64 = base64_std(&canary);
    let scenario = tmp.path().join("leak.yaml");
    std::fs::write(
        &scenario,
        r#"name: leak attempt
secrets: [PLAIN_VALUE]
steps:
  - create: { template: base, envs: { TOKEN_COPY: "{{ env.CANARY_API_KEY }}" } }
  - exec: 'echo "$TOKEN_COPY"; echo "{{ env.CANARY_API_KEY | b64encode }}"; echo "{{ env.PLAIN_VALUE }}" >&2; printf "%s" "user:$TOKEN_COPY" | base64'
  - write-file: { path: /tmp/k, content: "{{ env.CANARY_API_KEY | urlencode }}" }
  - read-file: /tmp/k
  - http-get: { url: "http://127.0.0.1:9/?k={{ env.CANARY_API_KEY }}" }
    continue_on_error: true
  - assert-stdout: { equals: "{{ env.CANARY_API_KEY }}" }
"#,
    )
    .unwrap();
    let (junit, json, evidence) = (tmp.path().join("j.xml"), tmp.path().join("r.json"), tmp.path().join("ev"));
    let (html, step_summary) = (tmp.path().join("r.html"), tmp.path().join("summary.md"));
    let out = cmd(&[
        scenario.to_str().unwrap(),
        "--no-progress",
        "-v",
        "--junit",
        junit.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--evidence",
        evidence.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ])
    .env("GITHUB_ACTIONS", "true")
    .env("GITHUB_STEP_SUMMARY", &step_summary)
    .env("CANARY_API_KEY", &canary)
    .env("PLAIN_VALUE", "plain-canary-value")
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "the assertion fails, so the secret is in a mismatch: {}",
        text(&out.stdout)
    );
    let mut outputs = vec![("stdout".to_string(), text(&out.stdout)), ("stderr".to_string(), text(&out.stderr))];
    outputs.push(("junit".into(), std::fs::read_to_string(&junit).unwrap()));
    outputs.push(("json".into(), std::fs::read_to_string(&json).unwrap()));
    // Issue 18: the HTML report and the GitHub job summary (and the annotations, on stdout).
    outputs.push(("html".into(), std::fs::read_to_string(&html).unwrap()));
    outputs.push(("job summary".into(), std::fs::read_to_string(&step_summary).unwrap()));
    assert!(text(&out.stdout).contains("::error file="), "annotations are on stdout");
    for e in std::fs::read_dir(&evidence).unwrap().flatten() {
        outputs.push((e.path().display().to_string(), std::fs::read_to_string(e.path()).unwrap()));
    }
    let basic = base64_std(&format!("user:{canary}"));
    let forms = [canary.as_str(), b64.as_str(), basic.as_str(), "plain-canary-value"];
    for (name, content) in &outputs {
        for form in forms {
            assert!(!content.contains(form), "{name} leaks {form}:\n{content}");
        }
    }
    // The masking is visible, so the test would notice if the secret were simply not printed.
    assert!(outputs.iter().any(|(_, c)| c.contains("***")));
}

fn base64_std(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn live_sandboxes_never_exceed_the_concurrency_limit() {
    let tmp = tempfile::tempdir().unwrap();
    for i in 0..10 {
        std::fs::write(
            tmp.path().join(format!("s{i}.yaml")),
            format!("name: peak {i}\nsteps:\n  - create: base\n  - exec: sleep 0.3\n"),
        )
        .unwrap();
    }
    // Two sandboxes in one case: it must take two permits.
    std::fs::write(
        tmp.path().join("two.yaml"),
        "name: peak two\nsteps:\n  - create: { template: base, as: a }\n  - create: { template: base, as: b }\n  - exec: sleep 0.3\n",
    )
    .unwrap();
    let report = tmp.path().join("r.json");
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress", "-j", "3", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let stats = &r["provider_stats"];
    assert_eq!(stats["created"], 12);
    assert_eq!(stats["destroyed"], 12);
    assert_eq!(stats["live"], 0);
    assert_eq!(stats["peak_live"], 3, "peak must reach the limit (parallel) and never pass it: {stats}");
}

#[test]
fn sigkilled_run_leaves_no_process_and_the_next_run_sweeps_its_state() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mark = format!("sr-sigkill-{}", std::process::id());
    let (mut child, _lines) = start_long_run(&state, &mark, &[]);
    child.kill().unwrap(); // SIGKILL: no chance to clean up
    child.wait().unwrap();
    assert!(count_sandboxes(&state) >= 3, "state directories are left on disk by a SIGKILL");
    // The next run on the same state directory sweeps them; the processes died with the
    // runner (bwrap --die-with-parent), and the mounts lived only in their namespaces.
    let out = cmd(&["tests/fixtures/passing/simple.yaml", "--no-progress"])
        .env("SCENARIO_RUN_STATE_DIR", &state)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert_nothing_left(&state, &mark);
}

/// A loopback HTTP server that takes its first connection and never answers it (a server
/// that accepts before it serves), then answers every later one with 200. Returns its URL
/// and the number of connections it accepted.
fn silent_first_server() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            if count.fetch_add(1, Ordering::SeqCst) == 0 {
                held.push(s); // open and silent until the process ends
                continue;
            }
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok");
        }
    });
    (url, accepted)
}

#[test]
fn a_polled_request_that_hangs_costs_one_attempt_not_the_window() {
    let (url, accepted) = silent_first_server();
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("poll.yaml");
    std::fs::write(
        &file,
        "name: poll past a stuck request\nsteps:\n  - http-get: { url: \"{{ env.POLL_URL }}/health\", expect: { status: 200, body: { equals: ok } } }\n    eventually: { within: 20s, every: 200ms }\n",
    )
    .unwrap();
    let report = tmp.path().join("r.json");
    let started = Instant::now();
    let out = cmd(&[file.to_str().unwrap(), "--no-progress", "--json", report.to_str().unwrap()])
        .env("POLL_URL", &url)
        .output()
        .unwrap();
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let step = &r["results"][0]["steps"][0];
    assert_eq!(step["attempts"], 2, "{step}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    // The stuck attempt gave up after the polled default (5 s), not the request default (30 s).
    assert!(took < Duration::from_secs(15), "took {took:?}");
}

#[test]
fn no_attempt_of_a_polled_step_outlives_its_window() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("window.yaml");
    std::fs::write(
        &file,
        "name: window bounds the attempt\nsteps:\n  - create: base\n  - exec: sleep 20\n    eventually: { within: 1500ms, every: 100ms }\n",
    )
    .unwrap();
    let started = Instant::now();
    let out = run(&[file.to_str().unwrap(), "--no-progress"]);
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stdout = text(&out.stdout);
    // The window bounds the command itself (issue 27 item 1: what it printed is kept).
    assert!(
        stdout.contains(
            "did not pass within 1.50s (1 attempts): command timed out after 1.50s (what was left of `eventually`'s window)"
        ),
        "{stdout}"
    );
    assert!(took < Duration::from_secs(10), "the 20 s command held the step for {took:?}");
}

#[test]
fn output_past_max_output_is_counted_and_an_assertion_on_it_says_so() {
    let out = run(&["tests/fixtures/output-cap.yaml", "--no-progress", "--max-output", "1KiB"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    // The same scenario with the default cap keeps everything, so its size check fails.
    let out = run(&["tests/fixtures/output-cap.yaml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let bad = run(&["tests/fixtures/output-cap.yaml", "--max-output", "12 parsecs"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad.stderr).contains("unknown unit `parsecs`"), "{}", text(&bad.stderr));
}

/// Issue 14: a step's `requires: { env }` skips that step alone when the variable is unset
/// (a model's key), visibly and counted in every report, and the rest of the scenario runs and
/// can fail; with the variable set, the step runs.
#[test]
fn a_step_without_its_key_is_skipped_counted_and_the_rest_still_decides() {
    let tmp = tempfile::tempdir().unwrap();
    let (junit, json) = (tmp.path().join("junit.xml"), tmp.path().join("report.json"));
    let out = cmd(&[
        "tests/fixtures/step-requires",
        "--no-progress",
        "-j",
        "1",
        "--junit",
        junit.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ])
    .env_remove("FIXTURE_MODEL_KEY")
    .output()
    .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "the broken step still fails the run:\n{stdout}");
    assert!(
        stdout.contains("PASSED  step requires skips one step")
            && stdout.contains("(2 steps skipped: missing credentials [FIXTURE_MODEL_KEY])"),
        "{stdout}"
    );
    assert!(stdout.contains("FAILED  step requires does not hide a failure"), "{stdout}");
    assert!(stdout.contains("1 passed, 1 failed, 0 error, 0 skipped, 0 xfail, 0 xpass in "), "{stdout}");
    assert!(stdout.contains("3 steps skipped: missing credentials (steps with requires.env)"), "{stdout}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["totals"]["skipped_steps"], 3);
    let step = &report["results"][0]["steps"][1];
    assert_eq!(
        (&step["status"], &step["message"], &step["missing_env"]),
        (
            &serde_json::json!("skipped"),
            &serde_json::json!("missing credentials [FIXTURE_MODEL_KEY]"),
            &serde_json::json!(["FIXTURE_MODEL_KEY"])
        )
    );
    let xml = junit_doc(&junit);
    assert!(xml.contains(r#"<property name="skipped_steps" value="3"/>"#), "{xml}");
    assert!(xml.contains("2 steps skipped: missing credentials [FIXTURE_MODEL_KEY]"), "{xml}");

    // With the key, the step runs (and its check passes).
    let out = cmd(&["tests/fixtures/step-requires/skips.yaml", "--no-progress"])
        .env("FIXTURE_MODEL_KEY", "set")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("skipped: missing credentials"), "{stdout}");
}

#[test]
fn a_runaway_terminal_fails_its_pty_step_at_the_output_cap_and_is_killed() {
    // `yes` in a PTY never prints what is expected: the step stops reading at --max-output,
    // fails saying so, and kills it (no `yes` is left in the sandbox).
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("runaway.yaml");
    std::fs::write(
        &file,
        "name: runaway pty\nsteps:\n  - create: base\n  - pty: { cmd: \"yes\", expect: { contains: never-printed }, within: 60s }\n    expect_error: { contains: \"without matching (raise --max-output)\" }\n  - exec: { cmd: \"for i in $(seq 50); do pgrep -x yes >/dev/null || exit 0; sleep 0.1; done; exit 1\", exit_code: 0 }\n",
    )
    .unwrap();
    let started = Instant::now();
    let out = run(&["--no-progress", "--max-output", "1MiB", file.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", text(&out.stderr));
    assert!(started.elapsed() < Duration::from_secs(50), "the cap, not `within`, ended the step: {stdout}");
}

/// Issue 37 item 5: Python's string methods, a bytes view of base64 and `assert-file: {
/// sha256, size }` on a binary file, on the local provider; a wrong digest fails with both.
#[test]
fn pytest_habits_in_expressions_and_binary_files() {
    let tmp = tempfile::tempdir().unwrap();
    // 0xff 0x00 0xfe: not UTF-8.
    let digest = "af9ceddc9d8b08ac09e1994bfd20459b5e377425df7354dfce3501992828a5b7";
    std::fs::write(
        tmp.path().join("bytes.yaml"),
        format!(
            r#"name: bytes
steps:
  - create: base
  - write-file: {{ path: /tmp/b.bin, content_base64: "/wD+" }}
  - assert-file: {{ path: /tmp/b.bin, size: 3, sha256: {digest} }}
  - read-file: {{ path: /tmp/b.bin, encoding: base64 }}
    id: r
  - assert: {{ that: "(steps.r.content | b64decode | length) == 3 and (steps.r.content | b64decode | sha256) == '{digest}'" }}
  - exec: echo '  hello world'
    id: e
  - assert: {{ that: "steps.e.stdout.strip().startswith('hello') and steps.e.stdout.split()[1] == 'world'" }}
---
name: wrong digest
steps:
  - create: base
  - write-file: {{ path: /tmp/b.bin, content_base64: "/wD+" }}
  - assert-file: {{ path: /tmp/b.bin, sha256: "{}" }}
"#,
            "0".repeat(64)
        ),
    )
    .unwrap();
    let report = tmp.path().join("r.json");
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let outcome = |name: &str| r["results"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap().clone();
    assert_eq!(outcome("bytes")["outcome"], "passed", "{}", text(&out.stdout));
    let wrong = outcome("wrong digest");
    assert_eq!(wrong["outcome"], "failed");
    let reason = wrong["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("/tmp/b.bin: expected sha256 {}, found {digest}", "0".repeat(64))), "{reason}");
}

/// Issue 37 items 8 and 9: a matrix of mappings names its cases by their `id` (not their
/// JSON), and JUnit carries the failing command's captured stdout and stderr as the terminal
/// shows them, in <system-out> and <system-err>.
#[test]
fn matrix_cases_have_short_names_and_junit_has_the_captured_streams() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("m.yaml"),
        r#"name: sizes
matrix:
  case:
    - { id: small, n: 1, body: '{"a": [1, 2]}' }
    - { id: large, n: 9, body: '{"a": []}' }
steps:
  - create: base
  - exec: "echo compiling {{ matrix.case.n }}; echo 'error: no such file' >&2; exit 2"
  - assert-exit: 0
"#,
    )
    .unwrap();
    let junit = tmp.path().join("junit.xml");
    let out = run(&[tmp.path().to_str().unwrap(), "--no-progress", "--junit", junit.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("sizes[case=small]") && stdout.contains("sizes[case=large]"), "{stdout}");
    assert!(!stdout.contains("\"body\""), "{stdout}");
    let xml = junit_doc(&junit);
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let case = doc.descendants().find(|n| n.attribute("name") == Some("sizes[case=small]")).expect("short name");
    let child = |tag: &str| case.children().find(|n| n.has_tag_name(tag)).and_then(|n| n.text()).unwrap_or_default();
    let out_text = child("system-out");
    assert!(
        out_text.contains("--- captured stdout of assert-exit: 0 (") && out_text.contains("compiling 1\n"),
        "{out_text}"
    );
    assert!(!out_text.contains("null"), "{out_text}");
    let err_text = child("system-err");
    assert!(
        err_text.contains("--- captured stderr of assert-exit: 0 (") && err_text.ends_with("error: no such file\n"),
        "{xml}"
    );
}

/// Issue 37 item 6: a folder's search passes over `node_modules`, virtual environments and
/// `.gitignore`d folders, and a YAML file that is not a scenario with a note; named, such a
/// file is still an error.
#[test]
fn discovery_passes_over_what_is_not_a_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let broken = "name: broken\nsteps:\n  - exce: nope\n";
    for dir in ["node_modules/pkg", "venv", "build"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        std::fs::write(root.join(dir).join("s.yaml"), broken).unwrap();
    }
    std::fs::write(root.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    std::fs::write(root.join(".gitignore"), "build/\n").unwrap();
    std::fs::write(root.join("compose.yaml"), "services:\n  web: { image: nginx }\n").unwrap();
    std::fs::write(root.join("a.yaml"), "name: a\nsteps:\n  - set: { x: 1 }\n").unwrap();
    let out = run(&[root.to_str().unwrap(), "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("note: passed over ") && err.contains("compose.yaml: not a scenario (no `steps:`)"), "{err}");
    assert!(text(&out.stdout).contains("1 passed"), "{}", text(&out.stdout));
    let out = run(&["check", root.join("compose.yaml").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
}

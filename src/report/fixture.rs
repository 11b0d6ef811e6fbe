//! Test fixtures: a hand-built [`RunSummary`] with one scenario of every outcome, fixed
//! durations and timestamps, shared by the reporter tests.

use std::collections::BTreeMap;

use serde_json::json;

use crate::diag::Location;
use crate::provider::ProviderStats;
use crate::results::*;

pub fn loc(file: &str, line: u32, col: u32) -> Location {
    Location { file: file.to_string(), line, col }
}

pub fn step(index: usize, label: &str, status: StepStatus, location: Location) -> StepRecord {
    StepRecord {
        index,
        phase: Phase::Steps,
        kind: label.split_once(':').map_or("assert", |(k, _)| k).to_string(),
        label: label.to_string(),
        id: None,
        location,
        status,
        args: json!({}),
        outputs: json!({}),
        message: None,
        mismatch: None,
        attempts: 1,
        start_ms: index as u64 * 100,
        duration_ms: 100,
        continued: false,
        missing_env: Vec::new(),
        error_kind: None,
    }
}

pub fn scenario(index: usize, name: &str, file: &str, outcome: Outcome, duration_ms: u64) -> ScenarioResult {
    ScenarioResult {
        index,
        name: name.to_string(),
        description: None,
        location: loc(file, 1, 1),
        tags: vec![],
        matrix: BTreeMap::new(),
        outcome,
        reason: None,
        failure: None,
        known_issue: None,
        steps: vec![],
        sandboxes: vec![],
        kept_sandboxes: vec![],
        started_at_ms: 1_700_000_000_000 + index as u64,
        duration_ms,
        interrupted: false,
        soft_failures: 0,
    }
}

fn failed(
    mut r: ScenarioResult,
    label: &str,
    at: Location,
    message: &str,
    mismatch: Option<Mismatch>,
    status: StepStatus,
) -> ScenarioResult {
    let mut s = step(0, "create: base", StepStatus::Passed, loc(&r.location.file, 3, 5));
    s.phase = Phase::Setup;
    s.kind = "create".into();
    s.id = Some("sb".into());
    s.outputs = json!({"sandbox_id": "sb-1"});
    r.steps.push(s);
    let mut f = step(1, label, status, at.clone());
    f.message = Some(message.to_string());
    f.mismatch = mismatch.clone();
    f.args = json!({"cmd": "cat /tmp/out.txt"});
    f.outputs = json!({"exit_code": 1, "stdout": "world\n", "stderr": ""});
    r.steps.push(f);
    let mut later = step(2, "exec: echo after", StepStatus::Skipped, loc(&r.location.file, 20, 5));
    later.message = Some("an earlier step failed".into());
    r.steps.push(later);
    r.sandboxes = vec!["sb-1".into()];
    r.failure =
        Some(Failure { step: label.to_string(), location: at, message: message.to_string(), mismatch, captured: None });
    r
}

/// Seven scenarios, indexes 0..=6, one per outcome plus a multi-line diff; listed out of
/// order so that sorting by index is tested.
pub fn summary() -> RunSummary {
    let mut passed = scenario(0, "hello", "scenarios/basic.yaml", Outcome::Passed, 1200);
    passed.tags = vec!["smoke".into()];
    passed.steps = vec![
        step(0, "exec: echo hi", StepStatus::Passed, loc("scenarios/basic.yaml", 4, 5)),
        step(1, "exec: true", StepStatus::Passed, loc("scenarios/basic.yaml", 5, 5)),
    ];

    let mut matrix = scenario(1, "write file[template=base]", "scenarios/files.yaml", Outcome::Failed, 300);
    matrix.matrix.insert("template".into(), "base".into());
    let matrix = failed(
        matrix,
        "check content",
        loc("scenarios/files.yaml", 12, 7),
        "stdout did not match",
        Some(Mismatch::new("hello", "world")),
        StepStatus::Failed,
    );

    let mut matrix = matrix;
    let mut log = step(3, "exec: cat /tmp/app.log", StepStatus::Passed, loc("scenarios/files.yaml", 40, 5));
    log.phase = Phase::Finally;
    log.kind = "exec".into();
    log.outputs = json!({
        "exit_code": 0,
        "stdout": (1..=25).map(|i| format!("log line {i}\n")).collect::<String>(),
        "stderr": "",
    });
    matrix.steps.push(log);

    let multi = failed(
        scenario(2, "multi line", "scenarios/files.yaml", Outcome::Failed, 63_000),
        "exec: ls",
        loc("scenarios/files.yaml", 30, 7),
        "stdout did not match\nsee diff",
        Some(Mismatch::new("a\nb\nc\n", "a\nB\nc\n")),
        StepStatus::Failed,
    );

    let error = failed(
        scenario(3, "broken provider", "scenarios/net.yaml", Outcome::Error, 50),
        "create: base",
        loc("scenarios/net.yaml", 3, 5),
        "connection refused <&> \"q\" 'a' \u{0}\u{1b}[31m",
        None,
        StepStatus::Error,
    );

    let mut skipped = scenario(4, "needs ports", "scenarios/net.yaml", Outcome::Skipped, 0);
    skipped.reason = Some("provider lacks capability `ports`".into());

    let mut xfail = failed(
        scenario(5, "known bug", "scenarios/bugs.yaml", Outcome::Xfail, 800),
        "exec: exit 3",
        loc("scenarios/bugs.yaml", 8, 7),
        "exit code 0, expected 3",
        None,
        StepStatus::Failed,
    );
    xfail.reason = Some("issue #12: exit code lost".into());
    xfail.known_issue = Some(KnownIssueInfo { id: Some("#12".into()), reason: "exit code lost".into(), strict: false });

    let mut xpass = scenario(6, "fixed bug", "scenarios/bugs.yaml", Outcome::Xpass, 400);
    xpass.reason = Some("known issue #7 passed".into());
    xpass.known_issue = Some(KnownIssueInfo { id: Some("#7".into()), reason: "flaky cwd".into(), strict: true });
    xpass.steps = vec![step(0, "exec: pwd", StepStatus::Passed, loc("scenarios/bugs.yaml", 15, 7))];

    let results = vec![xpass, passed, matrix, multi, error, skipped, xfail];
    let totals = Totals::from_results(&results);
    RunSummary {
        run_id: "r-20240101-abcd".into(),
        provider: "local".into(),
        concurrency: 4,
        started_at_ms: 1_700_000_000_000,
        duration_ms: 1234,
        interrupted: false,
        totals,
        exit_code: 1,
        fail_on_skip: false,
        provider_stats: ProviderStats { created: 4, destroyed: 4, live: 0, peak_live: 2 },
        results,
    }
}

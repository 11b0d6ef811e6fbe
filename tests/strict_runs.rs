//! Issue 27 item 3: a run whose credentials are missing was green (every scenario SKIPPED,
//! exit 0): right on a laptop, wrong in a CI job whose secret is gone. Two strict modes, on
//! the real binary and the local provider:
//!
//! * `--require-credentials`: a scenario or step that would be SKIPPED for `missing
//!   credentials [...]` is an ERROR instead (exit 4): what the cloud jobs use, where a skip for
//!   a capability the provider lacks is still a skip.
//! * `--fail-on-skip`: any SKIPPED scenario, or step skipped for its key, fails the run (exit
//!   1), outcomes unchanged: for a job where every selected scenario must run.

mod common;

use common::*;

/// What the summary says under `--require-credentials`, pinned as the user sees it.
#[test]
fn require_credentials_turns_missing_credentials_into_errors() {
    let out = cmd(&[
        "tests/fixtures/passing",
        "tests/fixtures/step-requires/skips.yaml",
        "--require-credentials",
        "--no-progress",
        "-j",
        "1",
    ])
    .env_remove("FIXTURE_MODEL_KEY")
    .env_remove("FIXTURE_ONLY_API_KEY")
    .env_remove("FIXTURE_ONLY_TOKEN")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}{}", text(&out.stdout), text(&out.stderr));
    expect_file(&root().join("tests/fixtures/require-credentials.out"), &redact(&text(&out.stdout)));
    // Without the flag the same run is green, as it is on a laptop.
    let out = cmd(&["tests/fixtures/passing", "tests/fixtures/step-requires/skips.yaml", "--no-progress"])
        .env_remove("FIXTURE_MODEL_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // With every key set, nothing is missing and the strict run passes.
    let out = cmd(&[
        "tests/fixtures/passing",
        "tests/fixtures/step-requires/skips.yaml",
        "--require-credentials",
        "--no-progress",
    ])
    .env("FIXTURE_MODEL_KEY", "set")
    .env("FIXTURE_ONLY_API_KEY", "k")
    .env("FIXTURE_ONLY_TOKEN", "t")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
}

/// A skip for a capability or a provider is not a missing credential: it stays a skip.
#[test]
fn require_credentials_leaves_other_skips_alone() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("p.yaml"),
        "name: cloud only\nrequires:\n  providers: [e2b, alicloud]\nsteps:\n  - create: base\n",
    )
    .unwrap();
    let out = run(&[tmp.path().to_str().unwrap(), "--require-credentials", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("SKIPPED cloud only"), "{}", text(&out.stdout));
}

#[test]
fn fail_on_skip_fails_a_run_with_any_skip_and_says_why() {
    let out = cmd(&["tests/fixtures/passing", "--fail-on-skip", "--no-progress", "-j", "1"])
        .env_remove("FIXTURE_ONLY_API_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let stdout = redact(&text(&out.stdout));
    assert!(
        stdout.ends_with(
            "1 passed, 0 failed, 0 error, 1 skipped, 0 xfail, 0 xpass in <dur>\n\
             --fail-on-skip: 1 skipped scenario fails this run\n"
        ),
        "{stdout}"
    );
    // A step skipped for its key counts too.
    let out = cmd(&["tests/fixtures/step-requires/skips.yaml", "--fail-on-skip", "--no-progress"])
        .env_remove("FIXTURE_MODEL_KEY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout).ends_with("--fail-on-skip: 2 skipped steps fail this run\n"), "{}", text(&out.stdout));
    // Nothing skipped: the flag changes nothing.
    let out = run(&["tests/fixtures/passing/simple.yaml", "--fail-on-skip", "--no-progress"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    assert!(!text(&out.stdout).contains("--fail-on-skip"), "{}", text(&out.stdout));
}

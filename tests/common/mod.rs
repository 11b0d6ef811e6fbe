//! Helpers for tests that run the real binary.
#![allow(dead_code)]

pub mod serve;
pub mod testnet;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test; `SCENARIO_RUN_TEST_BIN` points the tests at another build (to see
/// a regression test fail on the code before its fix).
pub fn bin() -> PathBuf {
    std::env::var_os("SCENARIO_RUN_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_scenario-run")))
}

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The binary, run from the project root with a clean, predictable environment (also when
/// the tests themselves run in GitHub Actions: no annotations or job summary unless a test
/// asks for them).
pub fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.current_dir(root())
        .args(args)
        .env("NO_COLOR", "1")
        .env_remove("E2E_RUN_ID")
        .env_remove("SCENARIO_RUN_TEMPLATES_DIR")
        .env_remove("GITHUB_ACTIONS")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("COLUMNS");
    c
}

pub fn run(args: &[&str]) -> Output {
    cmd(args).output().expect("binary runs")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Replace what varies between runs (durations, run ids, sandbox ids, times) so output can
/// be compared with an expected file.
pub fn redact(s: &str) -> String {
    let rules: &[(&str, &str)] = &[
        (r"\b\d+(\.\d+)?s\b", "<dur>"),
        (r"\b\d+m\d{2}s\b", "<dur>"),
        (r"sr-[0-9a-f]{8}", "<run-id>"),
        (r"sbx?-[0-9a-f]{6,}", "<sandbox>"),
        (r#"timestamp="[^"]*""#, r#"timestamp="<ts>""#),
        (r#"hostname="[^"]*""#, r#"hostname="<host>""#),
        (r#"time="[^"]*""#, r#"time="<t>""#),
    ];
    let mut out = s.to_string();
    for (re, to) in rules {
        out = regex::Regex::new(re).unwrap().replace_all(&out, *to).into_owned();
    }
    out
}

/// Compare with an expected file; `UPDATE_EXPECT=1` rewrites it instead.
pub fn expect_file(path: &Path, actual: &str) {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|_| panic!("missing {}; run with UPDATE_EXPECT=1", path.display()));
    if expected != actual {
        let diff =
            similar::TextDiff::from_lines(&expected, actual).unified_diff().header("expected", "actual").to_string();
        panic!("{} differs (UPDATE_EXPECT=1 rewrites it):\n{diff}", path.display());
    }
}

/// Whether every test must run: in CI (`CI` set, as GitHub Actions and `.ci/run` set it) and
/// under `scripts/test` (`SCENARIO_RUN_TEST_STRICT=1`), which start what the tests need (the
/// Docker stack of `.ci/local-stack.sh`). There a missing tool fails the test; elsewhere (a
/// developer's machine) the test says what it needs and passes over it.
pub fn strict() -> bool {
    let on = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    on("CI") || on("SCENARIO_RUN_TEST_STRICT")
}

/// The value of `var`, which `test` needs (`how`: what provides it). Unset: in CI (see
/// [`strict`]) the test fails saying so; on a developer's machine it prints a SKIPPED line on
/// stderr (shown by `cargo nextest run --no-capture`) and the caller returns.
pub fn needs(var: &str, test: &str, how: &str) -> Option<String> {
    if let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
        return Some(v);
    }
    assert!(
        !strict(),
        "{test}: {var} is not set, and in CI (CI or SCENARIO_RUN_TEST_STRICT is set) every test must run: {how}"
    );
    eprintln!("SKIPPED {test}: {var} is not set ({how}); in CI this test fails instead");
    None
}

/// What provides `DOCKER_HOST` and the registries.
pub const LOCAL_STACK: &str = "scripts/test starts it: .ci/local-stack.sh up, then source $STACK_DIR/env";

/// Template builds on the local provider (and through `serve`) need root and bubblewrap: a
/// machine without them fails these tests loudly (CI has both; a skip would hide a broken
/// build). Returns true so callers read as before.
pub fn can_build() -> bool {
    // SAFETY: getuid cannot fail.
    let root = unsafe { libc::getuid() } == 0;
    let bwrap = Command::new("bwrap").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(root && bwrap, "template builds need root and bubblewrap (scripts/setup installs bubblewrap)");
    true
}

/// The outputs of every step of `kind` in a JSON report.
pub fn step_outputs(report: &Path, kind: &str) -> Vec<serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let mut out = Vec::new();
    for r in doc["results"].as_array().unwrap() {
        for s in r["steps"].as_array().unwrap() {
            if s["kind"] == kind {
                out.push(s["outputs"].clone());
            }
        }
    }
    out
}

/// How many scenarios `--list <args>` selects.
pub fn listed(args: &[&str]) -> usize {
    let mut all = vec!["--no-progress", "--list"];
    all.extend_from_slice(args);
    text(&run(&all).stdout).lines().count()
}

/// The scenarios of a JSON report by outcome: the names that passed and (name, reason) of
/// those skipped. Panics on any other outcome but xfail, and on an xfail whose pin is not strict.
pub fn passed_and_skipped(report: &Path) -> (Vec<String>, Vec<(String, String)>) {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let (mut passed, mut skipped) = (Vec::new(), Vec::new());
    for res in r["results"].as_array().unwrap() {
        let (name, outcome) = (res["name"].as_str().unwrap(), res["outcome"].as_str().unwrap());
        match outcome {
            "passed" => passed.push(name.to_string()),
            "xfail" => assert!(res["known_issue"]["strict"].as_bool().unwrap(), "{name}: pins are strict"),
            "skipped" => skipped.push((name.to_string(), res["reason"].as_str().unwrap().to_string())),
            other => panic!("{name}: {other}: {res}"),
        }
    }
    (passed, skipped)
}

/// Every template folder under `templates/` (the names).
pub fn template_folders() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("templates"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Dockerfile").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The templates that scenarios which PASSED built or deployed in a JSON report, and the
/// steps skipped in them with why (only missing keys may skip a step of a template scenario).
pub fn templates_built_by_passing_scenarios(report: &Path) -> (Vec<String>, Vec<String>) {
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let (mut built, mut skips) = (Vec::new(), Vec::new());
    for res in r["results"].as_array().unwrap().iter().filter(|r| r["outcome"] == "passed") {
        for s in res["steps"].as_array().unwrap() {
            let name = match s["kind"].as_str() {
                Some("build") => s["outputs"]["name"].as_str(),
                Some("deploy") => s["outputs"]["template_id"].as_str(),
                _ => None,
            };
            if let Some(n) = name.filter(|_| s["status"] == "passed") {
                if !built.iter().any(|b| b == n) {
                    built.push(n.to_string());
                }
            }
            if s["status"] == "skipped" && s["message"].as_str().is_some_and(|m| !m.starts_with("if: ")) {
                let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
                skips.push(format!("{}: {}: {}", text(&res["name"]), text(&s["label"]), text(&s["message"])));
            }
        }
    }
    // Templates of a scenario's own (`scenarios/custom/data/`) are not the library's folders.
    let folders = template_folders();
    built.retain(|b| folders.contains(b));
    built.sort();
    (built, skips)
}

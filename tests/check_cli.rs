//! `scenario-run check`, `steps` and `schema`: diagnostics compared with expected output.

mod common;

use common::*;

#[test]
fn every_invalid_fixture_gets_its_expected_diagnostics_and_exit_3() {
    let dir = root().join("tests/fixtures/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 20, "fixtures missing");
    for f in files {
        let rel = f.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
        let out = run(&["check", &rel]);
        assert_eq!(out.status.code(), Some(3), "{rel}: {}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "{rel}: diagnostics go to stderr");
        expect_file(&f.with_extension("err"), &text(&out.stderr));
    }
}

#[test]
fn all_problems_of_all_files_are_reported_at_once() {
    let out = run(&["check", "tests/fixtures/invalid"]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    let count = err.matches("\nerror: ").count() + usize::from(err.starts_with("error: ")) - 1;
    assert!(count >= 20, "expected every diagnostic, got {count}:\n{err}");
    assert!(err.trim_end().ends_with("nothing was run"), "{err}");
}

#[test]
fn nothing_runs_when_one_file_is_invalid() {
    // A valid file next to an invalid one: the run refuses before creating any sandbox.
    let out = run(&["tests/fixtures/passing/simple.yaml", "tests/fixtures/invalid/unknown-kind.yaml", "--no-progress"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(!text(&out.stdout).contains("PASSED"), "{}", text(&out.stdout));
}

#[test]
fn shipped_scenarios_check_clean() {
    let out = run(&["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("ok: "), "{}", text(&out.stdout));
}

#[test]
fn steps_lists_every_kind_from_the_registry() {
    let out = run(&["steps"]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    for kind in scenario_run::steps::registry::names() {
        assert!(
            s.contains(&format!("\n{kind}\n")) || s.starts_with(&format!("{kind}\n")),
            "{kind} missing from `steps`"
        );
    }
    let one = run(&["steps", "exce"]);
    assert_eq!(one.status.code(), Some(2));
    assert!(text(&one.stderr).contains("did you mean `exec`?"));
}

#[test]
fn schema_check_detects_staleness() {
    let out = run(&["schema", "--check"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let tmp = tempfile::tempdir().unwrap();
    let stale = tmp.path().join("s.json");
    std::fs::write(&stale, "{}").unwrap();
    let out = run(&["schema", "--check", "--out", stale.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&["--shard", "5/3"]).status.code(), Some(2));
    assert_eq!(run(&["no/such/dir"]).status.code(), Some(2));
    assert_eq!(run(&["-t", "a and"]).status.code(), Some(2));
}

/// Issue 13: `--step-timeout 1e300` panicked in `Duration::from_secs_f64` (exit 101).
#[test]
fn huge_duration_flags_are_usage_errors() {
    for (flag, value) in [
        ("--step-timeout", "1e300"),
        ("--scenario-timeout", "99999999999999999999h"),
        ("--exec-timeout", "9999999h"),
        ("--grace-period", "1e20"),
        ("--sandbox-ttl", "inf"),
    ] {
        let out = run(&["--list", flag, value]);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {}", text(&out.stderr));
        assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    }
    let out = run(&["cleanup", "--all-tagged", "--older-than", "1e300"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

/// Issue 13: a file of n variables cost n² in duplicate-key detection, and n typos each
/// scanned every variable for a suggestion. The figures are in scripts/reliability; here, that
/// a large file is checked at all and every problem is still reported.
#[test]
fn thousands_of_vars_and_typos_are_all_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 3000;
    let mut yaml = String::from("name: many\nvars:\n");
    for i in 0..n {
        yaml.push_str(&format!("  v{i}: {i}\n"));
    }
    yaml.push_str("  v7: again\nsteps:\n  - create: base\n");
    for i in 0..n {
        yaml.push_str(&format!("  - exec: echo {{{{ vars.w{i} }}}}\n"));
    }
    let f = tmp.path().join("many.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = run(&["check", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains("duplicate key `v7`"), "{}", &err[..500]);
    assert_eq!(err.matches("undefined variable `vars.w").count(), n);
    assert!(err.contains(&format!("{} problems in 1 file", n + 1)), "{}", err.lines().last().unwrap());
    // Suggestions go to the first typos; the rest are reported without one.
    assert!(err.contains("undefined variable `vars.w1`"));
}

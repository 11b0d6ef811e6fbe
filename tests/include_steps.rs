//! Issue 37 item 11: `include:` a steps file with parameters, on the real local provider and
//! through `check`: a folder's search passes over steps files, every diagnostic inside one
//! points at its own line and says which include brought it in, and a step that fails inside
//! one says so too.

mod common;

use common::*;

#[test]
fn included_steps_run_with_their_parameters_and_steps_files_are_not_scenarios() {
    let tmp = tempfile::tempdir().unwrap();
    let report = tmp.path().join("r.json");
    let out = run(&["tests/fixtures/include/ok", "--no-progress", "--json", report.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "passed over tests/fixtures/include/ok/lib/serve.yaml: not a scenario (a steps file for `include:`)"
        ),
        "{err}"
    );
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(r["results"].as_array().unwrap().len(), 1, "only the scenario ran");
    let steps = r["results"][0]["steps"].as_array().unwrap();
    // Each step of a steps file is located in it; the params of each include are its own.
    let reads: Vec<_> = steps.iter().filter(|s| s["kind"] == "exec" && s["id"] == "read").collect();
    assert_eq!(reads.len(), 3, "{steps:?}");
    assert_eq!(reads[0]["location"]["file"], "tests/fixtures/include/ok/lib/serve.yaml");
    assert_eq!(reads[0]["location"]["line"], 10);
    assert_eq!(reads[0]["outputs"]["stdout"], "hello world");
    assert_eq!(reads[1]["outputs"]["stdout"], "HI world");
    assert_eq!(reads[2]["location"]["file"], "tests/fixtures/include/ok/include.yaml");
    let sets: Vec<_> = steps.iter().filter(|s| s["kind"] == "set").collect();
    assert_eq!(
        sets[0]["location"]["file"], "tests/fixtures/include/ok/lib/mark.yaml",
        "nested, relative to its includer"
    );
    assert!(steps.iter().all(|s| s["status"] == "passed"), "{steps:?}");
}

#[test]
fn check_points_inside_included_files_and_names_the_include() {
    let out = run(&["check", "tests/fixtures/include/bad/include.yaml"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    expect_file(&root().join("tests/fixtures/include/bad.err"), &text(&out.stderr));
    // Named on the command line, a steps file is refused with why.
    let out = run(&["check", "tests/fixtures/include/ok/lib/serve.yaml"]);
    assert_eq!(out.status.code(), Some(3));
    let err = text(&out.stderr);
    assert!(err.contains("this is a steps file (`kind: steps`), not a scenario"), "{err}");
    assert!(err.contains("--> tests/fixtures/include/ok/lib/serve.yaml:3:7"), "{err}");
}

#[test]
fn a_failure_inside_an_included_file_says_where_and_which_include() {
    let out = run(&["tests/fixtures/include/failing", "--no-progress"]);
    assert_eq!(out.status.code(), Some(1), "{}{}", text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    // At the step in the steps file, and which include brought it in.
    assert!(
        stdout.contains("FAILED a failure inside an included file › assert-stdout: {{ params.want }} (tests/fixtures/include/failing/lib/expect.yaml:4:5)\n  stdout: expected \"hello world\\n\", found \"bye world\\n\" (included from tests/fixtures/include/failing/include-fails.yaml:6:5)"),
        "{stdout}"
    );
}

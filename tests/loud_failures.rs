//! Issue 26, "no silent wrong answer, part two": runs of the real binary where today's code
//! gave a wrong or missing result without failing the run. Each test is named after the bug.

mod common;

use std::path::Path;

use common::*;

fn write(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path.to_str().unwrap().to_string()
}

/// A scenario that needs no sandbox: it runs in milliseconds.
const NO_SANDBOX: &str = "name: no sandbox\nsteps:\n  - set: { a: 1 }\n  - assert: { that: \"vars.a == 1\" }\n";

/// Item 1: a report that cannot be written (a full disk) fails the run with exit 4 and says
/// which file; JUnit and JSON went through a `BufWriter` that was never flushed and checked.
#[test]
fn a_report_written_to_a_full_disk_fails_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(tmp.path(), "s.yaml", NO_SANDBOX);
    for flag in ["--junit", "--json", "--html"] {
        let out = run(&[&file, "--no-progress", flag, "/dev/full"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{flag} /dev/full: {err}");
        assert!(err.contains("cannot write /dev/full: No space left on device"), "{flag}: {err}");
    }
    // Every report asked for is attempted: one that fails does not stop the others.
    let json = tmp.path().join("run.json");
    let out = run(&[&file, "--no-progress", "--junit", "/dev/full", "--json", json.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(json.is_file(), "the JSON report is still written");
}

//! Issue 26, "no silent wrong answer, part two": runs of the real binary where today's code
//! gave a wrong or missing result without failing the run. Each test is named after the bug.

mod common;

use std::path::Path;

use common::serve::{e2b_cmd, live, serve};
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
    // In GitHub Actions the job summary is one more report.
    let out = cmd(&[&file, "--no-progress"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", "/dev/full")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot write the job summary /dev/full"), "{}", text(&out.stderr));
}

/// Runs `args` on a real terminal (`script` gives it a pty) of `cols` columns; returns the exit
/// code and everything the terminal showed.
fn on_terminal(cols: u16, args: &[&str]) -> (Option<i32>, String) {
    let mut line = format!("stty cols {cols}; exec {}", bin().display());
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    let out = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(root())
        .env_remove("NO_COLOR")
        .env_remove("COLUMNS")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script (util-linux) runs");
    (out.status.code(), text(&out.stdout))
}

/// Item 2: the live view coloured the first 7 bytes of a line that `fit()` had cut to a
/// 7-column terminal, slicing inside the `…` it added: the printer panicked and the run
/// exited 0 with no summary.
#[test]
fn a_seven_column_terminal_with_colour_still_shows_the_summary() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(tmp.path(), "s.yaml", NO_SANDBOX);
    for cols in [1, 3, 7, 8, 12] {
        let (code, shown) = on_terminal(cols, &[&file, "--color", "always"]);
        assert_eq!(code, Some(0), "{cols} columns: {shown}");
        assert!(!shown.contains("panicked"), "{cols} columns: {shown}");
        assert!(shown.contains("1 passed"), "{cols} columns: the summary is shown: {shown}");
    }
}

/// Item 2, at the command line: CRLF output with a non-ASCII character after it (what every
/// PTY sends) was an ERROR "the step panicked"; it is a FAILED with the hint.
#[test]
fn crlf_output_with_a_non_ascii_char_fails_with_a_hint_not_a_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "crlf.yaml",
        "name: crlf\nsteps:\n  - create: base\n  - exec: printf 'a\\r\\nbé\\n'\n  - assert-stdout: { equals: \"A\\nbé\" }\n",
    );
    let out = run(&[&file, "--no-progress"]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}{}", text(&out.stderr));
    assert!(shown.contains("FAILED  crlf"), "{shown}");
    assert!(shown.contains("only line endings, a trailing newline and letter case differ"), "{shown}");
    assert!(!shown.contains("panicked") && !text(&out.stderr).contains("panicked"), "{shown}");
}

/// Item 4: `assert-stdout: { of: X }` where X has no stdout (`set`, `http-get`, `create`, or a
/// step under `expect_error`) checked an empty string, so `not_contains` and `empty` passed
/// vacuously. `check` refuses it at the `of:` value.
#[test]
fn an_assertion_of_a_step_without_that_output_is_refused_by_check() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "of.yaml",
        "name: of\nsteps:\n  - set: { a: 1 }\n    id: s\n  - create: base\n    id: c\n  - http-get: { url: 'http://127.0.0.1:9/' }\n    id: h\n    continue_on_error: true\n  - exec: echo hi\n    id: e\n  - assert-stdout: { of: s, not_contains: secret }\n  - assert-stderr: { of: h, empty: true }\n  - assert-exit: { of: c, code: 0 }\n  - assert-stdout: { of: e, contains: hi }\n",
    );
    let out = run(&["check", &file]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    for (what, at) in [
        ("step `s` has no stdout", "of.yaml:12:26"),
        ("step `h` has no stderr", "of.yaml:13:26"),
        ("step `c` has no exit_code", "of.yaml:14:24"),
    ] {
        assert!(err.contains(what), "{what}: {err}");
        assert!(err.contains(at), "{what} at {at}: {err}");
    }
    assert!(err.contains("3 problems"), "the exec step's own stdout is fine: {err}");
}

/// Item 6: a `.env` value `"C:\\new"` reached scenarios as `C:\` + newline + `ew`.
#[test]
fn an_env_file_backslash_before_n_is_a_backslash() {
    let tmp = tempfile::tempdir().unwrap();
    let env = write(tmp.path(), "x.env", "WIN_PATH=\"C:\\\\new\"\n");
    let file = write(
        tmp.path(),
        "env.yaml",
        "name: env\nsteps:\n  - assert: { that: \"env.WIN_PATH == 'C:' ~ '\\\\\\\\' ~ 'new'\", message: \"got {{ env.WIN_PATH }}\" }\n",
    );
    let out = cmd(&[&file, "--no-progress", "--env-file", &env]).env_remove("WIN_PATH").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
}

/// Item 9: an expired `known_issue.until` made the whole file invalid (exit 3, nothing ran,
/// the other scenarios of the file included). Only that scenario fails, saying so; `check`
/// warns at the date.
#[test]
fn an_expired_known_issue_fails_only_its_scenario() {
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "pins.yaml",
        "name: pinned\nknown_issue: { id: KI-9, reason: broken, until: 2020-01-01 }\nsteps:\n  - set: { a: 1 }\n---\nname: fine\nsteps:\n  - set: { a: 1 }\n",
    );
    let json = tmp.path().join("run.json");
    let out = run(&[&file, "--no-progress", "--json", json.to_str().unwrap()]);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{shown}{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let outcomes: Vec<(&str, &str)> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(outcomes, [("pinned", "failed"), ("fine", "passed")]);
    let pinned = &doc["results"][0];
    assert!(pinned["reason"].as_str().unwrap().contains("known issue KI-9 expired on 2020-01-01"), "{pinned}");
    assert_eq!(pinned["failure"]["location"]["line"], 2, "{pinned}");
    assert!(shown.contains("pins.yaml:2"), "{shown}");

    let out = run(&["check", &file]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("warning: known issue KI-9 expired on 2020-01-01"), "{err}");
    assert!(err.contains("pins.yaml:2:"), "{err}");
}

/// Item 10: `matrix` dropped the scenario files at the top of the folder without a word, and
/// a folder with nothing to run gave `{"include":[]}` and exit 0 (a CI with no jobs at all).
#[test]
fn matrix_keeps_top_level_files_and_refuses_a_folder_with_nothing_to_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("suite");
    std::fs::create_dir_all(root.join("files")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    write(&root, "smoke.yaml", NO_SANDBOX);
    write(&root.join("files"), "a.yaml", NO_SANDBOX);
    let r = root.to_str().unwrap();
    let out = run(&["matrix", "--emit", "github", r]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        m,
        serde_json::json!({ "include": [
            { "area": "files", "path": format!("{r}/files") },
            { "area": "smoke.yaml", "path": format!("{r}/smoke.yaml") },
        ]})
    );
    let out = run(&["matrix", "--emit", "lines", r]);
    assert_eq!(text(&out.stdout), format!("{r}/files\n{r}/smoke.yaml\n"));

    // A flat folder of files: one entry per file.
    let flat = tmp.path().join("flat");
    std::fs::create_dir_all(&flat).unwrap();
    write(&flat, "one.yaml", NO_SANDBOX);
    let out = run(&["matrix", flat.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("one.yaml"), "{}", text(&out.stdout));

    // Nothing to run: an error, not an empty matrix.
    let out = run(&["matrix", root.join("empty").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("no scenario files"), "{}", text(&out.stderr));
}

/// Item 10: `create { keep: true }` under `--provider e2b` (here against `serve`) was destroyed
/// at the end of the run anyway, by the provider's destroy-all and the sweep of the run's tag.
#[test]
fn a_kept_sandbox_outlives_the_run_on_an_e2b_provider() {
    let srv = serve();
    let tmp = tempfile::tempdir().unwrap();
    let file = write(
        tmp.path(),
        "keep.yaml",
        "name: keep\nsteps:\n  - create: { template: base, keep: true, as: kept }\n  - create: { template: base, as: gone }\n  - exec: echo hi\n",
    );
    let out = e2b_cmd(&srv, &[&file]).env("E2E_RUN_ID", "keep-test").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(live(&srv), 1, "the kept sandbox is alive, the other one destroyed");
    // The janitor still finds it by the run's tag.
    let url = format!("http://127.0.0.1:{}", srv.port);
    let out = cmd(&["cleanup", "--provider", "e2b", "--run-id", "keep-test", "--yes"])
        .env("E2B_API_KEY", &srv.key)
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_DOMAIN", format!("localhost:{}", srv.port))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(live(&srv), 0);
}

/// Item 15: the `-k`/`-t` parser recursed once per `(` or `not`; `((((…` overflowed the stack
/// and the process died of SIGSEGV. Deep nesting is a usage error with a clear message.
#[test]
fn a_deeply_nested_selection_is_a_usage_error_not_a_stack_overflow() {
    let deep_parens = format!("{}a{}", "(".repeat(60_000), ")".repeat(60_000));
    let deep_nots = "not ".repeat(30_000) + "a";
    let long_chain = vec!["a"; 20_000].join(" and ");
    for (flag, expr) in [("-k", &deep_parens), ("-t", &deep_nots), ("-k", &long_chain)] {
        let out = run(&["tests/fixtures/passing", "--list", flag, expr]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("too deep") || err.contains("too long"), "{flag}: {err}");
    }
    // Reasonable nesting still works.
    let out = run(&["tests/fixtures/passing", "--list", "-k", "((((passing))))"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

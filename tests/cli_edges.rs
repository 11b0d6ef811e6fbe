//! Issue 13, "a green run that is wrong", at the command line: an unknown provider, a
//! selection that matches nothing, a closed pipe, and which `.env` file wins.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// A pipe whose reader is already closed: every write to it fails with EPIPE, at once and
/// every time (a reader closed later would race with the first writes).
fn closed_pipe() -> std::io::PipeWriter {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    writer
}

fn run_into_closed_pipes(mut c: Command) -> (Option<i32>, String) {
    let (err_reader, err_writer) = std::io::pipe().unwrap();
    let mut child = c.stdout(closed_pipe()).stderr(err_writer).stdin(Stdio::null()).spawn().unwrap();
    drop(c); // the parent's copies of the pipe ends
    let mut err = String::new();
    std::io::Read::read_to_string(&mut { err_reader }, &mut err).unwrap();
    (child.wait().unwrap().code(), err)
}

#[test]
fn an_unknown_provider_is_a_usage_error_exit_2() {
    let out = run(&["--list", "--provider", "nosuch"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("possible values: local, docker, e2b, alicloud"), "{}", text(&out.stderr));
    let out = run(&["cleanup", "--provider", "nosuch", "--all-tagged"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = cmd(&["--list"]).env("SCENARIO_RUN_PROVIDER", "nosuch").output().unwrap();
    assert_eq!(out.status.code(), Some(2), "from the environment too: {}", text(&out.stderr));
}

#[test]
fn a_selection_that_matches_nothing_fails_unless_allowed() {
    for filter in [["-t", "nosuchtag"], ["-k", "nonexistent"], ["-k", "files and commands"]] {
        let out = run(&["--no-progress", filter[0], filter[1]]);
        assert_eq!(out.status.code(), Some(2), "{filter:?}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(err.contains(&format!("no scenario matches {} '{}'", filter[0], filter[1])), "{err}");
        assert!(err.contains("--no-scenarios=pass"), "the way out is named: {err}");
        assert!(out.stdout.is_empty(), "nothing ran");
    }
    let out = run(&["tests/fixtures/passing", "--no-progress", "-t", "nosuchtag", "--no-scenarios=warn"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("warning: no scenario matches -t 'nosuchtag'"), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("0 passed"), "{}", text(&out.stdout));
    let out = run(&["tests/fixtures/passing", "--no-progress", "-t", "nosuchtag", "--no-scenarios", "pass"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("warning"), "{}", text(&out.stderr));
    // Issue 26 item 10: listing answers as the run would (it exited 0 where the run exits 2).
    let out = run(&["--list", "-t", "nosuchtag"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no scenario matches -t 'nosuchtag'"), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let out = run(&["--list", "-t", "nosuchtag", "--no-scenarios=warn"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("0 scenarios selected"), "zero is plural");
}

/// `--list | head`, `schema --out - | head` and friends exited 101 with a panic message.
#[test]
fn output_into_a_closed_pipe_is_not_a_panic() {
    let commands: &[&[&str]] = &[
        &["--list"],
        &["schema", "--out", "-"],
        &["steps"],
        &["steps", "exec"],
        &["matrix"],
        &["matrix", "--emit", "lines"],
        &["check"],
        &["cleanup", "--all-tagged"],
        &["tests/fixtures/passing", "--no-progress", "-j", "1"],
    ];
    for args in commands {
        let (code, err) = run_into_closed_pipes(cmd(args));
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // And with stderr closed as well (`2>&1 | head`).
        let mut c = cmd(args);
        c.stdout(closed_pipe()).stderr(closed_pipe()).stdin(Stdio::null());
        let status = c.status().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?} with stderr closed too");
    }
    // A command that fails still says so by its exit code.
    let (code, _) = run_into_closed_pipes(cmd(&["check", "tests/fixtures/invalid/unknown-kind.yaml"]));
    assert_eq!(code, Some(3));
}

fn write(dir: &Path, name: &str, body: &str) {
    std::fs::write(dir.join(name), body).unwrap();
}

/// docs/reference.md: "`./.env` is read first, then each `--env-file`; a variable set in the shell always
/// wins." `.env` used to be copied into the process environment, where it counted as the
/// shell's and beat every `--env-file`.
#[test]
fn env_files_beat_dot_env_and_the_shell_beats_both() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(
        d,
        "s.yaml",
        "name: precedence\nsteps:\n  - assert: { that: \"env.PRECEDENCE_PROBE == vars.want\", message: \"{{ env.PRECEDENCE_PROBE }}\" }\n",
    );
    write(d, ".env", "PRECEDENCE_PROBE=dotenv\nSCENARIO_RUN_NO_SCENARIOS=pass\n");
    write(d, "a.env", "PRECEDENCE_PROBE=first-file\nSCENARIO_RUN_NO_SCENARIOS=fail\n");
    write(d, "b.env", "PRECEDENCE_PROBE=second-file\n");
    let go = |args: &[&str], shell: Option<&str>| {
        let mut c = Command::new(bin());
        c.current_dir(d).args(["s.yaml", "--no-progress"]).args(args).env("NO_COLOR", "1");
        c.env_remove("PRECEDENCE_PROBE").env_remove("SCENARIO_RUN_NO_SCENARIOS");
        if let Some(v) = shell {
            c.env("PRECEDENCE_PROBE", v);
        }
        let out = c.output().unwrap();
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };
    let (code, out) = go(&["--var", "want=dotenv"], None);
    assert_eq!(code, Some(0), ".env alone: {out}");
    let (code, out) = go(&["--env-file", "a.env", "--var", "want=first-file"], None);
    assert_eq!(code, Some(0), "--env-file over .env: {out}");
    let (code, out) = go(&["--env-file", "a.env", "--env-file", "b.env", "--var", "want=second-file"], None);
    assert_eq!(code, Some(0), "the later --env-file wins: {out}");
    let (code, out) = go(&["--env-file", "a.env", "--var", "want=shell"], Some("shell"));
    assert_eq!(code, Some(0), "the shell wins: {out}");
    // Flags that read a variable follow the same order: .env says pass, a.env says fail.
    let (code, out) = go(&["--var", "want=x", "-t", "nosuchtag"], None);
    assert_eq!(code, Some(0), ".env's SCENARIO_RUN_NO_SCENARIOS=pass: {out}");
    let (code, out) = go(&["--var", "want=x", "-t", "nosuchtag", "--env-file", "a.env"], None);
    assert_eq!(code, Some(2), "a.env's SCENARIO_RUN_NO_SCENARIOS=fail beats .env: {out}");
    let (code, out) =
        go(&["--var", "want=x", "-t", "nosuchtag", "--env-file", "a.env", "--no-scenarios", "pass"], None);
    assert_eq!(code, Some(0), "the flag beats every file: {out}");
}

/// Issue 39, a lean client: `scenario-run serve` becomes the server binary beside it, whose
/// flags, help and errors are serve's; the client binary holds none of the server's code.
#[test]
fn serve_is_a_binary_of_its_own_that_the_client_becomes() {
    let out = run(&["serve", "--help"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let help = text(&out.stdout);
    assert!(help.contains("Usage: scenario-run serve [OPTIONS]") && help.contains("--listen"), "{help}");
    let out = run(&["serve", "--listen", "nowhere"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("invalid value 'nowhere' for '--listen"), "{}", text(&out.stderr));

    // A message only the server prints: in the server's binary, not in the client's.
    let needle = "serve: platform faults on (--fault): ";
    let holds = |path: &Path| {
        let bytes = std::fs::read(path).unwrap();
        aho_corasick::AhoCorasick::new([needle]).unwrap().find(&bytes[..]).is_some()
    };
    let server = bin().with_file_name("scenario-run-serve");
    assert!(holds(&server), "{} lacks the server's message: the probe proves nothing", server.display());
    assert!(!holds(&bin()), "{} holds the server's code", bin().display());

    // Alone, without the server beside it or on PATH, the client says what is missing.
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("scenario-run");
    std::fs::copy(bin(), &alone).unwrap();
    let out = Command::new(&alone).args(["serve", "--help"]).env("PATH", dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("cannot start scenario-run-serve"), "{}", text(&out.stderr));
}

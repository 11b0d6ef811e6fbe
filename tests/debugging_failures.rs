//! Issue 37 item 10, debugging a failure: `--keep-on-failure` keeps exactly the failing
//! scenario's sandbox, says how to reach it, and `scenario-run shell` reaches it (a command,
//! and a real terminal through `script`'s pseudo-terminal); without the flag nothing is kept;
//! `--lf`/`--ff` rerun the last failures only or first, from the record the last run left.
//!
//! Real parts: the binary, the local provider (namespaces, as root), a state directory and a
//! last-run record of each test's own.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::*;

/// One scenario that passes and one that fails after leaving a mark in its sandbox.
const SCENARIOS: &str = "\
name: passes
steps:
  - create: base
  - exec: { cmd: 'echo passing > /tmp/mark', exit_code: 0 }
---
name: fails
steps:
  - create: base
  - exec: { cmd: 'echo kept-for-debugging > /tmp/mark; exit 3', exit_code: 0 }
";

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("sr37-").tempdir().unwrap();
        std::fs::write(dir.path().join("s.yaml"), SCENARIOS).unwrap();
        std::fs::create_dir(dir.path().join("state")).unwrap();
        Self { dir }
    }
    fn file(&self) -> String {
        self.dir.path().join("s.yaml").display().to_string()
    }
    /// The binary with this test's state directory and last-run record.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = cmd(args);
        c.env("SCENARIO_RUN_STATE_DIR", self.dir.path().join("state"))
            .env("SCENARIO_RUN_CACHE_DIR", self.dir.path().join("cache"))
            .env_remove("SCENARIO_RUN_PROVIDER");
        c
    }
    fn shell(&self, id: &str, command: &[&str]) -> std::process::Output {
        let mut args = vec!["shell", id, "--provider", "local", "--"];
        args.extend_from_slice(command);
        self.cmd(&args).stdin(Stdio::null()).output().unwrap()
    }
}

/// The run's stdout lines as they come, and the child.
fn spawn_lines(mut c: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null()).spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    for stream in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
    }
    (child, rx)
}

/// Lines until one contains `want` (all of them, that one last); panics after `within`.
fn lines_until(rx: &mpsc::Receiver<String>, want: &str, within: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + within;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(want);
                seen.push(line);
                if done {
                    return seen;
                }
            }
            Err(_) => panic!("no line with {want:?} within {within:?}; saw:\n{}", seen.join("\n")),
        }
    }
}

/// The scenario results of a JSON report: (name, sandboxes).
fn sandboxes(report: &Path) -> Vec<(String, Vec<String>)> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let ids = r["sandboxes"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            (r["name"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

#[test]
fn keep_on_failure_keeps_only_the_failing_sandbox_and_shell_reaches_it() {
    let s = Setup::new();
    let report = s.dir.path().join("r.json");
    let (mut run, rx) = spawn_lines(s.cmd(&[
        &s.file(),
        "--provider",
        "local",
        "--no-progress",
        "--keep-on-failure",
        "--json",
        report.to_str().unwrap(),
    ]));
    let lines = lines_until(&rx, "it waits here until Ctrl-C", Duration::from_secs(180));
    let all = lines.join("\n");
    let ids = sandboxes(&report);
    let failing = &ids.iter().find(|(n, _)| n == "fails").unwrap().1[0];
    let passing = &ids.iter().find(|(n, _)| n == "passes").unwrap().1[0];
    assert!(all.contains("kept 1 sandbox of failing scenarios (--keep-on-failure)"), "{all}");
    assert!(all.contains(&format!("scenario-run shell {failing} --provider local")), "how to reach it: {all}");
    assert!(!all.contains(passing.as_str()), "the passing scenario's sandbox is not offered: {all}");

    // The way in is root's alone. The test's folders are opened to everyone first, so only
    // the socket's own directory stands between another user and the sandbox.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    for d in [s.dir.path().to_path_buf(), s.dir.path().join("state")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let sock = s.dir.path().join("state").join(format!("{failing}.shell")).join("sock");
    let private = std::fs::metadata(sock.parent().unwrap()).unwrap();
    assert_eq!((private.mode() & 0o777, private.uid()), (0o700, 0), "the socket's directory");
    let as_nobody = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"])
        .arg(format!(
            "import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect({:?})\n    print('connected')\nexcept OSError as e:\n    print(type(e).__name__)",
            sock.display().to_string()
        ))
        .output()
        .unwrap();
    assert_eq!(text(&as_nobody.stdout), "PermissionError\n", "nobody: {}", text(&as_nobody.stderr));
    // From inside the sandbox the host's state directory is not there at all.
    let out =
        s.shell(failing, &["test", "-e", &sock.display().to_string(), "&&", "echo", "seen", "||", "echo", "absent"]);
    assert_eq!(text(&out.stdout), "absent\n", "{}", text(&out.stderr));

    // One command, its output and its exit code.
    let out = s.shell(failing, &["cat", "/tmp/mark"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "kept-for-debugging\n", "the failing scenario's own sandbox, as it was");
    let out = s.shell(failing, &["echo", "to-stderr", ">&2;", "exit", "7"]);
    assert_eq!(out.status.code(), Some(7), "the command's exit code: {}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "to-stderr\n");
    // The passing scenario's sandbox is gone.
    let out = s.shell(passing, &["true"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("no kept local sandbox {passing}")), "{}", text(&out.stderr));

    // A terminal: `script` gives the shell a pseudo-terminal; what is typed runs in the
    // sandbox, and the shell's exit code comes back.
    let shell_cmd = format!(
        "SCENARIO_RUN_STATE_DIR={} {} shell {failing} --provider local",
        s.dir.path().join("state").display(),
        bin().display()
    );
    let mut script = Command::new("script")
        .args(["-qec", &shell_cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    std::io::Write::write_all(
        script.stdin.as_mut().unwrap(),
        b"test -t 0 && echo tty-$((6*7)); cat /tmp/mark; exit 5\n",
    )
    .unwrap();
    let out = script.wait_with_output().unwrap();
    let seen = text(&out.stdout).replace('\r', "");
    assert!(seen.contains("tty-42\n"), "the command has a terminal: {seen}\n{}", text(&out.stderr));
    assert!(seen.contains("kept-for-debugging\n"), "{seen}");
    assert_eq!(out.status.code(), Some(5), "the shell's exit code: {seen}");

    // Without a terminal and without a command: said, not hung.
    let out = s.cmd(&["shell", failing, "--provider", "local"]).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("standard input is not a terminal"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("scenario-run shell {failing} --provider local -- CMD")));

    // Ctrl-C ends the wait and kills the kept sandbox; the run keeps its own exit code.
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(1), "the run failed a scenario");
    let rest: Vec<String> = rx.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("killed 1 kept sandbox")), "{rest:?}");
    let out = s.shell(failing, &["true"]);
    assert_eq!(out.status.code(), Some(4), "gone with its run: {}", text(&out.stderr));
}

#[test]
fn without_keep_on_failure_nothing_is_kept() {
    let s = Setup::new();
    let report = s.dir.path().join("r.json");
    let out = s
        .cmd(&[&s.file(), "--provider", "local", "--no-progress", "--json", report.to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "the run ends by itself: {}", text(&out.stderr));
    let all = text(&out.stdout) + &text(&out.stderr);
    assert!(!all.contains("--keep-on-failure") && !all.contains("scenario-run shell"), "{all}");
    let ids = sandboxes(&report);
    let failing = &ids.iter().find(|(n, _)| n == "fails").unwrap().1[0];
    let out = s.shell(failing, &["true"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&format!("no kept local sandbox {failing}")), "{}", text(&out.stderr));
}

/// The names of the scenarios a plain-lines run finished, in order.
fn finished(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            matches!(w.next(), Some("PASSED" | "FAILED" | "ERROR")).then(|| w.next().unwrap().to_string())
        })
        .collect()
}

#[test]
fn lf_and_ff_rerun_the_last_failures_only_or_first() {
    let s = Setup::new();
    let run = |extra: &[&str]| {
        let file = s.file();
        let mut args = vec![file.as_str(), "--provider", "local", "--no-progress", "-j", "1"];
        args.extend_from_slice(extra);
        let out = s.cmd(&args).stdin(Stdio::null()).output().unwrap();
        (out.status.code(), finished(&text(&out.stdout)), text(&out.stderr))
    };
    // No last run: said, and everything runs (as pytest does).
    let (code, ran, err) = run(&["--lf"]);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(ran, ["passes", "fails"], "{err}");
    assert!(err.contains("--lf: no last run recorded"), "{err}");
    assert!(err.contains("running every selected scenario"), "{err}");
    // That run recorded its failure: --lf runs it alone.
    let (code, ran, err) = run(&["--lf"]);
    assert_eq!((code, ran), (Some(1), vec!["fails".to_string()]), "{err}");
    assert!(err.contains("--lf: running the 1 scenario that failed last time (1 deselected)"), "{err}");
    // --ff: the failure first, then the rest.
    let (code, ran, err) = run(&["--ff"]);
    assert_eq!((code, ran), (Some(1), vec!["fails".to_string(), "passes".to_string()]), "{err}");
    assert!(err.contains("--ff: running the 1 scenario that failed last time first, then 1 more"), "{err}");
    // Once it passes it is forgotten: --lf then runs every scenario again.
    std::fs::write(s.dir.path().join("s.yaml"), SCENARIOS.replace("exit 3", "exit 0")).unwrap();
    let (code, ran, err) = run(&["--lf"]);
    assert_eq!((code, ran), (Some(0), vec!["fails".to_string()]), "{err}");
    let (code, ran, err) = run(&["--lf"]);
    assert_eq!((code, ran), (Some(0), vec!["passes".to_string(), "fails".to_string()]), "{err}");
    assert!(err.contains("--lf: no scenario of this selection failed last time"), "{err}");
}

/// Ctrl-C cleans everything: also what a scenario that failed before it had kept, and the run
/// does not wait.
#[test]
fn ctrl_c_kills_what_keep_on_failure_had_kept() {
    let s = Setup::new();
    let slow = format!(
        "{SCENARIOS}---\nname: slow\nsteps:\n  - create: base\n  - exec: {{ cmd: 'sleep 120', timeout: 3m }}\n"
    );
    std::fs::write(s.dir.path().join("s.yaml"), slow).unwrap();
    let report = s.dir.path().join("r.json");
    let (mut run, rx) = spawn_lines(s.cmd(&[
        &s.file(),
        "--provider",
        "local",
        "--no-progress",
        "--keep-on-failure",
        "--json",
        report.to_str().unwrap(),
    ]));
    lines_until(&rx, "FAILED  fails", Duration::from_secs(180));
    std::thread::sleep(Duration::from_secs(1));
    unsafe { libc::kill(run.id() as i32, libc::SIGINT) };
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let rest: Vec<String> = rx.try_iter().collect();
    let all = rest.join("\n");
    assert!(all.contains("interrupted: killed 1 sandbox(es) --keep-on-failure had kept"), "{all}");
    assert!(!all.contains("it waits here"), "{all}");
    let ids = sandboxes(&report);
    let failing = &ids.iter().find(|(n, _)| n == "fails").unwrap().1[0];
    let out = s.shell(failing, &["true"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
}

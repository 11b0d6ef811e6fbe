//! The interrupt storm (issue 13): runs of the shipped fast scenarios interrupted at random
//! moments with SIGINT, a double SIGINT, SIGTERM, or SIGKILL followed by what a next run (or the
//! janitor) does, on the local provider and through `serve`. After each, everything the run made
//! is counted: its processes, mounts, state directories, cgroups, mount points and (through
//! `serve`) sandboxes. Zero of each is tolerated. `STORM_RUNS` sets how many runs per provider
//! (default 6, the quick mode `scripts/test` runs); `scripts/reliability` prints the figures.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Leaks {
    processes: usize,
    mounts: usize,
    state: usize,
    cgroups: usize,
    mount_points: usize,
    sandboxes: usize,
}

impl Leaks {
    fn add(&mut self, o: Leaks) {
        self.processes += o.processes;
        self.mounts += o.mounts;
        self.state += o.state;
        self.cgroups += o.cgroups;
        self.mount_points += o.mount_points;
        self.sandboxes += o.sandboxes;
    }
}

#[derive(Clone, Copy, Debug)]
enum Blow {
    Int,
    DoubleInt,
    Term,
    Kill,
}

const BLOWS: [Blow; 4] = [Blow::Int, Blow::DoubleInt, Blow::Term, Blow::Kill];

/// A small deterministic generator (the storm's moments are reproducible from the seed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// What run `pid` (the scenario-run process) left behind on this machine: processes and
/// mounts of its sandboxes, cgroups and mount points named after it, state under `state`.
fn leftovers(pid: u32, state: &Path) -> Leaks {
    let tag = format!("{pid}.");
    let mut l = Leaks::default();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cgroup.contains(&format!("/scenario-run/{tag}"))
            || cmdline.contains(&format!("/run/scenario-run/roots/{tag}"))
        {
            l.processes += 1;
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let st = state.display().to_string();
    l.mounts = mountinfo.lines().filter(|m| m.contains(&st) || m.contains("/run/scenario-run/roots/")).count();
    l.state = std::fs::read_dir(state)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with("sbx-") || n.starts_with("tpl-") || n.starts_with("probe-")
                })
                .count()
        })
        .unwrap_or(0);
    for ctrl in ["memory", "cpu", "pids", "cpuset", "freezer"] {
        l.cgroups += std::fs::read_dir(format!("/sys/fs/cgroup/{ctrl}/scenario-run"))
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&tag)).count())
            .unwrap_or(0);
    }
    l.mount_points = std::fs::read_dir("/run/scenario-run/roots")
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&tag)).count())
        .unwrap_or(0);
    l
}

/// Polls `leftovers` until it is zero or `within` passes (teardown takes a moment).
fn settle(pid: u32, state: &Path, within: Duration) -> Leaks {
    let deadline = Instant::now() + within;
    loop {
        let l = leftovers(pid, state);
        if l == Leaks::default() || Instant::now() >= deadline {
            return l;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

const SET: &[&str] = &["scenarios/commands", "scenarios/files", "scenarios/lifecycle", "-t", "not slow"];

/// Starts a run (with `extra` arguments and environment), interrupts it with `blow` after
/// `after`, and returns its pid and exit status.
fn interrupted_run(
    extra: &[&str],
    env: &[(&str, String)],
    state: &Path,
    blow: Blow,
    after: Duration,
) -> (u32, Option<i32>) {
    let mut args: Vec<&str> = SET.to_vec();
    args.extend_from_slice(&["--no-progress", "-j", "4"]);
    args.extend_from_slice(extra);
    let mut c = cmd(&args);
    c.env("SCENARIO_RUN_STATE_DIR", state).stdout(Stdio::null()).stderr(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let pid = child.id();
    std::thread::sleep(after);
    match blow {
        Blow::Int => signal(&child, libc::SIGINT),
        Blow::DoubleInt => {
            signal(&child, libc::SIGINT);
            std::thread::sleep(Duration::from_millis(50));
            signal(&child, libc::SIGINT);
        }
        Blow::Term => signal(&child, libc::SIGTERM),
        Blow::Kill => signal(&child, libc::SIGKILL),
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (pid, st.code());
        }
        assert!(Instant::now() < deadline, "a run did not end within 60 s of {blow:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn runs() -> usize {
    std::env::var("STORM_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(6)
}

#[test]
fn interrupt_storm_on_the_local_provider_leaks_nothing() {
    let state = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed_0001 ^ u64::from(std::process::id()));
    let mut total = Leaks::default();
    let n = runs();
    for i in 0..n {
        let blow = BLOWS[i % BLOWS.len()];
        let after = Duration::from_millis(200 + rng.next() % 2500);
        let (pid, code) = interrupted_run(&["--provider", "local"], &[], state.path(), blow, after);
        match blow {
            // It may have finished before the signal: 0 or 1; interrupted: 130.
            Blow::Int | Blow::DoubleInt | Blow::Term => {
                assert!(matches!(code, Some(0 | 1 | 130)), "run {i} ({blow:?} after {after:?}) exited {code:?}")
            }
            Blow::Kill => {
                // What a killed run leaves on disk the next run sweeps: start one.
                let out = cmd(&["scenarios/lifecycle/connect.yaml", "--no-progress"])
                    .env("SCENARIO_RUN_STATE_DIR", state.path())
                    .output()
                    .unwrap();
                assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
            }
        }
        let l = settle(pid, state.path(), Duration::from_secs(15));
        assert_eq!(l, Leaks::default(), "run {i}: {blow:?} after {after:?} left {l:?}");
        total.add(l);
    }
    eprintln!(
        "interrupt storm (local): {n} runs, leaked processes {}, mounts {}, state {}, cgroups {}, mount points {}",
        total.processes, total.mounts, total.state, total.cgroups, total.mount_points
    );
}

/// Regression: a run SIGKILLed while one of its sandboxes was paused left that sandbox's
/// processes frozen: SIGKILL does not end a frozen cgroup v1 task until it is thawed, so the
/// next run's sweep killed them in vain and could not remove their groups (the CI's storm
/// caught 6 processes and 5 groups). The sweep thaws what it kills.
#[test]
fn a_run_killed_while_a_sandbox_is_paused_leaves_nothing_after_the_next_run() {
    let state = tempfile::tempdir().unwrap();
    let scenario = state.path().join("paused.yaml");
    std::fs::write(
        &scenario,
        "name: paused when killed\nsteps:\n  - create: base\n  - exec: { cmd: \"sleep 600\", background: true }\n  - pause: {}\n  - sleep: 10m\n",
    )
    .unwrap();
    let state_dir = state.path().join("state");
    let mut child = cmd(&[scenario.to_str().unwrap(), "--no-progress"])
        .env("SCENARIO_RUN_STATE_DIR", &state_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    // Paused: the group's freezer says so (v1; on v2, `cgroup.freeze`).
    let frozen = || {
        std::fs::read_dir("/sys/fs/cgroup/freezer/scenario-run")
            .map(|d| {
                d.flatten().any(|e| {
                    e.file_name().to_string_lossy().starts_with(&format!("{pid}."))
                        && std::fs::read_to_string(e.path().join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
                })
            })
            .unwrap_or(false)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !frozen() {
        assert!(Instant::now() < deadline, "the sandbox was never paused");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its sandbox was paused");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();
    // The frozen processes outlive their killed run until a run sweeps them. Any run on this
    // host sweeps the groups of dead runs, so another test's run may have done it already
    // (nextest runs many at once): then what is checked below is that sweep's work.
    if leftovers(pid, &state_dir).processes == 0 {
        eprintln!("another run swept the killed run's frozen sandbox first");
    }
    let out = cmd(&["scenarios/lifecycle/connect.yaml", "--no-progress"])
        .env("SCENARIO_RUN_STATE_DIR", &state_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let l = settle(pid, &state_dir, Duration::from_secs(15));
    assert_eq!(l, Leaks::default(), "the next run's sweep left {l:?}");
}

/// The serve process, killed if the test ends early (a failed assertion must not leave it).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            signal(&self.0, libc::SIGTERM);
            let _ = self.0.wait();
        }
    }
}

/// A raw request to serve; returns (status, body).
fn http(port: u16, method: &str, path: &str, key: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-API-KEY: {key}\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.split_whitespace().nth(1).unwrap_or("0").parse().unwrap_or(0);
    (status, resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Sandboxes serve holds with metadata `e2e=<run_id>`.
fn tagged(port: u16, key: &str, run_id: &str) -> usize {
    let (status, body) = http(port, "GET", "/v2/sandboxes", key);
    assert_eq!(status, 200, "{body}");
    body.matches(&format!("\"e2e\":\"{run_id}\"")).count()
}

#[test]
fn interrupt_storm_through_serve_leaks_no_sandbox() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let key = format!("storm_{:040x}", 0xbeef_u128 * 7_000_003 + u128::from(port));
    let listen = format!("127.0.0.1:{port}");
    let serve_state = tempfile::tempdir().unwrap();
    let mut server = Server(
        cmd(&["serve", "--listen", &listen])
            .env("E2B_API_KEY", &key)
            .env("SCENARIO_RUN_STATE_DIR", serve_state.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(server.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("listening on"), "{line}");
    let url = format!("http://127.0.0.1:{port}");
    let env = |run_id: &str| {
        vec![
            ("E2B_API_KEY", key.clone()),
            ("E2B_API_URL", url.clone()),
            ("E2B_SANDBOX_URL", url.clone()),
            ("E2B_DOMAIN", format!("localhost:{port}")),
            ("E2E_RUN_ID", run_id.to_string()),
        ]
    };
    let client_state = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x5eed_0002 ^ u64::from(std::process::id()));
    let (mut leaked, n) = (0, runs());
    for i in 0..n {
        let blow = BLOWS[i % BLOWS.len()];
        let after = Duration::from_millis(200 + rng.next() % 2500);
        let run_id = format!("storm-{}-{i}", std::process::id());
        let vars = env(&run_id);
        let (_, code) = interrupted_run(&["--provider", "e2b"], &vars, client_state.path(), blow, after);
        if let Blow::Kill = blow {
            // A killed client cannot clean up: the janitor finds its sandboxes by the run tag.
            let mut c = cmd(&["cleanup", "--provider", "e2b", "--run-id", &run_id, "--yes"]);
            for (k, v) in &vars {
                c.env(k, v);
            }
            let out = c.output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        } else {
            assert!(matches!(code, Some(0 | 1 | 130)), "run {i} ({blow:?} after {after:?}) exited {code:?}");
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut left = tagged(port, &key, &run_id);
        while left > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            left = tagged(port, &key, &run_id);
        }
        assert_eq!(left, 0, "run {i}: {blow:?} after {after:?} left {left} sandbox(es) on serve");
        leaked += left;
    }
    signal(&server.0, libc::SIGTERM);
    let _ = server.0.wait();
    let l = settle(server.0.id(), serve_state.path(), Duration::from_secs(15));
    assert_eq!(l, Leaks::default(), "serve left {l:?} after it stopped");
    eprintln!("interrupt storm (serve): {n} runs, leaked sandboxes {leaked}, leaked after serve stopped {l:?}");
}

/// A Ctrl-C while the run is still starting (here: while the local provider probes its
/// isolation, the moment its state directory appears) ends the run as one during it does:
/// exit 130, nothing left. It used to kill the process with SIGINT's default action, which the
/// storm saw as "exited None" on a loaded machine.
#[test]
fn an_interrupt_while_the_run_starts_ends_it_with_130() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        let base = tempfile::tempdir().unwrap();
        let state = base.path().join("state");
        let mut args: Vec<&str> = SET.to_vec();
        args.extend_from_slice(&["--no-progress", "--provider", "local"]);
        let mut child = cmd(&args)
            .env("SCENARIO_RUN_STATE_DIR", &state)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !state.exists() {
            assert!(child.try_wait().unwrap().is_none(), "the run ended before its provider started");
            assert!(Instant::now() < deadline, "no state directory within 30 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        signal(&child, sig);
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(130), "signal {sig}: {status:?}\n{err}");
        assert_eq!(settle(child.id(), &state, Duration::from_secs(10)), Leaks::default(), "signal {sig}");
    }
}

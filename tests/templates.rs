//! Template builds on the local provider, through the real binary: the shipped python-hello
//! scenario, one build per folder digest per run, removal at the end of the run, and `keep`.

mod common;

use std::path::Path;

use common::*;

fn builds_in(state: &Path) -> Vec<String> {
    std::fs::read_dir(state)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tpl-"))
                .collect()
        })
        .unwrap_or_default()
}

/// A template folder `name` with `dockerfile` and a scenario `steps` using it, under a fresh
/// temporary directory: the command that runs the scenario with its own state directory (kept
/// builds turned off) and that state directory.
struct Workbench {
    dir: tempfile::TempDir,
}

impl Workbench {
    fn new(name: &str, dockerfile: &str, steps: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tpl = dir.path().join("work/templates").join(name);
        std::fs::create_dir_all(&tpl).unwrap();
        std::fs::write(tpl.join("template.yaml"), format!("name: {name}\n")).unwrap();
        std::fs::write(tpl.join("Dockerfile"), dockerfile).unwrap();
        std::fs::write(dir.path().join("work/build.yaml"), format!("name: {name}\nsteps:\n{steps}")).unwrap();
        Self { dir }
    }

    fn state_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("state")
    }

    fn cmd(&self) -> std::process::Command {
        let work = self.dir.path().join("work");
        let mut c = cmd(&[work.join("build.yaml").to_str().unwrap(), "--no-progress"]);
        c.env("SCENARIO_RUN_STATE_DIR", self.state_dir())
            .env("SCENARIO_RUN_TEMPLATES_DIR", work.join("templates"))
            .env_remove(scenario_run::steps::build::KEEP_ENV);
        c
    }
}

#[test]
fn python_hello_scenario_passes_and_its_build_is_removed() {
    if !can_build() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let report = state.path().join("report.json");
    let out = cmd(&["scenarios/custom/python-hello.yaml", "--no-progress", "--json", report.to_str().unwrap()])
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .env_remove(scenario_run::steps::build::KEEP_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let builds = step_outputs(&report, "build");
    assert_eq!(builds.len(), 1);
    assert_eq!(builds[0]["cached"], false);
    let log = builds[0]["log"].as_str().unwrap();
    assert!(log.contains("FROM python:3.11-slim-bookworm maps to offline:python-3.11"), "{log}");
    assert!(log.contains("#8 RUN python3 -m venv /opt/abx"), "{log}");
    assert!(log.contains("package caches: /var/cache/scenario-run/npm"), "{log}");
    assert!(builds_in(state.path()).is_empty(), "a build not kept is removed at the end of the run");
}

/// `FROM ubuntu:22.04` on the local provider: the build maps it to the offline Ubuntu recipe
/// and the sandbox created from it runs Ubuntu 22.04 (tests/fixtures/ubuntu).
#[test]
fn a_template_from_ubuntu_22_04_runs_ubuntu_on_local() {
    if !can_build() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let report = state.path().join("report.json");
    let out = cmd(&["tests/fixtures/ubuntu/ubuntu.yaml", "--provider", "local", "--no-progress"])
        .args(["--json", report.to_str().unwrap()])
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .env_remove(scenario_run::steps::build::KEEP_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let builds = step_outputs(&report, "build");
    let log = builds[0]["log"].as_str().unwrap();
    assert!(log.contains("FROM ubuntu:22.04 maps to offline:ubuntu-22.04"), "{log}");
    assert!(builds_in(state.path()).is_empty(), "a build not kept is removed at the end of the run");
}

#[test]
fn one_build_per_digest_per_run_and_kept_builds_are_reused() {
    if !can_build() {
        return;
    }
    let state = tempfile::tempdir().unwrap();
    let report = state.path().join("report.json");
    let run_once = |keep: bool| {
        let mut c = cmd(&["tests/fixtures/templates", "--no-progress", "-j", "2", "--json", report.to_str().unwrap()]);
        c.env("SCENARIO_RUN_STATE_DIR", state.path());
        if keep {
            c.env(scenario_run::steps::build::KEEP_ENV, "1");
        } else {
            c.env_remove(scenario_run::steps::build::KEEP_ENV);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        step_outputs(&report, "build")
    };
    // Two cases, one build: the other case reuses it.
    let first = run_once(true);
    let fresh: Vec<bool> = first.iter().map(|b| b["cached"] == false).collect();
    assert_eq!(fresh.iter().filter(|f| **f).count(), 1, "{first:?}");
    assert_eq!(first[0]["digest"], first[1]["digest"]);
    let kept = builds_in(state.path());
    assert_eq!(kept.len(), 1, "kept after the run: {kept:?}");
    // A later run reuses the kept build.
    let second = run_once(true);
    assert!(second.iter().all(|b| b["cached"] == true), "{second:?}");
    assert!(second.iter().any(|b| b["log"].as_str().unwrap().contains("reusing the kept build")), "{second:?}");
    std::fs::remove_dir_all(state.path().join(&kept[0])).unwrap();
}

/// The entries of the build cache in `state` (`scenario-run cache`'s listing, by its names).
fn cached_in(state: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(state.join("layers"))
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Issue 37 item 1: a scenario that deploys a template rebuilt it on every run. A build is
/// kept by what it is made of (the folder's files, the build arguments, the `FROM` image) for
/// the next run, which reuses it and says so; a changed file or argument builds again; the
/// cache is held to its size (least recently used first) and `scenario-run cache` lists and
/// prunes it; `SCENARIO_RUN_LAYER_CACHE_MAX=0` keeps nothing.
#[test]
fn builds_are_kept_by_content_across_runs_and_any_change_builds_again() {
    can_build();
    let bench = Workbench::new(
        "cached-build",
        "FROM base\nARG FLAVOUR=plain\nCOPY template.yaml /t.yaml\nRUN sleep 2 && echo $FLAVOUR > /flavour\n",
        "  - build: cached-build\n    id: b\n  - deploy: cached-build\n    id: d\n  - create: { template: \"{{ steps.d.template_id }}\" }\n  - exec: cat /flavour\n  - assert-stdout: { equals: \"plain\\n\" }\n",
    );
    let state = bench.state_dir();
    let report = bench.dir.path().join("report.json");
    let run = |extra: &[(&str, &str)]| {
        let mut c = bench.cmd();
        c.args(["--json", report.to_str().unwrap()]);
        for (k, v) in extra {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        (step_outputs(&report, "build")[0].clone(), text(&out.stdout))
    };
    let (first, out) = run(&[]);
    assert_eq!(first["cached"], false, "{first}");
    assert!(out.contains("cached-build › build: cached-build › #4 RUN sleep 2"), "plain output names the steps: {out}");
    assert!(out.contains("› cached as "), "{out}");
    assert!(builds_in(&state).is_empty(), "nothing of the run is left in the state directory");
    assert_eq!(cached_in(&state).len(), 1, "{:?}", cached_in(&state));

    let (second, out) = run(&[]);
    assert_eq!(second["cached"], true, "{second}");
    assert!(out.contains("› reusing the cached build "), "the run says it reused the build: {out}");
    assert!(!out.contains("#4 RUN sleep 2"), "and shows no step as this run's: {out}");

    // An input changed: a file of the folder.
    let yaml = bench.dir.path().join("work/templates/cached-build/template.yaml");
    std::fs::write(&yaml, "name: cached-build\n# changed\n").unwrap();
    let (third, _) = run(&[]);
    assert_eq!(third["cached"], false, "a changed file is built again: {third}");
    assert_eq!(cached_in(&state).len(), 2);
    let list = cmd(&["cache"]).env("SCENARIO_RUN_STATE_DIR", &state).output().unwrap();
    let listed = text(&list.stdout);
    assert_eq!(listed.matches("cached-build  sha256:").count(), 2, "{listed}");
    assert!(listed.contains("2 cached build(s)"), "{listed}");

    // Held to its size: the least recently used goes first, at the end of a run.
    let (_, _) = run(&[("SCENARIO_RUN_LAYER_CACHE_MAX", "1")]);
    assert!(cached_in(&state).is_empty(), "{:?}", cached_in(&state));
    let (fourth, _) = run(&[]);
    assert_eq!(fourth["cached"], false, "evicted, so built again");
    let pruned = cmd(&["cache", "prune"]).env("SCENARIO_RUN_STATE_DIR", &state).output().unwrap();
    assert!(text(&pruned.stdout).contains("1 cached build(s) removed"), "{}", text(&pruned.stdout));
    assert!(cached_in(&state).is_empty());
    let (fifth, _) = run(&[("SCENARIO_RUN_LAYER_CACHE_MAX", "0")]);
    assert_eq!(fifth["cached"], false);
    assert!(cached_in(&state).is_empty() && builds_in(&state).is_empty(), "the cache off keeps nothing");
}

/// The package caches of builds are held to `SCENARIO_RUN_BUILD_CACHE_MAX`: after a build the
/// least recently used template's caches go, never the ones of the build that just ran ahead
/// of an older one (a CI run's freshly named templates each added caches nothing removed).
#[test]
fn package_caches_of_builds_are_held_to_their_size_least_recently_used_first() {
    can_build();
    let bench = Workbench::new(
        "pkg-cache",
        "FROM base\nRUN head -c 3000000 /dev/zero > /var/cache/scenario-run/pip/blob && echo made\n",
        "  - build: pkg-cache\n    id: b\n",
    );
    let caches = bench.dir.path().join("build-cache");
    let report = bench.dir.path().join("report.json");
    let run = |max: &str| {
        let out = bench
            .cmd()
            .args(["--json", report.to_str().unwrap()])
            .env("SCENARIO_RUN_BUILD_CACHE", &caches)
            .env("SCENARIO_RUN_BUILD_CACHE_MAX", max)
            .env("SCENARIO_RUN_LAYER_CACHE_MAX", "0")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
        step_outputs(&report, "build")[0]["log"].as_str().unwrap().to_string()
    };
    run("1GiB");
    // One id map, in it this template's caches, with what its RUN wrote.
    let ids = std::fs::read_dir(&caches).unwrap().flatten().next().unwrap().path();
    let own: Vec<_> = std::fs::read_dir(&ids).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(own.len(), 1, "{own:?}");
    assert!(std::fs::metadata(own[0].join("pip/blob")).unwrap().len() == 3_000_000);
    // Another template's caches, last used an hour ago.
    let stale = ids.join("other-0123456789abcdef");
    std::fs::create_dir_all(stale.join("pip")).unwrap();
    std::fs::write(stale.join("pip/blob"), vec![1u8; 2_000_000]).unwrap();
    let used = std::fs::File::create(stale.join("used")).unwrap();
    used.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(3600)).unwrap();
    // 4 MiB hold this template's 3 MB but not both: the stale one goes, this one stays.
    let log = run("4MiB");
    assert!(log.contains("package caches of builds: removed"), "{log}");
    assert!(!stale.exists(), "the least recently used caches went");
    assert!(own[0].join("pip/blob").exists(), "the caches of the build that just ran stay");
    assert!(
        !std::fs::read_dir(&ids).unwrap().flatten().any(|e| e.file_name().to_string_lossy().starts_with('.')),
        "nothing half-removed is left"
    );
}

/// Issue 37 item 3, one way to name a template: after `deploy: X`, `create: { template: X }`
/// is the deployed one, even where the folder maps X to a platform's own id (`ids:`, as
/// `code-interpreter-v1` does in the cloud); without the deploy, the error says to add it.
#[test]
fn a_deployed_template_is_created_by_its_name_and_a_missing_deploy_is_named() {
    can_build();
    let bench = Workbench::new(
        "named-tpl",
        "FROM base\nRUN echo named > /named\n",
        "  - deploy: named-tpl\n  - create: { template: named-tpl }\n  - exec: cat /named\n  - assert-stdout: { equals: \"named\\n\" }\n",
    );
    let tpl = bench.dir.path().join("work/templates/named-tpl");
    std::fs::write(tpl.join("template.yaml"), "name: named-tpl\nids: { local: the-platforms-own-id }\n").unwrap();
    let out = bench.cmd().output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    // No deploy: the name maps to the platform's id, which this machine has not got, and the
    // error says which step to add.
    let work = bench.dir.path().join("work");
    std::fs::write(work.join("build.yaml"), "name: named-tpl\nsteps:\n  - create: { template: named-tpl }\n").unwrap();
    let out = bench.cmd().output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("add `- deploy: named-tpl` before this step"), "{stdout}");
}

/// Issue 14: a failing RUN fails the build naming its `Dockerfile:<line>`, with the last lines
/// of the command's output, and nothing after it runs.
#[test]
fn a_failing_run_names_its_dockerfile_line_and_last_output() {
    can_build();
    let state = tempfile::tempdir().unwrap();
    let report = state.path().join("report.json");
    let out =
        cmd(&["tests/fixtures/broken-build/broken-run.yaml", "--no-progress", "--json", report.to_str().unwrap()])
            .env("SCENARIO_RUN_STATE_DIR", state.path())
            .output()
            .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("build failed at Dockerfile:5: the command exited with 3"), "{stdout}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let step = &doc["results"][0]["steps"][0];
    let message = step["message"].as_str().unwrap();
    assert!(message.ends_with("exited with 3\nabout-to-fail-on-line-5"), "the command's last output: {message}");
    let log = step["outputs"]["log"].as_str().unwrap();
    assert!(log.contains("before-the-failure") && !log.contains("never-reached\n"), "{log}");
    assert!(builds_in(state.path()).is_empty(), "a failed build leaves nothing behind");
}

/// Regression (issue 13, item 10): a run interrupted in the middle of a template build left
/// the build's directory (hundreds of MB) and once a build sandbox that lived on.
#[test]
fn an_interrupted_build_leaves_no_directory_process_or_cgroup() {
    can_build();
    let marker = format!("slow-build-{}", std::process::id());
    let bench = Workbench::new(
        "slow-build",
        &format!("FROM base\nRUN sleep 600; echo {marker}\n"),
        "  - build: slow-build\n    timeout: 10m\n",
    );
    let state_dir = bench.state_dir();
    let mut child =
        bench.cmd().stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let sleeping = || {
        let ps = std::process::Command::new("ps").args(["-eo", "args"]).output().unwrap();
        text(&ps.stdout).lines().filter(|l| l.contains(&marker)).count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while sleeping() == 0 {
        assert!(std::time::Instant::now() < deadline, "the build never reached its RUN");
        assert!(child.try_wait().unwrap().is_none(), "scenario-run ended before the build ran");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(builds_in(&state_dir).len(), 1, "the build is under way in the state directory");
    let pid = child.id();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(builds_in(&state_dir).is_empty(), "left behind: {:?}", builds_in(&state_dir));
    assert_eq!(sleeping(), 0, "the build's RUN outlived the run");
    let groups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup/memory/scenario-run")
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!groups.iter().any(|g| g.starts_with(&format!("{pid}."))), "cgroups left: {groups:?}");
}

/// CI once saw `build: codex` fail with only "step timed out after 20m00s": nothing said which
/// instruction hung. A step stopped by its timeout reports the last lines it streamed (the
/// build's instruction and its output), and the build's command does not outlive it.
#[test]
fn a_build_stopped_by_its_step_timeout_says_where_it_was() {
    can_build();
    let marker = format!("hanging-build-{}", std::process::id());
    let bench = Workbench::new(
        "hanging-build",
        &format!("FROM base\nRUN echo {marker}-started && sleep 600\n"),
        "  - build: hanging-build\n    timeout: 8s\n",
    );
    let state_dir = bench.state_dir();
    let out = bench.cmd().output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("step timed out after 8.00s (the step's `timeout:`)\n  the last lines it wrote:"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("#2 RUN echo {marker}-started && sleep 600")), "the instruction: {stdout}");
    assert!(stdout.contains(&format!("  {marker}-started")), "its output: {stdout}");
    let ps = std::process::Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(!text(&ps.stdout).contains(&format!("{marker}-started && sleep")), "the RUN outlived its step");
    assert!(builds_in(&state_dir).is_empty(), "left behind: {:?}", builds_in(&state_dir));
}

/// Two runs sharing a state directory build the same template at the same moment (the suite
/// and a serve test, in one CI job): each builds in a directory of its own, so neither removes
/// the other's build while it runs; kept, one build ends up under the shared name.
#[test]
fn two_runs_building_one_template_at_once_do_not_collide() {
    can_build();
    // Long enough that the two builds overlap: the second starts while the first one's RUN
    // sleeps, and the first run ends (removing its build) while the second one's still sleeps.
    let bench = Workbench::new(
        "shared-build",
        "FROM base\nRUN sleep 5 && echo built > /built.txt\n",
        "  - build: shared-build\n  - deploy: shared-build\n    id: d\n  - create: { template: \"{{ steps.d.template_id }}\" }\n  - exec: cat /built.txt\n  - assert-stdout: { contains: built }\n",
    );
    let state_dir = bench.state_dir();
    for keep in [false, true] {
        let start = || {
            let mut c = bench.cmd();
            if keep {
                c.env(scenario_run::steps::build::KEEP_ENV, "1");
            }
            c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap()
        };
        let a = start();
        std::thread::sleep(std::time::Duration::from_secs(2));
        let b = start();
        for child in [a, b] {
            let out = child.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "keep={keep}: {}{}", text(&out.stdout), text(&out.stderr));
        }
        let left = builds_in(&state_dir);
        if keep {
            assert_eq!(left.len(), 1, "one kept build under the shared name: {left:?}");
            assert!(!left[0].contains('.'), "the shared name, not a run's own: {left:?}");
        } else {
            assert!(left.is_empty(), "left behind: {left:?}");
        }
    }
}

/// Regression (issue 23 item 4): a template build shared the host's network, so a RUN reached
/// a service on the host's 127.0.0.1 and a listener it opened answered from outside. A build
/// now gets a sandbox's network: the package registries (a real download from PyPI), never
/// this host's loopback or addresses.
#[test]
fn a_build_reaches_the_registries_and_never_the_host() {
    can_build();
    use std::io::Write;
    let host = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = host.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in host.incoming().flatten() {
            let _ = c.write_all(b"host-secret");
        }
    });
    let addrs = std::process::Command::new("ip").args(["-4", "-o", "addr", "show"]).output().unwrap();
    let mut targets: Vec<String> = text(&addrs.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1)?.split('/').next().map(str::to_string))
        .collect();
    targets.push("10.0.2.2".into());
    // Each probe prints what it got; the RUN fails if any reached the host.
    let probes: Vec<String> = targets
        .iter()
        .map(|a| {
            format!(
                "got=$(timeout 5 bash -c 'exec 3<>/dev/tcp/{a}/{port} && head -c 32 <&3' 2>/dev/null || echo refused) && echo \"{a} $got\" && test \"$got\" != host-secret"
            )
        })
        .collect();
    let dockerfile = format!(
        "FROM base\nRUN pip download --no-deps --no-cache-dir -q -d /tmp/dl six && ls /tmp/dl | grep -q six\nRUN {}\n",
        probes.join(" && ")
    );
    let bench = Workbench::new("net-build", &dockerfile, "  - build: net-build\n");
    let report = bench.state_dir().with_extension("json");
    let out = bench.cmd().arg("--json").arg(&report).output().unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let log = step_outputs(&report, "build")[0]["log"].as_str().unwrap().to_string();
    for a in &targets {
        assert!(log.contains(&format!("{a} refused")), "{a}: {log}");
    }
}

/// Regression (issue 23 item 5): a RUN in one template wrote into the shared pip and npm
/// caches (and apt's archives), and a different template's build read the poisoned entry.
/// Each template's caches are now its own: the second template sees none of what the first
/// planted, while a rebuild of the first still finds its own cache.
#[test]
fn one_templates_build_cannot_poison_anothers_caches() {
    can_build();
    let dir = tempfile::tempdir().unwrap();
    let templates = dir.path().join("templates");
    let plant = "FROM base\nRUN mkdir -p /var/cache/scenario-run/pip /var/cache/scenario-run/npm && echo evil > /var/cache/scenario-run/pip/planted && echo evil > /var/cache/scenario-run/npm/planted && echo evil > /var/cache/apt/archives/planted_1.0_all.deb\n";
    let look = "FROM base\nRUN for f in /var/cache/scenario-run/pip/planted /var/cache/scenario-run/npm/planted /var/cache/apt/archives/planted_1.0_all.deb; do if [ -e $f ]; then echo \"found $f\"; exit 1; fi; done; echo clean\n";
    let again = "FROM base\nRUN test -e /var/cache/scenario-run/pip/planted && echo own-cache-kept\n";
    for (name, dockerfile) in [("planter", plant), ("victim", look)] {
        let t = templates.join(name);
        std::fs::create_dir_all(&t).unwrap();
        std::fs::write(t.join("template.yaml"), format!("name: {name}\n")).unwrap();
        std::fs::write(t.join("Dockerfile"), dockerfile).unwrap();
    }
    let cache = dir.path().join("build-cache");
    let run = |template_dir: &str, scenario: &str| {
        let file = dir.path().join(format!("{scenario}.yaml"));
        std::fs::write(&file, format!("name: {scenario}\nsteps:\n  - build: {template_dir}\n")).unwrap();
        let out = cmd(&[file.to_str().unwrap(), "--no-progress"])
            .env("SCENARIO_RUN_STATE_DIR", dir.path().join("state"))
            .env("SCENARIO_RUN_TEMPLATES_DIR", &templates)
            .env("SCENARIO_RUN_BUILD_CACHE", &cache)
            .env_remove(scenario_run::steps::build::KEEP_ENV)
            .output()
            .unwrap();
        (out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
    };
    let (code, out) = run("planter", "plant");
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run("victim", "look");
    assert_eq!(code, Some(0), "the victim's build saw the planted entries: {out}");
    // The planter's own cache is still its own: a rebuild of the same template (its folder,
    // with a changed Dockerfile, so a new build) finds it.
    std::fs::write(templates.join("planter/Dockerfile"), again).unwrap();
    let (code, out) = run("planter", "again");
    assert_eq!(code, Some(0), "the planter's rebuild lost its own cache: {out}");
}

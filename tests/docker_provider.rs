//! End-to-end tests of the docker provider against a real Docker engine: the one
//! `.ci/local-stack.sh up` starts (scripts/test does, and exports `DOCKER_HOST`). Without
//! `DOCKER_HOST` each test fails in CI, and on a developer's machine says SKIPPED and returns.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bollard::query_parameters::{InspectContainerOptions, ListContainersOptionsBuilder};
use bollard::Docker;
use scenario_run::provider::caps::*;
use scenario_run::provider::docker::{DockerOptions, DockerProvider};
use scenario_run::provider::{Capability, CreateRequest, ErrorKind, ExecRequest, OutputChunk, Provider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The provider, or None when no engine is configured: in CI that fails the test (see
/// `common::needs`), elsewhere the test says so and returns.
#[track_caller]
fn provider() -> Option<DockerProvider> {
    let test = std::thread::current().name().unwrap_or("a docker test").to_string();
    common::needs("DOCKER_HOST", &test, common::LOCAL_STACK).map(|_| DockerProvider::new(DockerOptions::default()))
}

fn engine() -> Docker {
    let host = std::env::var("DOCKER_HOST").unwrap();
    Docker::connect_with_unix(host.trim_start_matches("unix://"), 30, bollard::API_DEFAULT_VERSION).unwrap()
}

/// A metadata value no other test or run uses.
fn tag() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("dockertest-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

fn cmd(c: &str) -> ExecRequest {
    ExecRequest { cmd: c.to_string(), timeout: Some(Duration::from_secs(30)), ..Default::default() }
}

async fn sh(p: &DockerProvider, id: &str, c: &str) -> String {
    let r = p.exec(id, cmd(c), None).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{c}: {}", String::from_utf8_lossy(&r.stderr));
    String::from_utf8(r.stdout).unwrap()
}

async fn container_exists(name: &str) -> bool {
    engine().inspect_container(name, None::<InspectContainerOptions>).await.is_ok()
}

#[tokio::test]
async fn exec_streams_status_envs_and_cwd() {
    let Some(p) = provider() else { return };
    let envs = BTreeMap::from([("FOO".to_string(), "bar baz".to_string())]);
    let sb = p.create(CreateRequest { template: "base".into(), envs, ..Default::default() }).await.unwrap();
    assert!(sb.id.starts_with("sbx-"), "{}", sb.id);
    assert_eq!(sb.template, "base");

    let (tx, mut rx) = scenario_run::provider::output_channel();
    let r = p.exec(&sb.id, cmd("echo out; echo err >&2; exit 3"), Some(tx)).await.unwrap();
    assert_eq!(
        (r.stdout.as_slice(), r.stderr.as_slice(), r.exit_code, r.signal),
        (&b"out\n"[..], &b"err\n"[..], Some(3), None)
    );
    assert!(r.pid > 1 && !r.timed_out);
    let mut streamed = (Vec::new(), Vec::new());
    while let Ok(c) = rx.try_recv() {
        match c {
            OutputChunk::Stdout(b) => streamed.0.extend(b),
            OutputChunk::Stderr(b) => streamed.1.extend(b),
        }
    }
    assert_eq!(streamed, (b"out\n".to_vec(), b"err\n".to_vec()), "live output is the pid-stripped output");

    // Create-time envs reach every process, HOME and the default cwd are /home/user, a login
    // shell, and exec envs win over create envs.
    assert_eq!(sh(&p, &sb.id, "echo \"$FOO|$HOME|$(pwd)|$0\"").await, "bar baz|/home/user|/home/user|/bin/bash\n");
    let mut req = cmd("echo $FOO; pwd; shopt -q login_shell && echo login");
    req.envs.insert("FOO".into(), "exec wins".into());
    req.cwd = Some("/tmp".into());
    let r = p.exec(&sb.id, req, None).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "exec wins\n/tmp\nlogin\n");
    // A PATH given at create survives the login profile.
    let envs = BTreeMap::from([("PATH".to_string(), "/opt/x/bin:/usr/bin:/bin".to_string())]);
    let sb2 = p.create(CreateRequest { envs, ..Default::default() }).await.unwrap();
    assert_eq!(sh(&p, &sb2.id, "echo $PATH").await, "/opt/x/bin:/usr/bin:/bin\n");

    // stdin, a missing cwd, a timeout.
    let mut req = cmd("tr a-z A-Z");
    req.stdin = Some(b"hello\n".to_vec());
    assert_eq!(p.exec(&sb.id, req, None).await.unwrap().stdout, b"HELLO\n");
    let mut req = cmd("true");
    req.cwd = Some("/nonexistent".into());
    assert_eq!(p.exec(&sb.id, req, None).await.unwrap().exit_code, Some(125));
    let t0 = Instant::now();
    let mut req = cmd("echo before; sleep 30");
    req.timeout = Some(Duration::from_millis(800));
    let r = p.exec(&sb.id, req, None).await.unwrap();
    assert!(r.timed_out && r.signal == Some(9) && r.exit_code.is_none(), "{r:?}");
    assert_eq!(r.stdout, b"before\n");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(sh(&p, &sb.id, "pgrep -c -f '^sleep 30' || true").await, "0\n", "the timeout killed the group");
    p.destroy_all().await;
}

#[tokio::test]
async fn files_round_trip() {
    let Some(p) = provider() else { return };
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let id = &sb.id;
    // A few MiB of every byte value.
    let data: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    let e = p.write_file(id, "deep/er/blob.bin", data.clone(), Some(0o600)).await.unwrap();
    assert_eq!(
        (e.path.as_str(), e.kind.as_str(), e.size, e.mode),
        ("/home/user/deep/er/blob.bin", "file", data.len() as u64, 0o600)
    );
    assert_eq!(p.read_file(id, "/home/user/deep/er/blob.bin").await.unwrap(), data);
    assert_eq!(
        sh(&p, id, "wc -c < deep/er/blob.bin; stat -c %a deep/er/blob.bin").await,
        format!("{}\n600\n", data.len())
    );
    // Overwrite keeps the mode; a file written by a command reads back.
    p.write_file(id, "deep/er/blob.bin", b"small".to_vec(), None).await.unwrap();
    assert_eq!(p.stat(id, "deep/er/blob.bin").await.unwrap().mode, 0o600);
    sh(&p, id, "printf 'made inside' > /tmp/inside.txt; ln -s /tmp/inside.txt link").await;
    assert_eq!(p.read_file(id, "/tmp/inside.txt").await.unwrap(), b"made inside");
    assert_eq!(p.read_file(id, "link").await.unwrap(), b"made inside", "reads follow symlinks");
    assert_eq!(p.stat(id, "link").await.unwrap().kind, "symlink");
    p.write_file(id, "link", b"through".to_vec(), None).await.unwrap();
    assert_eq!(sh(&p, id, "cat /tmp/inside.txt").await, "through", "writes follow symlinks");

    // File operations act as the sandbox user: owned by it, and refused where it may not write.
    assert_eq!(sh(&p, id, "stat -c %U deep/er/blob.bin deep").await, "user\nuser\n");
    let e = p.make_dir(id, "/srv/x").await.unwrap_err();
    assert!(e.message.starts_with("permission denied"), "{}", e.message);
    let e = p.write_file(id, "/etc/x.conf", b"x".to_vec(), None).await.unwrap_err();
    assert!(e.message.starts_with("permission denied"), "{}", e.message);

    // Listing, mkdir, rename, remove, exists, and the errors.
    let d = p.make_dir(id, "/tmp/srv/a/b").await.unwrap();
    assert_eq!((d.kind.as_str(), d.path.as_str()), ("dir", "/tmp/srv/a/b"));
    // (The image's home has the account's dotfiles.)
    let names: Vec<String> = p
        .list_dir(id, "/home/user")
        .await
        .unwrap()
        .into_iter()
        .filter(|e| !e.name.starts_with('.'))
        .map(|e| format!("{}:{}", e.name, e.kind))
        .collect();
    assert_eq!(names, ["deep:dir", "link:symlink"]);
    let moved = p.rename(id, "deep/er/blob.bin", "/tmp/srv/a/blob.bin").await.unwrap();
    assert_eq!((moved.path.as_str(), moved.size), ("/tmp/srv/a/blob.bin", 5));
    assert!(!p.exists(id, "deep/er/blob.bin").await.unwrap());
    assert!(p.exists(id, "/tmp/srv/a/blob.bin").await.unwrap());
    p.remove(id, "/tmp/srv/a").await.unwrap();
    assert!(!p.exists(id, "/tmp/srv/a").await.unwrap());
    assert_eq!(p.read_file(id, "nope").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.read_file(id, "/home/user").await.unwrap_err().message, "is a directory: /home/user");
    assert_eq!(p.write_file(id, "/home/user", vec![1], None).await.unwrap_err().kind, ErrorKind::Invalid);
    assert!(p.exists(id, "/home/user").await.unwrap(), "a refused write leaves the directory alone");
    assert_eq!(p.list_dir(id, "nope").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.remove(id, "nope").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.rename(id, "nope", "x").await.unwrap_err().kind, ErrorKind::NotFound);
    p.write_file(id, "f", b"x".to_vec(), None).await.unwrap();
    assert_eq!(p.make_dir(id, "f").await.unwrap_err().kind, ErrorKind::Invalid);
    p.destroy_all().await;
}

#[tokio::test]
async fn background_processes_signals_and_wait() {
    let Some(p) = provider() else { return };
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let id = &sb.id;
    let trapper = p
        .spawn(
            id,
            cmd("trap 'echo got term; exit 42' TERM; echo started; : > /tmp/trap-set; while true; do sleep 0.1; done"),
        )
        .await
        .unwrap();
    let sleeper = p.spawn(id, cmd("sleep 300")).await.unwrap();
    let procs = p.process_list(id).await.unwrap();
    assert!(procs.iter().any(|x| x.pid == trapper && x.running), "{procs:?}");
    assert!(procs.iter().any(|x| x.pid == sleeper && x.running), "{procs:?}");
    // The pid is the command's, inside the container.
    assert_eq!(sh(&p, id, &format!("cat /proc/{sleeper}/cmdline | tr '\\0' ' '")).await, "sleep 300 ");
    // SIGTERM once the trap is set (the script says so with a file), not after a guessed pause.
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.exec(id, cmd("test -e /tmp/trap-set"), None).await.unwrap().exit_code != Some(0) {
        assert!(Instant::now() < deadline, "the trap was never set");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.signal(id, trapper, libc::SIGTERM).await.unwrap();
    let r = p.wait(id, trapper, Duration::from_secs(10)).await.unwrap();
    assert_eq!((r.exit_code, r.signal, r.stdout.as_slice()), (Some(42), None, &b"started\ngot term\n"[..]));
    p.signal(id, sleeper, libc::SIGKILL).await.unwrap();
    let r = p.wait(id, sleeper, Duration::from_secs(10)).await.unwrap();
    assert_eq!((r.exit_code, r.signal, r.timed_out), (None, Some(9), false));
    assert_eq!(p.signal(id, sleeper, libc::SIGTERM).await.unwrap_err().kind, ErrorKind::NotFound);
    // Exit 137 by itself is an exit code, not a signal.
    assert_eq!(p.exec(id, cmd("exit 137"), None).await.unwrap().exit_code, Some(137));

    // Live output and an open stdin.
    let mut live = p.spawn_live(id, cmd("while read l; do echo \"got $l\"; done; echo eof"), true).await.unwrap();
    p.write_stdin(id, live.pid, b"one\n".to_vec()).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), live.output.recv()).await.unwrap().unwrap();
    assert!(matches!(first, OutputChunk::Stdout(ref b) if b == b"got one\n"), "{first:?}");
    p.close_stdin(id, live.pid).await.unwrap();
    let r = p.wait(id, live.pid, Duration::from_secs(10)).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (Some(0), &b"got one\neof\n"[..]));

    // A foreground command that leaves a grandchild holding its output still returns.
    let t0 = Instant::now();
    let r = p.exec(id, cmd("sleep 60 & echo bg"), None).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (Some(0), &b"bg\n"[..]));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    p.destroy_all().await;
}

#[tokio::test]
async fn metadata_labels_list_kill_and_peak_live() {
    let Some(p) = provider() else { return };
    let run = tag();
    let meta = BTreeMap::from([("e2e".to_string(), run.clone())]);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let req = CreateRequest { metadata: meta.clone(), timeout_secs: Some(120), ..Default::default() };
        ids.push(p.create(req).await.unwrap().id);
    }
    let stats = p.stats();
    assert_eq!((stats.created, stats.live, stats.peak_live), (2, 2, 2));
    let listed = p.list(&meta).await.unwrap();
    let mut listed_ids: Vec<String> = listed.iter().map(|i| i.id.clone()).collect();
    listed_ids.sort();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(listed_ids, sorted);
    assert!(listed.iter().all(|i| i.metadata == meta && i.template == "base" && i.end_at >= i.started_at + 119));
    // The engine itself filters by the label.
    let filters = std::collections::HashMap::from([("label".to_string(), vec![format!("e2e={run}")])]);
    let opts = ListContainersOptionsBuilder::default().filters(&filters).build();
    assert_eq!(engine().list_containers(Some(opts)).await.unwrap().len(), 2);
    assert!(p.list(&BTreeMap::from([("e2e".to_string(), "no-such-run".to_string())])).await.unwrap().is_empty());

    // set_timeout moves the end; info reports it.
    p.set_timeout(&ids[0], 600).await.unwrap();
    let info = p.info(&ids[0]).await.unwrap();
    assert!(info.end_at >= info.started_at + 599, "{info:?}");
    // kill removes the container.
    assert!(p.kill(&ids[0]).await.unwrap());
    assert!(!container_exists(&ids[0]).await);
    assert!(!p.kill(&ids[0]).await.unwrap());
    assert_eq!(p.info(&ids[0]).await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.exec(&ids[0], cmd("true"), None).await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.list(&meta).await.unwrap().len(), 1);
    let stats = p.stats();
    assert_eq!((stats.created, stats.destroyed, stats.live, stats.peak_live), (2, 1, 1, 2));

    // Another provider (another run) can connect to the survivor by id.
    let q = provider().unwrap();
    let c = q.connect(&ids[1], None).await.unwrap();
    assert_eq!(c.metadata, meta);
    assert_eq!(sh(&q, &ids[1], "echo hi").await, "hi\n");
    assert_eq!(q.destroy_all().await, 0, "an adopted sandbox is not destroy_all's");
    assert!(container_exists(&ids[1]).await);

    assert_eq!(p.destroy_all().await, 1);
    assert!(!container_exists(&ids[1]).await);
    assert_eq!(p.stats().live, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_expire_and_destroy_all_now_removes_them() {
    let Some(p) = provider() else { return };
    let sb = p.create(CreateRequest { timeout_secs: Some(1), ..Default::default() }).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while container_exists(&sb.id).await {
        assert!(Instant::now() < deadline, "the sandbox did not expire");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(p.info(&sb.id).await.unwrap_err().kind, ErrorKind::NotFound);

    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    tokio::task::block_in_place(|| p.destroy_all_now());
    assert!(!container_exists(&a.id).await && !container_exists(&b.id).await);
    p.destroy_all().await;
}

/// GET `path` from `url` (`http://127.0.0.1:<port>`), retried until the server is up.
async fn http_get(url: &str, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut s) = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await {
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
            let mut buf = Vec::new();
            // A forwarder closes at once while nothing listens inside yet: try again.
            if s.read_to_end(&mut buf).await.is_ok() && !buf.is_empty() {
                return String::from_utf8_lossy(&buf).into_owned();
            }
        }
        assert!(Instant::now() < deadline, "server at {url} did not come up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Serves `body` as /index.html on `port` in sandbox `id`; returns the response through its port URL.
async fn serve_in(p: &DockerProvider, id: &str, port: u16, body: &str) -> String {
    sh(p, id, &format!("echo {body} > index.html")).await;
    p.spawn(id, cmd(&format!("exec python3 -m http.server {port} --bind 127.0.0.1"))).await.unwrap();
    let url = p.port_url(id, port).await.unwrap();
    http_get(&url, "/index.html").await
}

#[tokio::test(flavor = "multi_thread")]
async fn two_sandboxes_serve_the_same_port_through_their_own_urls() {
    let Some(p) = provider() else { return };
    assert!(p.capabilities().contains(&Capability::IsolatedPorts));
    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    let body_a = serve_in(&p, &a.id, 8000, "from-a").await;
    let body_b = serve_in(&p, &b.id, 8000, "from-b").await;
    assert!(body_a.starts_with("HTTP/1.0 200") && body_a.ends_with("from-a\n"), "{body_a}");
    assert!(body_b.starts_with("HTTP/1.0 200") && body_b.ends_with("from-b\n"), "{body_b}");
    let url_a = p.port_url(&a.id, 8000).await.unwrap();
    assert_ne!(url_a, p.port_url(&b.id, 8000).await.unwrap());
    p.destroy_all().await;
    let addr = url_a.trim_start_matches("http://").to_string();
    assert!(std::net::TcpStream::connect(addr).is_err(), "the forwarder outlived its sandbox");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_the_host_network_the_port_url_is_the_hosts_port() {
    if provider().is_none() {
        return;
    }
    let p = DockerProvider::new(DockerOptions { host_network: true, ..DockerOptions::default() });
    assert!(!p.capabilities().contains(&Capability::IsolatedPorts));
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let body = serve_in(&p, &sb.id, port, "hello-from-docker").await;
    assert_eq!(p.port_url(&sb.id, port).await.unwrap(), format!("http://127.0.0.1:{port}"));
    assert!(body.starts_with("HTTP/1.0 200") && body.ends_with("hello-from-docker\n"), "{body}");
    p.destroy_all().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_whole_library_passes_on_docker_through_the_binary() {
    if provider().is_none() {
        return;
    }
    let run_id = format!("sr-lib-{}", std::process::id());
    let report = tempfile::NamedTempFile::new().unwrap();
    let out = tokio::task::block_in_place(|| {
        common::cmd(&["scenarios", "--provider", "docker", "--no-progress", "--json", report.path().to_str().unwrap()])
            .env("E2E_RUN_ID", &run_id)
            .env_remove("E2E_SERVER_TEMPLATE")
            .env_remove(scenario_run::steps::build::KEEP_ENV)
            .output()
            .unwrap()
    });
    let stdout = common::text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", common::text(&out.stderr));
    let (passed, skipped) = common::passed_and_skipped(report.path());
    // Docker has no pause, snapshots, directory watches, terminals or egress policies: those
    // twelve scenarios (five of them pause, four egress) say so.
    let mut lacking: Vec<&str> = skipped
        .iter()
        .filter(|(_, why)| why.starts_with("provider docker lacks capability ["))
        .map(|(name, _)| name.as_str())
        .collect();
    lacking.sort_unstable();
    assert_eq!(
        lacking,
        [
            "commands output across a pause",
            "commands pty",
            "egress DNS under deny-all as E2B documents it",
            "egress a live update replaces the rules",
            "egress a name and a wildcard allowed over deny-all",
            "egress internet by default, off when asked",
            "files directory watch",
            "lifecycle pause and resume",
            "lifecycle paused by its timeout",
            "lifecycle resumed by traffic",
            "lifecycle snapshot",
            "lifecycle three pause and resume cycles"
        ],
        "{skipped:?}"
    );
    for (name, why) in &skipped {
        assert!(
            why.starts_with("missing credentials [")
                || why == "requires provider e2b or alicloud (running on docker)"
                || why == "requires provider opensandbox (running on docker)"
                || why.starts_with("provider docker lacks capability ["),
            "{name} skipped for another reason: {why}"
        );
    }
    // Whole scenarios skip only for the cloud-only key and limit checks and the real clients
    // driven from the host (the E2B SDK and CLI, agent-sandbox-client: no E2B endpoint here),
    // the three scenarios of one protocol, and the twelve of capabilities docker lacks.
    assert_eq!(skipped.len(), 6 + 3 + 12, "{skipped:?}");
    for scenario in ["declarative remote function", "network two sandboxes serve the same port"] {
        assert!(passed.iter().any(|p| p == scenario), "{scenario} did not pass: {passed:?}");
    }
    // Issue 14: every template (python-hello, node-web, code-interpreter-v1,
    // browser-automation, the seven agents, base) is built on the engine from the offline
    // images and passes its scenario; within them only steps that call a model skip.
    let (built, skips) = common::templates_built_by_passing_scenarios(report.path());
    assert_eq!(built, common::template_folders(), "templates built by passing scenarios on docker");
    assert!(skips.iter().all(|s| s.contains(": missing credentials [")), "{skips:#?}");
    assert_eq!(run_containers_of(&run_id).await, 0, "the run left containers behind");
}

/// Issue 26 item 10: `create { keep: true }` was destroyed at the end of the run anyway (the
/// provider's destroy-all and the sweep of the run's tag); the janitor still finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_kept_container_outlives_the_run_and_the_janitor_finds_it() {
    if provider().is_none() {
        return;
    }
    let run_id = format!("sr-keep-{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keep.yaml");
    std::fs::write(&file, "name: keep\nsteps:\n  - create: { template: base, keep: true, as: kept }\n  - create: { template: base, as: gone }\n").unwrap();
    let out = tokio::task::block_in_place(|| {
        common::cmd(&[file.to_str().unwrap(), "--provider", "docker", "--no-progress"])
            .env("E2E_RUN_ID", &run_id)
            .output()
            .unwrap()
    });
    assert_eq!(out.status.code(), Some(0), "{}{}", common::text(&out.stdout), common::text(&out.stderr));
    assert_eq!(run_containers_of(&run_id).await, 1, "the kept container is there, the other one is gone");
    let out = tokio::task::block_in_place(|| {
        common::cmd(&["cleanup", "--provider", "docker", "--run-id", &run_id, "--yes"]).output().unwrap()
    });
    assert_eq!(out.status.code(), Some(0), "{}{}", common::text(&out.stdout), common::text(&out.stderr));
    assert_eq!(run_containers_of(&run_id).await, 0, "the janitor removed it");
}

async fn run_containers_of(run_id: &str) -> usize {
    let filters = HashMap::from([("label".to_string(), vec![format!("e2e={run_id}")])]);
    let opts = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
    engine().list_containers(Some(opts)).await.unwrap().len()
}

/// The build step outputs (name, cached, log...) of a JSON report.
fn build_outputs(report: &std::path::Path) -> Vec<serde_json::Value> {
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["steps"].as_array().unwrap().clone())
        .filter(|s| s["kind"] == "build" || s["kind"] == "deploy")
        .map(|s| s["outputs"].clone())
        .collect()
}

/// Runs a template scenario on docker through the binary; returns (exit code, stdout+stderr, report).
fn run_template_scenario(path: &str, run_id: &str) -> (Option<i32>, String, Vec<serde_json::Value>) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let started = Instant::now();
    let out = common::cmd(&[path, "--provider", "docker", "--no-progress", "--json", report.to_str().unwrap()])
        .env("E2E_RUN_ID", run_id)
        .env_remove(scenario_run::steps::build::KEEP_ENV)
        .output()
        .unwrap();
    eprintln!("{path} on docker: {:.1}s", started.elapsed().as_secs_f64());
    let text = format!("{}{}", common::text(&out.stdout), common::text(&out.stderr));
    (out.status.code(), text, build_outputs(&report))
}

#[tokio::test(flavor = "multi_thread")]
async fn template_scenarios_build_deploy_and_clean_up_on_docker() {
    if provider().is_none() {
        return;
    }
    for (path, name) in
        [("scenarios/custom/python-hello.yaml", "python-hello"), ("scenarios/custom/node-web.yaml", "node-web")]
    {
        let run_id = format!("sr-tpl-{}-{name}", std::process::id());
        let (code, text, builds) = tokio::task::block_in_place(|| run_template_scenario(path, &run_id));
        assert_eq!(code, Some(0), "{text}");
        assert!(text.contains("PASSED"), "{text}");
        let first = &builds[0];
        assert_eq!(first["cached"], false, "{builds:?}");
        let image = first["image"].as_str().unwrap();
        assert!(image.contains(&format!("/{name}:")), "{image}");
        let log = first["log"].as_str().unwrap();
        assert!(log.contains("Step 1/"), "the engine's build log is captured: {log}");
        assert!(log.contains(" maps to localhost") || log.contains("maps to"), "{log}");
        assert!(builds.iter().skip(1).all(|b| b["cached"] == true), "one build per digest: {builds:?}");
        assert_eq!(run_containers_of(&run_id).await, 0, "{path} left containers behind");
        // Its own build: another run on this engine may be building the same template.
        assert!(engine().inspect_image(image).await.is_err(), "{path} left its build {image}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failing_run_names_its_dockerfile_line() {
    if provider().is_none() {
        return;
    }
    let run_id = format!("sr-tpl-{}-broken", std::process::id());
    let path = "tests/fixtures/broken-build/broken-run.yaml";
    let (code, text, builds) = tokio::task::block_in_place(|| run_template_scenario(path, &run_id));
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("templates/broken-run/Dockerfile:5: RUN echo about-to-fail-on-line-5 && exit 3 exited with 3"),
        "{text}"
    );
    let log = builds[0]["log"].as_str().unwrap();
    // FROM is the Dockerfile's (no BASE_IMAGE mapping to the stack's bases): the offline image.
    assert!(log.contains("FROM python:3.11-slim maps to "), "{log}");
    assert!(!log.contains("base-python"), "{log}");
    assert!(log.contains("before-the-failure") && log.contains("about-to-fail-on-line-5"), "{log}");
    assert!(!log.contains("never-reached\n"), "{log}");
    assert_eq!(run_containers_of(&run_id).await, 0);
    // The layer of the last step that ran (`RUN echo before-the-failure`) is not left untagged.
    let layer = log
        .lines()
        .filter_map(|l| l.trim().strip_prefix("---> "))
        .rfind(|id| id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no layer id in the build log: {log}"));
    assert!(engine().inspect_image(layer).await.is_err(), "the failed build left image {layer}");
}

#[test]
fn output_past_max_output_is_counted_not_kept() {
    if provider().is_none() {
        return;
    }
    let args = ["--provider", "docker", "--no-progress", "--max-output", "1KiB", "tests/fixtures/output-cap.yaml"];
    let out = common::cmd(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}{}", common::text(&out.stdout), common::text(&out.stderr));
}

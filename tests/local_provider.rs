//! End-to-end tests of the local provider with real namespaces and processes (needs root,
//! bwrap and nsenter, as on the CI machine). Every test makes its own state directory.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use scenario_run::provider::caps::*;
use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ErrorKind, ExecRequest, OutputChunk, Provider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn provider(isolation: Isolation) -> (LocalProvider, tempfile::TempDir) {
    let dir = tempfile::Builder::new().prefix("srtest-").tempdir().unwrap();
    let p =
        LocalProvider::new(LocalOptions { state_dir: dir.path().to_path_buf(), isolation, ..LocalOptions::default() })
            .unwrap();
    (p, dir)
}

fn ns() -> (LocalProvider, tempfile::TempDir) {
    provider(Isolation::Namespaces)
}

fn cmd(c: &str) -> ExecRequest {
    ExecRequest { cmd: c.to_string(), timeout: Some(Duration::from_secs(20)), ..Default::default() }
}

async fn sh(p: &LocalProvider, id: &str, c: &str) -> String {
    let r = p.exec(id, cmd(c), None).await.unwrap();
    assert_eq!(r.exit_code, Some(0), "{c}: {}", String::from_utf8_lossy(&r.stderr));
    String::from_utf8(r.stdout).unwrap()
}

async fn http_get(url: &str) -> std::io::Result<String> {
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n").await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut buf)).await.expect("response hung")?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[tokio::test]
async fn exec_separates_streams_and_reports_status() {
    let (p, _d) = ns();
    assert_eq!(p.isolation(), Isolation::Namespaces);
    assert!(p.warning().is_none());
    let sb = p.create(CreateRequest { template: "base".into(), ..Default::default() }).await.unwrap();
    assert_eq!(sb.template, "base");
    let (tx, mut rx) = scenario_run::provider::output_channel();
    let r = p.exec(&sb.id, cmd("echo out; echo err >&2; exit 3"), Some(tx)).await.unwrap();
    assert_eq!(r.stdout, b"out\n");
    assert_eq!(r.stderr, b"err\n");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.signal, None);
    assert!(!r.timed_out);
    let mut streamed = (Vec::new(), Vec::new());
    while let Ok(c) = rx.try_recv() {
        match c {
            OutputChunk::Stdout(b) => streamed.0.extend(b),
            OutputChunk::Stderr(b) => streamed.1.extend(b),
        }
    }
    assert_eq!(streamed, (b"out\n".to_vec(), b"err\n".to_vec()));

    // The pid is the one inside the sandbox's PID namespace (bwrap's init is 1, sleep is 2).
    let r = p.exec(&sb.id, cmd("echo $$"), None).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), r.pid.to_string());
    assert!(r.pid > 2 && r.pid < 1000, "pid {}", r.pid);

    let r = p.exec(&sb.id, cmd("kill -TERM $$"), None).await.unwrap();
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));

    assert_eq!(sh(&p, &sb.id, "pwd").await, "/home/user\n");
    assert_eq!(sh(&p, &sb.id, "echo $HOME").await, "/home/user\n");
    // Its own network namespace: the loopback interface and its stack's eth0 (netns.rs).
    let mut links: Vec<String> = sh(&p, &sb.id, "awk -F: 'NR > 2 { gsub(/ /, \"\", $1); print $1 }' /proc/net/dev")
        .await
        .lines()
        .map(str::to_string)
        .collect();
    links.sort();
    assert_eq!(links, ["eth0", "lo"]);
    let mut r = cmd("cat; echo; cat /etc/hostname >/dev/null");
    r.stdin = Some(b"from stdin".to_vec());
    r.cwd = Some("/tmp".into());
    assert_eq!(p.exec(&sb.id, r, None).await.unwrap().stdout, b"from stdin\n");
    assert!(p.kill(&sb.id).await.unwrap());
    assert!(!p.kill(&sb.id).await.unwrap());
}

#[tokio::test]
async fn envs_reach_every_process_and_exec_envs_win() {
    let (p, _d) = ns();
    let mut envs = BTreeMap::new();
    envs.insert("GREETING".to_string(), "hello world".to_string());
    envs.insert("SHARED".to_string(), "create".to_string());
    envs.insert("PATH".to_string(), "/opt/custom/bin:/usr/bin:/bin".to_string());
    let sb = p.create(CreateRequest { envs, ..Default::default() }).await.unwrap();
    assert_eq!(sh(&p, &sb.id, "echo \"$GREETING\"").await, "hello world\n");
    // A grandchild (non-login sh) sees it too, and the login profile did not reset PATH.
    assert_eq!(
        sh(&p, &sb.id, "sh -c 'echo $GREETING; echo $PATH'").await,
        "hello world\n/opt/custom/bin:/usr/bin:/bin\n"
    );
    let mut r = cmd("echo $SHARED-$ONLY");
    r.envs.insert("SHARED".into(), "exec".into());
    r.envs.insert("ONLY".into(), "x".into());
    assert_eq!(p.exec(&sb.id, r, None).await.unwrap().stdout, b"exec-x\n");
    let pid = p.spawn(&sb.id, cmd("echo $GREETING")).await.unwrap();
    let w = p.wait(&sb.id, pid, Duration::from_secs(10)).await.unwrap();
    assert_eq!(w.stdout, b"hello world\n");
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn timeout_kills_the_whole_command() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let t0 = Instant::now();
    let mut r = cmd("sleep 30 & sleep 30; echo never");
    r.timeout = Some(Duration::from_millis(500));
    let res = p.exec(&sb.id, r, None).await.unwrap();
    assert!(res.timed_out);
    assert_eq!(res.signal, Some(9));
    assert!(res.stdout.is_empty());
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Both sleeps (same process group) are gone: killed at once, reaped by the sandbox's
    // pid 1 a moment later (a loaded machine makes that moment longer). Only bwrap's
    // keep-alive `sleep infinity` remains.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = sh(&p, &sb.id, "ps -eo stat=,comm= | awk '$2 == \"sleep\" && $1 !~ /^Z/' | wc -l").await;
        if left.trim() == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "{} sleeps left after the timeout", left.trim());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn sandboxes_have_private_filesystems() {
    let (p, _d) = ns();
    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    let host_opt = format!("/opt/scenario-run-test-{}", std::process::id());
    for (sb, word) in [(&a, "alpha"), (&b, "beta")] {
        sh(&p, &sb.id, &format!("echo {word} > /tmp/x && echo {word} > ~/h")).await;
        let mut r = cmd(&format!("echo {word} > {host_opt}"));
        r.user = Some("root".into());
        assert_eq!(p.exec(&sb.id, r, None).await.unwrap().exit_code, Some(0));
    }
    for (sb, word) in [(&a, "alpha"), (&b, "beta")] {
        assert_eq!(
            sh(&p, &sb.id, &format!("cat /tmp/x {host_opt} /home/user/h")).await,
            format!("{word}\n{word}\n{word}\n")
        );
        assert_eq!(p.read_file(&sb.id, &host_opt).await.unwrap(), format!("{word}\n").as_bytes());
    }
    assert!(!std::path::Path::new(&host_opt).exists(), "host {host_opt} must not exist");
    // The host's /tmp is not visible inside either.
    assert_eq!(sh(&p, &a.id, "ls -A /tmp").await, "x\n");
    p.kill(&a.id).await.unwrap();
    p.kill(&b.id).await.unwrap();
}

#[tokio::test]
async fn same_port_in_two_sandboxes() {
    let (p, _d) = ns();
    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    for (sb, word) in [(&a, "served by a"), (&b, "served by b")] {
        p.write_file(&sb.id, "www/index.html", word.as_bytes().to_vec(), None).await.unwrap();
        let mut r = cmd("cd www && exec python3 -m http.server 8000 --bind 127.0.0.1");
        r.timeout = None;
        p.spawn(&sb.id, r).await.unwrap();
    }
    for (sb, word) in [(&a, "served by a"), (&b, "served by b")] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while sh(&p, &sb.id, "(echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null && echo up || echo down").await != "up\n" {
            assert!(Instant::now() < deadline, "server did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let url = p.port_url(&sb.id, 8000).await.unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        assert_eq!(p.port_url(&sb.id, 8000).await.unwrap(), url, "one forwarder per port");
        let resp = http_get(&url).await.unwrap();
        assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
        assert!(resp.ends_with(word), "{resp}");
    }
    // Nothing listens on 9 inside: the forwarded connection is closed (EOF or reset), not hung.
    let url = p.port_url(&a.id, 9).await.unwrap();
    let resp = http_get(&url).await;
    assert!(resp.as_ref().map_or(true, |s| s.is_empty()), "{resp:?}");
    p.kill(&a.id).await.unwrap();
    p.kill(&b.id).await.unwrap();
}

fn host_processes_in_ns(ns_link: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(l) = std::fs::read_link(e.path().join("ns/pid")) {
            if l.to_string_lossy() == ns_link {
                found.push(name);
            }
        }
    }
    found
}

#[tokio::test]
async fn kill_ends_every_process_and_leaves_nothing() {
    let (p, d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let mut r = cmd("sleep 1000");
    r.timeout = None;
    p.spawn(&sb.id, r).await.unwrap();
    sh(&p, &sb.id, "setsid sleep 1000 >/dev/null 2>&1 < /dev/null &").await;
    let link = sh(&p, &sb.id, "readlink /proc/self/ns/pid").await.trim().to_string();
    assert!(link.starts_with("pid:["), "{link}");
    assert!(host_processes_in_ns(&link).len() >= 3, "sandbox processes visible before kill");
    let (image, disk) = (d.path().join(&sb.id).join("disk.img"), d.path().join(&sb.id).join("disk"));
    assert!(image.exists(), "the sandbox's disk");
    // Mount points are named `<owner pid>.…`: this test process's are its sandbox's.
    let mine = format!("{}.", std::process::id());
    let roots = || {
        std::fs::read_dir("/run/scenario-run/roots")
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&mine)).count())
            .unwrap_or(0)
    };
    assert_eq!(roots(), 1, "the sandbox's mount point");
    assert!(p.kill(&sb.id).await.unwrap());
    assert_eq!(host_processes_in_ns(&link), Vec::<String>::new());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mountinfo.contains(&disk.display().to_string()), "no mount of it on the host");
    // Its loop device went with its last mount (the kernel frees it a moment later).
    let attached = || {
        let out = std::process::Command::new("losetup").arg("-a").output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains(&image.display().to_string())
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while attached() {
        assert!(std::time::Instant::now() < deadline, "a loop device still holds {}", image.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(roots(), 0, "its mount point is removed");
    assert!(!d.path().join(&sb.id).exists(), "state dir removed");
    assert_eq!(p.exec(&sb.id, cmd("true"), None).await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.connect(&sb.id, None).await.unwrap_err().kind, ErrorKind::NotFound);
}

#[tokio::test]
async fn background_processes() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let mut r = cmd("echo started; trap 'echo got term; exit 7' TERM; while true; do sleep 0.05; done");
    r.timeout = None;
    let pid = p.spawn(&sb.id, r).await.unwrap();
    let quick = p.spawn(&sb.id, cmd("echo quick; exit 4")).await.unwrap();
    let list = p.process_list(&sb.id).await.unwrap();
    let me = list.iter().find(|i| i.pid == pid).expect("listed");
    assert!(me.running);
    assert!(me.cmd.starts_with("echo started"));
    // Waiting with a short timeout returns the output so far.
    let w = p.wait(&sb.id, pid, Duration::from_millis(300)).await.unwrap();
    assert!(w.timed_out);
    assert_eq!(w.stdout, b"started\n");
    p.signal(&sb.id, pid, 15).await.unwrap();
    let w = p.wait(&sb.id, pid, Duration::from_secs(10)).await.unwrap();
    assert!(!w.timed_out);
    assert_eq!(w.exit_code, Some(7));
    assert_eq!(w.stdout, b"started\ngot term\n");
    // A finished process keeps its result.
    let w = p.wait(&sb.id, quick, Duration::from_secs(10)).await.unwrap();
    assert_eq!((w.exit_code, w.stdout.as_slice()), (Some(4), &b"quick\n"[..]));
    let list = p.process_list(&sb.id).await.unwrap();
    assert!(list.iter().any(|i| i.pid == pid && !i.running && i.exit_code == Some(7)));
    assert_eq!(p.signal(&sb.id, pid, 15).await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.wait(&sb.id, 99999, Duration::from_millis(10)).await.unwrap_err().kind, ErrorKind::NotFound);
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn file_operations() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let id = &sb.id;
    let big: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    let e = p.write_file(id, "deep/dir/big.bin", big.clone(), Some(0o600)).await.unwrap();
    assert_eq!((e.path.as_str(), e.name.as_str(), e.kind.as_str()), ("/home/user/deep/dir/big.bin", "big.bin", "file"));
    assert_eq!((e.size, e.mode), (big.len() as u64, 0o600));
    assert_eq!(p.read_file(id, "/home/user/deep/dir/big.bin").await.unwrap(), big);
    assert_eq!(sh(&p, id, "stat -c %s deep/dir/big.bin").await.trim(), big.len().to_string());

    // Files are written as the sandbox user: owned by it, and refused where it may not write.
    assert_eq!(sh(&p, id, "stat -c %U:%G deep/dir/big.bin deep").await, "user:user\nuser:user\n");
    let e = p.write_file(id, "/etc/scenario-test.conf", b"x=1\n".to_vec(), None).await.unwrap_err();
    assert!(e.message.starts_with("permission denied"), "{}", e.message);
    let host_tmp = format!("/tmp/scenario-test-{}.conf", std::process::id());
    p.write_file(id, &host_tmp, b"x=1\n".to_vec(), None).await.unwrap();
    assert_eq!(sh(&p, id, &format!("cat {host_tmp}")).await, "x=1\n");
    assert!(!std::path::Path::new(&host_tmp).exists());

    let d = p.make_dir(id, "a/b").await.unwrap();
    assert_eq!(d.kind, "dir");
    p.make_dir(id, "a/b").await.unwrap();
    p.write_file(id, "a/one.txt", b"1".to_vec(), None).await.unwrap();
    let names: Vec<(String, String)> =
        p.list_dir(id, "a").await.unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
    assert_eq!(names, [("b".into(), "dir".into()), ("one.txt".into(), "file".into())]);

    let r = p.rename(id, "a/one.txt", "a/b/two.txt").await.unwrap();
    assert_eq!(r.path, "/home/user/a/b/two.txt");
    assert!(!p.exists(id, "a/one.txt").await.unwrap());
    assert!(p.exists(id, "/home/user/a/b/two.txt").await.unwrap());
    assert_eq!(p.stat(id, "a/b/two.txt").await.unwrap().size, 1);

    p.remove(id, "a").await.unwrap();
    assert!(!p.exists(id, "a").await.unwrap());
    assert!(!p.exists(id, "nope/deeper").await.unwrap());
    let e = p.read_file(id, "missing").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert_eq!(e.message, "no such file or directory: /home/user/missing");
    assert_eq!(p.stat(id, "missing").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.remove(id, "missing").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.list_dir(id, "missing").await.unwrap_err().kind, ErrorKind::NotFound);
    assert_eq!(p.read_file(id, "/home").await.unwrap_err().kind, ErrorKind::Invalid);
    assert_eq!(p.read_file(id, "/../etc/passwd").await.unwrap_err().kind, ErrorKind::Invalid);

    // A symlink planted inside the sandbox cannot redirect a write to the host.
    let target = format!("/tmp/scenario-run-escape-{}", std::process::id());
    sh(&p, id, &format!("ln -s {target} /home/user/link")).await;
    p.write_file(id, "link", b"inside".to_vec(), None).await.unwrap();
    assert!(!std::path::Path::new(&target).exists(), "write escaped to the host");
    assert_eq!(sh(&p, id, &format!("cat {target}")).await, "inside");
    assert_eq!(p.stat(id, "link").await.unwrap().kind, "symlink");
    p.kill(id).await.unwrap();
    assert_eq!(p.read_file(id, "x").await.unwrap_err().kind, ErrorKind::NotFound);
}

#[tokio::test]
async fn lifecycle_metadata_expiry_and_stats() {
    let (p, _d) = ns();
    let mut md = BTreeMap::new();
    md.insert("suite".to_string(), "t".to_string());
    let b = p.create(CreateRequest::default()).await.unwrap();
    let c = p.create(CreateRequest { metadata: md.clone(), ..Default::default() }).await.unwrap();
    // Last, and listed at once: a loaded machine takes a while for each create, and `a` must
    // still be alive when it is listed.
    let a =
        p.create(CreateRequest { metadata: md.clone(), timeout_secs: Some(3), ..Default::default() }).await.unwrap();
    assert!(a.end_at > a.started_at && a.end_at <= a.started_at + 4);
    let listed: Vec<String> = p.list(&md).await.unwrap().into_iter().map(|i| i.id).collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&a.id) && listed.contains(&c.id));
    assert_eq!(p.list(&BTreeMap::new()).await.unwrap().len(), 3);
    assert_eq!(p.connect(&b.id, Some(600)).await.unwrap().id, b.id);
    assert!(p.info(&b.id).await.unwrap().end_at >= b.started_at + 599);
    assert_eq!(p.connect("sbx-nope", None).await.unwrap_err().kind, ErrorKind::NotFound);

    // c is extended, a expires by itself.
    p.set_timeout(&c.id, 60).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while p.info(&a.id).await.is_ok() {
        assert!(Instant::now() < deadline, "sandbox did not expire");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(p.connect(&a.id, None).await.unwrap_err().kind, ErrorKind::NotFound);
    // Regression (issue 13, item 8): the counters move with the registry, under one lock, so
    // once the sandbox is gone from info/list it is counted destroyed, even while its
    // teardown still runs (this failed about one run in three under load).
    let st = p.stats();
    assert_eq!((st.created, st.destroyed, st.live, st.peak_live), (3, 1, 2, 3));

    // Concurrent creates are counted exactly.
    let made = futures_join(&p, 4).await;
    let st = p.stats();
    assert_eq!((st.created, st.live, st.peak_live), (7, 6, 6));
    assert_eq!(made, 4);
    assert_eq!(p.destroy_all().await, 6);
    let st = p.stats();
    assert_eq!((st.created, st.destroyed, st.live, st.peak_live), (7, 7, 0, 6));
    assert!(p.list(&BTreeMap::new()).await.unwrap().is_empty());
}

async fn futures_join(p: &LocalProvider, n: usize) -> usize {
    let mut made = 0;
    let futs: Vec<_> = (0..n).map(|_| p.create(CreateRequest::default())).collect();
    for r in join_all(futs).await {
        r.unwrap();
        made += 1;
    }
    made
}

/// Polls all futures concurrently (no extra crate needed).
async fn join_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.unwrap()).collect()
}

#[tokio::test]
async fn without_isolation_dirs_are_per_sandbox() {
    let (p, d) = provider(Isolation::None);
    assert_eq!(p.isolation(), Isolation::None);
    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    p.write_file(&a.id, "/tmp/x", b"a".to_vec(), None).await.unwrap();
    p.write_file(&b.id, "/tmp/x", b"b".to_vec(), None).await.unwrap();
    assert_eq!(p.read_file(&a.id, "/tmp/x").await.unwrap(), b"a");
    assert_eq!(p.read_file(&b.id, "/tmp/x").await.unwrap(), b"b");
    let home = d.path().join(&a.id).join("home");
    assert_eq!(sh(&p, &a.id, "pwd").await.trim(), home.display().to_string());
    assert_eq!(sh(&p, &a.id, "cat $TMPDIR/x").await, "a");
    let r = p.exec(&a.id, cmd("echo $$; exit 2"), None).await.unwrap();
    assert_eq!(r.exit_code, Some(2));
    let mut bg = cmd("sleep 1000");
    bg.timeout = None;
    let pid = p.spawn(&a.id, bg).await.unwrap();
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(p.port_url(&a.id, 8000).await.unwrap(), "http://127.0.0.1:8000");
    p.kill(&a.id).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(Instant::now() < deadline, "background process survived kill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!d.path().join(&a.id).exists());
    p.kill(&b.id).await.unwrap();
}

#[tokio::test]
async fn dropped_provider_kills_its_sandboxes() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let link = sh(&p, &sb.id, "readlink /proc/self/ns/pid").await.trim().to_string();
    p.destroy_all_now();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !host_processes_in_ns(&link).is_empty() {
        assert!(Instant::now() < deadline, "destroy_all_now left processes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(p);
}

#[tokio::test]
async fn output_past_max_output_is_streamed_whole_but_kept_only_to_the_cap() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let (tx, mut rx) = scenario_run::provider::output_channel();
    let req = ExecRequest { max_output: Some(1000), ..cmd("head -c 300000 /dev/zero | tr '\\0' o") };
    // The live channel is bounded: it is read while the command runs.
    let reader = tokio::spawn(async move {
        let mut streamed = 0;
        while let Some(c) = rx.recv().await {
            if let OutputChunk::Stdout(b) = c {
                streamed += b.len();
            }
        }
        streamed
    });
    let r = p.exec(&sb.id, req, Some(tx)).await.unwrap();
    assert_eq!((r.stdout.len(), r.stdout_dropped), (1000, 299_000));
    assert!(r.stdout.iter().all(|b| *b == b'o'));
    assert_eq!(reader.await.unwrap(), 300_000, "a live listener gets all of it");
    p.destroy_all().await;
}

/// Issue 13, item 13: live output is backpressured, not queued. A writer whose listener does
/// not read waits on its pipe (it cannot finish, and nothing piles up in memory); once read,
/// every byte arrives and it finishes.
#[tokio::test]
async fn a_live_listener_that_does_not_read_holds_the_writer_back() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let total = 32 << 20;
    let req = cmd(&format!("head -c {total} /dev/zero; touch /tmp/finished"));
    let mut live = p.spawn_live(&sb.id, req, false).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let check = p.exec(&sb.id, cmd("test -e /tmp/finished"), None).await.unwrap();
    assert_eq!(check.exit_code, Some(1), "32 MiB went nowhere while nobody read: they were queued");
    let mut streamed = 0;
    while let Some(c) = live.output.recv().await {
        if let OutputChunk::Stdout(b) = c {
            streamed += b.len();
        }
    }
    assert_eq!(streamed, total);
    let r = p.wait(&sb.id, live.pid, std::time::Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.exit_code, Some(0));
    let check = p.exec(&sb.id, cmd("test -e /tmp/finished"), None).await.unwrap();
    assert_eq!(check.exit_code, Some(0), "read to the end, the writer finished");
    p.destroy_all().await;
}

/// A state directory inside a directory only root may enter (a 0700 home or temporary
/// directory) still gives isolated sandboxes: the sandbox's root must not need to walk there.
#[tokio::test]
async fn a_state_directory_under_a_private_directory_still_isolates() {
    use std::os::unix::fs::PermissionsExt;
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let opts = LocalOptions {
        state_dir: private.path().join("state"),
        isolation: Isolation::Namespaces,
        ..LocalOptions::default()
    };
    let p = LocalProvider::new(opts).expect("isolation works under a private directory");
    let sb = p.create(CreateRequest::default()).await.unwrap();
    assert_eq!(sh(&p, &sb.id, "id -un").await, "user\n");
    p.kill(&sb.id).await.unwrap();
}

/// Regression (issue 23, item 10): `read_file` of a FIFO never returned (and the runner, its
/// blocking thread stuck, then hung at exit, deaf to SIGTERM); one of a link to `/dev/zero`
/// read until the host ran out of memory. Only regular files are read, each up to the read
/// limit (checked by its size before anything is read); a write onto a FIFO does not block.
#[tokio::test]
async fn issue_23_read_file_refuses_fifos_devices_and_files_past_the_limit() {
    let (p, _d) = ns();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let id = &sb.id;
    sh(&p, id, "mkfifo /tmp/fifo && ln -s /dev/zero /tmp/zero && truncate -s 100G /tmp/huge").await;
    match tokio::time::timeout(Duration::from_secs(10), p.read_file(id, "/tmp/fifo")).await {
        Ok(r) => {
            let e = r.unwrap_err();
            assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Invalid, "is a FIFO, not a regular file: /tmp/fifo"));
        }
        Err(_) => {
            // Let the stuck reader go, so that the test ends.
            let _ = p.exec(id, cmd("echo > /tmp/fifo"), None).await;
            panic!("read_file of a FIFO did not return within 10 s");
        }
    }
    let e = p.read_file(id, "/tmp/zero").await.unwrap_err();
    assert_eq!(
        (e.kind, e.message.as_str()),
        (ErrorKind::Invalid, "is a character device, not a regular file: /tmp/zero")
    );
    let e = p.read_file_as(id, "/tmp/fifo", "root").await.unwrap_err();
    assert!(e.message.starts_with("is a FIFO"), "{}", e.message);
    let e = p.read_file(id, "/tmp/huge").await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.starts_with("is larger than 1 GiB, the most one read takes"), "{}", e.message);
    assert!(e.message.ends_with(": /tmp/huge"), "{}", e.message);
    let w = tokio::time::timeout(Duration::from_secs(10), p.write_file(id, "/tmp/fifo", b"x".to_vec(), None))
        .await
        .expect("a write onto a FIFO returns");
    assert!(w.unwrap_err().message.starts_with("is a FIFO, not a regular file"));
    // A file named `/etc/passwd` that is a FIFO does not hang who reads the sandbox's users.
    sh(&p, id, "sudo sh -c 'mv /etc/passwd /etc/passwd.real && mkfifo /etc/passwd'").await;
    let r = tokio::time::timeout(Duration::from_secs(10), p.read_file_as(id, "/etc/hostname", "root")).await;
    assert!(r.is_ok(), "looking up a user through a FIFO /etc/passwd hung");
    p.kill(id).await.unwrap();
}

/// The same through the runner: a `read-file` of a FIFO fails its step at once, saying why,
/// and the run ends (before, its stuck thread kept the process alive after the summary).
#[test]
fn issue_23_a_run_that_reads_a_fifo_fails_the_step_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("fifo.yaml");
    std::fs::write(
        &scenario,
        "name: fifo\nsteps:\n  - create: base\n  - exec: mkfifo /tmp/fifo\n  - read-file: /tmp/fifo\n    timeout: 5s\n",
    )
    .unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_scenario-run"))
        .args([scenario.to_str().unwrap(), "--no-progress"])
        .env("SCENARIO_RUN_STATE_DIR", dir.path().join("state"))
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("the run did not end within 60 s:\n{}", String::from_utf8_lossy(&out.stdout));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("is a FIFO, not a regular file: /tmp/fifo"), "{text}");
}

#[tokio::test]
async fn mounts_bind_host_directories_read_write_or_read_only_and_refuse_links() {
    use std::os::unix::fs::PermissionsExt;
    let (p, _d) = ns();
    let host = tempfile::Builder::new().prefix("srmount-").tempdir().unwrap();
    std::fs::write(host.path().join("marker.txt"), "from the host").unwrap();
    // The sandbox's root is an unprivileged user of the host: the directory lets it write.
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let mount = |path: &str, read_only| scenario_run::provider::Mount {
        host: scenario_run::hostfs::HostDir::open_trusted(host.path()).unwrap(),
        path: path.to_string(),
        read_only,
    };
    let sb = p
        .create(CreateRequest {
            mounts: vec![mount("/mnt/rw/deep", false), mount("/mnt/ro", true)],
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sh(&p, &sb.id, "cat /mnt/rw/deep/marker.txt /mnt/ro/marker.txt").await, "from the hostfrom the host");
    sh(&p, &sb.id, "echo from-inside > /mnt/rw/deep/written.txt").await;
    assert_eq!(std::fs::read_to_string(host.path().join("written.txt")).unwrap(), "from-inside\n");
    let r = p.exec(&sb.id, cmd("touch /mnt/ro/nope"), None).await.unwrap();
    assert_ne!(r.exit_code, Some(0), "a read-only mount was written");
    assert!(!host.path().join("nope").exists());
    // Nothing else of the host shows: the mount is that directory only.
    assert_eq!(sh(&p, &sb.id, "ls /mnt/ro | sort").await, "marker.txt\nwritten.txt\n");
    p.kill(&sb.id).await.unwrap();
    // A mount point is never made through a link (an absolute one would resolve on the host):
    // `/bin` is a link to `usr/bin` in the base image (merged /usr).
    let e =
        p.create(CreateRequest { mounts: vec![mount("/mnt/../etc", false)], ..Default::default() }).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid, "{}", e.message);
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let bin_is_link = sh(&p, &sb.id, "test -L /bin && echo link || echo dir").await == "link\n";
    p.kill(&sb.id).await.unwrap();
    assert!(bin_is_link, "the base image's /bin is expected to be a link");
    let e = p.create(CreateRequest { mounts: vec![mount("/bin/x", false)], ..Default::default() }).await;
    assert!(e.is_err(), "a mount point through /bin (a link) was made");
}

/// The sandboxes' directories in state directory `dir`.
fn sandbox_dirs(dir: &std::path::Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned());
    names.filter(|n| n.starts_with("sbx-")).collect()
}

/// Groups of this host's cgroup hierarchy (v1 controllers or the v2 tree) named after `id`.
fn cgroups_of(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let parents = ["memory", "pids", "cpu", "cpuset", "freezer", ""]
        .map(|c| std::path::Path::new("/sys/fs/cgroup").join(c).join("scenario-run"));
    for parent in parents {
        if let Ok(rd) = std::fs::read_dir(&parent) {
            found.extend(
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(&format!(".{id}")))
                    .map(|e| e.path().display().to_string()),
            );
        }
    }
    found
}

/// Issue 36 item 6: the local provider never blocks the runtime it runs on. On one thread (a
/// current-thread runtime) a ticker notes its largest gap while sandboxes are created (twice
/// the same shape, so the warm pool boots spares), one is killed, and the provider is dropped
/// with two still running and the spares booted. Dropping used to sleep 150 ms and then retry
/// removing cgroups with sleeps on the runtime's own thread; everything is still gone after.
#[test]
fn issue_36_the_provider_never_blocks_the_runtime_and_its_drop_leaves_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // The isolation probe of the synchronous constructor is its documented exception.
    let (p, d) = ns();
    rt.block_on(async move {
        let (worst, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (w, s) = (worst.clone(), stop.clone());
        let ticker = tokio::spawn(async move {
            let mut last = Instant::now();
            while !s.load(SeqCst) {
                tokio::time::sleep(Duration::from_millis(2)).await;
                let now = Instant::now();
                w.fetch_max(now.duration_since(last).as_micros() as u64, SeqCst);
                last = now;
            }
        });
        // The largest gap so far, in ms, and a fresh start for the next phase.
        let phase = || worst.swap(0, SeqCst) as f64 / 1000.0;
        tokio::time::sleep(Duration::from_millis(20)).await;
        phase();
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(p.create(CreateRequest::default()).await.unwrap().id);
        }
        sh(&p, &ids[1], "setsid sleep 600 >/dev/null 2>&1 < /dev/null & sleep 600 >/dev/null 2>&1 &").await;
        let link = sh(&p, &ids[1], "readlink /proc/self/ns/pid").await.trim().to_string();
        // Give the warm pool its moment to boot spares.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let create = phase();
        assert!(p.kill(&ids[0]).await.unwrap());
        let kill = phase();
        // Every sandbox there is, spares included (they are named like any other).
        let all = sandbox_dirs(d.path());
        assert!(all.len() > 2, "the warm pool booted spares: {all:?}");
        drop(p);
        // The drop handed its waits (150 ms for the processes to go, cgroup removals retried)
        // to the cleanup thread instead of doing them here, on the runtime's only thread.
        assert!(
            !scenario_run::provider::local::wait_for_cleanups(Duration::ZERO),
            "the drop did its cleanup on the runtime instead of handing it off"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let dropped = phase();
        stop.store(true, SeqCst);
        ticker.await.unwrap();
        // Figures, not bounds (a loaded CI machine stretches any gap): 35–60 ms creating and
        // killing in a debug build on two busy cores, 8–20 ms dropping (630 ms before).
        eprintln!("largest gaps of the runtime: create {create:.1} ms, kill {kill:.1} ms, drop {dropped:.1} ms");
        // Nothing is left: the cleanups a drop hands off are done before the process exits.
        assert!(scenario_run::provider::local::wait_for_cleanups(Duration::from_secs(20)), "cleanups still running");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !host_processes_in_ns(&link).is_empty() {
            assert!(Instant::now() < deadline, "processes left: {:?}", host_processes_in_ns(&link));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for id in &all {
            assert_eq!(cgroups_of(id), Vec::<String>::new(), "cgroups left");
        }
        assert_eq!(sandbox_dirs(d.path()), Vec::<String>::new(), "sandbox directories left");
    });
}

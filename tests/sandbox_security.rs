//! Attacks on a local sandbox, each of which must fail inside it and leave the host untouched.
//!
//! Everything a sandbox runs is untrusted (scenario commands, build steps, agent CLIs running
//! model-written code). These tests act as such code would, against real sandboxes: real user
//! namespaces, cgroups, seccomp and images. They need root (CI runs as root).

use std::time::Duration;

use scenario_run::provider::caps::*;
use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ExecRequest, Provider};

fn provider() -> (LocalProvider, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let opts =
        LocalOptions { state_dir: dir.path().to_path_buf(), isolation: Isolation::Namespaces, ..Default::default() };
    (LocalProvider::new(opts).expect("isolated sandboxes (needs root, bwrap)"), dir)
}

fn req(cmd: &str, user: &str) -> ExecRequest {
    ExecRequest {
        cmd: cmd.to_string(),
        user: Some(user.to_string()),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    }
}

/// Runs `cmd` as `user` and returns (exit code, stdout, stderr).
async fn run(p: &LocalProvider, id: &str, user: &str, cmd: &str) -> (Option<i32>, String, String) {
    let r = p.exec(id, req(cmd, user), None).await.unwrap();
    (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned(), String::from_utf8_lossy(&r.stderr).into_owned())
}

async fn ok(p: &LocalProvider, id: &str, user: &str, cmd: &str) -> String {
    let (code, out, err) = run(p, id, user, cmd).await;
    assert_eq!(code, Some(0), "{cmd} as {user} failed: {err}");
    out
}

/// Mounts in the host's namespace that a sandbox could have made: anything of tmpfs, proc,
/// sysfs, cgroup or overlay type, or under the sandboxes' mount points. (Other processes on a
/// busy machine, a Docker engine among them, add and remove their own mounts meanwhile: those
/// are told apart by their mount points, which are never the paths a sandbox names.)
fn sandbox_mounts_on_the_host() -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            let mount_point = l.split(' ').nth(4).unwrap_or("");
            mount_point == "/mnt"
                || mount_point.starts_with("/run/scenario-run")
                || l.contains("/run/scenario-run/roots/")
        })
        .map(str::to_string)
        .collect();
    found.sort();
    found
}

fn status_field(status: &str, key: &str) -> String {
    status.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_string()).unwrap_or_default()
}

#[tokio::test]
async fn commands_run_as_the_user_with_no_capabilities() {
    let (p, _d) = provider();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let status = ok(&p, &sb.id, "user", "id -u; id -g; cat /proc/self/status").await;
    assert!(status.starts_with("1000\n1000\n"), "{status}");
    assert_eq!(status_field(&status, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(&status, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(&status, "Seccomp:"), "2", "the seccomp filter is on");
    // Default user is `user`, in its home.
    let r = p.exec(&sb.id, ExecRequest { cmd: "id -un; pwd".into(), ..Default::default() }, None).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "user\n/home/user\n");
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn root_inside_is_an_unprivileged_range_on_the_host() {
    let (p, d) = provider();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    // Commands run in a user namespace nested in the sandbox's, one for one: their uid_map is
    // shown relative to the sandbox's own namespace. The host side is the owner below.
    let map = ok(&p, &sb.id, "root", "cat /proc/self/uid_map").await;
    let fields: Vec<u64> = map.split_whitespace().map(|f| f.parse().unwrap()).collect();
    assert_eq!(fields, [0, 0, 65536], "{map}");
    let status = ok(&p, &sb.id, "root", "cat /proc/self/status").await;
    let bounding = u64::from_str_radix(&status_field(&status, "CapBnd:"), 16).unwrap();
    for (cap, name) in [(21, "CAP_SYS_ADMIN"), (16, "CAP_SYS_MODULE"), (19, "CAP_SYS_PTRACE"), (12, "CAP_NET_ADMIN")] {
        assert_eq!(bounding & (1 << cap), 0, "{name} is in the bounding set");
    }
    // What root writes inside belongs to the unprivileged range on the host (seen from the
    // host through a process of the sandbox: its writable layer is on a disk of its own).
    let _ = d;
    let pid = ok(&p, &sb.id, "root", "echo x > /root-owned; sleep 30 >/dev/null 2>&1 & echo $!").await;
    // The background sleep may not have exec'd yet when the command returns: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let host_pid = loop {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|h| {
                std::fs::read_to_string(format!("/proc/{h}/status")).is_ok_and(|s| {
                    s.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().last() == Some(pid.trim()))
                        && s.lines().next() == Some("Name:\tsleep")
                })
            });
        if let Some(h) = found {
            break h;
        }
        assert!(std::time::Instant::now() < deadline, "the sandbox's sleep, seen from the host");
        std::thread::sleep(Duration::from_millis(20));
    };
    let meta = std::fs::metadata(format!("/proc/{host_pid}/root/root-owned")).expect("the file, seen from the host");
    use std::os::unix::fs::MetadataExt;
    assert!(meta.uid() >= 65536, "root inside owns files as host uid {}, not an unprivileged range", meta.uid());
    // And sudo gives root inside.
    assert_eq!(ok(&p, &sb.id, "user", "sudo -n id -u").await, "0\n");
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn mounts_devices_and_kernel_interfaces_are_refused_even_to_root() {
    let (p, _d) = provider();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    let host_mounts = sandbox_mounts_on_the_host();
    let attacks = [
        "mount -t tmpfs none /mnt",
        "mount -t proc proc /mnt",
        "mount --bind / /mnt",
        "umount /proc",
        "umount -l /dev",
        "mknod /tmp/disk b 8 0",
        "mknod /tmp/mem c 1 1",
        "unshare -U true",
        "unshare -m true",
        "unshare -n true",
        "echo b > /proc/sysrq-trigger",
        "echo 1 > /proc/sys/vm/drop_caches",
        "echo x > /proc/sys/kernel/hostname",
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(250,0,0,0,0,0) >= 0 else 1)'", // keyctl
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(321,0,0,0) >= 0 else 1)'", // bpf
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(313,0,0,0) >= 0 else 1)'", // finit_module
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(169,0xfee1dead,672274793,0x1234567,0) >= 0 else 1)'", // reboot
        "python3 -c 'import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); sys.exit(0 if l.syscall(308,3,0) >= 0 else 1)'", // setns
        "test -w /sys/fs/cgroup || ls /sys/fs/cgroup/memory/memory.limit_in_bytes",
        "cat /dev/sda",
        "cat /dev/kmsg",
        "ls /dev | grep -qE '^(sd|vd|nvme|kmsg|mem)'",
    ];
    for attack in attacks {
        for user in ["root", "user"] {
            let (code, _, _) = run(&p, &sb.id, user, attack).await;
            assert_ne!(code, Some(0), "`{attack}` as {user} succeeded inside the sandbox");
        }
    }
    // sudo gives root inside, and root inside still cannot mount.
    let (code, _, _) = run(&p, &sb.id, "user", "sudo -n mount -t tmpfs none /mnt").await;
    assert_ne!(code, Some(0));
    assert_eq!(sandbox_mounts_on_the_host(), host_mounts);
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn the_host_is_invisible() {
    let (p, d) = provider();
    let canary = format!("/tmp/scenario-run-canary-{}", std::process::id());
    std::fs::write(&canary, "host secret").unwrap();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    for path in [canary.as_str(), "/root/.cargo", "/work", "/usr/bin/bwrap", "/var/run/docker.sock", "/sys/fs/cgroup"] {
        let (code, _, _) = run(&p, &sb.id, "root", &format!("test -e {path}")).await;
        assert_ne!(code, Some(0), "{path} is visible inside");
    }
    // Neither the state directory (where the sandbox's own and others' layers live)...
    let state = d.path().display().to_string();
    assert_ne!(run(&p, &sb.id, "root", &format!("test -e {state}")).await.0, Some(0));
    // ...nor the host's processes: pid 1 is the sandbox's own init, and only a handful exist.
    let procs = ok(&p, &sb.id, "root", "ls /proc | grep -c '^[0-9]'").await;
    assert!(procs.trim().parse::<u32>().unwrap() < 10, "{procs} processes visible");
    assert!(ok(&p, &sb.id, "root", "cat /proc/1/cmdline").await.starts_with("bwrap"));
    // The file API cannot climb out either.
    assert!(p.read_file(&sb.id, &canary).await.is_err());
    std::fs::remove_file(&canary).unwrap();
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn sandboxes_reach_neither_each_other_nor_the_hosts_loopback() {
    let (p, _d) = provider();
    let host = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let host_port = host.local_addr().unwrap().port();
    let a = p.create(CreateRequest::default()).await.unwrap();
    let b = p.create(CreateRequest::default()).await.unwrap();
    let serve = ExecRequest { cmd: "exec python3 -m http.server 8123 --bind 127.0.0.1".into(), ..Default::default() };
    p.spawn(&b.id, serve).await.unwrap();
    let connect =
        |port: u16| format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2)'");
    // b's server is up (from inside b) ...
    let mut up = false;
    for _ in 0..50 {
        if run(&p, &b.id, "user", &connect(8123)).await.0 == Some(0) {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(up, "the server in b did not come up");
    // ... but neither it nor the host's listener is reachable from a.
    assert_ne!(run(&p, &a.id, "user", &connect(8123)).await.0, Some(0), "a reached b's port");
    assert_ne!(run(&p, &a.id, "root", &connect(host_port)).await.0, Some(0), "a reached the host's loopback");
    p.kill(&a.id).await.unwrap();
    p.kill(&b.id).await.unwrap();
}

#[tokio::test]
async fn memory_cpu_and_process_limits_hold() {
    let (p, _d) = provider();
    let sb = p.create(CreateRequest { memory_mb: Some(512), cpu: Some(1), ..Default::default() }).await.unwrap();
    let alloc = |mb: u32| format!("python3 -c 'b = bytearray({mb} * 1024 * 1024); print(len(b))'");
    assert_eq!(run(&p, &sb.id, "user", &alloc(200)).await.0, Some(0), "200 MiB fit in 512");
    let (code, _, _) = run(&p, &sb.id, "user", &alloc(1024)).await;
    assert_ne!(code, Some(0), "a 512 MiB sandbox held 1 GiB");
    assert_eq!(ok(&p, &sb.id, "user", "nproc").await, "1\n");
    // A fork bomb stops at the process limit, inside the sandbox.
    let bomb = "python3 -c 'import os, time
n = 0
for i in range(1500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
print(n)'";
    let (_, out, _) = run(&p, &sb.id, "user", bomb).await;
    let live: u32 = out.trim().parse().unwrap_or(0);
    assert!(live > 100 && live < 1024, "{live} forks succeeded in a sandbox limited to 1024 processes");
    p.kill(&sb.id).await.unwrap();
}

/// Every command joins every group of its sandbox (on cgroup v1 it writes itself into each
/// group's `tasks`, which moves one thread: it must have moved the whole process). Inside the
/// sandbox's cgroup namespace, whose root is the sandbox's group, each controller of
/// `/proc/self/cgroup` then reads `/`; a process left outside one would read `/../…`. Checked
/// for a command, its child and a process started in the background by an earlier command.
#[tokio::test]
async fn every_command_is_in_every_group_of_its_sandbox() {
    let (p, _d) = provider();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    ok(&p, &sb.id, "user", "nohup sleep 600 >/dev/null 2>&1 &").await;
    let out = ok(
        &p,
        &sb.id,
        "user",
        "cat /proc/self/cgroup; sh -c 'cat /proc/self/cgroup'; cat /proc/$(pgrep -n -f 'sleep 600')/cgroup",
    )
    .await;
    let lines: Vec<&str> = out.lines().collect();
    for ctrl in ["memory", "pids", "cpu", "cpuset"] {
        let mine: Vec<&&str> =
            lines.iter().filter(|l| l.split(':').nth(1).is_some_and(|c| c.split(',').any(|x| x == ctrl))).collect();
        assert_eq!(mine.len(), 3, "{ctrl} in each of the three views:\n{out}");
        assert!(mine.iter().all(|l| l.ends_with(":/")), "a process outside the sandbox's {ctrl} group:\n{out}");
    }
    p.kill(&sb.id).await.unwrap();
}

#[tokio::test]
async fn killing_a_sandbox_leaves_no_process_and_no_cgroup() {
    let (p, _d) = provider();
    let sb = p.create(CreateRequest::default()).await.unwrap();
    ok(&p, &sb.id, "user", "setsid sleep 600 & nohup sleep 600 >/dev/null 2>&1 & true").await;
    let groups = || -> Vec<String> {
        let mut found = Vec::new();
        for ctrl in ["memory", "pids", "cpu"] {
            if let Ok(rd) = std::fs::read_dir(format!("/sys/fs/cgroup/{ctrl}/scenario-run")) {
                found.extend(
                    rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.ends_with(&sb.id)),
                );
            }
        }
        found
    };
    assert!(!groups().is_empty(), "the sandbox has cgroups");
    p.kill(&sb.id).await.unwrap();
    assert!(groups().is_empty(), "cgroups left: {:?}", groups());
    let ps = std::process::Command::new("ps").args(["-eo", "uid,args"]).output().unwrap();
    let leftovers: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| {
            let uid: u64 = l.split_whitespace().next().and_then(|u| u.parse().ok()).unwrap_or(0);
            l.contains("sleep 600") && uid >= 65536
        })
        .map(str::to_string)
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// The hostile scenarios in tests/fixtures/hostile, through the real binary: every attack
/// fails inside (the run passes, nothing printed ESCAPED) and the host is untouched.
#[test]
fn hostile_scenarios_fail_inside_and_leave_the_host_untouched() {
    let canary_dir = tempfile::tempdir().unwrap();
    let canary = canary_dir.path().join("canary");
    std::fs::write(&canary, "host secret").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mounts = sandbox_mounts_on_the_host();
    let state = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_scenario-run"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tests/fixtures/hostile", "--no-progress", "--isolation", "namespaces"])
        .env("SCENARIO_RUN_STATE_DIR", state.path())
        .env("HOSTILE_HOST_PORT", &port)
        .env("HOSTILE_HOST_CANARY", &canary)
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("3 passed"), "{text}");
    assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host secret", "the host's file was written");
    assert_eq!(sandbox_mounts_on_the_host(), mounts);
    drop(listener);
}

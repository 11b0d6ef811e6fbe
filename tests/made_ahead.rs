//! What the local provider makes ahead so a create that finds no booted spare is quick (issue 39
//! item 6): disk images attached to their loop devices, and user namespaces. Each is held by the
//! runner alone, reached by no one else (an unprivileged host user, a sandbox), handed to one
//! sandbox, and gone with the provider. Real sandboxes; needs root (CI runs as root).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use scenario_run::provider::caps::*;
use scenario_run::provider::local::{Isolation, LocalOptions, LocalProvider};
use scenario_run::provider::{CreateRequest, ExecRequest, Provider};

/// How many of each the pools keep when nothing says (their `DEFAULT_POOL`).
const POOLED: usize = 3;

fn provider(dir: &Path) -> LocalProvider {
    if !rustix::process::getuid().is_root() {
        panic!("this test needs root (isolated local sandboxes)");
    }
    let opts = LocalOptions { state_dir: dir.to_path_buf(), isolation: Isolation::Namespaces, ..Default::default() };
    LocalProvider::new(opts).expect("isolated sandboxes (needs root, bwrap)")
}

/// Loop devices attached to a file under `dir`: (device, backing file).
fn loops_under(dir: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/sys/block").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(file) = std::fs::read_to_string(e.path().join("loop/backing_file")) {
            let file = PathBuf::from(file.trim_end());
            if file.starts_with(dir) {
                found.push((PathBuf::from("/dev").join(&name), file));
            }
        }
    }
    found
}

/// This process's descriptors of user namespaces other than its own, by path.
fn foreign_user_namespaces() -> Vec<PathBuf> {
    let own = std::fs::read_link("/proc/self/ns/user").unwrap();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy();
            if t.starts_with("user:[") && target != own {
                found.push(PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    e.file_name().to_string_lossy()
                )));
            }
        }
    }
    found
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `args` as host user nobody; whether it succeeded, and its stderr.
fn as_nobody(args: &[&str]) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(args)
        .output()
        .expect("setpriv (util-linux)");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn as_root(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).output().unwrap().status.success()
}

#[tokio::test]
async fn what_is_made_ahead_is_the_runners_alone_and_goes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let sb = p.create(CreateRequest::default()).await.unwrap();

    // The sandbox's disk came attached: its device is over its own image (renamed into its
    // directory from the pool's, the device following the file).
    let image = dir.path().join(&sb.id).join("disk.img");
    until("the sandbox's image is attached", || loops_under(dir.path()).iter().any(|(_, f)| *f == image)).await;
    // The take refilled both pools.
    let pooled = || loops_under(dir.path()).into_iter().filter(|(_, f)| *f != image).collect::<Vec<_>>();
    until("the disk pool holds attached images", || pooled().len() >= POOLED).await;
    // Each spare is a pair: the sandbox's namespace and the one nested in it for commands.
    until("the user-namespace pool is full", || foreign_user_namespaces().len() >= 2 * POOLED).await;
    let devices = pooled();
    for (_, file) in &devices {
        assert!(
            file.parent().unwrap().file_name().unwrap().to_string_lossy().starts_with("disk-pool."),
            "{}",
            file.display()
        );
        // The image is root's alone.
        let meta = std::fs::metadata(file).unwrap();
        assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "{}", file.display());
    }

    // From the host, as an unprivileged user: no pooled device opens, no namespace the runner
    // holds is entered. (As root both work: the routes tried are real.)
    for (dev, _) in &devices {
        let d = dev.to_str().unwrap();
        assert!(as_root(&["head", "-c", "1", d]), "root cannot read {d}: the attempt below proves nothing");
        let (ok, err) = as_nobody(&["head", "-c", "1", d]);
        assert!(!ok, "nobody read the pooled device {d}");
        assert!(err.contains("Permission denied"), "{d}: {err}");
    }
    let namespaces = foreign_user_namespaces();
    for ns in &namespaces {
        let user = format!("--user={}", ns.display());
        assert!(
            as_root(&["nsenter", &user, "true"]),
            "root cannot enter {}: the attempt below proves nothing",
            ns.display()
        );
        let (ok, err) = as_nobody(&["nsenter", &user, "true"]);
        assert!(!ok, "nobody entered the user namespace {} the runner holds", ns.display());
        assert!(err.contains("Permission denied"), "{}: {err}", ns.display());
    }

    // From inside the sandbox, as its root and its user: no loop device, nor the runner's
    // descriptors, nor a way to make a device node.
    let runner = std::process::id();
    let attacks = [
        "ls /dev | grep -q loop".to_string(),
        "ls /dev/loop-control".to_string(),
        format!("ls /proc/{runner}/fd"),
        "mknod /tmp/l b 7 0".to_string(),
    ];
    for attack in &attacks {
        for user in ["root", "user"] {
            let req = ExecRequest {
                cmd: attack.clone(),
                user: Some(user.into()),
                timeout: Some(Duration::from_secs(60)),
                ..Default::default()
            };
            let r = p.exec(&sb.id, req, None).await.unwrap();
            assert_ne!(r.exit_code, Some(0), "`{attack}` as {user} succeeded inside the sandbox");
        }
    }

    // Every pooled piece goes with the provider: devices detached, namespaces closed.
    p.kill(&sb.id).await.unwrap();
    p.destroy_all().await;
    drop(p);
    until("every loop device under the state directory is detached", || loops_under(dir.path()).is_empty()).await;
    until("no user namespace is held any more", || foreign_user_namespaces().is_empty()).await;
}

/// The user namespaces of a sandbox's processes, seen from the host through its cgroup: each
/// with its owner's host uid.
fn namespaces_of(id: &str) -> Vec<(u64, u32)> {
    use std::os::fd::AsRawFd;
    let groups = std::fs::read_dir("/sys/fs/cgroup/pids/scenario-run").expect("the sandboxes' pids cgroups");
    let group = groups
        .flatten()
        .find(|e| e.file_name().to_string_lossy().ends_with(id))
        .unwrap_or_else(|| panic!("no cgroup of {id}"));
    let procs = std::fs::read_to_string(group.path().join("cgroup.procs")).unwrap();
    let mut found = Vec::new();
    for pid in procs.split_whitespace() {
        let Ok(f) = std::fs::File::open(format!("/proc/{pid}/ns/user")) else { continue };
        const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
        let mut uid: libc::uid_t = 0;
        // SAFETY: the ioctl writes one uid_t into `uid`, which outlives the call.
        assert_eq!(unsafe { libc::ioctl(f.as_raw_fd(), NS_GET_OWNER_UID, &mut uid) }, 0);
        found.push((f.metadata().unwrap().ino(), uid));
    }
    found.sort();
    found.dedup();
    found
}

/// Sandboxes never share a user namespace, nor its owner (whose per-user limits a sandbox is
/// charged to): what the pool hands out is handed out once, past its size too.
#[tokio::test]
async fn each_sandbox_gets_a_user_namespace_and_an_owner_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let p = provider(dir.path());
    let mut ids = Vec::new();
    for _ in 0..(POOLED + 2) {
        let sb = p.create(CreateRequest::default()).await.unwrap();
        // A command, so the sandbox has processes in the namespaces commands run in too.
        let r = p
            .exec(&sb.id, ExecRequest { cmd: "sleep 600 >/dev/null 2>&1 &".into(), ..Default::default() }, None)
            .await
            .unwrap();
        assert_eq!(r.exit_code, Some(0));
        ids.push(sb.id.clone());
    }
    let all: Vec<Vec<(u64, u32)>> = ids.iter().map(|id| namespaces_of(id)).collect();
    for (i, a) in all.iter().enumerate() {
        assert!(!a.is_empty(), "{}: no namespace seen", ids[i]);
        for (j, b) in all.iter().enumerate().skip(i + 1) {
            let shared: Vec<_> = a.iter().filter(|(ino, _)| b.iter().any(|(other, _)| other == ino)).collect();
            assert!(shared.is_empty(), "{} and {} share user namespaces {shared:?}", ids[i], ids[j]);
        }
        // The namespace the sandbox was given has an owner of its own (the nested ones that
        // commands run in are owned by the sandbox's root, the same host id for every sandbox).
        let own =
            a.iter().filter(|(_, o)| all.iter().enumerate().all(|(j, b)| j == i || !b.iter().any(|(_, x)| x == o)));
        assert!(own.count() >= 1, "{}: no owner of its own among {a:?}", ids[i]);
    }
    for id in &ids {
        p.kill(id).await.unwrap();
    }
    p.destroy_all().await;
}

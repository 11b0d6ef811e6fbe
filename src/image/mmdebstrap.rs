//! Building an offline recipe's root filesystem with mmdebstrap, from the Debian mirror.
//!
//! mmdebstrap (root mode, `--variant=minbase`) writes the tree as a tar on its stdout, which
//! is unpacked straight into the build directory with owners shifted, so no 200 MB
//! intermediate file and no second walk. The flags follow what was measured for the local
//! stack (shared/docs/local-stack.md): the merged-usr hook (without it apt picks `usrmerge`,
//! which pulls perl), dpkg path excludes for docs, man pages and locales, no apt lists. The
//! host's extra CAs (`/usr/local/share/ca-certificates/*.crt`; a TLS-intercepting proxy's
//! among them) are copied in and `update-ca-certificates` is run, or pip and npm inside
//! fail. The mirror is `SCENARIO_RUN_DEBIAN_MIRROR`, else the host's apt sources, else
//! http://deb.debian.org/debian; the cache key covers all of it.
//!
//! Ubuntu recipes come from `SCENARIO_RUN_UBUNTU_MIRROR` (default
//! http://archive.ubuntu.com/ubuntu), checked against the host's Ubuntu archive keyring
//! (`signed-by`, so the host's own apt never trusts it); merged /usr is made by symlinks
//! before the first package (the merged-usr hook wants a `usr-is-merged` jammy and noble do
//! not have), and the image gets the official image's apt sources (all four components,
//! -updates, -backports, -security), in the file layout of its release.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::cache::{sha256_hex, HashReader};
use super::error::{ImageError, Result};
use super::idmap::IdMap;
use super::offline::{Recipe, RecipeKind, Ubuntu, RECIPE_VERSION};
use super::unpack::{UnpackStats, Unpacker};

const MERGED_USR_HOOK: &str = "/usr/share/mmdebstrap/hooks/merged-usr";
const HOST_CA_DIR: &str = "/usr/local/share/ca-certificates";
/// What the Ubuntu archive's Release files are checked against (Ubuntu's and Debian's
/// `ubuntu-keyring` install it; scripts/setup does where apt has neither).
pub(crate) const UBUNTU_KEYRING: &str = "/usr/share/keyrings/ubuntu-archive-keyring.gpg";
const UBUNTU_MIRROR: &str = "http://archive.ubuntu.com/ubuntu";
const UBUNTU_SECURITY: &str = "http://security.ubuntu.com/ubuntu";
/// How many lines of mmdebstrap's output a failure shows.
const TAIL: usize = 25;

/// Debian codenames and aliases, to tell a Debian source from a third-party one.
const DEBIAN_SUITES: &[&str] =
    &["buster", "bullseye", "bookworm", "trixie", "forky", "duke", "sid", "stable", "testing", "unstable", "oldstable"];

/// `(uri, suites)` of each `deb` source of the host.
fn host_sources() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(rd) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else { continue };
        if f.extension().is_some_and(|e| e == "sources") {
            for block in text.split("\n\n") {
                let get = |k: &str| {
                    block.lines().find_map(|l| {
                        l.split_once(':')
                            .filter(|(n, _)| n.trim().eq_ignore_ascii_case(k))
                            .map(|(_, v)| v.trim().to_string())
                    })
                };
                if !get("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb")) {
                    continue;
                }
                if let (Some(uris), Some(suites)) = (get("URIs"), get("Suites")) {
                    let suites: Vec<String> = suites.split_whitespace().map(str::to_string).collect();
                    for u in uris.split_whitespace() {
                        out.push((u.to_string(), suites.clone()));
                    }
                }
            }
        } else if f.extension().is_some_and(|e| e == "list") || f.ends_with("sources.list") {
            for l in text.lines() {
                let mut w = l.split_whitespace();
                if w.next() != Some("deb") {
                    continue;
                }
                let mut rest: Vec<&str> = w.collect();
                if rest.first().is_some_and(|r| r.starts_with('[')) {
                    while let Some(t) = rest.first() {
                        let end = t.ends_with(']');
                        rest.remove(0);
                        if end {
                            break;
                        }
                    }
                }
                if rest.len() >= 2 {
                    out.push((rest[0].to_string(), vec![rest[1].to_string()]));
                }
            }
        }
    }
    out
}

fn is_debian_suite(s: &str, security: bool) -> bool {
    let base = s.split('-').next().unwrap_or(s);
    let sec = s.ends_with("-security") || s.ends_with("/updates");
    DEBIAN_SUITES.contains(&base) && sec == security
}

/// The apt source lines `recipe` is built from.
pub(crate) fn sources(recipe: &Recipe) -> Result<Vec<String>> {
    if recipe.ubuntu().is_some() {
        let m = ubuntu_mirror()?;
        let suite = recipe.suite();
        return Ok(["", "-updates", "-security"]
            .iter()
            .map(|p| format!("deb [signed-by={UBUNTU_KEYRING}] {m} {suite}{p} main"))
            .collect());
    }
    Ok(debian_sources(recipe.suite()))
}

fn debian_sources(suite: &str) -> Vec<String> {
    let env = std::env::var("SCENARIO_RUN_DEBIAN_MIRROR").ok().filter(|m| !m.trim().is_empty());
    let host = host_sources();
    let mirror = env.clone().or_else(|| {
        host.iter()
            .find(|(u, s)| !u.contains("security") && s.iter().any(|s| is_debian_suite(s, false)))
            .map(|(u, _)| u.clone())
    });
    let mirror = mirror.unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let mirror = mirror.trim_end_matches('/');
    let mut lines = vec![format!("deb {mirror} {suite} main"), format!("deb {mirror} {suite}-updates main")];
    if env.is_none() {
        if let Some((u, _)) = host.iter().find(|(_, s)| s.iter().any(|s| is_debian_suite(s, true))) {
            lines.push(format!("deb {} {suite}-security main", u.trim_end_matches('/')));
        }
    }
    lines
}

/// `SCENARIO_RUN_UBUNTU_MIRROR` (an http(s) URL; it goes into apt source lines), else the
/// Ubuntu archive.
fn ubuntu_mirror() -> Result<String> {
    ubuntu_mirror_from(std::env::var("SCENARIO_RUN_UBUNTU_MIRROR").ok())
}

fn ubuntu_mirror_from(var: Option<String>) -> Result<String> {
    let Some(m) = var.filter(|m| !m.trim().is_empty()) else {
        return Ok(UBUNTU_MIRROR.into());
    };
    let m = m.trim().trim_end_matches('/');
    let ok = (m.starts_with("http://") || m.starts_with("https://"))
        && m.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~:/%@+=,".contains(&b));
    if !ok {
        return Err(ImageError::invalid(format!(
            "SCENARIO_RUN_UBUNTU_MIRROR=`{m}` is not an http:// or https:// URL made of letters, digits and -._~:/%@+=,"
        )));
    }
    Ok(m.to_string())
}

/// The apt sources the official `ubuntu` image has (with `mirror` for the archive): its
/// path in the image and its text. Noble's official image keeps them in deb822 form.
pub(crate) fn ubuntu_image_sources(u: Ubuntu, mirror: &str) -> Vec<(&'static str, String)> {
    let security = if mirror == UBUNTU_MIRROR { UBUNTU_SECURITY } else { mirror };
    let c = "main restricted universe multiverse";
    let s = u.codename();
    match u {
        Ubuntu::Jammy => vec![(
            "etc/apt/sources.list",
            format!(
                "deb {mirror} {s} {c}\ndeb {mirror} {s}-updates {c}\ndeb {mirror} {s}-backports {c}\ndeb {security} {s}-security {c}\n"
            ),
        )],
        Ubuntu::Noble => vec![
            ("etc/apt/sources.list", "# Ubuntu sources have moved to /etc/apt/sources.list.d/ubuntu.sources\n".into()),
            (
                "etc/apt/sources.list.d/ubuntu.sources",
                format!(
                    "Types: deb\nURIs: {mirror}\nSuites: {s} {s}-updates {s}-backports\nComponents: {c}\nSigned-By: {UBUNTU_KEYRING}\n\n\
                     Types: deb\nURIs: {security}\nSuites: {s}-security\nComponents: {c}\nSigned-By: {UBUNTU_KEYRING}\n"
                ),
            ),
        ],
    }
}

/// The host's extra CA certificates, sorted.
pub(crate) fn host_cas() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(HOST_CA_DIR)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "crt")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// The cache key of `recipe`: its definition and version, the suite, the sources, the CAs
/// (by content) and the id map the tree is shifted to.
pub(crate) fn key(recipe: &Recipe, sources: &[String], cas: &[PathBuf], ids: IdMap) -> String {
    let mut k = format!("recipe {} v{RECIPE_VERSION} {recipe:?}\nsuite {}\n", recipe.name, recipe.suite());
    for s in sources {
        k.push_str(&format!("source {s}\n"));
    }
    if recipe.ubuntu().is_some() {
        let body = std::fs::read(UBUNTU_KEYRING).unwrap_or_default();
        k.push_str(&format!("keyring {}\n", sha256_hex(&body)));
        if let Ok(m) = ubuntu_mirror() {
            k.push_str(&format!("image-sources {m}\n"));
        }
    }
    for c in cas {
        let body = std::fs::read(c).unwrap_or_default();
        k.push_str(&format!("ca {} {}\n", c.display(), sha256_hex(&body)));
    }
    k.push_str(&format!("ids {ids}\n"));
    // What the build runs, so that a changed hook makes a new image without a version bump.
    k.push_str(&format!("command {}\n", command(recipe, sources, cas).join(" ")));
    k
}

/// The sed script that makes /etc/profile use bash's `$EUID` before it runs `id -u`.
const PROFILE_EUID_SED: &str = r#"s/"\$(id -u)"/"${EUID:-$(id -u)}"/"#;

/// The mmdebstrap command line for `recipe` (tar to stdout).
pub(crate) fn command(recipe: &Recipe, sources: &[String], cas: &[PathBuf]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "mmdebstrap".into(),
        "--variant=minbase".into(),
        "--mode=root".into(),
        "--format=tar".into(),
        format!("--include={}", recipe.packages.join(",")),
        "--aptopt=Acquire::Languages \"none\"".into(),
    ];
    if let Some(u) = recipe.ubuntu() {
        // The official images' merged /usr, as debootstrap makes it.
        let dirs = match u {
            Ubuntu::Jammy => "bin sbin lib lib32 lib64 libx32",
            Ubuntu::Noble => "bin sbin lib lib64",
        };
        a.push(format!("--setup-hook=for d in {dirs}; do ln -s usr/$d \"$1/$d\"; mkdir -p \"$1/usr/$d\"; done"));
    } else if Path::new(MERGED_USR_HOOK).is_dir() {
        a.push(format!("--hook-dir={MERGED_USR_HOOK}"));
    }
    for o in [
        "path-exclude=/usr/share/doc/*",
        "path-include=/usr/share/doc/*/copyright",
        "path-exclude=/usr/share/man/*",
        "path-exclude=/usr/share/info/*",
        "path-exclude=/usr/share/locale/*",
    ] {
        a.push(format!("--dpkgopt={o}"));
    }
    if !cas.is_empty() {
        let mut hook = "--customize-hook=copy-in".to_string();
        for c in cas {
            hook.push(' ');
            hook.push_str(&c.display().to_string());
        }
        hook.push_str(" /usr/local/share/ca-certificates/");
        a.push(hook);
    }
    // Hook output goes to stderr: stdout is the tar.
    a.push("--customize-hook=chroot \"$1\" update-ca-certificates >&2".into());
    if recipe.kind == RecipeKind::E2bBase {
        // Every `bash -l -c` (how a sandbox runs a command) reads /etc/profile, whose PATH
        // choice runs `id -u`: a fork and exec on every command, a quarter of a command's
        // start. bash knows its EUID; other shells still ask `id`.
        a.push(format!("--customize-hook=sed -i {} \"$1/etc/profile\"", sh_quote(PROFILE_EUID_SED)));
    }
    if recipe.kind == RecipeKind::Python {
        // The official image's pip installs system-wide; Debian's refuses without this.
        a.push("--customize-hook=rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED".into());
    }
    if let Some(u) = recipe.ubuntu() {
        // Our sources line is `deb [signed-by=…] <mirror> <suite> main`.
        let mirror = sources.first().and_then(|l| l.split_whitespace().nth(2)).unwrap_or(UBUNTU_MIRROR);
        for (path, text) in ubuntu_image_sources(u, mirror) {
            a.push(format!("--customize-hook=printf %s {} > \"$1/{path}\"", sh_quote(&text)));
        }
    }
    a.push("--customize-hook=rm -f \"$1\"/var/cache/apt/*.bin".into());
    a.push(recipe.suite().into());
    a.push("-".into());
    a.extend(sources.iter().cloned());
    a
}

/// What a finished mmdebstrap run gave.
pub(crate) struct Built {
    /// sha256 of the tar mmdebstrap wrote.
    pub tar_digest: String,
    pub stats: UnpackStats,
    /// What update-ca-certificates said (`2 added, 0 removed; done.`).
    pub ca_line: Option<String>,
}

fn which(bin: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(bin)).find(|p| p.is_file())
}

fn sh_quote(a: &str) -> String {
    if !a.is_empty() && a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_=./,:".contains(&b)) {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn shell_words(args: &[String]) -> String {
    args.iter().map(|a| sh_quote(a)).collect::<Vec<_>>().join(" ")
}

/// Runs mmdebstrap for `recipe` and unpacks its tar into `rootfs` (blocking).
pub(crate) fn build(recipe: &Recipe, sources: &[String], cas: &[PathBuf], rootfs: &Path, ids: IdMap) -> Result<Built> {
    if !rustix::process::geteuid().is_root() {
        return Err(ImageError::infra(format!(
            "build the offline image {}: mmdebstrap's root mode needs root; run scenario-run as root",
            recipe.name
        )));
    }
    if recipe.ubuntu().is_some() && !Path::new(UBUNTU_KEYRING).is_file() {
        return Err(ImageError::infra(format!(
            "build the offline image {}: the Ubuntu archive keyring {UBUNTU_KEYRING} is missing (scripts/setup installs it)",
            recipe.name
        )));
    }
    let args = command(recipe, sources, cas);
    // mmdebstrap mounts /proc, /sys and /dev into its chroot: in a mount namespace of its
    // own they vanish with it even if it is killed, and its scratch files live in our build
    // directory (`scratch`), which the cache sweeps if we are killed too. It also dies with
    // the thread that waits for it.
    let scratch = rootfs.with_file_name("mmdebstrap");
    std::fs::create_dir_all(&scratch).map_err(|e| ImageError::infra(format!("create {}: {e}", scratch.display())))?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--"]).args(&args);
    // SAFETY: `pre_exec` needs an async-signal-safe closure: one raw system call (prctl), no
    // allocation. Its result is ignored, as before: a failure only loses the death signal.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
            Ok(())
        });
    }
    if which("mmdebstrap").is_none() {
        return Err(ImageError::infra(format!(
            "build the offline image {}: mmdebstrap is not installed (scripts/setup installs it: apt-get install mmdebstrap)",
            recipe.name
        )));
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .env("TMPDIR", &scratch)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("LC_ALL", "C.UTF-8")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .spawn()
        .map_err(|e| ImageError::infra(format!("start mmdebstrap (through unshare): {e}")))?;
    let stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut tail: std::collections::VecDeque<String> = Default::default();
        let mut ca_line = None;
        for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
            if line.contains(" added, ") && line.contains(" removed") {
                ca_line = Some(line.trim().to_string());
            }
            tail.push_back(line);
            if tail.len() > TAIL {
                tail.pop_front();
            }
        }
        (tail, ca_line)
    });
    let stdout = child.stdout.take().expect("piped");
    let mut hashed = HashReader::new(stdout);
    let unpacked = Unpacker::new(rootfs, ids).and_then(|mut u| {
        u.apply(&mut hashed)?;
        // Drain what tar left (its end blocks) so the digest covers the whole stream.
        std::io::copy(&mut hashed, &mut std::io::sink())?;
        Ok(u.stats)
    });
    if unpacked.is_err() {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|e| ImageError::infra(format!("wait for mmdebstrap: {e}")))?;
    let (tail, ca_line) = reader.join().unwrap_or_default();
    let _ = std::fs::remove_dir_all(&scratch);
    let tail: Vec<String> = tail.into_iter().collect();
    if !status.success() {
        return Err(ImageError::infra(format!(
            "build the offline image {}: mmdebstrap exited with {}\n$ {}\n{}",
            recipe.name,
            status.code().map_or_else(|| "a signal".to_string(), |c| c.to_string()),
            shell_words(&args),
            tail.join("\n")
        )));
    }
    let stats = unpacked.map_err(|e| {
        ImageError::infra(format!("build the offline image {}: unpack mmdebstrap's output: {e}", recipe.name))
    })?;
    Ok(Built { tar_digest: hashed.digest(), stats, ca_line })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_has_the_measured_flags() {
        let r = super::super::offline::recipe("python-3.11").unwrap();
        let srcs = vec!["deb http://m/debian bookworm main".to_string()];
        let cas = vec![PathBuf::from("/usr/local/share/ca-certificates/a.crt")];
        let c = command(r, &srcs, &cas);
        let has = |s: &str| c.iter().any(|a| a == s);
        assert!(has("--variant=minbase") && has("--mode=root") && has("--format=tar"));
        assert!(has("--include=ca-certificates,python3,python3-pip,python3-venv,python-is-python3"));
        assert!(has("--dpkgopt=path-exclude=/usr/share/man/*"));
        assert!(has(
            "--customize-hook=copy-in /usr/local/share/ca-certificates/a.crt /usr/local/share/ca-certificates/"
        ));
        assert!(c.iter().any(|a| a.contains("EXTERNALLY-MANAGED")));
        assert_eq!(&c[c.len() - 3..], &["bookworm".to_string(), "-".into(), srcs[0].clone()]);
    }

    #[test]
    fn ubuntu_builds_from_the_ubuntu_archive_with_the_official_sources() {
        let r = super::super::offline::recipe("ubuntu-22.04").unwrap();
        let k = format!("[signed-by={UBUNTU_KEYRING}]");
        let at = |m: &str| -> Vec<String> {
            ["jammy", "jammy-updates", "jammy-security"].iter().map(|s| format!("deb {k} {m} {s} main")).collect()
        };
        // The mirror is SCENARIO_RUN_UBUNTU_MIRROR if the environment sets it.
        assert_eq!(sources(r).unwrap(), at(&ubuntu_mirror().unwrap()));
        let srcs = at(UBUNTU_MIRROR);
        let c = command(r, &srcs, &[]);
        let has = |s: &str| c.iter().any(|a| a == s);
        assert!(has("--include=apt,ca-certificates") && has("--variant=minbase"));
        assert!(!c.iter().any(|a| a.contains(MERGED_USR_HOOK)), "jammy has no usr-is-merged: {c:?}");
        assert!(c.iter().any(|a| a.starts_with("--setup-hook=for d in bin sbin lib lib32 lib64 libx32;")));
        let hook = c.iter().find(|a| a.contains("etc/apt/sources.list")).expect("the image's sources are written");
        assert!(hook.contains("deb http://archive.ubuntu.com/ubuntu jammy-updates main restricted universe multiverse"));
        assert!(
            hook.contains("deb http://security.ubuntu.com/ubuntu jammy-security main restricted universe multiverse")
        );
        assert_eq!(&c[c.len() - 5..c.len() - 3], &["jammy".to_string(), "-".into()]);

        let noble = ubuntu_image_sources(Ubuntu::Noble, "http://m.example/ubuntu");
        assert_eq!(noble.len(), 2);
        assert!(noble[1].0.ends_with("ubuntu.sources"));
        assert!(noble[1].1.contains("URIs: http://m.example/ubuntu\nSuites: noble noble-updates noble-backports\n"));
        assert!(noble[1].1.contains("Suites: noble-security"), "a mirror serves -security too");
        assert!(!noble[1].1.contains("security.ubuntu.com"));
    }

    #[test]
    fn a_hostile_ubuntu_mirror_is_refused() {
        for bad in ["ftp://x/ubuntu", "http://x/ubuntu main'; rm -rf /", "http://x/$(id)", "http://x/a b"] {
            let e = ubuntu_mirror_from(Some(bad.into())).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.message.contains("SCENARIO_RUN_UBUNTU_MIRROR"), "{e}");
        }
        assert_eq!(ubuntu_mirror_from(Some("http://127.0.0.1:8/ubuntu/".into())).unwrap(), "http://127.0.0.1:8/ubuntu");
        assert_eq!(ubuntu_mirror_from(Some(" ".into())).unwrap(), UBUNTU_MIRROR);
        assert_eq!(ubuntu_mirror_from(None).unwrap(), UBUNTU_MIRROR);
    }

    #[test]
    fn keys_change_with_what_goes_in() {
        let r = super::super::offline::recipe("debian-bookworm").unwrap();
        let a = key(r, &["deb http://a bookworm main".into()], &[], IdMap::default());
        let b = key(r, &["deb http://b bookworm main".into()], &[], IdMap::default());
        let c = key(r, &["deb http://a bookworm main".into()], &[], IdMap { host_base: 1, len: 10 });
        assert!(a != b && a != c);
        assert!(a.contains("v1") && a.contains("bookworm"));
    }

    #[test]
    fn the_key_holds_the_command_so_a_changed_hook_is_a_new_image() {
        let r = super::super::offline::recipe("e2b-base").unwrap();
        let srcs = vec!["deb http://a bookworm main".to_string()];
        let k = key(r, &srcs, &[], IdMap::default());
        assert!(k.contains(PROFILE_EUID_SED), "{k}");
        let debian = key(super::super::offline::recipe("debian-bookworm").unwrap(), &srcs, &[], IdMap::default());
        assert!(!debian.contains("/etc/profile"), "only E2B's base has its profile changed: {debian}");
    }

    /// The profile edit, on Debian's own /etc/profile: bash picks the same PATH as before
    /// without running `id`; dash (no EUID) still asks `id`.
    #[test]
    fn the_base_profile_uses_bash_euid_instead_of_running_id() {
        let t = tempfile::tempdir().unwrap();
        let profile = t.path().join("profile");
        std::fs::write(
            &profile,
            "if [ \"$(id -u)\" -eq 0 ]; then\n  PATH=/root-path\nelse\n  PATH=/user-path\nfi\nexport PATH\n",
        )
        .unwrap();
        let sed = std::process::Command::new("sed").arg("-i").arg(PROFILE_EUID_SED).arg(&profile).status().unwrap();
        assert!(sed.success());
        let text = std::fs::read_to_string(&profile).unwrap();
        assert!(text.contains("\"${EUID:-$(id -u)}\""), "{text}");
        // A fake `id` that leaves a mark: bash must not run it, dash must.
        let bin = t.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let mark = t.path().join("id-ran");
        std::fs::write(bin.join("id"), format!("#!/bin/sh\ntouch {}\necho 0\n", mark.display())).unwrap();
        std::fs::set_permissions(bin.join("id"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let source = format!(". {}; echo \"$PATH\"", profile.display());
        let run = |shell: &str| {
            let out = std::process::Command::new(shell)
                .args(["-c", &source])
                .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let euid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
        let expected = if euid == 0 { "/root-path" } else { "/user-path" };
        assert_eq!(run("bash"), expected);
        assert!(!mark.exists(), "bash ran `id`");
        assert_eq!(run("dash"), "/root-path", "dash asks the fake id, which says 0");
        assert!(mark.exists(), "dash did not run `id`");
    }

    #[test]
    fn suites() {
        assert!(is_debian_suite("bookworm-updates", false));
        assert!(is_debian_suite("bookworm-security", true));
        assert!(!is_debian_suite("nodistro", false));
        assert!(!is_debian_suite("cloud-sdk-bookworm", false));
    }

    /// A real mmdebstrap against a mirror that refuses connections: the error has the command
    /// and apt's complaint, and no scratch is left.
    #[test]
    fn a_failed_build_shows_the_command_and_its_last_lines() {
        let t = tempfile::tempdir().unwrap();
        let rootfs = t.path().join("rootfs");
        std::fs::create_dir(&rootfs).unwrap();
        let r = super::super::offline::recipe("debian-bookworm").unwrap();
        let srcs = vec!["deb http://127.0.0.1:9/debian bookworm main".to_string()];
        let e = build(r, &srcs, &[], &rootfs, IdMap::default()).err().expect("the mirror is unreachable");
        assert!(e.message.starts_with("build the offline image debian-bookworm: mmdebstrap exited with"), "{e}");
        assert!(e.message.contains("\n$ mmdebstrap --variant=minbase --mode=root"), "{e}");
        assert!(e.message.contains("127.0.0.1:9"), "apt's output names the mirror: {e}");
        assert!(!t.path().join("mmdebstrap").exists());
    }
}

//! Template builds on the local provider: a Dockerfile applied as a layer over its `FROM` image.
//!
//! `FROM` names an image that [`ImageStore`] resolves to a root filesystem (an offline-built
//! image for the public names it maps, or an image pulled from a registry); its ENV, WORKDIR,
//! USER and CMD are the starting state. The other instructions run in a **build sandbox**:
//! the usual sandbox over an overlay of that image (in a user namespace of its own, so a build
//! step is no more privileged on the host than a sandbox), except that it keeps the host's
//! network (so pip, npm and apt reach the registries) and sees a copy of the template folder
//! read-only at [`CONTEXT`]. RUN is a command in it, as root unless a USER said otherwise;
//! COPY is `cp -a` from the context (so copies belong to root, as in Docker);
//! ENV/ARG/WORKDIR/USER/CMD/EXPOSE are state the builder keeps. When the last instruction is
//! done the sandbox is stopped and its overlay **upper directory is kept as the template
//! layer**, with a `build.json` (image, env, workdir, user, cmd, ports, log).
//!
//! A sandbox created from the template mounts `lowerdir=<layer>:<image>` and gets the
//! template's ENV and WORKDIR.
//!
//! On disk: `<state_dir>/tpl-<name>-<digest12>/{layer,work,merged,context,build.json,complete}`.
//! A build under way carries the run's `owner` file (so a SIGKILLed run's build is swept like a
//! sandbox). A finished one moves into the build cache (`layer_cache`) for later runs, or, when
//! the cache is off or the move fails, is removed by `remove_builds` at the end of the run; a
//! kept one carries `keep` instead, is never swept, and a later run with the same digest
//! reuses it (while its image is still in the image cache).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::build_cache::BuildCache;
use super::cgroup::Limits;
use super::enter::Identity;
use super::layer::Layer;
use super::process::{self, Target};
use super::sandbox::{Layout, NsSandbox};
use super::userns;
use crate::image::{IdMap, ImageConfig, ImageStore};
use crate::provider::registered::BuildLog;
use crate::provider::{ExecRequest, OutputChunk, ProviderError, Result};
use crate::templates::dockerfile::{shell_quote, Command, Inst};
use crate::templates::BuildSpec;

/// Where the template folder is visible inside the build sandbox.
pub(crate) const CONTEXT: &str = "/tmp/.scenario-run-context";
/// Limit for one RUN.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);
/// What a build sandbox may use: package managers are hungry.
const BUILD_LIMITS: Limits = Limits { cpus: 256, memory_mb: 8192, pids: 4096 };
/// Marker files in a build directory.
pub(crate) const KEEP_FILE: &str = "keep";
const COMPLETE_FILE: &str = "complete";

/// `tpl-<name>-<first 12 hex digits of the digest>`, with unsafe characters replaced.
pub(crate) fn build_dir(state_dir: &Path, name: &str, digest: &str) -> PathBuf {
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let hex = digest.trim_start_matches("sha256:");
    state_dir.join(format!("tpl-{clean}-{}", &hex[..hex.len().min(12)]))
}

/// Where this process builds `shared`'s digest: a directory of its own, so that two runs
/// sharing the state directory and building the same template at once never touch each
/// other's build (the second used to remove the first one's directory while it ran).
pub(crate) fn own_dir(shared: &Path) -> PathBuf {
    let mut name = shared.as_os_str().to_owned();
    name.push(format!(".{}", std::process::id()));
    PathBuf::from(name)
}

/// A directory of this process's own for a `skip_cache` build of `shared`: never one an
/// earlier build of this run made (a sandbox may still stack that one).
pub(crate) fn own_fresh_dir(shared: &Path) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut name = own_dir(shared).into_os_string();
    name.push(format!(".fresh{}", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    PathBuf::from(name)
}

/// Writes `build.json` and the `complete` marker into the layer's directory.
fn record(layer: &Layer) -> std::io::Result<()> {
    let json = serde_json::to_string_pretty(layer).map_err(std::io::Error::other)?;
    std::fs::write(layer.dir.join("build.json"), json)?;
    std::fs::write(layer.dir.join(COMPLETE_FILE), "")
}

/// Makes a finished build that is to be kept the one later runs reuse: its directory is
/// renamed to the shared name, then marked `keep` (a run killed in between leaves a directory
/// with a dead owner, which is swept). When another run published the same digest first,
/// that build is used and this one removed.
pub(crate) fn publish(mut layer: Layer, shared: &Path) -> std::io::Result<Layer> {
    let own = layer.dir.clone();
    if let Err(e) = std::fs::rename(&own, shared) {
        if let Some(theirs) = reuse(shared).filter(|l| l.keep) {
            let _ = std::fs::remove_dir_all(&own);
            return Ok(theirs);
        }
        if !shared.exists() {
            return Err(e);
        }
        // What is there is no finished kept build (a swept run's leftover): replace it.
        std::fs::remove_dir_all(shared)?;
        std::fs::rename(&own, shared)?;
    }
    layer.dir = shared.to_path_buf();
    layer.layer = shared.join("layer");
    record(&layer)?;
    std::fs::write(shared.join(KEEP_FILE), "")?;
    let _ = std::fs::remove_file(shared.join(crate::owner::FILE));
    Ok(layer)
}

/// A kept build of the same digest from an earlier run, if there is one (and its image is
/// still cached).
pub(crate) fn reuse(dir: &Path) -> Option<Layer> {
    if !dir.join(COMPLETE_FILE).exists() {
        return None;
    }
    let text = std::fs::read_to_string(dir.join("build.json")).ok()?;
    let layer: Layer = serde_json::from_str(&text).ok()?;
    layer.image.is_dir().then_some(layer)
}

/// Copies the template folder to `to`, owned by the build sandbox's root, so the sandbox can
/// read it wherever the folder lives on the host (a 0700 home, a temporary directory).
fn stage_context(from: &Path, to: &Path, ids: IdMap) -> std::io::Result<()> {
    let root = userns::host_id(ids, 0);
    let st = std::process::Command::new("cp").arg("-a").arg(from).arg(to).status()?;
    if !st.success() {
        return Err(std::io::Error::other(format!("copying the template folder failed ({st})")));
    }
    let st = std::process::Command::new("chown").args(["-R", "-h", &format!("{root}:{root}")]).arg(to).status()?;
    if !st.success() {
        return Err(std::io::Error::other(format!("chown of the template copy failed ({st})")));
    }
    Ok(())
}

/// Builds `spec` into `dir` (this process's own: [`own_dir`]), which carries its owner until
/// the build is removed or [`publish`]ed.
pub(crate) async fn build(
    spec: &BuildSpec,
    dir: &Path,
    images: &ImageStore,
    net: Arc<super::netns::Net>,
    tx: mpsc::UnboundedSender<String>,
) -> Result<Layer> {
    let started = Instant::now();
    let t = &spec.template;
    let mut log = BuildLog::new(tx.clone());
    let _ = std::fs::remove_dir_all(dir);
    crate::owner::create_dir(dir).map_err(|e| ProviderError::infra(format!("cannot create {}: {e}", dir.display())))?;
    log.line(format!("building template {} ({}) from {}", t.def.name, t.digest, t.dir.display()));
    let from = from_image(spec)
        .ok_or_else(|| ProviderError::invalid(format!("{}: the Dockerfile has no FROM", t.def.dockerfile)))?;
    let t0 = Instant::now();
    let image = images.get(&from, spec.from_auth.as_ref(), &tx).await?;
    log.line(format!("FROM {from} maps to {} ({:.1}s)", image.resolved, t0.elapsed().as_secs_f64()));
    let ids = images.ids();
    let mut layout = Layout::new(dir, ids, BUILD_LIMITS);
    layout.upper = dir.join("layer");
    // The network a sandbox gets (the registries and whatever the host reaches, never the
    // host itself), with the open policy.
    layout.net = Some(net);
    layout.lowers.push(image.dir.clone());
    let context = dir.join("context");
    layout.ro_binds.push((context.clone(), CONTEXT.to_string()));
    let cache = BuildCache::from_env(images.cache_dir(), ids).map(|c| c.for_template(&t.def.name, &t.dir));
    // Held until the build's downloads are kept: no eviction takes the caches from under it.
    let mut cache_held = None;
    if let Some(c) = &cache {
        let (c2, d, img) = (c.clone(), dir.to_path_buf(), image.dir.clone());
        let (held, binds) =
            tokio::task::spawn_blocking(move || c2.prepare(ids).and_then(|h| Ok((h, c2.binds(&d, &img, ids)?))))
                .await
                .map_err(|e| ProviderError::infra(e.to_string()))?
                .map_err(|e| ProviderError::infra(format!("cannot prepare the build caches: {e}")))?;
        cache_held = Some(held);
        log.line(format!(
            "package caches: {} ({}; SCENARIO_RUN_BUILD_CACHE=off turns them off)",
            binds.iter().map(|(_, inside)| inside.as_str()).collect::<Vec<_>>().join(", "),
            c.dir.display()
        ));
        layout.rw_binds = binds;
    }
    let (l, src) = (layout.clone(), t.dir.clone());
    tokio::task::spawn_blocking(move || l.create().and_then(|()| stage_context(&src, &context, ids)))
        .await
        .map_err(|e| ProviderError::infra(e.to_string()))?
        .map_err(|e| ProviderError::infra(format!("cannot prepare the build directory: {e}")))?;
    let ns = NsSandbox::start(layout.clone(), &format!("build-{}", crate::random::hex(6)), None).await?;
    let result = run_instructions(spec, &ns, ids, &image.config, cache.is_some(), &mut log).await;
    ns.stop().await;
    layout.remove_mount_points();
    if let Some(c) = &cache {
        let (c2, d) = (c.clone(), dir.to_path_buf());
        let kept = tokio::task::spawn_blocking(move || c2.keep_downloads(&d)).await.unwrap_or(0);
        if kept > 0 {
            log.line(format!("kept {kept} downloaded apt archives in {}", c.dir.join("apt").display()));
        }
        drop(cache_held);
        let c2 = c.clone();
        match tokio::task::spawn_blocking(move || c2.evict()).await {
            Ok(Ok(0)) | Err(_) => {}
            Ok(Ok(bytes)) => log.line(format!(
                "package caches of builds: removed {} of the least recently used (held to {} and to {} left free on the host)",
                crate::size::human(bytes),
                super::build_cache::MAX_VAR,
                crate::size::human(super::lru::KEEP_FREE)
            )),
            Ok(Err(e)) => log.line(format!("package caches of builds not held to a size: {e}")),
        }
    }
    for d in [&layout.work, &layout.merged, &dir.join("context"), &dir.join("apt-archives")] {
        let _ = std::fs::remove_dir_all(d);
    }
    // The context's mount point is not part of the template.
    let _ = std::fs::remove_dir(layout.upper.join(CONTEXT.trim_start_matches('/')));
    let mut layer = result?;
    log.line(format!(
        "built {} in {:.1}s: layer {}",
        t.def.name,
        started.elapsed().as_secs_f64(),
        layout.upper.display()
    ));
    layer.dir = dir.to_path_buf();
    layer.layer = layout.upper.clone();
    layer.image = image.dir.clone();
    layer.image_ref = format!("{from} ({})", image.resolved);
    layer.image_stamp = Some((image.digest.clone(), super::layer_cache::image_stamp(&image.digest, &image.dir)));
    layer.keep = spec.keep;
    layer.log = log.lines;
    record(&layer).map_err(|e| ProviderError::infra(format!("cannot record the build: {e}")))?;
    Ok(layer)
}

/// The image `FROM` names, with the ARGs before it applied.
fn from_image(spec: &BuildSpec) -> Option<String> {
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    for ins in &spec.template.dockerfile.instructions {
        match &ins.inst {
            Inst::Arg { name, default } => {
                let v = spec.build_args.get(name).cloned().or_else(|| default.as_ref().map(|d| d.expand(&args)));
                if let Some(v) = v {
                    args.insert(name.clone(), v);
                }
            }
            Inst::From { image } => return Some(image.expand(&args)),
            _ => {}
        }
    }
    None
}

/// Who runs a RUN: `user` (a Dockerfile USER) as the build sandbox's passwd says, else root.
fn build_identity(ns: &NsSandbox, ids: IdMap, user: Option<&str>) -> Result<Identity> {
    let Some(u) = user.filter(|u| !matches!(*u, "root" | "0")) else { return Ok(Identity::root()) };
    // `USER name:group` runs as the name's uid with that group, as in Docker.
    let (name, group) = u.split_once(':').map_or((u, None), |(n, g)| (n, Some(g)));
    // Read inside the build's root, as the run path reads a sandbox's passwd: a link a RUN
    // planted resolves there, not on the host, and a FIFO or device is refused unread.
    let root = super::files::Root::Proc { pid1: ns.pid1.pid(), ids, who: Identity::root() };
    let read = |p: &str| root.read_as_host(p).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let (passwd, groups) = (read("/etc/passwd"), read("/etc/group"));
    let mut who = Identity::lookup(name, &passwd, &groups)
        .ok_or_else(|| ProviderError::invalid(format!("USER {u}: no such user in the image")))?;
    if let Some(g) = group {
        let gid = g.parse::<u32>().ok().or_else(|| {
            groups.lines().find_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                (f.len() >= 3 && f[0] == g).then(|| f[2].parse().ok()).flatten()
            })
        });
        who.gid = gid.ok_or_else(|| ProviderError::invalid(format!("USER {u}: no such group in the image")))?;
        who.groups = vec![who.gid];
    }
    Ok(who)
}

async fn run_instructions(
    spec: &BuildSpec,
    ns: &NsSandbox,
    ids: IdMap,
    image: &ImageConfig,
    caches: bool,
    log: &mut BuildLog,
) -> Result<Layer> {
    let t = &spec.template;
    let df_name = &t.def.dockerfile;
    let entry = ns.entry.clone();
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    // What a container of the image starts with.
    let mut env: BTreeMap<String, String> = image.env_map();
    let mut workdir: Option<String> = image.workdir.clone().filter(|w| !w.is_empty());
    let mut user: Option<String> = image.user.clone().filter(|u| !u.is_empty());
    let mut cmd: Option<String> =
        image.cmd.as_ref().map(|c| c.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
    let mut ports: Vec<u16> = image.exposed_ports.clone();
    let mut who = build_identity(ns, ids, user.as_deref())?;
    for ins in &t.dockerfile.instructions {
        let at = format!("{df_name}:{}", ins.line);
        log.line(format!("#{} {}", ins.line, ins.text));
        // As in a Docker build: HOME and USER of whoever runs, then the image's and the
        // Dockerfile's ENV, ARGs for substitution and for RUN.
        let base = process::sandbox_env(&who);
        let root_base = process::sandbox_env(&Identity::root());
        match &ins.inst {
            Inst::From { .. } => {}
            Inst::Arg { name, default } => {
                let value = spec
                    .build_args
                    .get(name)
                    .cloned()
                    .or_else(|| default.as_ref().map(|d| d.expand(&subst(&base, &args, &env))));
                if let Some(v) = value {
                    args.insert(name.clone(), v);
                }
            }
            Inst::Env(pairs) => {
                for (k, w) in pairs {
                    let v = w.expand(&subst(&base, &args, &env));
                    env.insert(k.clone(), v);
                }
            }
            Inst::Workdir(w) => {
                let dir = absolute(&w.expand(&subst(&base, &args, &env)), workdir.as_deref());
                let target = Target::Ns { entry: entry.clone(), who: Identity::root() };
                let line = format!("mkdir -p {}", shell_quote(&dir));
                run(&target, &line, &root_base, &env, &args, "/", log, &at).await?;
                workdir = Some(dir);
            }
            Inst::User(w) => {
                let u = w.expand(&subst(&base, &args, &env));
                who = build_identity(ns, ids, Some(&u)).map_err(|e| ProviderError::invalid(format!("{at}: {e}")))?;
                user = Some(u);
            }
            Inst::Run(c) => {
                let mut line = c.shell_line();
                if matches!(c, Command::Exec(_)) {
                    line = format!("exec {line}");
                }
                let cwd = workdir.clone().unwrap_or_else(|| "/".into());
                let target = Target::Ns { entry: entry.clone(), who: who.clone() };
                // The package caches, for root (what runs as another user leaves them alone:
                // npm refuses a cache it cannot write).
                let mut base = base.clone();
                if caches && who.uid == 0 {
                    base.extend(BuildCache::env());
                }
                let started = std::time::Instant::now();
                run(&target, &line, &base, &env, &args, &cwd, log, &at).await?;
                log.line(format!("  done in {:.1}s", started.elapsed().as_secs_f64()));
            }
            Inst::Copy { sources, dest, ignored_flags } => {
                for f in ignored_flags {
                    log.line(format!("  note: {f} is ignored (files are copied as root)"));
                }
                let v = subst(&base, &args, &env);
                let dest = absolute(&dest.expand(&v), workdir.as_deref());
                let srcs = copy_sources(&t.dir, sources.iter().map(|w| w.expand(&v)), &at)?;
                let dest_is_dir = dest.ends_with('/') || srcs.len() > 1 || srcs.iter().any(|(_, d)| *d);
                let mut script = String::from("set -e\n");
                for (rel, is_dir) in &srcs {
                    let src = format!("{CONTEXT}/{rel}");
                    if *is_dir {
                        script +=
                            &format!("mkdir -p {d}\ncp -a {s}/. {d}/\n", d = shell_quote(&dest), s = shell_quote(&src));
                    } else if dest_is_dir {
                        script +=
                            &format!("mkdir -p {d}\ncp -a {s} {d}/\n", d = shell_quote(&dest), s = shell_quote(&src));
                    } else {
                        let parent = Path::new(&dest).parent().map(|p| p.display().to_string()).unwrap_or("/".into());
                        script += &format!(
                            "mkdir -p {p}\ncp -a {s} {d}\n",
                            p = shell_quote(&parent),
                            d = shell_quote(&dest),
                            s = shell_quote(&src)
                        );
                    }
                }
                let target = Target::Ns { entry: entry.clone(), who: Identity::root() };
                run(&target, &script, &root_base, &BTreeMap::new(), &BTreeMap::new(), "/", log, &at).await?;
            }
            Inst::Cmd(c) => cmd = Some(c.shell_line()),
            Inst::Expose(words) => {
                for w in words {
                    let s = w.expand(&subst(&base, &args, &env));
                    let num = s.split('/').next().unwrap_or(&s);
                    match num.parse::<u16>() {
                        Ok(p) if p > 0 => ports.push(p),
                        _ => return Err(ProviderError::invalid(format!("{at}: EXPOSE {s}: not a port"))),
                    }
                }
            }
        }
    }
    Ok(Layer {
        name: t.def.name.clone(),
        digest: t.digest.clone(),
        dir: PathBuf::new(),
        layer: PathBuf::new(),
        image: PathBuf::new(),
        below: Vec::new(),
        image_ref: String::new(),
        env,
        workdir,
        user,
        cmd,
        ports,
        log: Vec::new(),
        keep: spec.keep,
        image_stamp: None,
        hold: None,
    })
}

/// What substitution sees: the base env (HOME, USER, PATH), then ARGs, then ENVs.
fn subst(
    base: &BTreeMap<String, String>,
    args: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut v = base.clone();
    v.extend(args.clone());
    v.extend(env.clone());
    v
}

/// `p` made absolute against the current WORKDIR (default `/`).
fn absolute(p: &str, workdir: Option<&str>) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        let base = workdir.unwrap_or("/");
        format!("{}/{p}", base.trim_end_matches('/'))
    }
}

/// COPY sources, relative to the template folder, with `*`/`?` globs expanded; each one
/// must stay inside the folder. Returns (relative path, is a directory).
fn copy_sources(dir: &Path, sources: impl Iterator<Item = String>, at: &str) -> Result<Vec<(String, bool)>> {
    let root = dir.canonicalize().map_err(|e| ProviderError::infra(format!("{}: {e}", dir.display())))?;
    let mut out = Vec::new();
    for s in sources {
        let rel = s.trim_start_matches("./").trim_end_matches('/');
        let rel = if rel.is_empty() { "." } else { rel };
        let matches: Vec<PathBuf> = if rel.contains(['*', '?', '[']) {
            let pattern = root.join(rel).display().to_string();
            glob::glob(&pattern)
                .map_err(|e| ProviderError::invalid(format!("{at}: COPY {s}: {e}")))?
                .filter_map(|p| p.ok())
                .collect()
        } else {
            vec![root.join(rel)]
        };
        if matches.is_empty() {
            return Err(ProviderError::invalid(format!("{at}: COPY {s}: no such file in {}", dir.display())));
        }
        for m in matches {
            let missing = || ProviderError::invalid(format!("{at}: COPY {s}: no such file in {}", dir.display()));
            // A symlink is copied as a symlink, as Docker does: never followed, so its target
            // (absolute, dangling, or a host file such as /etc/shadow) is not read here, and
            // inside the build it names what the sandbox has there. Only the directories
            // leading to it are resolved, and they must stay in the folder.
            let link = std::fs::symlink_metadata(&m).map_err(|_| missing())?.file_type().is_symlink();
            let real = match (link, m.parent(), m.file_name()) {
                (true, Some(parent), Some(name)) => parent.canonicalize().map_err(|_| missing())?.join(name),
                _ => m.canonicalize().map_err(|_| missing())?,
            };
            let Ok(inside) = real.strip_prefix(&root) else {
                return Err(ProviderError::invalid(format!("{at}: COPY {s}: outside the template folder")));
            };
            let inside = if inside.as_os_str().is_empty() { ".".to_string() } else { inside.display().to_string() };
            out.push((inside, !link && real.is_dir()));
        }
    }
    Ok(out)
}

/// Runs one build command, streaming its output as log lines; a non-zero exit fails the build.
#[allow(clippy::too_many_arguments)]
async fn run(
    target: &Target,
    line: &str,
    base: &BTreeMap<String, String>,
    env: &BTreeMap<String, String>,
    args: &BTreeMap<String, String>,
    cwd: &str,
    log: &mut BuildLog,
    at: &str,
) -> Result<()> {
    let mut full = base.clone();
    full.extend(args.clone());
    full.extend(env.clone());
    let req = ExecRequest { cmd: line.to_string(), timeout: Some(RUN_TIMEOUT), ..Default::default() };
    let (tx, mut rx) = crate::provider::output_channel();
    let p = process::launch(target, &full, cwd, &req, Some(tx), false, None).await?;
    let guard = crate::provider::core::KillOnDrop(Some(p.clone()));
    let mut tail: Vec<String> = Vec::new();
    let mut partial = [String::new(), String::new()];
    let mut emit = |text: &str, log: &mut BuildLog| {
        tail.push(text.to_string());
        if tail.len() > 5 {
            tail.remove(0);
        }
        log.line(format!("  {text}"));
    };
    while let Some(chunk) = rx.recv().await {
        let (which, bytes) = match chunk {
            OutputChunk::Stdout(b) => (0, b),
            OutputChunk::Stderr(b) => (1, b),
        };
        partial[which].push_str(&String::from_utf8_lossy(&bytes));
        while let Some(nl) = partial[which].find('\n') {
            let l: String = partial[which].drain(..=nl).collect();
            emit(l.trim_end_matches(['\n', '\r']), log);
        }
    }
    for rest in &partial {
        if !rest.is_empty() {
            emit(rest, log);
        }
    }
    let r = process::finish(&p, Some(RUN_TIMEOUT)).await;
    drop(guard);
    if r.timed_out {
        return Err(ProviderError::new(crate::provider::ErrorKind::Timeout, format!("{at}: timed out after 30m")));
    }
    match r.exit_code {
        Some(0) => Ok(()),
        code => {
            let how = code.map_or_else(
                || format!("was killed by signal {}", r.signal.unwrap_or(0)),
                |c| format!("exited with {c}"),
            );
            let tail: Vec<&String> = tail.iter().filter(|l| !l.trim().is_empty()).collect();
            let tail = tail.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n");
            Err(ProviderError::invalid(format!("build failed at {at}: the command {how}\n{tail}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_follow_workdir() {
        assert_eq!(absolute("/x", Some("/app")), "/x");
        assert_eq!(absolute("x/y", Some("/app/")), "/app/x/y");
        assert_eq!(absolute("x", None), "/x");
    }

    #[test]
    fn copy_sources_stay_in_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("app")).unwrap();
        std::fs::write(dir.path().join("a.py"), "").unwrap();
        std::fs::write(dir.path().join("b.py"), "").unwrap();
        let got = copy_sources(dir.path(), ["app/".to_string(), "*.py".to_string()].into_iter(), "D:1").unwrap();
        assert_eq!(got, [("app".to_string(), true), ("a.py".to_string(), false), ("b.py".to_string(), false)]);
        let e = copy_sources(dir.path(), ["../".to_string()].into_iter(), "Dockerfile:3").unwrap_err();
        assert!(e.message.contains("Dockerfile:3") && e.message.contains("outside"), "{}", e.message);
        let e = copy_sources(dir.path(), ["nope".to_string()].into_iter(), "Dockerfile:4").unwrap_err();
        assert!(e.message.contains("no such file"), "{}", e.message);
    }

    #[test]
    fn copy_sources_keep_symlinks_as_links_without_following_them() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("folder");
        std::fs::create_dir(&f).unwrap();
        std::fs::write(f.join("test.txt"), "x").unwrap();
        std::os::unix::fs::symlink("test.txt", f.join("rel.txt")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", f.join("shadow")).unwrap();
        std::os::unix::fs::symlink("12345nothing", f.join("dangling")).unwrap();
        std::os::unix::fs::symlink("/etc", f.join("etc")).unwrap();
        let mut got = copy_sources(dir.path(), ["folder/*".to_string()].into_iter(), "D:1").unwrap();
        got.sort();
        let want = ["dangling", "etc", "rel.txt", "shadow", "test.txt"];
        assert_eq!(got, want.map(|n| (format!("folder/{n}"), false)), "links are files to copy, never followed");
        let got = copy_sources(dir.path(), ["folder/shadow".to_string()].into_iter(), "D:2").unwrap();
        assert_eq!(got, [("folder/shadow".to_string(), false)]);
        // A link on the way to a source is followed, and must stay in the folder.
        let e = copy_sources(dir.path(), ["folder/etc/passwd".to_string()].into_iter(), "D:3").unwrap_err();
        assert!(e.message.contains("outside"), "{}", e.message);
    }

    #[test]
    fn build_dir_names_are_safe() {
        let d = build_dir(Path::new("/s"), "a b:c", "sha256:0123456789abcdef");
        assert_eq!(d, Path::new("/s/tpl-a_b_c-0123456789ab"));
    }
}

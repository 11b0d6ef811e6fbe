//! Template builds on the local provider: a Dockerfile applied as a layer over the host's `/`.
//!
//! `FROM` maps to the host's root filesystem (the build log says so), unless images come from
//! a Docker engine (`SCENARIO_RUN_LOCAL_IMAGES=docker`): then the FROM image is exported from
//! it into the build's `base/`, which is stacked under the build and under every sandbox made
//! from the template (`lowerdir=<layer>:<base>:/`), and its ENV, WORKDIR and CMD are the
//! starting state. The base goes with the build directory. The other instructions
//! run in a **build sandbox**: the usual bubblewrap sandbox over an overlay of `/`, except
//! that it keeps the host's network (`--share-net`, so pip and npm reach the registries) and
//! sees the template folder read-only at [`CONTEXT`]. RUN is a command in it, COPY is `cp -a`
//! from the context, ENV/ARG/WORKDIR/USER/CMD/EXPOSE are state the builder keeps. When the
//! last instruction is done the sandbox is stopped and its overlay **upper directory is kept
//! as the template layer**, together with the build's `/home/user` and a `build.json` (env,
//! workdir, user, cmd, ports, log).
//!
//! A sandbox created from the template mounts `lowerdir=<layer>:/` (the layer over the host),
//! starts with a copy of the layer's `/home/user`, and gets the template's ENV and WORKDIR.
//!
//! On disk: `<state_dir>/tpl-<name>-<digest12>/{layer,home,work,merged,build.json,complete}`.
//! A build not kept carries the run's `owner` file (so a SIGKILLed run's build is swept like a
//! sandbox) and is removed by `remove_builds` at the end of the run; a kept one carries `keep`
//! instead, is never swept, and a later run with the same digest reuses it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::process::{self, Target};
use super::sandbox::{Layout, NsSandbox};
use crate::provider::docker::{DockerProvider, ImageConfig};
use crate::provider::registered::BuildLog;
use crate::provider::{ExecRequest, OutputChunk, ProviderError, Result};
use crate::templates::dockerfile::{shell_quote, Command, Inst};
use crate::templates::BuildSpec;

/// Where the template folder is visible inside the build sandbox.
pub(crate) const CONTEXT: &str = "/tmp/.scenario-run-context";
/// Limit for one RUN.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);
/// Marker files in a build directory.
pub(crate) const KEEP_FILE: &str = "keep";
const COMPLETE_FILE: &str = "complete";

/// A finished build: what `create` needs to stack it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Layer {
    pub name: String,
    pub digest: String,
    /// The build directory (removed with the build).
    pub dir: PathBuf,
    /// The overlay upper directory of the build: the layer itself.
    pub layer: PathBuf,
    /// The build's `/home/user`, copied into every sandbox made from the template.
    pub home: PathBuf,
    /// ENV after the last instruction (ARGs are not kept, as in Docker).
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    /// CMD, as a shell command line.
    pub cmd: Option<String>,
    pub ports: Vec<u16>,
    pub log: Vec<String>,
    pub keep: bool,
    /// The `FROM` image's filesystem, stacked under `layer` (only when images come from an
    /// engine; else `FROM` is the host's root).
    #[serde(default)]
    pub base: Option<PathBuf>,
}

/// `tpl-<name>-<first 12 hex digits of the digest>`, with unsafe characters replaced.
pub(crate) fn build_dir(state_dir: &Path, name: &str, digest: &str) -> PathBuf {
    let clean: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
    let hex = digest.trim_start_matches("sha256:");
    state_dir.join(format!("tpl-{clean}-{}", &hex[..hex.len().min(12)]))
}

/// A kept build of the same digest from an earlier run, if there is one.
pub(crate) fn reuse(dir: &Path) -> Option<Layer> {
    if !dir.join(COMPLETE_FILE).exists() {
        return None;
    }
    let text = std::fs::read_to_string(dir.join("build.json")).ok()?;
    serde_json::from_str(&text).ok()
}

/// Builds `spec` into `dir` (which must not exist yet). `owner` is written for builds not kept.
pub(crate) async fn build(
    spec: &BuildSpec,
    dir: &Path,
    owner: &str,
    images: Option<&DockerProvider>,
    tx: mpsc::UnboundedSender<String>,
) -> Result<Layer> {
    let started = Instant::now();
    let t = &spec.template;
    let mut log = BuildLog::new(tx);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| ProviderError::infra(format!("cannot create {}: {e}", dir.display())))?;
    let marker = if spec.keep { (KEEP_FILE, String::new()) } else { (super::OWNER_FILE, owner.to_string()) };
    std::fs::write(dir.join(marker.0), marker.1).map_err(|e| ProviderError::infra(e.to_string()))?;
    let mut layout = Layout::new(dir);
    layout.upper = dir.join("layer");
    layout.share_net = true;
    layout.ro_binds.push((t.dir.clone(), CONTEXT.to_string()));
    log.line(format!("building template {} ({}) from {}", t.def.name, t.digest, t.dir.display()));
    let mut image = None;
    if let (Some(engine), Some(from)) = (images, from_image(spec)) {
        let base = dir.join("base");
        let t0 = Instant::now();
        let config = engine.export_image(&from, &base).await?;
        log.line(format!(
            "FROM {from}: its filesystem, exported from the Docker engine in {:.1}s, is the base layer (over the host's root)",
            t0.elapsed().as_secs_f64()
        ));
        layout.lowers.push(base.clone());
        image = Some((base, config));
    }
    let l = layout.clone();
    tokio::task::spawn_blocking(move || l.create())
        .await
        .map_err(|e| ProviderError::infra(e.to_string()))?
        .map_err(|e| ProviderError::infra(format!("cannot prepare the build directory: {e}")))?;
    let ns = NsSandbox::start(layout.clone()).await?;
    let result = run_instructions(spec, &ns, image.as_ref().map(|(_, c)| c), &mut log).await;
    ns.stop().await;
    let _ = std::fs::remove_dir_all(&layout.work);
    let _ = std::fs::remove_dir_all(&layout.merged);
    let mut layer = result?;
    log.line(format!(
        "built {} in {:.1}s: layer {}",
        t.def.name,
        started.elapsed().as_secs_f64(),
        layout.upper.display()
    ));
    layer.dir = dir.to_path_buf();
    layer.layer = layout.upper.clone();
    layer.home = layout.home.clone();
    layer.keep = spec.keep;
    layer.base = image.map(|(b, _)| b);
    layer.log = log.lines;
    let json = serde_json::to_string_pretty(&layer).map_err(|e| ProviderError::infra(e.to_string()))?;
    std::fs::write(dir.join("build.json"), json)
        .and_then(|()| std::fs::write(dir.join(COMPLETE_FILE), ""))
        .map_err(|e| ProviderError::infra(format!("cannot record the build: {e}")))?;
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

async fn run_instructions(
    spec: &BuildSpec,
    ns: &NsSandbox,
    image: Option<&ImageConfig>,
    log: &mut BuildLog,
) -> Result<Layer> {
    let t = &spec.template;
    let df_name = &t.def.dockerfile;
    let target = Target::Ns { pid1: ns.pid1.pid() };
    let mut args: BTreeMap<String, String> = BTreeMap::new();
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    // As in a Docker build: root, with HOME=/root (not the sandbox user's home, which would
    // carry caches into every sandbox made from the template).
    let mut base = process::base_env("/root");
    base.insert("USER".into(), "root".into());
    let mut workdir: Option<String> = None;
    let mut user: Option<String> = None;
    // USER that exists here: RUNs switch to it with runuser.
    let mut run_as: Option<String> = None;
    let mut cmd: Option<String> = None;
    let mut ports: Vec<u16> = Vec::new();
    if let Some(img) = image {
        // What a container of the image starts with.
        env.extend(img.env.iter().filter_map(|e| e.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())));
        workdir.clone_from(&img.workdir);
        cmd = img.cmd.as_ref().map(|c| c.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
    }
    for ins in &t.dockerfile.instructions {
        let at = format!("{df_name}:{}", ins.line);
        log.line(format!("#{} {}", ins.line, ins.text));
        match &ins.inst {
            Inst::From { image: from } => {
                let from = from.expand(&subst(&base, &args, &env));
                if image.is_none() {
                    log.line(format!(
                        "  FROM {from}: the local provider builds over the host's root filesystem (FROM maps to /)"
                    ));
                }
            }
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
                run(&target, &format!("mkdir -p {}", shell_quote(&dir)), &base, &env, &args, "/", log, &at).await?;
                workdir = Some(dir);
            }
            Inst::User(w) => {
                let u = w.expand(&subst(&base, &args, &env));
                let probe = format!("id -u {} >/dev/null 2>&1", shell_quote(&u));
                run_as = None;
                if u == "root" || u == "0" {
                } else if run_quiet(&target, &probe, &base).await {
                    run_as = Some(u.clone());
                } else {
                    log.line(format!("  note: user {u} does not exist on this host; later RUNs stay root"));
                }
                user = Some(u);
            }
            Inst::Run(c) => {
                let mut line = c.shell_line();
                if matches!(c, Command::Exec(_)) {
                    line = format!("exec {line}");
                }
                if let Some(u) = &run_as {
                    line = format!("exec runuser -u {} -- /bin/sh -c {}", shell_quote(u), shell_quote(&line));
                }
                let cwd = workdir.clone().unwrap_or_else(|| "/".into());
                run(&target, &line, &base, &env, &args, &cwd, log, &at).await?;
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
                run(&target, &script, &base, &BTreeMap::new(), &BTreeMap::new(), "/", log, &at).await?;
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
        home: PathBuf::new(),
        env,
        workdir,
        user,
        cmd,
        ports,
        log: Vec::new(),
        keep: spec.keep,
        base: None,
    })
}

/// What substitution sees: the host's base env, then ARGs, then ENVs.
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
            let real = m
                .canonicalize()
                .map_err(|_| ProviderError::invalid(format!("{at}: COPY {s}: no such file in {}", dir.display())))?;
            let Ok(inside) = real.strip_prefix(&root) else {
                return Err(ProviderError::invalid(format!("{at}: COPY {s}: outside the template folder")));
            };
            let inside = if inside.as_os_str().is_empty() { ".".to_string() } else { inside.display().to_string() };
            out.push((inside, real.is_dir()));
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
    let (tx, mut rx) = mpsc::unbounded_channel();
    let p = process::launch(target, &full, cwd, &req, Some(tx), false).await?;
    let guard = process::KillOnDrop(Some(p.clone()));
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

/// Whether `line` exits 0 in the build sandbox (output discarded).
async fn run_quiet(target: &Target, line: &str, base: &BTreeMap<String, String>) -> bool {
    let req = ExecRequest { cmd: line.to_string(), timeout: Some(Duration::from_secs(30)), ..Default::default() };
    let Ok(p) = process::launch(target, base, "/", &req, None, false).await else { return false };
    process::finish(&p, req.timeout).await.exit_code == Some(0)
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
    fn build_dir_names_are_safe() {
        let d = build_dir(Path::new("/s"), "a b:c", "sha256:0123456789abcdef");
        assert_eq!(d, Path::new("/s/tpl-a_b_c-0123456789ab"));
    }
}

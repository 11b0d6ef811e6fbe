//! Finding and reading scenario files: files, folders (recursive) and globs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::diag::{Diagnostic, Source};

use super::scenario::{Case, Scenario};
use super::validate::{self, LoadOptions};

#[derive(Debug)]
pub struct Loaded {
    pub scenarios: Vec<Arc<Scenario>>,
    pub cases: Vec<Case>,
    pub files: usize,
    /// Files a folder's search found that are not scenarios, each as `path: why`.
    pub passed_over: Vec<String>,
}

pub(crate) fn is_scenario_file(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

/// Folders a search never enters, as ripgrep and pytest pass them over: what git, npm, cargo
/// and Python's virtual environments keep there is never a scenario.
const PASSED_OVER_DIRS: &[&str] = &[".git", "node_modules", "target", "__pycache__"];

/// A virtual environment (`python -m venv`, virtualenv, uv): a folder with `pyvenv.cfg`.
fn is_venv(dir: &Path) -> bool {
    dir.join("pyvenv.cfg").is_file()
}

/// The YAML files under `dir`, sorted by path, as ripgrep finds files: hidden entries,
/// `.gitignore`d ones (inside a git repository or not), `.ignore`d ones, [`PASSED_OVER_DIRS`]
/// and virtual environments are left out.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let walker = ignore::WalkBuilder::new(dir)
        .require_git(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(|e| {
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            e.depth() == 0 || !is_dir || !(PASSED_OVER_DIRS.iter().any(|d| e.file_name() == *d) || is_venv(e.path()))
        })
        .build();
    for entry in walker {
        let entry = entry.map_err(|e| match e.into_io_error() {
            Some(io) => io,
            None => std::io::Error::other("cannot read an ignore file"),
        })?;
        if entry.file_type().is_some_and(|t| t.is_file()) && is_scenario_file(entry.path()) {
            out.push(entry.into_path());
        }
    }
    Ok(())
}

/// Why command-line paths named no scenario files.
#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot read folder {path}: {source}")]
    ReadFolder { path: String, source: std::io::Error },
    #[error("no scenario files (*.yaml, *.yml) in {0}")]
    EmptyFolder(String),
    #[error("bad glob {pattern}: {source}")]
    BadGlob { pattern: String, source: glob::PatternError },
    #[error("no files match {0}")]
    NoMatch(String),
    #[error("no such file or folder: {0}")]
    Missing(String),
}

/// Command-line paths expanded: the files, and which of them were found in a folder rather
/// than named (those are passed over when they are not scenarios, see [`load_found`]).
#[derive(Debug, Default)]
pub struct Expanded {
    pub files: Vec<PathBuf>,
    pub discovered: BTreeSet<PathBuf>,
}

/// Expand command-line paths into a sorted, de-duplicated list of files.
pub fn expand_paths(paths: &[String]) -> Result<Vec<PathBuf>, PathsError> {
    expand(paths).map(|e| e.files)
}

/// Expand command-line paths, keeping which files a folder's search found.
pub fn expand(paths: &[String]) -> Result<Expanded, PathsError> {
    let mut out = Vec::new();
    let mut discovered = BTreeSet::new();
    for raw in paths {
        let p = Path::new(raw);
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|source| PathsError::ReadFolder { path: raw.clone(), source })?;
            if found.is_empty() {
                return Err(PathsError::EmptyFolder(raw.clone()));
            }
            discovered.extend(found.iter().cloned());
            out.extend(found);
        } else if p.is_file() {
            out.push(p.to_path_buf());
        } else if raw.contains(['*', '?', '[']) {
            let matches: Vec<PathBuf> = glob::glob(raw)
                .map_err(|source| PathsError::BadGlob { pattern: raw.clone(), source })?
                .filter_map(Result::ok)
                .collect();
            if matches.is_empty() {
                return Err(PathsError::NoMatch(raw.clone()));
            }
            for m in matches {
                if m.is_dir() {
                    let mut found = Vec::new();
                    walk(&m, &mut found)
                        .map_err(|source| PathsError::ReadFolder { path: m.display().to_string(), source })?;
                    discovered.extend(found.iter().cloned());
                    out.extend(found);
                } else {
                    out.push(m);
                }
            }
        } else {
            return Err(PathsError::Missing(raw.clone()));
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|p| seen.insert(p.clone()));
    // A file named on the command line is a scenario, even when a folder also found it.
    discovered.retain(|p| !paths.iter().any(|raw| Path::new(raw) == p));
    Ok(Expanded { files: out, discovered })
}

/// Why a YAML file a folder's search found is not a scenario, or `None` when it may be one
/// (then it is validated, and its mistakes are errors). A scenario has `steps`, `setup` or
/// `finally` (or a key one typo away from them) at the top of one of its documents, or only
/// keys a scenario has (`name` and `tags` without their steps: an error, not a note).
fn not_a_scenario(text: &str) -> Option<&'static str> {
    const LISTS: [&str; 3] = ["steps", "setup", "finally"];
    let src = Source::new("", text);
    let looks = |key: &str| LISTS.contains(&key) || crate::diag::did_you_mean(key, LISTS).is_some();
    match crate::yaml::parse_keeping_going(&src) {
        Ok((docs, _)) => {
            let maps: Vec<_> = docs.iter().filter_map(|d| d.as_map()).collect();
            if docs.iter().all(|d| d.value == crate::yaml::Value::Null) {
                return Some("empty");
            }
            // A steps file runs where a scenario includes it, and is checked there.
            if maps
                .iter()
                .any(|m| m.iter().any(|(k, v)| k.key_text() == "kind" && v.as_str() == Some(validate::STEPS_KIND)))
            {
                return Some("a steps file for `include:`");
            }
            let any = maps.iter().any(|m| {
                m.iter().any(|(k, _)| looks(&k.key_text()))
                    || m.iter().all(|(k, _)| validate::TOP_KEYS.contains(&k.key_text().as_str()))
            });
            (!any).then_some("no `steps:`")
        }
        // Not YAML a scenario could be (a Helm chart's template): a top-level `steps:` line
        // says it was meant as one.
        Err(_) => {
            let meant = text.lines().any(|l| {
                l.split_once(':').is_some_and(|(k, _)| !k.starts_with([' ', '\t', '#', '-']) && looks(k.trim()))
            });
            (!meant).then_some("not YAML, and no `steps:`")
        }
    }
}

/// Read, parse and validate every file; all diagnostics at once.
pub fn load(files: &[PathBuf], opts: &LoadOptions) -> Result<Loaded, Vec<Diagnostic>> {
    load_found(&Expanded { files: files.to_vec(), discovered: BTreeSet::new() }, opts)
}

/// [`load`], passing over the files a folder's search found that are not scenarios (a
/// `docker-compose.yaml`, a chart's values) with a note in [`Loaded::passed_over`].
pub fn load_found(found: &Expanded, opts: &LoadOptions) -> Result<Loaded, Vec<Diagnostic>> {
    let files = &found.files;
    let mut diags = Vec::new();
    let mut scenarios = Vec::new();
    let mut passed_over = Vec::new();
    for path in files {
        let shown = path.to_string_lossy().trim_start_matches("./").to_string();
        let text = match std::fs::read(path) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(t) => t,
                Err(_) => {
                    let src = Source::new(shown, "");
                    diags.push(Diagnostic::new(&src, 1, 1, 1, "file is not UTF-8 text"));
                    continue;
                }
            },
            Err(e) => {
                let src = Source::new(shown, "");
                diags.push(Diagnostic::new(&src, 1, 1, 1, format!("cannot read file: {e}")));
                continue;
            }
        };
        if found.discovered.contains(path) {
            if let Some(why) = not_a_scenario(&text) {
                passed_over.push(format!("{shown}: not a scenario ({why})"));
                continue;
            }
        }
        let source = Source::new(shown, text);
        match validate::file(&source, opts) {
            Ok(list) => scenarios.extend(list.into_iter().map(Arc::new)),
            Err(mut d) => diags.append(&mut d),
        }
    }
    // Names are unique within the run: reports, -k and --shard rely on it.
    let mut cases = Vec::new();
    let mut names: BTreeMap<String, crate::diag::Location> = BTreeMap::new();
    for sc in &scenarios {
        for case in sc.cases() {
            if let Some(first) = names.get(&case.name) {
                let src = &sc.source;
                diags.push(
                    Diagnostic::new(
                        src,
                        sc.location.line,
                        sc.location.col,
                        sc.name.len(),
                        format!("duplicate scenario name `{}`", case.name),
                    )
                    .label("name used again")
                    .help(format!("the first is at {first}; names must be unique within a run")),
                );
                continue;
            }
            names.insert(case.name.clone(), sc.location.clone());
            cases.push(case);
        }
    }
    if diags.is_empty() {
        Ok(Loaded { files: files.len() - passed_over.len(), scenarios, cases, passed_over })
    } else {
        diags.sort_by(|a, b| a.location.cmp(&b.location));
        Err(diags)
    }
}

#[cfg(test)]
mod tests {
    use super::{expand, expand_paths, load_found, not_a_scenario, PathsError};

    /// Issue 37 item 6: a folder's search passes over what git, npm, cargo and virtual
    /// environments keep, and what `.gitignore` names, as ripgrep does.
    #[test]
    fn discovery_skips_tool_folders_venvs_and_gitignored_files() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let scenario = "name: s\nsteps:\n  - set: { a: 1 }\n";
        for dir in [".git", "node_modules/pkg", "target/debug", "venv", "gone", "area"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
            std::fs::write(root.join(dir).join("x.yaml"), scenario).unwrap();
        }
        std::fs::write(root.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        std::fs::write(root.join(".gitignore"), "gone/\n*.local.yaml\n").unwrap();
        std::fs::write(root.join("area/y.local.yaml"), scenario).unwrap();
        let found = expand(&[root.to_string_lossy().into_owned()]).unwrap();
        assert_eq!(found.files, [root.join("area/x.yaml")]);
        // Named, a file is read whatever ignores it.
        let named = root.join("gone/x.yaml").to_string_lossy().into_owned();
        assert_eq!(expand_paths(std::slice::from_ref(&named)).unwrap(), [root.join("gone/x.yaml")]);
    }

    /// Issue 37 item 6: a YAML file that is not a scenario, found in a folder, is passed over
    /// with a note; named on the command line it is still an error.
    #[test]
    fn non_scenario_yaml_found_in_a_folder_is_passed_over() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::write(root.join("a.yaml"), "name: s\nsteps:\n  - set: { a: 1 }\n").unwrap();
        std::fs::write(root.join("compose.yaml"), "services:\n  web: { image: nginx }\n").unwrap();
        std::fs::write(root.join("typo.yaml"), "name: t\nstesp:\n  - set: { a: 1 }\n").unwrap();
        let opts = crate::model::LoadOptions::default();
        let dir = root.to_string_lossy().into_owned();
        // The typo is one edit from `steps`: meant as a scenario, so an error.
        let e = load_found(&expand(std::slice::from_ref(&dir)).unwrap(), &opts).unwrap_err();
        assert!(e.iter().all(|d| d.location.file.ends_with("typo.yaml")), "{e:?}");
        std::fs::remove_file(root.join("typo.yaml")).unwrap();
        let loaded = load_found(&expand(std::slice::from_ref(&dir)).unwrap(), &opts).unwrap();
        assert_eq!(loaded.cases.len(), 1);
        assert_eq!(loaded.files, 1);
        assert_eq!(loaded.passed_over.len(), 1);
        assert!(
            loaded.passed_over[0].ends_with("compose.yaml: not a scenario (no `steps:`)"),
            "{:?}",
            loaded.passed_over
        );
        let named = root.join("compose.yaml").to_string_lossy().into_owned();
        assert!(load_found(&expand(&[dir, named]).unwrap(), &opts).is_err(), "named, it is checked");
        assert_eq!(not_a_scenario(""), Some("empty"));
        assert_eq!(not_a_scenario("{{ .Values.x }}: [\n"), Some("not YAML, and no `steps:`"));
        assert_eq!(not_a_scenario("name: x\nsteps: [\n"), None);
        assert_eq!(not_a_scenario("name: x\ntags: [a]\n"), None, "a scenario that forgot its steps");
        assert_eq!(not_a_scenario("name: ci\non: push\njobs: {}\n"), Some("no `steps:`"));
    }

    #[test]
    fn paths_that_name_no_scenario_say_why_by_kind() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().to_string_lossy().into_owned();
        let one = |p: String| expand_paths(&[p]);
        assert!(matches!(one(dir.clone()), Err(PathsError::EmptyFolder(d)) if d == dir));
        assert!(matches!(one(format!("{dir}/gone")), Err(PathsError::Missing(_))));
        assert!(matches!(one(format!("{dir}/*.yaml")), Err(PathsError::NoMatch(_))));
        let e = one(format!("{dir}/[")).unwrap_err();
        assert!(matches!(e, PathsError::BadGlob { .. }), "{e}");
        assert!(e.to_string().starts_with(&format!("bad glob {dir}/[: ")), "{e}");
        std::fs::write(t.path().join("a.yaml"), "").unwrap();
        assert_eq!(one(format!("{dir}/*.yaml")).unwrap(), [t.path().join("a.yaml")]);
    }
}

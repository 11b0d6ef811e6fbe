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
}

pub(crate) fn is_scenario_file(p: &Path) -> bool {
    matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"))
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if e.file_type()?.is_dir() {
            walk(&p, out)?;
        } else if is_scenario_file(&p) {
            out.push(p);
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

/// Expand command-line paths into a sorted, de-duplicated list of files.
pub fn expand_paths(paths: &[String]) -> Result<Vec<PathBuf>, PathsError> {
    let mut out = Vec::new();
    for raw in paths {
        let p = Path::new(raw);
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|source| PathsError::ReadFolder { path: raw.clone(), source })?;
            if found.is_empty() {
                return Err(PathsError::EmptyFolder(raw.clone()));
            }
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
                    walk(&m, &mut out)
                        .map_err(|source| PathsError::ReadFolder { path: m.display().to_string(), source })?;
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
    Ok(out)
}

/// Read, parse and validate every file; all diagnostics at once.
pub fn load(files: &[PathBuf], opts: &LoadOptions) -> Result<Loaded, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let mut scenarios = Vec::new();
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
        Ok(Loaded { files: files.len(), scenarios, cases })
    } else {
        diags.sort_by(|a, b| a.location.cmp(&b.location));
        Err(diags)
    }
}

#[cfg(test)]
mod tests {
    use super::{expand_paths, PathsError};

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

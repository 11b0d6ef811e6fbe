//! Finding and reading scenario files: files, folders (recursive) and globs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::diag::{Diagnostic, Source};

use super::{validate, Case, Scenario};

#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Names given with `--var`, known to the static checks.
    pub cli_vars: BTreeSet<String>,
    /// Today's date (YYYY-MM-DD), for `known_issue.until`.
    pub today: String,
    /// `SCENARIO_RUN_TEMPLATES_DIR` of the run's environment: where `build`/`deploy` look for
    /// template folders, so `check` finds a missing one before a run does.
    pub templates_dir: Option<String>,
}

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

/// Expand command-line paths into a sorted, de-duplicated list of files.
pub fn expand_paths(paths: &[String]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for raw in paths {
        let p = Path::new(raw);
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found).map_err(|e| format!("cannot read folder {raw}: {e}"))?;
            if found.is_empty() {
                return Err(format!("no scenario files (*.yaml, *.yml) in {raw}"));
            }
            out.extend(found);
        } else if p.is_file() {
            out.push(p.to_path_buf());
        } else if raw.contains(['*', '?', '[']) {
            let matches: Vec<PathBuf> =
                glob::glob(raw).map_err(|e| format!("bad glob {raw}: {e}"))?.filter_map(Result::ok).collect();
            if matches.is_empty() {
                return Err(format!("no files match {raw}"));
            }
            for m in matches {
                if m.is_dir() {
                    walk(&m, &mut out).map_err(|e| format!("cannot read folder {}: {e}", m.display()))?;
                } else {
                    out.push(m);
                }
            }
        } else {
            return Err(format!("no such file or folder: {raw}"));
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

//! `--lf` and `--ff`, pytest's last-failed: every run records which scenarios did not pass
//! (FAILED or ERROR) in `.scenario-run/last-run.json` under the current folder (or
//! `$SCENARIO_RUN_CACHE_DIR/last-run.json`); the next run with `--lf` runs only those, with
//! `--ff` runs them first and then the rest.
//!
//! A scenario is known by its file (canonical path) and its name, which for a matrix case
//! includes the cell (`name[template=base]`). The record is merged as pytest's is: a
//! scenario that ran this time replaces what was known of it (a failure that now passes is
//! forgotten); one that did not run (deselected, skipped, interrupted) keeps its entry.
//! Without a record, or when none of the selection failed last time, every selected scenario
//! runs, with a note saying so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Case;
use crate::results::{Outcome, RunSummary};

/// `--lf` or `--ff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rerun {
    /// Only the last failures.
    LastFailed,
    /// The last failures first, then the rest.
    FailedFirst,
}

impl Rerun {
    fn flag(self) -> &'static str {
        match self {
            Rerun::LastFailed => "--lf",
            Rerun::FailedFirst => "--ff",
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    version: u32,
    /// The scenarios that failed the last time they ran.
    failed: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
struct Entry {
    file: String,
    name: String,
}

/// Where the record is kept.
pub fn path(env: &BTreeMap<String, String>) -> PathBuf {
    let dir = env
        .get("SCENARIO_RUN_CACHE_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(".scenario-run"), PathBuf::from);
    dir.join("last-run.json")
}

fn entry(file: &str, name: &str) -> Entry {
    let file = std::fs::canonicalize(file).map_or_else(|_| file.to_string(), |p| p.display().to_string());
    Entry { file, name: name.to_string() }
}

fn read(path: &Path) -> Option<Record> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

/// The selected `cases` as `--lf`/`--ff` want them, and the note that says what was done.
pub fn apply(rerun: Rerun, cases: Vec<Case>, path: &Path) -> (Vec<Case>, String) {
    let flag = rerun.flag();
    let Some(record) = read(path) else {
        return (
            cases,
            format!("{flag}: no last run recorded ({} not found): running every selected scenario", path.display()),
        );
    };
    let failed: BTreeSet<Entry> = record.failed.into_iter().collect();
    let (first, rest): (Vec<Case>, Vec<Case>) =
        cases.into_iter().partition(|c| failed.contains(&entry(&c.scenario.location.file, &c.name)));
    if first.is_empty() {
        let mut all = first;
        all.extend(rest);
        return (
            all,
            format!("{flag}: no scenario of this selection failed last time: running every selected scenario"),
        );
    }
    let n = first.len();
    let s = if n == 1 { "" } else { "s" };
    match rerun {
        Rerun::LastFailed => {
            let note = format!("{flag}: running the {n} scenario{s} that failed last time ({} deselected)", rest.len());
            (first, note)
        }
        Rerun::FailedFirst => {
            let note =
                format!("{flag}: running the {n} scenario{s} that failed last time first, then {} more", rest.len());
            let mut all = first;
            all.extend(rest);
            (all, note)
        }
    }
}

/// Records this run's failures into the record at `path` (merged: see the module).
pub fn record(summary: &RunSummary, path: &Path) -> std::io::Result<()> {
    let mut failed: BTreeSet<Entry> = read(path).map(|r| r.failed.into_iter().collect()).unwrap_or_default();
    for r in &summary.results {
        if r.outcome == Outcome::Skipped {
            continue;
        }
        let e = entry(&r.location.file, &r.name);
        if matches!(r.outcome, Outcome::Failed | Outcome::Error) {
            failed.insert(e);
        } else {
            failed.remove(&e);
        }
    }
    let record = Record { version: 1, failed: failed.into_iter().collect() };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    // Written whole, then renamed: two runs in one folder never leave half a file.
    let tmp = path.with_extension(format!("json.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&record).expect("serializable"))?;
    std::fs::rename(&tmp, path)
}

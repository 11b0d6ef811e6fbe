//! The evidence directory (`--evidence DIR`): one JSON file per scenario with every step's
//! rendered arguments, outputs, status, message and timings, plus an `index.json`.
//!
//! Layout:
//!
//! ```text
//! DIR/
//!   index.json            {"schema_version", "run_id", "provider", "started_at_ms",
//!                          "duration_ms", "interrupted", "totals",
//!                          "scenarios": [{"index", "name", "outcome", "duration_ms", "file"}]}
//!   000-hello.json        {"schema_version", "run_id", "provider", "scenario": <ScenarioResult>}
//!   001-write-file-template-base.json
//! ```
//!
//! File names are `<index>-<slug>.json`: the index zero-padded to three digits so names sort
//! in plan order, the slug made of lowercase ASCII letters, digits and `-` (at most 60
//! characters), so it is safe on every file system. Names are unique within a run.
//! `schema_version` is [`JSON_SCHEMA_VERSION`]; the
//! scenario object has the shape documented in [`super::json`].

use std::collections::HashSet;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::json::JSON_SCHEMA_VERSION;
use crate::results::{Outcome, RunSummary, ScenarioResult, Totals};

#[derive(Serialize)]
struct ScenarioFile<'a> {
    schema_version: u32,
    run_id: &'a str,
    provider: &'a str,
    scenario: &'a ScenarioResult,
}

#[derive(Serialize)]
struct IndexEntry<'a> {
    index: usize,
    name: &'a str,
    outcome: Outcome,
    duration_ms: u64,
    file: String,
}

#[derive(Serialize)]
struct Index<'a> {
    schema_version: u32,
    run_id: &'a str,
    provider: &'a str,
    started_at_ms: u64,
    duration_ms: u64,
    interrupted: bool,
    totals: &'a Totals,
    scenarios: Vec<IndexEntry<'a>>,
}

/// Write the evidence files into `dir` (created if missing). Returns the paths written:
/// the scenario files in index order, then `index.json`.
pub fn write_evidence(summary: &RunSummary, dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut results: Vec<&ScenarioResult> = summary.results.iter().collect();
    results.sort_by_key(|r| r.index);

    let mut used = HashSet::new();
    let mut written = Vec::with_capacity(results.len() + 1);
    let mut entries = Vec::with_capacity(results.len());
    for r in results {
        let base = format!("{:03}-{}", r.index, slug(&r.name));
        let mut name = format!("{base}.json");
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("{base}-{n}.json");
            n += 1;
        }
        let path = dir.join(&name);
        let doc = ScenarioFile {
            schema_version: JSON_SCHEMA_VERSION,
            run_id: &summary.run_id,
            provider: &summary.provider,
            scenario: r,
        };
        write_pretty(&path, &doc)?;
        written.push(path);
        entries.push(IndexEntry {
            index: r.index,
            name: &r.name,
            outcome: r.outcome,
            duration_ms: r.duration_ms,
            file: name,
        });
    }

    let index = Index {
        schema_version: JSON_SCHEMA_VERSION,
        run_id: &summary.run_id,
        provider: &summary.provider,
        started_at_ms: summary.started_at_ms,
        duration_ms: summary.duration_ms,
        interrupted: summary.interrupted,
        totals: &summary.totals,
        scenarios: entries,
    };
    let path = dir.join("index.json");
    write_pretty(&path, &index)?;
    written.push(path);
    Ok(written)
}

fn write_pretty(path: &Path, value: &impl Serialize) -> io::Result<()> {
    let mut w = BufWriter::new(fs::File::create(path)?);
    serde_json::to_writer_pretty(&mut w, value)?;
    w.write_all(b"\n")?;
    w.flush()
}

/// `write file[template=base]` → `write-file-template-base`; never empty.
fn slug(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out: String = out.chars().take(60).collect();
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        out.push_str("scenario");
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::report::fixture;

    #[test]
    fn one_file_per_scenario_plus_index() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("nested/evidence");
        let summary = fixture::summary();
        let paths = write_evidence(&summary, &dir).unwrap();
        assert_eq!(paths.len(), 8);
        let names: Vec<_> = paths.iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names[0], "000-hello.json");
        assert_eq!(names[1], "001-write-file-template-base.json");
        assert_eq!(names[7], "index.json");
        let mut on_disk: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        on_disk.sort();
        assert_eq!(on_disk.len(), 8);

        let v: Value = serde_json::from_slice(&fs::read(&paths[1]).unwrap()).unwrap();
        assert_eq!(v["run_id"], "r-20240101-abcd");
        let sc = &v["scenario"];
        assert_eq!(sc["name"], "write file[template=base]");
        assert_eq!(sc["steps"].as_array().unwrap().len(), 4);
        let failed = &sc["steps"][1];
        assert_eq!(failed["status"], "failed");
        assert_eq!(failed["args"]["cmd"], "cat /tmp/out.txt");
        assert_eq!(failed["outputs"]["stdout"], "world\n");
        assert_eq!(failed["message"], "stdout did not match");
        assert_eq!(failed["duration_ms"], 100);
        assert_eq!(failed["start_ms"], 100);

        let index: Value = serde_json::from_slice(&fs::read(&paths[7]).unwrap()).unwrap();
        assert_eq!(index["totals"]["failed"], 2);
        assert_eq!(index["scenarios"][6]["file"], "006-fixed-bug.json");
        assert_eq!(index["scenarios"][6]["outcome"], "xpass");
    }

    #[test]
    fn names_are_unique_and_safe() {
        let tmp = tempfile::tempdir().unwrap();
        let mut summary = fixture::summary();
        summary.results.truncate(2);
        for r in &mut summary.results {
            r.index = 7;
            r.name = "../../etc/passwd <é>".into();
        }
        let paths = write_evidence(&summary, tmp.path()).unwrap();
        let names: Vec<_> = paths.iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names, ["007-etc-passwd.json", "007-etc-passwd-2.json", "index.json"]);
        assert!(paths.iter().all(|p| p.parent() == Some(tmp.path())));
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("exit codes[template=base]"), "exit-codes-template-base");
        assert_eq!(slug("--"), "scenario");
        assert_eq!(slug(&"a".repeat(100)).len(), 60);
        assert_eq!(slug("Ünïcode ✓ Name"), "n-code-name");
    }
}

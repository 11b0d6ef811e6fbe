//! Reporters: the live terminal view, the summary, and the JUnit, JSON, evidence and HTML files.

pub mod evidence;
pub mod format;
pub mod github;
pub mod html;
pub mod human;
pub mod json;
pub mod junit;
pub mod summary;

#[cfg(test)]
pub(crate) mod fixture;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::mask::Masker;
use crate::results::{Event, RunSummary};

/// A consumer of events. Exactly one reporter owns the terminal.
pub trait Reporter: Send {
    fn handle(&mut self, event: &Event);
}

/// The report files a run writes besides the terminal (`--junit`, `--json`, `--evidence`,
/// `--html`).
#[derive(Debug, Clone, Default)]
pub struct ReportFiles {
    pub junit: Option<PathBuf>,
    pub json: Option<PathBuf>,
    /// A directory: one file per scenario.
    pub evidence: Option<PathBuf>,
    pub html: Option<PathBuf>,
}

impl ReportFiles {
    /// Write each file asked for, making its directory. Every file is attempted, each one
    /// flushed and checked (a full disk must not leave CI a truncated report and a green job);
    /// the error names every file that could not be written, one per line.
    pub fn write(&self, summary: &RunSummary, masker: &Masker) -> Result<(), String> {
        let mut errors = Vec::new();
        if let Some(p) = &self.junit {
            errors.extend(write_file(p, |w| junit::write_junit(summary, w)).err());
        }
        if let Some(p) = &self.json {
            errors.extend(write_file(p, |w| json::write_json(summary, w)).err());
        }
        if let Some(dir) = &self.evidence {
            if let Err(e) = evidence::write_evidence(summary, dir) {
                errors.push(format!("cannot write evidence to {}: {e}", dir.display()));
            }
        }
        if let Some(p) = &self.html {
            // Masked as a whole once more: the page holds every step's arguments and outputs.
            let page = html::render_html(summary);
            let page = masker.mask(&page);
            errors.extend(write_file(p, |w| w.write_all(page.as_bytes())).err());
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("\nerror: "))
        }
    }
}

/// Create `path` (and its directory), write it through a buffer and flush it: an error of the
/// last buffered write shows up only at the flush, so the flush is checked like every write.
fn write_file(path: &Path, body: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let file = File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut w = BufWriter::new(file);
    body(&mut w).and_then(|()| w.flush()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

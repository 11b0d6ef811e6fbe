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
    /// Write each file asked for, making its directory; the first failure is the error.
    pub fn write(&self, summary: &RunSummary, masker: &Masker) -> Result<(), String> {
        let create = |p: &Path| -> Result<std::io::BufWriter<std::fs::File>, String> {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::File::create(p)
                .map(std::io::BufWriter::new)
                .map_err(|e| format!("cannot write {}: {e}", p.display()))
        };
        if let Some(p) = &self.junit {
            let mut w = create(p)?;
            junit::write_junit(summary, &mut w).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
        if let Some(p) = &self.json {
            let mut w = create(p)?;
            json::write_json(summary, &mut w).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
        if let Some(dir) = &self.evidence {
            evidence::write_evidence(summary, dir)
                .map_err(|e| format!("cannot write evidence to {}: {e}", dir.display()))?;
        }
        if let Some(p) = &self.html {
            // Masked as a whole once more: the page holds every step's arguments and outputs.
            let page = html::render_html(summary);
            let mut w = create(p)?;
            std::io::Write::write_all(&mut w, masker.mask(&page).as_bytes())
                .and_then(|()| std::io::Write::flush(&mut w))
                .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        }
        Ok(())
    }
}

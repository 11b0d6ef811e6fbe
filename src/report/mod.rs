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

/// A report that could not be written, with the file or directory and the I/O error.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The directory a report file goes in.
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: io::Error },
    /// Creating, writing or flushing a report file.
    #[error("cannot write {}: {source}", path.display())]
    Write { path: PathBuf, source: io::Error },
    /// `--evidence`'s directory or one of its files.
    #[error("cannot write evidence to {}: {source}", dir.display())]
    Evidence { dir: PathBuf, source: io::Error },
    /// GitHub Actions' `$GITHUB_STEP_SUMMARY`.
    #[error("cannot write the job summary {}: {source}", path.display())]
    JobSummary { path: PathBuf, source: io::Error },
}

/// Every report file of a run that could not be written (at least one): one per line, each
/// line after the first led by `error: ` as the first is by the caller.
#[derive(Debug, thiserror::Error)]
#[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\nerror: "))]
pub struct ReportErrors(pub Vec<ReportError>);

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
    pub fn write(&self, summary: &RunSummary, masker: &Masker) -> Result<(), ReportErrors> {
        let mut errors = Vec::new();
        if let Some(p) = &self.junit {
            errors.extend(write_file(p, |w| junit::write_junit(summary, w)).err());
        }
        if let Some(p) = &self.json {
            errors.extend(write_file(p, |w| json::write_json(summary, w)).err());
        }
        if let Some(dir) = &self.evidence {
            if let Err(source) = evidence::write_evidence(summary, dir) {
                errors.push(ReportError::Evidence { dir: dir.clone(), source });
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
            Err(ReportErrors(errors))
        }
    }
}

/// Create `path` (and its directory), write it through a buffer and flush it: an error of the
/// last buffered write shows up only at the flush, so the flush is checked like every write.
fn write_file(path: &Path, body: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) -> Result<(), ReportError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir { dir: dir.to_path_buf(), source })?;
    }
    let write = |source| ReportError::Write { path: path.to_path_buf(), source };
    let file = File::create(path).map_err(write)?;
    let mut w = BufWriter::new(file);
    body(&mut w).and_then(|()| w.flush()).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 28 item 4: every file that cannot be written is reported, each by its kind, in
    /// the text the run prints.
    #[test]
    fn every_unwritable_report_is_an_error_of_its_kind() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let files = ReportFiles {
            junit: Some(file.join("junit.xml")),
            json: Some(dir.path().join("ok.json")),
            evidence: Some(file.clone()),
            html: Some(dir.path().to_path_buf()),
        };
        let e = files.write(&fixture::summary(), &Masker::default()).unwrap_err();
        assert_eq!(e.0.len(), 3, "{e}");
        assert!(matches!(&e.0[0], ReportError::CreateDir { dir, .. } if *dir == file));
        assert!(matches!(&e.0[1], ReportError::Evidence { dir, .. } if *dir == file));
        assert!(matches!(&e.0[2], ReportError::Write { path, .. } if path == dir.path()));
        assert!(dir.path().join("ok.json").is_file());
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with(&format!("cannot create {}: ", file.display())), "{text}");
        assert!(lines[1].starts_with(&format!("error: cannot write evidence to {}: ", file.display())), "{text}");
        assert!(lines[2].starts_with(&format!("error: cannot write {}: ", dir.path().display())), "{text}");
    }
}

//! Diagnostics: user-facing problems in scenario files, with where and how to fix them.
//!
//! One [`Diagnostic`] type, rendered rustc-style:
//!
//! ```text
//! error: unknown step kind `exce`
//!   --> scenarios/a.yaml:7:5
//!    |
//!  7 |   - exce: echo hi
//!    |     ^^^^ unknown step kind
//!    = help: did you mean `exec`?
//! ```

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Serialize;

/// A position in a source file. Lines and columns are 1-based.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Location {
    pub file: String,
    pub line: u32,
    pub col: u32,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// A loaded source file, kept so any diagnostic can show its line.
#[derive(Debug)]
pub struct Source {
    pub path: String,
    pub text: String,
    /// Byte offset of the start of every line, so finding a line is O(1): a file with many
    /// problems must not cost a scan of the file per problem.
    line_starts: Vec<usize>,
}

impl Source {
    pub fn new(path: impl Into<String>, text: impl Into<String>) -> Arc<Self> {
        let text = text.into();
        let line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        Arc::new(Self { path: path.into(), text, line_starts })
    }

    /// Line `line` (1-based) without its line ending, as `str::lines` gives it.
    pub fn line_text(&self, line: u32) -> Option<&str> {
        let i = (line as usize).checked_sub(1)?;
        let start = *self.line_starts.get(i)?;
        let end = self.line_starts.get(i + 1).map_or(self.text.len(), |next| next - 1);
        if start == self.text.len() {
            return None; // at the end of the text (after a final newline) there is no line
        }
        let l = &self.text[start..end];
        Some(l.strip_suffix('\r').unwrap_or(l))
    }
}

/// A problem at a place, with the length of the offending text for the caret line.
#[derive(Debug, Clone)]
pub struct Diagnostic {
    pub location: Location,
    /// Characters to underline (at least 1).
    pub len: usize,
    pub message: String,
    pub label: Option<String>,
    pub help: Option<String>,
    /// The offending source line, captured when the diagnostic is made.
    pub source_line: Option<String>,
    /// Lines shown after the help, as `= note: …` (which `include:` brought the file in).
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn new(source: &Source, line: u32, col: u32, len: usize, message: impl Into<String>) -> Self {
        Self {
            location: Location { file: source.path.clone(), line, col },
            len: len.max(1),
            message: message.into(),
            label: None,
            help: None,
            source_line: source.line_text(line).map(str::to_string),
            notes: Vec::new(),
        }
    }

    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.notes.push(note.into());
        self
    }

    pub fn help_opt(mut self, help: Option<String>) -> Self {
        self.help = help;
        self
    }

    /// Render rustc-style, without colour.
    pub fn render(&self) -> String {
        self.render_as("error")
    }

    /// Render as a `warning:` (a problem that does not stop the run).
    pub fn render_warning(&self) -> String {
        self.render_as("warning")
    }

    fn render_as(&self, level: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{level}: {}", self.message);
        let num = self.location.line.to_string();
        let pad = " ".repeat(num.len());
        let _ = writeln!(out, "{pad}--> {}", self.location);
        if let Some(line) = &self.source_line {
            let shown = line.replace('\t', "→");
            let _ = writeln!(out, "{pad} |");
            let _ = writeln!(out, "{num} | {shown}");
            let caret_pad = " ".repeat(self.location.col.saturating_sub(1) as usize);
            let width = self.len.min(shown.chars().count().saturating_sub(caret_pad.len()).max(1));
            let _ = write!(out, "{pad} | {caret_pad}{}", "^".repeat(width));
            if let Some(label) = &self.label {
                let _ = write!(out, " {label}");
            }
            out.push('\n');
        }
        if let Some(help) = &self.help {
            let mut lines = help.lines();
            let _ = writeln!(out, "{pad} = help: {}", lines.next().unwrap_or(""));
            for line in lines {
                let _ = writeln!(out, "{pad}         {line}");
            }
        }
        for note in &self.notes {
            let _ = writeln!(out, "{pad} = note: {note}");
        }
        out
    }
}

/// The closest candidate to `word`, if it is close enough to be a likely typo.
pub fn did_you_mean<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        // Optimal-string-alignment distance: edits plus adjacent transpositions (`exce` →
        // `exec` is 1).
        let d = strsim::osa_distance(word, c);
        let limit = (c.len().max(word.len()) / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_names_only() {
        let kinds = ["exec", "create", "write-file", "read-file"];
        assert_eq!(did_you_mean("exce", kinds), Some("exec"));
        assert_eq!(did_you_mean("write_file", kinds), Some("write-file"));
        assert_eq!(did_you_mean("banana", kinds), None);
    }

    #[test]
    fn line_text_agrees_with_str_lines() {
        for text in ["", "a", "a\n", "a\nb", "a\r\nb\r\n", "\n\n", "x\n\ny\n", "é\nü"] {
            let src = Source::new("t", text);
            let want: Vec<&str> = text.lines().collect();
            let got: Vec<&str> = (1..=want.len() as u32 + 2).map_while(|l| src.line_text(l)).collect();
            assert_eq!(got, want, "{text:?}");
            assert_eq!(src.line_text(0), None);
        }
    }

    #[test]
    fn renders_caret_under_the_column() {
        let src = Source::new("a.yaml", "name: x\nsteps:\n  - exce: hi\n");
        let d = Diagnostic::new(&src, 3, 5, 4, "unknown step kind `exce`")
            .label("unknown step kind")
            .help("did you mean `exec`?");
        let text = d.render();
        assert!(text.contains("--> a.yaml:3:5"), "{text}");
        assert!(text.contains("3 |   - exce: hi\n  |     ^^^^ unknown step kind"), "{text}");
        assert!(text.ends_with("= help: did you mean `exec`?\n"), "{text}");
    }
}

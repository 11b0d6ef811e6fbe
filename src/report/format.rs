//! Small text helpers shared by the reporters: durations, ANSI colour, quoting, and the
//! expected-vs-actual rendering of a [`Mismatch`].
//!
//! Kept in one place so the terminal, the summary table and the JUnit failure text agree on
//! how a duration or a mismatch looks.

use similar::TextDiff;

use crate::results::{Mismatch, Outcome};

/// `0.42s` under a minute, `1m03s` under an hour, `1h02m03s` beyond.
pub fn duration(ms: u64) -> String {
    if ms < 60_000 {
        format!("{}.{:02}s", ms / 1000, (ms % 1000) / 10)
    } else if ms < 3_600_000 {
        let s = ms / 1000;
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        let s = ms / 1000;
        format!("{}h{:02}m{:02}s", s / 3600, (s % 3600) / 60, s % 60)
    }
}

/// ANSI SGR codes used by the reporters.
#[derive(Debug, Clone, Copy)]
pub enum Color {
    Red,
    Green,
    Yellow,
    Magenta,
    Cyan,
    Bold,
    Dim,
}

impl Color {
    fn code(self) -> &'static str {
        match self {
            Color::Red => "31",
            Color::Green => "32",
            Color::Yellow => "33",
            Color::Magenta => "35",
            Color::Cyan => "36",
            Color::Bold => "1",
            Color::Dim => "2",
        }
    }
}

/// Wrap `text` in the colour when `on`; the text itself unchanged otherwise.
pub fn paint(text: &str, color: Color, on: bool) -> String {
    if on && !text.is_empty() {
        format!("\x1b[{}m{text}\x1b[0m", color.code())
    } else {
        text.to_string()
    }
}

pub fn outcome_color(outcome: Outcome) -> Color {
    match outcome {
        Outcome::Passed => Color::Green,
        Outcome::Failed | Outcome::Error => Color::Red,
        Outcome::Skipped | Outcome::Xfail => Color::Yellow,
        Outcome::Xpass => Color::Magenta,
    }
}

/// The outcome label, coloured when `on`.
pub fn outcome_label(outcome: Outcome, on: bool) -> String {
    paint(outcome.label(), outcome_color(outcome), on)
}

/// A value shown on one line: quoted, with escapes visible (`"a\tb\n"`).
pub fn quote(s: &str) -> String {
    format!("{s:?}")
}

/// True when a value is better shown as a diff than quoted: it has a line break other than
/// a single trailing one.
pub fn is_multiline(s: &str) -> bool {
    s.strip_suffix('\n').unwrap_or(s).contains('\n')
}

/// Control characters (escape sequences, NUL, tabs) shown escaped, so a table cell or a
/// one-line report cannot break alignment or drive the terminal.
pub fn sanitize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// First line of a message, for table cells and one-line reports.
pub fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or("")
}

/// Expected vs found: quoted one-liners, or a unified diff when either side is multi-line;
/// then the hint, if any. Every line ends with `\n`.
pub fn mismatch(m: &Mismatch, color: bool) -> String {
    let mut out = if !is_multiline(&m.expected) && !is_multiline(&m.actual) {
        format!(
            "{} {}\n{}    {}\n",
            paint("expected:", Color::Green, color),
            quote(&m.expected),
            paint("found:", Color::Red, color),
            quote(&m.actual)
        )
    } else {
        diff(&m.expected, &m.actual, color)
    };
    if let Some(h) = &m.hint {
        out.push_str(&paint("hint:", Color::Cyan, color));
        out.push(' ');
        out.push_str(h);
        out.push('\n');
    }
    out
}

/// A unified diff from the expected text to the text found, coloured when `color`.
pub fn diff(expected: &str, found: &str, color: bool) -> String {
    let diff = TextDiff::from_lines(expected, found);
    let text = diff.unified_diff().header("expected", "found").to_string();
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let c = if line.starts_with("+++") || line.starts_with("---") {
            Some(Color::Bold)
        } else if line.starts_with("@@") {
            Some(Color::Cyan)
        } else if line.starts_with('+') {
            Some(Color::Green)
        } else if line.starts_with('-') {
            Some(Color::Red)
        } else {
            None
        };
        match c {
            Some(c) => out.push_str(&paint(line, c, color)),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(0), "0.00s");
        assert_eq!(duration(420), "0.42s");
        assert_eq!(duration(1234), "1.23s");
        assert_eq!(duration(59_999), "59.99s");
        assert_eq!(duration(63_000), "1m03s");
        assert_eq!(duration(3_723_000), "1h02m03s");
    }

    #[test]
    fn paint_only_when_on() {
        assert_eq!(paint("x", Color::Red, false), "x");
        assert_eq!(paint("x", Color::Red, true), "\x1b[31mx\x1b[0m");
    }

    #[test]
    fn one_line_mismatch_is_quoted() {
        let m = Mismatch::new("hello\n", "he\tllo");
        assert_eq!(mismatch(&m, false), "expected: \"hello\\n\"\nfound:    \"he\\tllo\"\n");
    }

    #[test]
    fn multi_line_mismatch_is_a_diff() {
        let m = Mismatch::new("a\nb\nc\n", "a\nB\nc\n");
        assert_eq!(mismatch(&m, false), "--- expected\n+++ found\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n");
    }
}

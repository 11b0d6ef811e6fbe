//! A file beside the scenario as the expected value (`assert-file: { equals_file: … }`).
//!
//! The path is relative to the scenario file's folder and must stay inside it (symbolic links
//! followed): a scenario compares with what ships beside it, never with whatever the runner's
//! machine has elsewhere. `check` resolves a written path with [`resolve`] and points at the
//! value when it is absolute, missing, a folder or outside; a templated one is resolved the
//! same way at run time.
//!
//! The comparison is byte for byte. A mismatch names the first difference (line and column
//! for text, byte offset and values for binary) and the sizes, and carries a diff that is
//! bounded: the whole texts when both are small, else a window of lines around the first
//! difference, so a 100 MiB file does not become a 100 MiB report.

use std::path::{Path, PathBuf};

use crate::results::Mismatch;

/// `exists: false` beside `equals_file`: said by `check` and, for a templated `exists`, by the
/// step.
pub const EQUALS_FILE_AND_ABSENT: &str =
    "`equals_file` with `exists: false`: a file that must not exist has no content to compare";

/// Why a local path is refused: the message, the label under it, the help.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    pub message: String,
    pub label: &'static str,
    pub help: String,
}

/// `rel` (as written under `field`) resolved against `scenario_dir`: an existing regular file
/// inside that folder or below it.
pub fn resolve(scenario_dir: &Path, rel: &str, field: &str) -> Result<PathBuf, Refused> {
    let dir = if scenario_dir.as_os_str().is_empty() { Path::new(".") } else { scenario_dir };
    let shown_dir = dir.display();
    let beside = format!(
        "`{field}` names a file beside the scenario, relative to its folder {shown_dir} (a sub-folder is fine)"
    );
    if rel.trim().is_empty() {
        return Err(Refused { message: format!("`{field}` is empty"), label: "no file named", help: beside });
    }
    if Path::new(rel).is_absolute() {
        return Err(Refused {
            message: format!("`{field}` must be relative to the scenario's folder, found the absolute path {rel}"),
            label: "absolute path",
            help: format!("{beside}; copy the file there"),
        });
    }
    let root = dir.canonicalize().map_err(|e| Refused {
        message: format!("cannot open the scenario's folder {shown_dir}: {e}"),
        label: "folder not readable",
        help: beside.clone(),
    })?;
    let joined = dir.join(rel);
    let real = joined.canonicalize().map_err(|e| Refused {
        message: if e.kind() == std::io::ErrorKind::NotFound {
            format!("no local file {}", joined.display())
        } else {
            format!("cannot open the local file {}: {e}", joined.display())
        },
        label: "file not found",
        help: beside.clone(),
    })?;
    if !real.starts_with(&root) {
        let how = if Path::new(rel).components().any(|c| c == std::path::Component::ParentDir) {
            "is"
        } else {
            "leads (through a symbolic link)"
        };
        return Err(Refused {
            message: format!("{rel} {how} outside the scenario's folder {shown_dir}"),
            label: "outside the scenario's folder",
            help: format!("{beside}, and never outside it; copy the file there"),
        });
    }
    if !real.is_file() {
        return Err(Refused {
            message: format!("{} is not a file", joined.display()),
            label: "not a file",
            help: beside,
        });
    }
    Ok(real)
}

/// Both texts in whole under these sizes; beyond, a window around the first difference.
const WHOLE_LINES: usize = 200;
const WHOLE_BYTES: usize = 64 * 1024;
/// The window: lines before the first differing one, and lines from it on.
const BEFORE: usize = 3;
const AFTER: usize = 12;
/// A line of the window is cut after so many characters.
const LINE_CHARS: usize = 400;

/// What differs between the expected bytes (`local`, as written) and those found (`path` in
/// the sandbox): `None` when they are equal.
pub fn compare(expected: &[u8], found: &[u8], local: &str, path: &str) -> Option<(String, Option<Mismatch>)> {
    if expected == found {
        return None;
    }
    let at = expected.iter().zip(found).take_while(|(a, b)| a == b).count();
    let sizes = format!("expected {} bytes, found {}", expected.len(), found.len());
    let head = format!("{path} differs from {local}");
    let (Ok(e), Ok(f)) = (std::str::from_utf8(expected), std::str::from_utf8(found)) else {
        let what = match (expected.get(at), found.get(at)) {
            (Some(a), Some(b)) => format!("first at byte {at}: expected 0x{a:02x}, found 0x{b:02x}"),
            (Some(_), None) => format!("the file found ends after the first {at} bytes"),
            _ => format!("the file found goes on after the expected {at} bytes"),
        };
        return Some((format!("{head} (binary): {what}; {sizes}"), None));
    };
    // Line and column (in characters) of the first difference, counted in the expected text.
    let before = &e[..floor_char(e, at)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    let what = if at == e.len() {
        format!("the file found goes on after the expected text (line {line}, column {col})")
    } else if at == f.len() {
        format!("the file found ends early, at line {line}, column {col}")
    } else {
        format!("first at line {line}, column {col}")
    };
    let small = |s: &str| s.len() <= WHOLE_BYTES && s.lines().count() <= WHOLE_LINES;
    let hint = if small(e) && small(f) { crate::matcher::difference(e, f) } else { None };
    let mut message = format!("{head}: {what}; {sizes}");
    if let Some(h) = &hint {
        message.push_str(&format!(" ({})", h.short));
    }
    let mismatch = if small(e) && small(f) {
        Mismatch::new(e, f)
    } else {
        let from = (line - 1).saturating_sub(BEFORE);
        let window = |s: &str| {
            let mut out = String::new();
            for l in s.split_inclusive('\n').skip(from).take(line - from + AFTER) {
                if l.chars().count() > LINE_CHARS {
                    out.extend(l.chars().take(LINE_CHARS));
                    out.push_str("…\n");
                } else {
                    out.push_str(l);
                }
            }
            out
        };
        message.push_str(&format!("; the diff shows lines {} to {} of each", from + 1, line + AFTER));
        Mismatch::new(window(e), window(f))
    };
    Some((message, Some(mismatch.with_hint(hint.map(|h| h.full)))))
}

/// The largest char boundary of `s` at or before `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_bytes_are_no_difference() {
        assert_eq!(compare(b"a\nb\n", b"a\nb\n", "x", "/p"), None);
    }

    #[test]
    fn text_names_the_line_and_column_and_diffs_the_whole_when_small() {
        let (message, m) =
            compare(b"alpha\nbeta\ngamma\n", b"alpha\nbeta\nGamma\n", "expected/g.txt", "/tmp/g").unwrap();
        assert_eq!(
            message,
            "/tmp/g differs from expected/g.txt: first at line 3, column 1; expected 17 bytes, found 17 (only letter case differs)"
        );
        let m = m.unwrap();
        assert_eq!((m.expected.as_str(), m.actual.as_str()), ("alpha\nbeta\ngamma\n", "alpha\nbeta\nGamma\n"));
        assert!(m.hint.unwrap().contains("character 12"));
    }

    #[test]
    fn a_short_or_long_file_says_where_it_ends() {
        let (message, _) = compare(b"a\nb\n", b"a\n", "e.txt", "/p").unwrap();
        assert!(
            message.contains("the file found ends early, at line 2, column 1; expected 4 bytes, found 2"),
            "{message}"
        );
        let (message, _) = compare(b"a\n", b"a\nb\n", "e.txt", "/p").unwrap();
        assert!(message.contains("goes on after the expected text (line 2, column 1)"), "{message}");
    }

    #[test]
    fn a_large_text_gets_a_window_around_the_first_difference() {
        let e: String = (1..=100_000).map(|i| format!("line {i}\n")).collect();
        let f = e.replace("line 50000\n", "line 5000O\n");
        let (message, m) = compare(e.as_bytes(), f.as_bytes(), "big.txt", "/big").unwrap();
        assert!(message.contains("first at line 50000, column 10"), "{message}");
        assert!(message.contains("the diff shows lines 49997 to 50012 of each"), "{message}");
        let m = m.unwrap();
        assert_eq!(m.expected.lines().count(), 16);
        assert!(m.expected.starts_with("line 49997\n") && m.actual.contains("line 5000O\n"), "{}", m.actual);
    }

    #[test]
    fn binary_gives_the_byte_offset() {
        let (message, m) = compare(&[0, 1, 2, 0xff], &[0, 1, 3, 0xff], "blob.bin", "/b").unwrap();
        assert_eq!(
            message,
            "/b differs from blob.bin (binary): first at byte 2: expected 0x02, found 0x03; expected 4 bytes, found 4"
        );
        assert!(m.is_none());
        let (message, _) = compare(&[0xff, 1], &[0xff], "blob.bin", "/b").unwrap();
        assert!(message.contains("the file found ends after the first 1 bytes"), "{message}");
    }

    #[test]
    fn resolve_keeps_to_the_scenario_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("suite");
        std::fs::create_dir_all(dir.join("expected")).unwrap();
        std::fs::write(dir.join("expected/a.txt"), "a").unwrap();
        std::fs::write(tmp.path().join("secret.txt"), "s").unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret.txt"), dir.join("link.txt")).unwrap();
        assert!(resolve(&dir, "expected/a.txt", "equals_file").is_ok());
        assert!(resolve(&dir, "expected/../expected/a.txt", "equals_file").is_ok());
        let e = resolve(&dir, "../secret.txt", "equals_file").unwrap_err();
        assert_eq!(e.message, format!("../secret.txt is outside the scenario's folder {}", dir.display()));
        let e = resolve(&dir, "link.txt", "equals_file").unwrap_err();
        assert_eq!(
            e.message,
            format!("link.txt leads (through a symbolic link) outside the scenario's folder {}", dir.display())
        );
        let e = resolve(&dir, "/etc/hostname", "equals_file").unwrap_err();
        assert_eq!(e.label, "absolute path");
        let e = resolve(&dir, "expected/b.txt", "equals_file").unwrap_err();
        assert!(e.message.starts_with("no local file ") && e.message.ends_with("expected/b.txt"), "{}", e.message);
        assert_eq!(resolve(&dir, "expected", "equals_file").unwrap_err().label, "not a file");
    }
}

//! 5xx answers say what failed, never where on the host (issue 35 item 8: a 500 named serve's
//! work and state directories, the template folders and the volumes' host paths).
//!
//! Every 5xx answer serve writes (E2B's `{"code","message"}`, OpenSandbox's, a Connect
//! unary error) goes through [`answer`]: each absolute path in its message becomes `<path>`,
//! and the whole message is written to serve's stderr for the operator. One rule at the three
//! places answers are made, rather than a careful message at each of the many places an
//! error is made (the local provider, the image store, builds), which a new one would miss.
//! A path inside a sandbox is cut as well: a 5xx is serve's failure, and its detail is the log's.

use std::borrow::Cow;

/// The message of a `status` answer: for a 5xx, without absolute paths (logged in full).
pub(crate) fn answer(status: u16, message: &str) -> Cow<'_, str> {
    if !(500..600).contains(&status) {
        return Cow::Borrowed(message);
    }
    let scrubbed = without_paths(message);
    if let Cow::Owned(_) = &scrubbed {
        crate::errln!("serve: answered {status} without host paths; the detail: {message}");
    }
    scrubbed
}

/// `message` with every absolute path (a `/` that starts a word and is followed by more than
/// itself) replaced by `<path>`; a path ends at white space, a quote, a bracket, a comma, or a
/// colon before a space (`cannot open /x/y: denied`).
pub(crate) fn without_paths(message: &str) -> Cow<'_, str> {
    let bytes = message.as_bytes();
    let starts_word =
        |i: usize| i == 0 || matches!(bytes[i - 1], b' ' | b'\'' | b'"' | b'`' | b'(' | b'[' | b'=' | b'\t' | b'\n');
    let ends = |i: usize| {
        matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\'' | b'"' | b'`' | b')' | b']' | b',')
            || (bytes[i] == b':' && bytes.get(i + 1).is_none_or(|b| b.is_ascii_whitespace()))
    };
    let mut out = String::new();
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'/' && starts_word(i) && bytes.get(i + 1).is_some_and(|b| *b != b'/') {
            let mut j = i + 1;
            while j < bytes.len() && !ends(j) {
                j += 1;
            }
            // A lone `/` (the root) stays: it names no place of serve's.
            if j > i + 1 {
                out.push_str(&message[copied..i]);
                out.push_str("<path>");
                copied = j;
            }
            i = j;
        } else {
            i += 1;
        }
    }
    if copied == 0 {
        return Cow::Borrowed(message);
    }
    out.push_str(&message[copied..]);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cut_from_server_errors_only() {
        assert_eq!(
            without_paths("cannot create /tmp/scenario-run-serve-1-2/uploads/x: Permission denied (os error 13)"),
            "cannot create <path>: Permission denied (os error 13)"
        );
        assert_eq!(
            without_paths("Volume 'v': could not ensure host path directory exists at '/srv/v/a/b': Not a directory"),
            "Volume 'v': could not ensure host path directory exists at '<path>': Not a directory"
        );
        assert_eq!(
            without_paths("cannot build the official template t from /work/templates/t: `/a b`"),
            "cannot build the official template t from <path>: `<path> b`"
        );
        assert_eq!(without_paths("(path=/var/lib/x)"), "(path=<path>)");
        // URLs, a lone root, and ratios are not paths.
        for same in ["cannot reach http://127.0.0.1:3000/x", "GET / failed", "1/2 done", "no path here"] {
            assert!(matches!(without_paths(same), Cow::Borrowed(_)), "{same}");
        }
        assert_eq!(answer(404, "no /such/file"), "no /such/file");
        assert_eq!(answer(500, "no /such/file"), "no <path>");
        assert_eq!(answer(507, "not enough disk space"), "not enough disk space");
    }
}

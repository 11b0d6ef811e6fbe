//! Secret masking: replaces secret values, and the encoded forms they commonly take in
//! command output and HTTP traffic, with `***` before anything reaches a report.
//!
//! For every secret the [`Masker`] matches, in one Aho-Corasick pass (leftmost-longest):
//!
//! - the value itself (and its whitespace-trimmed form, for values read from files);
//! - base64: standard and URL-safe alphabets, with and without padding;
//! - percent-encoding as the common encoders write it: everything but RFC 3986's unreserved
//!   characters (percent-encoding of a URL component), that keeping `/` (Python's `quote()`), minijinja's
//!   `urlencode` (keeps `/`, encodes `~`), JavaScript's `encodeURIComponent` (keeps
//!   `!'()*`) and HTML forms (keep `*`); `%20` or `+` for spaces; upper- or lower-case hex;
//! - JSON string escaping: as `serde_json` writes it, that applied twice (JSON inside a JSON
//!   string), with `\uXXXX` for every non-ASCII character (Python's `json.dumps`), with
//!   `<`, `>`, `&`, `'` as `\u003c`… (Go's `encoding/json`), and with `\/`;
//! - HTML and XML entities: `&amp;`, `&lt;`, `&gt;`, `&quot;`/`&#34;`, `&#x27;`/`&#39;`/
//!   `&apos;`, and `/` as `&#x2f;` (minijinja's `escape`);
//! - hex of the bytes, lower and upper case;
//! - base32 (RFC 4648, as Python's `b32encode` and coreutils' `base32` write it): padded or
//!   not, upper or lower case, and inside a longer base32 stream (`label:secret`, a TOTP
//!   seed): for each of base32's five byte alignments, the characters whose bits all come from
//!   the secret (a character or two at each end, mixed with the bytes around it, stay);
//! - the value reversed (`rev`), and its characters separated by single spaces
//!   (`sed 's/./& /g'`, Python's `" ".join`): one pattern each, cheap, and seen in the wild.
//!
//! base64 of a secret inside a longer base64 string (HTTP basic auth is
//! `base64("user:" + secret)`, a JWT payload is base64 of JSON) does not contain base64 of
//! the secret as a substring, because base64 works in 3-byte groups; and `base64` and MIME
//! wrap their output at 76 columns, so the encoding of any secret of 57 bytes or more (a
//! typical model-provider key) is broken across lines. A second pass therefore finds runs of
//! base64 characters, joins runs that continue on the next line (a line break, or an escaped
//! `\n` in JSON text, between them, and the next line's indentation), decodes them at each of the four alignments, and masks
//! the runs that hold the encoding of any form of a secret, leaving the line breaks.
//!
//! A secret folded across lines (a terminal or `fold` breaking it, a wrapped log line) is
//! found by a third pass over the text with its line breaks (and escaped `\n`, `\r`, and the
//! indentation of the next line, as a build log has it) taken out; each piece of it is
//! masked, and the line breaks stay.
//!
//! Values shorter than [`MIN_SECRET_LEN`] characters are ignored: masking every `abc` or
//! `1` in a log would destroy it while protecting nothing, since such values are guessable
//! anyway. Not covered: secrets split across separately masked texts, encodings other than
//! these (a secret ROT13'd, gzipped or encrypted is not recognised), encodings of a derived
//! form (base64 of the reversed value), other separators between characters (commas, tabs,
//! two spaces; one character per line is the folded case above), and base32hex or other
//! base32 alphabets.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use aho_corasick::{AhoCorasick, MatchKind};
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;

/// What a masked secret is replaced with.
pub const MASK: &str = "***";

/// Shorter values are not treated as secrets (see the module docs).
pub const MIN_SECRET_LEN: usize = 4;

/// Environment variable names containing one of these (case-insensitive) hold secrets.
pub const SECRET_NAME_PARTS: [&str; 4] = ["KEY", "SECRET", "TOKEN", "PASSWORD"];

/// Masks a fixed set of secret values. Cheap to clone; `Debug` never shows the values.
#[derive(Clone)]
pub struct Masker {
    secrets: usize,
    /// Every form of every secret; `None` when there are no secrets.
    forms: Option<AhoCorasick>,
}

impl fmt::Debug for Masker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Masker").field("secrets", &self.secrets).finish_non_exhaustive()
    }
}

impl Default for Masker {
    fn default() -> Self {
        Self::new(std::iter::empty())
    }
}

impl Masker {
    /// A masker for these values. Values shorter than [`MIN_SECRET_LEN`] characters, leading and
    /// trailing whitespace not counted, are ignored; a value with such whitespace is masked both
    /// as given and trimmed.
    pub fn new(secrets: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = Vec::new();
        for s in secrets {
            let trimmed = s.trim();
            if trimmed.chars().count() < MIN_SECRET_LEN {
                continue;
            }
            if trimmed != s {
                values.push(trimmed.to_string());
            }
            values.push(s);
        }
        values.sort();
        values.dedup();

        let mut forms: Vec<String> = Vec::new();
        for s in &values {
            forms.extend(derived_forms(s));
        }
        forms.retain(|f| f.len() >= MIN_SECRET_LEN);
        forms.sort();
        forms.dedup();

        let automaton = (!forms.is_empty()).then(|| {
            AhoCorasick::builder().match_kind(MatchKind::LeftmostLongest).build(&forms).expect("secret patterns build")
        });
        Masker { secrets: values.len(), forms: automaton }
    }

    /// Every variable whose name contains KEY, SECRET, TOKEN or PASSWORD (any case), and
    /// every variable named in `extra_names`, is a secret.
    pub fn from_env(env: &BTreeMap<String, String>, extra_names: &[String]) -> Self {
        Self::new(
            env.iter()
                .filter(|(name, _)| {
                    let upper = name.to_ascii_uppercase();
                    SECRET_NAME_PARTS.iter().any(|p| upper.contains(p)) || extra_names.contains(name)
                })
                .map(|(_, value)| value.clone()),
        )
    }

    /// Number of distinct secret values being masked.
    pub fn len(&self) -> usize {
        self.secrets
    }

    pub fn is_empty(&self) -> bool {
        self.secrets == 0
    }

    /// `text` with every secret, and every derived form, replaced by [`MASK`]. Borrowed when
    /// nothing needed masking.
    pub fn mask<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(ac) = &self.forms else { return Cow::Borrowed(text) };
        // Whole base64 runs first, so a run with a secret inside is masked entirely rather
        // than around a directly matched, aligned base64 fragment.
        let mut out = match mask_base64_runs(ac, text) {
            Some(masked) => Cow::Owned(masked),
            None => Cow::Borrowed(text),
        };
        if ac.is_match(out.as_ref()) {
            let mut dst = String::with_capacity(out.len());
            ac.replace_all_with(&out, &mut dst, |_, _, dst| {
                dst.push_str(MASK);
                true
            });
            out = Cow::Owned(dst);
        }
        if let Some(unfolded) = mask_folded(ac, &out) {
            out = Cow::Owned(unfolded);
        }
        out
    }

    /// Mask every string in `v`, object keys included.
    pub fn mask_json(&self, v: &mut serde_json::Value) {
        use serde_json::Value;
        if self.is_empty() {
            return;
        }
        match v {
            Value::String(s) => {
                if let Cow::Owned(m) = self.mask(s) {
                    *s = m;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.mask_json(item)),
            Value::Object(map) => {
                let old = std::mem::take(map);
                for (key, mut value) in old {
                    self.mask_json(&mut value);
                    map.insert(self.mask(&key).into_owned(), value);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

/// The base64 alphabets' union, by byte: `+` and `-` are 62, `/` and `_` are 63, so one
/// decoder reads the standard and the URL-safe alphabet alike, and a run mixing them still
/// decodes; [`NOT_B64`] for every other byte. A table: this runs over every byte of every
/// output, megabytes of base64 included.
const B64: [u8; 256] = {
    let mut t = [NOT_B64; 256];
    let mut i = 0;
    while i < 26 {
        t[b'A' as usize + i] = i as u8;
        t[b'a' as usize + i] = 26 + i as u8;
        i += 1;
    }
    let mut d = 0;
    while d < 10 {
        t[b'0' as usize + d] = 52 + d as u8;
        d += 1;
    }
    t[b'+' as usize] = 62;
    t[b'-' as usize] = 62;
    t[b'/' as usize] = 63;
    t[b'_' as usize] = 63;
    t
};
const NOT_B64: u8 = 0xff;

fn is_b64(c: u8) -> bool {
    B64[usize::from(c)] != NOT_B64
}

/// Decode base64 characters (all valid, no padding), dropping a partial last group's bits.
fn b64_decode(chars: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chars.len() / 4 * 3 + 2);
    let v = |c: u8| u32::from(B64[usize::from(c)] & 0x3f);
    let mut quads = chars.chunks_exact(4);
    for q in &mut quads {
        let n = v(q[0]) << 18 | v(q[1]) << 12 | v(q[2]) << 6 | v(q[3]);
        out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8]);
    }
    let rest = quads.remainder();
    if !rest.is_empty() {
        let n = rest.iter().fold(0u32, |acc, c| acc << 6 | v(*c)) << (6 * (4 - rest.len()));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..(rest.len() * 6 / 8)]);
    }
    out
}

/// A run of base64 characters in a text, with `=` padding after it (`end` is past it).
#[derive(Debug, Clone, Copy)]
struct Run {
    start: usize,
    /// End of the base64 characters.
    data_end: usize,
    end: usize,
}

/// Runs of base64 characters. The letter of an escape (`\n`, `\r`, `\t` in JSON text) is not
/// part of a run, so a mask next to an escaped newline keeps its `n`.
fn base64_runs(text: &[u8]) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let escaped = i > 0 && text[i - 1] == b'\\' && matches!(text[i], b'n' | b'r' | b't');
        if escaped || !is_b64(text[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < text.len() && is_b64(text[i]) {
            i += 1;
        }
        let data_end = i;
        while i < text.len() && i - data_end < 2 && text[i] == b'=' {
            i += 1;
        }
        runs.push(Run { start, data_end, end: i });
    }
    runs
}

/// A line break between two runs that continue each other: a newline, CRLF, or their JSON
/// escapes, and the next line's indentation (a build log indents what a step prints).
fn is_line_break(gap: &[u8]) -> bool {
    let indent = gap.iter().rev().take_while(|b| matches!(b, b' ' | b'\t')).count();
    matches!(&gap[..gap.len() - indent], b"\n" | b"\r\n" | b"\\n" | b"\\r\\n")
}

/// Bytes of a line break at the start of `rest`, with the next line's indentation; 0 if
/// `rest` does not start with one.
fn line_break_width(rest: &[u8]) -> usize {
    let brk = match rest {
        [b'\n', ..] | [b'\r', ..] => 1,
        [b'\\', b'n' | b'r', ..] => 2,
        _ => return 0,
    };
    let ends_line = matches!(rest[..brk], [b'\n'] | [b'\\', b'n']);
    let indent = if ends_line { rest[brk..].iter().take_while(|b| matches!(b, b' ' | b'\t')).count() } else { 0 };
    brk + indent
}

/// The second pass (see the module docs): runs, joined across line breaks, whose decoding
/// holds a form of a secret are replaced by [`MASK`]; `None` when none is.
fn mask_base64_runs(ac: &AhoCorasick, text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let runs = base64_runs(bytes);
    let mut doomed = vec![false; runs.len()];
    let mut first = 0;
    while first < runs.len() {
        // A group: runs that continue on the next line; padding ends one.
        let mut last = first;
        while last + 1 < runs.len()
            && runs[last].end == runs[last].data_end
            && is_line_break(&bytes[runs[last].end..runs[last + 1].start])
        {
            last += 1;
        }
        let mut joined = Vec::new();
        let mut offsets = Vec::with_capacity(last - first + 1);
        for r in &runs[first..=last] {
            offsets.push(joined.len());
            joined.extend_from_slice(&bytes[r.start..r.data_end]);
        }
        if joined.len() >= 8 {
            for skip in 0..4.min(joined.len()) {
                let decoded = b64_decode(&joined[skip..]);
                for m in ac.find_iter(decoded.as_slice()) {
                    // The characters that hold the match's bits (6 bits each), and their runs.
                    let from = skip + m.start() * 8 / 6;
                    let to = (skip + (m.end() * 8 - 1) / 6 + 1).min(joined.len());
                    for (k, off) in offsets.iter().enumerate() {
                        let r = &runs[first + k];
                        let len = r.data_end - r.start;
                        if *off < to && off + len > from {
                            doomed[first + k] = true;
                        }
                    }
                }
            }
        }
        first = last + 1;
    }
    if !doomed.contains(&true) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (r, _) in runs.iter().zip(&doomed).filter(|(_, d)| **d) {
        out.push_str(&text[last..r.start]);
        out.push_str(MASK);
        last = r.end;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// The third pass: forms of secrets broken across lines. The text is searched with its line
/// breaks (and escaped `\n`, `\r`, and the indentation after them) taken out; each piece of a match that spans one is
/// replaced by [`MASK`], and the line breaks stay. `None` when there is no such match.
fn mask_folded(ac: &AhoCorasick, text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    if !bytes.iter().any(|b| matches!(b, b'\n' | b'\r')) && !text.contains("\\n") && !text.contains("\\r") {
        return None;
    }
    // The text without breaks, and where each removed stretch was: (index in `kept` where
    // it was, original bytes removed so far including it).
    let mut kept = Vec::with_capacity(bytes.len());
    let mut breaks: Vec<(usize, usize)> = Vec::new();
    let mut removed = 0;
    let mut i = 0;
    while i < bytes.len() {
        let width = line_break_width(&bytes[i..]);
        if width == 0 {
            kept.push(bytes[i]);
            i += 1;
            continue;
        }
        removed += width;
        match breaks.last_mut() {
            Some((at, total)) if *at == kept.len() => *total = removed,
            _ => breaks.push((kept.len(), removed)),
        }
        i += width;
    }
    // Original offset of the byte at `k` in `kept`.
    let original = |k: usize| -> usize {
        let n = breaks.partition_point(|(at, _)| *at <= k);
        k + if n == 0 { 0 } else { breaks[n - 1].1 }
    };
    let mut pieces: Vec<(usize, usize)> = Vec::new();
    for m in ac.find_iter(kept.as_slice()) {
        let (start, end) = (original(m.start()), original(m.end() - 1) + 1);
        if end - start == m.len() {
            continue; // not folded: the direct pass saw it
        }
        // Split at the breaks inside the match.
        let mut piece_start = m.start();
        let first_break = breaks.partition_point(|(at, _)| *at <= m.start());
        for (at, _) in breaks[first_break..].iter().take_while(|(at, _)| *at < m.end()) {
            pieces.push((original(piece_start), original(at - 1) + 1));
            piece_start = *at;
        }
        pieces.push((original(piece_start), end));
    }
    if pieces.is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (start, end) in pieces {
        out.push_str(&text[last..start]);
        out.push_str(MASK);
        last = end;
    }
    out.push_str(&text[last..]);
    Some(out)
}

/// Percent-encoding of `s`, keeping ASCII alphanumerics and the bytes in `keep`.
fn percent(s: &str, keep: &[u8], plus_for_space: bool, lower: bool) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            out.push(b as char);
        } else if b == b' ' && plus_for_space {
            out.push('+');
        } else if lower {
            out.push_str(&format!("%{b:02x}"));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How a JSON encoder escapes a string (without the quotes).
#[derive(Clone, Copy)]
struct JsonStyle {
    /// `\uXXXX` for every non-ASCII character: Some(lower-case hex?).
    ascii: Option<bool>,
    /// `<`, `>`, `&`, `'` as `\u003c`, `\u003e`, `\u0026`, `\u0027` (Go, HTML-safe encoders).
    html: bool,
    /// `/` as `\/`.
    slash: bool,
}

fn json_escape(s: &str, style: JsonStyle) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    let lower = style.ascii.unwrap_or(true);
    let u = |out: &mut String, unit: u32| {
        if lower {
            out.push_str(&format!("\\u{unit:04x}"));
        } else {
            out.push_str(&format!("\\u{unit:04X}"));
        }
    };
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '/' if style.slash => out.push_str("\\/"),
            '<' | '>' | '&' | '\'' if style.html => u(&mut out, c as u32),
            c if (c as u32) < 0x20 => u(&mut out, c as u32),
            c if !c.is_ascii() && style.ascii.is_some() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    u(&mut out, u32::from(*unit));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// HTML/XML entity escaping of `s`: `&`, `<`, `>` always; `"`, `'` and `/` as given
/// (`None`: left as they are).
fn html_escape(s: &str, quote: Option<&str>, apostrophe: Option<&str>, slash: Option<&str>) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match (c, quote, apostrophe, slash) {
            ('&', ..) => out.push_str("&amp;"),
            ('<', ..) => out.push_str("&lt;"),
            ('>', ..) => out.push_str("&gt;"),
            ('"', Some(q), _, _) => out.push_str(q),
            ('\'', _, Some(a), _) => out.push_str(a),
            ('/', _, _, Some(sl)) => out.push_str(sl),
            (c, ..) => out.push(c),
        }
    }
    out
}

/// The forms one secret can take; see the module docs.
fn derived_forms(s: &str) -> Vec<String> {
    let mut forms = vec![s.to_string()];
    for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
        forms.push(engine.encode(s));
    }
    // Percent-encoders differ in what they leave alone (see the module docs).
    let keep_sets: [&[u8]; 5] = [b"-_.~", b"-_.~/", b"-_./", b"-_.!~*'()", b"-_.*"];
    for keep in keep_sets {
        for plus in [false, true] {
            for lower in [false, true] {
                forms.push(percent(s, keep, plus, lower));
            }
        }
    }
    for ascii in [None, Some(true), Some(false)] {
        for html in [false, true] {
            for slash in [false, true] {
                forms.push(json_escape(s, JsonStyle { ascii, html, slash }));
            }
        }
    }
    let json = json_escape(s, JsonStyle { ascii: None, html: false, slash: false });
    forms.push(json_escape(&json, JsonStyle { ascii: None, html: false, slash: false }));
    for quote in [None, Some("&quot;"), Some("&#34;")] {
        for apostrophe in [None, Some("&#x27;"), Some("&#39;"), Some("&apos;")] {
            for slash in [None, Some("&#x2f;")] {
                forms.push(html_escape(s, quote, apostrophe, slash));
            }
        }
    }
    let hex = hex::encode(s);
    forms.push(hex.to_ascii_uppercase());
    forms.push(hex);
    // base32 (RFC 4648): padded or not, upper or lower case, and inside a longer stream.
    let b32 = base32(s.as_bytes());
    for form in [b32.clone(), b32.trim_end_matches('=').to_string()] {
        forms.push(form.to_ascii_lowercase());
        forms.push(form);
    }
    for core in base32_cores(s.as_bytes()) {
        forms.push(core.to_ascii_lowercase());
        forms.push(core);
    }
    // Reversed (`rev`), and one character at a time with a space between (`sed 's/./& /g'`).
    forms.push(s.chars().rev().collect());
    forms.push(s.chars().map(String::from).collect::<Vec<_>>().join(" "));
    forms
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// RFC 4648 base32, upper case, padded with `=` to a multiple of 8.
fn base32(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(5) * 8);
    for group in data.chunks(5) {
        let mut block = [0u8; 5];
        block[..group.len()].copy_from_slice(group);
        let n = block.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b));
        let chars = (group.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < chars {
                out.push(BASE32[((n >> (35 - 5 * i)) & 31) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// base32 works in 5-byte groups, so a secret after other bytes (`label:secret`, a TOTP URI's
/// seed) is encoded differently at each of the five alignments. For each, the characters
/// whose 5 bits all come from the secret: what that encoding holds whatever is around it.
fn base32_cores(data: &[u8]) -> Vec<String> {
    (0..5)
        .filter_map(|offset| {
            let mut padded = vec![0u8; offset];
            padded.extend_from_slice(data);
            let enc = base32(&padded);
            let (from, to) = (8 * offset, 8 * (offset + data.len()));
            let first = from.div_ceil(5);
            let end = to / 5; // characters [first, end) lie wholly inside the secret's bits
            enc.get(first..end).map(str::to_string)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const SECRET: &str = "s3cr3t p@ss/wörd~+\"x\"\\";

    fn masker() -> Masker {
        Masker::new([SECRET.to_string(), "tok_ABCDEF123456".to_string()])
    }

    fn assert_masked(m: &Masker, text: &str) -> String {
        let out = m.mask(text).into_owned();
        assert!(out.contains(MASK), "not masked: {text:?} -> {out:?}");
        out
    }

    #[test]
    fn raw_value_every_occurrence() {
        let m = masker();
        let text = format!("a {SECRET} b {SECRET}c tok_ABCDEF123456");
        assert_eq!(m.mask(&text), "a *** b ***c ***");
    }

    #[test]
    fn longest_secret_wins_when_one_contains_another() {
        let m = Masker::new(["abcd".to_string(), "abcdefgh".to_string()]);
        assert_eq!(m.mask("x abcdefgh y abcd"), "x *** y ***");
    }

    #[test]
    fn base64_all_four_forms() {
        let m = masker();
        for engine in [&STANDARD, &STANDARD_NO_PAD, &URL_SAFE, &URL_SAFE_NO_PAD] {
            let enc = engine.encode(SECRET);
            let out = assert_masked(&m, &format!("value: {enc} end"));
            assert_eq!(out, "value: *** end", "{enc}");
        }
        // The standard and URL-safe encodings of this secret really differ.
        assert_ne!(STANDARD.encode(SECRET), URL_SAFE.encode(SECRET));
    }

    #[test]
    fn base64_embedded_in_a_longer_token_basic_auth() {
        let m = masker();
        for user in ["u", "us", "user", "admin:"] {
            let token = STANDARD.encode(format!("{user}:{SECRET}"));
            let header = format!("Authorization: Basic {token}\r\nHost: x");
            assert_eq!(m.mask(&header), "Authorization: Basic ***\r\nHost: x", "{user}");
        }
    }

    #[test]
    fn base64_in_jwt_payload() {
        let m = masker();
        let payload = URL_SAFE_NO_PAD.encode(json!({"sub": "me", "key": "tok_ABCDEF123456"}).to_string());
        let jwt = format!("eyJhbGciOiJIUzI1NiJ9.{payload}.c2lnbmF0dXJl");
        assert_eq!(m.mask(&jwt), "eyJhbGciOiJIUzI1NiJ9.***.c2lnbmF0dXJl");
    }

    #[test]
    fn url_encoded_forms() {
        let m = masker();
        let pct = crate::net::url_encode(SECRET);
        assert!(pct.contains("%20") && pct.contains("%2F"), "{pct}");
        assert_eq!(m.mask(&format!("GET /?p={pct}&x=1")), "GET /?p=***&x=1");
        let plus = pct.replace("%20", "+");
        assert_eq!(m.mask(&format!("p={plus}&x=1")), "p=***&x=1");
        let lower = percent(SECRET, b"-_.~", false, true);
        assert_ne!(lower, pct);
        assert_eq!(m.mask(&format!("p={lower}")), "p=***");
    }

    #[test]
    fn json_escaped_forms() {
        let m = masker();
        let body = json!({"password": SECRET}).to_string();
        assert!(!body.contains(SECRET), "escaping changes the value: {body}");
        assert_eq!(m.mask(&body), r#"{"password":"***"}"#);
        let nested = json!({"body": body}).to_string();
        assert_eq!(m.mask(&nested), r#"{"body":"{\"password\":\"***\"}"}"#);
    }

    #[test]
    fn hex_forms() {
        let m = masker();
        let hex: String = "tok_ABCDEF123456".bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(m.mask(&format!("0x{hex}")), "0x***");
        assert_eq!(m.mask(&hex.to_uppercase()), "***");
    }

    #[test]
    fn other_text_is_untouched_and_borrowed() {
        let m = masker();
        let text = "configuration Authorization: Basic dXNlcjpvdGhlcg== s3cr3t p@ss \u{1b}[31m {}";
        assert!(matches!(m.mask(text), Cow::Borrowed(t) if t == text));
        assert!(matches!(Masker::default().mask(SECRET), Cow::Borrowed(_)));
    }

    #[test]
    fn short_values_are_ignored() {
        let m = Masker::new(["abc".to_string(), "1".to_string(), String::new(), "   ab  ".to_string()]);
        assert!(m.is_empty());
        assert_eq!(m.mask("abc 1 ab"), "abc 1 ab");
        // Multibyte: four characters count even if the bytes are more.
        let m = Masker::new(["äöüß".to_string()]);
        assert_eq!(m.len(), 1);
        assert_eq!(m.mask("x äöüß"), "x ***");
    }

    #[test]
    fn trimmed_value_also_masked() {
        let m = Masker::new(["hunter22\n".to_string()]);
        assert_eq!(m.mask("pw=hunter22;"), "pw=***;");
    }

    #[test]
    fn from_env_picks_secret_names() {
        let env: BTreeMap<String, String> = [
            ("E2B_API_KEY", "e2b_0123456789"),
            ("github_token", "ghp_abcdefghij"),
            ("DB_PASSWORD", "correct horse"),
            ("MySecret", "shhh-quiet"),
            ("DEPLOY_URL", "https://internal.example"),
            ("HOME", "/home/user"),
            ("SHORT_TOKEN", "abc"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = Masker::from_env(&env, &["DEPLOY_URL".to_string()]);
        assert_eq!(m.len(), 5);
        let text = "e2b_0123456789 ghp_abcdefghij correct horse shhh-quiet https://internal.example /home/user abc";
        assert_eq!(m.mask(text), "*** *** *** *** *** /home/user abc");
    }

    #[test]
    fn mask_json_values_and_keys() {
        let m = masker();
        let mut v = json!({
            "stdout": format!("token {SECRET}\n"),
            "tok_ABCDEF123456": [1, "x", {"deep": ["tok_ABCDEF123456"]}],
            "n": 3,
        });
        m.mask_json(&mut v);
        assert_eq!(v, json!({"stdout": "token ***\n", "***": [1, "x", {"deep": ["***"]}], "n": 3}));
        // Key order is kept.
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["stdout", "***", "n"]);
    }

    /// Issue 13: forms that leaked. A key of 57 bytes or more is a typical model-provider key.
    const LONG_KEY: &str = "sk-proj-Zq3vT9xLm2Rk8WpY4nHc6JdF1sAe7UgB5oKi0VlNtQrXyMbCwEzDhGjP-u_8";

    fn long() -> Masker {
        Masker::new([LONG_KEY.to_string(), SECRET.to_string()])
    }

    /// `base64`, Python's `base64.encodebytes` and MIME wrap at 76 columns.
    fn wrapped(b64: &str, width: usize, sep: &str) -> String {
        b64.as_bytes().chunks(width).map(|c| std::str::from_utf8(c).unwrap()).collect::<Vec<_>>().join(sep)
    }

    #[test]
    fn base64_wrapped_at_76_columns() {
        assert!(LONG_KEY.len() >= 57);
        let m = long();
        for secret in [LONG_KEY, SECRET] {
            let b64 = STANDARD.encode(format!("{secret}\n"));
            for sep in ["\n", "\r\n", "\\n"] {
                let text = format!("before\n{}{sep}after", wrapped(&b64, 76, sep));
                let out = m.mask(&text).into_owned();
                for line in wrapped(&b64, 76, "\n").lines() {
                    assert!(!out.contains(line), "{sep:?}: {line} in {out}");
                }
                assert!(out.starts_with("before\n***") && out.ends_with(&format!("***{sep}after")), "{out}");
                assert_eq!(out.matches(sep).count(), text.matches(sep).count(), "line breaks stay: {out}");
            }
        }
        // Inside basic auth, wrapped, and with the other alphabet.
        let token = URL_SAFE.encode(format!("user:{LONG_KEY}"));
        let out = m.mask(&wrapped(&token, 20, "\n")).into_owned();
        assert!(out.split('\n').all(|l| l == "***"), "{out}");
    }

    /// RFC 4648 base32, written here independently of the masker's encoder (Python's
    /// `base64.b32encode`, coreutils' `base32`).
    fn b32(data: &[u8]) -> String {
        const A: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
        let bits: Vec<u8> = data.iter().flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1)).collect();
        let mut out: String = bits
            .chunks(5)
            .map(|c| A[c.iter().chain(std::iter::repeat(&0)).take(5).fold(0, |n, b| n << 1 | *b as usize)] as char)
            .collect();
        while !out.len().is_multiple_of(8) {
            out.push('=');
        }
        out
    }

    /// Issue 23 item 13: base32 of a secret reached the reports. Padded or not, upper or lower
    /// case, alone, after any number of other bytes (a TOTP-style `label:secret`), and wrapped
    /// at 76 columns as coreutils' `base32` writes it.
    #[test]
    fn base32_of_a_secret_in_every_case_and_alignment() {
        let m = long();
        assert_eq!(b32(b"foobar"), "MZXW6YTBOI======", "RFC 4648's test vector");
        for secret in [LONG_KEY, SECRET, "abcd"] {
            let m = Masker::new([secret.to_string(), LONG_KEY.to_string()]);
            let enc = b32(secret.as_bytes());
            for form in [
                enc.clone(),
                enc.trim_end_matches('=').to_string(),
                enc.to_lowercase(),
                enc.trim_end_matches('=').to_lowercase(),
            ] {
                assert_eq!(m.mask(&format!("v: {form} end")), "v: *** end", "{secret}: {form}");
            }
            for prefix in ["", "u", "us", "use", "user", "user:", "longer prefix:"] {
                for suffix in ["", "\n", "!tail"] {
                    let enc = b32(format!("{prefix}{secret}{suffix}").as_bytes());
                    for form in [enc.clone(), enc.to_lowercase()] {
                        let out = m.mask(&form).into_owned();
                        let plain: String = secret.chars().take(6).collect();
                        assert!(out.contains(MASK), "{prefix:?}+{secret}+{suffix:?}: {form} -> {out}");
                        // What is left is at most a few characters at each end.
                        assert!(out.len() <= MASK.len() + 2 * 3 + (prefix.len() + suffix.len()) * 8 / 5 + 8, "{out}");
                        assert!(!out.contains(&plain), "{out}");
                    }
                }
            }
        }
        let enc = b32(LONG_KEY.as_bytes());
        let text = format!("before\n{}\nafter", wrapped(&enc, 76, "\n"));
        let out = m.mask(&text).into_owned();
        assert!(out.starts_with("before\n***") && out.ends_with("***\nafter"), "{out}");
        assert!(!out.contains(&enc[..20]) && !out.contains(&enc[enc.len() - 20..]), "{out}");
    }

    /// Decided in issue 23 item 13: the value reversed (`rev`) and its characters spaced out
    /// (`sed 's/./& /g'`, `" ".join(v)`) are masked too; each is one more pattern per secret.
    #[test]
    fn reversed_and_char_spaced_secrets() {
        let m = long();
        let reversed: String = LONG_KEY.chars().rev().collect();
        assert_eq!(m.mask(&format!("rev: {reversed}\n")), "rev: ***\n");
        let spaced: Vec<String> = LONG_KEY.chars().map(String::from).collect();
        assert_eq!(m.mask(&format!("x {} y", spaced.join(" "))), "x *** y");
        let spaced: Vec<String> = SECRET.chars().map(String::from).collect();
        assert_eq!(m.mask(&spaced.join(" ")), "***");
    }

    #[test]
    fn url_encoding_that_keeps_slashes_and_other_sets() {
        let m = masker();
        let minijinja = crate::expr::env().render_str("{{ s | urlencode }}", minijinja::context! { s => SECRET });
        let minijinja = minijinja.unwrap();
        assert!(minijinja.contains('/'), "{minijinja}");
        let python_quote = percent(SECRET, b"-_.~/", false, false);
        let js = percent(SECRET, b"-_.!~*'()", false, false);
        for form in [minijinja, python_quote, js] {
            assert_eq!(m.mask(&format!("GET /x?p={form}&q=1")), "GET /x?p=***&q=1", "{form}");
        }
    }

    #[test]
    fn html_entities() {
        let m = Masker::new(["p&ss<w>\"o'rd/x".to_string()]);
        for form in [
            "p&amp;ss&lt;w&gt;&quot;o&#x27;rd/x",
            "p&amp;ss&lt;w&gt;&#34;o&#39;rd/x",
            "p&amp;ss&lt;w&gt;&quot;o&apos;rd/x",
            "p&amp;ss&lt;w&gt;&quot;o&#x27;rd&#x2f;x",
            "p&amp;ss&lt;w&gt;\"o'rd/x",
        ] {
            assert_eq!(m.mask(&format!("<td>{form}</td>")), "<td>***</td>", "{form}");
        }
        let minijinja =
            crate::expr::env().render_str("{{ s | escape }}", minijinja::context! { s => "p&ss<w>\"o'rd/x" }).unwrap();
        assert_eq!(m.mask(&minijinja), "***", "{minijinja}");
    }

    #[test]
    fn json_unicode_escapes() {
        let m = masker();
        // Python's json.dumps (ensure_ascii): "wörd" -> "w\u00f6rd".
        let python = json_escape(SECRET, JsonStyle { ascii: Some(true), html: false, slash: false });
        assert!(python.contains("\\u00f6"), "{python}");
        let upper = json_escape(SECRET, JsonStyle { ascii: Some(false), html: false, slash: false });
        let go = json_escape("a<b>&c'dé", JsonStyle { ascii: None, html: true, slash: false });
        assert_eq!(go, "a\\u003cb\\u003e\\u0026c\\u0027dé");
        let php = json_escape(SECRET, JsonStyle { ascii: Some(true), html: false, slash: true });
        for form in [python, upper, php] {
            assert_eq!(m.mask(&format!("{{\"k\": \"{form}\"}}")), "{\"k\": \"***\"}", "{form}");
        }
        let m = Masker::new(["a<b>&c'dé".to_string()]);
        assert_eq!(m.mask(&format!("\"{go}\"")), "\"***\"");
    }

    #[test]
    fn a_secret_folded_across_lines() {
        let m = long();
        for width in [1, 7, 20, 40] {
            for sep in ["\n", "\r\n", "\\n"] {
                let folded = wrapped(LONG_KEY, width, sep);
                let out = m.mask(&format!("key:\n{folded}\ndone")).into_owned();
                assert!(!out.replace(sep, "").contains("Zq3vT9xLm2Rk"), "{width} {sep:?}: {out}");
                assert_eq!(out.matches(sep).count(), format!("key:\n{folded}\ndone").matches(sep).count());
                assert!(out.starts_with("key:\n***") && out.ends_with("***\ndone"), "{out}");
            }
        }
        // Folded and encoded: hex across lines.
        let hex: String = LONG_KEY.bytes().map(|b| format!("{b:02x}")).collect();
        let out = m.mask(&wrapped(&hex, 32, "\n")).into_owned();
        assert!(out.lines().all(|l| l == "***"), "{out}");
    }

    #[test]
    fn escaped_newlines_next_to_a_mask_keep_their_n() {
        let m = long();
        let b64 = STANDARD.encode(LONG_KEY);
        // JSON text of a command's output: the token sits between escaped newlines.
        let text = format!("{{\"stdout\": \"x\\n{b64}\\ny\"}}");
        assert_eq!(m.mask(&text), "{\"stdout\": \"x\\n***\\ny\"}");
        let text = format!("line\\n{LONG_KEY}\\nnext");
        assert_eq!(m.mask(&text), "line\\n***\\nnext");
        let text = format!("\\n{}", wrapped(LONG_KEY, 30, "\\n"));
        assert_eq!(m.mask(&text), "\\n***\\n***\\n***");
    }

    /// Found by the canaries: a build log indents what a RUN step prints.
    #[test]
    fn indented_wrapped_and_folded_forms() {
        let m = long();
        let b64 = STANDARD.encode(LONG_KEY);
        let log = format!("#4 RUN x\n  {}\n  {}\nbuilt\n", wrapped(&b64, 76, "\n  "), wrapped(LONG_KEY, 12, "\n  "));
        let out = m.mask(&log).into_owned();
        assert!(!out.contains("sk-proj") && !out.contains(&b64[..20]), "{out}");
        assert!(out.starts_with("#4 RUN x\n  ***\n  ***\n  ***\n") && out.ends_with("  ***\nbuilt\n"), "{out}");
    }

    #[test]
    fn a_word_on_the_line_after_a_token_stays() {
        let m = long();
        let text = format!("K b64url: {}\nK mime:\n", URL_SAFE_NO_PAD.encode(LONG_KEY));
        assert_eq!(m.mask(&text), "K b64url: ***\nK mime:\n");
    }

    #[test]
    fn unrelated_lines_beside_a_wrapped_secret_stay() {
        let m = long();
        let b64 = STANDARD.encode(LONG_KEY);
        let text = format!("hello\nworld\n{}\nthe-end\n", wrapped(&b64, 76, "\n"));
        let out = m.mask(&text).into_owned();
        assert!(out.starts_with("hello\nworld\n***\n***\n"), "{out}");
        assert!(out.ends_with("the-end\n"), "{out}");
    }

    #[test]
    fn debug_does_not_leak() {
        let text = format!("{:?}", masker());
        assert_eq!(text, "Masker { secrets: 2, .. }");
    }

    #[test]
    fn megabytes_of_output() {
        let m = masker();
        let line = "lorem ipsum dolor sit amet configuration 0123456789abcdef QmFzZTY0IG5vaXNl\n";
        let mut text = line.repeat(40_000); // ~3 MB
        text.push_str(&format!("Basic {}\n", STANDARD.encode(format!("u:{SECRET}"))));
        text.push_str("tok_ABCDEF123456\n");
        let start = std::time::Instant::now();
        let out = m.mask(&text);
        let elapsed = start.elapsed();
        assert!(out.ends_with("Basic ***\n***\n"));
        let noise = line.len() * 40_000;
        assert_eq!(out[..noise], text[..noise]);
        // Generous, so debug builds on slow machines pass; a quadratic algorithm would not.
        assert!(elapsed.as_secs() < 20, "{elapsed:?}");
    }
}

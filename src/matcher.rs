//! The one matcher vocabulary for stdout, stderr, files and HTTP bodies (§3 of the language).
//!
//! A matcher is a mapping; several keys in one mapping must all hold. Matchers are validated
//! statically from the spanned tree ([`validate`]) and built at run time from the rendered
//! arguments ([`Matcher::from_json`]), since their values may be templates.

use regex::Regex;
use serde_json::Value as JsonValue;

use crate::diag::{did_you_mean, Diagnostic, Source};
use crate::results::Mismatch;
use crate::yaml::{Node, Value};

pub const KEYS: &[(&str, &str)] = &[
    ("equals", "the whole value equals this (strings compare exactly, including newlines)"),
    ("contains", "the text contains this substring"),
    ("not_contains", "the text does not contain this substring"),
    ("matches", "the text matches this regular expression (Rust regex syntax; anywhere unless anchored)"),
    ("starts_with", "the text starts with this"),
    ("ends_with", "the text ends with this"),
    ("empty", "true: the text is empty; false: it is not"),
    ("lines", "a count of lines, or the exact list of lines"),
    ("length", "the length in characters"),
    ("json", "parse the text as JSON and check paths: [{ path: \"$.a.b\", equals: 1 }]"),
    ("not", "the inner matcher must fail"),
    ("all", "every matcher in the list holds"),
    ("any", "at least one matcher in the list holds"),
];

/// Keys allowed beside `path` in a `json:` entry.
const JSON_ENTRY_EXTRA: &[&str] = &["path", "exists"];

#[derive(Debug, Clone)]
pub enum Clause {
    Equals(JsonValue),
    Contains(String),
    NotContains(String),
    Matches(Regex),
    StartsWith(String),
    EndsWith(String),
    Empty(bool),
    LineCount(usize),
    Lines(Vec<String>),
    Length(usize),
    Json(Vec<JsonCheck>),
    Not(Box<Matcher>),
    All(Vec<Matcher>),
    Any(Vec<Matcher>),
}

#[derive(Debug, Clone)]
pub struct JsonCheck {
    pub path: String,
    pub exists: Option<bool>,
    pub matcher: Option<Matcher>,
}

#[derive(Debug, Clone)]
pub struct Matcher(pub Vec<Clause>);

/// Why a matcher did not hold.
///
/// Every message follows one convention: `expected <what was expected>, found <what was
/// found>`, then in parentheses a short hint when the two differ only in a way that is hard
/// to see (a trailing newline, line endings, letter case, whitespace). The [`Mismatch`]
/// carries both sides and the full hint for the expected/found block below the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct MatchFailure {
    pub message: String,
    pub mismatch: Option<Mismatch>,
}

/// A difference that is hard to see: `short` goes into the one-line message, `full` (what
/// differs and how to write the expectation) under the expected/found block.
#[derive(Debug, Clone, PartialEq)]
pub struct Hint {
    pub short: String,
    pub full: String,
}

fn failure(message: String, hint: Option<&Hint>, mismatch: Option<Mismatch>) -> MatchFailure {
    let message = match hint {
        Some(h) => format!("{message} ({})", h.short),
        None => message,
    };
    MatchFailure { message, mismatch: mismatch.map(|m| m.with_hint(hint.map(|h| h.full.clone()))) }
}

fn text_of(v: &JsonValue) -> String {
    match v {
        JsonValue::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A value as shown in a message: strings quoted with escapes visible (`"hi\n"`), cut at 200
/// characters; other JSON as JSON (`3`, `[1,2]`).
fn shown(v: &JsonValue) -> String {
    match v {
        JsonValue::String(s) => short(s),
        other => short_raw(&other.to_string()),
    }
}

fn short(s: &str) -> String {
    format!("{:?}", cut(s))
}

fn short_raw(s: &str) -> String {
    cut(s)
}

fn cut(s: &str) -> String {
    let mut t: String = s.chars().take(200).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

/// One character for a hint: quoted with escapes, or `the end of the text`.
fn char_at(s: &str, i: usize) -> String {
    s.chars().nth(i).map_or_else(|| "the end of the text".to_string(), |c| format!("{:?}", c.to_string()))
}

fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

/// Why two texts that should be equal are not, when the reason is hard to see: only a
/// trailing newline, only line endings, only letter case or only whitespace differs, or a
/// few of these at once ("only letter case and a trailing newline differ").
pub fn difference(expected: &str, found: &str) -> Option<Hint> {
    if expected == found {
        return None;
    }
    if let Some(h) = one_difference(expected, found) {
        return Some(h);
    }
    type Norm = fn(&str) -> String;
    let kinds: [(&str, Norm); 3] = [
        ("a trailing newline", |s| s.trim_end_matches(['\n', '\r']).replace("\r\n", "\n")),
        ("letter case", |s| s.to_lowercase()),
        ("whitespace", |s| s.split_whitespace().collect::<Vec<_>>().join(" ")),
    ];
    // The smallest set of kinds whose normalisations make the two equal.
    for set in [[0, 1].as_slice(), &[1, 2]] {
        let all = |s: &str| set.iter().fold(s.to_string(), |t, &k| kinds[k].1(&t));
        if all(expected) != all(found) {
            continue;
        }
        let mut names = Vec::new();
        // What each kind changes, seen with the other kinds taken out.
        let details: Vec<String> = set
            .iter()
            .map(|&k| {
                let others = |s: &str| set.iter().filter(|&&o| o != k).fold(s.to_string(), |t, &o| kinds[o].1(&t));
                let (e, f) = (others(expected), others(found));
                let i = first_difference(&e, &f);
                match k {
                    0 => {
                        let (what, detail) = line_end_difference(&e, &f);
                        names.push(what);
                        detail
                    }
                    1 => {
                        names.push(kinds[1].0);
                        format!(
                            "letter case first differs at character {}: expected {}, found {}",
                            i + 1,
                            char_at(&e, i),
                            char_at(&f, i)
                        )
                    }
                    _ => {
                        names.push(kinds[2].0);
                        format!(
                            "whitespace first differs at character {}: expected {}, found {}",
                            i + 1,
                            char_at(&e, i),
                            char_at(&f, i)
                        )
                    }
                }
            })
            .collect();
        let short = format!("only {} differ", names.join(" and "));
        let full = format!("{short}: {}", details.join("; "));
        return Some(Hint { short, full });
    }
    None
}

/// How two texts equal but for their line endings and trailing newlines differ: the words for
/// the one-line hint (`a trailing newline`, `line endings`, or both) and what each changes.
/// Compared as texts, never by byte offsets of one into the other: `"a\r\nbé"` and `"a\nbé"`
/// have different lengths, and an offset of one may fall inside a character of the other.
fn line_end_difference(e: &str, f: &str) -> (&'static str, String) {
    let body = |s: &str| s.trim_end_matches(['\n', '\r']).len();
    let ((e_body, e_tail), (f_body, f_tail)) = (e.split_at(body(e)), f.split_at(body(f)));
    let unix = |s: &str| s.replace("\r\n", "\n");
    let mut details = Vec::new();
    let endings = e_body != f_body || (e_tail != f_tail && unix(e_tail) == unix(f_tail));
    if endings {
        let (who, other) = if f.contains("\r\n") { ("found", "expected") } else { ("expected", "found") };
        details.push(format!("the text {who} has Windows line endings (\"\\r\\n\"), the text {other} has \"\\n\""));
    }
    let trailing = unix(e_tail) != unix(f_tail);
    if trailing {
        details.push(if f_tail.len() > e_tail.len() {
            format!("the text found ends with {f_tail:?}")
        } else if f_tail.is_empty() {
            format!("the expected text ends with {e_tail:?} and the text found does not")
        } else {
            format!("the expected text ends with {e_tail:?} and the text found with {f_tail:?}")
        });
    }
    let what = match (endings, trailing) {
        (true, true) => "line endings, a trailing newline",
        (true, false) => "line endings",
        _ => "a trailing newline",
    };
    (what, details.join("; "))
}

fn one_difference(expected: &str, found: &str) -> Option<Hint> {
    if expected == found {
        return None;
    }
    let unix = |s: &str| s.replace("\r\n", "\n");
    if expected.contains('\r') != found.contains('\r') && unix(expected) == unix(found) {
        let (who, other) = if found.contains("\r\n") { ("found", "expected") } else { ("expected", "found") };
        return Some(Hint {
            short: "only line endings differ".into(),
            full: format!(
                "only line endings differ: the text {who} has Windows line endings (\"\\r\\n\"), the text {other} has \"\\n\""
            ),
        });
    }
    let body = |s: &str| s.trim_end_matches(['\n', '\r']).len();
    if expected[..body(expected)] == found[..body(found)] {
        let short = "only a trailing newline differs".to_string();
        let (found_tail, expected_tail) = (&found[body(found)..], &expected[body(expected)..]);
        let full = if found_tail.len() > expected_tail.len() {
            let fix = if expected.chars().count() <= 60 {
                format!("expect {:?} (or use `starts_with`)", format!("{}{found_tail}", &expected[..body(expected)]))
            } else {
                format!("end the expected text with {found_tail:?} (or use `starts_with`)")
            };
            format!("{short}: the text found ends with {found_tail:?}, as the output of `echo` and most commands does; {fix}")
        } else {
            let found =
                if found_tail.is_empty() { "does not".to_string() } else { format!("ends with {found_tail:?}") };
            format!(
                "{short}: the expected text ends with {expected_tail:?} and the text found {found}; a YAML block scalar `|` adds a newline, `|-` does not"
            )
        };
        return Some(Hint { short, full });
    }
    if expected.to_lowercase() == found.to_lowercase() {
        let i = first_difference(expected, found);
        return Some(Hint {
            short: "only letter case differs".into(),
            full: format!(
                "only letter case differs, first at character {}: expected {}, found {}",
                i + 1,
                char_at(expected, i),
                char_at(found, i)
            ),
        });
    }
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if squeeze(expected) == squeeze(found) {
        if expected.trim() == found.trim() {
            return Some(Hint {
                short: "only leading or trailing whitespace differs".into(),
                full: format!(
                    "only leading or trailing whitespace differs: expected {} around the text, found {}",
                    edges(expected),
                    edges(found)
                ),
            });
        }
        let i = first_difference(expected, found);
        return Some(Hint {
            short: "only whitespace differs".into(),
            full: format!(
                "only whitespace differs (spaces, tabs or line breaks), first at character {}: expected {}, found {}",
                i + 1,
                char_at(expected, i),
                char_at(found, i)
            ),
        });
    }
    None
}

/// The whitespace before and after a text, for a hint: `"  " and "\n"`, or `none`.
fn edges(s: &str) -> String {
    let lead = &s[..s.len() - s.trim_start().len()];
    let trail = &s[s.trim_end().len()..];
    match (lead.is_empty(), trail.is_empty()) {
        (true, true) => "none".into(),
        (false, true) => format!("{lead:?} before"),
        (true, false) => format!("{trail:?} after"),
        (false, false) => format!("{lead:?} before and {trail:?} after"),
    }
}

/// A hint for `contains`/`starts_with`/`ends_with` whose text is in the subject only in a
/// form that is hard to tell apart: another letter case, other whitespace, a trailing newline.
fn near_hint(want: &str, text: &str, holds: impl Fn(&str, &str) -> bool, verb: &str) -> Option<Hint> {
    let trimmed = want.trim_end_matches(['\n', '\r']);
    if trimmed != want && holds(text, trimmed) {
        return Some(Hint {
            short: "only a trailing newline differs".into(),
            full: format!(
                "only a trailing newline differs: the text found {verb} {} but not followed by {:?}",
                short(trimmed),
                &want[trimmed.len()..]
            ),
        });
    }
    if verb == "ends with" {
        let t = text.trim_end_matches(['\n', '\r']);
        if t != text && t.ends_with(want) {
            return Some(Hint {
                short: "only a trailing newline differs".into(),
                full: format!(
                    "only a trailing newline differs: the text found ends with {} and then {:?}; use `ends_with: {:?}`",
                    short(want),
                    &text[t.len()..],
                    format!("{want}{}", &text[t.len()..])
                ),
            });
        }
    }
    if holds(&text.to_lowercase(), &want.to_lowercase()) {
        return Some(Hint {
            short: "only letter case differs".into(),
            full: format!("only letter case differs: the text found {verb} {} in another case", short(want)),
        });
    }
    let squeeze = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if !want.trim().is_empty() && holds(&squeeze(text), &squeeze(want)) {
        return Some(Hint {
            short: "only whitespace differs".into(),
            full: format!(
                "only whitespace differs: the text found {verb} {} with other spaces, tabs or line breaks",
                short(&squeeze(want))
            ),
        });
    }
    None
}

impl Matcher {
    /// Build from a rendered value. A scalar is shorthand for `equals`. The rules and
    /// messages are those [`validate`] gives a written matcher (see [`leaf`]).
    pub fn from_json(v: &JsonValue) -> Result<Matcher, MatcherError> {
        let obj = match v {
            JsonValue::Object(o) if o.is_empty() => return Err(MatcherError::Empty),
            JsonValue::Object(o) => o,
            JsonValue::Array(_) => return Err(MatcherError::NotAMapping),
            other => return Ok(Matcher(vec![Clause::Equals(other.clone())])),
        };
        let mut clauses = Vec::new();
        for (k, v) in obj {
            if let Some(clause) = leaf(k, v) {
                clauses.push(clause?);
                continue;
            }
            let list = || -> Result<Vec<Matcher>, MatcherError> {
                v.as_array()
                    .ok_or_else(|| expects(k, "a list of matchers", v))?
                    .iter()
                    .map(Matcher::from_json)
                    .collect()
            };
            clauses.push(match k.as_str() {
                "json" => {
                    let items = v.as_array().ok_or_else(|| expects(k, JSON_LIST, v))?;
                    let mut checks = Vec::new();
                    for item in items {
                        let o = item.as_object().ok_or(MatcherError::JsonEntry)?;
                        let path = match o.get("path") {
                            None => return Err(MatcherError::JsonNoPath),
                            Some(p) => p.as_str().ok_or_else(|| expects("path", "a string", p))?.to_string(),
                        };
                        parse_path(&path)?;
                        let exists = match o.get("exists") {
                            None => None,
                            Some(JsonValue::Bool(b)) => Some(*b),
                            Some(other) => return Err(expects("exists", "true or false", other)),
                        };
                        let rest: serde_json::Map<String, JsonValue> = o
                            .iter()
                            .filter(|(k, _)| !JSON_ENTRY_EXTRA.contains(&k.as_str()))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        let matcher =
                            if rest.is_empty() { None } else { Some(Matcher::from_json(&JsonValue::Object(rest))?) };
                        checks.push(JsonCheck { path, exists, matcher });
                    }
                    Clause::Json(checks)
                }
                "not" => Clause::Not(Box::new(Matcher::from_json(v)?)),
                "all" => Clause::All(list()?),
                "any" => Clause::Any(list()?),
                other => return Err(MatcherError::UnknownKey(other.to_string())),
            });
        }
        Ok(Matcher(clauses))
    }

    /// Check a text subject (stdout, a file, an HTTP body).
    pub fn check_text(&self, actual: &str) -> Result<(), MatchFailure> {
        self.check(&JsonValue::String(actual.to_string()))
    }

    /// Check any value; non-strings are compared as JSON and searched as their JSON text.
    pub fn check(&self, actual: &JsonValue) -> Result<(), MatchFailure> {
        for c in &self.0 {
            c.check(actual)?;
        }
        Ok(())
    }

    /// The matcher as written, for messages: `{ contains "a", empty: false }`.
    pub fn describe(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(Clause::describe).collect();
        format!("{{ {} }}", parts.join(", "))
    }
}

impl Clause {
    fn describe(&self) -> String {
        match self {
            Clause::Equals(v) => format!("equals {}", shown(v)),
            Clause::Contains(s) => format!("contains {}", short(s)),
            Clause::NotContains(s) => format!("not_contains {}", short(s)),
            Clause::Matches(re) => format!("matches /{}/", re.as_str()),
            Clause::StartsWith(s) => format!("starts_with {}", short(s)),
            Clause::EndsWith(s) => format!("ends_with {}", short(s)),
            Clause::Empty(b) => format!("empty: {b}"),
            Clause::LineCount(n) => format!("lines: {n}"),
            Clause::Lines(l) => format!("lines: {}", short_raw(&serde_json::to_string(l).unwrap_or_default())),
            Clause::Length(n) => format!("length: {n}"),
            Clause::Json(checks) => {
                let paths: Vec<&str> = checks.iter().map(|c| c.path.as_str()).collect();
                format!("json at {}", paths.join(", "))
            }
            Clause::Not(m) => format!("not {}", m.describe()),
            Clause::All(ms) => format!("all [{}]", ms.iter().map(Matcher::describe).collect::<Vec<_>>().join(", ")),
            Clause::Any(ms) => format!("any [{}]", ms.iter().map(Matcher::describe).collect::<Vec<_>>().join(", ")),
        }
    }

    fn check(&self, actual: &JsonValue) -> Result<(), MatchFailure> {
        let text = text_of(actual);
        let found = shown(actual);
        let plain = |ok: bool, message: String| if ok { Ok(()) } else { Err(failure(message, None, None)) };
        match self {
            Clause::Equals(exp) => {
                let equal = match (exp, actual) {
                    (JsonValue::String(e), a) => *e == text_of(a),
                    (e, JsonValue::String(a)) => {
                        serde_json::from_str::<JsonValue>(a).map(|a| &a == e).unwrap_or(false) || text_of(e) == *a
                    }
                    (e, a) => loose_eq(e, a),
                };
                if equal {
                    return Ok(());
                }
                let want = text_of(exp);
                let hint = difference(&want, &text);
                let m = Mismatch::new(want, text.clone());
                Err(failure(format!("expected {}, found {found}", shown(exp)), hint.as_ref(), Some(m)))
            }
            Clause::Contains(s) => {
                if text.contains(s.as_str()) {
                    return Ok(());
                }
                let hint = near_hint(s, &text, |t, w| t.contains(w), "contains");
                Err(failure(format!("expected text containing {}, found {found}", short(s)), hint.as_ref(), None))
            }
            Clause::NotContains(s) => {
                plain(!text.contains(s.as_str()), format!("expected text not containing {}, found {found}", short(s)))
            }
            Clause::Matches(re) => {
                if re.is_match(&text) {
                    return Ok(());
                }
                let hint = regex_hint(re, &text);
                Err(failure(format!("expected text matching /{}/, found {found}", re.as_str()), hint.as_ref(), None))
            }
            Clause::StartsWith(s) => {
                if text.starts_with(s.as_str()) {
                    return Ok(());
                }
                let hint = near_hint(s, &text, |t, w| t.starts_with(w), "starts with");
                Err(failure(format!("expected text starting with {}, found {found}", short(s)), hint.as_ref(), None))
            }
            Clause::EndsWith(s) => {
                if text.ends_with(s.as_str()) {
                    return Ok(());
                }
                let hint = near_hint(s, &text, |t, w| t.ends_with(w), "ends with");
                Err(failure(format!("expected text ending with {}, found {found}", short(s)), hint.as_ref(), None))
            }
            Clause::Empty(want) => {
                if text.is_empty() == *want {
                    return Ok(());
                }
                if !*want {
                    return plain(false, "expected non-empty text, found empty text".into());
                }
                let hint = text.trim().is_empty().then(|| Hint {
                    short: "only whitespace".into(),
                    full: format!("the text found is only whitespace ({found}); use `matches: '^\\s*$'` to allow it"),
                });
                Err(failure(format!("expected empty text, found {found}"), hint.as_ref(), None))
            }
            Clause::LineCount(n) => {
                let got = text.lines().count();
                plain(got == *n, format!("expected {n} line{}, found {got}: {found}", if *n == 1 { "" } else { "s" }))
            }
            Clause::Lines(lines) => {
                let got: Vec<&str> = text.lines().collect();
                if got == *lines {
                    return Ok(());
                }
                let mut expected = lines.join("\n");
                if !lines.is_empty() {
                    expected.push('\n');
                }
                let joined = got.join("\n") + if got.is_empty() { "" } else { "\n" };
                let hint = difference(&expected, &joined);
                let listed = |l: &[&str]| short_raw(&serde_json::to_string(l).unwrap_or_default());
                let want: Vec<&str> = lines.iter().map(String::as_str).collect();
                Err(failure(
                    format!("expected the lines {}, found {}", listed(&want), listed(&got)),
                    hint.as_ref(),
                    Some(Mismatch::new(expected, text.clone())),
                ))
            }
            Clause::Length(n) => {
                let got = text.chars().count();
                if got == *n {
                    return Ok(());
                }
                let trimmed = text.trim_end_matches(['\n', '\r']);
                let hint = (trimmed.chars().count() == *n).then(|| Hint {
                    short: "only a trailing newline differs".into(),
                    full: format!(
                        "only a trailing newline differs: without its trailing {:?} the text found has length {n}",
                        &text[trimmed.len()..]
                    ),
                });
                Err(failure(format!("expected length {n}, found length {got}: {found}"), hint.as_ref(), None))
            }
            Clause::Json(checks) => {
                let doc: JsonValue = match actual {
                    JsonValue::String(s) => serde_json::from_str(s)
                        .map_err(|e| failure(format!("expected JSON, found {} ({e})", short(s)), None, None))?,
                    other => other.clone(),
                };
                for check in checks {
                    let found_at = lookup(&doc, &check.path);
                    if let Some(want) = check.exists {
                        if found_at.is_some() != want {
                            let message = if want {
                                format!(
                                    "expected {} to exist, found no such path in {}",
                                    check.path,
                                    short_raw(&doc.to_string())
                                )
                            } else {
                                format!(
                                    "expected {} not to exist, found {}",
                                    check.path,
                                    found_at.map(shown).unwrap_or_default()
                                )
                            };
                            return Err(failure(message, None, None));
                        }
                    }
                    if let Some(m) = &check.matcher {
                        let Some(v) = found_at else {
                            return Err(failure(
                                format!(
                                    "at {}: expected a value, found no such path in {}",
                                    check.path,
                                    short_raw(&doc.to_string())
                                ),
                                None,
                                None,
                            ));
                        };
                        m.check(v)
                            .map_err(|f| MatchFailure { message: format!("at {}: {}", check.path, f.message), ..f })?;
                    }
                }
                Ok(())
            }
            Clause::Not(m) => match m.check(actual) {
                Ok(()) => plain(false, format!("expected text not matching {}, found {found}", m.describe())),
                Err(_) => Ok(()),
            },
            Clause::All(ms) => ms.iter().try_for_each(|m| m.check(actual)),
            Clause::Any(ms) => {
                let mut reasons = Vec::new();
                for m in ms {
                    match m.check(actual) {
                        Ok(()) => return Ok(()),
                        Err(f) => reasons.push(f.message),
                    }
                }
                let alternatives: Vec<String> = ms.iter().map(Matcher::describe).collect();
                plain(
                    false,
                    format!("expected any of {}, found {found} ({})", alternatives.join(" or "), reasons.join("; ")),
                )
            }
        }
    }
}

/// A hint for a regex that does not match: `$` before a trailing newline, letter case.
fn regex_hint(re: &Regex, text: &str) -> Option<Hint> {
    let trimmed = text.trim_end_matches(['\n', '\r']);
    if trimmed != text && re.is_match(trimmed) {
        return Some(Hint {
            short: "only a trailing newline differs".into(),
            full: format!(
                "only a trailing newline differs: the text found ends with {:?}, and `$` is the very end of the text; match it with `\\n$`, or use `(?m)` to make `$` the end of each line",
                &text[trimmed.len()..]
            ),
        });
    }
    if let Ok(ci) = Regex::new(&format!("(?i){}", re.as_str())) {
        if ci.is_match(text) {
            return Some(Hint {
                short: "only letter case differs".into(),
                full: "only letter case differs: start the pattern with `(?i)` to ignore case".into(),
            });
        }
    }
    None
}

/// Numbers compare by value (`1` equals `1.0`).
fn loose_eq(a: &JsonValue, b: &JsonValue) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[derive(Debug, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// `$.a.b[0]["c d"]`
fn parse_path(path: &str) -> Result<Vec<Seg>, MatcherError> {
    let bad = || MatcherError::InvalidPath(path.to_string());
    let rest = path.strip_prefix('$').ok_or_else(bad)?;
    let mut segs = Vec::new();
    let chars: Vec<char> = rest.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '.' => {
                let start = i + 1;
                let mut j = start;
                while j < chars.len() && chars[j] != '.' && chars[j] != '[' {
                    j += 1;
                }
                if j == start {
                    return Err(bad());
                }
                segs.push(Seg::Key(chars[start..j].iter().collect()));
                i = j;
            }
            '[' => {
                let close = chars[i..].iter().position(|&c| c == ']').ok_or_else(bad)? + i;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                if let Some(q) = inner
                    .strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .or_else(|| inner.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
                {
                    segs.push(Seg::Key(q.to_string()));
                } else {
                    segs.push(Seg::Index(inner.parse().map_err(|_| bad())?));
                }
                i = close + 1;
            }
            _ => return Err(bad()),
        }
    }
    Ok(segs)
}

pub fn lookup<'a>(doc: &'a JsonValue, path: &str) -> Option<&'a JsonValue> {
    let mut cur = doc;
    for seg in parse_path(path).ok()? {
        cur = match seg {
            Seg::Key(k) => cur.get(&k)?,
            Seg::Index(i) => cur.get(i)?,
        };
    }
    Some(cur)
}

const EMPTY: &str = "empty matcher";
const NOT_A_LIST: &str = "a matcher is a mapping such as `{ contains: ok }`, not a list";
const JSON_LIST: &str = "a list of { path, <matcher> } entries";
const JSON_ENTRY: &str = "each `json` entry is a mapping like `{ path: \"$.a\", equals: 1 }`";
const JSON_NO_PATH: &str = "missing `path` in `json` entry";

/// The name of a value's type, for messages: `a string`, `a list`.
fn type_name(v: &JsonValue) -> &'static str {
    match v {
        JsonValue::Null => "null",
        JsonValue::Bool(_) => "a boolean",
        JsonValue::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        JsonValue::Number(_) => "a number",
        JsonValue::String(_) => "a string",
        JsonValue::Array(_) => "a list",
        JsonValue::Object(_) => "a mapping",
    }
}

/// A matcher that cannot be built: the same refusals for one written in a scenario
/// ([`validate`]) and one rendered ([`Matcher::from_json`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatcherError {
    #[error("{}", EMPTY)]
    Empty,
    /// A list where a matcher belongs.
    #[error("{}", NOT_A_LIST)]
    NotAMapping,
    /// A clause whose value has the wrong type (`contains: [a]`).
    #[error("`{key}` expects {expected}, found {found}")]
    WrongType { key: String, expected: String, found: &'static str },
    /// The last line of the regex crate's message.
    #[error("invalid regex in `matches`: {0}")]
    InvalidRegex(String),
    #[error("{}", JSON_ENTRY)]
    JsonEntry,
    #[error("{}", JSON_NO_PATH)]
    JsonNoPath,
    #[error("invalid JSON path `{0}`: write it like `$.items[0].name`")]
    InvalidPath(String),
    #[error("unknown matcher `{0}`")]
    UnknownKey(String),
}

impl MatcherError {
    /// What a diagnostic says under the value, for the kinds that have a label.
    fn label(&self) -> Option<String> {
        match self {
            MatcherError::WrongType { expected, .. } => Some(format!("expected {expected}")),
            MatcherError::InvalidRegex(_) => Some("not a valid regular expression".into()),
            _ => None,
        }
    }
}

fn expects(key: &str, what: &str, v: &JsonValue) -> MatcherError {
    MatcherError::WrongType { key: key.to_string(), expected: what.to_string(), found: type_name(v) }
}

/// One clause without structure (`contains: ok`, `length: 3`) from its value: what a written
/// one ([`validate`]) and a rendered one ([`Matcher::from_json`]) are both held to. `None` for
/// the keys with structure (`json`, `not`, `all`, `any`) and unknown keys.
fn leaf(key: &str, v: &JsonValue) -> Option<Result<Clause, MatcherError>> {
    let text = |make: fn(String) -> Clause| match v {
        JsonValue::String(_) | JsonValue::Number(_) | JsonValue::Bool(_) => Ok(make(text_of(v))),
        other => Err(expects(key, "a string", other)),
    };
    let count = || v.as_u64().map(|n| n as usize).ok_or_else(|| expects(key, "a non-negative integer", v));
    Some(match key {
        "equals" => Ok(Clause::Equals(v.clone())),
        "contains" => text(Clause::Contains),
        "not_contains" => text(Clause::NotContains),
        "starts_with" => text(Clause::StartsWith),
        "ends_with" => text(Clause::EndsWith),
        "matches" => match v.as_str() {
            Some(re) => Regex::new(re).map(Clause::Matches).map_err(|e| {
                let msg = e.to_string();
                let last = msg.lines().last().unwrap_or("").trim().trim_start_matches("error: ").to_string();
                MatcherError::InvalidRegex(last)
            }),
            None => Err(expects(key, "a regular expression string", v)),
        },
        "empty" => v.as_bool().map(Clause::Empty).ok_or_else(|| expects(key, "true or false", v)),
        "lines" => match v {
            JsonValue::Array(items) => Ok(Clause::Lines(items.iter().map(text_of).collect())),
            other => other
                .as_u64()
                .map(|n| Clause::LineCount(n as usize))
                .ok_or_else(|| expects(key, "a count or a list of lines", other)),
        },
        "length" => count().map(Clause::Length),
        _ => return None,
    })
}

fn is_expression(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// Static checks of a matcher written in a scenario: known keys, value shapes, regexes and
/// JSON paths that are not templates.
pub fn validate(node: &Node, src: &Source, diags: &mut Vec<Diagnostic>) {
    let Some(map) = node.as_map() else {
        if matches!(node.value, Value::Seq(_)) {
            diags.push(node.diag(src, NOT_A_LIST).label("expected a mapping"));
        }
        return;
    };
    if map.is_empty() {
        diags.push(node.diag(src, EMPTY).help(format!("use one of: {}", key_names().join(", "))));
    }
    for (k, v) in map {
        let key = k.key_text();
        validate_clause(&key, k, v, src, diags);
    }
}

fn key_names() -> Vec<&'static str> {
    KEYS.iter().map(|(k, _)| *k).collect()
}

fn validate_clause(key: &str, k: &Node, v: &Node, src: &Source, diags: &mut Vec<Diagnostic>) {
    // A refusal at a node, with its label when it has one.
    let at = |node: &Node, e: MatcherError| {
        let d = node.diag(src, e.to_string());
        match e.label() {
            Some(label) => d.label(label),
            None => d,
        }
    };
    let want = |what: &str| at(v, expects(key, what, &v.to_json()));
    // A clause without structure: by `leaf`, as `from_json` will take it once rendered.
    if let Some(r) = leaf(key, &v.to_json()) {
        if let (Err(e), false) = (r, crate::expr::has_template(v)) {
            diags.push(at(v, e));
        }
        return;
    }
    match key {
        "json" => match v.as_seq() {
            Some(items) => {
                for item in items {
                    let Some(m) = item.as_map() else {
                        diags.push(item.diag(src, JSON_ENTRY));
                        continue;
                    };
                    match item.get("path") {
                        None => diags.push(item.diag(src, JSON_NO_PATH).help("add `path: \"$.field\"`")),
                        Some(p) => match p.as_str() {
                            Some(ps) if !is_expression(ps) => {
                                if let Err(e) = parse_path(ps) {
                                    diags.push(at(p, e));
                                }
                            }
                            Some(_) => {}
                            None => {
                                diags.push(at(p, expects("path", "a string", &p.to_json())));
                            }
                        },
                    }
                    for (ek, ev) in m {
                        let ek_text = ek.key_text();
                        if ek_text == "path" {
                            continue;
                        }
                        if ek_text == "exists" {
                            if !matches!(ev.value, Value::Bool(_)) && !crate::expr::has_template(ev) {
                                diags.push(at(ev, expects("exists", "true or false", &ev.to_json())));
                            }
                            continue;
                        }
                        validate_clause(&ek_text, ek, ev, src, diags);
                    }
                }
            }
            None => diags.push(want(JSON_LIST)),
        },
        "not" => validate(v, src, diags),
        "all" | "any" => match v.as_seq() {
            Some(items) => items.iter().for_each(|m| validate(m, src, diags)),
            None => diags.push(want("a list of matchers")),
        },
        other => {
            let mut d = k.diag(src, format!("unknown matcher `{other}`")).label("unknown matcher");
            d = match did_you_mean(other, key_names()) {
                Some(s) => d.help(format!("did you mean `{s}`?")),
                None => d.help(format!("matchers are: {}", key_names().join(", "))),
            };
            diags.push(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(v: JsonValue) -> Matcher {
        Matcher::from_json(&v).unwrap()
    }

    #[test]
    fn text_matchers() {
        assert!(m(json!({"equals": "hi\n"})).check_text("hi\n").is_ok());
        assert!(m(json!({"equals": "hi"})).check_text("hi\n").is_err());
        assert!(m(json!({"contains": "ll", "starts_with": "he", "ends_with": "lo"})).check_text("hello").is_ok());
        assert!(m(json!({"not_contains": "x"})).check_text("hello").is_ok());
        assert!(m(json!({"not_contains": "l"})).check_text("hello").is_err());
        assert!(m(json!({"matches": "^h.*o$"})).check_text("hello").is_ok());
        assert!(m(json!({"empty": true})).check_text("").is_ok());
        assert!(m(json!({"empty": false})).check_text("").is_err());
        assert!(m(json!({"lines": 2})).check_text("a\nb\n").is_ok());
        assert!(m(json!({"lines": ["a", "b"]})).check_text("a\nb\n").is_ok());
        assert!(m(json!({"length": 5})).check_text("héllo").is_ok());
    }

    /// Issue 26 item 2: `printf 'a\r\nbé\n'` against `equals: "A\nbé"` sliced the text found
    /// at the expected text's byte length, inside `é`: the step panicked instead of failing.
    #[test]
    fn a_non_ascii_char_after_a_crlf_is_a_failure_with_a_hint_not_a_panic() {
        let err = m(json!({"equals": "A\nbé"})).check_text("a\r\nbé\n").unwrap_err();
        assert!(
            err.message.contains("only line endings, a trailing newline and letter case differ"),
            "{}",
            err.message
        );
        let hint = err.mismatch.unwrap().hint.unwrap();
        assert!(hint.contains("Windows line endings"), "{hint}");
        assert!(hint.contains(r#"the text found ends with "\n""#), "{hint}");
        assert!(hint.contains(r#"expected "A", found "a""#), "{hint}");
    }

    /// Every matcher over texts made of the characters that change length under line-ending,
    /// case and whitespace normalisation (`\r\n`, `é`, `İ`, which lowercases to two chars, `ß`)
    /// fails or holds: never a panic.
    #[test]
    fn no_text_makes_a_matcher_panic() {
        let alphabet = ["a", "A", "é", "É", "İ", "ß", "\r", "\n", " ", "\t", "b"];
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut text =
            |n: u64| -> String { (0..n).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect() };
        for i in 0..4000 {
            let want = text(6);
            // Mostly a near miss of `want` (the hint code's domain), else anything.
            let found = match i % 4 {
                0 => want.replace('\n', "\r\n").to_uppercase() + "\n",
                1 => want.to_lowercase().replace(' ', "\t") + "\r\n",
                2 => format!(" {}", want.replace("\r\n", "\n").to_uppercase()),
                _ => text(7),
            };
            let _ = difference(&want, &found);
            for key in ["equals", "contains", "starts_with", "ends_with", "not_contains"] {
                let _ = m(json!({ key: want })).check_text(&found);
            }
            let lines: Vec<&str> = want.lines().collect();
            let _ = m(json!({"lines": lines})).check_text(&found);
            let _ = m(json!({"length": want.chars().count()})).check_text(&found);
            let _ = m(json!({"matches": "^a$"})).check_text(&found);
        }
    }

    #[test]
    fn combinators() {
        assert!(m(json!({"not": {"contains": "x"}})).check_text("abc").is_ok());
        assert!(m(json!({"not": {"contains": "a"}})).check_text("abc").is_err());
        assert!(m(json!({"any": [{"equals": "x"}, {"contains": "b"}]})).check_text("abc").is_ok());
        assert!(m(json!({"all": [{"contains": "a"}, {"contains": "z"}]})).check_text("abc").is_err());
    }

    #[test]
    fn json_paths() {
        let body = r#"{"a":{"b":[1,{"c":"x"}]},"n":2}"#;
        assert!(m(json!({"json": [{"path": "$.a.b[1].c", "equals": "x"}, {"path": "$.n", "equals": 2}]}))
            .check_text(body)
            .is_ok());
        assert!(m(json!({"json": [{"path": "$.n", "equals": 3}]})).check_text(body).is_err());
        assert!(m(json!({"json": [{"path": "$.zz", "exists": false}]})).check_text(body).is_ok());
        assert!(m(json!({"json": [{"path": "$.a", "exists": true}]})).check_text(body).is_ok());
        assert!(m(json!({"json": [{"path": "$[\"n\"]", "matches": "^2$"}]})).check_text(body).is_ok());
        let f = m(json!({"json": [{"path": "$.n", "equals": 3}]})).check_text(body).unwrap_err();
        assert!(f.message.starts_with("at $.n:"), "{}", f.message);
    }

    #[test]
    fn equals_failure_carries_expected_and_actual() {
        let f = m(json!({"equals": "a\nb\n"})).check_text("a\nc\n").unwrap_err();
        assert_eq!(f.mismatch, Some(Mismatch::new("a\nb\n", "a\nc\n")));
    }

    /// Issue 18: every failure reads "expected …, found …", with a pointed hint when only a
    /// trailing newline, line endings, letter case or whitespace differs. The exact text a
    /// user sees, one case per line: matcher, subject, then message and hint.
    #[test]
    fn failure_messages_snapshot() {
        let cases: &[(JsonValue, &str)] = &[
            (json!({"equals": "hello"}), "Hello\n"),
            (json!({"equals": "hi"}), "hi\n"),
            (json!({"equals": "hi\n"}), "hi"),
            (json!({"equals": "a\nb\n"}), "a\r\nb\r\n"),
            (json!({"equals": "Hello World"}), "hello world"),
            (json!({"equals": "a b"}), "a\tb"),
            (json!({"equals": "ok"}), "  ok "),
            (json!({"equals": "bye"}), "hello\n"),
            (json!({"equals": 3}), "2"),
            (json!({"contains": "hi\n"}), "say hi"),
            (json!({"contains": "ERROR"}), "an error happened"),
            (json!({"contains": "a  b"}), "a b"),
            (json!({"contains": "bye"}), "hello\n"),
            (json!({"not_contains": "l"}), "hello"),
            (json!({"starts_with": "Hello"}), "hello"),
            (json!({"ends_with": "done"}), "all done\n"),
            (json!({"matches": "^hi$"}), "hi\n"),
            (json!({"matches": "^HI"}), "hi"),
            (json!({"matches": "^x"}), "hi"),
            (json!({"empty": true}), "\n"),
            (json!({"empty": true}), "x"),
            (json!({"empty": false}), ""),
            (json!({"lines": 1}), "a\nb\n"),
            (json!({"lines": ["a", "b"]}), "a\nc\n"),
            (json!({"length": 2}), "hi\n"),
            (json!({"json": [{"path": "$.n", "equals": 3}]}), r#"{"n":2}"#),
            (json!({"json": [{"path": "$.name", "equals": "Box"}]}), r#"{"name":"box"}"#),
            (json!({"json": [{"path": "$.a", "exists": true}]}), r#"{"n":2}"#),
            (json!({"json": [{"path": "$.a", "exists": true}]}), "ok"),
            (json!({"not": {"contains": "a"}}), "abc"),
            (json!({"any": [{"equals": "x"}, {"contains": "z"}]}), "abc"),
        ];
        let mut got = String::new();
        for (matcher, subject) in cases {
            let f = m(matcher.clone()).check_text(subject).unwrap_err();
            got.push_str(&format!("{matcher} on {subject:?}\n  {}\n", f.message));
            if let Some(hint) = f.mismatch.as_ref().and_then(|m| m.hint.as_ref()) {
                got.push_str(&format!("  hint: {hint}\n"));
            }
        }
        let want = r#"{"equals":"hello"} on "Hello\n"
  expected "hello", found "Hello\n" (only a trailing newline and letter case differ)
  hint: only a trailing newline and letter case differ: the text found ends with "\n"; letter case first differs at character 1: expected "h", found "H"
{"equals":"hi"} on "hi\n"
  expected "hi", found "hi\n" (only a trailing newline differs)
  hint: only a trailing newline differs: the text found ends with "\n", as the output of `echo` and most commands does; expect "hi\n" (or use `starts_with`)
{"equals":"hi\n"} on "hi"
  expected "hi\n", found "hi" (only a trailing newline differs)
  hint: only a trailing newline differs: the expected text ends with "\n" and the text found does not; a YAML block scalar `|` adds a newline, `|-` does not
{"equals":"a\nb\n"} on "a\r\nb\r\n"
  expected "a\nb\n", found "a\r\nb\r\n" (only line endings differ)
  hint: only line endings differ: the text found has Windows line endings ("\r\n"), the text expected has "\n"
{"equals":"Hello World"} on "hello world"
  expected "Hello World", found "hello world" (only letter case differs)
  hint: only letter case differs, first at character 1: expected "H", found "h"
{"equals":"a b"} on "a\tb"
  expected "a b", found "a\tb" (only whitespace differs)
  hint: only whitespace differs (spaces, tabs or line breaks), first at character 2: expected " ", found "\t"
{"equals":"ok"} on "  ok "
  expected "ok", found "  ok " (only leading or trailing whitespace differs)
  hint: only leading or trailing whitespace differs: expected none around the text, found "  " before and " " after
{"equals":"bye"} on "hello\n"
  expected "bye", found "hello\n"
{"equals":3} on "2"
  expected 3, found "2"
{"contains":"hi\n"} on "say hi"
  expected text containing "hi\n", found "say hi" (only a trailing newline differs)
{"contains":"ERROR"} on "an error happened"
  expected text containing "ERROR", found "an error happened" (only letter case differs)
{"contains":"a  b"} on "a b"
  expected text containing "a  b", found "a b" (only whitespace differs)
{"contains":"bye"} on "hello\n"
  expected text containing "bye", found "hello\n"
{"not_contains":"l"} on "hello"
  expected text not containing "l", found "hello"
{"starts_with":"Hello"} on "hello"
  expected text starting with "Hello", found "hello" (only letter case differs)
{"ends_with":"done"} on "all done\n"
  expected text ending with "done", found "all done\n" (only a trailing newline differs)
{"matches":"^hi$"} on "hi\n"
  expected text matching /^hi$/, found "hi\n" (only a trailing newline differs)
{"matches":"^HI"} on "hi"
  expected text matching /^HI/, found "hi" (only letter case differs)
{"matches":"^x"} on "hi"
  expected text matching /^x/, found "hi"
{"empty":true} on "\n"
  expected empty text, found "\n" (only whitespace)
{"empty":true} on "x"
  expected empty text, found "x"
{"empty":false} on ""
  expected non-empty text, found empty text
{"lines":1} on "a\nb\n"
  expected 1 line, found 2: "a\nb\n"
{"lines":["a","b"]} on "a\nc\n"
  expected the lines ["a","b"], found ["a","c"]
{"length":2} on "hi\n"
  expected length 2, found length 3: "hi\n" (only a trailing newline differs)
{"json":[{"path":"$.n","equals":3}]} on "{\"n\":2}"
  at $.n: expected 3, found 2
{"json":[{"path":"$.name","equals":"Box"}]} on "{\"name\":\"box\"}"
  at $.name: expected "Box", found "box" (only letter case differs)
  hint: only letter case differs, first at character 1: expected "B", found "b"
{"json":[{"path":"$.a","exists":true}]} on "{\"n\":2}"
  expected $.a to exist, found no such path in {"n":2}
{"json":[{"path":"$.a","exists":true}]} on "ok"
  expected JSON, found "ok" (expected value at line 1 column 1)
{"not":{"contains":"a"}} on "abc"
  expected text not matching { contains "a" }, found "abc"
{"any":[{"equals":"x"},{"contains":"z"}]} on "abc"
  expected any of { equals "x" } or { contains "z" }, found "abc" (expected "x", found "abc"; expected text containing "z", found "abc")
"#;
        assert_eq!(got, want, "\n--- got ---\n{got}");
    }

    /// The full hints of the clauses that carry no expected/found pair reach the message only
    /// in short; `difference` itself is what the summary shows under expected/found.
    #[test]
    fn difference_hints() {
        assert_eq!(difference("same", "same"), None);
        assert_eq!(difference("abc", "xyz"), None);
        assert_eq!(difference("Ab  c\n", "aB c").unwrap().short, "only letter case and whitespace differ");
        let h = difference("line\n", "line\n\n").unwrap();
        assert_eq!(h.short, "only a trailing newline differs");
        assert!(h.full.contains(r#"expect "line\n\n""#), "{}", h.full);
        let long = "x".repeat(80);
        let h = difference(&long, &format!("{long}\n")).unwrap();
        assert!(h.full.ends_with(r#"end the expected text with "\n" (or use `starts_with`)"#), "{}", h.full);
    }

    /// A bad clause written in a scenario (`validate`) and the same one rendered
    /// (`from_json`) are refused with the same message.
    #[test]
    fn written_and_rendered_clauses_get_the_same_message() {
        let cases = [
            "{ matches: '(' }",
            "{ matches: 3 }",
            "{ contains: [a] }",
            "{ empty: 1 }",
            "{ lines: -1 }",
            "{ length: x }",
            "{ json: { path: $.a } }",
            "{ json: [ 3 ] }",
            "{ json: [ { equals: 1 } ] }",
            "{ json: [ { path: 3 } ] }",
            "{ json: [ { path: $.a, exists: 1 } ] }",
            "{ all: { contains: a } }",
            "{ not: [ a ] }",
            "{ not: {} }",
            "{ bogus: 1 }",
        ];
        for case in cases {
            let src = Source::new("t.yaml", format!("m: {case}\n"));
            let node = crate::yaml::parse(&src).unwrap().remove(0).get("m").unwrap().clone();
            let mut diags = Vec::new();
            validate(&node, &src, &mut diags);
            assert_eq!(diags.len(), 1, "{case}: {diags:?}");
            let rendered = Matcher::from_json(&node.to_json()).expect_err(case);
            assert_eq!(diags[0].message, rendered.to_string(), "{case}");
        }
    }

    /// Issue 28 item 4: a rendered matcher's refusal is a kind a caller can match; the text
    /// is the one a written matcher gets.
    #[test]
    fn refusals_have_kinds() {
        use serde_json::json;
        let e = |v: JsonValue| Matcher::from_json(&v).unwrap_err();
        assert_eq!(e(json!({})), MatcherError::Empty);
        assert_eq!(e(json!([1])), MatcherError::NotAMapping);
        assert_eq!(e(json!({ "bogus": 1 })), MatcherError::UnknownKey("bogus".into()));
        assert_eq!(e(json!({ "json": [3] })), MatcherError::JsonEntry);
        assert_eq!(e(json!({ "json": [{ "equals": 1 }] })), MatcherError::JsonNoPath);
        assert_eq!(e(json!({ "json": [{ "path": "a" }] })), MatcherError::InvalidPath("a".into()));
        assert_eq!(
            e(json!({ "not": { "contains": [1] } })),
            MatcherError::WrongType { key: "contains".into(), expected: "a string".into(), found: "a list" }
        );
        assert_eq!(e(json!({ "contains": [1] })).to_string(), "`contains` expects a string, found a list");
        assert!(matches!(e(json!({ "matches": "(" })), MatcherError::InvalidRegex(_)));
        assert_eq!(
            e(json!({ "json": [{ "path": "a" }] })).to_string(),
            "invalid JSON path `a`: write it like `$.items[0].name`"
        );
    }

    #[test]
    fn static_validation_points_at_the_key() {
        let src = Source::new("t.yaml", "m:\n  contians: x\n  matches: '('\n");
        let doc = crate::yaml::parse(&src).unwrap().remove(0);
        let mut diags = Vec::new();
        validate(doc.get("m").unwrap(), &src, &mut diags);
        assert_eq!(diags.len(), 2);
        assert_eq!(diags[0].help.as_deref(), Some("did you mean `contains`?"));
        assert_eq!((diags[0].location.line, diags[0].location.col), (2, 3));
        assert!(diags[1].message.starts_with("invalid regex"), "{}", diags[1].message);
    }
}

//! The one matcher vocabulary for stdout, stderr, files and HTTP bodies (§3 of the language).
//!
//! A matcher is a mapping; several keys in one mapping must all hold. Matchers are validated
//! statically from the spanned tree ([`validate`]) and built at run time from the rendered
//! arguments ([`Matcher::from_json`]), since their values may be templates.

use regex::Regex;
use serde_json::Value as J;

use crate::diag::{did_you_mean, Diagnostic, Source};
use crate::report::events::Mismatch;
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
    Equals(J),
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
#[derive(Debug, Clone, PartialEq)]
pub struct MatchFailure {
    pub message: String,
    pub mismatch: Option<Mismatch>,
}

fn fail(message: impl Into<String>, expected: Option<String>, actual: &str) -> MatchFailure {
    MatchFailure {
        message: message.into(),
        mismatch: expected.map(|e| Mismatch { expected: e, actual: actual.to_string() }),
    }
}

fn text_of(v: &J) -> String {
    match v {
        J::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(200).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    format!("{t:?}")
}

impl Matcher {
    /// Build from a rendered value. A scalar is shorthand for `equals`.
    pub fn from_json(v: &J) -> Result<Matcher, String> {
        let obj = match v {
            J::Object(o) => o,
            other => return Ok(Matcher(vec![Clause::Equals(other.clone())])),
        };
        let mut clauses = Vec::new();
        for (k, v) in obj {
            let s = || v.as_str().map(str::to_string).ok_or_else(|| format!("`{k}` expects a string"));
            let n = || v.as_u64().map(|n| n as usize).ok_or_else(|| format!("`{k}` expects a non-negative integer"));
            let list = || -> Result<Vec<Matcher>, String> {
                v.as_array()
                    .ok_or_else(|| format!("`{k}` expects a list of matchers"))?
                    .iter()
                    .map(Matcher::from_json)
                    .collect()
            };
            clauses.push(match k.as_str() {
                "equals" => Clause::Equals(v.clone()),
                "contains" => Clause::Contains(text_of(v)),
                "not_contains" => Clause::NotContains(text_of(v)),
                "matches" => Clause::Matches(Regex::new(&s()?).map_err(|e| format!("invalid regex: {e}"))?),
                "starts_with" => Clause::StartsWith(text_of(v)),
                "ends_with" => Clause::EndsWith(text_of(v)),
                "empty" => Clause::Empty(v.as_bool().ok_or("`empty` expects true or false")?),
                "lines" => match v {
                    J::Array(items) => Clause::Lines(items.iter().map(text_of).collect()),
                    _ => Clause::LineCount(n()?),
                },
                "length" => Clause::Length(n()?),
                "json" => {
                    let items = v.as_array().ok_or("`json` expects a list of { path, <matcher> }")?;
                    let mut checks = Vec::new();
                    for item in items {
                        let o = item.as_object().ok_or("each `json` entry is a mapping with `path`")?;
                        let path =
                            o.get("path").and_then(J::as_str).ok_or("each `json` entry needs `path`")?.to_string();
                        parse_path(&path)?;
                        let exists = o.get("exists").and_then(J::as_bool);
                        let rest: serde_json::Map<String, J> = o
                            .iter()
                            .filter(|(k, _)| !JSON_ENTRY_EXTRA.contains(&k.as_str()))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        let matcher = if rest.is_empty() { None } else { Some(Matcher::from_json(&J::Object(rest))?) };
                        checks.push(JsonCheck { path, exists, matcher });
                    }
                    Clause::Json(checks)
                }
                "not" => Clause::Not(Box::new(Matcher::from_json(v)?)),
                "all" => Clause::All(list()?),
                "any" => Clause::Any(list()?),
                other => return Err(format!("unknown matcher `{other}`")),
            });
        }
        Ok(Matcher(clauses))
    }

    /// Check a text subject (stdout, a file, an HTTP body).
    pub fn check_text(&self, actual: &str) -> Result<(), MatchFailure> {
        self.check(&J::String(actual.to_string()))
    }

    /// Check any value; non-strings are compared as JSON and searched as their JSON text.
    pub fn check(&self, actual: &J) -> Result<(), MatchFailure> {
        for c in &self.0 {
            c.check(actual)?;
        }
        Ok(())
    }
}

impl Clause {
    fn check(&self, actual: &J) -> Result<(), MatchFailure> {
        let text = text_of(actual);
        let ok = |b: bool, msg: String, exp: Option<String>| {
            if b {
                Ok(())
            } else {
                Err(fail(msg, exp, &text))
            }
        };
        match self {
            Clause::Equals(exp) => {
                let equal = match (exp, actual) {
                    (J::String(e), a) => *e == text_of(a),
                    (e, J::String(a)) => {
                        serde_json::from_str::<J>(a).map(|a| &a == e).unwrap_or(false) || text_of(e) == *a
                    }
                    (e, a) => loose_eq(e, a),
                };
                ok(equal, format!("expected {} to equal {}", short(&text), short(&text_of(exp))), Some(text_of(exp)))
            }
            Clause::Contains(s) => ok(
                text.contains(s.as_str()),
                format!("expected {} to contain {}", short(&text), short(s)),
                Some(s.clone()),
            ),
            Clause::NotContains(s) => {
                ok(!text.contains(s.as_str()), format!("expected {} not to contain {}", short(&text), short(s)), None)
            }
            Clause::Matches(re) => {
                ok(re.is_match(&text), format!("expected {} to match /{}/", short(&text), re.as_str()), None)
            }
            Clause::StartsWith(s) => {
                ok(text.starts_with(s.as_str()), format!("expected {} to start with {}", short(&text), short(s)), None)
            }
            Clause::EndsWith(s) => {
                ok(text.ends_with(s.as_str()), format!("expected {} to end with {}", short(&text), short(s)), None)
            }
            Clause::Empty(want) => {
                let msg = if *want {
                    format!("expected empty, got {}", short(&text))
                } else {
                    "expected non-empty, got empty".to_string()
                };
                ok(text.is_empty() == *want, msg, None)
            }
            Clause::LineCount(n) => {
                let got = text.lines().count();
                ok(got == *n, format!("expected {n} lines, got {got}"), None)
            }
            Clause::Lines(lines) => {
                let got: Vec<&str> = text.lines().collect();
                let mut expected = lines.join("\n");
                if !lines.is_empty() {
                    expected.push('\n');
                }
                ok(
                    got == *lines,
                    format!("expected {} lines as listed, got {}", lines.len(), got.len()),
                    Some(expected),
                )
            }
            Clause::Length(n) => {
                let got = text.chars().count();
                ok(got == *n, format!("expected length {n}, got {got}"), None)
            }
            Clause::Json(checks) => {
                let doc: J = match actual {
                    J::String(s) => serde_json::from_str(s)
                        .map_err(|e| fail(format!("expected JSON, got {} ({e})", short(s)), None, s))?,
                    other => other.clone(),
                };
                for check in checks {
                    let found = lookup(&doc, &check.path);
                    if let Some(want) = check.exists {
                        if found.is_some() != want {
                            let msg = if want { "to exist" } else { "not to exist" };
                            return Err(fail(
                                format!("expected {} {msg} in {}", check.path, short(&doc.to_string())),
                                None,
                                &text,
                            ));
                        }
                    }
                    if let Some(m) = &check.matcher {
                        let Some(v) = found else {
                            return Err(fail(
                                format!("{} not found in {}", check.path, short(&doc.to_string())),
                                None,
                                &text,
                            ));
                        };
                        m.check(v)
                            .map_err(|f| MatchFailure { message: format!("at {}: {}", check.path, f.message), ..f })?;
                    }
                }
                Ok(())
            }
            Clause::Not(m) => match m.check(actual) {
                Ok(()) => Err(fail(format!("expected {} not to match {:?}", short(&text), m), None, &text)),
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
                Err(fail(format!("no alternative matched: {}", reasons.join("; ")), None, &text))
            }
        }
    }
}

/// Numbers compare by value (`1` equals `1.0`).
fn loose_eq(a: &J, b: &J) -> bool {
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
fn parse_path(path: &str) -> Result<Vec<Seg>, String> {
    let bad = || format!("invalid JSON path `{path}`: write it like `$.items[0].name`");
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

pub fn lookup<'a>(doc: &'a J, path: &str) -> Option<&'a J> {
    let mut cur = doc;
    for seg in parse_path(path).ok()? {
        cur = match seg {
            Seg::Key(k) => cur.get(&k)?,
            Seg::Index(i) => cur.get(i)?,
        };
    }
    Some(cur)
}

fn is_template(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// Static checks of a matcher written in a scenario: known keys, value shapes, regexes and
/// JSON paths that are not templates.
pub fn validate(node: &Node, src: &Source, diags: &mut Vec<Diagnostic>) {
    let Some(map) = node.as_map() else {
        if matches!(node.value, Value::Seq(_)) {
            diags.push(
                node.diag(src, "a matcher is a mapping such as `{ contains: ok }`, not a list")
                    .label("expected a mapping"),
            );
        }
        return;
    };
    if map.is_empty() {
        diags.push(node.diag(src, "empty matcher").help(format!("use one of: {}", key_names().join(", "))));
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
    let want = |what: &str| {
        v.diag(src, format!("`{key}` expects {what}, found {}", v.type_name())).label(format!("expected {what}"))
    };
    let scalar = matches!(v.value, Value::Str(_) | Value::Int(_) | Value::Float(_) | Value::Bool(_));
    let templ = v.as_str().is_some_and(is_template);
    match key {
        "equals" => {}
        "contains" | "not_contains" | "starts_with" | "ends_with" if !scalar => diags.push(want("a string")),
        "matches" => match v.as_str() {
            Some(re) if !is_template(re) => {
                if let Err(e) = Regex::new(re) {
                    let msg = e.to_string();
                    let last = msg.lines().last().unwrap_or("").trim().trim_start_matches("error: ").to_string();
                    diags.push(
                        v.diag(src, format!("invalid regex in `matches`: {last}"))
                            .label("not a valid regular expression"),
                    );
                }
            }
            Some(_) => {}
            None => diags.push(want("a regular expression string")),
        },
        "empty" if !matches!(v.value, Value::Bool(_)) && !templ => diags.push(want("true or false")),
        "lines" if !matches!(v.value, Value::Int(_) | Value::Seq(_)) && !templ => {
            diags.push(want("a count or a list of lines"))
        }
        "length" if !matches!(v.value, Value::Int(_)) && !templ => diags.push(want("an integer")),
        "json" => match v.as_seq() {
            Some(items) => {
                for item in items {
                    let Some(m) = item.as_map() else {
                        diags
                            .push(item.diag(src, "each `json` entry is a mapping like `{ path: \"$.a\", equals: 1 }`"));
                        continue;
                    };
                    match item.get("path") {
                        None => {
                            diags.push(item.diag(src, "missing `path` in `json` entry").help("add `path: \"$.field\"`"))
                        }
                        Some(p) => {
                            if let Some(ps) = p.as_str().filter(|s| !is_template(s)) {
                                if let Err(e) = parse_path(ps) {
                                    diags.push(p.diag(src, e));
                                }
                            }
                        }
                    }
                    for (ek, ev) in m {
                        let ek_text = ek.key_text();
                        if ek_text == "path" {
                            continue;
                        }
                        if ek_text == "exists" {
                            if !matches!(ev.value, Value::Bool(_)) {
                                diags.push(ev.diag(src, "`exists` expects true or false"));
                            }
                            continue;
                        }
                        validate_clause(&ek_text, ek, ev, src, diags);
                    }
                }
            }
            None => diags.push(want("a list of { path, <matcher> } entries")),
        },
        "not" => validate(v, src, diags),
        "all" | "any" => match v.as_seq() {
            Some(items) => items.iter().for_each(|m| validate(m, src, diags)),
            None => diags.push(want("a list of matchers")),
        },
        "contains" | "not_contains" | "starts_with" | "ends_with" | "empty" | "lines" | "length" => {}
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

    fn m(v: J) -> Matcher {
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
        assert_eq!(f.mismatch, Some(Mismatch { expected: "a\nb\n".into(), actual: "a\nc\n".into() }));
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

//! Step arguments: the one checker from the registry's field types to typed values.
//!
//! `scenario-run check` runs [`convert`] on every literal value (one without `{{ }}` expressions) of a step, and
//! the runner runs [`convert_step`] on every step's rendered arguments before the step runs,
//! so a value is accepted, converted and refused by the same rules and with the same message
//! whether it was written or rendered. Steps read the typed [`Args`] and check no types.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value as JsonValue;

use super::kinds::{Field, FieldType, StepKind};
use crate::diag::did_you_mean;
use crate::matcher::Matcher;

/// The highest signal number (SIGRTMAX on Linux).
const MAX_SIGNAL: i64 = 64;

/// One argument, converted.
#[derive(Debug, Clone)]
pub enum ArgValue {
    Str(String),
    Int(i64),
    Bool(bool),
    Duration(Duration),
    StrMap(BTreeMap<String, String>),
    StrList(Vec<String>),
    IntList(Vec<i64>),
    Matcher(Box<Matcher>),
    /// `Any` and `Expr` values, as rendered.
    Json(JsonValue),
    /// A nested mapping with its own fields.
    Object(Args),
}

/// Why a value was refused: what `check` reports at the value and a rendered step fails with.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgError {
    pub message: String,
    /// The short label `check` puts under the value.
    pub label: Option<String>,
    pub help: Option<String>,
    /// The key inside the value that is wrong (an entry of a map of strings), so `check` can
    /// point at it.
    pub entry: Option<String>,
}

impl ArgError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), label: None, help: None, entry: None }
    }
    fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }
    fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What a value is, for messages: its type, and a scalar's value (cut short).
pub fn found(v: &JsonValue) -> String {
    let shown = |s: String| {
        let cut: String = s.chars().take(60).collect();
        if cut.len() < s.len() {
            format!("{cut}…")
        } else {
            cut
        }
    };
    match v {
        JsonValue::Null => "null".into(),
        JsonValue::Bool(b) => format!("a boolean {b}"),
        JsonValue::Number(n) if n.is_i64() || n.is_u64() => format!("an integer {}", shown(n.to_string())),
        JsonValue::Number(n) => format!("a number {}", shown(n.to_string())),
        JsonValue::String(s) => format!("a string {}", shown(serde_json::to_string(s).unwrap_or_default())),
        JsonValue::Array(_) => "a list".into(),
        JsonValue::Object(_) => "a mapping".into(),
    }
}

fn wrong_type(key: &str, what: &str, v: &JsonValue) -> ArgError {
    ArgError::new(format!("`{key}` must be {what}, found {}", found(v))).label(format!("expected {what}"))
}

/// The text of a scalar: strings as they are, numbers and booleans in their usual form.
fn scalar_text(v: &JsonValue) -> Option<String> {
    match v {
        JsonValue::String(s) => Some(s.clone()),
        JsonValue::Number(n) => Some(n.to_string()),
        JsonValue::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// An integer, or a string holding one.
fn int(v: &JsonValue) -> Option<i64> {
    match v {
        JsonValue::Number(n) => n.as_i64(),
        JsonValue::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Convert one (non-null) value of `field` of step `owner` (`http-get.expect` for a nested
/// field). Strings stand for numbers and booleans too, since a template inside a longer
/// string renders to one: `"8000"` is an integer, `"True"` a boolean.
pub fn convert(owner: &str, field: &Field, v: &JsonValue) -> Result<ArgValue, ArgError> {
    let key = field.name;
    match field.ty {
        FieldType::Str => scalar_text(v).map(ArgValue::Str).ok_or_else(|| wrong_type(key, "a string", v)),
        FieldType::Int => int(v).map(ArgValue::Int).ok_or_else(|| wrong_type(key, "an integer", v)),
        FieldType::Range(lo, hi) => int(v)
            .filter(|n| (lo..=hi).contains(n))
            .map(ArgValue::Int)
            .ok_or_else(|| wrong_type(key, &format!("an integer from {lo} to {hi}"), v)),
        FieldType::IntList => match v {
            JsonValue::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| int(item).ok_or_else(|| wrong_type(&format!("{key}[{i}]"), "an integer", item)))
                .collect::<Result<_, _>>()
                .map(ArgValue::IntList),
            other => int(other)
                .map(|n| ArgValue::IntList(vec![n]))
                .ok_or_else(|| wrong_type(key, "an integer or a list of integers", other)),
        },
        FieldType::Bool => {
            let b = match v {
                JsonValue::Bool(b) => Some(*b),
                JsonValue::String(s) if s.trim().eq_ignore_ascii_case("true") => Some(true),
                JsonValue::String(s) if s.trim().eq_ignore_ascii_case("false") => Some(false),
                _ => None,
            };
            b.map(ArgValue::Bool).ok_or_else(|| wrong_type(key, "true or false", v))
        }
        FieldType::Duration => {
            let bad = |e: &dyn std::fmt::Display| {
                ArgError::new(format!("bad duration for `{key}`: {e}"))
                    .label("not a duration")
                    .help(crate::duration::HINT)
            };
            match v {
                JsonValue::Number(n) => crate::duration::from_secs_f64(n.as_f64().unwrap_or(f64::INFINITY)),
                JsonValue::String(s) => crate::duration::parse(s),
                other => return Err(bad(&format_args!("found {}", found(other)))),
            }
            .map(ArgValue::Duration)
            .map_err(|e| bad(&e))
        }
        FieldType::StrMap => {
            let JsonValue::Object(m) = v else { return Err(wrong_type(key, "a mapping of strings", v)) };
            let mut out = BTreeMap::new();
            for (k, val) in m {
                let text = match val {
                    JsonValue::Null => String::new(),
                    other => scalar_text(other).ok_or_else(|| ArgError {
                        entry: Some(k.clone()),
                        ..wrong_type(&format!("{key}.{k}"), "a string", other)
                    })?,
                };
                out.insert(k.clone(), text);
            }
            Ok(ArgValue::StrMap(out))
        }
        FieldType::StrList => match v {
            JsonValue::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| scalar_text(item).ok_or_else(|| wrong_type(&format!("{key}[{i}]"), "a string", item)))
                .collect::<Result<_, _>>()
                .map(ArgValue::StrList),
            other => scalar_text(other)
                .map(|s| ArgValue::StrList(vec![s]))
                .ok_or_else(|| wrong_type(key, "a list of strings", other)),
        },
        FieldType::Matcher => Matcher::from_json(v)
            .map(|m| ArgValue::Matcher(Box::new(m)))
            .map_err(|e| ArgError::new(format!("`{key}`: {e}")).label("not a matcher")),
        FieldType::Enum(options) => match v {
            JsonValue::String(s) => match options.iter().find(|o| o.eq_ignore_ascii_case(s.trim())) {
                Some(o) => Ok(ArgValue::Str(o.to_string())),
                None => {
                    let help = did_you_mean(s, options.iter().copied())
                        .map_or_else(|| format!("one of: {}", options.join(", ")), |o| format!("did you mean `{o}`?"));
                    Err(ArgError::new(format!("invalid value `{s}` for `{key}` of `{owner}`"))
                        .label("not allowed")
                        .help(help))
                }
            },
            other => Err(wrong_type(key, &format!("one of {}", options.join(", ")), other)),
        },
        FieldType::Signal => {
            let numbered = |n: Option<i64>| {
                n.filter(|n| (1..=MAX_SIGNAL).contains(n))
                    .map(ArgValue::Int)
                    .ok_or_else(|| wrong_type(key, &format!("a signal name or a number from 1 to {MAX_SIGNAL}"), v))
            };
            match v {
                JsonValue::Number(n) => numbered(n.as_i64()),
                JsonValue::String(s) if s.trim().starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '+') => {
                    numbered(s.trim().parse().ok())
                }
                JsonValue::String(s) => match signal_number(s) {
                    Ok(n) => numbered(Some(i64::from(n))),
                    Err(e) => Err(ArgError::new(e.to_string()).label("unknown signal")),
                },
                other => Err(wrong_type(key, "a signal name or number", other)),
            }
        }
        // An expression (a string), or a value whose truth counts (a rendered one).
        FieldType::Expr | FieldType::Any => Ok(ArgValue::Json(v.clone())),
        FieldType::Object(spec) => match v {
            JsonValue::Object(m) => convert_map(&format!("{owner}.{key}"), spec, false, m).map(ArgValue::Object),
            other => Err(wrong_type(key, "a mapping", other)),
        },
    }
}

/// Where a key of a step's (or nested object's) mapping goes.
pub enum Slot {
    Field(&'static Field),
    /// A matcher key (`contains`) of a matcher step.
    Matcher,
    Unknown,
}

pub fn slot(spec: &'static [Field], matcher: bool, key: &str) -> Slot {
    match spec.iter().find(|f| f.name == key) {
        Some(f) => Slot::Field(f),
        None if matcher && crate::matcher::KEYS.iter().any(|(m, _)| *m == key) => Slot::Matcher,
        None => Slot::Unknown,
    }
}

/// The names a mapping of these fields may have, for did-you-mean.
pub fn known_keys(spec: &[Field], matcher: bool) -> Vec<&'static str> {
    let mut known: Vec<&'static str> = spec.iter().map(|f| f.name).collect();
    if matcher {
        known.extend(crate::matcher::KEYS.iter().map(|(k, _)| *k));
    }
    known
}

pub fn unknown_field(owner: &str, key: &str, known: &[&str]) -> ArgError {
    let e = ArgError::new(format!("unknown field `{key}` for `{owner}`")).label("unknown field");
    match did_you_mean(key, known.iter().copied()) {
        Some(s) => e.help(format!("did you mean `{s}`?")),
        None => e.help(format!("known fields: {}", known.join(", "))),
    }
}

pub fn missing_field(owner: &str, field: &Field) -> ArgError {
    ArgError::new(format!("missing required field `{}` for `{owner}`", field.name))
        .help(format!("`{}`: {}", field.name, field.doc))
}

/// A matcher step (`assert-stdout`) given no matcher key (`assert-file` may check existence only).
pub fn needs_matcher(owner: &str) -> Option<ArgError> {
    (owner != "assert-file").then(|| {
        let keys: Vec<&str> = crate::matcher::KEYS.iter().map(|(k, _)| *k).collect();
        ArgError::new(format!("`{owner}` needs a matcher"))
            .help(format!("for example `{{ contains: ok }}`; matchers: {}", keys.join(", ")))
    })
}

/// Convert a mapping of fields; null values count as not given.
fn convert_map(
    owner: &str,
    spec: &'static [Field],
    matcher: bool,
    map: &serde_json::Map<String, JsonValue>,
) -> Result<Args, ArgError> {
    let mut args = Args::default();
    let mut rest = serde_json::Map::new();
    for (k, v) in map.iter().filter(|(_, v)| !v.is_null()) {
        match slot(spec, matcher, k) {
            Slot::Field(f) => {
                args.values.insert(f.name, convert(owner, f, v)?);
            }
            Slot::Matcher => {
                rest.insert(k.clone(), v.clone());
            }
            Slot::Unknown => return Err(unknown_field(owner, k, &known_keys(spec, matcher))),
        }
    }
    if let Some(f) = spec.iter().find(|f| f.required && !args.values.contains_key(f.name)) {
        return Err(missing_field(owner, f));
    }
    if matcher {
        if rest.is_empty() {
            if let Some(e) = needs_matcher(owner) {
                return Err(e);
            }
        } else {
            let m = Matcher::from_json(&JsonValue::Object(rest)).map_err(|e| ArgError::new(e.to_string()))?;
            args.matcher = Some(Box::new(m));
        }
    }
    Ok(args)
}

/// A step's rendered arguments (a mapping: the main-field shorthand is expanded when the
/// scenario is loaded), converted by the step kind's fields.
pub fn convert_step(kind: &StepKind, rendered: &JsonValue) -> Result<Args, ArgError> {
    let empty = serde_json::Map::new();
    let map = match rendered {
        JsonValue::Object(m) => m,
        JsonValue::Null => &empty,
        _ if kind.free_keys => {
            return Err(ArgError::new(format!("`{}` takes a mapping of names to values", kind.name)))
        }
        other => {
            return Err(ArgError::new(format!("`{}` takes a mapping of fields, found {}", kind.name, found(other))))
        }
    };
    if kind.free_keys {
        return Ok(Args { free: map.clone(), ..Args::default() });
    }
    convert_map(kind.name, kind.fields, kind.matcher, map)
}

/// A step's arguments, converted: what the step's fields say, already checked.
///
/// The getters take a field's name; a field that was not given (or was null) reads as absent.
/// Reading a field as another type than the registry gives it is a bug in the step, caught
/// by the step tests (debug builds assert it).
#[derive(Debug, Clone, Default)]
pub struct Args {
    values: BTreeMap<&'static str, ArgValue>,
    /// The matcher keys of a matcher step (`contains: ok`), as one matcher.
    matcher: Option<Box<Matcher>>,
    /// Every key of a `free_keys` step (`set`).
    free: serde_json::Map<String, JsonValue>,
}

macro_rules! wrong_getter {
    ($key:expr, $v:expr, $want:literal) => {{
        debug_assert!(false, "field `{}` read as {} but it is {:?}", $key, $want, $v);
        None
    }};
}

impl Args {
    pub fn has(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    pub fn opt_str(&self, key: &str) -> Option<&str> {
        match self.values.get(key)? {
            ArgValue::Str(s) => Some(s),
            other => wrong_getter!(key, other, "a string"),
        }
    }

    /// A string field (required ones are always there; an absent one reads as "").
    pub fn str(&self, key: &str) -> &str {
        self.opt_str(key).unwrap_or_default()
    }

    /// An `Int` field, or a `Signal` (its number).
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.values.get(key)? {
            ArgValue::Int(n) => Some(*n),
            other => wrong_getter!(key, other, "an integer"),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Option<bool> {
        match self.values.get(key)? {
            ArgValue::Bool(b) => Some(*b),
            other => wrong_getter!(key, other, "a boolean"),
        }
    }

    /// A flag: false unless given as true.
    pub fn flag(&self, key: &str) -> bool {
        self.opt_bool(key).unwrap_or(false)
    }

    pub fn duration(&self, key: &str) -> Option<Duration> {
        match self.values.get(key)? {
            ArgValue::Duration(d) => Some(*d),
            other => wrong_getter!(key, other, "a duration"),
        }
    }

    /// A map of strings (empty when not given).
    pub fn str_map(&self, key: &str) -> BTreeMap<String, String> {
        match self.values.get(key) {
            None => BTreeMap::new(),
            Some(ArgValue::StrMap(m)) => m.clone(),
            Some(other) => wrong_getter!(key, other, "a map of strings").unwrap_or_default(),
        }
    }

    /// A list of strings (empty when not given).
    pub fn str_list(&self, key: &str) -> Vec<String> {
        match self.values.get(key) {
            None => Vec::new(),
            Some(ArgValue::StrList(l)) => l.clone(),
            Some(other) => wrong_getter!(key, other, "a list of strings").unwrap_or_default(),
        }
    }

    /// A list of integers, if given.
    pub fn int_list(&self, key: &str) -> Option<&[i64]> {
        match self.values.get(key)? {
            ArgValue::IntList(l) => Some(l),
            other => wrong_getter!(key, other, "a list of integers"),
        }
    }

    /// An `Any` or `Expr` value as rendered.
    pub fn json(&self, key: &str) -> Option<&JsonValue> {
        match self.values.get(key)? {
            ArgValue::Json(v) => Some(v),
            other => wrong_getter!(key, other, "a JSON value"),
        }
    }

    /// A `Matcher` field.
    pub fn field_matcher(&self, key: &str) -> Option<&Matcher> {
        match self.values.get(key)? {
            ArgValue::Matcher(m) => Some(m),
            other => wrong_getter!(key, other, "a matcher"),
        }
    }

    /// A nested `Object` field.
    pub fn object(&self, key: &str) -> Option<&Args> {
        match self.values.get(key)? {
            ArgValue::Object(a) => Some(a),
            other => wrong_getter!(key, other, "a mapping"),
        }
    }

    /// The matcher of a matcher step (its matcher keys), if it has one.
    pub fn matcher(&self) -> Option<&Matcher> {
        self.matcher.as_deref()
    }

    /// All keys of a `free_keys` step, as rendered.
    pub fn free(&self) -> &serde_json::Map<String, JsonValue> {
        &self.free
    }
}

/// A signal name [`signal_number`] does not know (upper case, without `SIG`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown signal `{0}`: use TERM, KILL, INT, HUP, USR1, USR2, STOP, CONT or a number")]
pub struct UnknownSignal(pub String);

/// Signal names authors write (`TERM`, `SIGTERM`, `sigterm`), to numbers.
pub fn signal_number(name: &str) -> Result<i32, UnknownSignal> {
    let s = name.trim().to_ascii_uppercase();
    let s = s.trim_start_matches("SIG");
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    Ok(match s {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "CONT" => libc::SIGCONT,
        other => return Err(UnknownSignal(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::kinds::lookup;

    fn step(kind: &str, args: JsonValue) -> Result<Args, String> {
        convert_step(lookup(kind).expect("kind"), &args).map_err(|e| e.message)
    }

    #[test]
    fn unknown_signals_name_what_was_written() {
        assert_eq!(signal_number(" sigterm "), Ok(libc::SIGTERM));
        assert_eq!(signal_number("sigfoo"), Err(UnknownSignal("FOO".into())));
        assert_eq!(
            signal_number("foo").unwrap_err().to_string(),
            "unknown signal `FOO`: use TERM, KILL, INT, HUP, USR1, USR2, STOP, CONT or a number"
        );
    }

    #[test]
    fn strings_stand_for_numbers_and_booleans_and_enums_take_their_canonical_case() {
        let a = step("exec", json!({ "cmd": 7, "exit_code": " 3 ", "background": "True", "timeout": 1.5 })).unwrap();
        assert_eq!((a.str("cmd"), a.int("exit_code"), a.flag("background")), ("7", Some(3), true));
        assert_eq!(a.duration("timeout"), Some(Duration::from_millis(1500)));
        let a = step("http", json!({ "method": "post", "url": "u" })).unwrap();
        assert_eq!(a.str("method"), "POST");
        let a = step("signal", json!({ "pid": 9, "signal": "term" })).unwrap();
        assert_eq!(a.int("signal"), Some(i64::from(libc::SIGTERM)));
        let a =
            step("create", json!({ "network": { "allow_out": "10.0.0.1", "deny_out": ["0.0.0.0/0", 7] } })).unwrap();
        let n = a.object("network").unwrap();
        assert_eq!(
            (n.str_list("allow_out"), n.str_list("deny_out")),
            (vec!["10.0.0.1".into()], vec!["0.0.0.0/0".into(), "7".into()])
        );
        let a = step("signal", json!({ "pid": 9, "signal": "15" })).unwrap();
        assert_eq!(a.int("signal"), Some(15));
    }

    #[test]
    fn what_is_refused() {
        let bad = [
            (
                "exec",
                json!({ "cmd": "x", "background": "yes" }),
                "`background` must be true or false, found a string \"yes\"",
            ),
            ("exec", json!({ "cmd": "x", "background": 1 }), "`background` must be true or false, found an integer 1"),
            (
                "exec",
                json!({ "cmd": "x", "exit_code": 1.5 }),
                "`exit_code` must be an integer from -255 to 255, found a number 1.5",
            ),
            ("exec", json!({ "cmd": ["x"] }), "`cmd` must be a string, found a list"),
            ("exec", json!({ "cmd": "x", "cwdd": "/" }), "unknown field `cwdd` for `exec`"),
            ("exec", json!({ "cmd": "x", "env": { "A": [1] } }), "`env.A` must be a string, found a list"),
            ("assert-stdout", json!({ "of": "a" }), "`assert-stdout` needs a matcher"),
            ("assert-stdout", json!({ "matches": "(" }), "invalid regex in `matches`: unclosed group"),
            ("create", json!({ "network": { "allow_out": [], "x": 1 } }), "unknown field `x` for `create.network`"),
            ("set", json!("x"), "`set` takes a mapping of names to values"),
            ("http-get", json!({ "port": 0 }), "`port` must be an integer from 1 to 65535, found an integer 0"),
            ("pty", json!({ "cols": "70000" }), "`cols` must be an integer from 1 to 65535, found a string \"70000\""),
            (
                "http-get",
                json!({ "url": "u", "expect": { "status": [200, "2xx"] } }),
                "`status[1]` must be an integer, found a string \"2xx\"",
            ),
            (
                "signal",
                json!({ "pid": 1, "signal": "BOGUS" }),
                "unknown signal `BOGUS`: use TERM, KILL, INT, HUP, USR1, USR2, STOP, CONT or a number",
            ),
            (
                "create",
                json!({ "network": { "allow_out": [["10.0.0.1"]] } }),
                "`allow_out[0]` must be a string, found a list",
            ),
            (
                "create",
                json!({ "network": { "deny_out": { "a": 1 } } }),
                "`deny_out` must be a list of strings, found a mapping",
            ),
        ];
        for (kind, args, want) in bad {
            assert_eq!(step(kind, args.clone()).unwrap_err(), want, "{kind} {args}");
        }
    }

    /// Issue 26 item 5: integers were cast with `as` where the step used them, so
    /// `exit_code: 4294967296` expected 0 (and passed on exit 0), and a negative `cpu` or
    /// `memory` became a huge one. Each integer field has its range, checked with the types.
    #[test]
    fn integers_out_of_their_range_are_refused_not_truncated() {
        let bad = [
            (
                "exec",
                json!({ "cmd": "x", "exit_code": 4294967296_i64 }),
                "`exit_code` must be an integer from -255 to 255, found an integer 4294967296",
            ),
            (
                "host",
                json!({ "cmd": "x", "exit_code": "256" }),
                "`exit_code` must be an integer from -255 to 255, found a string \"256\"",
            ),
            (
                "pty",
                json!({ "exit_code": -4294967296_i64 }),
                "`exit_code` must be an integer from -255 to 255, found an integer -4294967296",
            ),
            (
                "assert-exit",
                json!({ "code": 4294967296_i64 }),
                "`code` must be an integer from -255 to 255, found an integer 4294967296",
            ),
            ("create", json!({ "cpu": -1 }), "`cpu` must be an integer from 1 to 1024, found an integer -1"),
            (
                "create",
                json!({ "memory": -512 }),
                "`memory` must be an integer from 1 to 1048576, found an integer -512",
            ),
            (
                "create",
                json!({ "memory": "18446744073709551615" }),
                "`memory` must be an integer from 1 to 1048576, found a string \"18446744073709551615\"",
            ),
            (
                "signal",
                json!({ "pid": 4294967297_i64 }),
                "`pid` must be an integer from 1 to 2147483647, found an integer 4294967297",
            ),
            ("wait", json!({ "pid": 0 }), "`pid` must be an integer from 1 to 2147483647, found an integer 0"),
            (
                "signal",
                json!({ "pid": 9, "signal": 4294967311_i64 }),
                "`signal` must be a signal name or a number from 1 to 64, found an integer 4294967311",
            ),
            (
                "signal",
                json!({ "pid": 9, "signal": "-9" }),
                "`signal` must be a signal name or a number from 1 to 64, found a string \"-9\"",
            ),
        ];
        for (kind, args, want) in bad {
            assert_eq!(step(kind, args.clone()).unwrap_err(), want, "{kind} {args}");
        }
        let a = step("exec", json!({ "cmd": "x", "exit_code": -1 })).unwrap();
        assert_eq!(a.int("exit_code"), Some(-1), "a platform's -1 for a signal is still written");
    }

    #[test]
    fn null_is_not_given_and_matchers_are_built_once() {
        let e = step("exec", json!({ "cmd": null })).unwrap_err();
        assert_eq!(e, "missing required field `cmd` for `exec`");
        let a = step("exec", json!({ "cmd": "x", "cwd": null })).unwrap();
        assert!(!a.has("cwd") && a.opt_str("cwd").is_none());
        let a = step("assert-file", json!({ "path": "/p", "contains": "hi" })).unwrap();
        assert!(a.matcher().is_some_and(|m| m.check_text("oh hi").is_ok() && m.check_text("no").is_err()));
        assert!(step("assert-file", json!({ "path": "/p", "exists": false })).unwrap().matcher().is_none());
        let a = step("set", json!({ "who": "bob", "n": null })).unwrap();
        assert_eq!(JsonValue::Object(a.free().clone()), json!({ "who": "bob", "n": null }));
    }
}

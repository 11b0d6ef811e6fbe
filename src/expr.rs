//! Expressions: minijinja with strict undefined, the variables scenarios see, and static checks.
//! (Not template folders, the `templates/<name>` a sandbox is built from: those are
//! [`crate::templates`].)
//!
//! Every string in a step's arguments may hold expressions (`{{ … }}`). At `check` time each one is compiled
//! (syntax errors) and its variables are resolved against what is knowable statically (file
//! `vars`, `--var`, matrix keys, earlier step ids and their outputs, sandbox aliases). At run
//! time it is rendered against the live context; a single `{{ expr }}` keeps the expression's
//! type, so `port: "{{ vars.port }}"` stays a number.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, OnceLock};

use std::error::Error as _;

use base64::Engine as _;
use minijinja::value::{Object, Value as MValue};
use minijinja::{Environment, Error, ErrorKind, State, UndefinedBehavior};
use serde_json::Value as JsonValue;

use crate::diag::{did_you_mean, Diagnostic, Source};
use crate::yaml::{Node, Value};

pub mod explain;

pub const ROOTS: &[&str] =
    &["vars", "env", "matrix", "steps", "sandbox", "sandboxes", "run", "scenario", "provider", "params"];

pub fn is_expression(s: &str) -> bool {
    s.contains("{{") || s.contains("{%")
}

/// Whether a string anywhere under the node is a template: its value is known only when
/// rendered, and checked then.
pub fn has_template(v: &crate::yaml::Node) -> bool {
    use crate::yaml::Value;
    match &v.value {
        Value::Str(s) => is_expression(s),
        Value::Seq(items) => items.iter().any(has_template),
        Value::Map(m) => m.iter().any(|(_, val)| has_template(val)),
        _ => false,
    }
}

/// The shared environment: strict undefined plus a few filters QA scripts need.
pub fn env() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut e = Environment::new();
        e.set_undefined_behavior(UndefinedBehavior::Strict);
        e.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .keep_trailing_newline(true)
                .build()
                .expect("default syntax with kept newlines"),
        );
        e.add_filter("b64encode", |s: String| base64::engine::general_purpose::STANDARD.encode(s));
        // Python's habits: `'x'.startswith('y')`, `.split()`, `.strip()`, `d.items()`, ...
        e.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // Bytes, as Python's `base64.b64decode`: `| length` counts bytes, `| sha256` hashes
        // them, and a text renders as its UTF-8 (a binary file is not refused).
        e.add_filter("b64decode", |s: String| -> Result<MValue, Error> {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s.trim())
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("invalid base64: {e}")))?;
            Ok(MValue::from_bytes(bytes))
        });
        e.add_filter("sha256", |v: MValue| -> Result<String, Error> {
            use sha2::Digest as _;
            let bytes = v.as_bytes().ok_or_else(|| {
                Error::new(ErrorKind::InvalidOperation, format!("sha256 takes a string or bytes, not {}", v.kind()))
            })?;
            Ok(hex::encode(sha2::Sha256::digest(bytes)))
        });
        e.add_filter("fromjson", |s: String| -> Result<MValue, Error> {
            let v: JsonValue = serde_json::from_str(&s)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("invalid JSON: {e}")))?;
            Ok(MValue::from(minijinja::value::Serde(v)))
        });
        e
    })
}

/// A sandbox as templates see it: `id`, `template`, `alias`, `url(port)`, `host(port)`; a
/// copy, made for each render, of the scenario's `steps::SandboxRef` without what only the
/// runner uses (expressions sit below steps, so they do not see that type).
/// Port URLs are resolved before rendering (see [`ports_in`]), since providers are async.
#[derive(Debug, Clone)]
pub struct SandboxView {
    pub id: String,
    pub template: String,
    pub alias: Option<String>,
    pub urls: HashMap<u16, String>,
}

impl Object for SandboxView {
    fn get_value(self: &Arc<Self>, key: &MValue) -> Option<MValue> {
        match key.as_str()? {
            "id" => Some(MValue::from(self.id.clone())),
            "template" => Some(MValue::from(self.template.clone())),
            "alias" => Some(self.alias.clone().map_or(MValue::from(()), MValue::from)),
            _ => None,
        }
    }

    fn call_method(
        self: &Arc<Self>,
        _state: &mut State<'_, '_>,
        method: &str,
        args: &[MValue],
    ) -> Result<MValue, Error> {
        let port = || -> Result<u16, Error> {
            args.first()
                .and_then(|v| u16::try_from(v.clone()).ok().or_else(|| v.as_str()?.parse().ok()))
                .ok_or_else(|| Error::new(ErrorKind::InvalidOperation, format!("{method}() takes a port number")))
        };
        match method {
            "url" | "host" => {
                let p = port()?;
                let url = self.urls.get(&p).ok_or_else(|| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        format!("port {p} was not resolved; write the port as a number literal: {method}({p})"),
                    )
                })?;
                Ok(MValue::from(if method == "url" { url.clone() } else { strip_scheme(url).to_string() }))
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        }
    }

    fn render(self: &Arc<Self>, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

pub fn strip_scheme(url: &str) -> &str {
    url.split_once("://").map_or(url, |(_, rest)| rest).trim_end_matches('/')
}

/// Literal ports used in `url(N)` / `host(N)` calls, to resolve before rendering.
pub fn ports_in(text: &str) -> Vec<u16> {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    let re = RE.get_or_init(|| regex::Regex::new(r"\b(?:url|host)\(\s*(\d{1,5})\s*\)").unwrap());
    re.captures_iter(text).filter_map(|c| c[1].parse().ok()).collect()
}

/// A rendering failure, with the position inside the expression when minijinja knows it.
#[derive(Debug, Clone)]
pub struct RenderError {
    pub message: String,
    pub line_in_expr: Option<usize>,
}

fn describe(e: &Error) -> String {
    let mut msg = match e.kind() {
        ErrorKind::UndefinedError => "undefined value".to_string(),
        _ => e.kind().to_string(),
    };
    if let Some(detail) = e.detail() {
        msg = format!("{msg}: {detail}");
    }
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

/// `{{ expr }}` and nothing else (surrounding text, even a newline, makes it a template).
fn single_expression(s: &str) -> Option<&str> {
    let inner = s.strip_prefix("{{")?.strip_suffix("}}")?;
    (!inner.contains("{{") && !inner.contains("}}") && !s.contains("{%")).then_some(inner.trim())
}

/// `{{ expr }}` and nothing else: `that: "{{ x == 1 }}"` is the expression `x == 1`.
pub fn is_lone_expression(s: &str) -> bool {
    single_expression(s).is_some()
}

/// Render one string. A lone `{{ expr }}` keeps the expression's type.
pub fn render_str(s: &str, ctx: &MValue) -> Result<JsonValue, RenderError> {
    if !is_expression(s) {
        return Ok(JsonValue::String(s.to_string()));
    }
    let err = |e: Error| RenderError { message: describe(&e), line_in_expr: e.line() };
    if let Some(expr) = single_expression(s) {
        let compiled = env().compile_expression(expr).map_err(err)?;
        let v = compiled.eval(ctx.clone()).map_err(err)?;
        if v.is_undefined() {
            return Err(RenderError { message: format!("undefined value: `{expr}`"), line_in_expr: Some(1) });
        }
        if v.as_object().is_some_and(|o| o.downcast_ref::<SandboxView>().is_some()) {
            return Ok(JsonValue::String(v.to_string()));
        }
        // Bytes (`b64decode`) as a value are their text, as they render inside a template
        // (serde would make a list of numbers of them).
        if v.kind() == minijinja::value::ValueKind::Bytes {
            return Ok(JsonValue::String(v.to_string()));
        }
        return serde_json::to_value(&v).map_err(|e| RenderError { message: e.to_string(), line_in_expr: None });
    }
    env().render_str(s, ctx.clone()).map(JsonValue::String).map_err(err)
}

/// Evaluate a condition (`if:`, `assert: { that: }`). Braces are optional.
pub fn eval_bool(expr: &str, ctx: &MValue) -> Result<bool, RenderError> {
    let e = single_expression(expr).unwrap_or(expr.trim());
    let err = |e: Error| RenderError { message: describe(&e), line_in_expr: e.line() };
    let compiled = env().compile_expression(e).map_err(err)?;
    Ok(compiled.eval(ctx.clone()).map_err(err)?.is_true())
}

/// Render a node tree into JSON, rendering every string with expressions.
pub fn render_node(node: &Node, ctx: &MValue) -> Result<JsonValue, (RenderError, u32, u32)> {
    match &node.value {
        Value::Str(s) => render_str(s, ctx).map_err(|e| {
            let (line, col) = position(node, e.line_in_expr);
            (e, line, col)
        }),
        Value::Seq(items) => {
            items.iter().map(|n| render_node(n, ctx)).collect::<Result<Vec<_>, _>>().map(JsonValue::Array)
        }
        Value::Map(m) => {
            let mut out = serde_json::Map::new();
            for (k, v) in m {
                out.insert(k.key_text(), render_node(v, ctx)?);
            }
            Ok(JsonValue::Object(out))
        }
        _ => Ok(node.to_json()),
    }
}

/// Position in the file of a line inside a scalar with expressions.
pub fn position(node: &Node, line_in_expr: Option<usize>) -> (u32, u32) {
    match line_in_expr {
        Some(l) if l > 1 || node.block => (node.line + l as u32 - 1 + u32::from(node.block), node.col),
        _ => (node.line, node.col),
    }
}

/// What is known statically at a point of a scenario, for checking variable references.
#[derive(Debug, Default, Clone)]
pub struct Scope {
    pub vars: BTreeSet<String>,
    pub matrix: BTreeSet<String>,
    /// step id -> output names (empty: unknown, accept anything)
    pub steps: BTreeMap<String, Vec<String>>,
    /// ids defined anywhere in the scenario (later ones give a better message)
    pub later_steps: BTreeSet<String>,
    pub aliases: BTreeSet<String>,
    /// A `create` or `connect` came before this point.
    pub has_sandbox: bool,
    /// Inside a steps file run by `include:`, the parameters it declares; `None` elsewhere.
    pub params: Option<BTreeSet<String>>,
    /// Suggestions made over large candidate sets so far (see [`Scope::suggest`]).
    pub suggestions: std::cell::Cell<u32>,
}

/// Candidate sets up to this size always get a suggestion.
const SMALL_SET: usize = 64;
/// Suggestions over larger sets, per scenario: each one compares the word with every name.
const LARGE_SET_SUGGESTIONS: u32 = 64;

impl Scope {
    /// `did you mean` over names the scenario defines (vars, step ids, aliases). A file with
    /// thousands of names and thousands of typos would make every typo scan every name
    /// (quadratic: 4,000 of each took a minute), so after [`LARGE_SET_SUGGESTIONS`] such
    /// scans in one scenario large sets get no suggestion; the problems are all reported.
    pub fn suggest<'a>(&self, word: &str, names: impl ExactSizeIterator<Item = &'a str>) -> Option<&'a str> {
        if names.len() > SMALL_SET {
            let spent = self.suggestions.get();
            if spent >= LARGE_SET_SUGGESTIONS {
                return None;
            }
            self.suggestions.set(spent + 1);
        }
        did_you_mean(word, names)
    }
}

/// Compile a string with expressions and check its variables; push diagnostics.
pub fn check(node: &Node, text: &str, scope: &Scope, src: &Source, diags: &mut Vec<Diagnostic>) {
    if !is_expression(text) {
        return;
    }
    let compiled = match single_expression(text) {
        Some(expr) => env().compile_expression(expr).map(|e| e.undeclared_variables(true)),
        None => env().template_from_str(text).map(|t| t.undeclared_variables(true)),
    };
    let names = match compiled {
        Ok(names) => names,
        Err(e) => {
            let (line, col) = position(node, e.line());
            let mut d = Diagnostic::new(src, line, col, node.len, format!("template syntax error: {}", describe(&e)));
            d = d
                .label("in this template")
                .help("templates use minijinja (Jinja2) syntax: `{{ vars.name }}`, `{{ steps.id.stdout | trim }}`");
            diags.push(d);
            return;
        }
    };
    let mut names: Vec<String> = names.into_iter().collect();
    names.sort();
    for name in names {
        if let Some(msg) = check_name(&name, scope) {
            let (message, help) = msg;
            diags.push(node.diag(src, message).label("in this template").help_opt(help));
        }
    }
    // Filters, tests and methods are looked up only when the expression runs: one that does
    // not exist would fail after a sandbox (or a build) was paid for.
    for u in unknown_calls(text) {
        let (line, col) = position(node, Some(u.line));
        diags.push(Diagnostic::new(src, line, col, node.len, u.message).label("in this template").help_opt(u.help));
    }
}

/// A filter, test or method an expression calls that does not exist, found by [`unknown_calls`].
#[derive(Debug, PartialEq)]
pub struct UnknownCall {
    pub message: String,
    pub help: Option<String>,
    /// The line of the text it is on (1-based).
    pub line: usize,
}

/// The filters every expression may use (minijinja's built-in ones and ours), for
/// `did you mean`; whether one exists is asked of the environment itself.
const FILTERS: &[&str] = &[
    "abs",
    "attr",
    "b64decode",
    "b64encode",
    "batch",
    "bool",
    "capitalize",
    "count",
    "default",
    "dictsort",
    "escape",
    "first",
    "float",
    "fromjson",
    "groupby",
    "indent",
    "int",
    "items",
    "join",
    "last",
    "length",
    "lines",
    "list",
    "lower",
    "map",
    "max",
    "min",
    "pprint",
    "reject",
    "rejectattr",
    "replace",
    "reverse",
    "round",
    "safe",
    "select",
    "selectattr",
    "slice",
    "sort",
    "split",
    "string",
    "sum",
    "title",
    "tojson",
    "trim",
    "unique",
    "upper",
    "urlencode",
];

/// The tests (`x is defined`) for `did you mean`.
const TESTS: &[&str] = &[
    "boolean",
    "defined",
    "divisibleby",
    "endingwith",
    "eq",
    "even",
    "false",
    "filter",
    "float",
    "ge",
    "gt",
    "in",
    "integer",
    "iterable",
    "le",
    "lower",
    "lt",
    "mapping",
    "ne",
    "none",
    "number",
    "odd",
    "safe",
    "sameas",
    "sequence",
    "startingwith",
    "string",
    "test",
    "true",
    "undefined",
    "upper",
];

/// The methods values have in expressions: a sandbox's `url(port)` and `host(port)` (and a
/// loop's, inside `{% for %}`).
/// Methods a value has: a sandbox's, the loop's, and Python's string, list and mapping
/// methods (minijinja-contrib's `pycompat`, installed as the unknown-method callback).
const METHODS: &[&str] = &[
    "url",
    "host",
    "cycle",
    "changed",
    "capitalize",
    "count",
    "endswith",
    "find",
    "format",
    "get",
    "isalnum",
    "isalpha",
    "isascii",
    "islower",
    "isnumeric",
    "isspace",
    "isupper",
    "items",
    "join",
    "keys",
    "lower",
    "lstrip",
    "replace",
    "rfind",
    "rstrip",
    "split",
    "splitlines",
    "startswith",
    "strip",
    "title",
    "upper",
    "values",
];

fn filter_exists(name: &str) -> bool {
    let source = format!("none | {name}");
    let Ok(e) = env().compile_expression(&source) else { return true };
    !matches!(e.eval(()), Err(err) if err.kind() == ErrorKind::UnknownFilter)
}

fn test_exists(name: &str) -> bool {
    let source = format!("none is {name}");
    let Ok(e) = env().compile_expression(&source) else { return true };
    !matches!(e.eval(()), Err(err) if err.kind() == ErrorKind::UnknownTest)
}

/// The parts of `text` that are expressions: all of it for a lone `{{ … }}` or a bare
/// expression, else what is inside each `{{ }}` and `{% %}`; with their byte offsets.
fn expression_parts(text: &str) -> Vec<(usize, &str)> {
    if !text.contains("{{") && !text.contains("{%") {
        return vec![(0, text)];
    }
    let mut parts = Vec::new();
    let mut at = 0;
    while let Some(open) = text[at..].find(['{']).map(|i| at + i) {
        let close = match text.get(open..open + 2) {
            Some("{{") => "}}",
            Some("{%") => "%}",
            _ => {
                at = open + 1;
                continue;
            }
        };
        let start = open + 2;
        let Some(end) = text[start..].find(close).map(|i| start + i) else { break };
        parts.push((start, &text[start..end]));
        at = end + 2;
    }
    parts
}

/// Filters (`| name`), tests (`is name`) and methods (`.name(`) the text's expressions call
/// that do not exist. String literals are skipped; what the environment would refuse at
/// compile time is left to the compiler's own message.
pub fn unknown_calls(text: &str) -> Vec<UnknownCall> {
    let mut out = Vec::new();
    for (offset, part) in expression_parts(text) {
        let bytes = part.as_bytes();
        // The previous significant token: `|`, `.`, `is`, `is not`, or something else.
        let mut prev = "";
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i];
            if c == b'\'' || c == b'"' {
                i += 1;
                while i < bytes.len() && bytes[i] != c {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                prev = "";
                continue;
            }
            if c.is_ascii_whitespace() {
                i += 1;
                continue;
            }
            if c.is_ascii_alphabetic() || c == b'_' {
                let start = i;
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &part[start..i];
                let line = text[..offset + start].matches('\n').count() + 1;
                let called = part[i..].trim_start().starts_with('(');
                match prev {
                    "|" if !filter_exists(word) => out.push(UnknownCall {
                        message: format!("unknown filter `{word}`"),
                        help: Some(
                            did_you_mean(word, FILTERS.iter().copied().filter(|f| filter_exists(f))).map_or_else(
                                || format!("filters: {}", FILTERS.join(", ")),
                                |s| format!("did you mean `| {s}`?"),
                            ),
                        ),
                        line,
                    }),
                    "is" | "is not" if word != "not" && !test_exists(word) => out.push(UnknownCall {
                        message: format!("unknown test `{word}`"),
                        help: Some(did_you_mean(word, TESTS.iter().copied().filter(|t| test_exists(t))).map_or_else(
                            || format!("tests: {}", TESTS.join(", ")),
                            |s| format!("did you mean `is {s}`?"),
                        )),
                        line,
                    }),
                    "." if called && !METHODS.contains(&word) => {
                        let as_filter = match word {
                            w if filter_exists(w) && FILTERS.contains(&w) => Some(w),
                            _ => None,
                        };
                        out.push(UnknownCall {
                            message: format!("unknown method `{word}()`"),
                            help: Some(match as_filter {
                                Some(f) => format!("no such method; use the filter: `| {f}`"),
                                None => "values have Python's string, list and mapping methods (`strip`, `split`, `startswith`, `items`, …) and a sandbox's `url(port)` and `host(port)`; else use a filter, e.g. `| trim`, or a test, e.g. `is startingwith('x')`".to_string(),
                            }),
                            line,
                        });
                    }
                    _ => {}
                }
                prev = match (prev, word) {
                    (_, "is") => "is",
                    ("is", "not") => "is not",
                    _ => "",
                };
                continue;
            }
            prev = match c {
                b'|' => "|",
                b'.' => ".",
                _ => "",
            };
            i += 1;
        }
    }
    out
}

fn check_name(name: &str, scope: &Scope) -> Option<(String, Option<String>)> {
    let mut parts = name.split('.');
    let root = parts.next()?;
    let second = parts.next();
    let third = parts.next();
    let mean = |word: &str, cands: Vec<&str>| did_you_mean(word, cands).map(|s| format!("did you mean `{s}`?"));
    let said = |s: Option<&str>| s.map(|s| format!("did you mean `{s}`?"));
    if !ROOTS.contains(&root) {
        let help = if scope.vars.contains(root) {
            Some(format!("variables live under `vars`: did you mean `vars.{root}`?"))
        } else {
            mean(root, ROOTS.to_vec()).or_else(|| Some(format!("available: {}", ROOTS.join(", "))))
        };
        return Some((format!("undefined variable `{root}`"), help));
    }
    if root == "params" && second.is_none() && scope.params.is_none() {
        return Some((
            "`params` is defined only in a steps file run by `include:`".into(),
            Some("a scenario's own values are `vars`; a steps file (`kind: steps`) declares `params:`".into()),
        ));
    }
    let second = second?;
    match root {
        "vars" if !scope.vars.contains(second) => Some((
            format!("undefined variable `vars.{second}`"),
            said(scope.suggest(second, scope.vars.iter().map(String::as_str)))
                .or_else(|| Some("define it under `vars:` in the file, with a `set` step, or with `--var`".into())),
        )),
        "matrix" if !scope.matrix.contains(second) => Some((
            format!("undefined variable `matrix.{second}`"),
            said(scope.suggest(second, scope.matrix.iter().map(String::as_str))).or_else(|| {
                Some(if scope.matrix.is_empty() {
                    "this scenario has no `matrix:`".into()
                } else {
                    format!("matrix keys: {}", scope.matrix.iter().cloned().collect::<Vec<_>>().join(", "))
                })
            }),
        )),
        "steps" => match scope.steps.get(second) {
            None if scope.later_steps.contains(second) => Some((
                format!("step `{second}` is referenced before it runs"),
                Some("a step can only use outputs of steps above it".into()),
            )),
            None => Some((
                format!("reference to unknown step id `{second}`"),
                said(scope.suggest(second, scope.steps.keys().map(String::as_str)))
                    .or_else(|| Some("give the step an `id:` to refer to its outputs".into())),
            )),
            Some(outputs) => {
                let out = third?;
                (!outputs.is_empty() && !outputs.iter().any(|o| o == out)).then(|| {
                    (
                        format!("step `{second}` has no output `{out}`"),
                        mean(out, outputs.iter().map(String::as_str).collect())
                            .or_else(|| Some(format!("its outputs are: {}", outputs.join(", ")))),
                    )
                })
            }
        },
        "sandboxes" if !scope.aliases.contains(second) => Some((
            format!("unknown sandbox alias `{second}`"),
            said(scope.suggest(second, scope.aliases.iter().map(String::as_str)))
                .or_else(|| Some("name a sandbox with `create: { as: <alias> }`".into())),
        )),
        "sandbox" if !["id", "template", "alias", "url", "host"].contains(&second) => Some((
            format!("sandbox has no field `{second}`"),
            Some("a sandbox has `id`, `template`, `alias`, `url(port)`, `host(port)`".into()),
        )),
        "provider" if !["name", "env"].contains(&second) => Some((
            format!("undefined variable `provider.{second}`"),
            Some(
                "provider has `name` (local, docker, e2b, alicloud) and `env` (the variables its clients read)".into(),
            ),
        )),
        "run" if !["id", "tag"].contains(&second) => {
            Some((format!("undefined variable `run.{second}`"), Some("run has `id` and `tag`".into())))
        }
        "params" => match &scope.params {
            None => Some((
                format!("`params.{second}` is defined only in a steps file run by `include:`"),
                Some("a scenario's own values are `vars`; a steps file (`kind: steps`) declares `params:`".into()),
            )),
            Some(declared) if !declared.contains(second) => Some((
                format!("undefined parameter `params.{second}`"),
                said(scope.suggest(second, declared.iter().map(String::as_str))).or_else(|| {
                    Some(if declared.is_empty() {
                        "this steps file declares no `params:`".into()
                    } else {
                        format!("its params: {}", declared.iter().cloned().collect::<Vec<_>>().join(", "))
                    })
                }),
            )),
            Some(_) => None,
        },
        "scenario" if !["name", "file", "description"].contains(&second) => Some((
            format!("undefined variable `scenario.{second}`"),
            Some("scenario has `name`, `file` and `description`".into()),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::context;

    #[test]
    fn lone_expression_keeps_type() {
        let ctx = context! { vars => context! { port => 8000, name => "x" } };
        assert_eq!(render_str("{{ vars.port }}", &ctx).unwrap(), JsonValue::from(8000));
        assert_eq!(render_str("p{{ vars.port }}", &ctx).unwrap(), JsonValue::from("p8000"));
        assert_eq!(render_str("{{ vars.name }}\n", &ctx).unwrap(), JsonValue::from("x\n"));
        assert_eq!(render_str("{{ vars.name | upper }}", &ctx).unwrap(), JsonValue::from("X"));
    }

    #[test]
    fn strict_undefined_is_an_error() {
        let ctx = context! { vars => context! { a => 1 } };
        assert!(render_str("{{ vars.b }}", &ctx).is_err());
        assert!(render_str("x {{ vars.b }} y", &ctx).is_err());
    }

    #[test]
    fn sandbox_methods() {
        let sb = SandboxView {
            id: "sb1".into(),
            template: "base".into(),
            alias: None,
            urls: HashMap::from([(8000, "http://127.0.0.1:4000".into())]),
        };
        let ctx = context! { sandbox => MValue::from_object(sb) };
        assert_eq!(render_str("{{ sandbox.url(8000) }}/x", &ctx).unwrap(), JsonValue::from("http://127.0.0.1:4000/x"));
        assert_eq!(render_str("{{ sandbox.host(8000) }}", &ctx).unwrap(), JsonValue::from("127.0.0.1:4000"));
        assert_eq!(render_str("{{ sandbox }}", &ctx).unwrap(), JsonValue::from("sb1"));
        assert!(render_str("{{ sandbox.url(9) }}", &ctx).is_err());
        assert_eq!(ports_in("{{ sandbox.url(8000) }} {{ sandboxes.a.host( 9000 ) }}"), vec![8000, 9000]);
    }

    #[test]
    fn filters() {
        let ctx = context! {};
        assert_eq!(render_str("{{ 'hi' | b64encode }}", &ctx).unwrap(), JsonValue::from("aGk="));
        assert_eq!(render_str("{{ ('{\"a\": 2}' | fromjson).a }}", &ctx).unwrap(), JsonValue::from(2));
    }

    #[test]
    fn python_string_methods_work_as_in_pytest() {
        let ctx = context! { out => "  hello world\n" };
        assert!(eval_bool("out.strip().startswith('hello')", &ctx).unwrap());
        assert!(eval_bool("out.endswith('\\n')", &ctx).unwrap());
        assert_eq!(render_str("{{ out.split() }}", &ctx).unwrap(), serde_json::json!(["hello", "world"]));
        assert_eq!(render_str("{{ out.strip().split(' ')[1].upper() }}", &ctx).unwrap(), JsonValue::from("WORLD"));
        assert_eq!(render_str("{{ 'a=1'.replace('=', ':') }}", &ctx).unwrap(), JsonValue::from("a:1"));
    }

    #[test]
    fn b64decode_gives_bytes_with_length_and_sha256() {
        let ctx = context! {};
        // 0xff 0x00 0xfe: not UTF-8, 3 bytes.
        assert_eq!(render_str("{{ '/wD+' | b64decode | length }}", &ctx).unwrap(), JsonValue::from(3));
        // é is 2 bytes in UTF-8 but one character: bytes are counted.
        assert_eq!(render_str("{{ 'w6k=' | b64decode | length }}", &ctx).unwrap(), JsonValue::from(2));
        assert_eq!(
            render_str("{{ '/wD+' | b64decode | sha256 }}", &ctx).unwrap(),
            JsonValue::from("af9ceddc9d8b08ac09e1994bfd20459b5e377425df7354dfce3501992828a5b7".to_string())
        );
        assert_eq!(
            render_str("{{ 'abc' | sha256 }}", &ctx).unwrap(),
            JsonValue::from("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        // Text still reads as text, alone and inside a template.
        assert_eq!(render_str("{{ 'aGk=' | b64decode }}", &ctx).unwrap(), JsonValue::from("hi"));
        assert_eq!(render_str("<{{ 'aGk=' | b64decode }}>", &ctx).unwrap(), JsonValue::from("<hi>"));
        assert!(eval_bool("('aGk=' | b64decode | string) == 'hi'", &ctx).unwrap());
    }

    #[test]
    fn static_check_finds_typos_and_unknown_steps() {
        let src = Source::new("t.yaml", "x: \"{{ vars.greting }} {{ steps.nope.stdout }} {{ foo }}\"\n");
        let node = crate::yaml::parse(&src).unwrap().remove(0);
        let v = node.get("x").unwrap();
        let scope = Scope { vars: ["greeting".to_string()].into(), ..Default::default() };
        let mut diags = Vec::new();
        check(v, v.as_str().unwrap(), &scope, &src, &mut diags);
        let msgs: Vec<_> = diags.iter().map(|d| d.message.as_str()).collect();
        assert_eq!(
            msgs,
            ["undefined variable `foo`", "reference to unknown step id `nope`", "undefined variable `vars.greting`"]
        );
        assert_eq!(diags[2].help.as_deref(), Some("did you mean `greeting`?"));
    }

    #[test]
    fn suggestions_over_large_sets_are_budgeted_small_sets_never() {
        let scope = Scope { vars: (0..1000).map(|i| format!("v{i}")).collect(), ..Default::default() };
        let hits = (0..1000)
            .filter(|i| scope.suggest(&format!("v{i}x"), scope.vars.iter().map(String::as_str)).is_some())
            .count();
        assert_eq!(hits, LARGE_SET_SUGGESTIONS as usize);
        let small = ["alpha", "beta"];
        assert_eq!(scope.suggest("alpah", small.iter().copied()), Some("alpha"), "small sets always");
    }

    #[test]
    fn static_check_reports_syntax_errors() {
        let src = Source::new("t.yaml", "x: \"{{ vars.a \"\n");
        let node = crate::yaml::parse(&src).unwrap().remove(0);
        let v = node.get("x").unwrap();
        let mut diags = Vec::new();
        check(v, v.as_str().unwrap(), &Scope::default(), &src, &mut diags);
        assert_eq!(diags.len(), 1);
        assert!(diags[0].message.starts_with("template syntax error"), "{}", diags[0].message);
    }
}

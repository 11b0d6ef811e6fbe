//! Spanned tree to [`Scenario`], with every problem reported as a diagnostic.
//!
//! The step registry decides which fields a step has and their types; this module walks the
//! tree once, collecting diagnostics instead of stopping at the first.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as JsonValue;

use super::args::{self, ArgError, Slot};
use super::capability::PROVIDERS;
use super::kinds::{self as registry, Field, FieldType, COMMON_KEYS};
use super::scenario::{ErrorClass, Eventually, ExpectError, IncludeFrame, KnownIssue, Requires, Retry, Scenario, Step};
use crate::diag::{did_you_mean, Diagnostic, Location, Source};
use crate::expr::{self, Scope};
use crate::yaml::{self, Node, Value};

pub(crate) const TOP_KEYS: &[&str] = &[
    "name",
    "description",
    "tags",
    "timeout",
    "requires",
    "known_issue",
    "vars",
    "secrets",
    "matrix",
    "setup",
    "steps",
    "finally",
];
/// The providers `requires.providers` may name.
/// The largest `retry.backoff`: each attempt waits at most ten times the one before.
pub const MAX_BACKOFF: f64 = 10.0;
/// The most cases one scenario's `matrix` may expand to.
pub const MAX_CASES: usize = 1000;
/// The most `retry.attempts`.
pub const MAX_ATTEMPTS: u32 = 1000;

struct Ctx<'a> {
    src: &'a Arc<Source>,
    diags: Vec<Diagnostic>,
    /// The `include:` that brought this file in, when it is a steps file.
    frame: Option<Arc<IncludeFrame>>,
    /// The files being read, outermost first (canonical path, as shown): an include of one of
    /// them is a cycle.
    stack: Vec<(PathBuf, String)>,
    /// Counts shared by every file of one load: frame ids, and the steps includes brought in.
    includes: Rc<RefCell<IncludeCounts>>,
}

#[derive(Default)]
struct IncludeCounts {
    frames: usize,
    steps: usize,
}

impl Ctx<'_> {
    fn push(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    fn err(&mut self, node: &Node, msg: impl Into<String>) -> &mut Diagnostic {
        self.diags.push(node.diag(self.src, msg));
        self.diags.last_mut().expect("just pushed")
    }

    fn wrong_type(&mut self, node: &Node, what: &str, key: &str) {
        let d = node
            .diag(self.src, format!("`{key}` must be {what}, found {}", node.type_name()))
            .label(format!("expected {what}"));
        self.push(d);
    }

    fn unknown_key(&mut self, key: &Node, known: &[&str], context: &str) {
        let k = key.key_text();
        let mut d = key.diag(self.src, format!("unknown field `{k}` {context}")).label("unknown field");
        d = match did_you_mean(&k, known.iter().copied()) {
            Some(s) => d.help(format!("did you mean `{s}`?")),
            None => d.help(format!("known fields: {}", known.join(", "))),
        };
        self.push(d);
    }

    fn string(&mut self, node: &Node, key: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => Some(node.key_text()),
            _ => {
                self.wrong_type(node, "a string", key);
                None
            }
        }
    }

    fn string_list(&mut self, node: &Node, key: &str) -> Vec<String> {
        match &node.value {
            Value::Seq(items) => items.iter().filter_map(|i| self.string(i, key)).collect(),
            Value::Str(s) => vec![s.clone()],
            _ => {
                self.wrong_type(node, "a list of strings", key);
                Vec::new()
            }
        }
    }

    fn duration(&mut self, node: &Node, key: &str) -> Option<Duration> {
        let parsed = match &node.value {
            Value::Int(i) if *i >= 0 => crate::duration::from_secs_f64(*i as f64),
            Value::Float(f) if *f >= 0.0 => crate::duration::from_secs_f64(*f),
            // Checked when it is rendered.
            Value::Str(s) if expr::is_expression(s) => return None,
            Value::Str(s) => crate::duration::parse(s),
            _ => {
                let d = node.diag(self.src, format!("bad duration for `{key}`: found {}", node.type_name()));
                self.push(d.help(crate::duration::HINT));
                return None;
            }
        };
        match parsed {
            Ok(d) => Some(d),
            Err(e) => {
                let d = node.diag(self.src, format!("bad duration for `{key}`: {e}")).label("not a duration");
                self.push(d.help(crate::duration::HINT));
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, key: &str) -> Option<bool> {
        match &node.value {
            Value::Bool(b) => Some(*b),
            _ => {
                self.wrong_type(node, "true or false", key);
                None
            }
        }
    }
}

/// What a load knows besides the files (see [`super::load`]).
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Names given with `--var`, known to the static checks.
    pub cli_vars: BTreeSet<String>,
    /// Today's date (YYYY-MM-DD), for `known_issue.until`.
    pub today: String,
    /// `SCENARIO_RUN_TEMPLATES_DIR` of the run's environment: where `build`/`deploy` look for
    /// template folders, so `check` finds a missing one before a run does.
    pub templates_dir: Option<String>,
}

/// Validate one file (one or more YAML documents).
pub fn file(src: &Arc<Source>, opts: &LoadOptions) -> Result<Vec<Scenario>, Vec<Diagnostic>> {
    let (docs, diags) = yaml::parse_keeping_going(src)?;
    let canonical = std::fs::canonicalize(&src.path).unwrap_or_else(|_| PathBuf::from(&src.path));
    let mut cx = Ctx { src, diags, frame: None, stack: vec![(canonical, src.path.clone())], includes: Rc::default() };
    let docs: Vec<Node> = docs.into_iter().filter(|d| d.value != Value::Null).collect();
    if docs.is_empty() {
        let d = Diagnostic::new(src, 1, 1, 1, "empty file: a scenario needs `name` and `steps`")
            .help("start with:\nname: my scenario\nsteps:\n  - create: base\n  - exec: echo hello");
        return Err(vec![d]);
    }
    let stem =
        std::path::Path::new(&src.path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let count = docs.len();
    let mut out = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let default_name = if count > 1 { format!("{stem}#{}", i + 1) } else { stem.clone() };
        if let Some(s) = scenario(&mut cx, doc, default_name, opts) {
            out.push(s);
        }
    }
    if cx.diags.is_empty() {
        Ok(out)
    } else {
        Err(dedup(cx.diags))
    }
}

/// A steps file included twice with the same mistake: one diagnostic, with a note per include.
fn dedup(diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
    let mut out: Vec<Diagnostic> = Vec::with_capacity(diags.len());
    for d in diags {
        match out.iter_mut().find(|o| !d.notes.is_empty() && o.location == d.location && o.message == d.message) {
            Some(o) => o.notes.extend(d.notes.into_iter().filter(|n| !o.notes.contains(n)).collect::<Vec<_>>()),
            None => out.push(d),
        }
    }
    out
}

fn scenario(cx: &mut Ctx<'_>, doc: &Node, default_name: String, opts: &LoadOptions) -> Option<Scenario> {
    let Some(map) = doc.as_map() else {
        let d = doc
            .diag(cx.src, "a scenario is a mapping with `name` and `steps`")
            .label(format!("found {}", doc.type_name()));
        cx.push(d);
        return None;
    };
    if let Some(kind) = doc.get("kind").filter(|k| k.as_str() == Some(STEPS_KIND)) {
        let d = kind
            .diag(cx.src, "this is a steps file (`kind: steps`), not a scenario: it runs where a scenario includes it")
            .label("a steps file")
            .help("name the scenarios that `include:` it; `check` validates it there, with their variables and its `with:` values");
        cx.push(d);
        return None;
    }
    for (k, _) in map {
        if !TOP_KEYS.contains(&k.key_text().as_str()) {
            let kt = k.key_text();
            if registry::lookup(&kt).is_some() {
                let d =
                    k.diag(cx.src, format!("step `{kt}` outside of `steps`")).help("steps go in a list under `steps:`");
                cx.push(d);
            } else {
                cx.unknown_key(k, TOP_KEYS, "in scenario");
            }
        }
    }
    let mut location = Location { file: cx.src.path.clone(), line: doc.line, col: doc.col };
    let mut name = default_name;
    if let Some(n) = doc.get("name") {
        if let Some(s) = cx.string(n, "name") {
            name = s;
            location = Location { file: cx.src.path.clone(), line: n.line, col: n.col };
        }
    }
    let description = doc.get("description").and_then(|n| cx.string(n, "description"));
    let tags = doc.get("tags").map(|n| cx.string_list(n, "tags")).unwrap_or_default();
    let timeout = doc.get("timeout").and_then(|n| cx.duration(n, "timeout"));
    let requires = doc.get("requires").map(|n| requires(cx, n)).unwrap_or_default();
    let known_issue = doc.get("known_issue").and_then(|n| known_issue(cx, n, &opts.today));
    let mut vars = serde_json::Map::new();
    if let Some(v) = doc.get("vars") {
        match v.as_map() {
            Some(m) => m.iter().for_each(|(k, v)| {
                vars.insert(k.key_text(), v.to_json());
            }),
            None => cx.wrong_type(v, "a mapping of names to values", "vars"),
        }
    }
    let secrets = doc.get("secrets").map(|n| cx.string_list(n, "secrets")).unwrap_or_default();
    let mut matrix = Vec::new();
    if let Some(m) = doc.get("matrix") {
        match m.as_map() {
            Some(entries) => {
                for (k, v) in entries {
                    match v.as_seq() {
                        Some(items) if !items.is_empty() => {
                            matrix.push((k.key_text(), items.iter().map(Node::to_json).collect::<Vec<JsonValue>>()))
                        }
                        Some(_) => {
                            cx.err(v, format!("matrix `{}` has no values", k.key_text()));
                        }
                        None => cx.wrong_type(v, "a list of values", &format!("matrix.{}", k.key_text())),
                    }
                }
            }
            None => cx.wrong_type(m, "a mapping of names to lists", "matrix"),
        }
        let cases = matrix.iter().try_fold(1usize, |n, (_, values)| n.checked_mul(values.len()));
        if cases.is_none_or(|n| n > MAX_CASES) {
            let product: f64 = matrix.iter().map(|(_, v)| v.len() as f64).product();
            let count = cases.map_or_else(|| format!("{product:.0e}"), |n| n.to_string());
            let sizes: Vec<String> = matrix.iter().map(|(_, v)| v.len().to_string()).collect();
            let d = m
                .diag(
                    cx.src,
                    format!("matrix expands to {count} cases ({}); the most is {MAX_CASES}", sizes.join(" x ")),
                )
                .label("too many combinations")
                .help("split the scenario, or use fewer keys or values");
            cx.push(d);
            matrix.clear();
        }
    }

    let mut scope = Scope {
        vars: vars.keys().cloned().chain(opts.cli_vars.iter().cloned()).collect(),
        matrix: matrix.iter().map(|(k, _)| k.clone()).collect(),
        ..Default::default()
    };
    // Ids anywhere in the file, so a forward reference gets the better message.
    for list in ["setup", "steps", "finally"] {
        for step in doc.get(list).and_then(Node::as_seq).unwrap_or_default() {
            if let Some(id) = step.get("id").and_then(Node::as_str) {
                scope.later_steps.insert(id.to_string());
            }
        }
    }
    let mut ids: BTreeMap<String, Location> = BTreeMap::new();
    let mut sandboxes = 0usize;
    let mut lists: [Vec<Step>; 3] = Default::default();
    for (slot, list) in ["setup", "steps", "finally"].iter().enumerate() {
        let Some(node) = doc.get(list) else { continue };
        if node.value == Value::Null {
            continue;
        }
        let Some(items) = node.as_seq() else {
            cx.wrong_type(node, "a list of steps", list);
            continue;
        };
        lists[slot] = step_list(cx, items, &mut scope, &mut ids, &mut sandboxes, opts);
    }
    let [setup, steps, finally] = lists;
    match doc.get("steps") {
        None => {
            let d = doc
                .diag(cx.src, format!("scenario `{name}` has no `steps`"))
                .help("add `steps:` with at least one step");
            cx.push(d);
        }
        Some(n) if n.as_seq().is_some_and(<[Node]>::is_empty) || n.value == Value::Null => {
            cx.err(n, format!("scenario `{name}` has no steps")).help =
                Some("add at least one step under `steps:`".into());
        }
        _ => {}
    }
    Some(Scenario {
        source: cx.src.clone(),
        name,
        description,
        location,
        tags,
        timeout,
        requires,
        known_issue,
        vars,
        secrets,
        matrix,
        setup,
        steps,
        finally,
        sandbox_need: sandboxes,
    })
}

/// A step's `requires`: only `env` (providers and capabilities are the scenario's business).
fn step_requires(cx: &mut Ctx<'_>, node: &Node) -> Vec<String> {
    let Some(map) = node.as_map() else {
        cx.wrong_type(node, "a mapping with env", "requires");
        return Vec::new();
    };
    let mut env = Vec::new();
    for (k, v) in map {
        match k.key_text().as_str() {
            "env" => env = cx.string_list(v, "requires.env"),
            "providers" | "capabilities" => {
                let d = k
                    .diag(cx.src, format!("`requires.{}` is for a whole scenario, not a step", k.key_text()))
                    .help("move it to the scenario's `requires`, or gate the step with `if: provider.name == '…'`");
                cx.push(d);
            }
            _ => cx.unknown_key(k, &["env"], "in a step's `requires`"),
        }
    }
    env
}

fn requires(cx: &mut Ctx<'_>, node: &Node) -> Requires {
    let mut r = Requires::default();
    let Some(map) = node.as_map() else {
        cx.wrong_type(node, "a mapping with env, providers, capabilities", "requires");
        return r;
    };
    for (k, v) in map {
        match k.key_text().as_str() {
            "env" => {
                r.env = cx.string_list(v, "requires.env");
                r.env_location = Some(Location { file: cx.src.path.clone(), line: v.line, col: v.col });
            }
            "providers" => {
                r.providers = cx.string_list(v, "requires.providers");
                for (i, p) in r.providers.iter().enumerate() {
                    if !PROVIDERS.contains(&p.as_str()) {
                        let at = v.as_seq().and_then(|s| s.get(i)).unwrap_or(v);
                        let help = did_you_mean(p, PROVIDERS.iter().copied()).map_or_else(
                            || format!("providers are: {}", PROVIDERS.join(", ")),
                            |s| format!("did you mean `{s}`?"),
                        );
                        let d = at.diag(cx.src, format!("unknown provider `{p}`")).help(help);
                        cx.push(d);
                    }
                }
            }
            "capabilities" => {
                r.capabilities = cx.string_list(v, "requires.capabilities");
                let known: Vec<&str> = super::capability::Capability::ALL.iter().map(|c| c.name()).collect();
                for (i, c) in r.capabilities.iter().enumerate() {
                    if !known.contains(&c.as_str()) {
                        let at = v.as_seq().and_then(|s| s.get(i)).unwrap_or(v);
                        let help = did_you_mean(c, known.iter().copied()).map_or_else(
                            || format!("capabilities are: {}", known.join(", ")),
                            |s| format!("did you mean `{s}`?"),
                        );
                        let d = at.diag(cx.src, format!("unknown capability `{c}`")).help(help);
                        cx.push(d);
                    }
                }
            }
            _ => cx.unknown_key(k, &["env", "providers", "capabilities"], "in `requires`"),
        }
    }
    r
}

fn known_issue(cx: &mut Ctx<'_>, node: &Node, today: &str) -> Option<KnownIssue> {
    let Some(map) = node.as_map() else {
        cx.wrong_type(node, "a mapping with id, reason, strict, until", "known_issue");
        return None;
    };
    let mut ki = KnownIssue { id: None, reason: String::new(), strict: false, until: None, expired: None };
    let mut expired_at = None;
    for (k, v) in map {
        match k.key_text().as_str() {
            "id" => ki.id = cx.string(v, "known_issue.id"),
            "reason" => ki.reason = cx.string(v, "known_issue.reason").unwrap_or_default(),
            "strict" => ki.strict = cx.boolean(v, "known_issue.strict").unwrap_or(false),
            "until" => {
                let Some(s) = cx.string(v, "known_issue.until") else { continue };
                let valid = s.len() == 10 && s.parse::<jiff::civil::Date>().is_ok();
                if !valid {
                    cx.err(v, format!("`until` must be a date like 2027-03-01, found `{s}`"));
                } else if !today.is_empty() && s.as_str() < today {
                    expired_at = Some(v);
                }
                ki.until = Some(s);
            }
            _ => cx.unknown_key(k, &["id", "reason", "strict", "until"], "in `known_issue`"),
        }
    }
    if let (Some(v), Some(until)) = (expired_at, &ki.until) {
        let what = ki.id.clone().map_or("known issue".to_string(), |id| format!("known issue {id}"));
        ki.expired = Some(
            v.diag(cx.src, format!("{what} expired on {until}"))
                .label("expired")
                .help("fix the issue and remove `known_issue`, or move `until` to a later date"),
        );
    }
    if ki.reason.is_empty() {
        cx.err(node, "`known_issue` needs a `reason`").help =
            Some("say what is known to be broken, e.g. `reason: envd reports -1 for SIGTERM`".into());
    }
    Some(ki)
}

/// One step: its kind, its arguments (shorthand expanded), its common keys and its fields;
/// what it adds to the scope (sandboxes, aliases, variables, step outputs) is recorded for the
/// steps after it.
fn step(
    cx: &mut Ctx<'_>,
    item: &Node,
    scope: &mut Scope,
    ids: &mut BTreeMap<String, Location>,
    sandboxes: &mut usize,
    opts: &LoadOptions,
) -> Option<Step> {
    let Some(map) = item.as_map() else {
        let kind = item.as_str().and_then(registry::lookup);
        let d = item
            .diag(cx.src, "a step is a mapping like `- exec: echo hi`")
            .label(format!("found {}", item.type_name()));
        let d = match kind {
            Some(k) => d.help(format!("write `- {}: {{}}` or give it arguments", k.name)),
            None => d,
        };
        cx.push(d);
        return None;
    };
    let (kind, knode, args) = step_kind(cx, item, map)?;
    let location = Location { file: cx.src.path.clone(), line: knode.line, col: knode.col };
    let args = step_args(cx, kind, args)?;
    let mut st = Step {
        kind,
        location,
        label: String::new(),
        args,
        id: None,
        sandbox: None,
        timeout: None,
        retry: None,
        eventually: None,
        condition: None,
        continue_on_error: false,
        requires_env: Vec::new(),
        expect_error: None,
        include: cx.frame.clone(),
    };
    let name = common_keys(cx, map, &mut st, scope, ids);

    // Fields of the kind.
    fields(cx, kind.name, &st.args, kind.fields, kind.matcher, kind.free_keys, scope);
    if kind.name == "build" || kind.name == "deploy" {
        template_folder(cx, kind.name, &st.args, opts);
    }
    if kind.name == "assert-file" {
        local_file(cx, &st.args);
    }
    if kind.name == "watch-events" {
        watch_expect(cx, &st.args);
    }
    if kind.name == "http" || kind.name == "http-get" {
        http_capture(cx, &st.args);
    }
    record_in_scope(cx, &st, knode, scope, sandboxes);
    st.label = name.unwrap_or_else(|| label(kind.name, &st.args, kind.main));
    Some(st)
}

/// The one step kind among a step's keys (the others must be common keys), with its key node
/// and its arguments; every other case is a located diagnostic.
fn step_kind<'n>(
    cx: &mut Ctx<'_>,
    item: &Node,
    map: &'n [(Node, Node)],
) -> Option<(&'static registry::StepKind, &'n Node, &'n Node)> {
    let common: Vec<&str> = COMMON_KEYS.iter().map(|(k, _)| *k).collect();
    let mut kind_entries = Vec::new();
    for (k, v) in map {
        let kt = k.key_text();
        if !common.contains(&kt.as_str()) {
            kind_entries.push((k, v, kt));
        }
    }
    let kinds: Vec<&str> = registry::names().collect();
    let mut known: Vec<_> = kind_entries.iter().filter(|(_, _, t)| registry::lookup(t).is_some()).collect();
    // The same kind twice is a duplicate key, already reported by the parser.
    known.dedup_by(|a, b| a.2 == b.2);
    match known.len() {
        1 => {
            let (k, v, t) = known[0];
            let kind = registry::lookup(t).expect("checked");
            for (ok, _, ot) in kind_entries.iter().filter(|(_, _, o)| o != t) {
                let field_of_kind =
                    kind.field(ot).is_some() || (kind.matcher && crate::matcher::KEYS.iter().any(|(m, _)| m == ot));
                let mut d =
                    ok.diag(cx.src, format!("unknown key `{ot}` on a `{}` step", kind.name)).label("unknown key");
                d = if field_of_kind {
                    d.help(format!(
                        "`{ot}` is a field of `{}`: put it inside, as `{}: {{ {ot}: … }}`",
                        kind.name, kind.name
                    ))
                } else {
                    match did_you_mean(ot, common.iter().copied()) {
                        Some(s) => d.help(format!("did you mean `{s}`?")),
                        None => d.help(format!("keys beside the step kind are: {}", common.join(", "))),
                    }
                };
                cx.push(d);
            }
            Some((kind, k, v))
        }
        0 => {
            match kind_entries.first() {
                Some((k, _, t)) => {
                    let mut d = k.diag(cx.src, format!("unknown step kind `{t}`")).label("unknown step kind");
                    d = match did_you_mean(t, kinds.iter().copied()) {
                        Some(s) => d.help(format!("did you mean `{s}`?")),
                        None => d.help("run `scenario-run steps` to list step kinds"),
                    };
                    cx.push(d);
                }
                None => {
                    cx.err(item, "step has no kind").help = Some(format!("a step is one of: {}", kinds.join(", ")));
                }
            }
            None
        }
        _ => {
            let (k, _, _) = known[1];
            let names: Vec<&str> = known.iter().map(|(_, _, t)| t.as_str()).collect();
            cx.err(k, format!("a step has exactly one kind, found {}", names.join(" and "))).help =
                Some("split it into two steps, each starting with `- `".into());
            None
        }
    }
}

/// A step's arguments as a mapping: a scalar is the main field, null is no arguments.
fn step_args(cx: &mut Ctx<'_>, kind: &'static registry::StepKind, args: &Node) -> Option<Node> {
    // Shorthand: a scalar is the main field; null is no arguments.
    let args = match &args.value {
        Value::Map(_) => args.clone(),
        Value::Null => Node { value: Value::Map(Vec::new()), ..args.clone() },
        Value::Seq(_) => {
            cx.err(args, format!("`{}` takes a mapping of fields, not a list", kind.name)).help =
                Some(format!("example:\n{}", kind.example));
            return None;
        }
        _ if kind.free_keys => {
            cx.err(args, format!("`{}` takes a mapping of names to values", kind.name));
            return None;
        }
        _ => match kind.main {
            Some(main) => {
                let key = Node { value: Value::Str(main.to_string()), ..args.clone() };
                Node { value: Value::Map(vec![(key, args.clone())]), ..args.clone() }
            }
            None => {
                cx.err(args, format!("`{}` takes a mapping of fields", kind.name)).help =
                    Some(format!("example:\n{}", kind.example));
                return None;
            }
        },
    };

    // `exec: {{ vars.cmd }}` is a YAML flow mapping whose key is a mapping: say so plainly.
    if let Some(m) = args.as_map() {
        if m.iter().any(|(k, _)| matches!(k.value, Value::Map(_))) {
            let d = args
                .diag(cx.src, "a value that starts with `{{` must be quoted")
                .label("YAML reads this as a mapping")
                .help(format!("write `{}: \"{{{{ … }}}}\"`", kind.name));
            cx.push(d);
            return None;
        }
    }
    Some(args)
}

/// The keys every step may have beside its kind (`id`, `name`, `sandbox`, `timeout`, `retry`,
/// `eventually`, `if`, `continue_on_error`, `requires`, `expect_error`), into `st`; returns
/// the `name`.
fn common_keys(
    cx: &mut Ctx<'_>,
    map: &[(Node, Node)],
    st: &mut Step,
    scope: &Scope,
    ids: &mut BTreeMap<String, Location>,
) -> Option<String> {
    let kind = st.kind;
    let mut name = None;
    for (k, v) in map {
        match k.key_text().as_str() {
            "id" => {
                let Some(id) = cx.string(v, "id") else { continue };
                let ok = !id.is_empty()
                    && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !id.starts_with(|c: char| c.is_ascii_digit());
                if !ok {
                    cx.err(v, format!("step id `{id}` must be letters, digits and `_` (not starting with a digit)"))
                        .help = Some("ids are used in templates: {{ steps.<id>.stdout }}".into());
                }
                if let Some(first) = ids.get(&id) {
                    let first = first.line;
                    cx.err(v, format!("duplicate step id `{id}`")).help =
                        Some(format!("the first step with this id is at line {first}"));
                } else {
                    ids.insert(id.clone(), Location { file: cx.src.path.clone(), line: v.line, col: v.col });
                }
                st.id = Some(id);
            }
            "name" => name = cx.string(v, "name"),
            "sandbox" => {
                let Some(alias) = cx.string(v, "sandbox") else { continue };
                if !expr::is_expression(&alias) && !scope.aliases.contains(&alias) {
                    let help = scope.suggest(&alias, scope.aliases.iter().map(String::as_str)).map_or_else(
                        || "name a sandbox with `create: { as: <alias> }` before this step".to_string(),
                        |s| format!("did you mean `{s}`?"),
                    );
                    cx.err(v, format!("unknown sandbox alias `{alias}`")).help = Some(help);
                }
                st.sandbox = Some(alias);
            }
            "timeout" => st.timeout = cx.duration(v, "timeout"),
            "retry" => st.retry = retry(cx, v),
            "eventually" => {
                if !kind.eventual {
                    cx.err(k, format!("`{}` cannot be polled with `eventually`", kind.name)).help = Some(
                        "use `retry` for steps that change state; `eventually` is for checks that become true".into(),
                    );
                }
                st.eventually = eventually(cx, v);
            }
            "if" => match &v.value {
                Value::Str(_) if templated_expression(cx, v, "if", "if: provider.name != 'docker'") => {}
                Value::Str(s) => {
                    let expr = if expr::is_expression(s) { s.clone() } else { format!("{{{{ {s} }}}}") };
                    let before = cx.diags.len();
                    expr::check(v, &expr, scope, cx.src, &mut cx.diags);
                    bare_expression_help(&mut cx.diags[before..], "if", "if: provider.name != 'docker'");
                    st.condition = Some((s.clone(), v.clone()));
                }
                Value::Bool(b) => st.condition = Some((b.to_string(), v.clone())),
                _ => cx.wrong_type(v, "an expression", "if"),
            },
            "continue_on_error" => st.continue_on_error = cx.boolean(v, "continue_on_error").unwrap_or(false),
            "requires" => st.requires_env = step_requires(cx, v),
            "expect_error" => st.expect_error = expect_error(cx, v, scope),
            _ => {}
        }
    }
    name
}

/// `expect_error: true`, a matcher for the message, and `kind:` (one kind or a list) naming
/// the errors that meet it beside the default `failed`.
fn expect_error(cx: &mut Ctx<'_>, v: &Node, scope: &Scope) -> Option<ExpectError> {
    let default = vec![ErrorClass::Failed];
    match &v.value {
        Value::Bool(true) => Some(ExpectError { kinds: default, matcher: None }),
        Value::Bool(false) => None,
        Value::Map(entries) => {
            let mut kinds = Vec::new();
            let mut rest = Vec::new();
            for (k, val) in entries {
                if k.key_text() != "kind" {
                    rest.push((k.clone(), val.clone()));
                    continue;
                }
                let names: Vec<&Node> = match &val.value {
                    Value::Seq(items) if !items.is_empty() => items.iter().collect(),
                    Value::Str(_) => vec![val],
                    _ => {
                        cx.wrong_type(val, "a kind of error or a list of them", "expect_error.kind");
                        continue;
                    }
                };
                for n in names {
                    let name = n.as_str().unwrap_or_default();
                    match ErrorClass::parse(name) {
                        Some(c) => kinds.push(c),
                        None => {
                            let all: Vec<&str> = ErrorClass::ALL.iter().map(|(_, n)| *n).collect();
                            let help = did_you_mean(name, all.iter().copied()).map_or_else(
                                || format!("kinds are: {}", all.join(", ")),
                                |s| format!("did you mean `{s}`?"),
                            );
                            let d = n.diag(cx.src, format!("unknown kind of error `{}`", n.key_text())).help(help);
                            cx.push(d);
                        }
                    }
                }
            }
            let matcher = if rest.is_empty() && !entries.is_empty() {
                None
            } else {
                let m = Node { value: Value::Map(rest), ..v.clone() };
                crate::matcher::validate(&m, cx.src, &mut cx.diags);
                templates(cx, &m, scope);
                Some(m)
            };
            Some(ExpectError { kinds: if kinds.is_empty() { default } else { kinds }, matcher })
        }
        _ => {
            let d = v
                .diag(cx.src, format!("`expect_error` must be true or a matcher, found {}", v.type_name()))
                .help("write `expect_error: true`, `expect_error: { contains: not found }` or `expect_error: { kind: timeout }`");
            cx.push(d);
            None
        }
    }
}

/// Whether the step has the sandbox it needs, and what it adds to the scope of the steps
/// after it: a sandbox and its alias, variables, its outputs under `steps.<id>`.
fn record_in_scope(cx: &mut Ctx<'_>, st: &Step, knode: &Node, scope: &mut Scope, sandboxes: &mut usize) {
    let kind = st.kind;
    // A step that needs a sandbox must come after one exists.
    let names_target = st.args.get("id").is_some() || st.args.get("url").is_some();
    if kind.uses_sandbox && !names_target && !scope.has_sandbox {
        cx.err(knode, format!("`{}` needs a sandbox, but none is created before it", kind.name)).help =
            Some("add `- create: base` before this step".into());
    }
    if kind.name == "create" || kind.name == "connect" {
        if kind.name == "create" {
            *sandboxes += 1;
        }
        scope.has_sandbox = true;
        if let Some(alias) = st.args.get("as").and_then(Node::as_str) {
            scope.aliases.insert(alias.to_string());
        }
    }
    if kind.name == "set" {
        if let Some(m) = st.args.as_map() {
            scope.vars.extend(m.iter().map(|(k, _)| k.key_text()));
        }
    }
    if let Some(m) = st.args.get("capture").and_then(Node::as_map).filter(|_| kind.name.starts_with("http")) {
        scope.vars.extend(m.iter().map(|(k, _)| k.key_text()));
    }
    if let Some(id) = &st.id {
        let outputs: Vec<String> = if st.expect_error.is_some() {
            vec!["error".into(), "severity".into(), "kind".into()]
        } else {
            kind.outputs.iter().map(|(n, _)| n.to_string()).collect()
        };
        scope.steps.insert(id.clone(), outputs);
    }
}

/// `exec: echo hi`-style label, cut to a readable length.
fn label(kind: &str, args: &Node, main: Option<&str>) -> String {
    let main_val = main.and_then(|m| args.get(m)).map(|v| v.key_text());
    // An expression (`assert: { that: }`), on one line and cut between its tokens, never
    // inside a value: a block scalar's first line is not a label.
    let expression =
        registry::lookup(kind).and_then(|k| main.and_then(|m| k.field(m))).is_some_and(|f| f.ty == FieldType::Expr);
    if let (true, Some(v)) = (expression, &main_val) {
        return format!("{kind}: {}", crate::expr::explain::shorten(v, 60));
    }
    let detail = match (kind, main_val) {
        (_, Some(v)) => v,
        ("files", _) => format!(
            "{} {}",
            args.get("op").map(Node::key_text).unwrap_or_default(),
            args.get("path").map(Node::key_text).unwrap_or_default()
        ),
        ("http", _) | ("http-get", _) => {
            let target = args.get("url").map(Node::key_text).or_else(|| {
                args.get("port")
                    .map(|p| format!(":{}{}", p.key_text(), args.get("path").map(Node::key_text).unwrap_or_default()))
            });
            format!("{} {}", args.get("method").map(Node::key_text).unwrap_or_default(), target.unwrap_or_default())
                .trim()
                .to_string()
        }
        (_, None) => args.get("path").map(Node::key_text).unwrap_or_default(),
    };
    let one_line = detail.lines().next().unwrap_or("").trim().to_string();
    let mut short: String = one_line.chars().take(60).collect();
    if short.len() < one_line.len() || detail.lines().count() > 1 {
        short.push('…');
    }
    if short.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}: {short}")
    }
}

fn retry(cx: &mut Ctx<'_>, v: &Node) -> Option<Retry> {
    let mut r = Retry { attempts: 3, delay: Duration::from_secs(1), backoff: 1.0 };
    match &v.value {
        Value::Int(_) => r.attempts = attempts(cx, v)?,
        Value::Map(m) => {
            for (k, val) in m {
                match k.key_text().as_str() {
                    "attempts" => r.attempts = attempts(cx, val).unwrap_or(r.attempts),
                    "delay" => r.delay = cx.duration(val, "retry.delay").unwrap_or(r.delay),
                    "backoff" => match val.value {
                        Value::Int(n) if (1..=MAX_BACKOFF as i64).contains(&n) => r.backoff = n as f64,
                        Value::Float(f) if (1.0..=MAX_BACKOFF).contains(&f) => r.backoff = f,
                        Value::Int(_) | Value::Float(_) => {
                            let d = val
                                .diag(cx.src, format!("`retry.backoff` must be between 1 and {MAX_BACKOFF}"))
                                .label("out of range")
                                .help("the delay is multiplied by `backoff` after each attempt: 2 doubles it");
                            cx.push(d);
                        }
                        _ => cx.wrong_type(val, "a number between 1 and 10", "retry.backoff"),
                    },
                    _ => cx.unknown_key(k, &["attempts", "delay", "backoff"], "in `retry`"),
                }
            }
        }
        _ => {
            cx.wrong_type(v, "a count or { attempts, delay, backoff }", "retry");
            return None;
        }
    }
    Some(r)
}

/// `retry.attempts`: 1 to [`MAX_ATTEMPTS`].
fn attempts(cx: &mut Ctx<'_>, v: &Node) -> Option<u32> {
    match v.value {
        Value::Int(n) if (1..=i64::from(MAX_ATTEMPTS)).contains(&n) => u32::try_from(n).ok(),
        Value::Int(_) => {
            let d =
                v.diag(cx.src, format!("`retry.attempts` must be between 1 and {MAX_ATTEMPTS}")).label("out of range");
            cx.push(d);
            None
        }
        _ => {
            cx.wrong_type(v, "a positive integer", "retry.attempts");
            None
        }
    }
}

fn eventually(cx: &mut Ctx<'_>, v: &Node) -> Option<Eventually> {
    let mut e = Eventually { within: Duration::from_secs(30), every: Duration::from_millis(500) };
    match &v.value {
        Value::Map(m) => {
            for (k, val) in m {
                match k.key_text().as_str() {
                    "within" => e.within = cx.duration(val, "eventually.within").unwrap_or(e.within),
                    "every" => e.every = cx.duration(val, "eventually.every").unwrap_or(e.every),
                    _ => cx.unknown_key(k, &["within", "every"], "in `eventually`"),
                }
            }
        }
        _ => e.within = cx.duration(v, "eventually")?,
    }
    Some(e)
}

/// Check the fields of a step (or of a nested object) against the registry: which keys go
/// where, which are missing and the literal values, by the rules of [`super::args`],
/// the ones the runner applies to rendered arguments.
fn fields(
    cx: &mut Ctx<'_>,
    owner: &str,
    args: &Node,
    spec: &'static [Field],
    matcher: bool,
    free: bool,
    scope: &Scope,
) {
    let Some(map) = args.as_map() else { return };
    let mut seen = BTreeSet::new();
    let mut matcher_entries = Vec::new();
    let mut unknown = 0;
    let known = args::known_keys(spec, matcher);
    // Required fields a better diagnostic already speaks for (`files: { mkdir: /x }` names
    // both `op` and `path` in its help).
    let mut covered: BTreeSet<&str> = BTreeSet::new();
    for (k, v) in map {
        let kt = k.key_text();
        if free {
            templates(cx, v, scope);
            continue;
        }
        // A null value is not given, as a rendered null is.
        if v.value != Value::Null {
            seen.insert(kt.clone());
        }
        match args::slot(spec, matcher, &kt) {
            Slot::Field(field) => field_value(cx, owner, field, v, scope),
            Slot::Matcher => {
                matcher_entries.push((k.clone(), v.clone()));
                templates(cx, v, scope);
            }
            Slot::Unknown => {
                unknown += 1;
                if let Some(d) = value_as_key(cx.src, owner, k, v, map, spec, &mut covered) {
                    cx.push(d);
                } else if let Some(d) = common_key_inside(cx.src, owner, k, v, map) {
                    cx.push(d);
                } else {
                    arg_error(cx, k, args::unknown_field(owner, &kt, &known));
                }
            }
        }
    }
    for f in spec.iter().filter(|f| f.required && !covered.contains(f.name)) {
        if !seen.contains(f.name) {
            let mut e = args::missing_field(owner, f);
            if let Some(k) = registry::lookup(owner) {
                e.help = Some(format!("{}\nexample:\n{}", e.help.unwrap_or_default(), k.example));
            }
            arg_error(cx, args, e);
        }
    }
    if matcher {
        if !matcher_entries.is_empty() {
            let node = Node { value: Value::Map(matcher_entries), ..args.clone() };
            crate::matcher::validate(&node, cx.src, &mut cx.diags);
        } else if unknown == 0 {
            if let Some(e) = args::needs_matcher(owner) {
                arg_error(cx, args, e);
            }
        }
    }
}

/// A refused argument as a diagnostic at its value (or at the entry inside it that is wrong).
fn arg_error(cx: &mut Ctx<'_>, node: &Node, e: ArgError) {
    let at = e
        .entry
        .as_deref()
        .and_then(|key| node.as_map()?.iter().find(|(k, _)| k.key_text() == key).map(|(_, v)| v))
        .unwrap_or(node);
    let mut d = at.diag(cx.src, e.message);
    if let Some(l) = e.label {
        d = d.label(l);
    }
    if let Some(h) = e.help {
        d = d.help(h);
    }
    cx.push(d);
}

fn field_value(cx: &mut Ctx<'_>, owner: &str, field: &Field, v: &Node, scope: &Scope) {
    let key = field.name;
    match field.ty {
        // Checked where they are known: an expression against the scope; a matcher by the
        // matcher's own checker, which points inside it.
        FieldType::Expr if v.as_str().is_some() => {
            let s = v.as_str().unwrap_or_default();
            if templated_expression(cx, v, key, &format!("{key}: steps.first.exit_code == 0")) {
                return;
            }
            let expr = if expr::is_expression(s) { s.to_string() } else { format!("{{{{ {s} }}}}") };
            let before = cx.diags.len();
            expr::check(v, &expr, scope, cx.src, &mut cx.diags);
            let example = format!("{key}: steps.first.exit_code == 0");
            bare_expression_help(&mut cx.diags[before..], key, &example);
            return;
        }
        FieldType::Matcher if v.as_map().is_some() => {
            crate::matcher::validate(v, cx.src, &mut cx.diags);
            templates(cx, v, scope);
            return;
        }
        FieldType::Object(spec) if v.as_map().is_some() => {
            fields(cx, &format!("{owner}.{key}"), v, spec, false, false, scope);
            return;
        }
        // The entries without templates now, the others when rendered.
        FieldType::StrMap if v.as_map().is_some() => {
            templates(cx, v, scope);
            let literal: serde_json::Map<String, JsonValue> = v
                .as_map()
                .unwrap_or_default()
                .iter()
                .filter(|(_, val)| !expr::has_template(val))
                .map(|(k, val)| (k.key_text(), val.to_json()))
                .collect();
            if let Err(e) = args::convert(owner, field, &JsonValue::Object(literal)) {
                arg_error(cx, v, e);
            }
            return;
        }
        _ => {}
    }
    templates(cx, v, scope);
    if expr::has_template(v) || v.value == Value::Null {
        return;
    }
    if let Err(e) = args::convert(owner, field, &v.to_json()) {
        arg_error(cx, v, e);
        return;
    }
    if field.ty == FieldType::Str && key == "of" {
        let text = v.key_text();
        if !scope.steps.contains_key(&text) {
            let help = scope.suggest(&text, scope.steps.keys().map(String::as_str)).map_or_else(
                || "`of` names the `id` of an earlier exec step".to_string(),
                |s| format!("did you mean `{s}`?"),
            );
            let d = v
                .diag(cx.src, format!("reference to unknown step id `{text}`"))
                .label("no earlier step has this id")
                .help(help);
            cx.push(d);
        } else if let Some(stream) = asserted_output(owner) {
            // An assertion of a step that has no such output would check an empty text, and
            // `not_contains` or `empty` would pass without checking anything.
            let outputs = &scope.steps[&text];
            if !outputs.iter().any(|o| o == stream) {
                let has = if outputs.is_empty() {
                    format!("`{text}` has no outputs")
                } else {
                    format!("the outputs of `{text}` are {}", outputs.join(", "))
                };
                let d = v
                    .diag(cx.src, format!("step `{text}` has no {stream} for `{owner}` to check"))
                    .label(format!("no {stream}"))
                    .help(format!(
                        "`of` names an earlier step that ran a command (exec, host, run-code, wait, pty); {has}"
                    ));
                cx.push(d);
            }
        }
    }
    if field.ty == FieldType::Any && key == "json" {
        if v.as_seq().is_some() {
            let wrapped = Node {
                value: Value::Map(vec![(Node { value: Value::Str("json".into()), ..v.clone() }, v.clone())]),
                ..v.clone()
            };
            crate::matcher::validate(&wrapped, cx.src, &mut cx.diags);
        } else {
            cx.wrong_type(v, "a list of { path, <matcher> } checks", key);
        }
    }
}

/// The output of the step named by `of:` that an assertion step checks.
pub(crate) fn asserted_output(kind: &str) -> Option<&'static str> {
    match kind {
        "assert-stdout" => Some("stdout"),
        "assert-stderr" => Some("stderr"),
        "assert-exit" => Some("exit_code"),
        _ => None,
    }
}

/// Check every string under a node that holds `{{ }}` expressions.
fn templates(cx: &mut Ctx<'_>, v: &Node, scope: &Scope) {
    match &v.value {
        Value::Str(s) => expr::check(v, s, scope, cx.src, &mut cx.diags),
        Value::Seq(items) => items.iter().for_each(|i| templates(cx, i, scope)),
        Value::Map(m) => m.iter().for_each(|(_, val)| templates(cx, val, scope)),
        _ => {}
    }
}

/// `files: { mkdir: /tmp/x }`: a value of one of the step's choice fields written as a key.
/// One diagnostic that shows the form (`files: { op: mkdir, path: /tmp/x }`), instead of
/// "missing `op`", "missing `path`" and "unknown field `mkdir`".
fn value_as_key(
    src: &Source,
    owner: &str,
    k: &Node,
    v: &Node,
    map: &[(Node, Node)],
    spec: &'static [Field],
    covered: &mut BTreeSet<&'static str>,
) -> Option<Diagnostic> {
    let kt = k.key_text();
    let choice = spec.iter().find(|f| matches!(f.ty, FieldType::Enum(opts) if opts.contains(&kt.as_str())))?;
    let present = |name: &str| map.iter().any(|(mk, _)| mk.key_text() == name);
    if present(choice.name) {
        return None;
    }
    covered.insert(choice.name);
    // The value goes to the first required text field not written yet (`path`).
    let target =
        spec.iter().find(|f| f.required && f.ty == FieldType::Str && f.name != choice.name && !present(f.name));
    let mut form = format!("{}: {kt}", choice.name);
    if let Some(t) = target {
        covered.insert(t.name);
        let value =
            if matches!(v.value, Value::Map(_) | Value::Seq(_) | Value::Null) { "…".into() } else { v.key_text() };
        form.push_str(&format!(", {}: {value}", t.name));
    }
    for (mk, mv) in map.iter().filter(|(mk, _)| mk.key_text() != kt) {
        form.push_str(&format!(
            ", {}: {}",
            mk.key_text(),
            if matches!(mv.value, Value::Map(_) | Value::Seq(_)) { "…".into() } else { mv.key_text() }
        ));
    }
    Some(
        k.diag(src, format!("`{kt}` is a value of `{}`, not a field of `{owner}`", choice.name))
            .label(format!("an `{}`", choice.name))
            .help(format!("write `{owner}: {{ {form} }}`")),
    )
}

/// `exec: { cmd: …, sandbox: sb }`: a key that goes beside the step kind, written inside it.
fn common_key_inside(src: &Source, owner: &str, k: &Node, v: &Node, map: &[(Node, Node)]) -> Option<Diagnostic> {
    let kt = k.key_text();
    // Nested objects (`http.expect`) are not steps.
    if owner.contains('.') || !COMMON_KEYS.iter().any(|(c, _)| *c == kt) {
        return None;
    }
    let flow =
        |n: &Node| if matches!(n.value, Value::Map(_) | Value::Seq(_)) { "…".to_string() } else { n.key_text() };
    let rest: Vec<String> = map
        .iter()
        .filter(|(mk, _)| mk.key_text() != kt)
        .map(|(mk, mv)| format!("{}: {}", mk.key_text(), flow(mv)))
        .collect();
    Some(
        k.diag(src, format!("`{kt}` is a key of the step, not a field of `{owner}`"))
            .label("belongs beside the step kind")
            .help(format!(
                "write it beside `{owner}:`, at the same indentation:\n  - {owner}: {{ {} }}\n    {kt}: {}",
                rest.join(", "),
                flow(v)
            )),
    )
}

/// A syntax error in an expression field (`that:`, `if:`): say it takes a bare expression,
/// since the general expression help (`{{ vars.name }}`) suggests the braces it does not need.
/// `that: "{{ steps.a.stdout }} == 'ok'"`: `{{ }}` inside an expression is rendered into its
/// text before it is evaluated, so the value becomes code (a quote in it breaks the
/// expression, or changes it). Refused, with the bare form; a lone `{{ expr }}` is the
/// expression itself and is taken.
fn templated_expression(cx: &mut Ctx<'_>, v: &Node, key: &str, example: &str) -> bool {
    let s = v.as_str().unwrap_or_default();
    if !(s.contains("{{") || s.contains("{%")) || expr::is_lone_expression(s) {
        return false;
    }
    let d = v
        .diag(cx.src, format!("`{key}:` takes a bare expression, not a template with `{{{{ }}}}` inside"))
        .label("`{{ }}` here would paste a value into the expression's text")
        .help(format!("name the values as they are, without `{{{{ }}}}`, e.g. `{example}`"));
    cx.push(d);
    true
}

fn bare_expression_help(diags: &mut [Diagnostic], key: &str, example: &str) {
    for d in diags {
        if let Some(rest) = d.message.strip_prefix("template syntax error: ") {
            d.message = format!("expression syntax error in `{key}`: {}", rest.trim_start_matches("syntax error: "));
            d.label = Some("in this expression".into());
            d.help = Some(format!(
                "`{key}:` takes a bare expression, without `{{{{ }}}}`, e.g. `{example}`; operators: == != < > and or not in"
            ));
        }
    }
}

/// `watch-events { expect: [...] }`: each item a name or `{ name, type }` with a type the
/// watch reports (a literal one; a templated one is checked when rendered).
fn watch_expect(cx: &mut Ctx<'_>, args: &Node) {
    let Some(expect) = args.get("expect") else { return };
    let items: Vec<&Node> = match &expect.value {
        Value::Seq(items) => items.iter().collect(),
        Value::Str(s) if expr::is_expression(s) => return,
        _ => vec![expect],
    };
    let types = registry::WATCH_TYPES;
    for item in items {
        match &item.value {
            Value::Str(_) => {}
            Value::Map(m) => {
                for (k, v) in m {
                    match k.key_text().as_str() {
                        "name" => {}
                        "type" => {
                            let t = v.key_text();
                            if expr::has_template(v) || types.contains(&t.to_ascii_lowercase().as_str()) {
                                continue;
                            }
                            // The words other watchers use (inotify, fsnotify, watchdog).
                            let other = match t.to_ascii_lowercase().as_str() {
                                "modify" | "modified" | "change" | "changed" | "update" => Some("write"),
                                "delete" | "deleted" | "unlink" => Some("remove"),
                                "move" | "moved" => Some("rename"),
                                "attrib" | "chown" => Some("chmod"),
                                _ => None,
                            };
                            let help = other.or_else(|| did_you_mean(&t, types.iter().copied())).map_or_else(
                                || format!("types: {}", types.join(", ")),
                                |s| format!("did you mean `{s}`?"),
                            );
                            let d = v
                                .diag(cx.src, format!("`{t}` is not a type of change a watch reports"))
                                .label(format!("one of {}", types.join("|")))
                                .help(help);
                            cx.push(d);
                        }
                        _ => cx.unknown_key(k, &["name", "type"], "in a `watch-events` expect item"),
                    }
                }
                if !m.iter().any(|(k, _)| k.key_text() == "name") {
                    cx.err(item, "a `watch-events` expect item needs a `name`").help =
                        Some("write `{ name: a.txt, type: write }`, or just the name".into());
                }
            }
            _ => cx.wrong_type(item, "a name or { name, type }", "watch-events.expect"),
        }
    }
}

/// `http: { capture: { name: { header, regex } } }`: names a variable can have, each with
/// `header`, `regex` or both, and a regex that compiles.
fn http_capture(cx: &mut Ctx<'_>, args: &Node) {
    let Some(node) = args.get("capture") else { return };
    let Some(entries) = node.as_map() else {
        if !node.as_str().is_some_and(expr::is_expression) {
            cx.wrong_type(node, "a mapping of variable names to { header, regex }", "capture");
        }
        return;
    };
    let example = "write `capture: { token: { header: X-Token } }` or `capture: { id: { regex: 'id=(\\d+)' } }`";
    for (k, v) in entries {
        let name = k.key_text();
        let ok = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            cx.err(k, format!("capture name `{name}` must be letters, digits and `_` (not starting with a digit)"))
                .help = Some("it becomes `{{ vars.<name> }}`".into());
        }
        let Some(fields) = v.as_map() else {
            let d = v
                .diag(
                    cx.src,
                    format!("capture `{name}` must be {{ header }}, {{ regex }} or both, found {}", v.type_name()),
                )
                .help(example);
            cx.push(d);
            continue;
        };
        for (fk, fv) in fields {
            match fk.key_text().as_str() {
                "header" => {}
                "regex" => {
                    let re = fv.key_text();
                    if !expr::has_template(fv) {
                        if let Err(e) = regex::Regex::new(&re) {
                            let d = fv
                                .diag(cx.src, format!("bad regex for capture `{name}`"))
                                .label("does not compile")
                                .help(e.to_string());
                            cx.push(d);
                        }
                    }
                }
                _ => cx.unknown_key(fk, &["header", "regex"], &format!("in capture `{name}`")),
            }
        }
        if v.get("header").is_none() && v.get("regex").is_none() {
            let d = v.diag(cx.src, format!("capture `{name}` needs `header`, `regex` or both")).help(example);
            cx.push(d);
        }
    }
}

/// `assert-file: { equals_file: … }`: the local file is found now (beside the scenario, inside
/// its folder), rather than by the run; a templated path is resolved the same way at run time.
fn local_file(cx: &mut Ctx<'_>, args: &Node) {
    if let Some(node) = args.get("sha256") {
        let digest = node.as_str().filter(|s| !expr::is_expression(s));
        if digest.is_some_and(|d| d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit())) {
            let d = node
                .diag(cx.src, "`sha256` is not a SHA-256 digest")
                .label("expected 64 hex digits")
                .help("write the digest as `sha256sum FILE` prints it");
            cx.push(d);
        }
    }
    let Some(node) = args.get("equals_file") else { return };
    if let Some(exists) = args.get("exists").filter(|e| matches!(e.value, Value::Bool(false))) {
        let d = exists
            .diag(cx.src, super::local_file::EQUALS_FILE_AND_ABSENT)
            .label("the file must not exist")
            .help("keep `equals_file` to compare the file, or `exists: false` to check it is absent");
        cx.push(d);
    }
    let Some(rel) = node.as_str().filter(|s| !expr::is_expression(s)) else { return };
    let scenario_dir = std::path::Path::new(&cx.src.path).parent().map(|p| p.to_path_buf()).unwrap_or_default();
    if let Err(r) = super::local_file::resolve(&scenario_dir, rel, "equals_file") {
        let d = node.diag(cx.src, r.message).label(r.label).help(r.help);
        cx.push(d);
    }
}

/// `build`/`deploy` of a template folder that is not there: found now rather than by the run.
fn template_folder(cx: &mut Ctx<'_>, kind: &str, args: &Node, opts: &LoadOptions) {
    let scenario_dir = std::path::Path::new(&cx.src.path).parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let (node, dir, help) = match (args.get("path"), args.get("template")) {
        (Some(p), _) => {
            let Some(rel) = p.as_str().filter(|s| !expr::is_expression(s)) else { return };
            let dir = scenario_dir.join(rel);
            (p, dir, "`path:` is relative to the scenario file".to_string())
        }
        (None, Some(t)) => {
            let Some(name) = t.as_str().filter(|s| !expr::is_expression(s)) else { return };
            let root = opts.templates_dir.as_deref().filter(|r| !r.is_empty());
            let dir = crate::templates::find_dir(name, &scenario_dir, root);
            let help = match root {
                Some(r) => format!(
                    "{} is {r}, and it has no folder `{name}`; unset it to search `templates/` above the scenario file, or add the folder",
                    crate::templates::TEMPLATES_DIR_ENV
                ),
                None => format!(
                    "looked for `templates/{name}` in the folders above the scenario file; set {} to the folder that holds your template folders, or give `path:` (relative to the scenario file)",
                    crate::templates::TEMPLATES_DIR_ENV
                ),
            };
            (t, dir, help)
        }
        _ => return,
    };
    if !dir.is_dir() {
        let d = node
            .diag(cx.src, format!("no template folder {} for `{kind}`", dir.display()))
            .label("folder not found")
            .help(help);
        cx.push(d);
    }
}

/// The marker at the top of a steps file: `kind: steps`.
pub(crate) const STEPS_KIND: &str = "steps";
/// The keys at the top of a steps file.
const STEPS_FILE_KEYS: &[&str] = &["kind", "description", "params", "steps"];
/// How deep includes may nest (a file that includes a file that includes …).
pub const MAX_INCLUDE_DEPTH: usize = 16;
/// The most steps includes may bring into one file: two includes of a file that includes
/// itself twice, and so on, double at each level.
pub const MAX_INCLUDED_STEPS: usize = 10_000;

/// A list of steps, `include:` steps expanded in place.
fn step_list(
    cx: &mut Ctx<'_>,
    items: &[Node],
    scope: &mut Scope,
    ids: &mut BTreeMap<String, Location>,
    sandboxes: &mut usize,
    opts: &LoadOptions,
) -> Vec<Step> {
    let mut out = Vec::new();
    for item in items {
        if item.get("include").is_some() {
            out.extend(include(cx, item, scope, sandboxes, opts));
        } else if let Some(step) = step(cx, item, scope, ids, sandboxes, opts) {
            out.push(step);
        }
    }
    out
}

/// `a/./b/../c` as `a/c`, without asking the filesystem: the path a diagnostic shows.
fn tidy(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// A parameter a steps file declares: `name: ~` (required), `name: <default>`, or
/// `name: { default: …, description: … }`.
struct Param {
    name: String,
    default: Option<Node>,
}

/// The `params:` of a steps file.
fn declared_params(cx: &mut Ctx<'_>, node: &Node) -> Vec<Param> {
    let Some(map) = node.as_map() else {
        if node.value != Value::Null {
            cx.wrong_type(node, "a mapping of parameter names to defaults", "params");
        }
        return Vec::new();
    };
    let mut out = Vec::new();
    for (k, v) in map {
        let name = k.key_text();
        let ok = !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if !ok {
            cx.err(k, format!("parameter name `{name}` must be letters, digits and `_` (not starting with a digit)"))
                .help = Some("parameters are used as `{{ params.<name> }}`".into());
            continue;
        }
        let default = match &v.value {
            Value::Null => None,
            Value::Map(m) if m.iter().any(|(mk, _)| ["default", "description"].contains(&mk.key_text().as_str())) => {
                for (mk, _) in m.iter().filter(|(mk, _)| !["default", "description"].contains(&mk.key_text().as_str()))
                {
                    cx.unknown_key(mk, &["default", "description"], &format!("in parameter `{name}`"));
                }
                v.get("default").cloned()
            }
            _ => Some(v.clone()),
        };
        out.push(Param { name, default });
    }
    out
}

/// `- include: lib/login.yaml` with `with: { user: admin }` beside it: the steps of the steps
/// file, checked here with the scope of the include step plus `params`, each remembering
/// the include. Step ids inside are the include's own; what else they add to the scope
/// (`set` variables, sandboxes, aliases) stays after it.
fn include(cx: &mut Ctx<'_>, item: &Node, scope: &mut Scope, sandboxes: &mut usize, opts: &LoadOptions) -> Vec<Step> {
    let map = item.as_map().unwrap_or_default();
    let Some((knode, target)) = map.iter().find(|(k, _)| k.as_str() == Some("include")) else { return Vec::new() };
    // Over the budget already: said once, where it was passed.
    if cx.includes.borrow().steps > MAX_INCLUDED_STEPS {
        return Vec::new();
    }
    let mut with = None;
    for (k, v) in map {
        match k.key_text().as_str() {
            "include" => {}
            "with" => with = Some(v),
            other if registry::lookup(other).is_some() => {
                cx.err(k, format!("a step has exactly one kind, found include and {other}")).help =
                    Some("split it into two steps, each starting with `- `".into());
            }
            other => {
                let d = k
                    .diag(cx.src, format!("`{other}` cannot go beside `include:`"))
                    .label("not for an include")
                    .help(match did_you_mean(other, ["with"]) {
                        Some(s) => format!("did you mean `{s}`?"),
                        None => format!(
                            "an include takes only `with:` beside it; give the steps inside the included file their own `{other}`"
                        ),
                    });
                cx.push(d);
            }
        }
    }
    let example = "write `- include: lib/login.yaml` with `with: { user: admin }` beside it";
    let rel = match target.as_str() {
        Some(s) if expr::is_expression(s) => {
            let d = target
                .diag(cx.src, "the path of `include:` cannot be a template: includes are read before anything runs")
                .label("a template")
                .help("pass what varies as a parameter, with `with:`");
            cx.push(d);
            return Vec::new();
        }
        Some(s) if !s.trim().is_empty() => s.trim(),
        _ => {
            let d = target
                .diag(cx.src, format!("`include` takes the path of a steps file, found {}", target.type_name()))
                .label("expected a path")
                .help(example);
            cx.push(d);
            return Vec::new();
        }
    };
    let here = Path::new(&cx.src.path).parent().unwrap_or(Path::new(""));
    let path = tidy(&here.join(rel));
    let shown = path.to_string_lossy().into_owned();
    let text = match std::fs::read(&path).map(String::from_utf8) {
        Ok(Ok(t)) => t,
        Ok(Err(_)) => {
            cx.err(target, format!("included file {shown} is not UTF-8 text"));
            return Vec::new();
        }
        Err(e) => {
            let why = if e.kind() == std::io::ErrorKind::NotFound { "no such file".to_string() } else { e.to_string() };
            let d = target
                .diag(cx.src, format!("cannot read included file {shown}: {why}"))
                .label("not found")
                .help(format!("the path is relative to the file that includes it, {}", cx.src.path));
            cx.push(d);
            return Vec::new();
        }
    };
    let canonical = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
    if let Some(i) = cx.stack.iter().position(|(p, _)| *p == canonical) {
        let mut chain: Vec<&str> = cx.stack[i..].iter().map(|(_, s)| s.as_str()).collect();
        chain.push(&shown);
        let d = target
            .diag(cx.src, format!("include cycle: {}", chain.join(" → ")))
            .label("includes a file that is already being included")
            .help("a steps file cannot include itself, directly or through another file");
        cx.push(d);
        return Vec::new();
    }
    if cx.stack.len() > MAX_INCLUDE_DEPTH {
        cx.err(target, format!("includes nest more than {MAX_INCLUDE_DEPTH} files deep")).help =
            Some("flatten the steps files".into());
        return Vec::new();
    }
    let child_src = Source::new(shown.clone(), text);
    let (docs, parse_diags) = match yaml::parse_keeping_going(&child_src) {
        Ok(parsed) => parsed,
        Err(diags) => {
            let site = Location { file: cx.src.path.clone(), line: knode.line, col: knode.col };
            cx.diags.extend(diags.into_iter().map(|d| d.note(format!("included from {site}"))));
            return Vec::new();
        }
    };
    let frame_id = {
        let mut c = cx.includes.borrow_mut();
        c.frames += 1;
        c.frames
    };
    let site = Location { file: cx.src.path.clone(), line: knode.line, col: knode.col };
    let mut child = Ctx {
        src: &child_src,
        diags: parse_diags,
        frame: None,
        stack: cx.stack.iter().cloned().chain([(canonical, shown.clone())]).collect(),
        includes: cx.includes.clone(),
    };
    let docs: Vec<&Node> = docs.iter().filter(|d| d.value != Value::Null).collect();
    let doc = match docs.as_slice() {
        [one] if one.as_map().is_some() => *one,
        _ => {
            let d = target
                .diag(
                    cx.src,
                    format!("{shown} is not a steps file: it must be one mapping with `kind: steps` and `steps:`"),
                )
                .label("not a steps file")
                .help("a steps file starts with `kind: steps`, then `params:` and `steps:`");
            cx.push(d);
            return Vec::new();
        }
    };
    if doc.get("kind").and_then(Node::as_str) != Some(STEPS_KIND) {
        let what = if doc.get("name").is_some() { "a scenario" } else { "not a steps file" };
        let d = target
            .diag(cx.src, format!("{shown} is {what}: a file run by `include:` starts with `kind: steps`"))
            .label("not a steps file")
            .help("add `kind: steps` at the top of it, beside `params:` and `steps:` (its `kind` keeps a folder's search from running it as a scenario)");
        cx.push(d);
        return Vec::new();
    }
    for (k, v) in doc.as_map().unwrap_or_default() {
        match k.key_text().as_str() {
            "kind" | "params" | "steps" => {}
            "description" => {
                child.string(v, "description");
            }
            _ => child.unknown_key(k, STEPS_FILE_KEYS, "in a steps file"),
        }
    }
    let params = doc.get("params").map(|p| declared_params(&mut child, p)).unwrap_or_default();
    let names: BTreeSet<String> = params.iter().map(|p| p.name.clone()).collect();
    // `with:`: every name declared, every required one given; values checked where written.
    let mut given: BTreeMap<String, Node> = BTreeMap::new();
    if let Some(w) = with {
        match w.as_map() {
            Some(entries) => {
                for (k, v) in entries {
                    let name = k.key_text();
                    if !names.contains(&name) {
                        let help = did_you_mean(&name, names.iter().map(String::as_str)).map_or_else(
                            || {
                                if names.is_empty() {
                                    format!("{shown} declares no `params:`")
                                } else {
                                    format!(
                                        "the params of {shown}: {}",
                                        names.iter().cloned().collect::<Vec<_>>().join(", ")
                                    )
                                }
                            },
                            |s| format!("did you mean `{s}`?"),
                        );
                        let d = k
                            .diag(cx.src, format!("unknown parameter `{name}` for {shown}"))
                            .label("not declared")
                            .help(help);
                        cx.push(d);
                        continue;
                    }
                    templates(cx, v, scope);
                    given.insert(name, v.clone());
                }
            }
            None if w.value == Value::Null => {}
            None => cx.wrong_type(w, "a mapping of parameter names to values", "with"),
        }
    }
    let mut values = Vec::new();
    for p in &params {
        match (given.remove(&p.name), &p.default) {
            (Some(v), _) => values.push((p.name.clone(), v, cx.src.path.clone())),
            (None, Some(d)) => {
                templates(&mut child, d, scope);
                values.push((p.name.clone(), d.clone(), shown.clone()));
            }
            (None, None) => {
                let all: Vec<String> = params
                    .iter()
                    .map(|q| if q.default.is_some() { format!("{} (has a default)", q.name) } else { q.name.clone() })
                    .collect();
                let d = knode
                    .diag(cx.src, format!("missing parameter `{}` for {shown}", p.name))
                    .label("needs a value for it")
                    .help(format!(
                        "write `with: {{ {}: … }}` beside `include:`; its params: {}",
                        p.name,
                        all.join(", ")
                    ));
                cx.push(d);
            }
        }
    }
    let frame = Arc::new(IncludeFrame { id: frame_id, site: site.clone(), params: values, parent: cx.frame.clone() });
    child.frame = Some(frame.clone());
    let steps = match doc.get("steps") {
        Some(n) if n.as_seq().is_some_and(|s| !s.is_empty()) => {
            // Step ids are the include's own (the file may be included twice); variables,
            // sandboxes and aliases are shared with the steps around it.
            let items = n.as_seq().unwrap_or_default();
            let later = items.iter().filter_map(|i| i.get("id").and_then(Node::as_str)).map(str::to_string).collect();
            let saved_params = scope.params.replace(names);
            let saved_steps = std::mem::take(&mut scope.steps);
            let saved_later = std::mem::replace(&mut scope.later_steps, later);
            let mut own_ids = BTreeMap::new();
            let list = step_list(&mut child, items, scope, &mut own_ids, sandboxes, opts);
            scope.params = saved_params;
            scope.steps = saved_steps;
            scope.later_steps = saved_later;
            list
        }
        Some(n) if n.as_seq().is_none() && n.value != Value::Null => {
            child.wrong_type(n, "a list of steps", "steps");
            Vec::new()
        }
        Some(n) => {
            child.err(n, "a steps file has no steps").help = Some("add at least one step under `steps:`".into());
            Vec::new()
        }
        None => {
            child.err(doc, "a steps file has no `steps`").help = Some("add `steps:` with at least one step".into());
            Vec::new()
        }
    };
    // Said once per include; a diagnostic from a file it includes in turn already says it.
    let note = frame.chain();
    for d in child.diags {
        let d = if d.location.file == shown { d.note(note.clone()) } else { d };
        cx.diags.push(d);
    }
    let total = {
        let mut c = cx.includes.borrow_mut();
        c.steps += steps.len();
        c.steps
    };
    if total > MAX_INCLUDED_STEPS && total - steps.len() <= MAX_INCLUDED_STEPS {
        cx.err(knode, format!("includes bring in more than {MAX_INCLUDED_STEPS} steps")).help =
            Some("a steps file included many times over (each include of it copies its steps): include fewer".into());
    }
    if total > MAX_INCLUDED_STEPS {
        return Vec::new();
    }
    steps
}

#[cfg(test)]
mod include_tests {
    use std::path::Path;

    use crate::diag::Diagnostic;
    use crate::model::{load, LoadOptions};

    fn write(dir: &Path, name: &str, text: &str) {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn check(dir: &Path) -> Result<Vec<crate::model::Step>, Vec<Diagnostic>> {
        load(&[dir.join("s.yaml")], &LoadOptions::default()).map(|l| l.scenarios[0].steps.clone())
    }

    /// A steps file included twice with the same mistake: one diagnostic, at the file's own
    /// line and column, with a note for each include.
    #[test]
    fn a_mistake_in_a_file_included_twice_is_one_diagnostic_with_both_includes() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "lib/x.yaml", "kind: steps\nsteps:\n  - exec: echo {{ params.nope }}\n");
        write(
            t.path(),
            "s.yaml",
            "name: s\nsteps:\n  - create: base\n  - include: lib/x.yaml\n  - include: lib/x.yaml\n",
        );
        let d = check(t.path()).unwrap_err();
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].location.file.ends_with("lib/x.yaml"));
        assert_eq!((d[0].location.line, d[0].location.col), (3, 11));
        assert_eq!(d[0].message, "undefined parameter `params.nope`");
        assert_eq!(d[0].notes.len(), 2, "{:?}", d[0].notes);
        assert!(d[0].notes[0].ends_with("s.yaml:4:5") && d[0].notes[1].ends_with("s.yaml:5:5"), "{:?}", d[0].notes);
        assert!(d[0].render().contains("= note: included from "), "{}", d[0].render());
    }

    /// Expanded in place: each step keeps its include, with its parameters (a default where
    /// `with:` gives none), and the params a nested include's `with:` uses are its includer's.
    #[test]
    fn steps_are_expanded_in_place_with_their_frames() {
        let t = tempfile::tempdir().unwrap();
        write(t.path(), "lib/a.yaml", "kind: steps\nparams: { p: ~, q: 2 }\nsteps:\n  - set: { x: \"{{ params.p }}\" }\n  - include: b.yaml\n    with: { r: \"{{ params.q }}\" }\n");
        write(
            t.path(),
            "lib/b.yaml",
            "kind: steps\nparams:\n  r: { description: the value }\nsteps:\n  - set: { y: \"{{ params.r }}\" }\n",
        );
        write(t.path(), "s.yaml", "name: s\nsteps:\n  - include: lib/a.yaml\n    with: { p: 1 }\n  - assert: { that: vars.x == 1 and vars.y == 2 }\n");
        let steps = check(t.path()).unwrap();
        assert_eq!(steps.len(), 3);
        let a = steps[0].include.as_ref().unwrap();
        let names: Vec<_> =
            a.params.iter().map(|(n, v, f)| (n.as_str(), v.key_text(), f.ends_with("a.yaml"))).collect();
        assert_eq!(names, [("p", "1".to_string(), false), ("q", "2".to_string(), true)]);
        let b = steps[1].include.as_ref().unwrap();
        assert!(steps[1].location.file.ends_with("lib/b.yaml"));
        assert_eq!(b.parent.as_ref().unwrap().id, a.id);
        assert!(b.chain().contains("lib/a.yaml:5:5, included from "), "{}", b.chain());
        assert!(steps[2].include.is_none());
        // Without `with:`, a parameter without a default is missing (and said where).
        write(t.path(), "s.yaml", "name: s\nsteps:\n  - include: lib/b.yaml\n");
        let d = check(t.path()).unwrap_err();
        assert_eq!(d[0].message, format!("missing parameter `r` for {}", t.path().join("lib/b.yaml").display()));
        assert_eq!((d[0].location.line, d[0].location.col), (3, 5));
    }

    /// Includes that multiply (a file including the next twice, sixteen deep) stop at the
    /// budget, said once, instead of expanding 2^16 times.
    #[test]
    fn includes_that_multiply_are_bounded() {
        let t = tempfile::tempdir().unwrap();
        for i in 0..15 {
            let next = format!("f{}.yaml", i + 1);
            write(
                t.path(),
                &format!("f{i}.yaml"),
                &format!("kind: steps\nsteps:\n  - include: {next}\n  - include: {next}\n"),
            );
        }
        write(t.path(), "f15.yaml", "kind: steps\nsteps:\n  - set: { a: 1 }\n");
        write(t.path(), "s.yaml", "name: s\nsteps:\n  - include: f0.yaml\n");
        let started = std::time::Instant::now();
        let d = check(t.path()).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        let over: Vec<_> = d.iter().filter(|d| d.message.contains("more than 10000 steps")).collect();
        assert_eq!(over.len(), 1, "{d:?}");
    }
}

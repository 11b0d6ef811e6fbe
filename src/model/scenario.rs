//! The scenario model: what a scenario file holds once validated, and the cases its matrix
//! expands to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as JsonValue;

use super::kinds::StepKind;
use crate::diag::{Location, Source};
use crate::yaml::Node;

#[derive(Debug, Clone, Default)]
pub struct Requires {
    pub env: Vec<String>,
    /// Where `env` is written: what a missing credential points at under
    /// `--require-credentials`.
    pub env_location: Option<crate::diag::Location>,
    pub providers: Vec<String>,
    pub capabilities: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct KnownIssue {
    pub id: Option<String>,
    pub reason: String,
    pub strict: bool,
    pub until: Option<String>,
    /// `until` is past: the scenario fails without running, with this (located at the date).
    /// Not a reason to refuse the file: its other scenarios run.
    pub expired: Option<crate::diag::Diagnostic>,
}

#[derive(Debug, Clone, Copy)]
pub struct Retry {
    pub attempts: u32,
    pub delay: Duration,
    pub backoff: f64,
}

#[derive(Debug, Clone, Copy)]
pub struct Eventually {
    pub within: Duration,
    pub every: Duration,
}

#[derive(Debug, Clone)]
pub struct Step {
    pub kind: &'static StepKind,
    pub location: Location,
    /// The step's arguments as a mapping (shorthand already expanded).
    pub args: Node,
    pub id: Option<String>,
    pub label: String,
    pub sandbox: Option<String>,
    pub timeout: Option<Duration>,
    pub retry: Option<Retry>,
    pub eventually: Option<Eventually>,
    /// `if:` expression, and where it is.
    pub condition: Option<(String, Node)>,
    pub continue_on_error: bool,
    /// `requires: { env }`: variables the step needs (a model's key); unset, it is SKIPPED.
    pub requires_env: Vec<String>,
    /// `expect_error`: the step must fail, with an error of the kinds it names.
    pub expect_error: Option<ExpectError>,
    /// The `include:` that brought this step in from a steps file; `None` for the scenario's own.
    pub include: Option<Arc<IncludeFrame>>,
}

/// One `include:` of a steps file, shared by the steps it brought in: its parameters are
/// evaluated once, when the first of them runs, in the context of the include step.
#[derive(Debug)]
pub struct IncludeFrame {
    /// Unique within the scenario (the runner keeps each frame's evaluated params by it).
    pub id: usize,
    /// The `include:` key, in the file that has it.
    pub site: Location,
    /// Each parameter: its name, its value (from `with:`, else the file's default) and the
    /// file that value is written in.
    pub params: Vec<(String, Node, String)>,
    /// The include that brought in the file holding this include, when it is itself included.
    pub parent: Option<Arc<IncludeFrame>>,
}

impl IncludeFrame {
    /// `included from a.yaml:7:5`, then each include above it.
    pub fn chain(&self) -> String {
        let mut out = format!("included from {}", self.site);
        let mut up = self.parent.as_deref();
        while let Some(f) = up {
            out.push_str(&format!(", included from {}", f.site));
            up = f.parent.as_deref();
        }
        out
    }
}

/// `expect_error: true`, `expect_error: { contains: … }` or `expect_error: { kind: timeout, … }`.
#[derive(Debug, Clone)]
pub struct ExpectError {
    /// The kinds that meet it: `[Failed]` unless `kind:` names others.
    pub kinds: Vec<ErrorClass>,
    /// A matcher for the error's message (the mapping without `kind`), if any.
    pub matcher: Option<Node>,
}

/// The kinds of error `expect_error` tells apart. `Failed`, the default, is the operation's
/// own failure (a missing file, a refused request, a check that did not hold); a limit that
/// fired, and an ERROR of the platform, never meet `expect_error` unless it names them: a
/// step that hangs, or a provider that is down, is not the failure a scenario expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// Any failure of the operation that is not a timeout or an ERROR (includes the two below).
    Failed,
    /// The thing asked for does not exist.
    NotFound,
    /// The platform refused the request as wrong.
    Invalid,
    /// A limit fired: the command's `timeout`, the step's, the client's.
    Timeout,
    /// The platform or a service broke or could not be reached (an ERROR, a protocol error).
    Infra,
    /// Credentials were refused.
    Auth,
    /// The provider does not support the operation.
    Unsupported,
    /// The platform has no room for what was asked (disk, memory, sandboxes: E2B's 507/429
    /// on a create); an ERROR unless named.
    Capacity,
}

impl ErrorClass {
    /// Each kind's name in `kind:`, and what it means (for diagnostics and docs).
    pub const ALL: &'static [(ErrorClass, &'static str)] = &[
        (ErrorClass::Failed, "failed"),
        (ErrorClass::NotFound, "not-found"),
        (ErrorClass::Invalid, "invalid"),
        (ErrorClass::Timeout, "timeout"),
        (ErrorClass::Infra, "infra"),
        (ErrorClass::Auth, "auth"),
        (ErrorClass::Unsupported, "unsupported"),
        (ErrorClass::Capacity, "capacity"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(c, _)| *c == self).map_or("failed", |(_, n)| n)
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(c, _)| *c)
    }

    /// Whether an error of kind `got` meets an `expect_error` that names `self`.
    pub fn admits(self, got: ErrorClass) -> bool {
        self == got || (self == ErrorClass::Failed && matches!(got, ErrorClass::NotFound | ErrorClass::Invalid))
    }
}

#[derive(Debug)]
pub struct Scenario {
    pub source: Arc<Source>,
    pub name: String,
    pub description: Option<String>,
    pub location: Location,
    pub tags: Vec<String>,
    pub timeout: Option<Duration>,
    pub requires: Requires,
    pub known_issue: Option<KnownIssue>,
    pub vars: serde_json::Map<String, JsonValue>,
    /// Names of environment variables whose values are masked, beyond the automatic ones.
    pub secrets: Vec<String>,
    pub matrix: Vec<(String, Vec<JsonValue>)>,
    pub setup: Vec<Step>,
    pub steps: Vec<Step>,
    pub finally: Vec<Step>,
    /// Upper bound on sandboxes alive at once in this scenario (number of create steps).
    pub sandbox_need: usize,
}

/// One runnable case: a scenario with one matrix cell.
#[derive(Debug, Clone)]
pub struct Case {
    pub scenario: Arc<Scenario>,
    pub name: String,
    pub matrix: BTreeMap<String, JsonValue>,
}

impl Scenario {
    /// Matrix expansion: one case per combination, named `name[k=v,k2=v2]`.
    /// A mapping or list value is named by its `id`, else by its index and first scalar
    /// (`name[case=small]`, `name[case=1-large]`), as pytest's parametrize ids are, not by its JSON.
    pub fn cases(self: &Arc<Self>) -> Vec<Case> {
        // (cell, the label of each key's value, in the matrix's order)
        let mut cells: Vec<(BTreeMap<String, JsonValue>, Vec<String>)> = vec![(BTreeMap::new(), Vec::new())];
        for (key, values) in &self.matrix {
            let labels = case_ids(values);
            cells = cells
                .into_iter()
                .flat_map(|(cell, names)| {
                    values.iter().zip(&labels).map(move |(v, label)| {
                        let mut c = cell.clone();
                        c.insert(key.clone(), v.clone());
                        let mut n = names.clone();
                        n.push(format!("{key}={label}"));
                        (c, n)
                    })
                })
                .collect();
        }
        cells
            .into_iter()
            .map(|(cell, names)| {
                let name =
                    if cell.is_empty() { self.name.clone() } else { format!("{}[{}]", self.name, names.join(",")) };
                Case { scenario: self.clone(), name, matrix: cell }
            })
            .collect()
    }
}

/// The short names of one matrix key's values: a scalar as its text; a mapping by its `id`
/// (when every mapping's `id` is a distinct scalar), else by its index and first scalar value.
fn case_ids(values: &[JsonValue]) -> Vec<String> {
    let scalar = |v: &JsonValue| match v {
        JsonValue::Array(_) | JsonValue::Object(_) => None,
        v => Some(text(v)),
    };
    let id = |v: &JsonValue| v.as_object().and_then(|m| m.get("id")).and_then(scalar);
    let ids: Vec<Option<String>> = values.iter().map(id).collect();
    let mut distinct: Vec<&String> = ids.iter().flatten().collect();
    distinct.sort();
    distinct.dedup();
    let use_ids = distinct.len() == ids.iter().flatten().count();
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let first = match v {
                JsonValue::Object(m) => m.values().find_map(scalar),
                JsonValue::Array(items) => items.iter().find_map(scalar),
                v => return text(v),
            };
            match (&ids[i], first) {
                (Some(id), _) if use_ids => id.clone(),
                (_, Some(first)) if !first.is_empty() => {
                    let short: String = first.chars().take(20).collect();
                    let more = if short.len() < first.len() { "…" } else { "" };
                    format!("{i}-{short}{more}")
                }
                _ => i.to_string(),
            }
        })
        .collect()
}

/// The text form of a value: strings as they are, everything else as JSON.
pub fn text(v: &JsonValue) -> String {
    match v {
        JsonValue::String(s) => s.clone(),
        JsonValue::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {

    fn names(matrix: &str) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.yaml");
        std::fs::write(&path, format!("name: m\nmatrix:\n{matrix}steps:\n  - set: {{ a: 1 }}\n")).unwrap();
        let loaded = crate::model::load(&[path], &crate::model::LoadOptions::default()).expect("valid");
        loaded.cases.into_iter().map(|c| c.name).collect()
    }

    /// Issue 37 item 9: a case whose value is a mapping was named by its whole JSON.
    #[test]
    fn matrix_cases_have_short_names() {
        assert_eq!(names("  template: [base, ci]\n  n: [1]\n"), ["m[template=base,n=1]", "m[template=ci,n=1]"]);
        assert_eq!(
            names("  case:\n    - { id: small, size: 1, body: '{\"a\": [1, 2]}' }\n    - { id: large, size: 9 }\n"),
            ["m[case=small]", "m[case=large]"]
        );
        assert_eq!(
            names("  case:\n    - { size: 1, body: x }\n    - { body: { a: 1 }, size: 9 }\n    - [{ a: 1 }]\n"),
            ["m[case=0-1]", "m[case=1-9]", "m[case=2]"]
        );
        // Ids that collide do not name the cases (names are unique within a run).
        assert_eq!(names("  case: [{ id: a, n: x }, { id: a, n: y }]\n"), ["m[case=0-a]", "m[case=1-a]"]);
        let long = names("  c: [{ cmd: 'python3 -c \"print(123456789)\"' }]\n");
        assert_eq!(long, ["m[c=0-python3 -c \"print(12…]"]);
    }
}

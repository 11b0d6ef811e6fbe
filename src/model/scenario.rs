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
    pub fn cases(self: &Arc<Self>) -> Vec<Case> {
        let mut cells: Vec<BTreeMap<String, JsonValue>> = vec![BTreeMap::new()];
        for (key, values) in &self.matrix {
            cells = cells
                .into_iter()
                .flat_map(|cell| {
                    values.iter().map(move |v| {
                        let mut c = cell.clone();
                        c.insert(key.clone(), v.clone());
                        c
                    })
                })
                .collect();
        }
        cells
            .into_iter()
            .map(|cell| {
                let name = if cell.is_empty() {
                    self.name.clone()
                } else {
                    let order: Vec<String> =
                        self.matrix.iter().map(|(k, _)| format!("{k}={}", text(&cell[k]))).collect();
                    format!("{}[{}]", self.name, order.join(","))
                };
                Case { scenario: self.clone(), name, matrix: cell }
            })
            .collect()
    }
}

/// The text form of a value: strings as they are, everything else as JSON.
pub fn text(v: &JsonValue) -> String {
    match v {
        JsonValue::String(s) => s.clone(),
        JsonValue::Null => String::new(),
        other => other.to_string(),
    }
}

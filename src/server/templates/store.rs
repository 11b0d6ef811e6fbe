//! The templates made through this server, as data (held in `AppState`): their builds, tags and
//! upload tokens. What is done with them is in `super` (the template API).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde_json::Value as JsonValue;

#[derive(Default)]
pub(super) struct Build {
    pub(super) status: &'static str,
    pub(super) entries: Vec<JsonValue>,
    pub(super) reason: Option<JsonValue>,
}

pub(super) struct Tpl {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) cpu: Option<u64>,
    pub(super) memory: Option<u64>,
    pub(super) builds: HashMap<String, Arc<Mutex<Build>>>,
    /// The newest build's ID (what a tag assigned now points at).
    pub(super) last_build: String,
    /// Tags assigned to it: (tag, build ID, unix seconds).
    pub(super) tags: Vec<(String, String, u64)>,
    /// What its newest ready build was made of, for a build `fromTemplate` it: `fromImage` and
    /// every step, a template's it was made from first (see [`super::expand`]).
    pub(super) recipe: Option<JsonValue>,
}

#[derive(Default)]
pub(super) struct Inner {
    pub(super) by_id: HashMap<String, Tpl>,
    pub(super) by_name: HashMap<String, String>,
    /// Upload token → (template ID, files hash).
    pub(super) uploads: HashMap<String, (String, String)>,
}

/// Templates made through this server.
pub(crate) struct Store {
    pub(super) root: PathBuf,
    pub(super) inner: Mutex<Inner>,
    /// The official templates deployed so far; held while one is built, so the creates that
    /// wait for it wait for one build.
    pub(super) official: tokio::sync::Mutex<std::collections::HashSet<String>>,
    /// `SCENARIO_RUN_TEMPLATES_DIR` from serve's environment and `./.env` (see
    /// [`Store::with_templates_dir`]); `None`: the process environment's.
    pub(super) templates_dir: Option<String>,
}

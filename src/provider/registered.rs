//! What the providers that build templates themselves (local, docker) share: the template
//! `create` knows by name, and the build log that is both streamed and kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::templates::TemplateDef;

/// A template registered by `build` (what was built) or `deploy` (and what to start).
pub(crate) struct Registered<B> {
    /// The build: a local layer, a docker image.
    pub built: Arc<B>,
    /// Set by `deploy`: run in the background at create, then wait for `ready`.
    pub start: Option<String>,
    pub ready: Option<String>,
    pub ports: Vec<u16>,
    /// template.yaml `envs` with a value.
    pub envs: BTreeMap<String, String>,
    /// template.yaml `cpu` and `memory` (MiB): the sandbox's limits unless `create` says.
    pub cpu: Option<u32>,
    pub memory_mb: Option<u64>,
    /// template.yaml `disk` (MiB).
    pub disk_mb: Option<u64>,
}

// Not derived: that would ask `B: Clone`, and only the Arc is cloned.
impl<B> Clone for Registered<B> {
    fn clone(&self) -> Self {
        Self {
            built: self.built.clone(),
            start: self.start.clone(),
            ready: self.ready.clone(),
            ports: self.ports.clone(),
            envs: self.envs.clone(),
            cpu: self.cpu,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
        }
    }
}

impl<B> Registered<B> {
    /// `def`'s registration of `built`, whose own CMD and exposed ports are the fallbacks.
    pub fn new(built: &Arc<B>, def: &TemplateDef, deploy: bool, cmd: Option<&str>, ports: &[u16]) -> Self {
        Self {
            built: built.clone(),
            start: if deploy { def.start_command.clone().or_else(|| cmd.map(str::to_string)) } else { None },
            ready: if deploy { def.ready_command.clone() } else { None },
            ports: if def.ports.is_empty() { ports.to_vec() } else { def.ports.clone() },
            envs: def.envs.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect(),
            cpu: def.cpu,
            memory_mb: def.memory,
            disk_mb: def.disk,
        }
    }

    /// The log line of a deploy: `registered template <what>: start `..`, ready `..``.
    pub fn note(&self, what: &str) -> String {
        format!(
            "registered template {what}: start `{}`, ready `{}`",
            self.start.as_deref().unwrap_or("(none)"),
            self.ready.as_deref().map_or_else(|| format!("ports {:?}", self.ports), str::to_string)
        )
    }
}

/// A build log: every line is sent to the step's stream and kept.
pub(crate) struct BuildLog {
    tx: mpsc::UnboundedSender<String>,
    pub lines: Vec<String>,
}

impl BuildLog {
    pub fn new(tx: mpsc::UnboundedSender<String>) -> Self {
        Self { tx, lines: Vec::new() }
    }

    pub fn line(&mut self, s: impl Into<String>) {
        let s = s.into();
        let _ = self.tx.send(s.clone());
        self.lines.push(s);
    }
}

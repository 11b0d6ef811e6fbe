//! What a scenario may ask of its provider (`requires:`): the provider names and the optional
//! features a provider may lack. The scenario model owns these words; the providers say which
//! of them they have (`Provider::capabilities`, derived from what each implements).

use serde::Serialize;

/// Every provider's name, in the order the help lists them (`requires.providers`, `--provider`
/// and the JSON Schema read it; the factory makes one provider of each).
pub const PROVIDERS: &[&str] = &["local", "docker", "e2b", "alicloud", "opensandbox"];

/// Optional features a provider may lack; scenarios list them under `requires.capabilities`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// `port_url` reaches a port inside the sandbox.
    Ports,
    /// Each sandbox has its own ports: two sandboxes can bind the same port (not on docker's
    /// host networking, nor on local without namespaces).
    IsolatedPorts,
    Files,
    Processes,
    RunCode,
    Build,
    /// `pause`/`resume`: a paused sandbox's processes stop where they are.
    Pause,
    /// A create's `lifecycle.auto_resume`: traffic to a paused sandbox resumes it.
    AutoResume,
    /// `snapshot`: a sandbox's filesystem captured as a template `create` starts.
    Snapshot,
    /// `watch_dir`: changes under a directory are reported.
    Watch,
    /// `spawn_pty`: commands in a pseudo-terminal.
    Pty,
    /// A background process's stdin kept open and written by pid (`exec: { open_stdin }`,
    /// `send-stdin`).
    OpenStdin,
    /// Egress policies: a create's `network` rules are enforced, and `update-network`
    /// replaces them on a running sandbox.
    Egress,
}

impl Capability {
    pub const ALL: &'static [Capability] = &[
        Capability::Ports,
        Capability::IsolatedPorts,
        Capability::Files,
        Capability::Processes,
        Capability::RunCode,
        Capability::Build,
        Capability::Pause,
        Capability::AutoResume,
        Capability::Snapshot,
        Capability::Watch,
        Capability::Pty,
        Capability::OpenStdin,
        Capability::Egress,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Capability::Ports => "ports",
            Capability::IsolatedPorts => "isolated-ports",
            Capability::Files => "files",
            Capability::Processes => "processes",
            Capability::RunCode => "run-code",
            Capability::Build => "build",
            Capability::Pause => "pause",
            Capability::AutoResume => "auto-resume",
            Capability::Snapshot => "snapshot",
            Capability::Watch => "watch",
            Capability::Pty => "pty",
            Capability::OpenStdin => "open-stdin",
            Capability::Egress => "egress",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|c| c.name() == s)
    }
}

//! Which provider a run uses, made from its name and the run's environment: the one list of
//! provider names (flags, `requires.providers` validation and the JSON Schema read it) and the
//! one place each provider is constructed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::docker::{DockerOptions, DockerProvider};
use super::e2b::{E2bProvider, Preset};
use super::local::{Isolation, LocalOptions, LocalProvider};
use super::Provider;
use crate::errln;
use crate::image::ImageStore;

/// Where sandboxes live (a closed set: an unknown name is a usage error, exit 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderKind {
    /// Isolated sandboxes on this machine (bubblewrap); no account needed.
    Local,
    /// Containers on the Docker engine of DOCKER_HOST.
    Docker,
    /// E2B (api.e2b.app), over the E2B REST API and envd.
    E2b,
    /// Alibaba Cloud FC Agent Sandbox, over the E2B protocol.
    Alicloud,
    /// An OpenSandbox server (or `scenario-run serve`), over its lifecycle API and execd.
    Opensandbox,
}

/// Every provider's name, in the order the help lists them.
pub const NAMES: &[&str] = crate::model::PROVIDERS;

impl ProviderKind {
    pub const ALL: [ProviderKind; 5] = [
        ProviderKind::Local,
        ProviderKind::Docker,
        ProviderKind::E2b,
        ProviderKind::Alicloud,
        ProviderKind::Opensandbox,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Local => "local",
            ProviderKind::Docker => "docker",
            ProviderKind::E2b => "e2b",
            ProviderKind::Alicloud => "alicloud",
            ProviderKind::Opensandbox => "opensandbox",
        }
    }
}

/// `--isolation` (`auto`, `namespaces`, `none`) as the local provider takes it.
pub fn isolation(name: &str) -> Isolation {
    match name {
        "namespaces" => Isolation::Namespaces,
        "none" => Isolation::None,
        _ => Isolation::Auto,
    }
}

/// The local provider's options, with the state directory from the run's environment (files
/// and process), so `.env` and `--env-file` reach it without touching the process's own.
pub fn local_options(isolation: Isolation, env: &BTreeMap<String, String>) -> LocalOptions {
    let state_dir = env
        .get("SCENARIO_RUN_STATE_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(LocalOptions::default_state_dir, PathBuf::from);
    // The image cache and id range come from the run's environment (.env included), for the
    // local provider and the docker provider's offline images alike.
    let images = ImageStore::set_shared(ImageStore::from_vars(env));
    LocalOptions { state_dir, isolation, images }
}

/// Why the run's provider could not be made or made ready.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The run's environment or this machine does not allow it (a bad setting, no isolation).
    #[error("{provider} provider: {error}")]
    Make { provider: &'static str, error: String },
    /// Its one-time preparation ([`Provider::prepare`]) failed.
    #[error("{provider} provider: {error}")]
    Prepare { provider: String, error: super::ProviderError },
    /// Ctrl-C came while it was being prepared.
    #[error("interrupted while preparing the provider")]
    Interrupted,
}

impl SetupError {
    fn make(kind: ProviderKind, error: impl std::fmt::Display) -> Self {
        SetupError::Make { provider: kind.name(), error: error.to_string() }
    }
}

/// The provider `kind`, configured from the run's environment. A local provider that had to
/// fall back to weaker isolation says so once, here.
pub fn make(
    kind: ProviderKind,
    isolation_name: &str,
    env: &BTreeMap<String, String>,
) -> Result<Arc<dyn Provider>, SetupError> {
    match kind {
        ProviderKind::Local => {
            let p = LocalProvider::new(local_options(isolation(isolation_name), env))
                .map_err(|e| SetupError::make(kind, e))?;
            if let Some(w) = p.warning() {
                errln!("warning: {w}");
            }
            Ok(Arc::new(p))
        }
        ProviderKind::E2b | ProviderKind::Alicloud => {
            let preset = if kind == ProviderKind::E2b { Preset::E2b } else { Preset::Alicloud };
            let p = E2bProvider::new(preset, env).map_err(|e| SetupError::make(kind, e))?;
            Ok(Arc::new(p))
        }
        ProviderKind::Opensandbox => {
            let p = super::opensandbox::OpenSandboxProvider::new(env).map_err(|e| SetupError::make(kind, e))?;
            Ok(Arc::new(p))
        }
        ProviderKind::Docker => {
            // Offline images (`base`, FROM names) come from the store the run's environment names.
            ImageStore::set_shared(ImageStore::from_vars(env));
            Ok(Arc::new(DockerProvider::new(DockerOptions::from_env(env))))
        }
    }
}

/// The provider's one-time preparation (the local `base` image on first use), its progress
/// printed as it comes; Ctrl-C stops it. Unless `verbose`, a line that only says an image was
/// cached is left out: a run that builds nothing starts quietly.
pub async fn prepare(provider: &dyn Provider, cancel: &CancellationToken, verbose: bool) -> Result<(), SetupError> {
    let (log, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    let printer = tokio::spawn(async move {
        while let Some(line) = lines.recv().await {
            if verbose || !crate::image::is_cache_hit(&line) {
                errln!("{line}");
            }
        }
    });
    let r = tokio::select! {
        r = provider.prepare(log) => r.map_err(|error| SetupError::Prepare { provider: provider.name().into(), error }),
        _ = cancel.cancelled() => Err(SetupError::Interrupted),
    };
    let _ = printer.await;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider the run's environment does not allow is refused by kind, naming it and why.
    #[test]
    fn a_provider_that_cannot_be_made_says_which_and_why() {
        let env = BTreeMap::from([("OPEN_SANDBOX_PROTOCOL".to_string(), "ftp".to_string())]);
        let Err(e) = make(ProviderKind::Opensandbox, "auto", &env) else { panic!("made with protocol ftp") };
        assert!(matches!(e, SetupError::Make { provider: "opensandbox", .. }), "{e:?}");
        assert_eq!(e.to_string(), "opensandbox provider: OPEN_SANDBOX_PROTOCOL must be http or https, not \"ftp\"");
    }

    /// The names list and the enum say the same (flags parse the enum; validation and the
    /// schema read the list).
    #[test]
    fn names_match_the_kinds() {
        let names: Vec<&str> = ProviderKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(names, NAMES);
        for k in ProviderKind::ALL {
            let parsed = <ProviderKind as clap::ValueEnum>::from_str(k.name(), false).unwrap();
            assert_eq!(parsed, k);
        }
    }
}

//! What every command shares: the one tokio runtime, stdout, and the provider.

use std::collections::BTreeMap;
use std::future::Future;

use crate::exit::Exit;
use crate::provider::factory::{self, ProviderKind};
use crate::{errln, out};

/// The one tokio runtime a command runs on, driven to `work`'s end.
/// Once the runtime is gone (with it the tasks that still held a provider), waits for the
/// cleanups the local provider's drops handed off, so the exit that follows leaves no cgroup
/// or state directory behind.
pub fn block_on<F: Future>(work: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime starts");
    let out = rt.block_on(work);
    drop(rt);
    crate::provider::local::wait_for_cleanups(std::time::Duration::from_secs(10));
    out
}

/// The provider `kind` for a command ([`factory::make`]). A local one also sweeps what
/// SIGKILLed `serve`s left of their uploads and builds, as the provider sweeps what SIGKILLed
/// runs left of their sandboxes (here, not in the factory: providers know nothing of `serve`).
pub(super) fn make_provider(
    kind: ProviderKind,
    isolation: &str,
    env: &BTreeMap<String, String>,
) -> Result<std::sync::Arc<dyn crate::provider::Provider>, factory::SetupError> {
    let provider = factory::make(kind, isolation, env)?;
    if kind == ProviderKind::Local {
        crate::server::sweep_stale_work_dirs();
    }
    Ok(provider)
}

/// "X needs KEY, …" when the environment lacks a credential `provider` requires: what
/// `bench` and `compat` say before they run anything (a run instead skips each scenario).
pub(super) fn unmet_credentials(
    provider: &dyn crate::provider::Provider,
    env: &BTreeMap<String, String>,
) -> Option<String> {
    let missing: Vec<String> =
        provider.required_credentials().into_iter().filter(|k| env.get(k).is_none_or(|v| v.is_empty())).collect();
    (!missing.is_empty()).then(|| format!("{} needs {}", provider.name(), missing.join(", ")))
}

/// Write a command's whole output to stdout: exit 0, also when the reader has gone.
pub(super) fn emit(text: &str) -> Exit {
    match out::stdout(text) {
        Ok(()) => Exit::Ok,
        Err(e) => {
            errln!("error: cannot write to standard output: {e}");
            Exit::Failed
        }
    }
}

/// `1 scenario`, `2 scenarios`.
pub(super) fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

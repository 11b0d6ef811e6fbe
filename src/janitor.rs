//! The janitor: find and delete sandboxes that runs left behind.
//!
//! Every sandbox scenario-run creates carries the metadata tag `e2e=<run id>`. The janitor
//! lists sandboxes on a provider and keeps only tagged ones (the given run id, or any run id
//! with `--all-tagged`), optionally only those older than a duration; it never touches a
//! sandbox without the tag. It is a dry run unless told `--yes`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::mask::Masker;
use crate::provider::{Provider, SandboxInfo};
use crate::{errln, outln};

pub const TAG: &str = "e2e";

#[derive(Debug, Clone)]
pub struct Selection {
    /// Only this run's sandboxes; `None` with `all_tagged` means any run.
    pub run_id: Option<String>,
    pub all_tagged: bool,
    pub older_than: Option<Duration>,
}

/// Why the janitor found nothing to show.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// Neither a run id nor `--all-tagged`: the janitor never guesses.
    #[error("say which sandboxes: --run-id ID or --all-tagged")]
    NoSelection,
    #[error("cannot list sandboxes on {provider}: {source}")]
    List { provider: String, source: crate::provider::ProviderError },
}

/// Tagged sandboxes that match the selection, oldest first.
pub async fn find(provider: &dyn Provider, sel: &Selection, now_secs: u64) -> Result<Vec<SandboxInfo>, FindError> {
    let mut filter = BTreeMap::new();
    if let Some(id) = &sel.run_id {
        filter.insert(TAG.to_string(), id.clone());
    } else if !sel.all_tagged {
        return Err(FindError::NoSelection);
    }
    let mut found: Vec<SandboxInfo> = provider
        .list(&filter)
        .await
        .map_err(|source| FindError::List { provider: provider.name().to_string(), source })?
        .into_iter()
        // The provider's filter is not trusted alone: the tag must really be there.
        .filter(|s| match &sel.run_id {
            Some(id) => s.metadata.get(TAG) == Some(id),
            None => s.metadata.get(TAG).is_some_and(|v| !v.is_empty()),
        })
        .filter(|s| sel.older_than.is_none_or(|age| now_secs.saturating_sub(s.started_at) >= age.as_secs()))
        .collect();
    found.sort_by_key(|s| (s.started_at, s.id.clone()));
    Ok(found)
}

/// Delete them; returns the ids that could not be deleted, with why.
pub async fn delete(provider: &dyn Provider, sandboxes: &[SandboxInfo]) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for s in sandboxes {
        match tokio::time::timeout(Duration::from_secs(60), provider.kill(&s.id)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => failed.push((s.id.clone(), e.to_string())),
            Err(_) => failed.push((s.id.clone(), "timed out".into())),
        }
    }
    failed
}

/// `scenario-run cleanup`: print what the selection finds (masked), and delete it when `yes`.
/// `Err` when listing failed or a sandbox could not be deleted (each is printed).
pub async fn clean(
    provider: &dyn Provider,
    sel: &Selection,
    yes: bool,
    masker: &Masker,
    now_secs: u64,
) -> Result<(), ()> {
    let found = match find(provider, sel, now_secs).await {
        Ok(f) => f,
        Err(e) => {
            errln!("error: {}", masker.mask(&e.to_string()));
            return Err(());
        }
    };
    for s in &found {
        outln!("{}", masker.mask(&describe(s, now_secs)));
    }
    if !yes {
        outln!("{} sandbox(es) would be deleted; run again with --yes to delete them", found.len());
        return Ok(());
    }
    let failed = delete(provider, &found).await;
    for (id, why) in &failed {
        errln!("error: could not delete {id}: {}", masker.mask(why));
    }
    outln!("deleted {} sandbox(es)", found.len() - failed.len());
    if failed.is_empty() {
        Ok(())
    } else {
        Err(())
    }
}

/// One line per sandbox: id, run tag, age, template.
pub fn describe(s: &SandboxInfo, now_secs: u64) -> String {
    let age = crate::duration::human(Duration::from_secs(now_secs.saturating_sub(s.started_at)));
    format!("{}  e2e={}  age {}  template {}", s.id, s.metadata.get(TAG).map_or("", String::as_str), age, s.template)
}

//! After a `--keep-on-failure` run: say which sandboxes were kept, how to reach them and how
//! they end; and on the local provider, whose sandboxes die with this process, hold them.
//!
//! A kept sandbox keeps its run's tag (`e2e=<run id>`), so the janitor still finds it:
//! `scenario-run cleanup --run-id <id> --yes` removes it, and nothing else (the run's own
//! end-of-run sweep passes it by, as it passes `create { keep: true }` by). Its timeout is
//! [`KEPT_TTL`]: one nobody comes back to ends by itself.
//!
//! On local the run stays up after its summary and reports, serving `scenario-run shell` for
//! each kept sandbox on a Unix socket (`cli::shell`), until Ctrl-C, until every kept sandbox
//! is gone (`shell <id> -- kill 1` does not count: pid 1 is out of reach; the timeout does),
//! or until [`KEPT_TTL`]; then it kills them and exits with the run's own code.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::shell;
use crate::mask::Masker;
use crate::provider::factory::{self, ProviderKind};
use crate::provider::Provider;
use crate::results::RunSummary;
use crate::runner::KEPT_TTL;
use crate::{errln, outln};

/// Prints what was kept; on local holds it (see the module). Returns when the kept sandboxes
/// may go (they are then killed) or, on a remote provider, at once.
pub(super) async fn after_run(
    provider: Arc<dyn Provider>,
    kind: ProviderKind,
    summary: &RunSummary,
    env: &BTreeMap<String, String>,
    isolation: &str,
    masker: &Masker,
    cancel: CancellationToken,
) {
    let kept: Vec<(&str, String, &str)> = summary
        .results
        .iter()
        .flat_map(|r| r.kept_sandboxes.iter().map(move |id| (r.name.as_str(), r.location.to_string(), id.as_str())))
        .collect();
    let local = kind == ProviderKind::Local;
    if !kept.is_empty() && (summary.interrupted || cancel.is_cancelled()) {
        // Ctrl-C cleans everything, also what a scenario that failed before it had kept.
        let killed = kill_all(provider.as_ref(), kept.iter().map(|k| k.2)).await;
        errln!("scenario-run: interrupted: killed {killed} sandbox(es) --keep-on-failure had kept");
        if local {
            release_local(provider.as_ref(), &summary.run_id).await;
        }
        return;
    }
    if kept.is_empty() {
        if local {
            release_local(provider.as_ref(), &summary.run_id).await;
        }
        return;
    }
    let p = kind.name();
    let ttl = format!("{}m", KEPT_TTL.as_secs() / 60);
    let mut text = format!(
        "\nkept {} of failing scenarios (--keep-on-failure), each for {ttl} at most:\n",
        if kept.len() == 1 { "1 sandbox".to_string() } else { format!("{} sandboxes", kept.len()) }
    );
    for (name, at, id) in &kept {
        text.push_str(&format!(
            "  {p} sandbox {id}  `{name}` ({at})\n    reach it:     scenario-run shell {id} --provider {p}\n    one command:  scenario-run shell {id} --provider {p} -- CMD\n"
        ));
    }
    if local {
        text.push_str(&format!(
            "local sandboxes live only as long as this run: it waits here until Ctrl-C, which kills them (or until {ttl} have passed)\n"
        ));
    } else {
        text.push_str(&format!(
            "kill them: scenario-run cleanup --provider {p} --run-id {} --yes   (or they end by themselves after {ttl})\n",
            summary.run_id
        ));
    }
    if !local {
        outln!("{}", masker.mask(text.trim_end()));
        return;
    }
    let dir = factory::local_options(factory::isolation(isolation), env).state_dir;
    let mut sockets = Vec::new();
    let mut servers = Vec::new();
    for (_, _, id) in &kept {
        // Only the user who ran it (root, for namespaces) may type into its sandboxes: the
        // socket is made inside a directory of its own, 0700 from its creation, so there is
        // no moment at which another user could connect (a chmod after bind leaves one).
        let (private, path) = (shell::socket_dir(&dir, id), shell::socket_path(&dir, id));
        let _ = std::fs::remove_dir_all(&private); // trusted: the state directory is the tool's own
                                                   // Marked as this process's, so a later run's sweep of the state directory leaves it
                                                   // while this run waits, and takes it once this run is gone.
        let made = std::fs::DirBuilder::new().mode(0o700).create(&private).and_then(|()| crate::owner::mark(&private));
        let listener = match made.and_then(|()| tokio::net::UnixListener::bind(&path)) {
            Ok(l) => l,
            Err(e) => {
                errln!("warning: cannot offer `scenario-run shell {id}` ({}): {e}", path.display());
                continue;
            }
        };
        let _ = std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600));
        sockets.push(private);
        let (provider, id) = (provider.clone(), id.to_string());
        servers.push(tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(shell::serve_connection(provider.clone(), id.clone(), stream));
            }
        }));
    }
    // Said once the way in is open: a `shell` started on reading this finds the socket.
    outln!("{}", masker.mask(text.trim_end()));
    let gone = async {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let mut alive = 0;
            for (_, _, id) in &kept {
                alive += usize::from(provider.info(id).await.is_ok());
            }
            if alive == 0 {
                break;
            }
        }
    };
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = tokio::time::sleep(KEPT_TTL) => {}
        _ = gone => {}
    }
    for s in servers {
        s.abort();
    }
    for private in &sockets {
        let _ = std::fs::remove_dir_all(private);
    }
    let killed = kill_all(provider.as_ref(), kept.iter().map(|k| k.2)).await;
    errln!("scenario-run: killed {killed} kept sandbox(es)");
    release_local(provider.as_ref(), &summary.run_id).await;
}

/// Kills `ids`; returns how many were there to kill.
async fn kill_all<'a>(provider: &dyn Provider, ids: impl Iterator<Item = &'a str>) -> usize {
    let mut killed = 0;
    for id in ids {
        if matches!(tokio::time::timeout(Duration::from_secs(60), provider.kill(id)).await, Ok(Ok(true))) {
            killed += 1;
        }
    }
    killed
}

/// A local sandbox the run's end passed by because it was kept (`--keep-on-failure`, or
/// `create { keep: true }`, which cannot outlive the run on local) is killed in order here,
/// as the run's end did before local sandboxes could be kept.
async fn release_local(provider: &dyn Provider, run_id: &str) {
    let tag: BTreeMap<String, String> = [(crate::janitor::TAG.to_string(), run_id.to_string())].into();
    let Ok(left) = provider.list(&tag).await else { return };
    for sb in left {
        let _ = tokio::time::timeout(Duration::from_secs(60), provider.kill(&sb.id)).await;
    }
}

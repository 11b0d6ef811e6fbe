//! The small commands: `steps`, `schema`, `image`, `cleanup` and `matrix`.

use std::path::Path;
use std::time::Duration;

use super::wiring::{block_on, emit, make_provider};
use crate::exit::Exit;
use crate::image::{ImageStore, RegistryAuth};
use crate::mask::Masker;
use crate::provider::factory::ProviderKind;
use crate::{config, errln, janitor, model, outln, runner, schema};

/// `steps [KIND]`: the reference of every step kind, or of one.
pub fn steps(kind: Option<&str>) -> Exit {
    match schema::steps_reference(kind) {
        Ok(text) => emit(&text),
        Err(e) => {
            errln!("error: {e}");
            Exit::Usage
        }
    }
}

/// `schema`: write the JSON Schema to `out` (`-`: stdout), or with `check` only compare.
pub fn write_schema(out: &str, check: bool) -> Exit {
    let text = schema::schema_text();
    if out == "-" {
        return emit(&text);
    }
    if check {
        return match std::fs::read_to_string(out) {
            Ok(existing) if existing == text => Exit::Ok,
            _ => {
                errln!("error: {out} is stale: run `scenario-run schema`");
                Exit::Failed
            }
        };
    }
    if let Some(dir) = Path::new(out).parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(out, text) {
        Ok(()) => {
            errln!("wrote {out}");
            Exit::Ok
        }
        Err(e) => {
            errln!("error: cannot write {out}: {e}");
            Exit::Usage
        }
    }
}

/// `image REF`: the root filesystem of an image, built or pulled on first use.
pub fn image(reference: &str, username: Option<String>, password: Option<String>) -> Exit {
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let store = ImageStore::from_vars(&env);
    let auth = match (username, password) {
        (Some(username), Some(password)) => Some(RegistryAuth { username, password }),
        _ => None,
    };
    block_on(async move {
        let (log, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
        let printer = tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                errln!("{line}");
            }
        });
        let got = store.get(reference, auth.as_ref(), &log).await;
        drop(log);
        let _ = printer.await;
        match got {
            Ok(rootfs) => {
                outln!("{}", rootfs.dir.display());
                errln!("{} ({}, {})", rootfs.reference, rootfs.resolved, rootfs.digest);
                Exit::Ok
            }
            Err(e) => {
                errln!("error: {e}");
                Exit::Infra
            }
        }
    })
}

/// `cache` (`prune`): the local provider's builds kept by content (`layer_cache`).
pub fn cache(prune: bool) -> Exit {
    use crate::provider::local::{layer_cache, LocalOptions};
    let state = LocalOptions::default_state_dir();
    let max = match layer_cache::max_from_env() {
        Ok(m) => m,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    let ago = |t: std::time::SystemTime| {
        let secs = t.elapsed().map_or(0, |d| d.as_secs());
        crate::report::format::duration(secs.saturating_mul(1000)) + " ago"
    };
    if prune {
        let gone = layer_cache::prune(&state);
        let bytes: u64 = gone.iter().map(|e| e.bytes).sum();
        for e in &gone {
            outln!("removed {} ({}, {})", e.name, e.digest, crate::size::human(e.bytes));
        }
        let held = layer_cache::list(&state).len();
        outln!(
            "{} cached build(s) removed, {} freed{}",
            gone.len(),
            crate::size::human(bytes),
            if held > 0 { format!("; {held} held by a run or serve now, left") } else { String::new() }
        );
        return Exit::Ok;
    }
    let entries = layer_cache::list(&state);
    let w = entries.iter().map(|e| e.name.chars().count()).max().unwrap_or(4).max(4);
    if !entries.is_empty() {
        outln!("{:<w$}  {:<19}  {:>10}  LAST USED", "NAME", "DIGEST", "SIZE");
    }
    for e in entries.iter().rev() {
        let digest: String = e.digest.chars().take(19).collect();
        let held = if e.held { "  (in use)" } else { "" };
        outln!("{:<w$}  {digest:<19}  {:>10}  {}{held}", e.name, crate::size::human(e.bytes), ago(e.used));
    }
    let total: u64 = entries.iter().map(|e| e.bytes).sum();
    outln!(
        "{} cached build(s), {} of {} ({}; {} turns the cache off) in {}",
        entries.len(),
        crate::size::human(total),
        crate::size::human(max),
        layer_cache::MAX_VAR,
        "0",
        layer_cache::dir(&state).display()
    );
    Exit::Ok
}

/// `cleanup`: the janitor over the sandboxes runs left behind (a dry run unless `yes`).
pub fn cleanup(
    provider: ProviderKind,
    run_id: Option<String>,
    all_tagged: bool,
    older_than: Option<Duration>,
    yes: bool,
    env_files: &[String],
) -> Exit {
    let env = match config::environment(Path::new(".env"), env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    let run_id = run_id.filter(|r| !r.is_empty());
    if run_id.is_none() && !all_tagged {
        errln!("error: say which sandboxes: --run-id ID (or E2E_RUN_ID), or --all-tagged");
        return Exit::Usage;
    }
    let masker = Masker::from_env(&env, &[]);
    block_on(async move {
        let p = match make_provider(provider, "auto", &env) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: {e}");
                return Exit::Infra;
            }
        };
        let missing = p.required_credentials();
        if !missing.is_empty() {
            errln!("error: missing credentials [{}]", missing.join(", "));
            return Exit::Infra;
        }
        if p.name() == "local" {
            outln!("local sandboxes die with the run that made them (even on SIGKILL): nothing to clean up");
            return Exit::Ok;
        }
        let sel = janitor::Selection { run_id, all_tagged, older_than };
        match janitor::clean(p.as_ref(), &sel, yes, &masker, runner::now_ms() / 1000).await {
            Ok(()) => Exit::Ok,
            Err(()) => Exit::Infra,
        }
    })
}

/// `matrix`: the CI matrix, one entry per folder under `root` that holds scenario files.
pub fn matrix(format: &str, root: &str, providers: &[String]) -> Exit {
    let folders = match model::areas::folders(root) {
        Ok(f) => f,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    if format == "lines" {
        let text: String = folders.iter().map(|f| format!("{f}\n")).collect();
        emit(&text)
    } else {
        emit(&format!("{}\n", model::areas::github_matrix(&folders, providers)))
    }
}

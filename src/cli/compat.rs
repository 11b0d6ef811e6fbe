//! `scenario-run compat`: how "E2B-compatible" (or OpenSandbox-compatible) a platform is,
//! measured (issue 38 item 5).
//!
//! Each probe is an ordinary scenario in `compat/` that proves one feature the platforms'
//! clients use: a lifecycle call, a command path, a file operation, a port, an egress policy,
//! the code interpreter, a build, an API route of a given version. The probes run as a run
//! does (the same provider set-up, masking, timeouts and cleanup; the run's view goes to
//! stderr), and each outcome becomes a cell of the table on stdout:
//!
//! * `yes`: the probe passed;
//! * `no`: the provider says it lacks a capability the probe needs (skipped by `requires`);
//! * `fails`: the probe ran and failed, with the step and the reason (a platform that claims a
//!   feature and breaks it, or answers a route it does not have);
//! * `error`: the probe could not be judged (the platform was unreachable, a timeout);
//! * `n/a`: the probe is for other providers (the E2B REST routes on `local`).
//!
//! The score is the share of `yes` among the probes that apply. `--json FILE` keeps every row,
//! `--html FILE` is one self-contained page. The exit is 0 when the table was made, whatever
//! it says; 4 when the provider could not be reached at all.

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::run::{self, NoScenarios, RunRequest, View};
use crate::exit::Exit;
use crate::provider::factory::ProviderKind;
use crate::report::ReportFiles;
use crate::{errln, outln};

/// What `scenario-run compat` was asked.
#[derive(Debug, Clone)]
pub struct CompatArgs {
    pub provider: ProviderKind,
    pub isolation: String,
    /// The folder of probes (`compat`).
    pub probes: String,
    pub name_expr: Option<String>,
    pub concurrency: usize,
    pub json: Option<PathBuf>,
    pub html: Option<PathBuf>,
    pub env_files: Vec<String>,
    pub verbose: bool,
}

/// A probe's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Yes,
    No,
    Fails,
    Error,
    #[serde(rename = "n/a")]
    NotApplicable,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Yes => "yes",
            Status::No => "no",
            Status::Fails => "fails",
            Status::Error => "error",
            Status::NotApplicable => "n/a",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub area: String,
    pub feature: String,
    pub status: Status,
    /// Why, when it is not `yes`: the capability lacked, or the failing step and its message.
    pub detail: String,
    pub file: String,
    pub duration_ms: u64,
}

/// The rows a run's JSON report (its versioned schema, `report::json`) makes, in file order.
pub fn rows(report: &Value) -> Vec<Row> {
    let mut rows: Vec<Row> = report["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let name = r["name"].as_str().unwrap_or_default();
            let (area, feature) = name.split_once(": ").unwrap_or(("other", name));
            let reason = r["reason"].as_str().unwrap_or_default();
            let failure = || {
                let f = &r["failure"];
                let msg = f["message"].as_str().unwrap_or(reason);
                let first = msg.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim();
                let first: String = first.chars().take(160).collect();
                match f["step"].as_str() {
                    Some(step) if !step.is_empty() => format!("{step}: {first}"),
                    _ => first,
                }
            };
            // A step the provider refused as unsupported is a feature it says it lacks, as a
            // capability it does not declare is.
            let refused = r["steps"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["error_kind"] == "unsupported" && s["continued"] != true && s["status"] == "error");
            let (status, detail) = match r["outcome"].as_str().unwrap_or_default() {
                "passed" | "xpass" => (Status::Yes, String::new()),
                "skipped" if reason.contains(" lacks capability [") => (Status::No, reason.to_string()),
                "skipped" if reason.starts_with("requires provider") => (Status::NotApplicable, reason.to_string()),
                "skipped" => (Status::Error, reason.to_string()),
                "failed" | "xfail" => (Status::Fails, failure()),
                _ if refused => (Status::No, failure()),
                _ => (Status::Error, failure()),
            };
            Row {
                area: area.to_string(),
                feature: feature.to_string(),
                status,
                detail,
                file: r["location"]["file"].as_str().unwrap_or_default().to_string(),
                duration_ms: r["duration_ms"].as_u64().unwrap_or(0),
            }
        })
        .collect();
    let rank = |area: &str| AREAS.iter().position(|a| *a == area).unwrap_or(AREAS.len());
    rows.sort_by(|a, b| (rank(&a.area), &a.file).cmp(&(rank(&b.area), &b.file)));
    rows
}

/// The order of the table's areas (a probe of another area comes last).
const AREAS: &[&str] = &["lifecycle", "commands", "files", "network", "code interpreter", "templates", "api"];

/// `yes` among the probes that apply to this provider.
pub fn score(rows: &[Row]) -> (usize, usize) {
    let applies = rows.iter().filter(|r| r.status != Status::NotApplicable).count();
    (rows.iter().filter(|r| r.status == Status::Yes).count(), applies)
}

/// The table for the terminal (and, as it is Markdown, for README).
pub fn table(provider: &str, rows: &[Row]) -> String {
    let (yes, applies) = score(rows);
    let mut t = format!("compatibility of {provider}: {yes} of {applies} probes supported\n\n");
    t.push_str("| area | feature | supported | detail |\n|---|---|---|---|\n");
    for r in rows {
        let detail = r.detail.replace('|', "\\|");
        t.push_str(&format!("| {} | {} | {} | {} |\n", r.area, r.feature, r.status.word(), detail));
    }
    t
}

/// One self-contained page: the score and the table, cells coloured by verdict.
pub fn html(provider: &str, rows: &[Row]) -> String {
    use crate::report::html::esc;
    let (yes, applies) = score(rows);
    let mut body = String::new();
    for r in rows {
        body.push_str(&format!(
            "<tr class=\"{cls}\"><td>{}</td><td>{}</td><td class=\"v\">{}</td><td>{}</td><td><code>{}</code></td></tr>\n",
            esc(&r.area),
            esc(&r.feature),
            esc(r.status.word()),
            esc(&r.detail),
            esc(&r.file),
            cls = match r.status {
                Status::Yes => "yes",
                Status::No => "no",
                Status::Fails => "fails",
                Status::Error => "error",
                Status::NotApplicable => "na",
            }
        ));
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>compatibility of {p}</title>\n<style>\
body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}\
tr.yes .v{{background:#d4f7d4}}tr.no .v{{background:#eee}}tr.fails .v{{background:#f9d0d0}}tr.error .v{{background:#f9e7b0}}tr.na{{color:#888}}\
</style></head><body>\n<h1>compatibility of {p}</h1>\n<p class=\"score\">{yes} of {applies} probes supported</p>\n\
<table><thead><tr><th>area</th><th>feature</th><th>supported</th><th>detail</th><th>probe</th></tr></thead><tbody>\n{body}</tbody></table>\n</body></html>\n",
        p = esc(provider)
    )
}

/// `scenario-run compat`.
pub fn compat(a: CompatArgs) -> Exit {
    if !std::path::Path::new(&a.probes).is_dir() {
        errln!("error: no folder of probes at {} (run from the repository's root, or pass --probes DIR)", a.probes);
        return Exit::Usage;
    }
    // The run's JSON report, in a directory of this process's own (0700, a name no one can
    // guess): no other local user can put a link where it is written.
    let dir = std::env::temp_dir().join(format!("scenario-run-compat-{}", crate::random::hex(12)));
    if let Err(e) = std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&dir) {
        errln!("error: cannot make a temporary directory for the report: {e}");
        return Exit::Infra;
    }
    let report = dir.join("probes.json");
    let exit = probe(&a, &report);
    let _ = std::fs::remove_dir_all(&dir);
    exit
}

fn probe(a: &CompatArgs, report: &std::path::Path) -> Exit {
    // Without its key every probe would be skipped: said once, before anything runs.
    match crate::config::environment(std::path::Path::new(".env"), &a.env_files).map_err(|e| e.to_string()).and_then(
        |env| Ok((super::wiring::make_provider(a.provider, &a.isolation, &env).map_err(|e| e.to_string())?, env)),
    ) {
        Ok((p, env)) => {
            if let Some(why) = super::wiring::unmet_credentials(p.as_ref(), &env) {
                errln!("error: {why}");
                return Exit::Usage;
            }
        }
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    }
    errln!(
        "compat: probing {} with the scenarios in {}/ (a probe that fails is a feature the platform lacks)",
        a.provider.name(),
        a.probes
    );
    let exit = run::run(RunRequest {
        paths: vec![a.probes.clone()],
        vars: Vec::new(),
        env_files: a.env_files.clone(),
        name_expr: a.name_expr.clone(),
        tags: None,
        shard: None,
        list: false,
        no_scenarios: NoScenarios::Fail,
        provider: a.provider,
        isolation: a.isolation.clone(),
        concurrency: a.concurrency.max(1),
        fail_fast: false,
        require_credentials: false,
        fail_on_skip: false,
        keep_on_failure: false,
        rerun: None,
        // The run's own defaults (`scenario-run run --help`).
        step_timeout: Duration::from_secs(120),
        scenario_timeout: Duration::from_secs(600),
        exec_timeout: Duration::from_secs(60),
        max_output: 64 << 20,
        sandbox_ttl: Duration::from_secs(300),
        grace_period: Duration::from_secs(30),
        reports: ReportFiles { json: Some(report.to_path_buf()), ..Default::default() },
        view: View { no_progress: true, verbose: a.verbose, color: "never".into(), to_stderr: true },
        record_last_run: false,
    });
    // Failed and refused probes are the table's data; a run that did not happen makes none.
    if matches!(exit, Exit::Usage | Exit::Invalid | Exit::Interrupted) || !report.exists() {
        errln!("error: the probes could not run on {} (exit {}); no table", a.provider.name(), exit.code());
        return exit;
    }
    let text = std::fs::read_to_string(report).unwrap_or_default();
    let parsed: Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => {
            errln!("error: the probes' report is unreadable: {e}");
            return Exit::Infra;
        }
    };
    let rows = rows(&parsed);
    let provider = a.provider.name();
    outln!("{}", table(provider, &rows).trim_end());
    let (yes, applies) = score(&rows);
    let doc = serde_json::json!({
        "provider": provider,
        "version": env!("CARGO_PKG_VERSION"),
        "supported": yes,
        "applies": applies,
        "rows": rows,
    });
    let mut exit = Exit::Ok;
    if let Some(path) = &a.json {
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n") {
            errln!("error: cannot write {}: {e}", path.display());
            exit = Exit::Infra;
        }
    }
    if let Some(path) = &a.html {
        if let Err(e) = std::fs::write(path, html(provider, &rows)) {
            errln!("error: cannot write {}: {e}", path.display());
            exit = Exit::Infra;
        }
    }
    exit
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_outcome_becomes_its_verdict_and_the_score_counts_only_what_applies() {
        let report = json!({ "results": [
            { "name": "files: text", "location": { "file": "compat/b.yaml" }, "outcome": "passed", "reason": null, "failure": null, "duration_ms": 5 },
            { "name": "lifecycle: pause", "location": { "file": "compat/a.yaml" }, "outcome": "skipped",
              "reason": "provider docker lacks capability [pause]", "failure": null },
            { "name": "api: POST /v2/sandboxes", "location": { "file": "compat/c.yaml" }, "outcome": "skipped",
              "reason": "requires provider e2b or alicloud (running on local)", "failure": null },
            { "name": "network: deny", "location": { "file": "compat/d.yaml" }, "outcome": "failed", "reason": null,
              "failure": { "step": "steps[3] exec", "message": "\nexpected exit 7, got 0\nmore" } },
            { "name": "templates: build", "location": { "file": "compat/e.yaml" }, "outcome": "error", "reason": null,
              "failure": { "step": "", "message": "provider unreachable" },
              "steps": [{ "status": "error", "error_kind": "infra", "continued": false }] },
            { "name": "network: egress", "location": { "file": "compat/f.yaml" }, "outcome": "error", "reason": null,
              "failure": { "step": "create: base", "message": "network allow lists: not supported" },
              "steps": [{ "status": "passed" }, { "status": "error", "error_kind": "unsupported", "continued": false }] },
        ]});
        let r = rows(&report);
        let verdicts: Vec<(&str, Status, &str)> =
            r.iter().map(|r| (r.feature.as_str(), r.status, r.detail.as_str())).collect();
        assert_eq!(
            verdicts,
            [
                ("pause", Status::No, "provider docker lacks capability [pause]"),
                ("text", Status::Yes, ""),
                ("deny", Status::Fails, "steps[3] exec: expected exit 7, got 0"),
                ("egress", Status::No, "create: base: network allow lists: not supported"),
                ("build", Status::Error, "provider unreachable"),
                ("POST /v2/sandboxes", Status::NotApplicable, "requires provider e2b or alicloud (running on local)"),
            ]
        );
        assert_eq!(score(&r), (1, 5));
        let t = table("docker", &r);
        assert!(t.starts_with("compatibility of docker: 1 of 5 probes supported"), "{t}");
        assert!(t.contains("| network | deny | fails | steps[3] exec: expected exit 7, got 0 |"), "{t}");
        let h = html("docker", &r);
        assert!(h.contains("<tr class=\"fails\"><td>network</td>") && h.contains("1 of 5 probes supported"), "{h}");
        assert!(!html("<x>", &[]).contains("<x>"), "the provider's name is escaped");
    }
}

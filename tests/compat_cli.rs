//! Issue 38 item 5: `scenario-run compat` runs the probe scenarios of `compat/` on a provider
//! and prints what it supports: `yes` for a probe that passed, `no` for a capability the
//! provider says it lacks (or refuses as unsupported), `fails` for a probe that ran and failed,
//! `n/a` for another provider's probes, with the score, JSON and an HTML page. Checked on the
//! local provider and over `serve` with each protocol, against a provider set up to lack a
//! capability, and against probes that fail.

mod common;

use common::serve::*;
use common::*;
use serde_json::Value;

/// `scenario-run compat ARGS --json FILE --html FILE` with `env`: the process, the JSON, the page.
fn compat(args: &[&str], env: &[(&str, String)], dir: &std::path::Path) -> (std::process::Output, Value, String) {
    let (json, html) = (dir.join("compat.json"), dir.join("compat.html"));
    let mut all = vec!["compat", "--json", json.to_str().unwrap(), "--html", html.to_str().unwrap()];
    all.extend_from_slice(args);
    let mut c = cmd(&all);
    for k in ["E2B_API_KEY", "E2B_API_URL", "E2B_DOMAIN", "E2B_SANDBOX_URL", "OPEN_SANDBOX_API_KEY", "E2E_RUN_TAG"] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let doc = std::fs::read_to_string(&json).map(|t| serde_json::from_str(&t).unwrap()).unwrap_or_default();
    (out, doc, std::fs::read_to_string(&html).unwrap_or_default())
}

/// Each row's feature and verdict.
fn verdicts(doc: &Value) -> Vec<(String, String, String)> {
    doc["rows"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|r| {
            (
                format!("{}: {}", r["area"].as_str().unwrap(), r["feature"].as_str().unwrap()),
                r["status"].as_str().unwrap().to_string(),
                r["detail"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn probe_files() -> usize {
    std::fs::read_dir(root().join("compat"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "yaml"))
        .count()
}

#[test]
fn the_local_provider_supports_every_probe_and_the_api_routes_are_not_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    // The code interpreter and a build are the slow probes: the library's own scenarios and
    // the serve test below cover them.
    let (out, doc, html) = compat(&["-k", "not interpreter and not templates"], &[], tmp.path());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rows = verdicts(&doc);
    assert_eq!(rows.len(), probe_files() - 2, "{rows:#?}");
    for (feature, status, detail) in &rows {
        let expected = if feature.starts_with("api: ") { "n/a" } else { "yes" };
        assert_eq!(status, expected, "{feature}: {detail}\n{stdout}");
    }
    let applies = rows.iter().filter(|r| r.1 != "n/a").count();
    assert!(applies >= 14, "{rows:#?}");
    assert_eq!((doc["supported"].as_u64(), doc["applies"].as_u64()), (Some(applies as u64), Some(applies as u64)));
    let head = format!("compatibility of local: {applies} of {applies} probes supported");
    assert!(stdout.starts_with(&head), "{stdout}");
    assert!(stdout.contains("| lifecycle | pause and resume | yes |"), "{stdout}");
    assert!(html.contains(&format!("{applies} of {applies} probes supported")) && html.contains("<tr class=\"yes\">"));
    // The run's view went to stderr, the table alone to stdout; the probes are not the last run.
    assert!(!stdout.contains("PASSED") && text(&out.stderr).contains("PASSED"), "{stdout}");
}

#[test]
fn a_lacking_capability_is_no_and_a_failing_probe_fails_with_its_step() {
    let tmp = tempfile::tempdir().unwrap();
    // Without namespaces two local sandboxes share the host's ports: the provider says so.
    let (out, doc, _) = compat(&["--isolation", "none", "-k", "same or connect"], &[], tmp.path());
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let rows = verdicts(&doc);
    let same_port = rows.iter().find(|r| r.0.contains("same port")).unwrap();
    assert_eq!(
        (same_port.1.as_str(), same_port.2.as_str()),
        ("no", "provider local lacks capability [isolated-ports]")
    );
    assert!(rows.iter().any(|r| r.0 == "lifecycle: connect by id" && r.1 == "yes"), "{rows:?}");
    assert!(rows.iter().any(|r| r.0 == "commands: stdin by pid from a second connection" && r.1 == "yes"), "{rows:?}");
    assert_eq!((doc["supported"].as_u64(), doc["applies"].as_u64()), (Some(2), Some(3)));

    // Probes of one's own: one that fails names its step and reason, one that errors is an error.
    let probes = tmp.path().join("probes");
    std::fs::create_dir(&probes).unwrap();
    std::fs::write(
        probes.join("a.yaml"),
        "name: 'commands: a wrong exit'\nsteps:\n  - create: base\n  - exec: { cmd: 'exit 3', exit_code: 0 }\n",
    )
    .unwrap();
    std::fs::write(
        probes.join("b.yaml"),
        "name: 'files: a wrong read'\nsteps:\n  - create: base\n  - assert-file: { path: /etc/hostname, equals: not-this }\n",
    )
    .unwrap();
    let (out, doc, html) = compat(&["--probes", probes.to_str().unwrap()], &[], tmp.path());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "a table was made: {stdout}{}", text(&out.stderr));
    let rows = verdicts(&doc);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r.1 == "fails"), "{rows:?}");
    assert!(rows[0].2.starts_with("exec: exit 3") && rows[0].2.contains('3'), "{rows:?}");
    assert!(stdout.starts_with("compatibility of local: 0 of 2 probes supported"), "{stdout}");
    assert!(html.contains("<tr class=\"fails\">"), "{html}");

    // No probes folder, no key: said at once, nothing run.
    let (out, _, _) = compat(&["--probes", "no-such-folder"], &[], tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no folder of probes at no-such-folder"));
    let (out, _, _) = compat(&["--provider", "e2b"], &[], tmp.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("e2b needs E2B_API_KEY"), "{}", text(&out.stderr));
}

#[test]
fn over_serve_each_protocol_gets_its_table() {
    let tmp = tempfile::tempdir().unwrap();
    let srv = serve();
    let url = format!("http://127.0.0.1:{}", srv.port);
    let e2b = [
        ("E2B_API_KEY", srv.key.clone()),
        ("E2B_API_URL", url.clone()),
        ("E2B_SANDBOX_URL", url.clone()),
        ("E2B_DOMAIN", format!("localhost:{}", srv.port)),
    ];
    // E2B's REST routes, both versions, and the code interpreter serve builds on first use.
    let (out, doc, _) = compat(&["--provider", "e2b", "-k", "api or interpreter or exit"], &e2b, tmp.path());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rows = verdicts(&doc);
    assert_eq!(rows.len(), 7, "{rows:#?}");
    assert!(rows.iter().all(|r| r.1 == "yes"), "{stdout}");
    assert!(rows.iter().any(|r| r.0 == "api: POST /v2/sandboxes (v2 create, SDK 2.51 and later)"), "{rows:?}");
    assert!(!stdout.contains(&srv.key) && !text(&out.stderr).contains(&srv.key), "the key leaked");

    // OpenSandbox's protocol: no pty, watches or pause through its provider (each `no`, with
    // the reason); its network policy carries E2B's internet switch.
    let os = [
        ("OPEN_SANDBOX_API_KEY", srv.key.clone()),
        ("OPEN_SANDBOX_DOMAIN", format!("127.0.0.1:{}", srv.port)),
        ("OPEN_SANDBOX_PROTOCOL", "http".to_string()),
    ];
    let (out, doc, _) =
        compat(&["--provider", "opensandbox", "-k", "pseudo or internet or stdin or api"], &os, tmp.path());
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rows = verdicts(&doc);
    let get = |f: &str| {
        let hit = rows.iter().find(|r| r.0 == f).or_else(|| rows.iter().find(|r| r.0.contains(f)));
        hit.map(|r| r.1.as_str()).unwrap_or("missing")
    };
    assert_eq!(
        (
            get("pseudo-terminal"),
            get("internet by default"),
            get("commands: stdin"),
            get("stdin by pid"),
            get("POST /v2/sandboxes (v2 create")
        ),
        ("no", "yes", "yes", "no", "n/a"),
        "{stdout}"
    );
    assert!(stdout.contains("lacks capability [pty]"), "the refusal says why: {stdout}");
    assert_eq!(live(&srv), 0, "a probe's sandbox outlived the run");
}

//! The masking canaries (issue 13): the real binary runs scenarios on the local provider with
//! secrets set, the sandbox echoes every form of them (raw, base64 plain, URL-safe, wrapped at
//! 76 columns and inside basic auth, URL-encoded as Python and minijinja do it, HTML, JSON
//! with and without `\uXXXX`, nested JSON, hex, base32, reversed, char-spaced, folded across
//! lines, on stdout and stderr, in
//! files, over HTTP, in a failing assertion, in a build log), and then every output — the
//! terminal's stdout and stderr, JUnit, the JSON report, every evidence file — is searched
//! for any of those forms, in each of the output's own decodings (JSON strings, XML text and
//! attributes) and with line breaks taken out.

mod common;

use base64::engine::general_purpose::{STANDARD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine as _;
use common::*;

/// A model-provider-like key: 64 bytes, so its base64 wraps at 76 columns.
const API_KEY: &str = "sk-canary-7Qm2Zt9Lx4Vb8Nw1Rj6Hc3Yp5Ks0Df7Ga2Ue9Io4Pl8Xz1Wq3Er5Ty";
/// Punctuation that every encoding treats differently, and non-ASCII.
const PASSWORD: &str = "c4n@ry p&ss/w\u{f6}rd<x>'q\"~+1";
/// Named under `secrets:` in the scenario, not by its variable name.
const LISTED: &str = "listed-canary-value-4321";

/// The forms the canaries print, computed here independently of the masker.
fn forms(secret: &str) -> Vec<(String, String)> {
    let b = secret.as_bytes();
    let mut out = vec![
        ("raw".into(), secret.to_string()),
        ("base64".into(), STANDARD.encode(b)),
        ("base64url".into(), URL_SAFE_NO_PAD.encode(b)),
        ("base64url-padded".into(), URL_SAFE.encode(b)),
        ("basic auth".into(), STANDARD.encode(format!("user:{secret}"))),
        ("hex".into(), b.iter().map(|x| format!("{x:02x}")).collect()),
        ("urlencoded".into(), scenario_run::net::url_encode(secret)),
        ("python quote".into(), scenario_run::net::url_encode(secret).replace("%2F", "/")),
        ("json".into(), serde_json::to_string(secret).unwrap().trim_matches('"').to_string()),
    ];
    let ascii_json: String = secret
        .chars()
        .map(|c| match c {
            '"' => "\\\"".to_string(),
            '\\' => "\\\\".to_string(),
            c if c.is_ascii() => c.to_string(),
            c => format!("\\u{:04x}", c as u32),
        })
        .collect();
    out.push(("json ascii".into(), ascii_json));
    let html: String = secret
        .chars()
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&#x27;".to_string(),
            c => c.to_string(),
        })
        .collect();
    out.push(("html".into(), html));
    // Issue 23 item 13: base32 (padded and not, upper and lower case), reversed, char-spaced.
    let b32 = base32(b);
    out.push(("base32".into(), b32.clone()));
    out.push(("base32 lower unpadded".into(), b32.trim_end_matches('=').to_lowercase()));
    out.push(("reversed".into(), secret.chars().rev().collect()));
    out.push(("char-spaced".into(), secret.chars().map(String::from).collect::<Vec<_>>().join(" ")));
    out.retain(|(_, f)| f.len() >= 4);
    out
}

/// RFC 4648 base32, padded, written here rather than taken from the masker.
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let bits: Vec<u8> = data.iter().flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1)).collect();
    let mut out: String = bits
        .chunks(5)
        .map(|c| {
            ALPHABET[c.iter().chain(std::iter::repeat(&0)).take(5).fold(0, |n, b| n << 1 | usize::from(*b))] as char
        })
        .collect();
    while !out.len().is_multiple_of(8) {
        out.push('=');
    }
    out
}

/// An output as a reader of it would see it: its text, and the strings its format decodes to.
fn views(name: &str, text: &str) -> Vec<String> {
    let mut v = vec![text.to_string()];
    if name.ends_with(".json") {
        fn walk(j: &serde_json::Value, out: &mut Vec<String>) {
            match j {
                serde_json::Value::String(s) => out.push(s.clone()),
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
                serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| {
                    out.push(k.clone());
                    walk(x, out)
                }),
                _ => {}
            }
        }
        let j: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        walk(&j, &mut v);
    }
    // The HTML report and the GitHub job summary (markdown whose cells escape HTML and `|`).
    if name.ends_with(".html") || name.ends_with(".md") {
        let decoded = text
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("\\|", "|")
            .replace("&amp;", "&");
        v.push(decoded);
    }
    if name.ends_with(".xml") {
        let doc = roxmltree::Document::parse(text).unwrap_or_else(|e| panic!("{name}: {e}"));
        for n in doc.descendants() {
            v.extend(n.text().map(str::to_string));
            v.extend(n.attributes().map(|a| a.value().to_string()));
        }
    }
    // Wrapped and folded forms: the same text with its line breaks taken out.
    let unbroken: Vec<String> =
        v.iter().map(|t| t.replace("\\r", "").replace("\\n", "").replace(['\r', '\n'], "")).collect();
    v.extend(unbroken);
    v
}

#[test]
fn no_form_of_any_secret_reaches_any_output() {
    let tmp = tempfile::tempdir().unwrap();
    let (junit, json, evidence) = (tmp.path().join("junit.xml"), tmp.path().join("run.json"), tmp.path().join("ev"));
    // Issue 18's outputs: the HTML report, and in GitHub Actions the annotations (on stdout)
    // and the job summary.
    let (html, job_summary) = (tmp.path().join("report.html"), tmp.path().join("summary.md"));
    let mut files = vec!["tests/fixtures/canaries/echo-forms.yaml", "tests/fixtures/canaries/fails-with-secrets.yaml"];
    let build = can_build();
    if build {
        files.push("tests/fixtures/canaries/build-log.yaml");
    }
    let mut args = files.clone();
    args.extend(["--no-progress", "-v", "-j", "3", "--junit", junit.to_str().unwrap()]);
    args.extend(["--json", json.to_str().unwrap(), "--evidence", evidence.to_str().unwrap()]);
    args.extend(["--html", html.to_str().unwrap()]);
    let out = cmd(&args)
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &job_summary)
        .env("CANARY_API_KEY", API_KEY)
        .env("CANARY_PASSWORD", PASSWORD)
        .env("CANARY_LISTED", LISTED)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the failing canary fails the run:\n{stdout}\n{stderr}");

    // The canaries really ran and printed their forms (so silence is not mistaken for masking).
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let outcome = |name: &str| {
        report["results"].as_array().unwrap().iter().find(|r| r["name"] == name).unwrap()["outcome"].clone()
    };
    assert_eq!(outcome("canaries echo every form"), "passed", "{stdout}");
    assert_eq!(outcome("canaries fail loudly"), "failed");
    if build {
        assert_eq!(outcome("canaries in a build log"), "passed", "{stdout}");
    }
    // Every output, and every form of every secret.
    assert!(stdout.contains("::error file=tests/fixtures/canaries/"), "annotations are there:\n{stdout}");
    let mut outputs: Vec<(String, String)> = vec![("stdout".into(), stdout), ("stderr".into(), stderr)];
    for p in [&junit, &json, &html, &job_summary] {
        outputs.push((p.file_name().unwrap().to_string_lossy().into(), std::fs::read_to_string(p).unwrap()));
    }
    let mut evidence_files = 0;
    for e in std::fs::read_dir(&evidence).unwrap() {
        let p = e.unwrap().path();
        outputs.push((p.file_name().unwrap().to_string_lossy().into(), std::fs::read_to_string(&p).unwrap()));
        evidence_files += 1;
    }
    assert!(evidence_files >= 3, "evidence files: {evidence_files}");
    let all_forms: Vec<(String, String)> = [("API key", API_KEY), ("password", PASSWORD), ("listed", LISTED)]
        .iter()
        .flat_map(|(who, s)| forms(s).into_iter().map(move |(how, f)| (format!("{who} {how}"), f)))
        .collect();
    let mut leaks = Vec::new();
    for (name, text) in &outputs {
        for view in views(name, text) {
            for (what, form) in &all_forms {
                if view.contains(form.as_str()) {
                    leaks.push(format!("{name}: {what} `{form}`"));
                }
            }
            // Any 12 characters of a secret in a row is a leak too (half-masked values).
            for (who, s) in [("API key", API_KEY), ("listed", LISTED)] {
                let chars: Vec<char> = s.chars().collect();
                for w in chars.windows(12) {
                    let piece: String = w.iter().collect();
                    if view.contains(&piece) {
                        leaks.push(format!("{name}: part of the {who}: `{piece}`"));
                        break;
                    }
                }
            }
        }
    }
    leaks.sort();
    leaks.dedup();
    println!(
        "masking canaries: {} forms of 3 secrets, {} outputs ({} evidence files){}, {} leaks",
        all_forms.len(),
        outputs.len(),
        evidence_files,
        if build { ", build log included" } else { "" },
        leaks.len()
    );
    assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
    // Each form was printed, and masked in place (line breaks kept).
    let printed = &step_outputs(&json, "exec")[0]["stdout"];
    let printed = printed.as_str().unwrap();
    for label in [
        "K raw: ***",
        "K b64: ***",
        "K mime:\n***\n***\n",
        "P quote: ***",
        "P json: \"***\"",
        "L raw: ***",
        "K b32: ***",
        "P b32_lower_unpadded: ***",
        "K reversed: ***",
        "P spaced: ***",
    ] {
        assert!(printed.contains(label), "{label:?} not in the canary's output:\n{printed}");
    }
}

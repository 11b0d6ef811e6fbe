//! Issue 18: the HTML report of a real run on the local provider, opened in a real headless
//! browser (Debian's chromium, driven by npm's playwright-core: tests/html/check.mjs). It must
//! render with no error and no network request, its filters must work, and a 1280x800
//! screenshot is kept at `target/ux-artifacts/html-report-1280x800.png` (with the report
//! beside it) for CI to upload.
//!
//! Needs `chromium` (scripts/setup installs it) and node; installs playwright-core into
//! tests/html/node_modules on first use. A machine without them fails loudly: a skip would
//! hide a broken report.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn artifacts() -> PathBuf {
    let dir = root().join("target/ux-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The most sandboxes alive at once in a JSON report, from the create and destroy steps:
/// computed here independently of the report's own timeline.
fn peak_alive(report: &serde_json::Value) -> usize {
    let t0 = report["started_at_ms"].as_u64().unwrap();
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for r in report["results"].as_array().unwrap() {
        let base = r["started_at_ms"].as_u64().unwrap() - t0;
        for s in r["steps"].as_array().unwrap() {
            let at = base + s["start_ms"].as_u64().unwrap();
            match s["kind"].as_str().unwrap() {
                "create" if s["status"] == "passed" => edges.push((at, 1)),
                "destroy" => edges.push((at + s["duration_ms"].as_u64().unwrap(), -1)),
                _ => {}
            }
        }
    }
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// PNG width and height from its IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "{} is a PNG", path.display());
    let be = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    (be(16), be(20))
}

fn playwright() -> PathBuf {
    let dir = root().join("tests/html");
    if !dir.join("node_modules/playwright-core").is_dir() {
        let ok = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&dir)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "cannot install playwright-core into tests/html (npm ci)");
    }
    dir.join("check.mjs")
}

#[test]
fn html_report_renders_filters_and_is_screenshotted_in_chromium() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: scripts/setup installs Debian's chromium for this test"
    );
    let out_dir = artifacts();
    let (html, json) = (out_dir.join("report.html"), out_dir.join("report.json"));
    let out = cmd(&[
        "tests/fixtures/html",
        "--no-progress",
        "-j",
        "2",
        "--html",
        html.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ])
    .env_remove("HTML_FIXTURE_ONLY_TOKEN")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "two fixtures fail on purpose:\n{}", text(&out.stdout));

    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let peak = peak_alive(&report);
    assert!((1..=2).contains(&peak), "-j 2 holds: at most {peak} sandboxes alive");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains(&format!(
            "at most {peak} sandbox{} alive at once</b>, limit <b>-j 2</b>",
            if peak == 1 { "" } else { "es" }
        )),
        "the page states the peak it draws"
    );
    // What the failures say, as in the terminal.
    assert!(page.contains("only a trailing newline and letter case differ"), "the hint is there");
    assert!(page.contains("<span class=\"del\">-BETA</span>"), "the diff is there");
    assert!(page.contains("started\nready\n"), "what finally printed is there");
    assert!(page.contains("html/mismatch.yaml:7</code>"), "the failing step's file:line");

    let mut by_outcome = serde_json::Map::new();
    for (k, v) in report["totals"].as_object().unwrap() {
        if k != "total" && v.as_u64().unwrap() > 0 {
            by_outcome.insert(k.clone(), v.clone());
        }
    }
    let expect = serde_json::json!({
        "total": report["totals"]["total"],
        "byOutcome": by_outcome,
        "name": "server",
        "sandboxLanes": peak,
    });
    let expect_file = out_dir.join("expect.json");
    std::fs::write(&expect_file, expect.to_string()).unwrap();
    let shot = out_dir.join("html-report-1280x800.png");
    let _ = std::fs::remove_file(&shot);
    let check = Command::new("node")
        .arg(playwright())
        .args([&html, &shot, &expect_file])
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    assert!(check.status.success(), "the browser check failed:\n{}{}", text(&check.stdout), text(&check.stderr));
    let log = text(&check.stdout);
    assert!(log.contains("ok: the \"failed\" button shows 2"), "{log}");
    assert!(log.contains("ok: a link with the fragment opens the same filtered view"), "{log}");
    // Issue 27 item 6: a legend for the timeline's colours, and the timeline follows the filters.
    assert!(log.contains("ok: the legend explains every step colour"), "{log}");
    assert!(log.contains("ok: the timeline follows the text filter"), "{log}");
    assert!(log.contains("ok: the timeline follows the \"failed\" button"), "{log}");
    assert!(log.contains("ok: and the chart shrinks to fit"), "{log}");
    assert_eq!(png_size(&shot), (1280, 800), "the screenshot is 1280x800");
}

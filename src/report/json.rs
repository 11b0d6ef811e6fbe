//! The machine-readable run report (`--report-json`), one pretty-printed JSON document.
//!
//! # Schema, version 1
//!
//! ```text
//! {
//!   "schema_version": 1,                 // bumped on any incompatible change
//!   "tool": "scenario-run",
//!   "tool_version": "0.1.0",
//!   "run_id": string,
//!   "provider": string,                  // local, docker, e2b, …
//!   "concurrency": number,
//!   "started_at_ms": number,             // Unix milliseconds
//!   "duration_ms": number,
//!   "interrupted": bool,
//!   "totals": {"total","passed","failed","error","skipped","xfail","xpass": number,
//!              "soft_failures": number,   // steps failed under continue_on_error
//!              "passed_with_soft_failures": number},  // of `passed`
//!   "exit_code": number,
//!   "provider_stats": {"created","destroyed","live","peak_live": number},
//!   "results": [                          // ordered by index
//!     {
//!       "index": number, "name": string, "description": string|null,
//!       "location": {"file": string, "line": number, "col": number},
//!       "tags": [string], "matrix": {string: string},
//!       "outcome": "passed"|"failed"|"error"|"skipped"|"xfail"|"xpass",
//!       "reason": string|null,
//!       "failure": null | {"step": string, "location": {…}, "message": string,
//!                          "mismatch": null | {"expected": string, "actual": string,
//!                                               "hint": string|null}},
//!       "known_issue": null | {"id": string|null, "reason": string, "strict": bool},
//!       "steps": [
//!         {"index": number, "phase": "setup"|"steps"|"finally"|"cleanup",
//!          "kind": string, "label": string, "id": string|null, "location": {…},
//!          "status": "passed"|"failed"|"error"|"skipped",
//!          "args": any, "outputs": any, "message": string|null,
//!          "mismatch": null | {…}, "attempts": number,
//!          "start_ms": number, "duration_ms": number, "continued": bool,
//!          "error_kind": string}          // only when failed or errored: timeout, unsupported, …
//!       ],
//!       "sandboxes": [string], "started_at_ms": number, "duration_ms": number,
//!       "interrupted": bool,
//!       "soft_failures": number           // its steps with "continued": true that failed
//!     }
//!   ]
//! }
//! ```
//!
//! Adding a field is not an incompatible change; readers must ignore fields they do not know.

use std::io::{self, Write};

use serde::Serialize;

use crate::results::RunSummary;

pub const JSON_SCHEMA_VERSION: u32 = 1;

#[derive(Serialize)]
struct Document<'a> {
    schema_version: u32,
    tool: &'static str,
    tool_version: &'static str,
    #[serde(flatten)]
    summary: &'a RunSummary,
}

/// Write the run report; results are sorted by index, and a trailing newline ends the file.
pub fn write_json(summary: &RunSummary, w: &mut impl Write) -> io::Result<()> {
    let mut sorted;
    let summary = if summary.results.windows(2).all(|p| p[0].index <= p[1].index) {
        summary
    } else {
        sorted = summary.clone();
        sorted.results.sort_by_key(|r| r.index);
        &sorted
    };
    let doc = Document {
        schema_version: JSON_SCHEMA_VERSION,
        tool: "scenario-run",
        tool_version: env!("CARGO_PKG_VERSION"),
        summary,
    };
    serde_json::to_writer_pretty(&mut *w, &doc)?;
    w.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::report::fixture;

    #[test]
    fn has_header_and_round_trips() {
        let summary = fixture::summary();
        let mut buf = Vec::new();
        write_json(&summary, &mut buf).unwrap();
        assert!(buf.ends_with(b"}\n"));
        let mut v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["schema_version"], 1);
        assert_eq!(v["tool"], "scenario-run");
        assert_eq!(v["tool_version"], env!("CARGO_PKG_VERSION"));
        // Header keys come first.
        let keys: Vec<_> = v.as_object().unwrap().keys().take(4).cloned().collect();
        assert_eq!(keys, ["schema_version", "tool", "tool_version", "run_id"]);

        let indexes: Vec<_> = v["results"].as_array().unwrap().iter().map(|r| r["index"].as_u64().unwrap()).collect();
        assert_eq!(indexes, [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(v["results"][1]["outcome"], "failed");
        assert_eq!(v["results"][1]["failure"]["mismatch"]["expected"], "hello");
        assert_eq!(v["results"][1]["steps"][1]["status"], "failed");
        assert_eq!(v["totals"]["xpass"], 1);

        // Everything else is exactly the summary's own serialisation.
        let obj = v.as_object_mut().unwrap();
        for k in ["schema_version", "tool", "tool_version"] {
            obj.remove(k);
        }
        let mut expected = summary.clone();
        expected.results.sort_by_key(|r| r.index);
        assert_eq!(v, serde_json::to_value(&expected).unwrap());
    }
}

//! One checker for step arguments: a bad value written literally (`scenario-run check`'s
//! diagnostic) and the same value arriving through a template (the run's step failure) are
//! refused with the same message, and a refused rendered value never reaches the step.
//! Real binary, real local provider (the steps here need no sandbox).

mod common;

use common::*;

/// (step kind, the step's arguments with `VALUE` where the bad value goes, the bad value as
/// YAML, the message both sides must give).
const CASES: &[(&str, &str, &str, &str)] = &[
    ("sleep", "{ duration: VALUE }", "soon", "bad duration for `duration`: invalid duration `soon`"),
    (
        "sleep",
        "{ duration: VALUE }",
        "-1",
        "bad duration for `duration`: invalid duration `-1`: it must be a number of seconds, 0 or more",
    ),
    (
        "host",
        "{ cmd: 'true', exit_code: VALUE }",
        "zero",
        "`exit_code` must be an integer from -255 to 255, found a string \"zero\"",
    ),
    // Issue 26 item 5: cast with `as i32`, 4294967296 expected exit code 0.
    (
        "host",
        "{ cmd: 'true', exit_code: VALUE }",
        "4294967296",
        "`exit_code` must be an integer from -255 to 255, found an integer 4294967296",
    ),
    ("host", "{ cmd: VALUE }", "~", "missing required field `cmd` for `host`"),
    ("host", "{ cmd: 'true', env: VALUE }", "[A, B]", "`env` must be a mapping of strings, found a list"),
    ("host", "{ cmd: 'true', env: VALUE }", "{ A: { b: 1 } }", "`env.A` must be a string, found a mapping"),
    ("host", "{ cmd: VALUE }", "{ a: b }", "`cmd` must be a string, found a mapping"),
    ("list", "{ all: VALUE }", "perhaps", "`all` must be true or false, found a string \"perhaps\""),
    ("list", "{ all: VALUE }", "3", "`all` must be true or false, found an integer 3"),
    ("http", "{ method: VALUE, url: 'http://127.0.0.1:9/' }", "'GE T'", "invalid value `GE T` for `method` of `http`"),
    (
        "http-get",
        "{ url: 'http://127.0.0.1:9/', expect: VALUE }",
        "{ bodyy: x }",
        "unknown field `bodyy` for `http-get.expect`",
    ),
    ("http-get", "{ url: 'http://127.0.0.1:9/', expect: VALUE }", "[200]", "`expect` must be a mapping, found a list"),
];

fn scenario(templated: bool) -> String {
    let mut vars = String::from("vars:\n");
    let mut steps = String::from("steps:\n");
    for (i, (kind, args, value, _)) in CASES.iter().enumerate() {
        let arg = if templated {
            vars.push_str(&format!("  v{i}: {value}\n"));
            format!("\"{{{{ vars.v{i} }}}}\"")
        } else {
            value.to_string()
        };
        steps.push_str(&format!("  - {kind}: {}\n    continue_on_error: true\n", args.replace("VALUE", &arg)));
    }
    let vars = if templated { vars } else { String::new() };
    format!("name: args {templated}\n{vars}{steps}")
}

#[test]
fn a_bad_value_gets_the_same_message_written_and_rendered() {
    let dir = tempfile::tempdir().unwrap();
    let literal = dir.path().join("literal.yaml");
    let templated = dir.path().join("templated.yaml");
    std::fs::write(&literal, scenario(false)).unwrap();
    std::fs::write(&templated, scenario(true)).unwrap();

    // Written: one diagnostic per case, in order.
    let out = run(&["check", literal.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    let diags: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("error: ")).collect();
    let want: Vec<&str> = CASES.iter().map(|c| c.3).collect();
    assert_eq!(&diags[..diags.len() - 1], &want[..], "{stderr}");

    // Rendered: `check` cannot know the values, so it passes; the run refuses each step with
    // the same message.
    let out = run(&["check", templated.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report = dir.path().join("report.json");
    let out = cmd(&["--no-progress", templated.to_str().unwrap(), "--json", report.to_str().unwrap()])
        .env_remove("SCENARIO_RUN_PROVIDER")
        .output()
        .unwrap();
    // Every step carries on (`continue_on_error`), so the scenario itself passes.
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let steps = doc["results"][0]["steps"].as_array().expect("steps in the report").clone();
    let got: Vec<(&str, &str, &str)> = steps
        .iter()
        .map(|s| (s["kind"].as_str().unwrap(), s["status"].as_str().unwrap(), s["message"].as_str().unwrap_or("")))
        .collect();
    let want: Vec<(&str, &str, &str)> = CASES.iter().map(|c| (c.0, "error", c.3)).collect();
    assert_eq!(got, want);
}

/// The step's code never sees a rendered value its field refuses: the command, which would
/// leave a file behind, is not run.
#[test]
fn a_refused_rendered_value_never_reaches_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let file = dir.path().join("s.yaml");
    std::fs::write(
        &file,
        format!(
            "name: refused\nvars:\n  code: zero\n  env: [A]\nsteps:\n  - host: {{ cmd: 'touch {m}', exit_code: \"{{{{ vars.code }}}}\" }}\n    continue_on_error: true\n  - host: {{ cmd: 'touch {m}', env: \"{{{{ vars.env }}}}\" }}\n",
            m = marker.display()
        ),
    )
    .unwrap();
    let report = dir.path().join("report.json");
    let out = cmd(&["--no-progress", file.to_str().unwrap(), "--json", report.to_str().unwrap()])
        .env_remove("SCENARIO_RUN_PROVIDER")
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    // 4: the scenario ended in an error (not a failed expectation).
    assert_eq!(out.status.code(), Some(4), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("`env` must be a mapping of strings, found a list"), "{stdout}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let messages: Vec<&str> =
        doc["results"][0]["steps"].as_array().unwrap().iter().map(|s| s["message"].as_str().unwrap_or("")).collect();
    assert_eq!(
        messages,
        [
            "`exit_code` must be an integer from -255 to 255, found a string \"zero\"",
            "`env` must be a mapping of strings, found a list"
        ]
    );
    assert!(!marker.exists(), "a step ran with an argument its field refuses");
}

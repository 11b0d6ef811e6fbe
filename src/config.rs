//! Configuration: `.env` files, the environment, `--var`, and the run id.
//!
//! Precedence, lowest to highest: `.env` in the working directory, then each `--env-file` in
//! order, then the process environment (a variable set in the shell always wins).

use std::collections::BTreeMap;
use std::path::Path;

/// Parse a dotenv file as dotenv files are read everywhere (the `dotenvy` crate): `KEY=value`,
/// optional `export `, `#` comments, single quotes (as written), double quotes (escapes such as
/// `\n`, `\"`, `\\` read left to right, values over several lines), and `$NAME`/`${NAME}`
/// expanded in unquoted and double-quoted values. A later definition of a name wins.
pub fn parse_dotenv(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in dotenvy::from_read_iter(text.as_bytes()) {
        match item {
            Ok((k, v)) => {
                out.insert(k, v);
            }
            Err(dotenvy::Error::LineParse(line, index)) => {
                // dotenvy names the line by its text: find its number for the message.
                let first = line.lines().next().unwrap_or_default();
                let number =
                    text.lines().position(|l| l == first).map_or_else(String::new, |n| format!("line {}: ", n + 1));
                return Err(format!("{number}cannot parse `{}` at character {}", first.trim(), index + 1));
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(out)
}

/// The variables the files give: `.env` in the working directory, then each `--env-file` in
/// order (a later file wins). The process environment is not included, and never written.
pub fn file_layer(cwd_env: &Path, extra: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    if cwd_env.is_file() {
        let text = std::fs::read_to_string(cwd_env).map_err(|e| format!("cannot read {}: {e}", cwd_env.display()))?;
        env.extend(parse_dotenv(&text).map_err(|e| format!("{}: {e}", cwd_env.display()))?);
    }
    for f in extra {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read --env-file {f}: {e}"))?;
        env.extend(parse_dotenv(&text).map_err(|e| format!("{f}: {e}"))?);
    }
    Ok(env)
}

/// The environment scenarios see: [`file_layer`] under the process environment.
pub fn environment(cwd_env: &Path, extra: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut env = file_layer(cwd_env, extra)?;
    env.extend(std::env::vars());
    Ok(env)
}

/// `--var k=v`; the value is parsed as YAML-ish scalar (numbers and booleans keep their type).
pub fn parse_var(s: &str) -> Result<(String, serde_json::Value), String> {
    let (k, v) = s.split_once('=').ok_or_else(|| format!("expected k=v, got `{s}`"))?;
    let value = match v {
        "true" => serde_json::Value::Bool(true),
        "false" => serde_json::Value::Bool(false),
        _ => v.parse::<i64>().map(serde_json::Value::from).unwrap_or_else(|_| serde_json::Value::String(v.to_string())),
    };
    Ok((k.trim().to_string(), value))
}

/// `E2E_RUN_ID`, or a fresh short id: lowercase, safe in metadata and host names.
pub fn run_id(env: &BTreeMap<String, String>) -> String {
    if let Some(id) = env.get("E2E_RUN_ID").filter(|v| !v.is_empty()) {
        return id.clone();
    }
    format!("sr-{}", crate::random::hex(4))
}

/// Today's date, UTC, as YYYY-MM-DD.
pub fn today() -> String {
    utc_date(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

/// The UTC date of a Unix time as YYYY-MM-DD.
pub fn utc_date(unix_secs: u64) -> String {
    let ts = i64::try_from(unix_secs).ok().and_then(|s| jiff::Timestamp::from_second(s).ok());
    ts.unwrap_or(jiff::Timestamp::MAX).strftime("%Y-%m-%d").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotenv_forms() {
        let env = parse_dotenv("# c\nA=1\nexport B = two # note\nC=\"x\\ny\"\nD='$raw'\n\n").unwrap();
        assert_eq!(env["A"], "1");
        assert_eq!(env["B"], "two");
        assert_eq!(env["C"], "x\ny");
        assert_eq!(env["D"], "$raw");
        assert!(parse_dotenv("NOEQUALS\n").unwrap_err().contains("line 1"));
    }

    /// Issue 26 item 6: `\\n` was turned into a newline before `\\\\` into a backslash, so
    /// `"C:\\\\new"` became `C:\` + newline + `ew`. Parsed as dotenv files are everywhere.
    #[test]
    fn dotenv_escapes_are_read_left_to_right() {
        let env = parse_dotenv(concat!(
            "WIN=\"C:\\\\new\"\n",
            "NL=\"a\\nb\"\n",
            "Q=\"say \\\"hi\\\"\"\n",
            "RAW='C:\\new'\n",
            "MULTI=\"one\ntwo\"\n",
        ))
        .unwrap();
        assert_eq!(env["WIN"], "C:\\new");
        assert_eq!(env["NL"], "a\nb");
        assert_eq!(env["Q"], "say \"hi\"");
        assert_eq!(env["RAW"], "C:\\new");
        assert_eq!(env["MULTI"], "one\ntwo");
        let e = parse_dotenv("A=1\nB=\"unclosed\nC=3\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn vars_keep_simple_types() {
        assert_eq!(parse_var("n=3").unwrap().1, serde_json::json!(3));
        assert_eq!(parse_var("s=a=b").unwrap(), ("s".into(), serde_json::json!("a=b")));
        assert!(parse_var("novalue").is_err());
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01");
        assert_eq!(utc_date(1_709_210_096), "2024-02-29");
        assert!(utc_date(u64::MAX).starts_with("9999-12-"), "saturates, never panics");
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10);
        assert!(t.as_str() > "2025-01-01");
    }
}

//! Configuration: `.env` files, the environment, `--var`, and the run id.
//!
//! Precedence, lowest to highest: `.env` in the working directory, then each `--env-file` in
//! order, then the process environment (a variable set in the shell always wins).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A dotenv text that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum DotenvError {
    /// A line that is not `KEY=value`; `line` is 1-based, when the text was found again.
    #[error("{}cannot parse `{text}` at character {column}", line.map_or_else(String::new, |n| format!("line {n}: ")))]
    Syntax { line: Option<usize>, text: String, column: usize },
    /// Anything else `dotenvy` refuses (a `$NAME` it cannot read).
    #[error(transparent)]
    Other(dotenvy::Error),
}

/// An env file that cannot be read or parsed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `.env` in the working directory exists but cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    ReadDotenv { path: PathBuf, source: std::io::Error },
    /// An `--env-file` cannot be read (or does not exist).
    #[error("cannot read --env-file {path}: {source}")]
    ReadEnvFile { path: String, source: std::io::Error },
    /// `file` (as written, or `.env`'s path) does not parse.
    #[error("{file}: {source}")]
    Parse { file: String, source: DotenvError },
}

/// A `--var` that is not `k=v`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected k=v, got `{0}`")]
pub struct VarError(pub String);

/// Parse a dotenv file as dotenv files are read everywhere (the `dotenvy` crate): `KEY=value`,
/// optional `export `, `#` comments, single quotes (as written), double quotes (escapes such as
/// `\n`, `\"`, `\\` read left to right, values over several lines), and `$NAME`/`${NAME}`
/// expanded in unquoted and double-quoted values. A later definition of a name wins.
pub fn parse_dotenv(text: &str) -> Result<BTreeMap<String, String>, DotenvError> {
    let mut out = BTreeMap::new();
    for item in dotenvy::from_read_iter(text.as_bytes()) {
        match item {
            Ok((k, v)) => {
                out.insert(k, v);
            }
            Err(dotenvy::Error::LineParse(line, index)) => {
                // dotenvy names the line by its text: find its number for the message.
                let first = line.lines().next().unwrap_or_default();
                let line = text.lines().position(|l| l == first).map(|n| n + 1);
                return Err(DotenvError::Syntax { line, text: first.trim().to_string(), column: index + 1 });
            }
            Err(e) => return Err(DotenvError::Other(e)),
        }
    }
    Ok(out)
}

/// The variables the files give: `.env` in the working directory, then each `--env-file` in
/// order (a later file wins). The process environment is not included, and never written.
pub fn file_layer(cwd_env: &Path, extra: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut env = BTreeMap::new();
    if cwd_env.is_file() {
        let text = std::fs::read_to_string(cwd_env)
            .map_err(|source| ConfigError::ReadDotenv { path: cwd_env.to_path_buf(), source })?;
        env.extend(
            parse_dotenv(&text).map_err(|source| ConfigError::Parse { file: cwd_env.display().to_string(), source })?,
        );
    }
    for f in extra {
        let text = std::fs::read_to_string(f).map_err(|source| ConfigError::ReadEnvFile { path: f.clone(), source })?;
        env.extend(parse_dotenv(&text).map_err(|source| ConfigError::Parse { file: f.clone(), source })?);
    }
    Ok(env)
}

/// The environment scenarios see: [`file_layer`] under the process environment.
pub fn environment(cwd_env: &Path, extra: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut env = file_layer(cwd_env, extra)?;
    env.extend(std::env::vars());
    Ok(env)
}

/// `--var k=v`; the value is parsed as YAML-ish scalar (numbers and booleans keep their type).
pub fn parse_var(s: &str) -> Result<(String, serde_json::Value), VarError> {
    let (k, v) = s.split_once('=').ok_or_else(|| VarError(s.to_string()))?;
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
        assert!(parse_dotenv("NOEQUALS\n").unwrap_err().to_string().contains("line 1"));
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
        let e = parse_dotenv("A=1\nB=\"unclosed\nC=3\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
    }

    /// Issue 28 item 4: a caller tells a file it cannot read from one it cannot parse, and
    /// the messages read as they did.
    #[test]
    fn env_file_errors_have_kinds_and_keep_their_text() {
        let e = parse_dotenv("A=1\nNOEQUALS\n").unwrap_err();
        assert!(matches!(&e, DotenvError::Syntax { line: Some(2), text, column: 9 } if text == "NOEQUALS"), "{e:?}");
        assert_eq!(e.to_string(), "line 2: cannot parse `NOEQUALS` at character 9");

        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.env").display().to_string();
        let e = file_layer(&dir.path().join(".env"), std::slice::from_ref(&missing)).unwrap_err();
        assert!(
            matches!(&e, ConfigError::ReadEnvFile { path, source } if *path == missing && source.kind() == std::io::ErrorKind::NotFound)
        );
        assert!(e.to_string().starts_with(&format!("cannot read --env-file {missing}: ")), "{e}");

        let bad = dir.path().join("bad.env");
        std::fs::write(&bad, "NOEQUALS\n").unwrap();
        let bad = bad.display().to_string();
        let e = environment(&dir.path().join(".env"), std::slice::from_ref(&bad)).unwrap_err();
        assert!(
            matches!(&e, ConfigError::Parse { file, source: DotenvError::Syntax { line: Some(1), .. } } if *file == bad)
        );
        assert_eq!(e.to_string(), format!("{bad}: line 1: cannot parse `NOEQUALS` at character 9"));

        assert_eq!(parse_var("novalue"), Err(VarError("novalue".into())));
        assert_eq!(parse_var("novalue").unwrap_err().to_string(), "expected k=v, got `novalue`");
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

//! JSON shapes of the E2B protocol and their mapping to the provider types.
//!
//! Parsing is lenient where the protocol doc (§4.2, §9.5) says servers differ: camelCase and
//! snake_case keys, int64 as strings or numbers, enums as names or numbers, omitted zero
//! values, unknown fields. Control-plane keys keep E2B's exact spelling (`sandboxID`).

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_json::Value as JsonValue;

use crate::provider::{FileEntry, ProcessInfo, SandboxInfo};

// ---- lenient scalars -------------------------------------------------------------------

/// A number that may arrive as a JSON number or a string (proto3 int64); missing or null is 0.
pub fn lenient_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Option::<JsonValue>::deserialize(d)? {
        None | Some(JsonValue::Null) => Ok(0),
        Some(JsonValue::Number(n)) => n
            .as_i64()
            .or_else(|| n.as_f64().map(|f| f as i64))
            .ok_or_else(|| de::Error::custom(format!("number out of range: {n}"))),
        Some(JsonValue::String(s)) if s.is_empty() => Ok(0),
        Some(JsonValue::String(s)) => s.trim().parse().map_err(|_| de::Error::custom(format!("not an integer: {s:?}"))),
        Some(other) => Err(de::Error::custom(format!("expected an integer, got {other}"))),
    }
}

fn lenient_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = lenient_i64(d)?;
    u32::try_from(n).map_err(|_| de::Error::custom(format!("out of range for u32: {n}")))
}

fn lenient_i32<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    let n = lenient_i64(d)?;
    i32::try_from(n).map_err(|_| de::Error::custom(format!("out of range for i32: {n}")))
}

/// A string that may be null.
fn null_string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn null_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    Ok(Option::<BTreeMap<String, String>>::deserialize(d)?.unwrap_or_default())
}

/// RFC 3339 (`2024-01-01T00:00:00Z`, optional fraction, `Z` or `±hh:mm`) → unix seconds;
/// `None` for anything else, whatever bytes a server sends (parsed by jiff).
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    let ts: jiff::Timestamp = s.trim().parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

// ---- control plane -----------------------------------------------------------------------

/// A sandbox as an E2B API answer spells it, for the e2b client: `Sandbox` (create/connect
/// answer, §2.5) and the common part of `SandboxDetail` / `ListedSandbox` (§2.6, §2.7), with
/// the tokens and envd version the client needs; [`SandboxJson::info`] makes the provider's
/// `SandboxInfo` of it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SandboxJson {
    #[serde(rename = "sandboxID", alias = "sandboxId", alias = "sandbox_id")]
    pub sandbox_id: String,
    #[serde(
        rename = "templateID",
        alias = "templateId",
        alias = "template_id",
        default,
        deserialize_with = "null_string"
    )]
    pub template_id: String,
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(rename = "envdVersion", alias = "envd_version", default)]
    pub envd_version: Option<String>,
    #[serde(rename = "envdAccessToken", alias = "envd_access_token", default)]
    pub envd_access_token: Option<String>,
    #[serde(rename = "trafficAccessToken", alias = "traffic_access_token", default)]
    pub traffic_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
    #[serde(rename = "startedAt", alias = "started_at", default)]
    pub started_at: Option<String>,
    #[serde(rename = "endAt", alias = "end_at", default)]
    pub end_at: Option<String>,
    #[serde(default, deserialize_with = "null_map")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub state: Option<String>,
}

impl SandboxJson {
    /// The template as users name it: the alias when the API reports one.
    pub fn template(&self) -> String {
        self.alias.clone().filter(|a| !a.is_empty()).unwrap_or_else(|| self.template_id.clone())
    }

    /// Provider view; `fallback_*` fill what a create/connect answer does not carry.
    pub fn info(&self, fallback_started: u64, fallback_end: u64) -> SandboxInfo {
        SandboxInfo {
            id: self.sandbox_id.clone(),
            template: self.template(),
            metadata: self.metadata.clone(),
            started_at: self.started_at.as_deref().and_then(parse_rfc3339).unwrap_or(fallback_started),
            end_at: self.end_at.as_deref().and_then(parse_rfc3339).unwrap_or(fallback_end),
            state: self.state.clone().filter(|s| !s.is_empty()).unwrap_or_else(|| "running".into()),
        }
    }
}

/// The error body of the API: `{"code": <int>, "message": "…"}`.
#[derive(Debug, Default, Deserialize)]
pub struct ApiErrorJson {
    #[serde(default)]
    pub message: Option<String>,
}

// ---- envd: process -------------------------------------------------------------------------

#[derive(Debug, Default, Deserialize)]
pub struct EventEnvelope {
    #[serde(default)]
    pub event: Option<ProcessEvent>,
}

/// `ProcessEvent` oneof (§4.3). Exactly one is set; keepalives are ignored.
#[derive(Debug, Default, Deserialize)]
pub struct ProcessEvent {
    #[serde(default)]
    pub start: Option<StartEvent>,
    #[serde(default)]
    pub data: Option<DataEvent>,
    #[serde(default)]
    pub end: Option<EndEvent>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StartEvent {
    #[serde(default, deserialize_with = "lenient_u32")]
    pub pid: u32,
}

#[derive(Debug, Default, Deserialize)]
pub struct DataEvent {
    #[serde(default)]
    pub stdout: Option<String>,
    #[serde(default)]
    pub stderr: Option<String>,
    #[serde(default)]
    pub pty: Option<String>,
}

#[derive(Debug, Default, Clone, Deserialize, PartialEq)]
pub struct EndEvent {
    #[serde(default, rename = "exitCode", alias = "exit_code", deserialize_with = "lenient_i32")]
    pub exit_code: i32,
    #[serde(default)]
    pub exited: bool,
    #[serde(default, deserialize_with = "null_string")]
    pub status: String,
    #[serde(default)]
    pub error: Option<String>,
}

impl EndEvent {
    /// `(exit_code, signal)` as the provider reports them: a process ended by a signal
    /// (`status` "signal: killed") has no exit code.
    pub fn outcome(&self) -> (Option<i32>, Option<i32>) {
        match signal_from_status(&self.status) {
            Some(sig) if !self.exited => (None, Some(sig)),
            _ => (Some(self.exit_code), None),
        }
    }
}

/// Go's `ProcessState.String()` for a signalled process → signal number.
pub fn signal_from_status(status: &str) -> Option<i32> {
    let rest = status.trim().strip_prefix("signal")?.trim_start_matches(':').trim();
    let name = rest.split(" (core dumped)").next().unwrap_or(rest).trim();
    // Go's text of a signal it has no name for: "signal: signal 34".
    let name = name.strip_prefix("signal ").unwrap_or(name);
    if let Ok(n) = name.parse() {
        return Some(n);
    }
    Some(match name {
        "hangup" => libc::SIGHUP,
        "interrupt" => libc::SIGINT,
        "quit" => libc::SIGQUIT,
        "illegal instruction" => libc::SIGILL,
        "trace/breakpoint trap" => libc::SIGTRAP,
        "aborted" => libc::SIGABRT,
        "bus error" => libc::SIGBUS,
        "floating point exception" => libc::SIGFPE,
        "killed" => libc::SIGKILL,
        "user defined signal 1" => libc::SIGUSR1,
        "segmentation fault" => libc::SIGSEGV,
        "user defined signal 2" => libc::SIGUSR2,
        "broken pipe" => libc::SIGPIPE,
        "alarm clock" => libc::SIGALRM,
        "terminated" => libc::SIGTERM,
        _ => return None,
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct ProcessConfigJson {
    #[serde(default, deserialize_with = "null_string")]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListedProcess {
    #[serde(default)]
    pub config: Option<ProcessConfigJson>,
    #[serde(default, deserialize_with = "lenient_u32")]
    pub pid: u32,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListResponse {
    #[serde(default)]
    pub processes: Vec<ListedProcess>,
}

impl ListedProcess {
    /// The command as the user wrote it: the `-c` script of `/bin/bash -l -c <cmd>`.
    pub fn info(&self) -> ProcessInfo {
        let cmd = match &self.config {
            Some(c) => match c.args.as_slice() {
                [.., flag, script] if flag == "-c" && c.cmd.ends_with("bash") => script.clone(),
                [] => c.cmd.clone(),
                args => format!("{} {}", c.cmd, args.join(" ")),
            },
            None => String::new(),
        };
        ProcessInfo { pid: self.pid, cmd, running: true, exit_code: None }
    }
}

// ---- envd: filesystem ------------------------------------------------------------------------

/// `EntryInfo` (§4.4).
#[derive(Debug, Default, Deserialize)]
pub struct EntryJson {
    #[serde(default, deserialize_with = "null_string")]
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: Option<JsonValue>,
    #[serde(default, deserialize_with = "null_string")]
    pub path: String,
    #[serde(default, deserialize_with = "lenient_i64")]
    pub size: i64,
    #[serde(default, deserialize_with = "lenient_u32")]
    pub mode: u32,
    #[serde(default, rename = "modifiedTime", alias = "modified_time")]
    pub modified_time: Option<String>,
}

impl EntryJson {
    /// `file`, `dir`, `symlink`, or `None` for `FILE_TYPE_UNSPECIFIED` (which the SDK drops).
    pub fn kind(&self) -> Option<&'static str> {
        match &self.kind {
            Some(JsonValue::String(s)) => match s.as_str() {
                "FILE_TYPE_FILE" | "file" => Some("file"),
                "FILE_TYPE_DIRECTORY" | "dir" | "directory" => Some("dir"),
                "FILE_TYPE_SYMLINK" | "symlink" => Some("symlink"),
                _ => None,
            },
            Some(JsonValue::Number(n)) => match n.as_i64() {
                Some(1) => Some("file"),
                Some(2) => Some("dir"),
                Some(3) => Some("symlink"),
                _ => None,
            },
            _ => None,
        }
    }

    pub fn entry(&self) -> Option<FileEntry> {
        let kind = self.kind()?;
        let name = if self.name.is_empty() {
            self.path.rsplit('/').next().unwrap_or_default().to_string()
        } else {
            self.name.clone()
        };
        Some(FileEntry {
            name,
            path: self.path.clone(),
            kind: kind.to_string(),
            size: self.size.max(0) as u64,
            mode: self.mode & 0o7777,
            modified: self.modified_time.as_deref().and_then(parse_rfc3339).unwrap_or(0),
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct EntryResponse {
    #[serde(default)]
    pub entry: Option<EntryJson>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ListDirResponse {
    #[serde(default)]
    pub entries: Vec<EntryJson>,
}

/// One element of the `POST /files` answer (§5.2).
#[derive(Debug, Default, Deserialize)]
pub struct UploadedJson {
    #[serde(default, deserialize_with = "null_string")]
    pub path: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("2024-01-01T00:00:00Z"), Some(1_704_067_200));
        assert_eq!(parse_rfc3339("2024-01-01T00:00:00.123456789Z"), Some(1_704_067_200));
        assert_eq!(parse_rfc3339("2024-01-01T02:00:00+02:00"), Some(1_704_067_200));
        assert_eq!(parse_rfc3339("2023-12-31T23:00:00-01:00"), Some(1_704_067_200));
        assert_eq!(parse_rfc3339("2024-02-29T12:34:56Z"), Some(1_709_210_096));
        for bad in ["", "2024-01-01", "2024-13-01T00:00:00Z", "2024-01-01T00:00:00", "2024-01-01T00:00:00.Z"] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    /// Issue 13: the hand-written parser sliced by byte offset and panicked on a multi-byte
    /// character where it expected the offset's digits.
    #[test]
    fn malformed_timestamps_from_a_server_are_none_not_a_panic() {
        for bad in [
            "2024-01-01T00:00:00+aé00",
            "2024-01-01T00:00:00+é:00",
            "2024-01-01T00:00:00é",
            "2024-01-01Té0:00:00Z",
            "é024-01-01T00:00:00Z",
            "2024-01-01T00:00:00+99:99",
            "1969-12-31T23:59:59Z",
            "99999-01-01T00:00:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn sandbox_response_fields() {
        let j = r#"{"sandboxID":"i1x9k2","templateID":"rki5dems9wqfm4r03t7g","clientID":"6532622b",
            "envdVersion":"0.6.13","alias":"base","envdAccessToken":"tok","trafficAccessToken":null,"domain":null,
            "envdUrl":"https://x","accountID":"1"}"#;
        let s: SandboxJson = serde_json::from_str(j).unwrap();
        assert_eq!(s.sandbox_id, "i1x9k2");
        assert_eq!(s.template(), "base");
        assert_eq!(s.envd_access_token.as_deref(), Some("tok"));
        assert_eq!(s.domain, None);
        let info = s.info(10, 310);
        assert_eq!((info.started_at, info.end_at, info.state.as_str()), (10, 310, "running"));

        let j = r#"{"sandboxID":"a","templateID":"t","clientID":"c","startedAt":"2024-01-01T00:00:00Z",
            "endAt":"2024-01-01T00:05:00.5Z","envdVersion":"0.6.13","cpuCount":2,"memoryMB":512,"diskSizeMB":1,
            "state":"paused","metadata":{"owner":"me"}}"#;
        let s: SandboxJson = serde_json::from_str(j).unwrap();
        let info = s.info(0, 0);
        assert_eq!(info.template, "t", "no alias: the template id");
        assert_eq!((info.started_at, info.end_at), (1_704_067_200, 1_704_067_500));
        assert_eq!(info.state, "paused");
        assert_eq!(info.metadata["owner"], "me");
    }

    #[test]
    fn process_events() {
        let e: EventEnvelope = serde_json::from_str(r#"{"event":{"start":{"pid":1234}}}"#).unwrap();
        assert_eq!(e.event.unwrap().start.unwrap().pid, 1234);
        let e: EventEnvelope = serde_json::from_str(r#"{"event":{"start":{"pid":"77"}}}"#).unwrap();
        assert_eq!(e.event.unwrap().start.unwrap().pid, 77, "int as string");
        let e: EventEnvelope = serde_json::from_str(r#"{"event":{"keepalive":{}}}"#).unwrap();
        let ev = e.event.unwrap();
        assert!(ev.start.is_none() && ev.data.is_none() && ev.end.is_none());

        // Success: exitCode omitted (zero value).
        let e: EndEvent = serde_json::from_str(r#"{"exited":true,"status":"exit status 0"}"#).unwrap();
        assert_eq!(e.outcome(), (Some(0), None));
        let e: EndEvent =
            serde_json::from_str(r#"{"exitCode":1,"exited":true,"status":"exit status 1","error":"exit status 1"}"#)
                .unwrap();
        assert_eq!(e.outcome(), (Some(1), None));
        let e: EndEvent =
            serde_json::from_str(r#"{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}"#).unwrap();
        assert_eq!(e.outcome(), (None, Some(9)));
        let e: EndEvent = serde_json::from_str(r#"{"exit_code":"-1","status":"signal: terminated"}"#).unwrap();
        assert_eq!(e.outcome(), (None, Some(15)));
        assert_eq!(signal_from_status("signal: segmentation fault (core dumped)"), Some(11));
        assert_eq!(signal_from_status("signal 37"), Some(37));
        assert_eq!(signal_from_status("exit status 2"), None);
    }

    #[test]
    fn listed_processes() {
        let l: ListResponse = serde_json::from_str(
            r#"{"processes":[{"config":{"cmd":"/bin/bash","args":["-l","-c","sleep 100"]},"pid":42},
                {"config":{"cmd":"/usr/bin/python3","args":["-m","http.server"],"envs":{}},"pid":"43","tag":"x"}]}"#,
        )
        .unwrap();
        let infos: Vec<_> = l.processes.iter().map(ListedProcess::info).collect();
        assert_eq!(infos[0], ProcessInfo { pid: 42, cmd: "sleep 100".into(), running: true, exit_code: None });
        assert_eq!(infos[1].cmd, "/usr/bin/python3 -m http.server");
        assert_eq!(infos[1].pid, 43);
    }

    #[test]
    fn entries() {
        let e: EntryResponse = serde_json::from_str(
            r#"{"entry":{"name":"a.txt","type":"FILE_TYPE_FILE","path":"/home/user/a.txt","size":"12","mode":420,
                "permissions":"-rw-r--r--","owner":"user","group":"user","modifiedTime":"2024-01-01T00:00:00Z"}}"#,
        )
        .unwrap();
        let f = e.entry.unwrap().entry().unwrap();
        assert_eq!(
            f,
            FileEntry {
                name: "a.txt".into(),
                path: "/home/user/a.txt".into(),
                kind: "file".into(),
                size: 12,
                mode: 0o644,
                modified: 1_704_067_200
            }
        );
        let l: ListDirResponse = serde_json::from_str(
            r#"{"entries":[{"name":"d","type":2,"path":"/d","mode":493},{"name":"x","path":"/x"},
                {"name":"l","type":"FILE_TYPE_SYMLINK","path":"/l","size":3,"symlinkTarget":"/d"}]}"#,
        )
        .unwrap();
        let got: Vec<_> = l.entries.iter().filter_map(EntryJson::entry).collect();
        assert_eq!(got.len(), 2, "FILE_TYPE_UNSPECIFIED is dropped");
        assert_eq!((got[0].kind.as_str(), got[0].mode, got[0].size), ("dir", 0o755, 0));
        assert_eq!((got[1].kind.as_str(), got[1].size), ("symlink", 3));
    }
}

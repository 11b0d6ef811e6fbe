//! execd's files and directories: `/files/{info,upload,download,search,mv,permissions,replace}`,
//! `DELETE /files`, `/directories/list`, `POST`/`DELETE /directories`.
//!
//! execd runs as root in its container, so every operation here acts as the sandbox's root:
//! contents go through the provider's root reads and writes (`open_file_as`, which downloads
//! stream from, `read_file_as` and `write_file_as`, with `root`), metadata, listings,
//! searches, moves, modes and owners through a short root script in the sandbox (GNU
//! `find -printf` for `FileInfo`: type, size, modification and change times, owner and group
//! by name, permission bits). Answers follow execd's: a missing path is 404 `FILE_NOT_FOUND`,
//! other failures 500 `RUNTIME_ERROR` with its words; `mode` is the octal digits read as a
//! number (`755`), times RFC 3339 with nanoseconds.
//! Relative paths are under `/home/user`, as every provider's.

// Helpers return the early answer as their error.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Multipart, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::common::query_pairs;
use super::execd::{bad_request, error, parse, runtime_error};
use crate::provider::{ErrorKind, ExecRequest, FileStream};
use crate::server::state::{AppState, ServedSandbox};

type Sb = Extension<Arc<ServedSandbox>>;
type St = State<Arc<AppState>>;

/// The most one `/files/upload` request may carry (its files are held in memory).
const UPLOAD_LIMIT: usize = 256 << 20;

/// `find -printf` of one `FileInfo`: eight NUL-terminated fields.
const FMT: &str = r"%y\0%s\0%T@\0%C@\0%u\0%g\0%m\0%p\0";

pub(super) fn routes(r: Router<Arc<AppState>>) -> Router<Arc<AppState>> {
    r.route("/files", axum::routing::delete(remove_files))
        .route("/files/info", get(info))
        .route("/files/mv", post(rename))
        .route("/files/permissions", post(permissions))
        .route("/files/search", get(search))
        .route("/files/replace", post(replace))
        // Parts are read whole (execd's multipart form): past axum's default 2 MiB, up to
        // this much per request.
        .route("/files/upload", post(upload).layer(axum::extract::DefaultBodyLimit::max(UPLOAD_LIMIT)))
        .route("/files/download", get(download))
        .route("/directories/list", get(list))
        .route("/directories", post(make_dirs).delete(remove_dirs))
}

fn q(s: &str) -> String {
    crate::templates::dockerfile::shell_quote(s)
}

fn not_found(message: impl Into<String>) -> Response {
    error(StatusCode::NOT_FOUND, "FILE_NOT_FOUND", message)
}

/// An absolute, normalized path (relative ones under `/home/user`).
fn abs(path: &str) -> Result<String, Response> {
    crate::provider::normalize_path(path).map_err(|e| bad_request(e.message))
}

/// Runs `script` as the sandbox's root: (exit code, stdout, stderr).
async fn sh(st: &AppState, sb: &ServedSandbox, script: String) -> Result<(i32, Vec<u8>, String), Response> {
    let req = ExecRequest { cmd: script, user: Some("root".into()), ..Default::default() };
    let r = st.provider.sandbox(&sb.provider_id).exec(req, None).await.map_err(|e| runtime_error(e.message))?;
    Ok((r.exit_code.unwrap_or(-1), r.stdout, String::from_utf8_lossy(&r.stderr).trim().to_string()))
}

/// Fractional unix seconds (`find`'s `%T@`) as RFC 3339.
fn time(s: &str) -> String {
    let (secs, frac) = s.split_once('.').unwrap_or((s, ""));
    let secs: i64 = secs.parse().unwrap_or(0);
    let digits: String = frac.chars().take(9).collect();
    let nanos: i32 = format!("{digits:0<9}").parse().unwrap_or(0);
    jiff::Timestamp::new(secs, nanos).map(|t| t.to_string()).unwrap_or_else(|_| crate::server::state::rfc3339(0))
}

/// The `FileInfo`s of `find -printf FMT` output.
fn infos(out: &[u8]) -> Vec<Value> {
    let fields: Vec<String> = out.split(|b| *b == 0).map(|f| String::from_utf8_lossy(f).into_owned()).collect();
    fields
        .chunks(8)
        .filter(|c| c.len() == 8)
        .map(|f| {
            let kind = match f[0].as_str() {
                "f" => "file",
                "d" => "directory",
                "l" => "symlink",
                _ => "other",
            };
            let perm = u32::from_str_radix(&f[6], 8).unwrap_or(0) & 0o777;
            json!({
                "path": f[7],
                "type": kind,
                "size": f[1].parse::<u64>().unwrap_or(0),
                "modified_at": time(&f[2]),
                "created_at": time(&f[3]),
                "owner": f[4],
                "group": f[5],
                "mode": format!("{perm:o}").parse::<u32>().unwrap_or(0),
            })
        })
        .collect()
}

/// Each `path=` of the query, decoded.
fn paths(q: Option<&str>) -> Vec<String> {
    query_pairs(q).into_iter().filter(|(k, _)| k == "path").map(|(_, v)| v).collect()
}

fn param(q: Option<&str>, name: &str) -> Option<String> {
    query_pairs(q).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// The query's `path=`, which must be there and not empty.
fn path_param(q: Option<&str>) -> Result<String, Response> {
    param(q, "path")
        .filter(|p| !p.is_empty())
        .ok_or_else(|| error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'path'"))
}

/// The `FileInfo` of each path (not following a final symlink); the 404 of the first missing.
async fn stat_all(st: &AppState, sb: &ServedSandbox, list: &[String]) -> Result<Vec<Value>, Response> {
    let mut script = String::new();
    for (i, p) in list.iter().enumerate() {
        let p = q(p);
        script += &format!(
            "if [ -e {p} ] || [ -L {p} ]; then find {p} -maxdepth 0 -printf '{FMT}'; else echo {i} >&2; exit 3; fi\n"
        );
    }
    let (code, out, err) = sh(st, sb, script).await?;
    match code {
        0 => Ok(infos(&out)),
        3 => {
            let i: usize = err.lines().last().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
            let p = list.get(i).cloned().unwrap_or_default();
            Err(not_found(format!("file not found. file not found: {p}: stat {p}: no such file or directory")))
        }
        _ => Err(runtime_error(format!("error accessing file: {err}"))),
    }
}

async fn info(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery) -> Response {
    let asked = paths(qs.as_deref());
    if asked.is_empty() {
        return Json(json!({})).into_response();
    }
    let mut absolute = Vec::new();
    for p in &asked {
        match abs(p) {
            Ok(a) => absolute.push(a),
            Err(r) => return r,
        }
    }
    let found = match stat_all(&st, &sb, &absolute).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let mut out = serde_json::Map::new();
    for (asked, info) in asked.into_iter().zip(found) {
        out.insert(asked, info);
    }
    Json(Value::Object(out)).into_response()
}

/// Runs `script`, the lines for every path of a request, as root: 200 when it succeeds or
/// there is nothing to run; `failed` answers its exit code and stderr otherwise.
async fn run_all(
    st: &AppState,
    sb: &ServedSandbox,
    script: String,
    failed: impl FnOnce(i32, String) -> Response,
) -> Response {
    if script.is_empty() {
        return StatusCode::OK.into_response();
    }
    match sh(st, sb, script).await {
        Ok((0, _, _)) => StatusCode::OK.into_response(),
        Ok((code, _, err)) => failed(code, err),
        Err(r) => r,
    }
}

/// The lines `line` writes for each `path=` of the query, given the path as asked and its
/// absolute form.
fn path_script(qs: Option<&str>, line: impl Fn(&str, &str) -> Result<String, Response>) -> Result<String, Response> {
    let mut script = String::new();
    for p in paths(qs) {
        script += &line(&p, &abs(&p)?)?;
    }
    Ok(script)
}

async fn remove_files(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery) -> Response {
    let script = path_script(qs.as_deref(), |p, a| {
        let (qa, qp) = (q(a), q(p));
        Ok(format!(
            "if [ -d {qa} ]; then echo \"error removing file \"{qp}\". path is a directory: \"{qp} >&2; exit 3; fi\nrm -f -- {qa} || exit 4\n"
        ))
    });
    match script {
        Ok(script) => run_all(&st, &sb, script, |_, err| runtime_error(err)).await,
        Err(r) => r,
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Permission {
    owner: Option<String>,
    group: Option<String>,
    mode: Option<i64>,
}

/// execd's `ChmodFile` for path `qa` (quoted): the mode if not 0 (its decimal digits read as
/// octal), then the owner and group that exist (both unknown or unset: root's).
fn chmod_script(qa: &str, p: &Permission) -> Result<String, Response> {
    let mut s = String::new();
    if let Some(m) = p.mode.filter(|m| *m != 0) {
        let octal = u32::from_str_radix(&m.to_string(), 8)
            .map_err(|_| runtime_error(format!("strconv.ParseUint: parsing \"{m}\": invalid syntax")))?;
        s += &format!("chmod {octal:o} -- {qa} || exit 4\n");
    }
    let owner = q(p.owner.as_deref().unwrap_or(""));
    let group = q(p.group.as_deref().unwrap_or(""));
    s += &format!(
        "o={owner}; g={group}\n\
         [ -n \"$o\" ] && ! id -u -- \"$o\" >/dev/null 2>&1 && o=\n\
         [ -n \"$g\" ] && ! getent group -- \"$g\" >/dev/null 2>&1 && g=\n\
         if [ -z \"$o$g\" ]; then chown 0:0 -- {qa} || exit 4\n\
         elif [ -z \"$g\" ]; then chown -- \"$o\" {qa} || exit 4\n\
         else chown -- \"$o:$g\" {qa} || exit 4; fi\n"
    );
    Ok(s)
}

/// The script of a `{path: Permission}` body: for each path, the lines `before` writes (given
/// the path as asked and its absolute form quoted), then its [`chmod_script`].
fn chmod_each(body: &Bytes, before: impl Fn(&str, &str) -> String) -> Result<String, Response> {
    let req: BTreeMap<String, Permission> = parse(body)?;
    let mut script = String::new();
    for (p, perm) in &req {
        let qa = q(&abs(p)?);
        script += &before(p, &qa);
        script += &chmod_script(&qa, perm)?;
    }
    Ok(script)
}

async fn permissions(State(st): St, Extension(sb): Sb, body: Bytes) -> Response {
    let script = chmod_each(&body, |p, qa| {
        format!("[ -e {qa} ] || {{ echo 'error changing permissions for '{}'. chmod '{qa}': no such file or directory' >&2; exit 4; }}\n", q(p))
    });
    match script {
        Ok(script) => run_all(&st, &sb, script, |_, err| runtime_error(err)).await,
        Err(r) => r,
    }
}

#[derive(Debug, Deserialize)]
struct RenameItem {
    src: String,
    dest: String,
}

async fn rename(State(st): St, Extension(sb): Sb, body: Bytes) -> Response {
    let items: Vec<RenameItem> = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut script = String::new();
    let mv = if st.mutants.has(crate::server::mutants::Fault::RenameCopies) { "cp -a" } else { "mv -T" };
    for it in &items {
        let (src, dest) = match (abs(&it.src), abs(&it.dest)) {
            (Ok(s), Ok(d)) => (s, d),
            (Err(r), _) | (_, Err(r)) => return r,
        };
        let (qs, qd) = (q(&src), q(&dest));
        let parent = q(dest.rsplit_once('/').map(|(d, _)| if d.is_empty() { "/" } else { d }).unwrap_or("/"));
        script += &format!(
            "if [ ! -e {qs} ] && [ ! -L {qs} ]; then echo 'source path not found: '{}': stat '{qs}': no such file or directory' >&2; exit 3; fi\n\
             mkdir -p -- {parent} || exit 4\n\
             if [ -e {qd} ] || [ -L {qd} ]; then echo 'destination path already exists: '{} >&2; exit 4; fi\n\
             {mv} -- {qs} {qd} || exit 4\n",
            q(&it.src),
            q(&it.dest)
        );
    }
    run_all(&st, &sb, script, |code, err| match code {
        3 => not_found(format!("file not found. {err}")),
        _ => runtime_error(format!("error accessing file: {err}")),
    })
    .await
}

async fn make_dirs(State(st): St, Extension(sb): Sb, body: Bytes) -> Response {
    match chmod_each(&body, |_, qa| format!("mkdir -p -- {qa} || exit 4\n")) {
        Ok(script) => run_all(&st, &sb, script, |_, err| runtime_error(format!("error accessing file: {err}"))).await,
        Err(r) => r,
    }
}

async fn remove_dirs(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery) -> Response {
    let script = path_script(qs.as_deref(), |p, a| {
        if a == "/" {
            return Err(runtime_error(format!("error removing directory {p}. refusing to remove /")));
        }
        Ok(format!("rm -rf -- {} || exit 4\n", q(a)))
    });
    match script {
        Ok(script) => {
            run_all(&st, &sb, script, |_, err| runtime_error(format!("error removing directory. {err}"))).await
        }
        Err(r) => r,
    }
}

/// Entries of `path` down to `depth` (1: its children), lexical by name in each directory,
/// every directory followed by what is in it; symbolic links are listed, never followed.
async fn list(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery) -> Result<Response, Response> {
    let path = path_param(qs.as_deref())?;
    let depth = match param(qs.as_deref(), "depth") {
        None => 1,
        Some(d) => d.parse::<u32>().map_err(|_| bad_request(format!("invalid query parameter 'depth': {d}")))?,
    };
    let a = abs(&path)?;
    let qa = q(&a);
    let script = format!(
        "if [ -L {qa} ]; then exit 5; fi\nif [ ! -e {qa} ]; then exit 3; fi\nif [ ! -d {qa} ]; then exit 6; fi\n{}",
        if depth == 0 { String::new() } else { format!("find {qa} -mindepth 1 -maxdepth {depth} -printf '{FMT}'\n") }
    );
    let (code, out, err) = sh(&st, &sb, script).await?;
    match code {
        0 => {}
        3 => return Err(not_found(format!("file not found. lstat {a}: no such file or directory"))),
        5 => return Err(bad_request(format!("path is a symbolic link, refusing to traverse: {a}"))),
        6 => return Err(bad_request(format!("path is not a directory: {a}"))),
        _ => return Err(runtime_error(format!("error listing directory {a}. {err}"))),
    }
    let mut entries = infos(&out);
    let key = |v: &Value| v["path"].as_str().unwrap_or("").split('/').map(str::to_string).collect::<Vec<_>>();
    entries.sort_by_key(key);
    Ok(Json(Value::Array(entries)).into_response())
}

/// Files (anything but directories) under `path` whose name matches `pattern` (a glob; `**`,
/// the default, matches every name).
async fn search(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery) -> Result<Response, Response> {
    let path = path_param(qs.as_deref())?;
    let pattern = param(qs.as_deref(), "pattern").filter(|p| !p.is_empty()).unwrap_or_else(|| "**".into());
    let glob = glob::Pattern::new(&pattern)
        .map_err(|e| runtime_error(format!("error searching files. invalid pattern {pattern}: {e}")))?;
    let a = abs(&path)?;
    let qa = q(&a);
    let script = format!("[ -e {qa} ] || exit 3\nfind {qa} ! -type d -printf '{FMT}' 2>/dev/null\ntrue\n");
    let (code, out, err) = sh(&st, &sb, script).await?;
    match code {
        0 => {}
        3 => return Err(not_found(format!("file not found. stat {a}: no such file or directory"))),
        _ => return Err(runtime_error(format!("error searching files. {err}"))),
    }
    let found: Vec<Value> = infos(&out)
        .into_iter()
        .filter(|v| {
            let name = v["path"].as_str().unwrap_or("").rsplit('/').next().unwrap_or("");
            pattern == "**" || glob.matches(name)
        })
        .collect();
    Ok(Json(Value::Array(found)).into_response())
}

#[derive(Debug, Deserialize)]
struct ReplaceItem {
    #[serde(default)]
    old: String,
    #[serde(default)]
    new: String,
}

async fn replace(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery, body: Bytes) -> Response {
    let verbose = param(qs.as_deref(), "verbose").as_deref() == Some("true");
    let req: BTreeMap<String, ReplaceItem> = match parse(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut results = serde_json::Map::new();
    for (p, item) in &req {
        let a = match abs(p) {
            Ok(a) => a,
            Err(r) => return r,
        };
        // Its owner and mode, which the rewrite keeps.
        let (code, out, err) = match sh(&st, &sb, format!("stat -L -c '%u:%g %a' -- {}", q(&a))).await {
            Ok(v) => v,
            Err(r) => return r,
        };
        if code != 0 {
            return if err.contains("No such file") {
                not_found(format!("file not found. stat {a}: no such file or directory"))
            } else {
                runtime_error(format!("error accessing file: {err}"))
            };
        }
        if item.old.is_empty() {
            return bad_request("old content must not be empty");
        }
        let data = match st.provider.sandbox(&sb.provider_id).read_file_as(&a, "root").await {
            Ok(d) => d,
            Err(e) if e.kind == ErrorKind::NotFound => return not_found(format!("file not found. {e}")),
            Err(e) => return runtime_error(format!("error accessing file: {e}")),
        };
        let text = String::from_utf8_lossy(&data);
        let count = text.matches(item.old.as_str()).count();
        if count > 0 {
            let next = text.replace(item.old.as_str(), &item.new);
            if let Err(e) = st.provider.sandbox(&sb.provider_id).write_file_as(&a, next.into_bytes(), "root").await {
                return runtime_error(format!("error accessing file: {e}"));
            }
            let ids = String::from_utf8_lossy(&out);
            let mut it = ids.split_whitespace();
            if let (Some(owner), Some(mode)) = (it.next(), it.next()) {
                let fix = format!("chown {} -- {qa} && chmod {} -- {qa}", q(owner), q(mode), qa = q(&a));
                if let Err(r) = sh(&st, &sb, fix).await {
                    return r;
                }
            }
        }
        results.insert(p.clone(), json!({"replacedCount": count}));
    }
    if verbose {
        Json(Value::Object(results)).into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

/// An upload's `metadata` part: where the file goes, and its owner and mode.
#[derive(Debug, Default, Deserialize)]
struct FileMetadata {
    #[serde(default)]
    path: String,
    #[serde(flatten)]
    perm: Permission,
}

/// `POST /files/upload`: `metadata` and `file` parts in pairs, each file written as root,
/// then given its mode and owner as its metadata says.
async fn upload(State(st): St, Extension(sb): Sb, mut form: Multipart) -> Response {
    let upload_error = |code: &str, m: String| error(StatusCode::BAD_REQUEST, code, m);
    let mut metas: Vec<FileMetadata> = Vec::new();
    let mut files: Vec<Vec<u8>> = Vec::new();
    let mut total: u64 = 0;
    loop {
        let mut field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return upload_error("INVALID_FILE", format!("multipart form is invalid: {e}")),
        };
        let name = field.name().unwrap_or("").to_string();
        let mut data = Vec::new();
        loop {
            match field.chunk().await {
                Ok(Some(c)) => {
                    total += c.len() as u64;
                    if total > st.limits.max_upload {
                        return error(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            "INVALID_FILE",
                            format!("the upload is larger than {}", crate::size::human(st.limits.max_upload)),
                        );
                    }
                    data.extend_from_slice(&c);
                }
                Ok(None) => break,
                Err(e) => return upload_error("INVALID_FILE", format!("error reading part {name}: {e}")),
            }
        }
        match name.as_str() {
            "metadata" => match serde_json::from_slice::<FileMetadata>(&data) {
                Ok(m) if !m.path.is_empty() => metas.push(m),
                Ok(_) => return upload_error("INVALID_FILE_METADATA", "metadata path is empty".into()),
                Err(e) => return upload_error("INVALID_FILE_METADATA", format!("invalid metadata format. {e}")),
            },
            "file" => files.push(data),
            _ => {}
        }
    }
    if metas.is_empty() {
        return upload_error("INVALID_FILE_METADATA", "metadata file is missing".into());
    }
    if files.is_empty() {
        return upload_error("INVALID_FILE_CONTENT", "file is missing".into());
    }
    if metas.len() != files.len() {
        return upload_error(
            "INVALID_FILE",
            format!("metadata and file count mismatch: {} vs {}", metas.len(), files.len()),
        );
    }
    let mut script = String::new();
    for (meta, data) in metas.iter().zip(files) {
        let a = match abs(&meta.path) {
            Ok(a) => a,
            Err(r) => return r,
        };
        if let Err(e) = st.provider.sandbox(&sb.provider_id).write_file_as(&a, data, "root").await {
            return runtime_error(format!("error opening destination file {a}. {e}"));
        }
        match chmod_script(&q(&a), &meta.perm) {
            Ok(s) => script += &s,
            Err(r) => return r,
        }
    }
    // Never empty: every file's chmod_script sets at least its owner.
    run_all(&st, &sb, script, |_, err| runtime_error(format!("error chmoding file. {err}"))).await
}

/// The one byte range of a `Range: bytes=…` header over `size` bytes; `Err` when it cannot
/// be satisfied.
fn byte_range(h: &str, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(spec) = h.trim().strip_prefix("bytes=") else { return Err(()) };
    let first = spec.split(',').next().unwrap_or("").trim();
    let (a, b) = first.split_once('-').ok_or(())?;
    let (start, end) = if a.is_empty() {
        let n: u64 = b.parse().map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        (size.saturating_sub(n), size.saturating_sub(1))
    } else {
        let s: u64 = a.parse().map_err(|_| ())?;
        let e: u64 = if b.is_empty() {
            size.saturating_sub(1)
        } else {
            b.parse::<u64>().map_err(|_| ())?.min(size.saturating_sub(1))
        };
        (s, e)
    };
    if size == 0 || start >= size || end < start {
        return Err(());
    }
    Ok(Some((start, end)))
}

/// `Content-Disposition` as execd writes it (RFC 5987 for names that are not ASCII).
fn disposition(name: &str) -> String {
    if name.is_ascii() {
        format!("attachment; filename=\"{name}\"")
    } else {
        let enc = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string();
        format!("attachment; filename=\"{enc}\"; filename*=UTF-8''{enc}")
    }
}

async fn download(State(st): St, Extension(sb): Sb, RawQuery(qs): RawQuery, headers: HeaderMap) -> Response {
    let a = match path_param(qs.as_deref()).and_then(|p| abs(&p)) {
        Ok(a) => a,
        Err(r) => return r,
    };
    // Lines `offset` (1-based) and on, `limit` of them: the file is read whole for those
    // (up to 1 GiB); else it is streamed from the open file, whatever its size.
    let offset = param(qs.as_deref(), "offset").and_then(|v| v.parse::<usize>().ok());
    let limit = param(qs.as_deref(), "limit").and_then(|v| v.parse::<usize>().ok());
    let sandbox = st.provider.sandbox(&sb.provider_id);
    let file = if offset.is_some() || limit.is_some() {
        sandbox.read_file_as(&a, "root").await.map(|data| {
            let skip = offset.unwrap_or(1).saturating_sub(1);
            let lines: Vec<&[u8]> =
                data.split_inclusive(|b| *b == b'\n').skip(skip).take(limit.unwrap_or(usize::MAX)).collect();
            FileStream::of(lines.concat())
        })
    } else {
        sandbox.open_file_as(&a, "root").await
    };
    let file = match file {
        Ok(f) => f,
        Err(e) if e.kind == ErrorKind::NotFound => {
            return not_found(format!("file not found. open {a}: no such file or directory"))
        }
        Err(e) => return runtime_error(format!("error accessing file: {e}")),
    };
    let name = a.rsplit('/').next().unwrap_or("file").to_string();
    let size = file.len;
    let (mut status, mut range, mut range_header) = (StatusCode::OK, (0, size), None);
    if let Some(r) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        match byte_range(r, size) {
            Ok(Some((s, e))) => {
                status = StatusCode::PARTIAL_CONTENT;
                range_header = Some(format!("bytes {s}-{e}/{size}"));
                range = (s, e - s + 1);
            }
            Ok(None) => {}
            Err(()) => return error(StatusCode::RANGE_NOT_SATISFIABLE, "UNKNOWN", ""),
        }
    }
    let mut r = (status, sb.file_body(file, range.0, range.1)).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(range.1));
    if let Ok(v) = HeaderValue::from_str(&disposition(&name)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Some(cr) = range_header.and_then(|v| HeaderValue::from_str(&v).ok()) {
        h.insert(header::CONTENT_RANGE, cr);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_output_becomes_file_infos() {
        let out = b"f\x0012\x001700000000.5000000000\x001700000001.0\x00nobody\x00nogroup\x00755\x00/tmp/a b\x00\
                    d\x004096\x001700000000\x001700000000\x00root\x00root\x001777\x00/tmp/d\x00";
        let v = infos(out);
        assert_eq!(v.len(), 2);
        assert_eq!(v[0]["path"], "/tmp/a b");
        assert_eq!(v[0]["type"], "file");
        assert_eq!(v[0]["size"], 12);
        assert_eq!(v[0]["mode"], 755);
        assert_eq!(v[0]["modified_at"], "2023-11-14T22:13:20.5Z");
        assert_eq!(v[1]["type"], "directory");
        assert_eq!(v[1]["mode"], 777);
    }

    #[test]
    fn ranges() {
        assert_eq!(byte_range("bytes=0-9", 100), Ok(Some((0, 9))));
        assert_eq!(byte_range("bytes=90-", 100), Ok(Some((90, 99))));
        assert_eq!(byte_range("bytes=-10", 100), Ok(Some((90, 99))));
        assert_eq!(byte_range("bytes=0-999", 100), Ok(Some((0, 99))));
        assert!(byte_range("bytes=100-", 100).is_err());
        assert!(byte_range("lines=1-2", 100).is_err());
    }

    #[test]
    fn modes_are_octal_digits() {
        let s = chmod_script("/x", &Permission { mode: Some(644), ..Default::default() }).unwrap();
        assert!(s.starts_with("chmod 644 -- /x"));
        assert!(chmod_script("/x", &Permission { mode: Some(999), ..Default::default() }).is_err());
    }
}

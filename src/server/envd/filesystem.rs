//! envd's `filesystem.Filesystem` service, its entry methods: `Stat`, `ListDir`, `MakeDir`,
//! `Move` and `Remove`, and `EntryInfo` as envd reports it (Go's permission string, the owner,
//! a symbolic link described by what it leads to, `user.e2b.*` metadata). The service's
//! watchers are in `watch`. `MakeDir`, `Move` and `Remove` act with envd's rights (root),
//! directories they make given to the request's user: see the section below.

use std::sync::Arc;

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::provider::{ErrorKind, ExecRequest, FileEntry, ProviderError};
use crate::server::connect::{self, lenient, RpcError, Unary};
use crate::server::mutants::Fault;
use crate::server::state::{AppState, ServedSandbox};
use crate::server::users::{home_of, resolve, resolve_in};

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
    #[serde(default, deserialize_with = "lenient::opt_u32")]
    depth: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// Go's `FileMode.String()` for the type and permission bits.
fn permissions(kind: &str, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match kind {
        "dir" => 'd',
        "symlink" => 'L',
        _ => '-',
    });
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// The owner reported for every entry: the provider writes files as the sandbox user, and
/// `FileEntry` carries no owner.
fn owner_name() -> &'static str {
    "user"
}

/// `EntryInfo` in proto3 JSON (int64 size as a string, enum names).
fn entry_json(e: &FileEntry) -> Value {
    let ty = match e.kind.as_str() {
        "dir" => "FILE_TYPE_DIRECTORY",
        "symlink" => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_FILE",
    };
    json!({
        "name": e.name,
        "type": ty,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode & 0o777,
        "permissions": permissions(&e.kind, e.mode),
        "owner": owner_name(),
        "group": owner_name(),
        "modifiedTime": crate::server::state::rfc3339(e.modified),
    })
}

/// Most links followed in a row, as the kernel's `ELOOP` limit.
const MAX_LINKS: usize = 40;

/// Where the symbolic link `path` leads: the absolute path it resolves to and what is there,
/// or `None` when it dangles or loops.
async fn follow_link(st: &AppState, sb: &ServedSandbox, path: &str) -> Option<(String, FileEntry)> {
    let mut cur = path.to_string();
    for _ in 0..MAX_LINKS {
        let target = st.provider.sandbox(&sb.provider_id).read_link(&cur).await.ok()?;
        let base = cur.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        cur = resolve(&if target.starts_with('/') { target } else { format!("{base}/{target}") }).ok()?;
        let e = st.provider.sandbox(&sb.provider_id).stat(&cur).await.ok()?;
        if e.kind != "symlink" {
            return Some((cur, e));
        }
    }
    None
}

/// envd's `EntryInfo` of `e`: a symbolic link is described by what it leads to (type, mode,
/// size) with `symlinkTarget` set to the absolute path it resolves to; one that dangles stays
/// a link.
pub(super) async fn describe(st: &AppState, sb: &ServedSandbox, e: &FileEntry) -> Value {
    let mut v = describe_type(st, sb, e).await;
    // envd 0.6.2's file metadata: the `user.e2b.*` extended attributes, when there are any.
    if let Ok(m) = st.provider.sandbox(&sb.provider_id).file_metadata(&e.path).await {
        if !m.is_empty() {
            v["metadata"] = json!(m);
        }
    }
    v
}

async fn describe_type(st: &AppState, sb: &ServedSandbox, e: &FileEntry) -> Value {
    if e.kind != "symlink" {
        return entry_json(e);
    }
    match follow_link(st, sb, &e.path).await {
        Some((target, t)) => {
            let shown = FileEntry { name: e.name.clone(), path: e.path.clone(), modified: e.modified, ..t };
            let mut v = entry_json(&shown);
            v["symlinkTarget"] = json!(target);
            v
        }
        None => entry_json(e),
    }
}

fn file_not_found(path: &str) -> impl Fn(ProviderError) -> RpcError + '_ {
    move |e| {
        if e.kind == ErrorKind::NotFound {
            RpcError::not_found(format!("file not found: {path}"))
        } else {
            e.into()
        }
    }
}

unary_fn!(fs_stat, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    let e = st.provider.sandbox(&sb.provider_id).stat(&path).await.map_err(file_not_found(&path))?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_list_dir, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    let depth = r.depth.filter(|d| *d > 0).unwrap_or(1);
    // envd walks depth first, each directory in lexical order (the provider sorts by name),
    // and does not descend into symbolic links; a symbolic link as the root is followed.
    let root = match follow_link(&st, &sb, &path).await {
        Some((target, e)) if e.kind == "dir" => target,
        _ => path.clone(),
    };
    let mut entries = match st.provider.sandbox(&sb.provider_id).list_dir(&root).await {
        Ok(v) => v,
        Err(e) if e.kind == ErrorKind::NotFound => {
            return Err(RpcError::not_found(format!("directory not found: {path}")))
        }
        Err(e) if e.message.starts_with("not a directory") => {
            return Err(RpcError::invalid(format!("path is not a directory: {path}")))
        }
        Err(e) => return Err(e.into()),
    };
    if st.mutants.has(Fault::ListHidesDotfiles) {
        entries.retain(|e| !e.name.starts_with('.'));
    }
    // Reported under the requested path, not where a symbolic link root leads.
    let shown = |e: FileEntry, dir: &str| FileEntry { path: format!("{}/{}", dir.trim_end_matches('/'), e.name), ..e };
    let mut stack: Vec<(FileEntry, String, u32)> =
        entries.into_iter().rev().map(|e| (e.clone(), shown(e, &path).path, 1)).collect();
    let mut out = Vec::new();
    while let Some((e, at, level)) = stack.pop() {
        out.push(describe(&st, &sb, &FileEntry { path: at.clone(), ..e.clone() }).await);
        if e.kind == "dir" && level < depth {
            // Vanished or unreadable below the root: skipped.
            if let Ok(children) = st.provider.sandbox(&sb.provider_id).list_dir(&e.path).await {
                stack.extend(children.into_iter().rev().map(|c| {
                    let p = shown(c.clone(), &at).path;
                    (c, p, level + 1)
                }));
            }
        }
    }
    Ok(json!({ "entries": out }))
});

// ---- MakeDir, Move, Remove: as envd does them ----
//
// envd runs as root: it makes directories as root and gives them to the request's user, and
// moves and removes as root (issue 26: serve's `MakeDir("/contract-x")` as `user` answered
// "permission denied"). The provider's file calls act as the sandbox user, which is what the
// request asks for when it names no other user and has the rights; otherwise the operation
// runs as the sandbox's root ([`as_root`]), a short POSIX sh script, directories it makes
// given to the request's user.

/// The provider's own file calls act as this user.
const PROVIDER_USER: &str = "user";

/// Whether the provider refused for want of the user's rights.
fn denied(e: &ProviderError) -> bool {
    e.message.starts_with("permission denied") || e.message.starts_with("operation not permitted")
}

/// `path` resolved for the request's user (a relative path is under that user's home).
fn resolve_for(path: &str, user: &str) -> Result<String, RpcError> {
    resolve_in(path, &home_of(user))
}

/// Exit code of a root script whose target is missing (`$1`'s, stderr says which).
const MISSING: i32 = 4;
/// Exit code of a root script whose target exists already (stderr says what it is).
const EXISTS: i32 = 5;

/// Gives the directories listed in `$@` (those the script made) to user `$u`.
const GIVE: &str = r#"[ $# -eq 0 ] || chown -h -- "$u:$(id -g -- "$u")" "$@" || exit 3"#;

/// Collects in `$@` the missing directories from `$x` up, then makes `$x` (as `mkdir -p`).
const MAKE_PARENTS: &str = r#"set --
while [ ! -e "$x" ] && [ ! -L "$x" ]; do set -- "$x" "$@"; x=$(dirname -- "$x"); done
mkdir -p -- "$keep" || exit 3"#;

/// `$1` made a directory (with its parents), given to `$2`; its `stat` printed.
fn make_dir_script() -> String {
    format!(
        r#"p=$1 u=$2
if [ -d "$p" ]; then echo "directory already exists: $p" >&2; exit {EXISTS}; fi
if [ -e "$p" ] || [ -L "$p" ]; then echo "path already exists but it is not a directory: $p" >&2; exit {EXISTS}; fi
x=$p keep=$p
{MAKE_PARENTS}
{GIVE}
stat -L -c '%f %s %Y' -- "$p""#
    )
}

/// `$1` moved to `$2` (parents made, given to `$3`), as rename(2); `$2`'s `stat` printed.
fn move_script() -> String {
    format!(
        r#"s=$1 d=$2 u=$3
if [ ! -e "$s" ] && [ ! -L "$s" ]; then echo "file not found: $s" >&2; exit {MISSING}; fi
x=$(dirname -- "$d") keep=$(dirname -- "$d")
{MAKE_PARENTS}
{GIVE}
mv -T -- "$s" "$d" || exit 3
stat -c '%f %s %Y' -- "$d""#
    )
}

/// `$1` removed, recursively; nothing if it is missing.
const REMOVE_SCRIPT: &str = r#"rm -rf -- "$1""#;

/// Runs `script` (`$1`… are `args`) as the sandbox's root; `what` is the operation, for
/// errors. Its output on success; its last line of stderr as the error otherwise, with exit
/// [`MISSING`] as `not_found` and [`EXISTS`] as `already_exists` (a directory) or
/// `invalid_argument` (anything else).
async fn as_root(
    st: &AppState,
    sb: &ServedSandbox,
    what: &str,
    script: &str,
    args: &[&str],
) -> Result<String, RpcError> {
    use crate::templates::dockerfile::shell_quote;
    let quoted: Vec<String> = args.iter().map(|a| shell_quote(a)).collect();
    let req = ExecRequest {
        cmd: format!("set -- {}\n{script}", quoted.join(" ")),
        user: Some("root".into()),
        timeout: Some(std::time::Duration::from_secs(60)),
        max_output: Some(64 << 10),
        ..Default::default()
    };
    let r = st.provider.sandbox(&sb.provider_id).exec(req, None).await?;
    let stderr = String::from_utf8_lossy(&r.stderr);
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    match r.exit_code {
        Some(0) => Ok(String::from_utf8_lossy(&r.stdout).into_owned()),
        Some(MISSING) => Err(RpcError::not_found(last.to_string())),
        Some(EXISTS) if last.starts_with("directory already exists") => {
            Err(RpcError::new("already_exists", last.to_string()))
        }
        Some(EXISTS) => Err(RpcError::invalid(last.to_string())),
        _ if r.timed_out => Err(RpcError::new("deadline_exceeded", format!("{what}: timed out"))),
        _ => Err(RpcError::invalid(format!("{what}: {last}"))),
    }
}

/// The entry at `path` from a script's `stat -c '%f %s %Y'` line.
fn stat_entry(path: &str, line: &str) -> Result<FileEntry, RpcError> {
    let bad = || RpcError::new("internal", format!("cannot read the entry of {path}: {line:?}"));
    let mut it = line.split_whitespace();
    let raw = u32::from_str_radix(it.next().ok_or_else(bad)?, 16).map_err(|_| bad())?;
    let size = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let modified = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let kind = match raw & 0o170000 {
        0o040000 => "dir",
        0o120000 => "symlink",
        _ => "file",
    };
    let name = if path == "/" { "/".to_string() } else { path.rsplit('/').next().unwrap_or(path).to_string() };
    Ok(FileEntry { name, path: path.to_string(), kind: kind.into(), size, mode: raw & 0o7777, modified })
}

unary_fn!(fs_make_dir, PathRequest, |st, sb, r, user| {
    let user = user.as_deref().unwrap_or(PROVIDER_USER);
    let path = resolve_for(&r.path, user)?;
    match st.provider.sandbox(&sb.provider_id).stat(&path).await {
        Ok(e) if e.kind == "dir" => {
            return Err(RpcError::new("already_exists", format!("directory already exists: {path}")))
        }
        Ok(_) => return Err(RpcError::invalid(format!("path already exists but it is not a directory: {path}"))),
        // Where the user may not look, the root script looks.
        Err(e) if e.kind == ErrorKind::NotFound || denied(&e) => {}
        Err(e) => return Err(e.into()),
    }
    if user == PROVIDER_USER {
        match st.provider.sandbox(&sb.provider_id).make_dir(&path).await {
            Ok(e) => return Ok(json!({"entry": describe(&st, &sb, &e).await})),
            Err(e) if denied(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let out = as_root(&st, &sb, &format!("cannot make directory {path}"), &make_dir_script(), &[&path, user]).await?;
    let e = stat_entry(&path, out.lines().last().unwrap_or(""))?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_move, MoveRequest, |st, sb, r, user| {
    let user = user.as_deref().unwrap_or(PROVIDER_USER);
    let (src, dst) = (resolve_for(&r.source, user)?, resolve_for(&r.destination, user)?);
    if st.mutants.has(Fault::RenameCopies) {
        let out =
            as_root(&st, &sb, "cannot copy", r#"cp -a -- "$1" "$2" && stat -c '%f %s %Y' -- "$2""#, &[&src, &dst])
                .await?;
        return Ok(json!({"entry": describe(&st, &sb, &stat_entry(&dst, out.lines().last().unwrap_or(""))?).await}));
    }
    let quick = async {
        st.provider.sandbox(&sb.provider_id).stat(&src).await.map_err(|e| (e.kind == ErrorKind::NotFound, e))?;
        if let Some((parent, _)) = dst.rsplit_once('/') {
            if !parent.is_empty() {
                st.provider.sandbox(&sb.provider_id).make_dir(parent).await.map_err(|e| (false, e))?;
            }
        }
        st.provider.sandbox(&sb.provider_id).rename(&src, &dst).await.map_err(|e| (false, e))
    };
    match quick.await {
        Ok(e) => return Ok(json!({"entry": describe(&st, &sb, &e).await})),
        Err((true, _)) => return Err(RpcError::not_found(format!("file not found: {src}"))),
        Err((_, e)) if denied(&e) => {}
        Err((_, e)) => return Err(e.into()),
    }
    let out = as_root(&st, &sb, &format!("cannot move {src} to {dst}"), &move_script(), &[&src, &dst, user]).await?;
    let e = stat_entry(&dst, out.lines().last().unwrap_or(""))?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_remove, PathRequest, |st, sb, r, user| {
    let user = user.as_deref().unwrap_or(PROVIDER_USER);
    let path = resolve_for(&r.path, user)?;
    if st.mutants.has(Fault::RemoveKeepsFile) {
        return Ok(json!({}));
    }
    match st.provider.sandbox(&sb.provider_id).remove(&path).await {
        Ok(()) => Ok(json!({})),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(json!({})),
        Err(e) if denied(&e) && path != "/" => {
            as_root(&st, &sb, &format!("cannot remove {path}"), REMOVE_SCRIPT, &[&path]).await?;
            Ok(json!({}))
        }
        Err(e) => Err(e.into()),
    }
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_strings() {
        assert_eq!(permissions("file", 0o644), "-rw-r--r--");
        assert_eq!(permissions("dir", 0o755), "drwxr-xr-x");
    }
}

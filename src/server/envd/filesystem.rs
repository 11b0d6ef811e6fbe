//! envd's `filesystem.Filesystem` service, its entry methods: `Stat`, `ListDir`, `MakeDir`,
//! `Move` and `Remove`, and `EntryInfo` as envd reports it (Go's permission string, the owner,
//! a symbolic link described by what it leads to, `user.e2b.*` metadata). The service's
//! watchers are in `watch`.

use std::sync::Arc;

use axum::body::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};

use super::resolve;
use crate::provider::{ErrorKind, FileEntry, ProviderError};
use crate::server::connect::{self, lenient, RpcError, Unary};
use crate::server::{AppState, ServedSandbox};

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
        "modifiedTime": crate::server::rfc3339(e.modified),
    })
}

/// Most links followed in a row, as the kernel's `ELOOP` limit.
const MAX_LINKS: usize = 40;

/// Where the symbolic link `path` leads: the absolute path it resolves to and what is there,
/// or `None` when it dangles or loops.
async fn follow_link(st: &AppState, sb: &ServedSandbox, path: &str) -> Option<(String, FileEntry)> {
    let mut cur = path.to_string();
    for _ in 0..MAX_LINKS {
        let target = st.provider.read_link(&sb.provider_id, &cur).await.ok()?;
        let base = cur.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
        cur = resolve(&if target.starts_with('/') { target } else { format!("{base}/{target}") }).ok()?;
        let e = st.provider.stat(&sb.provider_id, &cur).await.ok()?;
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
    if let Ok(m) = st.provider.file_metadata(&sb.provider_id, &e.path).await {
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
    let e = st.provider.stat(&sb.provider_id, &path).await.map_err(file_not_found(&path))?;
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
    let entries = match st.provider.list_dir(&sb.provider_id, &root).await {
        Ok(v) => v,
        Err(e) if e.kind == ErrorKind::NotFound => {
            return Err(RpcError::not_found(format!("directory not found: {path}")))
        }
        Err(e) if e.message.starts_with("not a directory") => {
            return Err(RpcError::invalid(format!("path is not a directory: {path}")))
        }
        Err(e) => return Err(e.into()),
    };
    // Reported under the requested path, not where a symbolic link root leads.
    let shown = |e: FileEntry, dir: &str| FileEntry { path: format!("{}/{}", dir.trim_end_matches('/'), e.name), ..e };
    let mut stack: Vec<(FileEntry, String, u32)> =
        entries.into_iter().rev().map(|e| (e.clone(), shown(e, &path).path, 1)).collect();
    let mut out = Vec::new();
    while let Some((e, at, level)) = stack.pop() {
        out.push(describe(&st, &sb, &FileEntry { path: at.clone(), ..e.clone() }).await);
        if e.kind == "dir" && level < depth {
            // Vanished or unreadable below the root: skipped.
            if let Ok(children) = st.provider.list_dir(&sb.provider_id, &e.path).await {
                stack.extend(children.into_iter().rev().map(|c| {
                    let p = shown(c.clone(), &at).path;
                    (c, p, level + 1)
                }));
            }
        }
    }
    Ok(json!({ "entries": out }))
});

unary_fn!(fs_make_dir, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    match st.provider.stat(&sb.provider_id, &path).await {
        Ok(e) if e.kind == "dir" => {
            return Err(RpcError::new("already_exists", format!("directory already exists: {path}")))
        }
        Ok(_) => return Err(RpcError::invalid(format!("path already exists but it is not a directory: {path}"))),
        Err(e) if e.kind == ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let e = st.provider.make_dir(&sb.provider_id, &path).await?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_move, MoveRequest, |st, sb, r| {
    let (src, dst) = (resolve(&r.source)?, resolve(&r.destination)?);
    st.provider.stat(&sb.provider_id, &src).await.map_err(file_not_found(&src))?;
    if let Some((parent, _)) = dst.rsplit_once('/') {
        if !parent.is_empty() {
            st.provider.make_dir(&sb.provider_id, parent).await?;
        }
    }
    let e = st.provider.rename(&sb.provider_id, &src, &dst).await?;
    Ok(json!({"entry": describe(&st, &sb, &e).await}))
});

unary_fn!(fs_remove, PathRequest, |st, sb, r| {
    let path = resolve(&r.path)?;
    match st.provider.remove(&sb.provider_id, &path).await {
        Ok(()) => Ok(json!({})),
        Err(e) if e.kind == ErrorKind::NotFound => Ok(json!({})),
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

//! envd's users and paths, shared by envd's services, `/files` and its signatures (`auth`):
//! the user a request selects with Basic auth, the default user of `/files`, a user's home,
//! and envd's path resolution: empty → `/home/user`, `~` and `~/x` → the home directory,
//! relative → under the home directory.

use axum::http::{header, HeaderMap};
use base64::Engine;

use super::connect::RpcError;

const HOME: &str = "/home/user";

/// envd's path resolution (see the module documentation).
pub(crate) fn resolve(path: &str) -> Result<String, RpcError> {
    resolve_in(path, HOME)
}

/// The home directory of sandbox user `user`, as the base images make them.
pub(crate) fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".into()
    } else {
        format!("/home/{user}")
    }
}

/// [`resolve`] for a request made as a user whose home is `home`.
pub(crate) fn resolve_in(path: &str, home: &str) -> Result<String, RpcError> {
    let home = home.trim_end_matches('/');
    let p = if path.is_empty() || path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('~') {
        return Err(RpcError::invalid(format!("invalid path '{path}': only ~ and ~/ are supported")));
    } else {
        path.to_string()
    };
    let full = if p.starts_with('/') { p } else { format!("{home}/{p}") };
    let mut parts: Vec<&str> = Vec::new();
    for c in full.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    if full.contains('\0') {
        return Err(RpcError::invalid(format!("invalid path: {path:?}")));
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The user an envd request selects with `Authorization: Basic base64("<user>:")` (protocol
/// doc §3.3); none means the sandbox's default user.
pub(crate) fn basic_user(h: &HeaderMap) -> Option<String> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let user = text.split(':').next().unwrap_or_default();
    (!user.is_empty()).then(|| user.to_string())
}

/// The user a `/files` request names neither in `username=` nor in Basic auth acts as.
pub(crate) const DEFAULT_USER: &str = "user";

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn paths_resolve_like_envd() {
        assert_eq!(resolve("").unwrap(), "/home/user");
        assert_eq!(resolve("~").unwrap(), "/home/user");
        assert_eq!(resolve("~/a/b").unwrap(), "/home/user/a/b");
        assert_eq!(resolve("a.txt").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve("/tmp/../etc").unwrap(), "/etc");
        assert!(resolve("~root/x").is_err());
    }

    #[test]
    fn basic_auth_selects_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic cm9vdDo=")); // root:
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer cm9vdDo="));
        assert_eq!(basic_user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic Og==")); // ":"
        assert_eq!(basic_user(&h), None);
    }
}

//! create's `volumes` (`specs/sandbox-lifecycle.yml`, `Volume`): host directories and named
//! volumes bound into the sandbox, read-write or read-only, whole or one `subPath` of them.
//!
//! * `host` binds a directory of serve's machine. The reference server takes any path unless
//!   its `storage.allowed_host_paths` narrows it; serve takes none unless `--host-volume-prefix`
//!   names where they may come from (a client with the API key must not be able to bind `/`).
//!   Below the prefix no symbolic link is followed (a link there is refused, where the
//!   reference resolves it): the path is opened beneath the prefix's descriptor and mounted
//!   from that descriptor (`crate::hostfs`). A missing directory under an allowed prefix is
//!   made, as there.
//! * `pvc` is a named volume: a directory `<--volumes-dir>/<claimName>` that outlives the
//!   sandboxes and serve (as a Docker named volume does), made on first use when
//!   `createIfNotExists` (the SDKs' default), else 400 `VOLUME::PVC_VOLUME_NOT_FOUND`. It is
//!   made mode 0777: a sandbox's root is an unprivileged user of the host. A `subPath` is
//!   opened (and made) beneath the volume's descriptor, a link in it refused.
//! * `ossfs` (an OSS bucket through FUSE) and `deleteOnSandboxTermination` are refused by
//!   name (501), never accepted and ignored.
//!
//! Errors use the reference server's codes (`VOLUME::…`, 400).

use std::path::{Path, PathBuf};

use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use crate::hostfs::{BeneathError, HostDir};
use crate::provider::Mount;
use crate::server::answer::error;

/// Where volumes may come from (serve's flags).
#[derive(Debug, Clone, Default)]
pub struct VolumeConfig {
    /// Host directories under which `host` volumes may be bound; none: `host` volumes are
    /// refused.
    pub host_prefixes: Vec<PathBuf>,
    /// Where named (`pvc`) volumes live.
    pub dir: PathBuf,
}

impl VolumeConfig {
    /// The default directory of named volumes: `$XDG_STATE_HOME/scenario-run/serve-volumes`,
    /// else `$HOME/.local/state/scenario-run/serve-volumes`.
    pub fn default_dir() -> PathBuf {
        crate::server::tls::default_ca_dir().with_file_name("serve-volumes")
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Volume {
    #[serde(default)]
    name: String,
    #[serde(default)]
    host: Option<Host>,
    #[serde(default)]
    pvc: Option<Pvc>,
    #[serde(default)]
    ossfs: Option<serde_json::Value>,
    #[serde(default)]
    mount_path: String,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    sub_path: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Host {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pvc {
    #[serde(default)]
    claim_name: String,
    #[serde(default = "yes")]
    create_if_not_exists: bool,
    #[serde(default)]
    delete_on_sandbox_termination: bool,
}

fn yes() -> bool {
    true
}

fn bad(code: &str, message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, code, message)
}

/// A DNS label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63), as Kubernetes names volumes.
fn dns_label(s: &str) -> bool {
    k8s_name(s, 63, b"-")
}

/// A Kubernetes resource name (DNS subdomain: lowercase, digits, `-` and `.`, at most 253):
/// also a safe directory name (no `/`, never `.` or `..`).
fn resource_name(s: &str) -> bool {
    k8s_name(s, 253, b"-.")
}

/// 1 to `max` lowercase letters, digits and `inner` characters, beginning and ending with a
/// letter or digit.
fn k8s_name(s: &str, max: usize, inner: &[u8]) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= max
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || inner.contains(c))
}

/// An absolute path of plain components (no `.`, `..`, `//` or trailing `/`).
fn normal_absolute(p: &str) -> bool {
    p.starts_with('/') && p.len() > 1 && p[1..].split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// A relative path of plain components.
fn normal_relative(p: &str) -> bool {
    !p.starts_with('/') && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// The mounts of create's `volumes`, their directories made where that is asked for.
pub(super) fn mounts(cfg: &VolumeConfig, volumes: Vec<Volume>) -> Result<Vec<Mount>, Response> {
    let mut out: Vec<Mount> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for v in volumes {
        if !dns_label(&v.name) {
            return Err(bad(
                "VOLUME::INVALID_NAME",
                format!("Volume name '{}' must be a valid DNS label (lowercase letters, digits, '-').", v.name),
            ));
        }
        if !names.insert(v.name.clone()) {
            return Err(bad("VOLUME::DUPLICATE_NAME", format!("Duplicate volume name '{}'.", v.name)));
        }
        if !normal_absolute(&v.mount_path) {
            return Err(bad(
                "VOLUME::INVALID_MOUNT_PATH",
                format!("Mount path '{}' must be a normalized absolute path other than '/'.", v.mount_path),
            ));
        }
        if out.iter().any(|m| m.path == v.mount_path) {
            return Err(bad("VOLUME::DUPLICATE_MOUNT_PATH", format!("Duplicate mount path '{}'.", v.mount_path)));
        }
        let sub = v.sub_path.as_deref().filter(|s| !s.is_empty());
        if let Some(s) = sub {
            if !normal_relative(s) {
                return Err(bad(
                    "VOLUME::INVALID_SUB_PATH",
                    format!("SubPath '{s}' must be a relative path without '.' or '..' components."),
                ));
            }
        }
        let backends = [v.host.is_some(), v.pvc.is_some(), v.ossfs.is_some()].iter().filter(|b| **b).count();
        if backends != 1 {
            return Err(bad(
                "VOLUME::INVALID_BACKEND",
                format!("Volume '{}' must specify exactly one backend (host, pvc, ossfs).", v.name),
            ));
        }
        let host = if let Some(h) = &v.host {
            host_dir(cfg, &v.name, &h.path, sub)?
        } else if let Some(p) = &v.pvc {
            named_dir(cfg, &v.name, p, sub)?
        } else {
            return Err(error(
                StatusCode::NOT_IMPLEMENTED,
                "SANDBOX::API_NOT_SUPPORTED",
                format!("Volume '{}': ossfs volumes: not supported by scenario-run serve", v.name),
            ));
        };
        out.push(Mount { host, path: v.mount_path, read_only: v.read_only });
    }
    Ok(out)
}

/// `path` (with `sub`) as a directory under one of the allowed prefixes, made if missing.
///
/// The prefix is the operator's and is opened by name; everything below it is opened beneath
/// the prefix's descriptor without following any link (`hostfs`), and the mount is made from
/// the descriptor so checked, never from the name again.
fn host_dir(cfg: &VolumeConfig, name: &str, path: &str, sub: Option<&str>) -> Result<HostDir, Response> {
    if !normal_absolute(path) {
        return Err(bad(
            "VOLUME::INVALID_HOST_PATH",
            format!("Host path '{path}' must be a normalized absolute path other than '/'."),
        ));
    }
    let not_allowed = || {
        bad(
            "VOLUME::HOST_PATH_NOT_ALLOWED",
            if cfg.host_prefixes.is_empty() {
                format!(
                    "Host path '{path}' is not allowed: this server allows no host paths (serve --host-volume-prefix)."
                )
            } else {
                format!(
                    "Host path '{path}' is not under any allowed prefix. Allowed prefixes: {:?}",
                    cfg.host_prefixes.iter().map(|p| p.display().to_string()).collect::<Vec<_>>()
                )
            },
        )
    };
    let wanted = match sub {
        Some(s) => Path::new(path).join(s),
        None => PathBuf::from(path),
    };
    // The longest allowed prefix the path lies under, as written (lexically: nothing is
    // resolved by name below it).
    // Each prefix as the operator wrote it and with its links resolved.
    // trusted: the prefixes are the operator's flags; nothing below them is resolved by name.
    let prefixes = cfg.host_prefixes.iter().flat_map(|p| [Some(p.clone()), p.canonicalize().ok()]).flatten();
    let Some(prefix) = prefixes.filter(|pre| wanted.starts_with(pre)).max_by_key(|p| p.as_os_str().len()) else {
        return Err(not_allowed());
    };
    let rel = wanted.strip_prefix(&prefix).expect("checked");
    let base = HostDir::open_trusted(&prefix).map_err(|e| {
        eprintln!("serve: volume '{name}': cannot open the allowed prefix {}: {e}", prefix.display());
        bad(
            "VOLUME::HOST_PATH_NOT_ALLOWED",
            format!("Volume '{name}': the allowed prefix of '{path}' cannot be opened."),
        )
    })?;
    if rel.as_os_str().is_empty() {
        return Ok(base);
    }
    base.beneath(rel, Some(0o755)).map_err(|e| refused(name, path, e, "VOLUME::INVALID_HOST_PATH"))
}

/// A path below a volume's root that could not be opened or made by the rules of `hostfs`.
fn refused(name: &str, shown: &str, e: BeneathError, code: &str) -> Response {
    match e {
        BeneathError::Io(e) => {
            eprintln!("serve: volume '{name}': {shown}: {e}");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "VOLUME::HOST_PATH_CREATE_FAILED",
                format!("Volume '{name}': could not prepare '{shown}'."),
            )
        }
        e => bad(code, format!("Volume '{name}': '{shown}' is refused: {e}.")),
    }
}

/// The named volume's directory (with `sub`), made if asked.
fn named_dir(cfg: &VolumeConfig, name: &str, pvc: &Pvc, sub: Option<&str>) -> Result<HostDir, Response> {
    if !resource_name(&pvc.claim_name) {
        return Err(bad(
            "VOLUME::INVALID_PVC_NAME",
            format!("PVC claim name '{}' must be a valid Kubernetes resource name.", pvc.claim_name),
        ));
    }
    if pvc.delete_on_sandbox_termination {
        return Err(error(
            StatusCode::NOT_IMPLEMENTED,
            "SANDBOX::API_NOT_SUPPORTED",
            format!("Volume '{name}': deleteOnSandboxTermination: not supported by scenario-run serve"),
        ));
    }
    let failed = |e: std::io::Error| {
        eprintln!("serve: volume '{name}': named volume '{}': {e}", pvc.claim_name);
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "VOLUME::PVC_VOLUME_INSPECT_FAILED",
            format!("Volume '{name}': cannot prepare named volume '{}'.", pvc.claim_name),
        )
    };
    // The volumes' directory is serve's own; each volume in it is shared with sandboxes, so
    // from here on everything is opened beneath a descriptor.
    let volumes = HostDir::create_trusted(&cfg.dir).map_err(failed)?;
    let claim = Path::new(&pvc.claim_name);
    // A sandbox's root is an unprivileged user of the host: what is made is mode 0777.
    let make = pvc.create_if_not_exists.then_some(0o777);
    let root = match volumes.beneath(claim, make) {
        Ok(d) => d,
        Err(BeneathError::Missing) => {
            return Err(bad(
                "VOLUME::PVC_VOLUME_NOT_FOUND",
                format!("Volume '{name}': named volume '{}' does not exist.", pvc.claim_name),
            ))
        }
        Err(e) => return Err(refused(name, &pvc.claim_name, e, "VOLUME::INVALID_PVC_NAME")),
    };
    let Some(s) = sub else { return Ok(root) };
    // The sub path is made inside the volume (as Kubernetes' subPath is), and a link a
    // sandbox put there is refused, never followed.
    root.beneath(Path::new(s), Some(0o777)).map_err(|e| refused(name, s, e, "VOLUME::INVALID_SUB_PATH"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked() {
        assert!(normal_absolute("/mnt/data"));
        for p in ["/", "mnt", "/mnt/../etc", "/mnt//x", "/mnt/", "/./x"] {
            assert!(!normal_absolute(p), "{p}");
        }
        assert!(normal_relative("datasets/train"));
        for p in ["/x", "../x", "a/../b", "a//b", ""] {
            assert!(!normal_relative(p), "{p}");
        }
        assert!(resource_name("opensandbox-e2e-pvc-test"));
        for n in ["", "..", "a/b", "Upper", "-x"] {
            assert!(!resource_name(n), "{n}");
        }
    }

    #[test]
    fn host_paths_need_an_allowed_prefix() {
        let tmp = std::env::temp_dir().join(format!("sr-vol-test-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("ok")).unwrap();
        std::os::unix::fs::symlink("/", tmp.join("ok/escape")).unwrap();
        let none = VolumeConfig::default();
        assert!(host_dir(&none, "v", tmp.join("ok").to_str().unwrap(), None).is_err());
        let cfg = VolumeConfig { host_prefixes: vec![tmp.join("ok")], dir: tmp.join("named") };
        assert!(host_dir(&cfg, "v", tmp.join("ok").to_str().unwrap(), None).is_ok());
        assert!(host_dir(&cfg, "v", tmp.join("ok/new").to_str().unwrap(), None).is_ok());
        assert!(host_dir(&cfg, "v", "/etc", None).is_err());
        assert!(host_dir(&cfg, "v", tmp.join("ok/escape").to_str().unwrap(), None).is_err(), "a link out");
        assert!(host_dir(&cfg, "v", tmp.join("ok/escape/etc").to_str().unwrap(), None).is_err(), "a link out");
        assert!(host_dir(&cfg, "v", tmp.join("okay").to_str().unwrap(), None).is_err(), "a sibling");
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}

//! What a create's `image.uri` starts: one of serve's templates, or a template serve builds
//! `FROM` the image.
//!
//! * OpenSandbox's own images stand for serve's template of the same role:
//!   `opensandbox/code-interpreter[:tag]` is `code-interpreter-v1`, the code interpreter
//!   (its Jupyter kernels behind execd's `/code`, see `code`). That image's documented
//!   entrypoint (`/opt/code-interpreter/code-interpreter.sh`, which starts Jupyter) is the
//!   template's own start command, so a create naming it does not run it again; its
//!   `JUPYTER_PORT`/`JUPYTER_HOST` say where the runtime listens (49999 here, 44771 in the
//!   image), which the code-interpreter SDK probes before it is ready.
//! * A name of serve's templates (`base`, `code-interpreter-v1`, a template built through the
//!   E2B template API, by name or id) is that template.
//! * Anything else is an image: a template `FROM` it is built once per image and registry
//!   login, as the local provider builds any `FROM` (a public name of the offline image
//!   table, or `host[:port]/repo:tag` pulled from its registry with `image.auth`). An image
//!   it cannot have (a Docker Hub name outside the table: Docker Hub is out of reach here) is
//!   refused with the image layer's words (`DOCKER::SANDBOX_IMAGE_PULL_FAILED`).

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::lifecycle::ImageAuth;
use super::records::Images;
use crate::server::answer::error;
use crate::server::state::AppState;

/// An OpenSandbox image and the template of serve's it stands for.
struct Alias {
    image: &'static str,
    template: &'static str,
    /// The image's own entrypoint, which the template's start command plays.
    entrypoint: &'static str,
    /// The image's environment that differs in the template.
    env: &'static [(&'static str, &'static str)],
}

const ALIASES: &[Alias] = &[Alias {
    image: "opensandbox/code-interpreter",
    template: "code-interpreter-v1",
    entrypoint: "/opt/code-interpreter/code-interpreter.sh",
    env: &[("JUPYTER_PORT", "49999"), ("JUPYTER_HOST", "http://127.0.0.1:49999")],
}];

/// serve's templates that are always there (the provider's `base`, the official one serve
/// builds on first use).
const BUILT_IN: &[&str] = &["base", "code-interpreter-v1"];

/// A resolved `image.uri`.
pub(super) struct Resolved {
    pub template: String,
    /// The image's own entrypoint, which the template's start command plays.
    pub entrypoint: Option<&'static str>,
    /// The image's environment, under the create's.
    pub env: &'static [(&'static str, &'static str)],
}

/// The repository of an image reference, without tag or digest, registry prefix `docker.io/`
/// and namespace `library/`.
fn repository(uri: &str) -> &str {
    let no_digest = uri.split('@').next().unwrap_or(uri);
    let last_slash = no_digest.rfind('/').map_or(0, |i| i + 1);
    let repo = match no_digest[last_slash..].find(':') {
        Some(i) => &no_digest[..last_slash + i],
        None => no_digest,
    };
    let repo = repo.strip_prefix("docker.io/").unwrap_or(repo);
    repo.strip_prefix("library/").unwrap_or(repo)
}

impl Images {
    pub(super) fn template_ids(&self) -> Vec<String> {
        self.built.lock().expect("images").values().cloned().collect()
    }

    pub(super) async fn resolve(
        &self,
        st: &Arc<AppState>,
        uri: &str,
        auth: Option<&ImageAuth>,
    ) -> Result<Resolved, Response> {
        let uri = uri.trim();
        if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "SANDBOX::INVALID_PARAMETER",
                format!("invalid image uri {uri:?}"),
            ));
        }
        if let Some(a) = ALIASES.iter().find(|a| repository(uri) == a.image) {
            return Ok(Resolved { template: a.template.to_string(), entrypoint: Some(a.entrypoint), env: a.env });
        }
        let known = BUILT_IN.contains(&uri)
            || st.templates.resolve(uri) != uri
            || st.templates.ids().iter().any(|id| id == uri)
            || st.snapshots.resolve(uri).is_some();
        if known {
            return Ok(Resolved { template: uri.to_string(), entrypoint: None, env: &[] });
        }
        let user = auth.map(|a| a.username.as_str()).unwrap_or("");
        let key = format!("{uri}\0{user}");
        if let Some(t) = self.built.lock().expect("images").get(&key) {
            return Ok(Resolved { template: t.clone(), entrypoint: None, env: &[] });
        }
        let id = format!("osb-image-{}", &format!("{:x}", Sha256::digest(key.as_bytes()))[..16]);
        build(st, &id, uri, auth).await?;
        self.built.lock().expect("images").insert(key, id.clone());
        Ok(Resolved { template: id, entrypoint: None, env: &[] })
    }
}

/// Builds template `id`: `FROM uri`, nothing else.
async fn build(st: &Arc<AppState>, id: &str, uri: &str, auth: Option<&ImageAuth>) -> Result<(), Response> {
    let fail = |m: String| error(StatusCode::INTERNAL_SERVER_ERROR, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", m);
    let dir =
        std::env::temp_dir().join(format!("scenario-run-osb-image-{}-{}", std::process::id(), crate::random::hex(6)));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("Dockerfile"), format!("FROM {uri}\n"))?;
        std::fs::write(dir.join("template.yaml"), format!("name: {}\n", serde_json::Value::String(id.to_string())))
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_dir_all(&dir);
        return Err(fail(format!("cannot prepare the build of image {uri}: {e}")));
    }
    let loaded = crate::templates::TemplateDir::load(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    let mut template = loaded.map_err(|e| fail(format!("image {uri}: {e}")))?;
    template.digest = format!("sha256:{:x}", Sha256::digest(format!("opensandbox image {uri}").as_bytes()));
    let spec = crate::provider::BuildSpec {
        template,
        build_args: Default::default(),
        keep: false,
        skip_cache: false,
        from_auth: auth
            .map(|a| crate::image::RegistryAuth { username: a.username.clone(), password: a.password.clone() }),
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let drain = tokio::spawn(async move { while rx.recv().await.is_some() {} });
    crate::errln!("serve: building a template from image {uri} (first create that names it)");
    let r = st.provider.build(spec, tx).await;
    let _ = drain.await;
    r.map(|_| ()).map_err(|e| {
        let status = match e.kind {
            crate::provider::ErrorKind::NotFound | crate::provider::ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        error(status, "DOCKER::SANDBOX_IMAGE_PULL_FAILED", format!("image {uri} cannot be used: {}", e.message))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories() {
        assert_eq!(repository("opensandbox/code-interpreter:latest"), "opensandbox/code-interpreter");
        assert_eq!(repository("docker.io/opensandbox/code-interpreter:v1.0"), "opensandbox/code-interpreter");
        assert_eq!(repository("localhost:5000/x/y:tag"), "localhost:5000/x/y");
        assert_eq!(repository("python@sha256:abc"), "python");
        assert_eq!(repository("library/python:3.11"), "python");
    }
}

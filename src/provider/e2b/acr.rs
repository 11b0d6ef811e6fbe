//! The alicloud ACR path of `build`/`deploy`: the template image is built here, on a Docker
//! engine, pushed to Alibaba Container Registry, and the platform makes the template from
//! that image (`fromImage` with `fromImageRegistry` credentials and no steps; protocol doc
//! §8.3, agent-sandbox doc §7.2). It is taken on `--provider alicloud` when
//! `SCENARIO_RUN_ACR_REGISTRY` is set (settings: [`super::config::Acr`]).
//!
//! The engine is the docker provider's (`DOCKER_HOST`), and so is the build: the template
//! folder as context, the build log streamed into the step's evidence, a failing instruction
//! named as `Dockerfile:<line>`. The image is tagged `<push registry>/<name>:<digest12>`
//! (content-addressed, so a later run pushes the same tag again) and the platform is given
//! `<pull registry>/<name>:<digest12>`. Each digest is built and pushed once per run; the
//! engine's tags are removed at the end of the run unless the build is kept. The pushed
//! image stays in ACR (deleting it would be another signed OpenAPI call this tool does not make).
//!
//! The registry login ([`AcrLogin`]) is `ACR_USERNAME`/`ACR_PASSWORD`, or a temporary login
//! that ACR's `GetAuthorizationToken` gives for the AccessKey pair (the `acs` module signs
//! that call); the temporary one is asked for once and again when less than five minutes of
//! its hour are left. It goes to the engine for the push (`X-Registry-Auth`) and to the platform
//! in the build request body; it is never logged, and the build log and errors are masked of
//! it (every encoded form, as the run's masker does for the secrets it knows from the
//! environment: the token is not one of them).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OnceCell};

use super::acs;
use super::config::{Acr, AcrLogin};
use crate::image::RegistryAuth;
use crate::mask::Masker;
use crate::provider::docker::{image_tag, DockerOptions, DockerProvider};
use crate::provider::Result;
use crate::templates::BuildSpec;

/// A temporary login is asked for again when less than this is left of it.
const RENEW_BEFORE: Duration = Duration::from_secs(300);
/// How long a temporary login is taken to last when ACR does not say (its documented hour).
const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

pub(crate) struct AcrImages {
    acr: Acr,
    docker: DockerProvider,
    http: reqwest::Client,
    /// The temporary login from `GetAuthorizationToken`, until when it is used.
    temp: tokio::sync::Mutex<Option<(RegistryAuth, Instant)>>,
    /// Digest → the pull reference of its pushed image.
    pushed: Mutex<HashMap<String, Arc<OnceCell<String>>>>,
    /// Engine tags to remove at the end of the run.
    local: Mutex<Vec<String>>,
}

impl AcrImages {
    pub fn new(acr: Acr, env: &BTreeMap<String, String>, http: reqwest::Client) -> Self {
        Self {
            acr,
            docker: DockerProvider::new(DockerOptions::from_env(env)),
            http,
            temp: tokio::sync::Mutex::new(None),
            pushed: Mutex::new(HashMap::new()),
            local: Mutex::new(Vec::new()),
        }
    }

    /// The registry login: the configured one, or a temporary one from ACR's
    /// `GetAuthorizationToken` (asked for now, or earlier in this run and still good).
    pub async fn registry_auth(&self, log: &mpsc::UnboundedSender<String>) -> Result<Option<RegistryAuth>> {
        match &self.acr.login {
            AcrLogin::None => Ok(None),
            AcrLogin::Password { username, password } => {
                Ok(Some(RegistryAuth { username: username.clone(), password: password.clone() }))
            }
            AcrLogin::AccessKey { key_id, key_secret, instance_id, endpoint } => {
                let mut temp = self.temp.lock().await;
                if let Some((auth, until)) = temp.as_ref() {
                    if Instant::now() + RENEW_BEFORE < *until {
                        return Ok(Some(auth.clone()));
                    }
                }
                let t = acs::get_authorization_token(&self.http, endpoint, instance_id, key_id, key_secret).await?;
                let now_ms = jiff::Timestamp::now().as_millisecond();
                let lifetime = t
                    .expires_ms
                    .map(|ms| Duration::from_millis(u64::try_from(ms - now_ms).unwrap_or(0)))
                    .unwrap_or(TOKEN_LIFETIME);
                let _ = log.send(format!(
                    "ACR login: a temporary login for instance {instance_id} from GetAuthorizationToken at {endpoint} \
                     (user {}, good for {} min)",
                    t.username,
                    lifetime.as_secs() / 60
                ));
                let auth = RegistryAuth { username: t.username, password: t.password };
                *temp = Some((auth.clone(), Instant::now() + lifetime));
                Ok(Some(auth))
            }
        }
    }

    /// The image of `spec` as the platform pulls it: built and pushed now, or earlier in this run.
    pub async fn image(&self, spec: &BuildSpec, log: &mpsc::UnboundedSender<String>) -> Result<String> {
        let t = &spec.template;
        let cell = self.pushed.lock().expect("pushed").entry(t.digest.clone()).or_default().clone();
        cell.get_or_try_init(|| async {
            let push = image_tag(&self.acr.registry, &t.def.name, &t.digest);
            let pull = image_tag(&self.acr.pull_registry, &t.def.name, &t.digest);
            let auth = self.registry_auth(log).await?;
            let _ = log.send(format!(
                "building {} ({}) on the Docker engine for ACR: push {push}{}",
                t.def.name,
                t.digest,
                if pull == push { String::new() } else { format!(", the platform pulls {pull}") }
            ));
            // The engine's log and errors reach the evidence masked of the login.
            let masker = masker(auth.as_ref());
            let (tx, mut rx) = mpsc::unbounded_channel::<String>();
            let out = log.clone();
            let m = masker.clone();
            let forward = tokio::spawn(async move {
                while let Some(line) = rx.recv().await {
                    let _ = out.send(m.mask(&line).into_owned());
                }
            });
            let login = auth.as_ref().map(|a| (a.username.as_str(), a.password.as_str()));
            let pushed = self.docker.build_and_push(spec, &push, login, tx).await;
            let _ = forward.await;
            pushed.map_err(|mut e| {
                e.message = masker.mask(&e.message).into_owned();
                e
            })?;
            if !spec.keep {
                self.local.lock().expect("local").push(push);
            }
            Ok(pull)
        })
        .await
        .cloned()
    }

    /// Removes the engine's tags of the images pushed by this run and not kept.
    pub async fn remove_local(&self) -> usize {
        let tags: Vec<String> = self.local.lock().expect("local").drain(..).collect();
        self.pushed.lock().expect("pushed").clear();
        let mut n = 0;
        for t in tags {
            if self.docker.remove_image(&t).await {
                n += 1;
            }
        }
        n
    }
}

/// A masker of the login's password (a registry password or a temporary token) in all its
/// encoded forms.
pub(crate) fn masker(auth: Option<&RegistryAuth>) -> Masker {
    Masker::new(auth.map(|a| a.password.clone()))
}

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
//! image stays in ACR: deleting it needs Alibaba's OpenAPI, which this tool does not sign.
//!
//! The registry login goes to the engine for the push (`X-Registry-Auth`) and to the platform
//! in the build request body; it is never logged, and text coming back is scrubbed of it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, OnceCell};

use super::build::RegistryAuth;
use super::config::Acr;
use crate::provider::docker::{image_tag, DockerOptions, DockerProvider};
use crate::provider::Result;
use crate::templates::BuildSpec;

pub(crate) struct AcrImages {
    acr: Acr,
    docker: DockerProvider,
    /// Digest → the pull reference of its pushed image.
    pushed: Mutex<HashMap<String, Arc<OnceCell<String>>>>,
    /// Engine tags to remove at the end of the run.
    local: Mutex<Vec<String>>,
}

impl AcrImages {
    pub fn new(acr: Acr, env: &BTreeMap<String, String>) -> Self {
        Self {
            acr,
            docker: DockerProvider::new(DockerOptions::from_env(env)),
            pushed: Mutex::new(HashMap::new()),
            local: Mutex::new(Vec::new()),
        }
    }

    /// The credentials the platform pulls with.
    pub fn registry_auth(&self) -> Option<RegistryAuth> {
        self.acr.login().map(|(u, p)| RegistryAuth { username: u.to_string(), password: p.to_string() })
    }

    /// The image of `spec` as the platform pulls it: built and pushed now, or earlier in this run.
    pub async fn image(&self, spec: &BuildSpec, log: &mpsc::UnboundedSender<String>) -> Result<String> {
        let t = &spec.template;
        let cell = self.pushed.lock().expect("pushed").entry(t.digest.clone()).or_default().clone();
        cell.get_or_try_init(|| async {
            let push = image_tag(&self.acr.registry, &t.def.name, &t.digest);
            let pull = image_tag(&self.acr.pull_registry, &t.def.name, &t.digest);
            let _ = log.send(format!(
                "building {} ({}) on the Docker engine for ACR: push {push}{}",
                t.def.name,
                t.digest,
                if pull == push { String::new() } else { format!(", the platform pulls {pull}") }
            ));
            self.docker.build_and_push(spec, &push, self.acr.login(), log.clone()).await?;
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

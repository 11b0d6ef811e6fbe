//! Templates: builds made once per digest (this run's, a kept one or the build cache's), and
//! what `create` stacks for one.

use super::errors::blocking;
use super::*;

impl Inner {
    /// The build of `spec`'s digest: made now, or the one this run (or a kept earlier one)
    /// made already. Returns the layer and whether it was reused.
    pub(super) async fn build(
        &self,
        spec: &BuildSpec,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<(Arc<Layer>, bool)> {
        if !self.namespaces {
            return Err(ProviderError::unsupported(
                "building templates needs namespace isolation (root, bubblewrap and nsenter)",
            ));
        }
        let digest = spec.template.digest.clone();
        // What the build is made from: the folder and the build arguments.
        let key = layer_cache::key(spec);
        // skip_cache: a cell of its own, which then stands for the key in this run.
        let cell = if spec.skip_cache {
            let _ = log.send("skip_cache: building again, reusing no earlier build".to_string());
            Default::default()
        } else {
            self.builds.lock().expect("builds").entry(key.clone()).or_default().clone()
        };
        let mut fresh = false;
        let layer = cell
            .get_or_try_init(|| async {
                let shared = build::build_dir(&self.state_dir, &spec.template.def.name, &digest);
                if let Some(layer) = build::reuse(&shared).filter(|l| l.keep && !spec.skip_cache) {
                    let _ = log.send(format!("reusing the kept build {} of {digest}", shared.display()));
                    return Ok(Arc::new(layer));
                }
                let cache_max = layer_cache::max_from_env().map_err(ProviderError::invalid)?;
                let entry = layer_cache::entry(&self.state_dir, &spec.template.def.name, &key);
                if !spec.keep && !spec.skip_cache && cache_max > 0 {
                    let e = entry.clone();
                    if let Some(layer) = blocking(move || Ok(layer_cache::take(&e))).await? {
                        let _ = log.send(format!(
                            "reusing the cached build {} of {digest} (`scenario-run cache` lists the cache)",
                            entry.display()
                        ));
                        return Ok(Arc::new(layer));
                    }
                }
                fresh = true;
                let dir = if spec.skip_cache { build::own_fresh_dir(&shared) } else { build::own_dir(&shared) };
                self.building.lock().expect("building").insert(dir.clone());
                let net = self.nets.take().await.map_err(|e| net_error("cannot make the build's network".into(), e))?;
                let mut r = build::build(spec, &dir, &self.images, net, log.clone()).await;
                if let (true, Ok(layer)) = (spec.keep, &r) {
                    let (layer, to) = (layer.clone(), shared.clone());
                    r = blocking(move || {
                        build::publish(layer, &to).map_err(|e| {
                            ProviderError::infra(format!("cannot keep the build as {}: {e}", to.display()))
                        })
                    })
                    .await;
                } else if let (true, Ok(_)) = (spec.skip_cache, &r) {
                    // The entry of this key (if any) stays as it is; this build is the run's.
                    let _ = log.send("not cached (skip_cache): this build is this run's only".to_string());
                } else if let (true, Ok(layer)) = (cache_max > 0, &r) {
                    // Into the cache; where that fails, the build stays this run's only.
                    let (l, to) = (layer.clone(), entry.clone());
                    match blocking(move || Ok(layer_cache::store(l, &to))).await? {
                        Ok(stored) => {
                            let _ = log.send(format!("cached as {}", entry.display()));
                            r = Ok(stored);
                        }
                        Err(e) => {
                            let _ = log.send(format!("not cached (cannot move it to {}: {e})", entry.display()));
                        }
                    }
                }
                self.building.lock().expect("building").remove(&dir);
                if r.is_err() {
                    // A failed build is never reused (or found by remove_builds): do not leave it.
                    let d = dir.clone();
                    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(d)).await;
                }
                r.map(Arc::new)
            })
            .await?
            .clone();
        if spec.skip_cache {
            crate::provider::registered::supersede(&mut self.builds.lock().expect("builds"), key, cell);
        }
        if !fresh {
            let _ = log.send(format!("cached: {} ({digest}) was built before; its log:", layer.name));
            for l in &layer.log {
                let _ = log.send(l.clone());
            }
        }
        Ok((layer, !fresh))
    }
}

/// What `create` stacks for a build (`deploy`: with the start and ready commands).
pub(super) fn registered(layer: &Arc<Layer>, def: &crate::templates::TemplateDef, deploy: bool) -> Registered {
    Registered::new(layer, def, deploy, layer.cmd.as_deref(), &layer.ports)
}

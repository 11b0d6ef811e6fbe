//! What a docker sandbox can do, one capability trait of [`crate::provider::caps`] an impl: each
//! finds the container by id and works in it through the engine's API.

use super::*;

#[async_trait]
impl core::ProcessHost for DockerProvider {
    type Proc = exec::Proc;

    fn with_table<R>(&self, id: &str, f: impl FnOnce(&core::Procs<exec::Proc>) -> R) -> Result<R> {
        let sb = self.get(id)?;
        Ok(f(&sb.procs))
    }

    async fn run(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        let sb = self.get(id)?;
        let p = sb.procs.launch(&req, output, false).await?;
        let mut guard = core::KillOnDrop(Some(p.clone()));
        let result = p.finish(req.timeout).await;
        guard.0 = None;
        sb.procs.remove(&p);
        Ok(result)
    }

    async fn start(&self, id: &str, req: ExecRequest, out: Option<OutputTx>, stdin: bool) -> Result<Arc<Self::Proc>> {
        let sb = self.get(id)?;
        let p = sb.procs.launch(&req, out, stdin).await?;
        core::kill_after(&p, req.timeout);
        Ok(p)
    }
}

#[async_trait]
impl crate::provider::Files for DockerProvider {
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        let sb = self.get(id)?;
        files::write(&sb.procs, &files::normalize(path)?, data, mode).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let sb = self.get(id)?;
        files::read(sb.procs.docker(), &sb.id, &files::normalize(path)?).await
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let sb = self.get(id)?;
        files::list(&sb.procs, &files::normalize(path)?).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let sb = self.get(id)?;
        files::stat(sb.procs.docker(), &sb.id, &files::normalize(path)?).await
    }

    async fn exists(&self, id: &str, path: &str) -> Result<bool> {
        let sb = self.get(id)?;
        files::exists(sb.procs.docker(), &sb.id, &files::normalize(path)?).await
    }

    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry> {
        let sb = self.get(id)?;
        files::make_dir(&sb.procs, &files::normalize(path)?).await
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry> {
        let sb = self.get(id)?;
        files::rename(&sb.procs, &files::normalize(from)?, &files::normalize(to)?).await
    }

    async fn remove(&self, id: &str, path: &str) -> Result<()> {
        let sb = self.get(id)?;
        files::remove(&sb.procs, &files::normalize(path)?).await
    }
}

#[async_trait]
impl crate::provider::Ports for DockerProvider {
    /// Not on the host's network: there every container shares the host's ports.
    fn isolated(&self) -> bool {
        !self.inner.opts.host_network
    }

    async fn port_url(&self, id: &str, port: u16) -> Result<String> {
        let sb = self.forwarded(id).await?;
        match sb.fwd.get().and_then(Option::as_ref) {
            Some(f) => Ok(format!(
                "http://127.0.0.1:{}",
                f.host_port(port).await.map_err(|e| {
                    ProviderError::infra(format!(
                        "{} (the engine's containers must be visible in this machine's /proc; \
                     else set SCENARIO_RUN_DOCKER_NETWORK=host)",
                        e.message
                    ))
                })?
            )),
            // Host networking: the container's port is the host's.
            None => Ok(format!("http://127.0.0.1:{port}")),
        }
    }
}

#[async_trait]
impl crate::provider::ExposeHost for DockerProvider {
    async fn expose_host(&self, id: &str, host: std::net::SocketAddr, port: u16) -> Result<String> {
        let sb = self.forwarded(id).await?;
        match sb.fwd.get().and_then(Option::as_ref) {
            Some(f) => {
                f.expose(port, host).await?;
                Ok(format!("http://127.0.0.1:{port}"))
            }
            // Host networking: the host's service is reachable as it is.
            None => Ok(format!("http://{host}")),
        }
    }
}

#[async_trait]
impl crate::provider::Builds for DockerProvider {
    async fn build(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<BuildOutput> {
        let (image, cached) = self.inner.build(&spec, log).await?;
        let def = &spec.template.def;
        let mut templates = self.inner.templates.lock().expect("templates");
        // A deploy of the same digest wins: building again must not drop its start command.
        let deployed = templates.get(&def.name).is_some_and(|t| t.start.is_some() && t.built.digest == image.digest);
        if !deployed {
            templates.insert(def.name.clone(), registered(&image, def, false));
        }
        Ok(BuildOutput { image: image.tag.clone(), digest: image.digest.clone(), cached })
    }

    async fn deploy(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<DeployOutput> {
        let (image, cached) = self.inner.build(&spec, log.clone()).await?;
        let def = &spec.template.def;
        let reg = registered(&image, def, true);
        let _ = log.send(reg.note(&format!("{} ({})", def.name, image.tag)));
        self.inner.templates.lock().expect("templates").insert(def.name.clone(), reg);
        Ok(DeployOutput {
            template_id: def.name.clone(),
            image: image.tag.clone(),
            digest: image.digest.clone(),
            cached,
        })
    }

    /// Removes the local tags of the builds not kept (the pushed copies stay in the registry:
    /// see `build::remove`).
    async fn remove_builds(&self) -> usize {
        self.inner.templates.lock().expect("templates").clear();
        let builds: Vec<_> = self.inner.builds.lock().expect("builds").drain().collect();
        let Ok(docker) = self.inner.client().await else { return 0 };
        let mut removed = 0;
        for (_, cell) in builds {
            if let Some(image) = cell.get().filter(|i| !i.keep) {
                if build::remove(docker, &image.tag).await {
                    removed += 1;
                }
            }
        }
        removed
    }
}

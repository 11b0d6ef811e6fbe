//! What a local sandbox can do, one capability trait of [`crate::provider::caps`] an impl: each
//! finds the sandbox by id in the provider's table and works in it through its root, its
//! process table or its namespaces.

use super::errors::blocking;
use super::templates::registered;
use super::*;

#[async_trait]
impl core::ProcessHost for LocalProvider {
    type Proc = process::Proc;

    fn with_table<R>(&self, id: &str, f: impl FnOnce(&core::Procs<process::Proc>) -> R) -> Result<R> {
        let sb = self.get(id)?;
        Ok(f(&sb.procs))
    }

    async fn run(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        let sb = self.get(id)?;
        let (target, env, cwd) = sb.plan(&req)?;
        let p = process::launch(&target, &env, &cwd, &req, output, false, None).await?;
        sb.procs.insert(p.clone());
        let mut guard = core::KillOnDrop(Some(p.clone()));
        let result = process::finish(&p, req.timeout).await;
        guard.0 = None;
        sb.procs.remove(&p);
        Ok(result)
    }

    async fn start(&self, id: &str, req: ExecRequest, out: Option<OutputTx>, stdin: bool) -> Result<Arc<Self::Proc>> {
        let sb = self.get(id)?;
        let (target, env, cwd) = sb.plan(&req)?;
        let p = process::launch(&target, &env, &cwd, &req, out, stdin, None).await?;
        sb.procs.insert(p.clone());
        core::kill_after(&p, req.timeout);
        Ok(p)
    }
}

#[async_trait]
impl crate::provider::Pty for LocalProvider {
    async fn spawn_pty(&self, id: &str, req: ExecRequest, cols: u16, rows: u16) -> Result<LiveProcess> {
        let sb = self.get(id)?;
        let (target, env, cwd) = sb.plan(&req)?;
        let root = sb.root()?;
        let term = blocking(move || pty::open(&root, cols, rows)).await?;
        let (tx, rx) = crate::provider::output_channel();
        let p = process::launch(&target, &env, &cwd, &req, Some(tx), false, Some(term)).await?;
        sb.procs.insert(p.clone());
        Ok(LiveProcess { pid: p.pid, output: rx })
    }

    async fn write_pty(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()> {
        self.get(id)?.procs.get(pid)?.write_pty(data).await
    }

    async fn resize_pty(&self, id: &str, pid: u32, cols: u16, rows: u16) -> Result<()> {
        self.get(id)?.procs.get(pid)?.resize_pty(cols, rows)
    }
}

#[async_trait]
impl crate::provider::Files for LocalProvider {
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.write(&abs, &data, mode)).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.read(&abs)).await
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.list(&abs)).await
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.stat(&abs)).await
    }

    async fn exists(&self, id: &str, path: &str) -> Result<bool> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.exists(&abs)).await
    }

    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.make_dir(&abs)).await
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry> {
        let root = self.get(id)?.root()?;
        let (from, to) = (files::normalize(from)?, files::normalize(to)?);
        blocking(move || root.rename(&from, &to)).await
    }

    async fn remove(&self, id: &str, path: &str) -> Result<()> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.remove(&abs)).await
    }
}

#[async_trait]
impl crate::provider::EnvdFiles for LocalProvider {
    async fn read_link(&self, id: &str, path: &str) -> Result<String> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        blocking(move || root.read_link(&abs)).await
    }

    async fn write_file_as(&self, id: &str, path: &str, data: Vec<u8>, user: &str) -> Result<FileEntry> {
        let sb = self.get(id)?;
        let (root, abs, who) = (sb.root()?, files::normalize(path)?, sb.identity(user)?);
        let as_root = root.acting_as(Identity::root());
        blocking(move || {
            // The directories the write will make: from the nearest missing ancestor down.
            let mut made = Vec::new();
            let mut dir = abs.rsplit_once('/').map(|(d, _)| d.to_string()).unwrap_or_default();
            while !dir.is_empty() && !as_root.exists(&dir)? {
                made.push(dir.clone());
                dir = dir.rsplit_once('/').map(|(d, _)| d.to_string()).unwrap_or_default();
            }
            let e = as_root.write(&abs, &data, None)?;
            for d in made.iter().rev() {
                as_root.chown(d, &who)?;
            }
            as_root.chown(&abs, &who)?;
            Ok(e)
        })
        .await
    }

    async fn read_file_as(&self, id: &str, path: &str, user: &str) -> Result<Vec<u8>> {
        let (root, abs) = self.root_as(id, path, user)?;
        blocking(move || root.read(&abs)).await
    }

    async fn open_file_as(&self, id: &str, path: &str, user: &str) -> Result<crate::provider::FileStream> {
        let (root, abs) = self.root_as(id, path, user)?;
        // Opened with the user's rights; what is read through it after needs none.
        let (f, len) = blocking(move || root.open_read(&abs)).await?;
        Ok(crate::provider::FileStream { len, reader: Box::pin(tokio::fs::File::from_std(f)) })
    }

    // As envd (which runs as root): any file's metadata, whoever owns it.
    async fn file_metadata(&self, id: &str, path: &str) -> Result<BTreeMap<String, String>> {
        let (root, abs) = (self.get(id)?.root()?.acting_as(Identity::root()), files::normalize(path)?);
        blocking(move || root.metadata(&abs)).await
    }

    async fn set_file_metadata(&self, id: &str, path: &str, metadata: BTreeMap<String, String>) -> Result<()> {
        let (root, abs) = (self.get(id)?.root()?.acting_as(Identity::root()), files::normalize(path)?);
        blocking(move || root.set_metadata(&abs, &metadata)).await
    }
}

#[async_trait]
impl crate::provider::WatchDirs for LocalProvider {
    async fn watch_dir(&self, id: &str, path: &str, recursive: bool) -> Result<Box<dyn crate::provider::DirWatch>> {
        let (root, abs) = (self.get(id)?.root()?, files::normalize(path)?);
        let w = blocking(move || watch::Watch::start(root, &abs, recursive)).await?;
        Ok(Box::new(w))
    }
}

#[async_trait]
impl crate::provider::Ports for LocalProvider {
    /// Without namespaces sandboxes share the host's ports.
    fn isolated(&self) -> bool {
        self.inner.namespaces
    }

    async fn port_url(&self, id: &str, port: u16) -> Result<String> {
        let sb = self.get(id)?;
        if !sb.alive() {
            return Err(ProviderError::infra(format!("sandbox {id} is not running")));
        }
        match sb.boot() {
            Some(b) => Ok(format!("http://127.0.0.1:{}", b.fwd.host_port(port).await?)),
            None => Ok(format!("http://127.0.0.1:{port}")),
        }
    }

    async fn dial(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream> {
        let sb = self.get(id)?;
        if !sb.alive() {
            return Err(ProviderError::infra(format!("sandbox {id} is not running")));
        }
        match sb.boot() {
            // Connected from inside the sandbox's network namespace: no host listener.
            Some(b) => b.fwd.connect(port).await,
            None => tokio::net::TcpStream::connect((std::net::Ipv4Addr::LOCALHOST, port))
                .await
                .map_err(|e| ProviderError::infra(format!("cannot connect to port {port}: {e}"))),
        }
    }
}

#[async_trait]
impl crate::provider::ExposeHost for LocalProvider {
    async fn expose_host(&self, id: &str, host: std::net::SocketAddr, port: u16) -> Result<String> {
        let sb = self.get(id)?;
        if !sb.alive() {
            return Err(ProviderError::infra(format!("sandbox {id} is not running")));
        }
        match sb.boot() {
            Some(b) => {
                b.fwd.expose(port, host).await?;
                Ok(format!("http://127.0.0.1:{port}"))
            }
            // The host's network is the sandbox's.
            None => Ok(format!("http://{host}")),
        }
    }
}

impl Sandbox {
    /// Pauses it: frozen with its memory, or (`keep_memory` false) shut down with only its
    /// writable layer kept. A paused sandbox does not expire. `pause` and the end of a sandbox
    /// whose lifecycle pauses it both come here.
    pub(super) async fn pause(&self, keep_memory: bool) -> Result<()> {
        let (sb, id) = (self, &self.id);
        if sb.is_paused() {
            return Ok(());
        }
        if keep_memory {
            sb.freezer()?
                .freeze(true)
                .await
                .map_err(|e| ProviderError::infra(format!("cannot pause sandbox {id}: {}", sys::errno_text(&e))))?;
        } else {
            // Filesystem-only: its processes end (as at a shutdown) and only its writable
            // layer stays; `resume` boots it again from that.
            let boot = sb.boot().ok_or_else(|| {
                ProviderError::unsupported("pausing needs isolated sandboxes (an overlay upper layer)")
            })?;
            sb.cold.store(true, std::sync::atomic::Ordering::SeqCst);
            boot.shut_down().await;
            sb.forget_processes().await;
            for p in sb.procs.all() {
                sb.procs.remove(&p);
            }
        }
        sb.paused.store(true, std::sync::atomic::Ordering::SeqCst);
        // A paused sandbox does not expire (E2B keeps paused sandboxes until resumed or killed).
        sb.life.set_end(u64::MAX / 2);
        Ok(())
    }
}

#[async_trait]
impl crate::provider::Pausing for LocalProvider {
    async fn pause(&self, id: &str, keep_memory: bool) -> Result<()> {
        self.get(id)?.pause(keep_memory).await
    }

    async fn resume(&self, id: &str, timeout_secs: u64) -> Result<()> {
        let sb = self.get(id)?;
        if sb.is_paused() && sb.is_cold() {
            self.inner.reboot(&sb).await?;
            sb.cold.store(false, std::sync::atomic::Ordering::SeqCst);
            sb.paused.store(false, std::sync::atomic::Ordering::SeqCst);
        } else if sb.is_paused() {
            sb.freezer()?
                .freeze(false)
                .await
                .map_err(|e| ProviderError::infra(format!("cannot resume sandbox {id}: {}", sys::errno_text(&e))))?;
            sb.paused.store(false, std::sync::atomic::Ordering::SeqCst);
        }
        sb.life.extend(timeout_secs);
        Ok(())
    }
}

#[async_trait]
impl crate::provider::Snapshots for LocalProvider {
    async fn delete_snapshot(&self, snapshot: &str) -> Result<bool> {
        Ok(crate::provider::Builds::remove_template(self, snapshot).await)
    }

    async fn snapshot(&self, id: &str, name: &str) -> Result<String> {
        let sb = self.get(id)?;
        if !matches!(sb.iso, Iso::Ns { .. }) {
            return Err(ProviderError::unsupported("snapshots need isolated sandboxes (an overlay upper layer)"));
        }
        // The writable layer is the whole difference from the template: copied (with its
        // whiteouts and overlay attributes) it becomes a layer stacked on the same lowers.
        // The sandbox is frozen meanwhile, where it can be, so the copy is of one moment.
        let freezer = sb.freezer().ok().filter(|_| !sb.is_paused());
        // Its processes cannot write while it is copied: frozen, or gone (filesystem-only pause).
        if let Some(f) = &freezer {
            f.freeze(true).await.map_err(|e| ProviderError::infra(format!("cannot freeze sandbox {id}: {e}")))?;
        }
        let dir = self.inner.state_dir.join(format!("snap-{}", crate::random::hex(6)));
        let (to, owner) = (dir.join("layer"), dir.join(crate::owner::FILE));
        // The upper directory is on the sandbox's disk: seen through the running sandbox's
        // mount namespace, or (a filesystem-only pause) mounted read-only for the copy.
        let Iso::Ns { layout, .. } = &sb.iso else { unreachable!("checked above") };
        let disk = layout.disk.clone().expect("an isolated sandbox has a disk");
        let live = sb.boot().filter(|_| !sb.is_cold()).map(|b| b.ns.host_view(&disk.upper()));
        let copied = tokio::task::spawn_blocking(move || -> std::io::Result<std::process::Output> {
            std::fs::create_dir_all(to.parent().expect("has a parent"))?;
            std::fs::write(owner, crate::owner::token())?;
            let mut cp = std::process::Command::new("cp");
            cp.arg("-a").arg(live.as_deref().unwrap_or(&disk.upper())).arg(&to);
            match live {
                Some(_) => cp.output(),
                None => disk::with_mounted(&disk, cp),
            }
        })
        .await
        .map_err(|e| ProviderError::infra(e.to_string()));
        if let Some(f) = &freezer {
            let _ = f.freeze(false).await;
        }
        match copied? {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(ProviderError::infra(format!(
                    "cannot copy the sandbox's filesystem: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Err(e) => {
                let _ = tokio::fs::remove_dir_all(&dir).await;
                return Err(ProviderError::infra(format!("cannot copy the sandbox's filesystem: {e}")));
            }
        }
        let layer = Arc::new(Layer {
            name: name.to_string(),
            digest: format!("snapshot-{}", crate::random::hex(8)),
            layer: dir.join("layer"),
            dir,
            image: PathBuf::new(),
            below: sb.lowers.clone(),
            image_ref: format!("snapshot of {}", sb.id),
            env: sb.template_envs.clone(),
            workdir: sb.workdir.clone(),
            user: None,
            cmd: None,
            ports: Vec::new(),
            log: Vec::new(),
            keep: false,
            image_stamp: None,
            hold: None,
        });
        self.inner
            .builds
            .lock()
            .expect("builds")
            .insert(layer.digest.clone(), Arc::new(tokio::sync::OnceCell::new_with(Some(layer.clone()))));
        let registered = Registered {
            built: layer,
            start: None,
            ready: None,
            ready_timeout: None,
            ports: Vec::new(),
            envs: BTreeMap::new(),
            cpu: None,
            memory_mb: None,
            disk_mb: None,
        };
        self.inner.templates.lock().expect("templates").insert(name.to_string(), registered);
        Ok(name.to_string())
    }
}

#[async_trait]
impl crate::provider::Builds for LocalProvider {
    async fn build(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<BuildOutput> {
        let (layer, cached) = self.inner.build(&spec, log).await?;
        let def = &spec.template.def;
        let mut templates = self.inner.templates.lock().expect("templates");
        // A deploy of the same digest wins: building again must not drop its start command.
        let deployed = templates.get(&def.name).is_some_and(|t| t.start.is_some() && t.built.digest == layer.digest);
        if !deployed {
            templates.insert(def.name.clone(), registered(&layer, def, false));
        }
        Ok(BuildOutput { image: layer.layer.display().to_string(), digest: layer.digest.clone(), cached })
    }

    async fn deploy(&self, spec: BuildSpec, log: mpsc::UnboundedSender<String>) -> Result<DeployOutput> {
        let (layer, cached) = self.inner.build(&spec, log.clone()).await?;
        let def = &spec.template.def;
        let reg = registered(&layer, def, true);
        let _ = log.send(reg.note(&def.name));
        self.inner.templates.lock().expect("templates").insert(def.name.clone(), reg);
        Ok(DeployOutput {
            template_id: def.name.clone(),
            image: layer.layer.display().to_string(),
            digest: layer.digest.clone(),
            cached,
        })
    }

    async fn remove_builds(&self) -> usize {
        self.inner.templates.lock().expect("templates").clear();
        // Spares stand on the layers about to go.
        self.inner.warm.clear().await;
        // Builds cancelled before they finished (their sandboxes died with their futures).
        let unfinished: Vec<PathBuf> = self.inner.building.lock().expect("building").drain().collect();
        for dir in unfinished {
            let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir));
            let _ = tokio::time::timeout(Duration::from_secs(30), rm).await;
        }
        let builds: Vec<_> = self.inner.builds.lock().expect("builds").drain().collect();
        let mut removed = 0;
        // Cached builds stay, for the next run (`layer_cache`); this process's hold on them
        // goes with the map.
        for (_, cell) in builds {
            if let Some(layer) = cell.get().filter(|l| !l.keep && l.hold.is_none()) {
                let dir = layer.dir.clone();
                let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir));
                if matches!(tokio::time::timeout(Duration::from_secs(30), rm).await, Ok(Ok(Ok(())))) {
                    removed += 1;
                }
            }
        }
        if let Ok(max) = super::layer_cache::max_from_env() {
            let state = self.inner.state_dir.clone();
            let evict = tokio::task::spawn_blocking(move || super::layer_cache::evict(&state, max));
            let _ = tokio::time::timeout(Duration::from_secs(60), evict).await;
        }
        removed
    }

    async fn remove_template(&self, name: &str) -> bool {
        let known = self.inner.templates.lock().expect("templates").remove(name).is_some();
        let layers: Vec<Arc<Layer>> = {
            let mut builds = self.inner.builds.lock().expect("builds");
            let digests: Vec<String> = builds
                .iter()
                .filter(|(_, c)| c.get().is_some_and(|l| l.name == name))
                .map(|(d, _)| d.clone())
                .collect();
            digests.iter().filter_map(|d| builds.remove(d)).filter_map(|c| c.get().cloned()).collect()
        };
        let found = known || !layers.is_empty();
        if found {
            self.inner.warm.clear().await;
        }
        for layer in layers.into_iter().filter(|l| !l.keep && l.hold.is_none()) {
            let dir = layer.dir.clone();
            let rm = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir));
            let _ = tokio::time::timeout(Duration::from_secs(30), rm).await;
        }
        found
    }
}

#[async_trait]
impl crate::provider::NetworkControl for LocalProvider {
    async fn update_network(&self, id: &str, policy: crate::provider::NetworkPolicy) -> Result<()> {
        let sb = self.get(id)?;
        let policy = egress::Policy::from_request(&policy)?;
        sb.apply_network(policy).await
    }
}

#[async_trait]
impl crate::provider::Metrics for LocalProvider {
    async fn usage(&self, id: &str) -> Result<Usage> {
        let sb = self.get(id)?;
        let (cpu_usec, mem_bytes, mem_limit_bytes) = match sb.boot() {
            Some(b) if !sb.is_cold() => b.ns.cgroup().map(|c| c.usage()).unwrap_or_default(),
            _ => (0, 0, 0),
        };
        let (disk_bytes, disk_total_bytes) = match (&sb.iso, sb.boot()) {
            (Iso::Ns { layout, .. }, Some(b)) if !sb.is_cold() => {
                let d = layout.disk.as_ref().expect("an isolated sandbox has a disk");
                let at = b.ns.host_view(&d.mount);
                blocking(move || Ok(disk::usage(&at).unwrap_or_default())).await?
            }
            (Iso::Ns { layout, .. }, _) => {
                // Paused filesystem-only: what the image holds, of its size.
                let d = layout.disk.clone().expect("an isolated sandbox has a disk");
                use std::os::unix::fs::MetadataExt;
                let used = std::fs::metadata(&d.image).map(|m| m.blocks() * 512).unwrap_or(0);
                (used, d.size_mb * 1024 * 1024)
            }
            _ => {
                let dir = sb.dir.clone();
                blocking(move || Ok(disk_usage(&dir))).await?
            }
        };
        Ok(Usage { cpu_usec, mem_bytes, mem_limit_bytes, disk_bytes, disk_total_bytes })
    }
}

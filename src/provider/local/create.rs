//! Creating a sandbox: its template, limits, disk and network policy checked, a spare of its
//! shape taken or a sandbox booted, its record registered and a deployed template started;
//! and booting a sandbox paused filesystem-only again.

use super::ready::start_template;
use super::*;

/// Limits when neither `create` nor the template says (E2B's defaults for `base`).
const DEFAULT_CPUS: u32 = 2;
const DEFAULT_MEMORY_MB: u64 = 512;
/// Processes (and threads) a sandbox may have at once.
const DEFAULT_PIDS: u64 = 1024;

impl Inner {
    /// Boots a sandbox paused filesystem-only again over its kept writable layer: a new init,
    /// no processes, and a new boot id.
    pub(super) async fn reboot(&self, sb: &Sandbox) -> Result<()> {
        let Iso::Ns { boot, layout } = &sb.iso else {
            return Err(ProviderError::unsupported("rebooting needs isolated sandboxes"));
        };
        let l = layout.clone();
        let next = tokio::task::spawn_blocking(move || l.for_reboot())
            .await
            .map_err(|e| ProviderError::infra(e.to_string()))?
            .map_err(|e| ProviderError::infra(format!("cannot prepare sandbox {} to boot again: {e}", sb.id)))?;
        // The same network (and policy): its namespace outlived the last boot's processes.
        let users = self.booter.users.take().map_err(|e| userns::failed(&e))?;
        let ns = NsSandbox::start(next, &sb.id, Some(users)).await?;
        *boot.write().expect("boot") = Boot::new(ns);
        Ok(())
    }

    pub(super) async fn create_sandbox(self: &Arc<Self>, req: CreateRequest) -> Result<Arc<Sandbox>> {
        let tpl = self.templates.lock().expect("templates").get(&req.template).cloned();
        if tpl.is_none() && !matches!(req.template.as_str(), "" | "base") {
            // As a cloud answers: a typo must not silently run on the host's root.
            return Err(ProviderError::not_found(format!(
                "unknown template `{}`: the local provider has `base` and the templates this run built or deployed",
                req.template
            )));
        }
        let policy = match &req.network {
            Some(p) => egress::Policy::from_request(p)?,
            None => egress::Policy::default(),
        };
        if !policy.is_open() && !self.namespaces {
            return Err(no_policy_without_isolation());
        }
        if req.network.as_ref().is_some_and(|n| n.allow_public_traffic == Some(false)) {
            return Err(ProviderError::unsupported(
                "private ports (allow_public_traffic: false) on the local provider: it has no traffic access token (serve and the clouds have)",
            ));
        }
        if req.lifecycle.is_some_and(|l| l.auto_resume) {
            return Err(ProviderError::unsupported(
                "auto_resume on the local provider: a paused local sandbox is resumed by `connect` (serve wakes one on traffic)",
            ));
        }
        if !req.mounts.is_empty() && !self.namespaces {
            return Err(ProviderError::unsupported(
                "host directory mounts need the local provider's isolation (namespaces)",
            ));
        }
        for m in &req.mounts {
            let path_ok = m.path.starts_with('/')
                && Path::new(&m.path).components().skip(1).all(|c| matches!(c, std::path::Component::Normal(_)))
                && m.path != "/";
            if !path_ok {
                return Err(ProviderError::invalid(format!(
                    "mount path {:?}: must be absolute, not `/`, without `.` or `..`",
                    m.path
                )));
            }
            if !m.host.is_dir() {
                return Err(ProviderError::invalid(format!(
                    "mount source {}: not a directory",
                    m.host.shown().display()
                )));
            }
        }
        let mut envs;
        let mut workdir = None;
        let mut lowers = Vec::new();
        let mut net = None;
        let mut disk_claim = None;
        let (id, dir, iso) = if self.namespaces {
            let limits = Limits {
                cpus: req.cpu.or(tpl.as_ref().and_then(|t| t.cpu)).unwrap_or(DEFAULT_CPUS).clamp(1, 256),
                memory_mb: req
                    .memory_mb
                    .or(tpl.as_ref().and_then(|t| t.memory_mb))
                    .unwrap_or(DEFAULT_MEMORY_MB)
                    .max(16),
                pids: DEFAULT_PIDS,
            };
            let declared =
                req.disk_mb.or(tpl.as_ref().and_then(|t| t.disk_mb)).map(|mb| mb.clamp(disk::MIN_MB, disk::MAX_MB));
            // Held against the free space before anything is made (the images are sparse).
            let free = disk::free_mb(&self.state_dir).map_err(|e| {
                ProviderError::infra(format!("cannot read the free space of the state directory's filesystem: {e}"))
            })?;
            let claim = self
                .disk_book
                .admit(declared, free)
                .map_err(|m| ProviderError::new(crate::provider::ErrorKind::Capacity, m))?;
            let disk_mb = claim.mb();
            disk_claim = Some(claim);
            envs = BTreeMap::new();
            match &tpl {
                Some(t) => {
                    lowers.push(t.built.layer.clone());
                    if t.built.below.is_empty() {
                        lowers.push(t.built.image.clone());
                    } else {
                        lowers.extend(t.built.below.iter().cloned());
                    }
                    envs.extend(t.built.env.clone());
                    envs.extend(t.envs.clone());
                    workdir.clone_from(&t.built.workdir);
                }
                None => {
                    let (log, _) = mpsc::unbounded_channel();
                    let base = self.images.get(BASE_IMAGE, None, &log).await?;
                    lowers.push(base.dir.clone());
                    envs.extend(base.config.env_map());
                    workdir.clone_from(&base.config.workdir);
                }
            }
            let shape = warm::Shape { lowers: lowers.clone(), limits, disk_mb };
            // A create with host mounts boots its own: the mounts are part of the boot.
            let spare = if req.mounts.is_empty() { self.warm.take(&shape) } else { None };
            let booted = match spare {
                Some(b) => b,
                None => self.booter.boot(&shape, &req.mounts).await?,
            };
            if !policy.is_open() {
                if let Err(e) = booted.net.apply(policy).await {
                    booted.discard().await;
                    return Err(net_error("cannot set the sandbox's network policy".into(), e));
                }
            }
            net = Some(booted.net);
            let dir = booted.layout.dir.clone();
            let iso = Iso::Ns { boot: std::sync::RwLock::new(Boot::new(booted.ns)), layout: Box::new(booted.layout) };
            (booted.id, dir, iso)
        } else {
            let id = format!("sbx-{}", crate::random::hex(6));
            let dir = self.state_dir.join(&id);
            let (home, tmp, bash_env) = (dir.join("home"), dir.join("tmp"), dir.join("bash_env.sh"));
            let (d, h, t, b) = (dir.clone(), home.clone(), tmp.clone(), bash_env.clone());
            tokio::task::spawn_blocking(move || -> std::io::Result<()> {
                // Who owns it, so a later run can sweep it if this process dies without
                // cleaning up.
                crate::owner::create_dir(&d)?;
                std::fs::create_dir_all(&h)?;
                std::fs::create_dir_all(&t)?;
                std::fs::write(&b, process::BASH_ENV_SCRIPT)
            })
            .await
            .map_err(|e| ProviderError::infra(e.to_string()))?
            .map_err(|e| ProviderError::infra(format!("cannot prepare sandbox directory: {e}")))?;
            envs = process::base_env(&home.display().to_string());
            envs.insert("TMPDIR".into(), tmp.display().to_string());
            (id, dir, Iso::Plain { home, tmp, bash_env })
        };
        let template_envs = envs.clone();
        envs.extend(req.envs.clone());
        let now = now_ms();
        let timeout_ms = req.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS).saturating_mul(1000);
        let sb = Arc::new(Sandbox {
            id: id.clone(),
            template: if req.template.is_empty() { "base".into() } else { req.template.clone() },
            metadata: req.metadata.clone(),
            envs,
            started_at: now / 1000,
            life: Life::new(now.saturating_add(timeout_ms)),
            dir,
            workdir,
            ids: self.ids,
            iso,
            procs: ProcTable::default(),
            paused: Default::default(),
            cold: Default::default(),
            lowers,
            template_envs,
            net,
            _disk: disk_claim,
            pause_at_end: req.lifecycle.filter(|l| l.pause_on_timeout).map(|l| l.keep_memory),
        });
        let sb = self.core.register(sb);
        core::expire_at_end(self, sb.clone());
        if let Some(start) = tpl.as_ref().and_then(|t| t.start.clone()) {
            let t = tpl.as_ref().expect("checked");
            if let Err(e) =
                start_template(&sb, &start, t.ready.as_deref(), t.ready_timeout, &t.ports, t.built.user.as_deref())
                    .await
            {
                core::kill(self.as_ref(), &sb.id).await;
                return Err(e);
            }
        }
        Ok(sb)
    }
}

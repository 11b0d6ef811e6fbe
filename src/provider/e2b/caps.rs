//! What an E2B-protocol sandbox can do, one capability trait of [`crate::provider::caps`] an
//! impl: each goes to the platform's REST API or to the sandbox's envd.

use super::*;

/// E2B's background processes with stdin (`commands.run(stdin=True)`, `send_stdin`,
/// `close_stdin`): input goes to envd by pid, so any connection to the sandbox can send it.
#[async_trait]
impl crate::provider::LiveProcesses for E2bProvider {
    async fn spawn_live(&self, id: &str, req: ExecRequest, open_stdin: bool) -> Result<crate::provider::LiveProcess> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("run `{}` in the background", short(&req.cmd));
        let (proc, stream) = inner.start(&envd, &req, open_stdin, &what).await?;
        inner.procs.insert(id, proc.clone());
        let (tx, rx) = crate::provider::output_channel();
        let pid = proc.pid;
        tokio::spawn(process::drive(stream, proc, Some(tx), what, id.to_string()));
        Ok(crate::provider::LiveProcess { pid, output: rx })
    }

    async fn spawn_with_stdin(&self, id: &str, req: ExecRequest) -> Result<u32> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("run `{}` in the background with its stdin open", short(&req.cmd));
        let (proc, stream) = inner.start(&envd, &req, true, &what).await?;
        inner.procs.insert(id, proc.clone());
        tokio::spawn(process::drive(stream, proc.clone(), None, what, id.to_string()));
        Ok(proc.pid)
    }

    async fn write_stdin(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
        let body = json!({ "process": { "pid": pid }, "input": { "stdin": b64 } });
        let what = format!("send stdin to process {pid}");
        inner.process_call(&envd, id, pid, "process.Process/SendInput", &body, &what).await
    }

    async fn close_stdin(&self, id: &str, pid: u32) -> Result<()> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        if !envd.at_least((0, 5, 2)) {
            return Err(ProviderError::unsupported("closing a process's stdin: envd before 0.5.2 has no CloseStdin"));
        }
        let body = json!({ "process": { "pid": pid } });
        let what = format!("close the stdin of process {pid}");
        inner.process_call(&envd, id, pid, "process.Process/CloseStdin", &body, &what).await
    }
}

#[async_trait]
impl crate::provider::Processes for E2bProvider {
    async fn exec(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("run `{}`", short(&req.cmd));
        let (proc, stream) = inner.start(&envd, &req, false, &what).await?;
        inner.procs.insert(id, proc.clone());
        let mut guard = KillOnDrop { inner: inner.clone(), envd: envd.clone(), proc: Some(proc.clone()) };
        let task = tokio::spawn(process::drive(stream, proc.clone(), output, what, id.to_string()));
        let ended = match req.timeout {
            Some(t) => proc.wait_done(t).await,
            None => proc.wait_forever().await,
        };
        if !ended {
            proc.set_timed_out();
            let _ = inner.send_signal(&envd, proc.pid, "SIGNAL_SIGKILL").await;
            if !proc.wait_done(process::KILL_WAIT).await {
                task.abort();
            }
        }
        guard.proc = None;
        inner.procs.remove(id, &proc);
        proc.result(!proc.finished())
    }

    async fn spawn(&self, id: &str, req: ExecRequest) -> Result<u32> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("run `{}` in the background", short(&req.cmd));
        let (proc, stream) = inner.start(&envd, &req, false, &what).await?;
        inner.procs.insert(id, proc.clone());
        tokio::spawn(process::drive(stream, proc.clone(), None, what, id.to_string()));
        if let Some(t) = req.timeout {
            let (inner, proc) = (inner.clone(), proc.clone());
            tokio::spawn(async move {
                if !proc.wait_done(t).await {
                    proc.set_timed_out();
                    let _ = inner.send_signal(&envd, proc.pid, "SIGNAL_SIGKILL").await;
                }
            });
        }
        Ok(proc.pid)
    }

    async fn process_list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = "list processes";
        let listed: ListResponse = inner
            .rpc(&envd, "process.Process/List", &json!({}), None, what)
            .await
            .map_err(|e| e.into_provider(what, id))?;
        let mut by_pid: BTreeMap<u32, ProcessInfo> = listed.processes.iter().map(|p| (p.pid, p.info())).collect();
        for p in inner.procs.of(id) {
            let info = p.info();
            match by_pid.get_mut(&p.pid) {
                // Still running: keep envd's entry, with the command as the user wrote it.
                Some(e) if !info.running || e.cmd.is_empty() => {
                    if !info.cmd.is_empty() {
                        e.cmd = info.cmd;
                    }
                }
                Some(e) => e.cmd = info.cmd,
                None => {
                    by_pid.insert(p.pid, info);
                }
            }
        }
        Ok(by_pid.into_values().collect())
    }

    async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        if let Some(name) = process::signal_name(signal) {
            return inner
                .send_signal(&envd, pid, name)
                .await
                .map_err(|e| process_error(e, pid, &format!("signal process {pid}"), id));
        }
        // envd only implements KILL and TERM; send the others from inside the sandbox.
        let req = ExecRequest {
            cmd: format!("kill -{signal} {pid}"),
            timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let r = self.exec(id, req, None).await?;
        if r.exit_code == Some(0) {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&r.stderr).trim().to_string();
        if stderr.contains("No such process") {
            Err(ProviderError::not_found(format!("no such process: {pid}")))
        } else {
            Err(ProviderError::invalid(format!("send signal {signal} to process {pid}: {stderr}")))
        }
    }

    async fn wait(&self, id: &str, pid: u32, timeout: Duration) -> Result<ExecResult> {
        let proc = match self.inner.procs.get(id, pid) {
            Some(p) => p,
            None => self.inner.attach(id, pid).await?,
        };
        let done = proc.wait_done(timeout).await;
        proc.result(!done)
    }
}

#[async_trait]
impl crate::provider::Pty for E2bProvider {
    async fn spawn_pty(
        &self,
        id: &str,
        req: ExecRequest,
        cols: u16,
        rows: u16,
    ) -> Result<crate::provider::LiveProcess> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("run `{}` in a terminal", short(&req.cmd));
        let mut body = process::start_body(&ExecRequest { stdin: None, ..req.clone() });
        // As the SDK's `pty.create`: a terminal type, and stdin is the terminal.
        if body["process"]["envs"]["TERM"].is_null() {
            body["process"]["envs"]["TERM"] = json!("xterm-256color");
        }
        body["pty"] = json!({ "size": { "cols": cols, "rows": rows } });
        body.as_object_mut().map(|o| o.remove("stdin"));
        let mut stream = envd
            .stream(inner.http(), "process.Process/Start", &body, req.user.as_deref(), None, &what)
            .await
            .map_err(|e| e.into_provider(&what, id))?;
        let pid = tokio::time::timeout(envd::OPEN_TIMEOUT, process::read_start(&mut stream, &what))
            .await
            .map_err(|_| ProviderError::new(ErrorKind::Timeout, format!("{what}: no start event")))?
            .map_err(|e| e.into_provider(&what, id))?;
        let proc = Proc::new(pid, req.cmd.clone(), req.max_output);
        inner.procs.insert(id, proc.clone());
        let (tx, rx) = crate::provider::output_channel();
        tokio::spawn(process::drive(stream, proc, Some(tx), what, id.to_string()));
        Ok(crate::provider::LiveProcess { pid, output: rx })
    }

    async fn write_pty(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&data);
        let body = json!({ "process": { "pid": pid }, "input": { "pty": b64 } });
        let what = format!("type into the terminal of process {pid}");
        inner.process_call(&envd, id, pid, "process.Process/SendInput", &body, &what).await
    }

    async fn resize_pty(&self, id: &str, pid: u32, cols: u16, rows: u16) -> Result<()> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let body = json!({ "process": { "pid": pid }, "pty": { "size": { "cols": cols, "rows": rows } } });
        let what = format!("resize the terminal of process {pid}");
        inner.process_call(&envd, id, pid, "process.Process/Update", &body, &what).await
    }
}

#[async_trait]
impl crate::provider::Files for E2bProvider {
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let written = envd
            .upload(inner.http(), path, &data, None)
            .await
            .map_err(|e| e.into_provider(&format!("write {path}"), id))?;
        if let Some(m) = mode {
            let req = ExecRequest {
                cmd: format!("chmod {:o} -- {}", m & 0o7777, sh_quote(&written)),
                timeout: Some(Duration::from_secs(30)),
                ..Default::default()
            };
            let r = self.exec(id, req, None).await?;
            if r.exit_code != Some(0) {
                return Err(ProviderError::invalid(format!(
                    "set mode {:o} on {written}: {}",
                    m & 0o7777,
                    String::from_utf8_lossy(&r.stderr).trim()
                )));
            }
        }
        inner.stat(&envd, &written).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        envd.download(inner.http(), path, None).await.map_err(|e| match e.code() {
            Some("not_found") => ProviderError::not_found(format!("no such file: {path}")),
            _ => e.into_provider(&format!("read {path}"), id),
        })
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("list {path}");
        let r: ListDirResponse = inner
            .rpc(&envd, "filesystem.Filesystem/ListDir", &json!({ "path": path, "depth": 1 }), None, &what)
            .await
            .map_err(|e| e.into_provider(&what, id))?;
        let mut out: Vec<FileEntry> = r.entries.iter().filter_map(|e| e.entry()).collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let envd = self.inner.envd(id).await?;
        self.inner.stat(&envd, path).await
    }

    async fn exists(&self, id: &str, path: &str) -> Result<bool> {
        let envd = self.inner.envd(id).await?;
        let what = format!("stat {path}");
        match self.inner.path_call::<EntryResponse>(&envd, "Stat", path, &what).await {
            Ok(_) => Ok(true),
            Err(e) if e.code() == Some("not_found") => Ok(false),
            Err(e) => Err(e.into_provider(&what, id)),
        }
    }

    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let what = format!("make directory {path}");
        match inner.path_call::<EntryResponse>(&envd, "MakeDir", path, &what).await {
            Ok(r) => match r.entry.and_then(|e| e.entry()) {
                Some(e) => Ok(e),
                None => inner.stat(&envd, path).await,
            },
            Err(e) if e.code() == Some("already_exists") => {
                let entry = inner.stat(&envd, path).await?;
                if entry.kind == "dir" {
                    Ok(entry)
                } else {
                    Err(ProviderError::invalid(format!("{what}: {path} exists and is not a directory")))
                }
            }
            Err(e) => Err(e.into_provider(&what, id)),
        }
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry> {
        let envd = self.inner.envd(id).await?;
        let body = json!({ "source": from, "destination": to });
        self.inner.entry(&envd, "filesystem.Filesystem/Move", &body, &format!("move {from} to {to}")).await
    }

    async fn remove(&self, id: &str, path: &str) -> Result<()> {
        let envd = self.inner.envd(id).await?;
        let what = format!("remove {path}");
        self.inner
            .path_call::<JsonValue>(&envd, "Remove", path, &what)
            .await
            .map(|_| ())
            .map_err(|e| e.into_provider(&what, id))
    }
}

#[async_trait]
impl crate::provider::WatchDirs for E2bProvider {
    async fn watch_dir(&self, id: &str, path: &str, recursive: bool) -> Result<Box<dyn crate::provider::DirWatch>> {
        let inner = &self.inner;
        let envd = inner.envd(id).await?;
        let path = crate::provider::normalize_path(path)?;
        let what = format!("watch {path}");
        let body = json!({ "path": path, "recursive": recursive });
        let not_found = |e: RpcError| match e.code() {
            Some("not_found") => ProviderError::not_found(format!("no such directory: {path}")),
            _ => e.into_provider(&what, id),
        };
        let mut stream = envd
            .stream(inner.http(), "filesystem.Filesystem/WatchDir", &body, None, None, &what)
            .await
            .map_err(not_found)?;
        tokio::time::timeout(envd::OPEN_TIMEOUT, watch::read_start(&mut stream, &what))
            .await
            .map_err(|_| ProviderError::new(ErrorKind::Timeout, format!("{what}: no start event")))?
            .map_err(not_found)?;
        Ok(Box::new(watch::StreamWatch::start(stream, what)))
    }
}

#[async_trait]
impl crate::provider::Ports for E2bProvider {
    /// Every E2B sandbox is a VM of its own.
    fn isolated(&self) -> bool {
        true
    }

    async fn port_url(&self, id: &str, port: u16) -> Result<String> {
        let envd = self.inner.envd(id).await?;
        let url = self.inner.api.cfg.port_url(id, envd.domain.as_deref(), port);
        self.inner.port_bases.lock().expect("ports").insert(url.trim_end_matches('/').to_string(), id.to_string());
        Ok(url)
    }

    fn port_headers(&self, url: &str) -> Vec<(String, String)> {
        let id = {
            let bases = self.inner.port_bases.lock().expect("ports");
            bases.iter().find(|(base, _)| under(url, base)).map(|(_, id)| id.clone())
        };
        let Some(id) = id else { return Vec::new() };
        let envds = self.inner.envds.lock().expect("envds");
        match envds.get(&id).and_then(Envd::traffic) {
            Some(t) => vec![(envd::TRAFFIC_HEADER.to_string(), t.to_string())],
            None => Vec::new(),
        }
    }
}

#[async_trait]
impl crate::provider::Pausing for E2bProvider {
    /// E2B's `autoResume` (the API's; this client only sends it).
    fn resumes_on_traffic(&self) -> bool {
        true
    }

    async fn pause(&self, id: &str, keep_memory: bool) -> Result<()> {
        self.inner.api.pause(id, keep_memory).await
    }

    async fn resume(&self, id: &str, timeout_secs: u64) -> Result<()> {
        // Connecting resumes a paused sandbox; envd may live elsewhere afterwards.
        let sb = self.inner.api.connect(id, Some(timeout_secs)).await?;
        self.inner.remember(&sb);
        Ok(())
    }
}

#[async_trait]
impl crate::provider::Snapshots for E2bProvider {
    async fn snapshot(&self, id: &str, name: &str) -> Result<String> {
        let snap = self.inner.api.snapshot(id, name).await?;
        self.inner.snapshots.lock().expect("snapshots").insert(snap.clone());
        Ok(snap)
    }

    fn keep_snapshot(&self, snapshot: &str) {
        self.inner.snapshots.lock().expect("snapshots").remove(snapshot);
    }

    async fn delete_snapshot(&self, snapshot: &str) -> Result<bool> {
        let existed = build::delete_template(&self.inner.api, snapshot).await?;
        self.inner.snapshots.lock().expect("snapshots").remove(snapshot);
        Ok(existed)
    }
}

#[async_trait]
impl crate::provider::Builds for E2bProvider {
    async fn build(
        &self,
        spec: crate::provider::BuildSpec,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<crate::provider::BuildOutput> {
        let digest = spec.template.digest.clone();
        let (built, cached) = self.inner.builds.get(&self.inner.api, &spec, false, &log).await?;
        Ok(crate::provider::BuildOutput { image: built.template_id, digest, cached })
    }

    async fn deploy(
        &self,
        spec: crate::provider::BuildSpec,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<crate::provider::DeployOutput> {
        let digest = spec.template.digest.clone();
        let (built, cached) = self.inner.builds.get(&self.inner.api, &spec, true, &log).await?;
        Ok(crate::provider::DeployOutput {
            template_id: built.template_id.clone(),
            image: built.template_id,
            digest,
            cached,
        })
    }

    async fn remove_builds(&self) -> usize {
        // Snapshots a scenario's cleanup did not get to delete (it was cut short) go too.
        let left: Vec<String> = self.inner.snapshots.lock().expect("snapshots").drain().collect();
        let mut removed = 0;
        for id in left {
            if matches!(build::delete_template(&self.inner.api, &id).await, Ok(true)) {
                removed += 1;
            }
        }
        removed + self.inner.builds.remove(&self.inner.api).await
    }
}

#[async_trait]
impl crate::provider::NetworkControl for E2bProvider {
    async fn update_network(&self, id: &str, policy: crate::provider::NetworkPolicy) -> Result<()> {
        self.inner.api.update_network(id, &policy).await
    }
}

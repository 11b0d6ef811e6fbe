//! What a sandbox of an OpenSandbox server can do, one capability trait of
//! [`crate::provider::caps`] an impl: each goes to the lifecycle API or to the sandbox's execd.

use super::*;

#[async_trait]
impl crate::provider::Processes for OpenSandboxProvider {
    async fn exec(&self, id: &str, req: ExecRequest, output: Option<OutputTx>) -> Result<ExecResult> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let line = self.wrap(id, &req, n).await?;
        let started = std::time::Instant::now();
        let (code, signal, printed) = self.command(id, &line, req.cwd.as_deref(), &req.envs, req.timeout).await?;
        let pid = printed.lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
        let timed_out = req.timeout.is_some_and(|t| started.elapsed() >= t) && code.is_none();
        let max = req.max_output.unwrap_or(crate::provider::MAX_OUTPUT);
        let (stdout, stderr, stdout_dropped, stderr_dropped) = self.collect(id, n, max).await?;
        if let Some(tx) = output {
            if !stdout.is_empty() {
                let _ = tx.send(OutputChunk::Stdout(stdout.clone())).await;
            }
            if !stderr.is_empty() {
                let _ = tx.send(OutputChunk::Stderr(stderr.clone())).await;
            }
        }
        // An exit code is the command's own (`exit 130` is 130, not a signal); a signal is
        // the one execd saw end it (a timeout's is SIGKILL).
        let (exit_code, signal) = match (code, signal) {
            (Some(c), _) => (Some(c), None),
            (None, s) => (None, Some(s.unwrap_or(libc::SIGKILL))),
        };
        Ok(ExecResult { stdout, stderr, exit_code, signal, timed_out, pid, stdout_dropped, stderr_dropped })
    }

    async fn spawn(&self, id: &str, req: ExecRequest) -> Result<u32> {
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let line = self.wrap(id, &req, n).await?;
        let pidfile = format!("{WORK}/{n}.pid");
        // The shell's pid to a file (a background command's output is not streamed), then the
        // command in its place (same pid).
        let command = format!("echo $$ >{pidfile}; {}", line.trim_start_matches("echo $$; "));
        let e = self.execd(id).await?;
        let mut body = json!({"command": command, "background": true});
        if let Some(c) = &req.cwd {
            body["cwd"] = json!(c);
        }
        if !req.envs.is_empty() {
            body["envs"] = json!(req.envs);
        }
        let r = self.execd_req(&e, reqwest::Method::POST, "/command").json(&body);
        let out = self.execd_ok(id, r, "start a background command").await?;
        let command_id = String::from_utf8_lossy(&out)
            .split("\n\n")
            .filter_map(|f| serde_json::from_str::<Value>(f.trim()).ok())
            .find(|v| v["type"] == "init")
            .and_then(|v| v["text"].as_str().map(str::to_string))
            .ok_or_else(|| ProviderError::infra("the background command's stream named no id"))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let pid = loop {
            if let Some(b) = self.download(id, &pidfile).await? {
                if let Ok(p) = String::from_utf8_lossy(&b).trim().parse::<u32>() {
                    break p;
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::infra("the background command did not start within 30s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.sandboxes
            .lock()
            .expect("sandboxes")
            .entry(id.to_string())
            .or_default()
            .background
            .insert(pid, Background { command_id, n });
        Ok(pid)
    }

    async fn process_list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let script = r#"for d in /proc/[0-9]*; do c=$(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) || continue; [ -n "$c" ] && printf '%s\t%s\n' "${d#/proc/}" "$c"; done; true"#;
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let req = ExecRequest { cmd: script.into(), ..Default::default() };
        let line = self.wrap(id, &req, n).await?;
        self.command(id, &line, None, &BTreeMap::new(), None).await?;
        let (out, _, _, _) = self.collect(id, n, crate::provider::MAX_OUTPUT).await?;
        Ok(String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|l| {
                let (pid, cmd) = l.split_once('\t')?;
                Some(ProcessInfo {
                    pid: pid.parse().ok()?,
                    cmd: cmd.trim_end().to_string(),
                    running: true,
                    exit_code: None,
                })
            })
            .collect())
    }

    async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        let (code, _, _) =
            self.command(id, &format!("kill -s {signal} {pid} 2>/dev/null"), None, &BTreeMap::new(), None).await?;
        match code {
            Some(0) => Ok(()),
            _ => Err(ProviderError::not_found(format!("no such process: {pid}"))),
        }
    }

    async fn wait(&self, id: &str, pid: u32, timeout: Duration) -> Result<ExecResult> {
        let bg = self.sandboxes.lock().expect("sandboxes").get(id).and_then(|s| s.background.get(&pid).cloned());
        let Some(bg) = bg else {
            return Err(ProviderError::not_found(format!("no such process: {pid} (not started by this run)")));
        };
        let e = self.execd(id).await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let status = loop {
            let r = self.execd_req(&e, reqwest::Method::GET, &format!("/command/status/{}", bg.command_id));
            let v: Value =
                serde_json::from_slice(&self.execd_ok(id, r, "command status").await?).unwrap_or(Value::Null);
            if v["running"] == false {
                break Some(v);
            }
            if tokio::time::Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let Some(v) = status else {
            return Ok(ExecResult { pid, ..Default::default() });
        };
        let (stdout, stderr, stdout_dropped, stderr_dropped) =
            self.collect(id, bg.n, crate::provider::MAX_OUTPUT).await?;
        let error = v["error"].as_str().unwrap_or("");
        let (exit_code, signal) = match v["exit_code"].as_i64() {
            Some(c) if c >= 0 => (Some(c as i32), None),
            _ => match crate::provider::e2b::signal_from_status(error) {
                Some(sig) => (None, Some(sig)),
                None => {
                    return Err(ProviderError::infra(format!(
                        "execd says the background command {pid} ended: {error:?}"
                    )))
                }
            },
        };
        if let Some(s) = self.sandboxes.lock().expect("sandboxes").get_mut(id) {
            s.background.remove(&pid);
        }
        Ok(ExecResult { stdout, stderr, exit_code, signal, timed_out: false, pid, stdout_dropped, stderr_dropped })
    }
}

#[async_trait]
impl crate::provider::Files for OpenSandboxProvider {
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        let path = crate::provider::normalize_path(path)?;
        // Uploaded as root (execd's user), then written by the command user, as every
        // provider writes files: the file and the folders made for it are theirs, and what
        // they may not write is refused.
        let n = self.seq.fetch_add(1, Ordering::SeqCst);
        let staged = format!("{WORK}/{n}.up");
        self.upload(id, &staged, data, Some(0o644)).await?;
        let chmod = mode.map(|m| format!(" && chmod {:o} {}", m & 0o7777, q(&path))).unwrap_or_default();
        let cmd = format!(r#"mkdir -p -- "$(dirname {p})" && cat {staged} > {p}{chmod}"#, p = q(&path));
        let r = self.exec(id, ExecRequest { cmd, ..Default::default() }, None).await;
        let e = self.execd(id).await?;
        let del = self.execd_req(&e, reqwest::Method::DELETE, &format!("/files?path={}", enc(&staged)));
        let _ = self.send(del, "remove a staged upload").await;
        let r = r?;
        if r.exit_code != Some(0) {
            let why = String::from_utf8_lossy(&r.stderr).trim().to_string();
            let kind = if why.contains("ermission denied") { ErrorKind::Invalid } else { ErrorKind::Infra };
            return Err(ProviderError::new(kind, format!("cannot write {path}: {why}")));
        }
        self.stat(id, &path).await
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let path = crate::provider::normalize_path(path)?;
        let st = self.stat(id, &path).await?;
        if st.kind == "dir" {
            return Err(ProviderError::invalid(format!("{path} is a directory")));
        }
        self.download(id, &path).await?.ok_or_else(|| ProviderError::not_found(format!("no such file: {path}")))
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let path = crate::provider::normalize_path(path)?;
        let e = self.execd(id).await?;
        let r = self.execd_req(&e, reqwest::Method::GET, &format!("/directories/list?path={}&depth=1", enc(&path)));
        let body = self.execd_ok(id, r, "list a directory").await?;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok(v.as_array().map(|a| a.iter().map(|i| self.entry(&path, i)).collect()).unwrap_or_default())
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let path = crate::provider::normalize_path(path)?;
        let e = self.execd(id).await?;
        let r = self.execd_req(&e, reqwest::Method::GET, &format!("/files/info?path={}", enc(&path)));
        let body = self.execd_ok(id, r, "stat a file").await?;
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let info = v.as_object().and_then(|m| m.values().next().cloned()).unwrap_or(Value::Null);
        Ok(self.entry(&path, &info))
    }

    async fn exists(&self, id: &str, path: &str) -> Result<bool> {
        match self.stat(id, path).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry> {
        let path = crate::provider::normalize_path(path)?;
        // By the command user, as a write makes its folders.
        let r =
            self.exec(id, ExecRequest { cmd: format!("mkdir -p -- {}", q(&path)), ..Default::default() }, None).await?;
        if r.exit_code != Some(0) {
            let why = String::from_utf8_lossy(&r.stderr).trim().to_string();
            return Err(ProviderError::invalid(format!("cannot make {path}: {why}")));
        }
        self.stat(id, &path).await
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry> {
        let (from, to) = (crate::provider::normalize_path(from)?, crate::provider::normalize_path(to)?);
        let e = self.execd(id).await?;
        let r = self.execd_req(&e, reqwest::Method::POST, "/files/mv").json(&json!([{"src": from, "dest": to}]));
        self.execd_ok(id, r, "move a file").await?;
        self.stat(id, &to).await
    }

    async fn remove(&self, id: &str, path: &str) -> Result<()> {
        let path = crate::provider::normalize_path(path)?;
        let st = self.stat(id, &path).await?;
        let e = self.execd(id).await?;
        let route = if st.kind == "dir" { "/directories" } else { "/files" };
        let r = self.execd_req(&e, reqwest::Method::DELETE, &format!("{route}?path={}", enc(&path)));
        self.execd_ok(id, r, "remove a file").await.map(|_| ())
    }
}

#[async_trait]
impl crate::provider::Ports for OpenSandboxProvider {
    fn isolated(&self) -> bool {
        true
    }

    async fn port_url(&self, id: &str, port: u16) -> Result<String> {
        let e = self.endpoint(id, port).await?;
        self.ports.lock().expect("ports").push((e.url.clone(), e.headers));
        Ok(e.url)
    }

    fn port_headers(&self, url: &str) -> Vec<(String, String)> {
        let ports = self.ports.lock().expect("ports");
        ports
            .iter()
            .find(|(base, _)| {
                url == base || url.strip_prefix(base.as_str()).is_some_and(|r| r.starts_with('/') || r.starts_with('?'))
            })
            .map(|(_, h)| h.clone())
            .unwrap_or_default()
    }
}

#[async_trait]
impl crate::provider::Pausing for OpenSandboxProvider {
    /// OpenSandbox's pause keeps the memory; the library's pause scenario also needs a
    /// filesystem-only one (`pause: { memory: false }`), which it has no call for.
    fn keeps_memory_only(&self) -> bool {
        true
    }

    async fn pause(&self, id: &str, keep_memory: bool) -> Result<()> {
        if !keep_memory {
            return Err(ProviderError::unsupported("a filesystem-only pause: OpenSandbox's pause keeps the memory"));
        }
        self.api(reqwest::Method::POST, &format!("/sandboxes/{id}/pause"), None).await.map(|_| ())
    }

    async fn resume(&self, id: &str, timeout_secs: u64) -> Result<()> {
        self.api(reqwest::Method::POST, &format!("/sandboxes/{id}/resume"), None).await?;
        self.renew(id, timeout_secs).await
    }
}

#[async_trait]
impl crate::provider::Snapshots for OpenSandboxProvider {
    async fn snapshot(&self, id: &str, name: &str) -> Result<String> {
        let v =
            self.api(reqwest::Method::POST, &format!("/sandboxes/{id}/snapshots"), Some(json!({"name": name}))).await?;
        let snap = v["id"].as_str().ok_or_else(|| ProviderError::infra(format!("no id in the snapshot answer {v}")))?;
        // Taken asynchronously: ready when its state says so.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        let mut state = v["status"]["state"].as_str().unwrap_or("").to_string();
        while state != "Ready" {
            if state == "Failed" || tokio::time::Instant::now() >= deadline {
                return Err(ProviderError::infra(format!("snapshot {snap} of {id} did not become ready: {state}")));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let v = self.api(reqwest::Method::GET, &format!("/snapshots/{snap}"), None).await?;
            state = v["status"]["state"].as_str().unwrap_or("").to_string();
        }
        self.snapshots.lock().expect("snapshots").push(snap.to_string());
        Ok(snap.to_string())
    }

    async fn delete_snapshot(&self, snapshot: &str) -> Result<bool> {
        match self.api(reqwest::Method::DELETE, &format!("/snapshots/{snapshot}"), None).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
}

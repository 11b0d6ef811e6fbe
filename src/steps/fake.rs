//! An in-memory [`Provider`] for the step unit tests.
//!
//! Sandboxes, files and processes live in maps behind one mutex (never held across an
//! await). `exec` and `spawn` answer from a script, a closure that sees the request and the
//! sandbox's files (so `run-code` can find its result file), and every call is recorded so a
//! test can check exactly what a step asked for. Any method can be made to fail with a chosen
//! [`ProviderError`] to test how steps map error kinds. Ports map to `http://127.0.0.1:<port>`,
//! so a test's own listener on 127.0.0.1 is "the port inside the sandbox".

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::provider::{
    CreateRequest, ExecRequest, ExecResult, FileEntry, ProcessInfo, Provider, ProviderError, ProviderStats, Result,
    SandboxInfo,
};

/// The fake's clock: every sandbox starts at this unix time, and expiries count from it.
pub const NOW: u64 = 1_700_000_000;
/// First pid handed out; every exec and spawn takes the next.
pub const FIRST_PID: u32 = 100;

/// The files of one sandbox: absolute path to (content, mode), and the directories.
#[derive(Debug, Default, Clone)]
pub struct Fs {
    pub files: BTreeMap<String, (Vec<u8>, u32)>,
    pub dirs: BTreeSet<String>,
}

impl Fs {
    fn add_parents(&mut self, path: &str) {
        let mut p = parent(path);
        while p != "/" {
            self.dirs.insert(p.to_string());
            p = parent(p);
        }
    }

    pub fn write(&mut self, path: &str, data: &[u8], mode: u32) {
        let abs = absolute(path);
        self.add_parents(&abs);
        self.files.insert(abs, (data.to_vec(), mode));
    }

    pub fn read(&self, path: &str) -> Option<&[u8]> {
        self.files.get(&absolute(path)).map(|(d, _)| d.as_slice())
    }

    fn entry(&self, abs: &str) -> Option<FileEntry> {
        let name = abs.rsplit('/').next().unwrap_or_default().to_string();
        if let Some((data, mode)) = self.files.get(abs) {
            return Some(FileEntry {
                name,
                path: abs.into(),
                kind: "file".into(),
                size: data.len() as u64,
                mode: *mode,
                modified: NOW,
            });
        }
        (abs == "/" || self.dirs.contains(abs)).then(|| FileEntry {
            name,
            path: abs.into(),
            kind: "dir".into(),
            size: 4096,
            mode: 0o755,
            modified: NOW,
        })
    }

    /// Paths at or below `abs`.
    fn under<'a>(keys: impl Iterator<Item = &'a String>, abs: &str) -> Vec<String> {
        let prefix = format!("{}/", abs.trim_end_matches('/'));
        keys.filter(|k| *k == abs || k.starts_with(&prefix)).cloned().collect()
    }
}

/// Relative paths are under `/home/user`, like the real providers.
pub fn absolute(path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/home/user/{path}")
    }
}

fn parent(abs: &str) -> &str {
    match abs.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &abs[..i],
    }
}

/// One sandbox of the in-memory provider: its `SandboxInfo`, environment and files.
pub struct FakeSandbox {
    pub info: SandboxInfo,
    pub envs: BTreeMap<String, String>,
    pub fs: Fs,
}

/// A process started by `exec` or `spawn`, and what `wait` will return for it.
pub struct FakeProcess {
    pub sandbox: String,
    pub info: ProcessInfo,
    pub result: ExecResult,
}

/// Everything the fake knows, open to the tests.
#[derive(Default)]
pub struct State {
    pub sandboxes: BTreeMap<String, FakeSandbox>,
    pub processes: Vec<FakeProcess>,
    pub next_id: u32,
    pub next_pid: u32,
    pub creates: Vec<CreateRequest>,
    /// (sandbox, request) of every foreground exec.
    pub execs: Vec<(String, ExecRequest)>,
    pub spawns: Vec<(String, ExecRequest)>,
    /// (sandbox, pid, signal).
    pub signals: Vec<(String, u32, i32)>,
    /// (sandbox, pid, bytes written; `None`: closed) of every stdin call.
    pub stdin: Vec<(String, u32, Option<Vec<u8>>)>,
    /// (sandbox, pid, timeout).
    pub waits: Vec<(String, u32, Duration)>,
    /// (sandbox, seconds).
    pub set_timeouts: Vec<(String, u64)>,
    /// (sandbox, policy) of every network update.
    pub networks: Vec<(String, crate::provider::NetworkPolicy)>,
    pub port_urls: Vec<(String, u16)>,
    /// Names of every method called, in order.
    pub calls: Vec<&'static str>,
    pub stats: ProviderStats,
}

pub type Script = Arc<dyn Fn(&ExecRequest, &mut Fs) -> ExecResult + Send + Sync>;

pub struct FakeProvider {
    state: Mutex<State>,
    script: Mutex<Script>,
    failures: Mutex<HashMap<&'static str, ProviderError>>,
}

impl Default for FakeProvider {
    fn default() -> Self {
        Self::new()
    }
}

/// A finished command with this output.
pub fn done(stdout: &str, stderr: &str, exit_code: i32) -> ExecResult {
    ExecResult {
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
        exit_code: Some(exit_code),
        ..Default::default()
    }
}

impl FakeProvider {
    /// Every command succeeds with no output until a script is set.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State { next_id: 1, next_pid: FIRST_PID, ..Default::default() }),
            script: Mutex::new(Arc::new(|_, _| done("", "", 0))),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Answer `exec`/`spawn` with this closure.
    pub fn script(&self, f: impl Fn(&ExecRequest, &mut Fs) -> ExecResult + Send + Sync + 'static) {
        *self.script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(f);
    }

    /// Answer commands from a table of `cmd` to result; anything else exits 127.
    pub fn table(&self, rows: &[(&str, ExecResult)]) {
        let rows: HashMap<String, ExecResult> = rows.iter().map(|(c, r)| (c.to_string(), r.clone())).collect();
        self.script(move |req, _| {
            rows.get(&req.cmd)
                .cloned()
                .unwrap_or_else(|| done("", &format!("bash: {}: command not found\n", req.cmd), 127))
        });
    }

    /// Make every later call of `method` (its trait name, e.g. "exec") fail with `err`.
    pub fn fail(&self, method: &'static str, err: ProviderError) {
        self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(method, err);
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A sandbox made behind the scenario's back (for `connect` and `list`).
    pub fn add_sandbox(&self, template: &str, metadata: &[(&str, &str)]) -> String {
        let mut s = self.state();
        let id = format!("sb-{}", s.next_id);
        s.next_id += 1;
        let info = SandboxInfo {
            id: id.clone(),
            template: template.into(),
            metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            started_at: NOW,
            end_at: NOW + 300,
            state: "running".into(),
        };
        s.sandboxes.insert(id.clone(), FakeSandbox { info, envs: BTreeMap::new(), fs: Fs::default() });
        s.stats.created += 1;
        s.stats.live += 1;
        s.stats.peak_live = s.stats.peak_live.max(s.stats.live);
        id
    }

    /// Put a file in a sandbox directly.
    pub fn put_file(&self, id: &str, path: &str, data: &[u8]) {
        self.state().sandboxes.get_mut(id).expect("sandbox exists").fs.write(path, data, 0o644);
    }

    pub fn file(&self, id: &str, path: &str) -> Option<Vec<u8>> {
        self.state().sandboxes.get(id)?.fs.read(path).map(<[u8]>::to_vec)
    }

    /// Record the call and return the injected failure, if any.
    fn enter(&self, method: &'static str) -> Result<MutexGuard<'_, State>> {
        let mut s = self.state();
        s.calls.push(method);
        if let Some(e) = self.failures.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(method) {
            return Err(e.clone());
        }
        Ok(s)
    }

    fn run_script(&self, req: &ExecRequest, fs: &mut Fs) -> ExecResult {
        let f = self.script.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        f(req, fs)
    }
}

fn missing(id: &str) -> ProviderError {
    ProviderError::not_found(format!("sandbox {id} not found"))
}

fn sandbox<'a>(s: &'a mut State, id: &str) -> Result<&'a mut FakeSandbox> {
    s.sandboxes.get_mut(id).ok_or_else(|| missing(id))
}

fn process<'a>(s: &'a mut State, id: &str, pid: u32) -> Result<&'a mut FakeProcess> {
    s.processes
        .iter_mut()
        .find(|p| p.sandbox == id && p.info.pid == pid)
        .ok_or_else(|| ProviderError::not_found(format!("process {pid} not found")))
}

#[async_trait]
impl Provider for FakeProvider {
    fn name(&self) -> &str {
        "fake"
    }

    async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        let mut s = self.enter("create")?;
        s.creates.push(req.clone());
        let id = format!("sb-{}", s.next_id);
        s.next_id += 1;
        let info = SandboxInfo {
            id: id.clone(),
            template: req.template,
            metadata: req.metadata,
            started_at: NOW,
            end_at: NOW + req.timeout_secs.unwrap_or(300),
            state: "running".into(),
        };
        s.sandboxes.insert(id, FakeSandbox { info: info.clone(), envs: req.envs, fs: Fs::default() });
        s.stats.created += 1;
        s.stats.live += 1;
        s.stats.peak_live = s.stats.peak_live.max(s.stats.live);
        Ok(info)
    }

    async fn connect(&self, id: &str, timeout_secs: Option<u64>) -> Result<SandboxInfo> {
        let mut s = self.enter("connect")?;
        let sb = sandbox(&mut s, id)?;
        if let Some(t) = timeout_secs {
            sb.info.end_at = NOW + t;
        }
        Ok(sb.info.clone())
    }

    async fn info(&self, id: &str) -> Result<SandboxInfo> {
        let mut s = self.enter("info")?;
        Ok(sandbox(&mut s, id)?.info.clone())
    }

    async fn list(&self, metadata: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let s = self.enter("list")?;
        Ok(s.sandboxes
            .values()
            .filter(|sb| metadata.iter().all(|(k, v)| sb.info.metadata.get(k) == Some(v)))
            .map(|sb| sb.info.clone())
            .collect())
    }

    async fn kill(&self, id: &str) -> Result<bool> {
        let mut s = self.enter("kill")?;
        let existed = s.sandboxes.remove(id).is_some();
        if existed {
            s.stats.destroyed += 1;
            s.stats.live -= 1;
        }
        Ok(existed)
    }

    async fn set_timeout(&self, id: &str, timeout_secs: u64) -> Result<()> {
        let mut s = self.enter("set_timeout")?;
        sandbox(&mut s, id)?.info.end_at = NOW + timeout_secs;
        s.set_timeouts.push((id.into(), timeout_secs));
        Ok(())
    }

    async fn destroy_all(&self) -> usize {
        let mut s = self.state();
        let n = s.sandboxes.len();
        s.sandboxes.clear();
        s.stats.destroyed += n as u64;
        s.stats.live = 0;
        n
    }

    fn stats(&self) -> ProviderStats {
        self.state().stats.clone()
    }

    fn features(&self) -> crate::provider::Features<'_> {
        crate::provider::caps::features!(self; processes, live_processes, files, ports, builds, network_control)
    }
}

/// Only what the steps use: a background process with its stdin open, written by pid.
#[async_trait]
impl crate::provider::LiveProcesses for FakeProvider {
    async fn spawn_live(&self, _id: &str, _req: ExecRequest, _open: bool) -> Result<crate::provider::LiveProcess> {
        Err(ProviderError::unsupported("the fake has no live output"))
    }

    async fn spawn_with_stdin(&self, id: &str, req: ExecRequest) -> Result<u32> {
        crate::provider::Processes::spawn(self, id, req).await
    }

    async fn write_stdin(&self, id: &str, pid: u32, data: Vec<u8>) -> Result<()> {
        let mut s = self.enter("write_stdin")?;
        sandbox(&mut s, id)?;
        s.stdin.push((id.into(), pid, Some(data)));
        Ok(())
    }

    async fn close_stdin(&self, id: &str, pid: u32) -> Result<()> {
        let mut s = self.enter("close_stdin")?;
        sandbox(&mut s, id)?;
        s.stdin.push((id.into(), pid, None));
        Ok(())
    }
}

#[async_trait]
impl crate::provider::NetworkControl for FakeProvider {
    async fn update_network(&self, id: &str, policy: crate::provider::NetworkPolicy) -> Result<()> {
        let mut s = self.enter("update_network")?;
        sandbox(&mut s, id)?;
        s.networks.push((id.into(), policy));
        Ok(())
    }
}

#[async_trait]
impl crate::provider::Processes for FakeProvider {
    async fn exec(&self, id: &str, req: ExecRequest, _output: Option<crate::provider::OutputTx>) -> Result<ExecResult> {
        let mut s = self.enter("exec")?;
        let pid = s.next_pid;
        let mut result = self.run_script(&req, &mut sandbox(&mut s, id)?.fs);
        s.next_pid += 1;
        result.pid = pid;
        let info = ProcessInfo { pid, cmd: req.cmd.clone(), running: false, exit_code: result.exit_code };
        s.processes.push(FakeProcess { sandbox: id.into(), info, result: result.clone() });
        s.execs.push((id.into(), req));
        Ok(result)
    }

    async fn spawn(&self, id: &str, req: ExecRequest) -> Result<u32> {
        let mut s = self.enter("spawn")?;
        let pid = s.next_pid;
        // The script decides how the process will end; `timed_out` means it never does.
        let mut result = self.run_script(&req, &mut sandbox(&mut s, id)?.fs);
        s.next_pid += 1;
        result.pid = pid;
        let info = ProcessInfo { pid, cmd: req.cmd.clone(), running: true, exit_code: None };
        s.processes.push(FakeProcess { sandbox: id.into(), info, result });
        s.spawns.push((id.into(), req));
        Ok(pid)
    }

    async fn process_list(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let mut s = self.enter("process_list")?;
        sandbox(&mut s, id)?;
        Ok(s.processes.iter().filter(|p| p.sandbox == id).map(|p| p.info.clone()).collect())
    }

    async fn signal(&self, id: &str, pid: u32, signal: i32) -> Result<()> {
        let mut s = self.enter("signal")?;
        sandbox(&mut s, id)?;
        let p = process(&mut s, id, pid)?;
        if p.info.running && signal != libc::SIGCONT && signal != libc::SIGSTOP {
            // Every other signal ends a fake process.
            p.info.running = false;
            p.result = ExecResult { exit_code: None, signal: Some(signal), timed_out: false, ..p.result.clone() };
        }
        s.signals.push((id.into(), pid, signal));
        Ok(())
    }

    async fn wait(&self, id: &str, pid: u32, timeout: Duration) -> Result<ExecResult> {
        let mut s = self.enter("wait")?;
        sandbox(&mut s, id)?;
        s.waits.push((id.into(), pid, timeout));
        let p = process(&mut s, id, pid)?;
        if !p.result.timed_out {
            p.info.running = false;
            p.info.exit_code = p.result.exit_code;
        }
        Ok(p.result.clone())
    }
}

#[async_trait]
impl crate::provider::Files for FakeProvider {
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
        let mut s = self.enter("write_file")?;
        let fs = &mut sandbox(&mut s, id)?.fs;
        let abs = absolute(path);
        fs.write(&abs, &data, mode.unwrap_or(0o644));
        Ok(fs.entry(&abs).expect("just written"))
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>> {
        let mut s = self.enter("read_file")?;
        let abs = absolute(path);
        sandbox(&mut s, id)?
            .fs
            .read(&abs)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| ProviderError::not_found(format!("no such file: {abs}")))
    }

    async fn list_dir(&self, id: &str, path: &str) -> Result<Vec<FileEntry>> {
        let mut s = self.enter("list_dir")?;
        let fs = &sandbox(&mut s, id)?.fs;
        let abs = absolute(path);
        if fs.entry(&abs).is_none_or(|e| e.kind != "dir") {
            return Err(ProviderError::not_found(format!("no such directory: {abs}")));
        }
        let children = fs.files.keys().chain(fs.dirs.iter()).filter(|k| parent(k) == abs && **k != abs);
        // Directory order, not sorted: the step sorts.
        let mut out: Vec<FileEntry> = children.filter_map(|k| fs.entry(k)).collect();
        out.reverse();
        Ok(out)
    }

    async fn stat(&self, id: &str, path: &str) -> Result<FileEntry> {
        let mut s = self.enter("stat")?;
        let abs = absolute(path);
        sandbox(&mut s, id)?.fs.entry(&abs).ok_or_else(|| ProviderError::not_found(format!("no such file: {abs}")))
    }

    async fn exists(&self, id: &str, path: &str) -> Result<bool> {
        let mut s = self.enter("exists")?;
        Ok(sandbox(&mut s, id)?.fs.entry(&absolute(path)).is_some())
    }

    async fn make_dir(&self, id: &str, path: &str) -> Result<FileEntry> {
        let mut s = self.enter("make_dir")?;
        let fs = &mut sandbox(&mut s, id)?.fs;
        let abs = absolute(path);
        if fs.files.contains_key(&abs) {
            return Err(ProviderError::invalid(format!("{abs} exists and is not a directory")));
        }
        fs.add_parents(&abs);
        fs.dirs.insert(abs.clone());
        Ok(fs.entry(&abs).expect("just made"))
    }

    async fn rename(&self, id: &str, from: &str, to: &str) -> Result<FileEntry> {
        let mut s = self.enter("rename")?;
        let fs = &mut sandbox(&mut s, id)?.fs;
        let (from, to) = (absolute(from), absolute(to));
        if fs.entry(&from).is_none() {
            return Err(ProviderError::not_found(format!("no such file: {from}")));
        }
        let moved = |p: &str| format!("{to}{}", &p[from.len()..]);
        for k in Fs::under(fs.files.keys(), &from) {
            let v = fs.files.remove(&k).expect("listed");
            fs.files.insert(moved(&k), v);
        }
        for k in Fs::under(fs.dirs.iter(), &from) {
            fs.dirs.remove(&k);
            fs.dirs.insert(moved(&k));
        }
        fs.add_parents(&to);
        Ok(fs.entry(&to).expect("just moved"))
    }

    async fn remove(&self, id: &str, path: &str) -> Result<()> {
        let mut s = self.enter("remove")?;
        let fs = &mut sandbox(&mut s, id)?.fs;
        let abs = absolute(path);
        if fs.entry(&abs).is_none() {
            return Err(ProviderError::not_found(format!("no such file: {abs}")));
        }
        for k in Fs::under(fs.files.keys(), &abs) {
            fs.files.remove(&k);
        }
        for k in Fs::under(fs.dirs.iter(), &abs) {
            fs.dirs.remove(&k);
        }
        Ok(())
    }
}

#[async_trait]
impl crate::provider::Ports for FakeProvider {
    fn isolated(&self) -> bool {
        true
    }

    async fn port_url(&self, id: &str, port: u16) -> Result<String> {
        let mut s = self.enter("port_url")?;
        sandbox(&mut s, id)?;
        s.port_urls.push((id.into(), port));
        Ok(format!("http://127.0.0.1:{port}"))
    }
}

#[async_trait]
impl crate::provider::Builds for FakeProvider {
    async fn build(
        &self,
        spec: crate::provider::BuildSpec,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<crate::provider::BuildOutput> {
        let name = spec.template.def.name.clone();
        let _ = log.send(format!("building {name}"));
        if spec.skip_cache {
            let _ = log.send("skip_cache".into());
        }
        let _ = log.send("done".into());
        Ok(crate::provider::BuildOutput { image: format!("fake/{name}"), digest: spec.template.digest, cached: false })
    }

    async fn deploy(
        &self,
        spec: crate::provider::BuildSpec,
        log: mpsc::UnboundedSender<String>,
    ) -> Result<crate::provider::DeployOutput> {
        let name = spec.template.def.name.clone();
        let _ = log.send(format!("deploying {name}"));
        Ok(crate::provider::DeployOutput {
            template_id: format!("tpl-{name}"),
            image: format!("fake/{name}"),
            digest: spec.template.digest,
            cached: spec.keep,
        })
    }
}

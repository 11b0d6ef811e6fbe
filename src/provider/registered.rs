//! What the providers that build templates themselves (local, docker) share: the template
//! `create` knows by name, and the build log that is both streamed and kept.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::templates::TemplateDef;

/// A template registered by `build` (what was built) or `deploy` (and what to start).
pub(crate) struct Registered<B> {
    /// The build: a local layer, a docker image.
    pub built: Arc<B>,
    /// Set by `deploy`: run in the background at create, then wait for `ready`.
    pub start: Option<String>,
    pub ready: Option<String>,
    /// template.yaml `ready_timeout`: how long `ready` may fail (the provider's bound if none).
    pub ready_timeout: Option<std::time::Duration>,
    pub ports: Vec<u16>,
    /// template.yaml `envs` with a value.
    pub envs: BTreeMap<String, String>,
    /// template.yaml `cpu` and `memory` (MiB): the sandbox's limits unless `create` says.
    pub cpu: Option<u32>,
    pub memory_mb: Option<u64>,
    /// template.yaml `disk` (MiB).
    pub disk_mb: Option<u64>,
}

// Not derived: that would ask `B: Clone`, and only the Arc is cloned.
impl<B> Clone for Registered<B> {
    fn clone(&self) -> Self {
        Self {
            built: self.built.clone(),
            start: self.start.clone(),
            ready: self.ready.clone(),
            ready_timeout: self.ready_timeout,
            ports: self.ports.clone(),
            envs: self.envs.clone(),
            cpu: self.cpu,
            memory_mb: self.memory_mb,
            disk_mb: self.disk_mb,
        }
    }
}

impl<B> Registered<B> {
    /// `def`'s registration of `built`, whose own CMD and exposed ports are the fallbacks.
    pub fn new(built: &Arc<B>, def: &TemplateDef, deploy: bool, cmd: Option<&str>, ports: &[u16]) -> Self {
        Self {
            built: built.clone(),
            start: if deploy { def.start_command.clone().or_else(|| cmd.map(str::to_string)) } else { None },
            ready: if deploy { def.ready_command.clone() } else { None },
            ready_timeout: def.ready_timeout,
            ports: if def.ports.is_empty() { ports.to_vec() } else { def.ports.clone() },
            envs: def.envs.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| (k.clone(), v.clone())).collect(),
            cpu: def.cpu,
            memory_mb: def.memory,
            disk_mb: def.disk,
        }
    }

    /// The log line of a deploy: `registered template <what>: start `..`, ready `..``.
    pub fn note(&self, what: &str) -> String {
        format!(
            "registered template {what}: start `{}`, ready `{}`",
            self.start.as_deref().unwrap_or("(none)"),
            self.ready.as_deref().map_or_else(|| format!("ports {:?}", self.ports), str::to_string)
        )
    }
}

/// A build log: every line is sent to the step's stream and kept.
pub(crate) struct BuildLog {
    tx: mpsc::UnboundedSender<String>,
    pub lines: Vec<String>,
}

impl BuildLog {
    pub fn new(tx: mpsc::UnboundedSender<String>) -> Self {
        Self { tx, lines: Vec::new() }
    }

    pub fn line(&mut self, s: impl Into<String>) {
        let s = s.into();
        let _ = self.tx.send(s.clone());
        self.lines.push(s);
    }
}

/// Puts `cell`, a `skip_cache` build, in `builds` under `key`, where the next builds of the
/// key find it; the build it replaces stays in the map under a key no build asks for, so that
/// removing the run's builds (and a template's) still finds it.
pub(crate) fn supersede<C>(builds: &mut std::collections::HashMap<String, C>, key: String, cell: C) {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    if let Some(old) = builds.insert(key.clone(), cell) {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        builds.insert(format!("{key}#superseded{n}"), old);
    }
}

/// How many lines, and bytes, of a command's output an error about a template's start or ready
/// command carries.
const TAIL_LINES: usize = 10;
const TAIL_BYTES: usize = 2048;

/// The last lines of a command's stdout and stderr (bounded), for an error.
pub(crate) fn output_tail(r: &crate::provider::ExecResult) -> String {
    let mut text = String::from_utf8_lossy(&r.stdout).into_owned();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&String::from_utf8_lossy(&r.stderr));
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
    if tail.len() > TAIL_BYTES {
        let mut cut = tail.len() - TAIL_BYTES;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = format!("…{}", &tail[cut..]);
    }
    tail
}

/// How long a deployed template's start command may take to become ready when its
/// template.yaml does not say (`ready_timeout`): code-interpreter-v1's servers and kernels took
/// over 60 s on a loaded 2-core CI machine.
pub(crate) const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// What says a started template is ready: its ready command, else every port accepting
/// connections inside the sandbox; `None` when there is nothing to wait for.
pub(crate) fn ready_probe(ready: Option<&str>, ports: &[u16]) -> Option<String> {
    match ready {
        Some(r) => Some(r.to_string()),
        None if !ports.is_empty() => Some(
            ports
                .iter()
                .map(|p| format!("(echo > /dev/tcp/127.0.0.1/{p}) 2>/dev/null"))
                .collect::<Vec<_>>()
                .join(" && "),
        ),
        None => None,
    }
}

/// Tries `probe` every 200 ms until it exits 0, within `ready_timeout` (else [`READY_TIMEOUT`]),
/// each try cut off at what is left of the wait (never less than 1 s, never more than 10 s).
/// Fails as soon as the start command has ended (`start_finished`), and when the wait is
/// over, saying why with the probe's last result and the start command's output
/// (`start_output`). `try_probe` runs the probe once as the start command's user, bounded by
/// the timeout it is given.
pub(crate) async fn wait_ready<F, Fut>(
    start: &str,
    probe: &str,
    ready_timeout: Option<std::time::Duration>,
    start_finished: impl Fn() -> bool,
    start_output: impl Fn() -> crate::provider::ExecResult,
    mut try_probe: F,
) -> crate::provider::Result<()>
where
    F: FnMut(std::time::Duration) -> Fut,
    Fut: std::future::Future<Output = crate::provider::Result<crate::provider::ExecResult>>,
{
    use crate::provider::{ErrorKind, ProviderError};
    use std::time::Duration;
    let waited = ready_timeout.unwrap_or(READY_TIMEOUT);
    let deadline = tokio::time::Instant::now() + waited;
    loop {
        if start_finished() {
            return Err(ProviderError::infra(start_exited(start, &start_output())));
        }
        // Never past the deadline: a probe that hangs is cut off with it.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let r = try_probe(left.clamp(Duration::from_secs(1), Duration::from_secs(10))).await?;
        if r.exit_code == Some(0) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProviderError::new(ErrorKind::Timeout, not_ready(probe, waited, &r, start, &start_output())));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How a command ended, for an error: `exit 3`, `killed by signal 9`, `timed out`.
fn ended(r: &crate::provider::ExecResult) -> String {
    match (r.timed_out, r.exit_code, r.signal) {
        (true, _, _) => "timed out".into(),
        (_, Some(c), _) => format!("exit {c}"),
        (_, None, Some(s)) => format!("killed by signal {s}"),
        _ => "killed".into(),
    }
}

/// The error of a template that did not become ready within `waited`: why, as far as the
/// sandbox can say: the ready probe's last exit and output, and what the start command printed
/// (E2B #1009: a failed build that does not say why).
pub(crate) fn not_ready(
    probe: &str,
    waited: std::time::Duration,
    last: &crate::provider::ExecResult,
    start: &str,
    start_out: &crate::provider::ExecResult,
) -> String {
    let within =
        if waited.subsec_nanos() == 0 { format!("{}s", waited.as_secs()) } else { crate::duration::human(waited) };
    let mut m = format!("the template did not become ready within {within}: ");
    m += &format!("its ready command `{probe}` last ended with {}", ended(last));
    let t = output_tail(last);
    m += &if t.is_empty() { " and printed nothing".to_string() } else { format!(", printing: {t}") };
    let t = output_tail(start_out);
    if !t.is_empty() {
        m += &format!("; the start command `{start}` printed: {t}");
    }
    m
}

/// The error of a start command that exited before the template was ready.
pub(crate) fn start_exited(start: &str, r: &crate::provider::ExecResult) -> String {
    let t = output_tail(r);
    format!(
        "the template's start command `{start}` exited ({}) before it was ready{}",
        ended(r),
        if t.is_empty() { ", printing nothing".to_string() } else { format!(": {t}") }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ExecResult;

    #[test]
    fn the_ready_probe_is_the_ready_command_else_every_port() {
        assert_eq!(ready_probe(Some("curl -sf localhost:9000"), &[8080]).as_deref(), Some("curl -sf localhost:9000"));
        assert_eq!(
            ready_probe(None, &[8080, 9000]).as_deref(),
            Some("(echo > /dev/tcp/127.0.0.1/8080) 2>/dev/null && (echo > /dev/tcp/127.0.0.1/9000) 2>/dev/null")
        );
        assert_eq!(ready_probe(None, &[]), None);
    }

    fn out(code: Option<i32>, stdout: &str, stderr: &str) -> ExecResult {
        ExecResult { exit_code: code, stdout: stdout.into(), stderr: stderr.into(), ..Default::default() }
    }

    #[test]
    fn a_failing_ready_command_says_why() {
        let m = not_ready(
            "echo port-not-open >&2; exit 3",
            std::time::Duration::from_secs(5),
            &out(Some(3), "", "port-not-open\n"),
            "sleep infinity",
            &out(None, "", ""),
        );
        assert_eq!(
            m,
            "the template did not become ready within 5s: its ready command `echo port-not-open >&2; exit 3` \
             last ended with exit 3, printing: port-not-open"
        );
        let m = not_ready(
            "false",
            std::time::Duration::from_secs(1),
            &out(Some(1), "", ""),
            "srv",
            &out(None, "up\n", "warn\n"),
        );
        assert!(m.ends_with("exit 1 and printed nothing; the start command `srv` printed: up\nwarn"), "{m}");
        let timed = ExecResult { timed_out: true, ..Default::default() };
        assert!(not_ready("p", std::time::Duration::from_secs(1), &timed, "s", &timed)
            .contains("last ended with timed out and printed nothing"));
    }

    #[test]
    fn a_superseded_build_stays_findable_for_removal() {
        let mut builds = std::collections::HashMap::new();
        supersede(&mut builds, "k".to_string(), 1);
        assert_eq!(builds.len(), 1);
        supersede(&mut builds, "k".to_string(), 2);
        supersede(&mut builds, "k".to_string(), 3);
        assert_eq!(builds["k"], 3, "the newest answers the key");
        let mut all: Vec<i32> = builds.values().copied().collect();
        all.sort_unstable();
        assert_eq!(all, [1, 2, 3], "the earlier builds are still there to remove");
    }

    #[test]
    fn output_tails_are_bounded() {
        let many: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(output_tail(&out(Some(1), &many, "")).lines().count(), TAIL_LINES);
        assert!(output_tail(&out(Some(1), &many, "")).ends_with("line 99"));
        let wide = "x".repeat(10_000);
        let t = output_tail(&out(Some(1), "", &wide));
        assert!(t.len() <= TAIL_BYTES + "…".len() && t.starts_with('…'));
        assert_eq!(
            start_exited("srv", &out(Some(2), "", "no such file\n")),
            "the template's start command `srv` exited (exit 2) before it was ready: no such file"
        );
    }
}

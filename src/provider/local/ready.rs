//! A deployed template's start: its start command, and the probe that waits until it is ready.

use super::*;

/// How long a deployed template's start command may take to become ready: code-interpreter-v1's
/// servers and kernels took over 60 s on a loaded 2-core CI machine.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// Starts a deployed template's start command in `sb` and waits until its ready command
/// exits 0 (or, without one, until every port accepts connections inside the sandbox).
pub(super) async fn start_template(
    sb: &Arc<Sandbox>,
    start: &str,
    ready: Option<&str>,
    ready_timeout: Option<Duration>,
    ports: &[u16],
    user: Option<&str>,
) -> Result<()> {
    // As a container's CMD: the Dockerfile's USER, else root.
    let user = Some(user.unwrap_or("root").to_string());
    let req = ExecRequest { cmd: start.to_string(), user: user.clone(), ..Default::default() };
    let (target, env, cwd) = sb.plan(&req)?;
    let p = process::launch(&target, &env, &cwd, &req, None, false, None).await?;
    sb.procs.insert(p.clone());
    let probe = match ready {
        Some(r) => r.to_string(),
        None if !ports.is_empty() => ports
            .iter()
            .map(|p| format!("(echo > /dev/tcp/127.0.0.1/{p}) 2>/dev/null"))
            .collect::<Vec<_>>()
            .join(" && "),
        None => return Ok(()),
    };
    let waited = ready_timeout.unwrap_or(READY_TIMEOUT);
    let deadline = tokio::time::Instant::now() + waited;
    loop {
        if p.finished() {
            return Err(ProviderError::infra(crate::provider::registered::start_exited(start, &p.result(false))));
        }
        // Never past the deadline: a probe that hangs is cut off with it.
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let check = ExecRequest {
            cmd: probe.clone(),
            timeout: Some(left.clamp(Duration::from_secs(1), Duration::from_secs(10))),
            user: user.clone(),
            ..Default::default()
        };
        let q = process::launch(&target, &env, &cwd, &check, None, false, None).await?;
        let r = process::finish(&q, check.timeout).await;
        if r.exit_code == Some(0) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ProviderError::new(
                crate::provider::ErrorKind::Timeout,
                crate::provider::registered::not_ready(&probe, waited, &r, start, &p.result(false)),
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

//! A deployed template's start: its start command, and the probe that waits until it is ready.

use super::*;
use crate::provider::registered;

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
    let Some(probe) = registered::ready_probe(ready, ports) else { return Ok(()) };
    registered::wait_ready(
        start,
        &probe,
        ready_timeout,
        || p.finished(),
        || p.result(false),
        |timeout| {
            let check =
                ExecRequest { cmd: probe.clone(), timeout: Some(timeout), user: user.clone(), ..Default::default() };
            let (target, env, cwd) = (&target, &env, &cwd);
            async move {
                let q = process::launch(target, env, cwd, &check, None, false, None).await?;
                Ok(process::finish(&q, check.timeout).await)
            }
        },
    )
    .await
}

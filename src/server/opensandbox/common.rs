//! What the handlers of OpenSandbox's side share, below them and below the router
//! (`opensandbox/mod.rs`): the ports and headers, finding a sandbox made through this API,
//! query pairs, the token that opens a port, and event-stream bodies.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;

use super::records::OsSandbox;
use crate::server::answer::not_found;
use crate::server::state::{now_us, AppState, ServedSandbox};

/// execd's port inside an OpenSandbox sandbox.
pub(crate) const EXECD_PORT: u16 = 44772;

/// The egress sidecar's port.
pub(crate) const EGRESS_PORT: u16 = 18080;

/// The header of OpenSandbox's secured endpoints, which serve's endpoints always name.
pub(crate) const ACCESS_HEADER: &str = "OpenSandbox-Secure-Access";

impl OsSandbox {
    pub(super) fn touch(&self) {
        self.transition_us.store(now_us(), std::sync::atomic::Ordering::SeqCst);
    }
}

/// The sandbox `id` made through this API, alive; the 404 otherwise.
pub(super) async fn find(
    st: &Arc<AppState>,
    id: &str,
) -> Result<(Arc<ServedSandbox>, Arc<OsSandbox>, crate::provider::SandboxInfo), Response> {
    let Some(os) = st.opensandbox.get(id) else {
        return Err(not_found(id));
    };
    match st.lookup(id).await {
        Some((sb, info)) => Ok((sb, os, info)),
        None => {
            st.opensandbox.remove(id);
            Err(not_found(id))
        }
    }
}

/// Query pairs, each decoded once as a form value (what the reference server's framework
/// hands a handler: lossy, where E2B's side refuses bytes that are not UTF-8).
pub(super) fn query_pairs(raw: Option<&str>) -> Vec<(String, String)> {
    let dec = crate::net::form_decode;
    crate::net::query_split(raw).map(|(k, v)| (dec(k), dec(v))).collect()
}

/// The token that opens `port` of `sb` (execd and the egress sidecar: the envd token; any
/// other port: the traffic token).
pub(super) fn port_token(sb: &ServedSandbox, port: u16) -> &str {
    if port == EXECD_PORT || port == EGRESS_PORT {
        &sb.tokens.envd
    } else {
        &sb.tokens.traffic
    }
}

/// The body of an SSE-like stream of events, from a channel.
pub(crate) fn channel_body(rx: tokio::sync::mpsc::Receiver<axum::body::Bytes>) -> Body {
    let s = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Body::from_stream(s)
}

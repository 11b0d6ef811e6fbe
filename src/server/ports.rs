//! Requests to a port inside a served sandbox: each one over a connection dialled for it
//! through the provider ([`Ports::dial`]: from inside the sandbox's network namespace on the
//! local provider). Nothing listens on the host for a sandbox's port, so no local user can
//! reach a private port around serve's traffic token (rule 2 of the threat model: no listener
//! goes around an access rule).
//!
//! [`Ports::dial`]: crate::provider::Ports::dial

use axum::body::Body;
use axum::extract::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::state::{AppState, ServedSandbox};

/// Why a request did not get an answer from the sandbox's port.
#[derive(Debug)]
pub(crate) enum SendError {
    /// Nothing listens on the port, or the sandbox's network cannot be entered.
    Closed,
    /// The connection was made and then failed before an answer.
    Broken,
}

/// Sends `req` (its URI's path and query, its headers as given) to `port` in `sb` over a new
/// HTTP/1.1 connection, header names in title case as E2B's Go proxy writes them.
pub(crate) async fn send(
    st: &AppState,
    sb: &ServedSandbox,
    port: u16,
    req: Request<Body>,
) -> Result<hyper::Response<Incoming>, SendError> {
    let stream = st.provider.sandbox(&sb.provider_id).dial(port).await.map_err(|_| SendError::Closed)?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|_| SendError::Closed)?;
    // The connection ends with the response's body (or when the sandbox goes).
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|_| SendError::Broken)
}

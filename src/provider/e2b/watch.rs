//! Directory watches over envd's `Filesystem/WatchDir` stream (protocol doc §5): `start`
//! first, then one `filesystem {name, type}` per change, keepalives while idle. A task reads
//! the stream into a queue that [`DirWatch::drain`] empties; dropping the watch ends the task
//! and so the request, which stops the watch in envd.

use std::sync::{Arc, Mutex};

use serde::Deserialize;
use tokio::sync::Notify;

use super::envd::{RpcError, RpcStream};
use crate::provider::{DirWatch, FsEvent, FsOp, ProviderError};

#[derive(Debug, Default, Deserialize)]
struct WatchMessage {
    #[serde(default)]
    start: Option<serde_json::Value>,
    #[serde(default)]
    filesystem: Option<FsEventJson>,
}

#[derive(Debug, Default, Deserialize)]
struct FsEventJson {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "type")]
    kind: serde_json::Value,
}

/// envd's `EventType`, as its name (`EVENT_TYPE_WRITE`) or number (2).
fn op(v: &serde_json::Value) -> Option<FsOp> {
    let n = match v {
        serde_json::Value::Number(n) => n.as_u64()?,
        serde_json::Value::String(s) => match s.trim_start_matches("EVENT_TYPE_") {
            "CREATE" => 1,
            "WRITE" => 2,
            "REMOVE" => 3,
            "RENAME" => 4,
            "CHMOD" => 5,
            _ => return None,
        },
        _ => return None,
    };
    Some(match n {
        1 => FsOp::Create,
        2 => FsOp::Write,
        3 => FsOp::Remove,
        4 => FsOp::Rename,
        5 => FsOp::Chmod,
        _ => return None,
    })
}

fn parse(msg: &[u8], what: &str) -> Result<WatchMessage, RpcError> {
    serde_json::from_slice(msg).map_err(|e| {
        RpcError::Other(ProviderError::infra(format!(
            "{what}: malformed watch event ({e}): {}",
            super::connect::snippet(msg)
        )))
    })
}

/// Reads up to the `start` message: the watch is in place once it has come.
pub async fn read_start(stream: &mut RpcStream, what: &str) -> Result<(), RpcError> {
    loop {
        let Some(msg) = stream.next().await? else {
            return Err(RpcError::Other(ProviderError::infra(format!("{what}: stream ended before the start event"))));
        };
        let m = parse(&msg, what)?;
        if m.start.is_some() {
            return Ok(());
        }
        if m.filesystem.is_some() {
            return Err(RpcError::Other(ProviderError::infra(format!("{what}: an event came before the start event"))));
        }
    }
}

/// A watch whose stream a task reads.
pub struct StreamWatch {
    queue: Arc<Mutex<Vec<FsEvent>>>,
    arrived: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl StreamWatch {
    /// Reads `stream` (past its `start`) in a task of its own.
    pub fn start(mut stream: RpcStream, what: String) -> Self {
        let queue: Arc<Mutex<Vec<FsEvent>>> = Arc::default();
        let arrived = Arc::new(Notify::new());
        let (q, n) = (queue.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            // Ends at the end of the stream or on its first error; the queue keeps what came.
            while let Ok(Some(msg)) = stream.next().await {
                let Ok(m) = parse(&msg, &what) else { break };
                let Some(ev) = m.filesystem else { continue };
                let Some(op) = op(&ev.kind) else { continue };
                q.lock().expect("watch queue").push(FsEvent { name: ev.name, op });
                n.notify_waiters();
            }
        });
        Self { queue, arrived, task }
    }
}

impl Drop for StreamWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DirWatch for StreamWatch {
    fn drain(&self) -> Vec<FsEvent> {
        std::mem::take(&mut *self.queue.lock().expect("watch queue"))
    }

    fn arrived(&self) -> Arc<Notify> {
        self.arrived.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn event_types_by_name_and_number() {
        assert_eq!(op(&json!("EVENT_TYPE_WRITE")), Some(FsOp::Write));
        assert_eq!(op(&json!(1)), Some(FsOp::Create));
        assert_eq!(op(&json!("EVENT_TYPE_CHMOD")), Some(FsOp::Chmod));
        assert_eq!(op(&json!("EVENT_TYPE_UNSPECIFIED")), None);
        assert_eq!(op(&json!(0)), None);
    }
}

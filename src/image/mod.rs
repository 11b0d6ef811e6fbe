//! Root filesystems for sandboxes (placeholder until the image store lands: `base` is the
//! directory named by `SCENARIO_RUN_BASE_ROOTFS`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::mpsc;

/// Host ids that a sandbox's ids `0..len` map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub host_base: u32,
    pub len: u32,
}

impl IdMap {
    pub fn from_env() -> Self {
        let parsed = std::env::var("SCENARIO_RUN_ID_MAP").ok().and_then(|v| {
            let (b, l) = v.trim().split_once(':')?;
            Some(Self { host_base: b.parse().ok()?, len: l.parse().ok()? })
        });
        parsed.unwrap_or(Self { host_base: 100_000_000, len: 65536 })
    }
}

#[derive(Debug, Clone, Default)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub cmd: Option<Vec<String>>,
    pub entrypoint: Option<Vec<String>>,
    pub exposed_ports: Vec<u16>,
}

#[derive(Debug)]
pub struct Rootfs {
    pub reference: String,
    pub resolved: String,
    pub digest: String,
    pub dir: PathBuf,
    pub config: ImageConfig,
}

pub struct RegistryAuth {
    pub username: String,
    pub password: String,
}

#[derive(Debug)]
pub struct ImageError(pub String);

impl From<ImageError> for crate::provider::ProviderError {
    fn from(e: ImageError) -> Self {
        crate::provider::ProviderError::infra(e.0)
    }
}

#[derive(Debug, Clone)]
pub struct ImageStore {
    ids: IdMap,
}

impl ImageStore {
    pub fn from_env() -> Self {
        Self { ids: IdMap::from_env() }
    }
    pub fn ids(&self) -> IdMap {
        self.ids
    }
    pub async fn get(
        &self,
        reference: &str,
        _auth: Option<&RegistryAuth>,
        _log: &mpsc::UnboundedSender<String>,
    ) -> Result<Arc<Rootfs>, ImageError> {
        let dir = std::env::var("SCENARIO_RUN_BASE_ROOTFS").map_err(|_| ImageError("no image store".into()))?;
        let _ = BTreeMap::<String, String>::new();
        Ok(Arc::new(Rootfs {
            reference: reference.into(),
            resolved: dir.clone(),
            digest: "sha256:placeholder".into(),
            dir: dir.into(),
            config: ImageConfig::default(),
        }))
    }
}

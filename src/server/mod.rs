//! `scenario-run serve`: a local E2B-compatible server (control plane and envd on one port)
//! over any [`Provider`], so the unmodified E2B SDKs can drive local sandboxes.
//!
//! Protocol reference: `docs/e2b-protocol.md` (§9 is the minimum this implements). Built on
//! axum 0.8 (hyper 1 underneath): the routes, JSON and multipart extraction come for free, and
//! streaming bodies are plain streams.
//!
//! # Routing (one port)
//!
//! The port speaks plain HTTP and HTTPS (`tls`: sniffed per connection, certificates from a
//! local CA): the SDKs address a sandbox port as `https://{port}-{id}.{domain}`, and routing
//! is the same whichever way a request came. Every request goes through `dispatch`, in this
//! order:
//!
//! 1. `Host: {port}-{id}.<anything>` (what `Sandbox.get_host(port)` returns, with the
//!    `domain` this server reports, `localhost:<port>`): port 49983 is envd of sandbox `id`,
//!    any other port is forwarded into the sandbox (see `proxy`).
//! 2. An `E2b-Sandbox-Id` header (what the SDK sends on every envd call when
//!    `E2B_SANDBOX_URL` points here): envd of that sandbox, or the port in
//!    `E2b-Sandbox-Port` if that is not 49983. An unknown or killed sandbox answers 502
//!    `{"sandboxId":<id>,"code":502,"message":"The sandbox was not found"}`, E2B's proxy's
//!    words (the SDK raises `SandboxNotRunningException`).
//! 3. A `/files` request with a `signature` and neither of the above (a signed URL the SDK
//!    built on `E2B_SANDBOX_URL`): envd of the sandbox whose token made the signature.
//! 4. Otherwise the control plane, which needs the API key (`X-API-KEY`, or
//!    `Authorization: Bearer`) on every route but `/health`; a missing or wrong key is 401
//!    `{"code":401,"message":…}`.
//!
//! Sandbox bodies of create, detail and connect also name `envdUrl`: the origin the request
//! came to. The product's client (`agent-sandbox-client`) takes envd from it, as the platform
//! may name one, and would otherwise derive `https://49983-{id}.{domain}`; it sends
//! `E2b-Sandbox-Id` on every envd call, so rule 2 routes it (see `control::with_envd_url`).
//!
//! Data-plane requests (1–3) are authenticated by `auth`: envd needs the sandbox's
//! `envdAccessToken` (or a `/files` signature), a port its `trafficAccessToken` unless create
//! asked for public traffic; the API key opens both.
//!
//! # Limits ([`Limits`])
//!
//! Live sandboxes are capped (`--max-sandboxes`, 429 past it, as E2B's concurrency limit), and
//! admitted by the memory they declare against the host's (`--memory-overcommit`, 429 past it:
//! `admission`);
//! `/files` uploads are spooled to disk while they arrive, capped in size and in how far a
//! gzip body may inflate (`files`); Connect request bodies are capped at [`RPC_BODY_LIMIT`];
//! each process output subscriber may queue a bounded number of bytes (`procs`).
//!
//! # Fault injection ([`Faults`], all off by default)
//!
//! Applied to every request except `/health`: a fixed latency before handling; every Nth
//! request answered 429 (with `Retry-After: 1`); every Nth request answered 503 (retried by
//! the SDKs); and streamed bodies (process output streams, file downloads) cut, i.e. the
//! connection aborted, after a number of bytes. `--fault-control-plane-only` keeps envd (and
//! port) traffic free of the 429/503 faults, to test a client's control-plane retry policy.
//!
//! # Accounting
//!
//! Creates are counted, and a create carrying an `Idempotency-Key` already seen on a create
//! that was answered with a 5xx other than a refusal, or with success, is counted as a
//! *double create*: the client repeated what may already have been done. `GET /_serve/stats`
//! (API key) answers `{"live","creates","refusedCreates","doubleCreates"}`; the fault
//! matrix (`scripts/fault-matrix`) reads it.
//!
//! # Lifecycle
//!
//! Sandboxes expire at their end time (the provider kills them); [`serve`] runs until its
//! shutdown future resolves and then destroys every sandbox it created, and removes every
//! template built through the template API (`templates`, protocol doc §8.1) and its work
//! directory (`work_dir`; what a SIGKILLed serve leaves is swept by the next serve or run).

mod access_log;
mod admission;
mod args;
mod auth;
mod body;
mod build_dir;
mod connect;
mod control;
mod envd;
mod files;
pub mod mutants;
mod opensandbox;
pub use opensandbox::VolumeConfig;
mod ports;
mod procs;
mod proxy;
mod scrub;
mod snapshots;
mod templates;
pub(crate) use templates::BUILT_OFFICIAL;
pub mod tls;
mod work_dir;

pub use args::ServeArgs;
pub use work_dir::sweep_stale as sweep_stale_work_dirs;

use std::collections::{HashMap, VecDeque};
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::StreamExt;
use tower::ServiceExt;

use crate::provider::{Provider, SandboxInfo};

/// The envd port of the E2B protocol.
pub const ENVD_PORT: u16 = 49983;
/// How long in-flight requests may take to finish after shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// E2B's fixed legacy `clientID`.
const CLIENT_ID: &str = "6532622b";
/// The envd version reported: the SDKs turn features on by it, so it is the newest whose
/// features serve implements: 0.5.7's default user, `close_stdin`, octet-stream and gzip
/// uploads; 0.6.2's file metadata (`user.e2b.*` xattrs); 0.6.3's entries in watch events;
/// 0.6.4's `allowNetworkMounts` watch flag (there are no network mounts to refuse).
pub const ENVD_VERSION: &str = "0.6.4";

/// Fault injection settings; see the module documentation.
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

/// Bounds on what clients may make serve hold; see the module documentation.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most sandboxes alive at once; a create past it answers 429.
    pub max_sandboxes: u32,
    /// Most bytes one `/files` upload may write (all its files, after decompression).
    pub max_upload: u64,
    /// Most a gzip upload may inflate, as a multiple of its compressed size (counted once it
    /// has inflated past [`files::INFLATE_GRACE`]).
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

/// Options of [`serve`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The API key clients must send.
    pub api_key: String,
    pub faults: Faults,
    /// Platform faults (`--fault`, see `mutants`); none by default.
    pub mutants: mutants::Mutants,
    pub limits: Limits,
    /// HTTPS beside plain HTTP on the port (see `tls`), with these certificates.
    pub tls: Option<Arc<tls::Certs>>,
    /// Whether a sandbox whose create does not say `network.allowPublicTraffic` gets E2B's
    /// default, public ports (`--allow-public-traffic`); otherwise its ports need its traffic
    /// token, as with `allowPublicTraffic: false`.
    pub public_traffic: bool,
    /// Where OpenSandbox's volumes may come from (`--host-volume-prefix`, `--volumes-dir`).
    pub volumes: opensandbox::VolumeConfig,
    /// `SCENARIO_RUN_TEMPLATES_DIR` as the run reads it (the environment, then `./.env`).
    pub templates_dir: Option<String>,
    /// `-v`: one line per request on stderr (see `access_log`).
    pub log_requests: bool,
}

/// What happened to a create, for double-create accounting.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CreateOutcome {
    /// Refused before anything was made (429, `Should-Retry: true`, a 4xx): repeating is fine.
    Refused,
    /// Made, or maybe made (a 5xx that is not a refusal): repeating may make a second one.
    MaybeMade,
}

/// Creates seen, by `Idempotency-Key`; see the module documentation.
#[derive(Debug, Default)]
struct CreateLog {
    creates: u64,
    refused: u64,
    doubles: u64,
    by_key: HashMap<String, CreateOutcome>,
    order: VecDeque<String>,
}

/// Keys remembered for double-create accounting.
const CREATE_KEYS_KEPT: usize = 4096;

impl CreateLog {
    fn record(&mut self, key: Option<&str>, outcome: CreateOutcome) {
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
    pub procs: procs::Table,
    pub tokens: auth::Tokens,
    /// Resource samples taken for `GET /sandboxes/{id}/metrics`, oldest first.
    pub samples: Mutex<Vec<control::Sample>>,
    /// Its egress lists as create or the last network update set them.
    pub network: Mutex<crate::provider::NetworkPolicy>,
    /// The lifetime create gave it, which a resume on traffic gives it again.
    pub timeout_secs: u64,
    /// What happens at its end time, and how it wakes (see `control::Lifecycle`).
    pub lifecycle: control::Lifecycle,
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
    pub watchers: Mutex<HashMap<String, Arc<envd::Watcher>>>,
    /// create's `envVars`, which its forks get too.
    pub env_vars: std::collections::BTreeMap<String, String>,
    /// Its ports answer without the traffic token (create's `network.allowPublicTraffic`).
    pub public_ports: bool,
    /// The `Host` its servers are sent (create's `network.maskRequestHost`; see `proxy`).
    pub mask_host: Option<String>,
    /// Its place under `--max-sandboxes`, given back when the record goes.
    pub _slot: tokio::sync::OwnedSemaphorePermit,
    /// The memory promised to it (see `admission`), given back when the record goes.
    pub _memory: admission::MemoryClaim,
}

pub(crate) struct AppState {
    pub provider: Arc<dyn Provider>,
    api_key: String,
    /// Reported as `domain`, so `get_host(port)` gives `{port}-{id}.localhost:<port>`.
    pub domain: String,
    pub faults: Faults,
    /// Platform faults (`--fault`): host-side configuration, never a client's to switch.
    pub mutants: mutants::Mutants,
    /// What a create that does not say `allowPublicTraffic` gets (see [`ServeOptions`]).
    pub public_traffic: bool,
    requests: AtomicU64,
    sandboxes: Mutex<HashMap<String, Arc<ServedSandbox>>>,
    by_provider: Mutex<HashMap<String, String>>,
    /// Templates built through the template API.
    pub templates: templates::Store,
    /// Snapshots taken through the API (and those behind forks).
    pub snapshots: snapshots::Store,
    /// `http://<listen address>`: where upload URLs point.
    pub base_url: String,
    pub limits: Limits,
    /// One permit per sandbox that may still be made (`--max-sandboxes`).
    pub slots: Arc<tokio::sync::Semaphore>,
    /// The memory promised to live sandboxes (`--memory-overcommit`).
    pub memory: Arc<admission::MemoryBook>,
    creates: Mutex<CreateLog>,
    /// Where `/files` uploads are spooled while they arrive.
    pub spool: files::Spool,
    /// OpenSandbox's protocol beside E2B's (see `opensandbox`).
    pub opensandbox: opensandbox::State,
}

impl AppState {
    fn register(&self, sb: Arc<ServedSandbox>) {
        self.by_provider.lock().expect("ids").insert(sb.provider_id.clone(), sb.id.clone());
        self.sandboxes.lock().expect("sandboxes").insert(sb.id.clone(), sb);
    }

    fn unregister(&self, id: &str) {
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
    async fn end(&self, sb: &ServedSandbox, answer: std::time::Duration) -> crate::provider::Result<bool> {
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
    fn sandbox(&self, id: &str) -> Option<Arc<ServedSandbox>> {
        self.sandboxes.lock().expect("sandboxes").get(id).cloned()
    }

    /// Every live record (for finding the signer of a signed URL).
    pub(crate) fn all_sandboxes(&self) -> Vec<Arc<ServedSandbox>> {
        self.sandboxes.lock().expect("sandboxes").values().cloned().collect()
    }

    fn by_provider_id(&self, pid: &str) -> Option<Arc<ServedSandbox>> {
        let id = self.by_provider.lock().expect("ids").get(pid).cloned()?;
        self.sandbox(&id)
    }

    /// Forgets sandboxes the provider no longer has (expired at their end time, say).
    ///
    /// Only records registered *before* asking the provider are candidates: a create that
    /// finishes on another worker thread while `list` runs registers a sandbox the snapshot
    /// cannot contain, and judging it by that snapshot made it "not found" right after its
    /// create (11 to 23 of 1,000 scenarios at -j 200 in bench/run).
    async fn prune(&self) {
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

/// A JSON error body in the control-plane shape `{"code":<status>,"message":…}`.
pub(crate) fn json_error(status: StatusCode, message: &str) -> Response {
    let message = scrub::answer(status.as_u16(), message);
    let body = serde_json::json!({"code": status.as_u16(), "message": message});
    (status, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string()).into_response()
}

/// A new E2B sandbox ID: 20 characters of `[a-z0-9]`.
fn new_sandbox_id() -> String {
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

/// What the host offers, reported as a sandbox's resources when create names none: CPUs,
/// memory in MiB, root filesystem size in MiB (the local provider does not limit them).
fn host_resources() -> (u32, u64, u64) {
    let cpus = std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1);
    let si = rustix::system::sysinfo();
    let mem = si.totalram as u64 * si.mem_unit as u64 / (1024 * 1024);
    let disk = rustix::fs::statvfs(c"/").map_or(0, |sv| sv.f_blocks * sv.f_frsize / (1024 * 1024));
    (cpus, mem, disk)
}

/// Wraps a body so that the connection is aborted after `limit` bytes (fault injection).
pub(crate) fn limit_body(body: Body, limit: Option<u64>) -> Body {
    let Some(limit) = limit else {
        return body;
    };
    let mut sent = 0u64;
    let s = body.into_data_stream().scan(false, move |cut, chunk| {
        if *cut {
            return futures_util::future::ready(None);
        }
        let item = match chunk {
            Ok(b) if sent + b.len() as u64 > limit => {
                *cut = true;
                let keep = (limit - sent) as usize;
                sent = limit;
                // A short last chunk, then an error: hyper drops the connection mid-body.
                return futures_util::future::ready(Some(futures_util::stream::iter(vec![
                    Ok(b.slice(..keep)),
                    Err(std::io::Error::other("fault injection: stream cut")),
                ])));
            }
            Ok(b) => {
                sent += b.len() as u64;
                Ok(b)
            }
            Err(e) => Err(std::io::Error::other(e)),
        };
        futures_util::future::ready(Some(futures_util::stream::iter(vec![item])))
    });
    Body::from_stream(s.flatten().map(|r: Result<Bytes, std::io::Error>| r))
}

fn not_running(id: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "code": 502,
        // E2B's proxy's words exactly (the JS SDK's tests compare them); the id is beside.
        "message": "The sandbox was not found",
    });
    let mut r =
        (StatusCode::BAD_GATEWAY, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    // A missing sandbox does not come back: spare the client its retries.
    r.headers_mut().insert("should-retry", HeaderValue::from_static("false"));
    r
}

/// What reaching a paused sandbox answers (what E2B's proxy answers for one).
fn paused(id: &str) -> Response {
    let body = serde_json::json!({
        "sandboxId": id,
        "code": 502,
        "message": format!("The sandbox {id} is paused; connect to it to resume it"),
    });
    let mut r =
        (StatusCode::BAD_GATEWAY, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    r.headers_mut().insert("should-retry", HeaderValue::from_static("false"));
    r
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

fn authorized(st: &AppState, req: &Request) -> bool {
    let h = req.headers();
    let key = h.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let ok = |k: Option<&str>| k.is_some_and(|k| auth::ct_eq(k.as_bytes(), st.api_key.as_bytes()));
    ok(key) || ok(bearer) || st.mutants.has(mutants::Fault::AnyApiKey)
}

/// Reads (and drops) what is left of a refused request's body, up to 1 MiB and 5 s: a
/// response before the body makes hyper close the connection, and a client that reuses it
/// from its pool (the SDK after a refused create) sees "disconnected without a response".
pub(crate) async fn drain(body: Body) {
    let _ = tokio::time::timeout(Duration::from_secs(5), axum::body::to_bytes(body, 1 << 20)).await;
}

/// Injected faults for this request, if any.
async fn inject(st: &AppState) -> Option<Response> {
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

/// The socket a request came in on, so that a stream whose sandbox dies can be cut as a
/// dying envd's is: with a reset (see [`reset_on_close`]), not a clean close. And whether it
/// speaks TLS.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnSocket {
    fd: std::os::fd::RawFd,
    tls: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, tls::Listener>> for ConnSocket {
    fn connect_info(stream: axum::serve::IncomingStream<'_, tls::Listener>) -> Self {
        use std::os::fd::AsRawFd;
        ConnSocket { fd: stream.io().as_raw_fd(), tls: stream.io().is_tls() }
    }
}

/// Set by serve on every control-plane request (any such header a client sent is replaced):
/// `https` when it came over TLS, else `http`; `envdUrl` is given that scheme.
pub(crate) const SCHEME_HEADER: &str = "x-scenario-run-scheme";

/// Makes the connection of a request whose response is still streaming end with a TCP reset
/// when it is closed (`SO_LINGER` 0): over HTTP/1.1 that is how the SDKs see a connection
/// dropped mid-request (a transport failure, after which they ask `/health` whether the
/// sandbox is gone) rather than a truncated body. Only for a response still being written,
/// so the socket is the request's own.
pub(crate) fn reset_on_close(sock: Option<ConnSocket>) {
    let Some(ConnSocket { fd, .. }) = sock else { return };
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: plain setsockopt on a descriptor the server holds open; a failure is harmless.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

struct Routers {
    control: Router,
    envd: Router,
}

/// Routes one request; see the module documentation.
async fn dispatch(st: Arc<AppState>, routers: Arc<Routers>, req: Request) -> Response {
    let create = req.method() == Method::POST && matches!(req.uri().path(), "/sandboxes" | "/v2/sandboxes");
    if !create {
        return route(&st, &routers, req).await;
    }
    let key = req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_string);
    let resp = route(&st, &routers, req).await;
    let s = resp.status();
    let should_retry = resp.headers().get("should-retry").and_then(|v| v.to_str().ok()).map(str::trim);
    let outcome = if s.is_success() {
        CreateOutcome::MaybeMade
    } else if s == StatusCode::TOO_MANY_REQUESTS || should_retry.is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        CreateOutcome::Refused
    } else if s.is_server_error() {
        CreateOutcome::MaybeMade
    } else {
        CreateOutcome::Refused
    };
    st.creates.lock().expect("creates").record(key.as_deref(), outcome);
    resp
}

/// Where a data-plane request goes: `(sandbox id, port)` from the host or the headers.
fn data_target(req: &Request) -> Option<(String, u16)> {
    let host = req.headers().get(header::HOST).and_then(|v| v.to_str().ok()).map(str::to_string);
    let host = host.or_else(|| req.uri().host().map(str::to_string)).unwrap_or_default();
    if let Some((port, id)) = proxy::host_route(&host) {
        return Some((id.to_string(), port));
    }
    let id = req.headers().get("e2b-sandbox-id").and_then(|v| v.to_str().ok())?;
    let port = req
        .headers()
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or(ENVD_PORT);
    Some((id.trim().to_string(), port))
}

/// A signed `/files` URL that names no sandbox (see `auth::find_signer`).
fn signed_files(req: &Request) -> bool {
    req.uri().path() == "/files" && req.uri().query().is_some_and(|q| q.split('&').any(|p| p.starts_with("signature=")))
}

async fn route(st: &Arc<AppState>, routers: &Routers, mut req: Request) -> Response {
    let target = data_target(&req);
    // OpenSandbox's lifecycle API (`/v1/…`) and its proxy route, beside E2B's.
    if target.is_none() && opensandbox::claims(req.uri().path()) {
        return opensandbox::route(st, req).await;
    }
    let is_data = target.is_some() || signed_files(&req);
    // Health and serve's own accounting are never faulted: they observe the faults.
    let observer = req.uri().path() == "/health" || req.uri().path().starts_with("/_serve/");
    let exempt = observer || (st.faults.control_plane_only && is_data);
    if !exempt {
        if let Some(r) = inject(st).await {
            return r;
        }
    }
    let sb = match target {
        Some((id, port)) => {
            let Some((sb, _)) = st.lookup(&id).await else {
                return not_running(&id);
            };
            if sb.is_paused() {
                // E2B's proxy wakes a paused sandbox that asked for it on traffic; any other
                // stays paused and unreachable (`is_running()` is then false).
                let woken = sb.lifecycle.auto_resume && control::resume(st, &sb, sb.timeout_secs).await.is_ok();
                if !woken {
                    drain(req.into_body()).await;
                    return paused(&id);
                }
            }
            if port != ENVD_PORT {
                let sb = if st.mutants.has(mutants::Fault::PortRoutesToOldest) {
                    st.all_sandboxes().into_iter().min_by_key(|s| s.seq).unwrap_or(sb)
                } else {
                    sb
                };
                if let Err(r) = auth::port(st, &sb, req.headers()) {
                    drain(req.into_body()).await;
                    return r;
                }
                auth::strip_credentials(st, &sb, req.headers_mut());
                return proxy::forward(st, &sb, port, req).await;
            }
            let checked = if req.uri().path() == "/files" {
                let q = auth::Signed::from_query(req.uri().query());
                auth::files(st, &sb, req.method(), &q, req.headers())
            } else {
                auth::envd(st, &sb, req.uri().path(), req.headers())
            };
            if let Err(r) = checked {
                drain(req.into_body()).await;
                return r;
            }
            sb
        }
        None if is_data => {
            let q = auth::Signed::from_query(req.uri().query());
            // Found by its signature, then held to envd's rules like any other (a token
            // header present must match).
            let found = match auth::find_signer(st, req.method(), &q) {
                Ok(sb) => auth::files(st, &sb, req.method(), &q, req.headers()).map(|()| sb),
                Err(r) => Err(r),
            };
            match found {
                Ok(sb) => sb,
                Err(r) => {
                    drain(req.into_body()).await;
                    return r;
                }
            }
        }
        None => {
            // Upload URLs carry their own one-time token, like presigned URLs.
            let open = req.uri().path() == "/health" || req.uri().path().starts_with("/_upload/");
            if !open && !authorized(st, &req) {
                drain(req.into_body()).await;
                return json_error(
                    StatusCode::UNAUTHORIZED,
                    "Invalid API key, please visit https://e2b.dev/docs/api-key",
                );
            }
            if req.uri().path() == "/_serve/stats" {
                return stats(st).await;
            }
            let tls = req.extensions().get::<axum::extract::ConnectInfo<ConnSocket>>().is_some_and(|c| c.0.tls);
            req.headers_mut().insert(SCHEME_HEADER, HeaderValue::from_static(if tls { "https" } else { "http" }));
            let r = routers.control.clone().oneshot(req).await.into_response();
            if st.mutants.has(mutants::Fault::UnknownSandbox500) && r.status() == StatusCode::NOT_FOUND {
                return json_error(StatusCode::INTERNAL_SERVER_ERROR, "internal error");
            }
            return r;
        }
    };
    req.extensions_mut().insert(sb);
    let sock = req.extensions().get::<axum::extract::ConnectInfo<ConnSocket>>().map(|c| c.0);
    req.extensions_mut().insert(sock);
    routers.envd.clone().oneshot(req).await.into_response()
}

/// `GET /_serve/stats`: live sandboxes and create accounting.
async fn stats(st: &AppState) -> Response {
    st.prune().await;
    let live = st.sandboxes.lock().expect("sandboxes").len();
    let c = st.creates.lock().expect("creates");
    let body = serde_json::json!({
        "live": live,
        "creates": c.creates,
        "refusedCreates": c.refused,
        "doubleCreates": c.doubles,
    });
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// Serves the E2B API on `listener` until `shutdown` resolves, then destroys every sandbox
/// the provider still holds. Returns how many were destroyed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Arc<dyn Provider>,
    opts: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<usize> {
    let addr: SocketAddr = listener.local_addr()?;
    // What SIGKILLed serves left, then this one's own (see `work_dir`).
    work_dir::sweep_stale();
    let work = work_dir::create_in(&std::env::temp_dir(), addr.port())?;
    let st = Arc::new(AppState {
        provider: provider.clone(),
        api_key: opts.api_key,
        domain: format!("localhost:{}", addr.port()),
        faults: opts.faults,
        mutants: opts.mutants,
        public_traffic: opts.public_traffic,
        requests: AtomicU64::new(0),
        sandboxes: Mutex::new(HashMap::new()),
        by_provider: Mutex::new(HashMap::new()),
        templates: templates::Store::new(work.clone()).with_templates_dir(opts.templates_dir.clone()),
        snapshots: Default::default(),
        base_url: format!("http://{addr}"),
        slots: Arc::new(tokio::sync::Semaphore::new(opts.limits.max_sandboxes as usize)),
        memory: admission::MemoryBook::new(opts.limits.memory_overcommit),
        spool: files::Spool::new(work.join("spool"), opts.limits.max_upload),
        limits: opts.limits,
        creates: Mutex::new(CreateLog::default()),
        opensandbox: opensandbox::State::new(opts.volumes.clone()),
    });
    let state = st.clone();
    let control = control::router(snapshots::routes(templates::routes(Router::new())), st.clone());
    // After the RPC routes' body limit: uploads are streamed to disk under their own (`files`).
    let files =
        axum::routing::get(files::download).post(files::upload).layer(axum::extract::DefaultBodyLimit::disable());
    let envd = envd::routes().route("/files", files).with_state(st.clone());
    let routers = Arc::new(Routers { control, envd });
    let log = opts.log_requests;
    let app = Router::new().fallback(move |req: Request| {
        let line = log.then(|| access_log::describe(&req));
        access_log::logged(line, dispatch(st.clone(), routers.clone(), req))
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = app.into_make_service_with_connect_info::<ConnSocket>();
    let tls_config = match &opts.tls {
        Some(certs) => Some(certs.server_config()?),
        None => None,
    };
    let listener = tls::Listener::new(listener, tls_config)?;
    let server = axum::serve(listener, app).with_graceful_shutdown(async {
        let _ = stop_rx.await;
    });
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => r?,
        _ = shutdown => {
            let _ = stop_tx.send(());
            // Open process streams and idle keep-alive connections would hold a graceful
            // shutdown forever: give in-flight requests a moment, then drop them.
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await;
        }
    }
    {
        let c = state.creates.lock().expect("creates");
        crate::errln!(
            "serve: {} creates, {} refused, {} double (repeated after a 5xx that was not a refusal, or after success)",
            c.creates,
            c.refused,
            c.doubles
        );
    }
    let destroyed = provider.destroy_all().await;
    // Templates made through the API go with the server.
    for id in state.templates.ids().into_iter().chain(state.snapshots.all_ids()).chain(state.opensandbox.template_ids())
    {
        provider.remove_template(&id).await;
    }
    provider.remove_builds().await;
    state.templates.remove_all();
    Ok(destroyed)
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

    #[tokio::test]
    async fn cut_bodies_stop_at_the_limit() {
        let body = limit_body(Body::from(vec![7u8; 100]), Some(10));
        let r = axum::body::to_bytes(body, usize::MAX).await;
        assert!(r.is_err());
        let body = limit_body(Body::from(vec![7u8; 10]), Some(10));
        assert_eq!(axum::body::to_bytes(body, usize::MAX).await.unwrap().len(), 10);
    }
}

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
mod answer;
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
mod sandboxes;
mod scrub;
mod snapshots;
mod state;
mod templates;
pub(crate) use templates::BUILT_OFFICIAL;
pub mod tls;
mod users;
mod work_dir;

pub use args::{ServeArgs, ServeOptions};
pub use state::{Faults, Limits, ENVD_PORT, ENVD_VERSION, RPC_BODY_LIMIT};
pub use work_dir::sweep_stale as sweep_stale_work_dirs;

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceExt;

use crate::provider::Provider;
use answer::{drain, json_error, ConnSocket};
use proxy::data_target;
use state::{inject, AppState, CreateLog, CreateOutcome, SCHEME_HEADER};

/// How long in-flight requests may take to finish after shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

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
                let woken = sb.lifecycle.auto_resume && sandboxes::resume(st, &sb, sb.timeout_secs).await.is_ok();
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
        templates: templates::store::Store::new(work.clone()).with_templates_dir(opts.templates_dir.clone()),
        snapshots: Default::default(),
        base_url: format!("http://{addr}"),
        slots: Arc::new(tokio::sync::Semaphore::new(opts.limits.max_sandboxes as usize)),
        memory: admission::MemoryBook::new(opts.limits.memory_overcommit),
        spool: files::spool::Spool::new(work.join("spool"), opts.limits.max_upload),
        limits: opts.limits,
        creates: Mutex::new(CreateLog::default()),
        opensandbox: opensandbox::records::State::new(opts.volumes.clone()),
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

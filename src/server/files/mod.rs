//! envd's plain `/files` endpoints (protocol doc §5): `GET` downloads a file, `POST` uploads
//! one or several (multipart, or one `application/octet-stream` body, optionally
//! `Content-Encoding: gzip`). Who may call them is decided before (`auth::files`).
//!
//! # Bounded uploads
//!
//! An upload is never held in memory as it arrives. Each file is written to a spool file on
//! disk (under serve's working directory) by a blocking task that reads the body through a
//! channel of a few chunks, so a fast client waits for the disk rather than filling memory.
//! Two limits are checked as bytes are written, and the upload is refused with 413 the
//! moment one is crossed (the spool file is removed):
//!
//! * the size limit ([`super::Limits::max_upload`], `--max-upload`): bytes written, after
//!   decompression, over all files of the request;
//! * the decompression limit ([`super::Limits::max_inflate_ratio`], `--max-inflate-ratio`):
//!   a gzip body may inflate to at most N times the compressed bytes read so far, once past
//!   [`INFLATE_GRACE`]. 783 KB of gzip can inflate to 800 MB; with the default ratio such a
//!   body is refused after about 1 MiB of output.
//!
//! Only then is a file read back and handed to the provider, whose `write_file` takes the
//! bytes at once; how many bytes are held so at the same time, over all requests, is capped
//! by a budget equal to the size limit, so concurrent uploads wait rather than add up.

pub(super) mod spool;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Query, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer::{json_error, limit_body};
use super::state::{AppState, ServedSandbox};
use super::users::{basic_user, home_of, resolve_in, DEFAULT_USER};
use crate::provider::{ErrorKind, FileEntry, ProviderError};
use spool::Spool;

/// How much a gzip body may inflate before its ratio is judged (small bodies of zeros are
/// fine).
pub(crate) const INFLATE_GRACE: u64 = 1 << 20;
/// Chunks of a body in flight between the request and the spooling task.
const CHUNKS_IN_FLIGHT: usize = 4;

type SharedState = axum::extract::State<Arc<AppState>>;
type SandboxExt = Extension<Arc<ServedSandbox>>;

impl Spool {
    pub(crate) fn new(dir: PathBuf, max_upload: u64) -> Self {
        let kib = u32::try_from(max_upload.div_ceil(1024)).unwrap_or(u32::MAX).max(1);
        Self {
            dir,
            next: AtomicU64::new(0),
            budget: Arc::new(tokio::sync::Semaphore::new(kib as usize)),
            budget_kib: kib,
        }
    }

    /// A new, empty spool file, removed when dropped.
    fn create(&self) -> std::io::Result<(SpoolFile, std::fs::File)> {
        std::fs::create_dir_all(&self.dir)?;
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let path = self.dir.join(format!("upload-{n}"));
        let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&path)?;
        Ok((SpoolFile { path, len: 0 }, file))
    }
}

/// One spooled file; removed from disk when dropped.
struct SpoolFile {
    path: PathBuf,
    len: u64,
}

impl Drop for SpoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why spooling stopped.
#[derive(Debug)]
enum SpoolError {
    TooLarge(u64),
    Inflates(u64),
    BadGzip(String),
    Io(std::io::Error),
    Body(String),
}

impl SpoolError {
    fn response(&self) -> Response {
        match self {
            SpoolError::TooLarge(limit) => json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("upload is larger than {} (serve --max-upload)", crate::size::human(*limit)),
            ),
            SpoolError::Inflates(ratio) => json_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("gzip body inflates more than {ratio} times its size (serve --max-inflate-ratio)"),
            ),
            SpoolError::BadGzip(e) => json_error(StatusCode::BAD_REQUEST, &format!("invalid gzip body: {e}")),
            SpoolError::Io(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                json_error(StatusCode::INSUFFICIENT_STORAGE, "not enough disk space available")
            }
            SpoolError::Io(e) => {
                json_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("cannot spool the upload: {e}"))
            }
            SpoolError::Body(e) => json_error(StatusCode::BAD_REQUEST, &format!("cannot read the body: {e}")),
        }
    }
}

/// Counts what is written and enforces the limits (see the module documentation).
struct Counting<W> {
    inner: W,
    written: u64,
    limit: u64,
    /// Compressed bytes read so far, for gzip bodies; `None` for plain ones.
    compressed: Option<std::rc::Rc<std::cell::Cell<u64>>>,
    ratio: u64,
    /// The limit crossed, kept because the decoder turns it into a plain I/O error.
    crossed: Option<SpoolError>,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let after = self.written + buf.len() as u64;
        if after > self.limit {
            self.crossed = Some(SpoolError::TooLarge(self.limit));
            return Err(std::io::Error::other("size limit"));
        }
        if let Some(c) = &self.compressed {
            if after > INFLATE_GRACE && after > c.get().saturating_mul(self.ratio) {
                self.crossed = Some(SpoolError::Inflates(self.ratio));
                return Err(std::io::Error::other("inflate limit"));
            }
        }
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `chunks` into `file` (inflating them if `gzip`) under `limit` bytes and `ratio`,
/// on a blocking thread. Returns the bytes written.
fn sink(
    file: std::fs::File,
    gzip: bool,
    limit: u64,
    ratio: u64,
    mut chunks: tokio::sync::mpsc::Receiver<Bytes>,
) -> tokio::task::JoinHandle<Result<u64, SpoolError>> {
    tokio::task::spawn_blocking(move || {
        let compressed = gzip.then(|| std::rc::Rc::new(std::cell::Cell::new(0u64)));
        let counting = Counting {
            inner: std::io::BufWriter::with_capacity(256 << 10, file),
            written: 0,
            limit,
            compressed: compressed.clone(),
            ratio,
            crossed: None,
        };
        if let Some(count) = compressed {
            // Several gzip members in a row are one body, as Go's gzip reader (envd) takes them.
            let mut dec = flate2::write::MultiGzDecoder::new(counting);
            while let Some(chunk) = chunks.blocking_recv() {
                count.set(count.get() + chunk.len() as u64);
                if let Err(e) = dec.write_all(&chunk) {
                    return Err(verdict(dec.get_mut().crossed.take(), e, true));
                }
            }
            if let Err(e) = dec.try_finish() {
                return Err(verdict(dec.get_mut().crossed.take(), e, true));
            }
            let mut counting = dec.finish().map_err(SpoolError::Io)?;
            counting.flush().map_err(SpoolError::Io)?;
            Ok(counting.written)
        } else {
            let mut counting = counting;
            while let Some(chunk) = chunks.blocking_recv() {
                if let Err(e) = counting.write_all(&chunk) {
                    return Err(verdict(counting.crossed.take(), e, false));
                }
            }
            counting.flush().map_err(SpoolError::Io)?;
            Ok(counting.written)
        }
    })
}

/// What a failed write means: the limit the writer saw crossed, else a broken gzip stream
/// (flate2 reports those as invalid input or data), else the disk.
fn verdict(crossed: Option<SpoolError>, e: std::io::Error, gzip: bool) -> SpoolError {
    match crossed {
        Some(limit) => limit,
        None if gzip && matches!(e.kind(), std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData) => {
            SpoolError::BadGzip(e.to_string())
        }
        None => SpoolError::Io(e),
    }
}

/// Spools one stream of chunks; `limit` is what is left of the request's size limit.
async fn spool<S, E>(st: &AppState, mut body: S, gzip: bool, limit: u64) -> Result<SpoolFile, (SpoolError, Option<S>)>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let (mut spooled, file) = match st.spool.create() {
        Ok(f) => f,
        Err(e) => return Err((SpoolError::Io(e), Some(body))),
    };
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
    let task = sink(file, gzip, limit, st.limits.max_inflate_ratio, rx);
    let mut read_error = None;
    // Whether the body's stream has ended (it must not be polled again then).
    let mut ended = false;
    loop {
        match body.next().await {
            None => {
                ended = true;
                break;
            }
            Some(Ok(c)) => {
                // The sink stopped (a limit): its verdict follows.
                if tx.send(c).await.is_err() {
                    break;
                }
            }
            Some(Err(e)) => {
                read_error = Some(SpoolError::Body(e.to_string()));
                break;
            }
        }
    }
    drop(tx);
    let verdict = task.await.unwrap_or_else(|e| Err(SpoolError::Io(std::io::Error::other(e.to_string()))));
    match (read_error, verdict) {
        (Some(e), _) => Err((e, None)),
        (None, Ok(n)) => {
            spooled.len = n;
            Ok(spooled)
        }
        // What the client still sends is for the caller to drain.
        (None, Err(e)) => Err((e, (!ended).then_some(body))),
    }
}

/// Reads and drops what a client still sends after its upload was refused (up to 1 MiB and
/// 5 s), so that it sees the answer rather than a reset connection.
async fn drain<S, E>(mut body: S)
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
{
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        let mut left = 1usize << 20;
        while let Some(Ok(c)) = body.next().await {
            left = left.saturating_sub(c.len());
            if left == 0 {
                break;
            }
        }
    })
    .await;
}

#[derive(Debug, Deserialize)]
pub(crate) struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
    /// The user the upload is made as (`username=`, envd < 0.4 clients), else Basic auth's,
    /// else `user`.
    #[serde(default)]
    username: Option<String>,
}

fn files_error(e: ProviderError, path: &str) -> Response {
    match e.kind {
        ErrorKind::NotFound => json_error(StatusCode::NOT_FOUND, &format!("path '{path}' does not exist")),
        ErrorKind::Invalid if e.message.starts_with("is a directory") => {
            json_error(StatusCode::BAD_REQUEST, &format!("path '{path}' is a directory"))
        }
        ErrorKind::Invalid => json_error(StatusCode::BAD_REQUEST, &e.message),
        _ => json_error(StatusCode::INTERNAL_SERVER_ERROR, &e.message),
    }
}

/// The user a `/files` request is made as: `username=` (old clients), else Basic auth's, else
/// [`DEFAULT_USER`]. (A signed request's Basic user, if any, is the signed one: `auth`.)
fn request_user(q: &FilesQuery, headers: &axum::http::HeaderMap) -> String {
    q.username
        .clone()
        .filter(|u| !u.is_empty())
        .or_else(|| basic_user(headers))
        .unwrap_or_else(|| DEFAULT_USER.to_string())
}

/// `GET /files?path=`: read with the rights of the request's user; a relative path is
/// under that user's home.
pub(crate) async fn download(
    axum::extract::State(st): SharedState,
    Extension(sb): SandboxExt,
    headers: axum::http::HeaderMap,
    Query(q): Query<FilesQuery>,
) -> Response {
    let user = request_user(&q, &headers);
    let raw = q.path.unwrap_or_default();
    let path = match resolve_in(&raw, &home_of(&user)) {
        Ok(p) => p,
        Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.message),
    };
    // Streamed from the open file, as envd does: nothing of it is held in memory, whatever its
    // size (a provider that cannot open files to stream reads them whole, up to 1 GiB).
    match st.provider.sandbox(&sb.provider_id).open_file_as(&path, &user).await {
        Ok(file) => {
            let name = path.rsplit('/').next().unwrap_or("file").replace('"', "");
            let disposition = HeaderValue::from_str(&format!("inline; filename=\"{name}\""))
                .unwrap_or_else(|_| HeaderValue::from_static("inline"));
            let mut len = file.len;
            if st.mutants.has(super::mutants::Fault::ReadTruncates) && len > 64 << 10 {
                len -= 1;
            }
            let body = limit_body(sb.file_body(file, 0, len), st.faults.cut_stream_after);
            (
                [
                    (header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream")),
                    (header::CONTENT_DISPOSITION, disposition),
                    (header::CONTENT_LENGTH, HeaderValue::from(len)),
                ],
                body,
            )
                .into_response()
        }
        Err(e) => files_error(e, &path),
    }
}

fn written(e: &FileEntry, metadata: &BTreeMap<String, String>) -> Value {
    let mut v = json!({"path": e.path, "name": e.name, "type": "file"});
    if !metadata.is_empty() {
        v["metadata"] = json!(metadata);
    }
    v
}

/// An upload's metadata header that envd refuses.
#[derive(Debug, thiserror::Error)]
enum MetadataError {
    #[error("invalid metadata key {0:?}")]
    Key(String),
    #[error("metadata value of {0:?} is not printable ASCII")]
    Value(String),
}

/// The file metadata an upload carries (envd 0.6.2): each `X-Metadata-<key>: <value>`
/// header, the key lowercased; keys and values must be printable ASCII. Every file of the
/// upload gets it, and an upload without any clears what a file had.
fn upload_metadata(headers: &axum::http::HeaderMap) -> Result<BTreeMap<String, String>, MetadataError> {
    let printable = |s: &str| !s.is_empty() && s.bytes().all(|b| (0x20..0x7f).contains(&b));
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else { continue };
        let unprintable = || MetadataError::Value(key.to_string());
        let value = value.to_str().map_err(|_| unprintable())?;
        if !printable(key) {
            return Err(MetadataError::Key(key.to_string()));
        }
        if !value.is_empty() && !printable(value) {
            return Err(unprintable());
        }
        out.insert(key.to_ascii_lowercase(), value.to_string());
    }
    Ok(out)
}

/// `POST /files`: spools every file (see the module documentation), then writes them.
pub(crate) async fn upload(axum::extract::State(st): SharedState, Extension(sb): SandboxExt, req: Request) -> Response {
    let q: FilesQuery =
        Query::try_from_uri(req.uri()).map(|q| q.0).unwrap_or(FilesQuery { path: None, username: None });
    let owner = request_user(&q, req.headers());
    let metadata = match upload_metadata(req.headers()) {
        Ok(m) => m,
        Err(e) => {
            super::answer::drain(req.into_body()).await;
            return json_error(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let ctype = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let gzip = req
        .headers()
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("gzip"));
    let limit = st.limits.max_upload;
    let mut files: Vec<(String, SpoolFile)> = Vec::new();
    if ctype.starts_with("multipart/form-data") {
        let mut mp = match Multipart::from_request(req, &()).await {
            Ok(m) => m,
            Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("invalid multipart body: {e}")),
        };
        let mut total = 0u64;
        loop {
            let field = match mp.next_field().await {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &format!("invalid multipart body: {e}")),
            };
            if field.name() != Some("file") {
                continue;
            }
            let name = field.file_name().map(str::to_string).unwrap_or_default();
            let chunks = futures_util::stream::unfold(field, |mut f| async move {
                match f.chunk().await {
                    Ok(Some(c)) => Some((Ok::<Bytes, String>(c), f)),
                    Ok(None) => None,
                    Err(e) => Some((Err(e.to_string()), f)),
                }
            });
            let refused = match spool(&st, Box::pin(chunks), false, limit - total).await {
                Ok(f) => {
                    total += f.len;
                    files.push((name, f));
                    None
                }
                Err((e, rest)) => {
                    if let Some(rest) = rest {
                        drain(rest).await;
                    }
                    Some(e)
                }
            };
            if let Some(e) = refused {
                // And the rest of the body (the closing boundary at least), so the client
                // reads the answer instead of a reset.
                let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                    let mut left = 1usize << 20;
                    while let Ok(Some(mut f)) = mp.next_field().await {
                        while let Ok(Some(c)) = f.chunk().await {
                            left = left.saturating_sub(c.len());
                        }
                        if left == 0 {
                            break;
                        }
                    }
                })
                .await;
                return e.response();
            }
        }
        if let (Some(p), 1) = (&q.path, files.len()) {
            files[0].0 = p.clone();
        }
    } else if ctype.starts_with("application/octet-stream") {
        let Some(p) = q.path.clone() else {
            return json_error(StatusCode::BAD_REQUEST, "path is required for application/octet-stream uploads");
        };
        match spool(&st, req.into_body().into_data_stream(), gzip, limit).await {
            Ok(f) => files.push((p, f)),
            Err((e, rest)) => {
                if let Some(rest) = rest {
                    drain(rest).await;
                }
                return e.response();
            }
        }
    } else {
        return json_error(StatusCode::BAD_REQUEST, &format!("unsupported content type: {ctype:?}"));
    }
    if files.is_empty() {
        return json_error(StatusCode::BAD_REQUEST, "no file in the request");
    }
    let mut resolved: Vec<(String, SpoolFile)> = Vec::new();
    for (p, f) in files {
        let abs = match resolve_in(&p, &home_of(&owner)) {
            Ok(a) => a,
            Err(e) => return json_error(StatusCode::BAD_REQUEST, &e.message),
        };
        if resolved.iter().any(|(a, _)| *a == abs) {
            return json_error(StatusCode::BAD_REQUEST, &format!("path '{abs}' is given twice"));
        }
        resolved.push((abs, f));
    }
    let mut out = Vec::new();
    for (abs, f) in resolved {
        // The provider takes the bytes at once: hold them within the shared budget.
        // At most the whole budget, so that one file never waits for more than exists.
        let kib = u32::try_from(f.len.div_ceil(1024)).unwrap_or(u32::MAX).min(st.spool.budget_kib);
        let Ok(_permit) = st.spool.budget.acquire_many(kib).await else {
            return json_error(StatusCode::INTERNAL_SERVER_ERROR, "upload budget closed");
        };
        let data = match tokio::fs::read(&f.path).await {
            Ok(d) => d,
            Err(e) => return SpoolError::Io(e).response(),
        };
        drop(f);
        // As envd: written as root, then given to the user it is made as (which a watcher
        // sees as a chmod).
        let e = match st.provider.sandbox(&sb.provider_id).write_file_as(&abs, data, &owner).await {
            Ok(e) => e,
            Err(e) => return files_error(e, &abs),
        };
        match st.provider.sandbox(&sb.provider_id).set_file_metadata(&abs, metadata.clone()).await {
            Ok(()) => {}
            // A provider without file metadata has none to clear.
            Err(e) if e.kind == ErrorKind::Unsupported && metadata.is_empty() => {}
            Err(e) => return files_error(e, &abs),
        }
        out.push(written(&e, &metadata));
    }
    axum::Json(Value::Array(out)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_metadata_refuses_by_kind() {
        use axum::http::{HeaderMap, HeaderValue};
        let with = |name: &'static str, value: &[u8]| {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_bytes(value).unwrap());
            upload_metadata(&h)
        };
        assert_eq!(with("x-metadata-owner", b"qa").unwrap().get("owner").map(String::as_str), Some("qa"));
        assert!(matches!(with("x-metadata-bad", b"caf\xc3\xa9"), Err(MetadataError::Value(k)) if k == "bad"));
        assert!(matches!(with("x-metadata-bad", b"a\tb"), Err(MetadataError::Value(_))));
        let e = with("x-metadata-bad", b"\x80").unwrap_err();
        assert_eq!(e.to_string(), "metadata value of \"bad\" is not printable ASCII");
        assert!(with("x-other", b"\x80").unwrap().is_empty());
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    async fn run_sink(data: Vec<u8>, gz: bool, limit: u64, ratio: u64) -> (Result<u64, SpoolError>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
        let task = sink(file, gz, limit, ratio, rx);
        for c in data.chunks(16 << 10) {
            if tx.send(Bytes::copy_from_slice(c)).await.is_err() {
                break;
            }
        }
        drop(tx);
        let r = task.await.unwrap();
        (r, std::fs::read(&path).unwrap())
    }

    #[tokio::test]
    async fn plain_bodies_stop_at_the_size_limit() {
        let (r, _) = run_sink(vec![1u8; 100], false, 100, 100).await;
        assert_eq!(r.unwrap(), 100);
        let (r, _) = run_sink(vec![1u8; 101], false, 100, 100).await;
        assert!(matches!(r, Err(SpoolError::TooLarge(100))), "{r:?}");
    }

    #[tokio::test]
    async fn gzip_bodies_inflate_within_the_ratio() {
        let text: Vec<u8> = (0..300_000u32).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
        let (r, written) = run_sink(gzip(&text), true, 1 << 30, 100).await;
        assert_eq!(r.unwrap(), text.len() as u64);
        assert_eq!(written, text);
    }

    #[tokio::test]
    async fn a_gzip_bomb_is_refused_early() {
        let bomb = gzip(&vec![0u8; 64 << 20]);
        let (r, written) = run_sink(bomb, true, 1 << 30, 100).await;
        assert!(matches!(r, Err(SpoolError::Inflates(100))), "{r:?}");
        assert!(written.len() < 4 << 20, "stopped after {} bytes", written.len());
        // The size limit applies to inflated bytes too.
        let (r, _) = run_sink(gzip(&vec![0u8; 3 << 20]), true, 2 << 20, 10_000).await;
        assert!(matches!(r, Err(SpoolError::TooLarge(_))), "{r:?}");
        let (r, _) = run_sink(b"not gzip at all".to_vec(), true, 1 << 30, 100).await;
        assert!(matches!(r, Err(SpoolError::BadGzip(_))), "{r:?}");
    }
}

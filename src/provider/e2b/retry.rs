//! When and how long to wait before repeating a control-plane request (protocol doc §2.2,
//! the SDK's `retry.py`).
//!
//! * A response is retried when it says `Should-Retry: true`, or when it has no
//!   `Should-Retry` header and its status is 429, 502, 503 or 504. `Should-Retry: false`
//!   forbids it.
//! * The wait is `Retry-After` (seconds, capped at [`MAX_RETRY_AFTER`]) when the server gives
//!   one, else `0.1 s · 2ⁿ` capped at 10 s, times a random factor in [0.5, 1.5).
//! * At most [`MAX_RETRIES`] retries, and only for [`Idempotency::Idempotent`] calls. A
//!   create is [`Idempotency::Refused`]: repeated after a 429 (the server refused it before
//!   doing anything) or an explicit `Should-Retry: true`, never after a bare 502/503/504,
//!   which may come after the sandbox was made: a blind repeat would leak a second, billed
//!   sandbox whose id nobody knows. The
//!   protocol lists an optional `Idempotency-Key` header for create, but neither E2B's public
//!   spec nor FC documents that the key is honoured, so we do not rely on it.
//! * A connection that could not be established (TCP or TLS failed, nothing was sent) is
//!   retried for every call, like the SDK's `E2B_CONNECTION_RETRIES`.

use std::time::Duration;

use reqwest::header::HeaderMap;

/// Retries after the first attempt.
pub const MAX_RETRIES: u32 = 3;
/// A longer `Retry-After` is shortened to this, to keep every call bounded.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
const BASE: f64 = 0.1;
const CAP: f64 = 10.0;

/// Whether repeating a request is safe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idempotency {
    /// Reads, kill, set-timeout, connect: repeating them does no harm.
    Idempotent,
    /// Create: repeated only when the server says it did not act on the request: a 429
    /// (rate limited: refused before anything was made) or an explicit `Should-Retry: true`.
    /// Never on a bare 502/503/504, which may come after the sandbox was made.
    Refused,
    /// Never repeated after the server may have seen it.
    Never,
}

/// Whether this call may be repeated after this response.
pub fn may_retry(idem: Idempotency, status: u16, should_retry_header: Option<&str>) -> bool {
    match idem {
        Idempotency::Idempotent => should_retry(status, should_retry_header),
        Idempotency::Refused => match should_retry_header.map(str::trim) {
            Some(v) => v.eq_ignore_ascii_case("true"),
            None => status == 429,
        },
        Idempotency::Never => false,
    }
}

/// Whether a response with `status` and this `Should-Retry` header value may be retried.
pub fn should_retry(status: u16, should_retry_header: Option<&str>) -> bool {
    if status < 400 {
        return false;
    }
    match should_retry_header.map(str::trim) {
        Some(v) => v.eq_ignore_ascii_case("true"),
        None => matches!(status, 429 | 502 | 503 | 504),
    }
}

/// `Retry-After` in seconds (integer or decimal), capped; `None` if absent or not seconds.
pub fn retry_after(value: Option<&str>) -> Option<Duration> {
    let secs: f64 = value?.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).map_or(MAX_RETRY_AFTER, |d| d.min(MAX_RETRY_AFTER)))
}

/// Exponential backoff before retry number `attempt` (0-based), with `jitter` in [0, 1).
pub fn backoff(attempt: u32, jitter: f64) -> Duration {
    let base = (BASE * 2f64.powi(attempt.min(16) as i32)).min(CAP);
    Duration::from_secs_f64(base * (0.5 + jitter.clamp(0.0, 1.0)))
}

/// The wait before retry number `attempt`, given the response headers.
pub fn delay(attempt: u32, headers: &HeaderMap) -> Duration {
    retry_after(headers.get("retry-after").and_then(|v| v.to_str().ok())).unwrap_or_else(|| backoff(attempt, jitter()))
}

/// A number in [0, 1) that differs between calls and processes.
pub fn jitter() -> f64 {
    crate::random::unit()
}

/// Sends the request `build` makes, retrying per the policy above. The response returned
/// may still be an error status (the last one, or one that must not be retried).
pub async fn send(
    build: impl Fn() -> reqwest::RequestBuilder,
    idem: Idempotency,
) -> Result<reqwest::Response, reqwest::Error> {
    let mut attempt = 0;
    loop {
        match build().send().await {
            Ok(resp) => {
                let header = resp.headers().get("should-retry").and_then(|v| v.to_str().ok());
                if attempt < MAX_RETRIES && may_retry(idem, resp.status().as_u16(), header) {
                    let wait = delay(attempt, resp.headers());
                    drop(resp);
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                    continue;
                }
                return Ok(resp);
            }
            // Nothing reached the server: safe to repeat even a create.
            Err(e) if e.is_connect() && attempt < MAX_RETRIES => {
                tokio::time::sleep(backoff(attempt, jitter())).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_repeated_only_when_refused() {
        assert!(may_retry(Idempotency::Refused, 429, None));
        assert!(may_retry(Idempotency::Refused, 503, Some("true")));
        assert!(!may_retry(Idempotency::Refused, 429, Some("false")));
        for s in [500, 502, 503, 504] {
            assert!(!may_retry(Idempotency::Refused, s, None), "{s}");
        }
        assert!(!may_retry(Idempotency::Never, 429, Some("true")));
        assert!(may_retry(Idempotency::Idempotent, 503, None));
    }

    #[test]
    fn which_statuses_retry() {
        for s in [429, 502, 503, 504] {
            assert!(should_retry(s, None), "{s}");
        }
        for s in [200, 204, 400, 401, 404, 409, 500, 501] {
            assert!(!should_retry(s, None), "{s}");
        }
        assert!(!should_retry(503, Some("false")), "Should-Retry: false forbids");
        assert!(should_retry(500, Some("true")), "Should-Retry: true allows");
        assert!(should_retry(409, Some(" True ")));
        assert!(!should_retry(200, Some("true")), "never on success");
    }

    #[test]
    fn retry_after_is_honoured_and_capped() {
        assert_eq!(retry_after(Some("2")), Some(Duration::from_secs(2)));
        assert_eq!(retry_after(Some("0.5")), Some(Duration::from_millis(500)));
        assert_eq!(retry_after(Some("3600")), Some(MAX_RETRY_AFTER));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
        assert_eq!(retry_after(Some("-1")), None);
        assert_eq!(retry_after(None), None);
        // Issue 13: a server's huge Retry-After panicked in Duration::from_secs_f64.
        assert_eq!(retry_after(Some("1e300")), Some(MAX_RETRY_AFTER));
        let mut h = HeaderMap::new();
        h.insert("retry-after", "1".parse().unwrap());
        assert_eq!(delay(2, &h), Duration::from_secs(1));
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        assert_eq!(backoff(0, 0.5), Duration::from_millis(100));
        assert_eq!(backoff(1, 0.5), Duration::from_millis(200));
        assert_eq!(backoff(2, 0.5), Duration::from_millis(400));
        assert_eq!(backoff(20, 0.5), Duration::from_secs(10));
        assert_eq!(backoff(0, 0.0), Duration::from_millis(50));
        assert!(backoff(0, 0.999) < Duration::from_millis(150));
        let j = jitter();
        assert!((0.0..1.0).contains(&j));
    }
}

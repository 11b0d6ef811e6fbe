//! Random bytes, from the kernel's generator (getrandom(2), through the `getrandom` crate): the
//! one source for sandbox, build and run ids, idempotency keys, retry jitter and `serve`'s
//! access tokens.
//!
//! Tokens are secrets: [`token`] fails rather than return anything weaker. Ids only need to be
//! unique, so should the kernel ever refuse (it does not, for small requests, on Linux 3.17 and
//! later) [`hex`] and [`fill_or_unique`] fall back to the clock, the process id and a counter.

use std::sync::atomic::{AtomicU64, Ordering};

/// Fills `buf` from the kernel's generator.
pub fn fill(buf: &mut [u8]) -> std::io::Result<()> {
    getrandom::fill(buf).map_err(|e| std::io::Error::other(format!("the system's random generator failed: {e}")))
}

/// Fills `buf` with random bytes, or, if the generator fails, with bytes unique to this call.
pub fn fill_or_unique(buf: &mut [u8]) {
    if fill(buf).is_err() {
        unique(buf);
    }
}

/// Bytes unique to this call in this process (clock, pid and a counter, spread by splitmix64).
fn unique(buf: &mut [u8]) {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut state = (nanos as u64) ^ (u64::from(std::process::id()) << 32) ^ N.fetch_add(1, Ordering::Relaxed);
    for b in buf.iter_mut() {
        // splitmix64: distinct inputs give distinct, well-spread outputs.
        state = state.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        *b = (z ^ (z >> 31)) as u8;
    }
}

/// `n` random bytes as `2n` lowercase hex characters (ids).
pub fn hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    fill_or_unique(&mut buf);
    hex::encode(&buf)
}

/// A secret: `n` random bytes as lowercase hex, or an error.
pub fn token(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    fill(&mut buf)?;
    Ok(hex::encode(&buf))
}

/// A random (version 4) UUID, `xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx` in lowercase: build ids (the
/// SDKs parse E2B's as UUIDs) and the boot id each sandbox gets.
pub fn uuid_v4() -> String {
    let mut b = [0u8; 16];
    fill_or_unique(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// A number in [0, 1) (retry jitter).
pub fn unit() -> f64 {
    let mut b = [0u8; 8];
    fill_or_unique(&mut b);
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_tokens_have_their_length_and_differ() {
        let (a, b) = (hex(6), hex(6));
        assert_eq!(a.len(), 12);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{a}");
        assert_ne!(a, b);
        let t = token(32).unwrap();
        assert_eq!(t.len(), 64);
        assert_ne!(t, token(32).unwrap());
    }

    #[test]
    fn uuids_are_version_4_in_canonical_form() {
        let u = uuid_v4();
        let groups: Vec<&str> = u.split('-').collect();
        assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12], "{u}");
        assert!(u.bytes().all(|c| c == b'-' || (c.is_ascii_hexdigit() && !c.is_ascii_uppercase())), "{u}");
        assert!(groups[2].starts_with('4'), "{u}");
        assert!(matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b'), "{u}");
        assert_ne!(u, uuid_v4());
    }

    #[test]
    fn unit_is_in_range_and_varies() {
        let xs: Vec<f64> = (0..64).map(|_| unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)), "{xs:?}");
        assert!(xs.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn the_fallback_bytes_differ_between_calls() {
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..1000 {
            let mut b = [0u8; 8];
            unique(&mut b);
            seen.insert(b);
        }
        assert_eq!(seen.len(), 1000);
    }
}

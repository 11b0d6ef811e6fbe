//! Which host ids a sandbox's ids stand for.
//!
//! A sandbox runs in an unprivileged user namespace whose ids `0..len` are the host's
//! `host_base..host_base+len` (its `uid_map`/`gid_map`). The files of an image are stored
//! already shifted into that range, so the namespace's root owns what the image's root owns
//! and `sudo` stays setuid *inside* while meaning nothing on the host. The same map turns
//! them back when an image goes to a Docker engine.

use std::fmt;

/// Host ids that a sandbox's ids `0..len` map to (the user namespace's uid_map/gid_map).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IdMap {
    pub host_base: u32,
    pub len: u32,
}

/// The uid and gid that ids beyond the map become (`nobody`/`nogroup` in Debian).
pub const OVERFLOW_ID: u32 = 65534;

impl Default for IdMap {
    fn default() -> Self {
        Self { host_base: 100_000_000, len: 65536 }
    }
}

/// A `SCENARIO_RUN_ID_MAP` that is no id map; each variant keeps the value as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdMapError {
    /// Not two numbers around a colon.
    #[error("read SCENARIO_RUN_ID_MAP: {0:?} is not `base:len` (e.g. 100000000:65536)")]
    NotBaseLen(String),
    /// An empty range, one at 0, or one past 2^32.
    #[error("read SCENARIO_RUN_ID_MAP: {0:?}: the range must be non-empty, above 0 and below 2^32")]
    BadRange(String),
}

impl IdMap {
    /// `SCENARIO_RUN_ID_MAP="base:len"`, else the default.
    pub fn from_env() -> Result<Self, IdMapError> {
        match std::env::var("SCENARIO_RUN_ID_MAP") {
            Ok(v) if !v.trim().is_empty() => Self::parse(v.trim()),
            _ => Ok(Self::default()),
        }
    }

    /// `base:len`, e.g. `100000000:65536`.
    pub fn parse(s: &str) -> Result<Self, IdMapError> {
        let bad = || IdMapError::NotBaseLen(s.to_string());
        let (b, l) = s.split_once(':').ok_or_else(bad)?;
        let host_base: u32 = b.trim().parse().map_err(|_| bad())?;
        let len: u32 = l.trim().parse().map_err(|_| bad())?;
        if len == 0 || host_base == 0 || host_base.checked_add(len).is_none() {
            return Err(IdMapError::BadRange(s.to_string()));
        }
        Ok(Self { host_base, len })
    }

    /// The host id of the image's `id`, or None if the map does not cover it.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        (id < self.len).then(|| self.host_base + id)
    }

    /// The image's id of host id `host`, or None if it is outside the map.
    pub fn to_image(&self, host: u32) -> Option<u32> {
        host.checked_sub(self.host_base).filter(|id| *id < self.len)
    }

    /// The host id of `id`, mapping ids beyond the map to [`OVERFLOW_ID`] (second: clamped).
    pub fn to_host_clamped(&self, id: u32) -> (u32, bool) {
        match self.to_host(id) {
            Some(h) => (h, false),
            None => (self.host_base + OVERFLOW_ID.min(self.len - 1), true),
        }
    }
}

impl fmt::Display for IdMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host_base, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_both_ways() {
        let m = IdMap::default();
        assert_eq!(m.to_host(0), Some(100_000_000));
        assert_eq!(m.to_host(1000), Some(100_001_000));
        assert_eq!(m.to_host(65536), None);
        assert_eq!(m.to_image(100_001_000), Some(1000));
        assert_eq!(m.to_image(0), None);
        assert_eq!(m.to_host_clamped(70000), (100_065_534, true));
    }

    #[test]
    fn parses_the_env_form() {
        assert_eq!(IdMap::parse("200000:65536").unwrap(), IdMap { host_base: 200000, len: 65536 });
        assert!(IdMap::parse("200000").unwrap_err().to_string().contains("base:len"));
        assert!(IdMap::parse("0:10").is_err());
        assert!(IdMap::parse("4294967295:2").is_err());
    }

    /// Issue 28 item 4: a bad map says which way it is bad, in the words it used.
    #[test]
    fn bad_maps_have_kinds() {
        assert_eq!(IdMap::parse("200000"), Err(IdMapError::NotBaseLen("200000".into())));
        assert_eq!(IdMap::parse("a:1"), Err(IdMapError::NotBaseLen("a:1".into())));
        assert_eq!(
            IdMap::parse("200000").unwrap_err().to_string(),
            "read SCENARIO_RUN_ID_MAP: \"200000\" is not `base:len` (e.g. 100000000:65536)"
        );
        assert_eq!(IdMap::parse("0:10"), Err(IdMapError::BadRange("0:10".into())));
        assert_eq!(IdMap::parse("5:0"), Err(IdMapError::BadRange("5:0".into())));
        assert_eq!(
            IdMap::parse("4294967295:2").unwrap_err().to_string(),
            "read SCENARIO_RUN_ID_MAP: \"4294967295:2\": the range must be non-empty, above 0 and below 2^32"
        );
    }
}

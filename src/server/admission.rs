//! Which creates the host can take, by the memory each sandbox declares (issue 23: 256
//! sandboxes of 512 MiB were admitted on a 24 GiB host).
//!
//! A sandbox's declared memory is create's `memoryMB`, else the `memoryMB` of the template
//! built here, else [`DEFAULT_MEMORY_MB`] (what the local provider gives a sandbox that names
//! none); its cgroup holds it to that. A create is admitted while
//!
//! * the memory promised to the live sandboxes, its own included, stays within
//!   `--memory-overcommit` times the host's (`MemTotal`); the default, 2, promises twice the
//!   host's memory: sandboxes under test mostly idle far below their limit (E2B's hosts
//!   overcommit too), and with 1 every sandbox may use all of its memory at once; and
//! * the host has its share of that now (`MemAvailable`): its memory divided by the same
//!   ratio, all of it at 1. A host already short of memory takes no more sandboxes, whatever
//!   is promised.
//!
//! Otherwise it is answered 429 `{"code":429,"message":…}` saying how much was asked, how much
//! is promised or available, and the flag (the SDKs raise `RateLimitException` and retry);
//! with `Should-Retry: false` when the sandbox could never fit. A sandbox's promise is given
//! back when its record goes (kill, expiry), as its place under `--max-sandboxes` is.

use std::sync::{Arc, Mutex};

/// The memory of a sandbox that declares none (the local provider's default), MiB.
pub(crate) const DEFAULT_MEMORY_MB: u64 = 512;

/// The memory promised to live sandboxes; see the module documentation.
#[derive(Debug)]
pub(crate) struct MemoryBook {
    promised_mb: Mutex<u64>,
    overcommit: f64,
}

/// A live sandbox's promise, given back when dropped.
#[derive(Debug)]
pub(crate) struct MemoryClaim {
    book: Arc<MemoryBook>,
    mb: u64,
}

impl Drop for MemoryClaim {
    fn drop(&mut self) {
        let mut p = self.book.promised_mb.lock().expect("memory book");
        *p = p.saturating_sub(self.mb);
    }
}

/// Why a create was not admitted.
#[derive(Debug, PartialEq)]
pub(crate) struct Refusal {
    pub message: String,
    /// Whether it could be admitted later, once other sandboxes are gone.
    pub may_retry: bool,
}

/// The host's `MemTotal` and `MemAvailable`, MiB.
pub(crate) fn host_memory_mb() -> (u64, u64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib / 1024)
    };
    let si = rustix::system::sysinfo();
    let unit = u64::from(si.mem_unit.max(1));
    let total = field("MemTotal:").unwrap_or((si.totalram as u64 * unit) >> 20);
    let available = field("MemAvailable:").unwrap_or(((si.freeram as u64 + si.bufferram as u64) * unit) >> 20);
    (total, available)
}

impl MemoryBook {
    pub(crate) fn new(overcommit: f64) -> Arc<Self> {
        Arc::new(Self { promised_mb: Mutex::new(0), overcommit })
    }

    /// Admits a sandbox of `mb` on a host of `total` MiB with `available` MiB free now.
    pub(crate) fn admit(self: &Arc<Self>, mb: u64, total: u64, available: u64) -> Result<MemoryClaim, Refusal> {
        let human = |mib: u64| crate::size::human(mib.saturating_mul(1 << 20));
        let cap = (total as f64 * self.overcommit) as u64;
        let mut promised = self.promised_mb.lock().expect("memory book");
        if mb > cap.min(total) {
            return Err(Refusal {
                message: format!(
                    "not enough memory on this host: the sandbox asks for {}, the host has {} (serve promises at most {}, --memory-overcommit {} times its memory)",
                    human(mb),
                    human(total),
                    human(cap),
                    self.overcommit
                ),
                may_retry: false,
            });
        }
        if promised.saturating_add(mb) > cap {
            return Err(Refusal {
                message: format!(
                    "not enough memory on this host: the sandbox asks for {}, and {} of the {} serve promises (--memory-overcommit {} times the host's {}) are promised to live sandboxes; kill some, or raise --memory-overcommit",
                    human(mb),
                    human(*promised),
                    human(cap),
                    self.overcommit,
                    human(total)
                ),
                may_retry: true,
            });
        }
        let share = (mb as f64 / self.overcommit).ceil() as u64;
        if share > available {
            return Err(Refusal {
                message: format!(
                    "not enough memory on this host: the sandbox asks for {}, which needs {} available at --memory-overcommit {}, and the host has {} available now",
                    human(mb),
                    human(share),
                    self.overcommit,
                    human(available)
                ),
                may_retry: true,
            });
        }
        *promised += mb;
        Ok(MemoryClaim { book: self.clone(), mb })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promises_add_up_to_the_overcommit_and_come_back() {
        // 256 sandboxes of 512 MiB on a 24 GiB host, at the default overcommit: 96 fit.
        let book = MemoryBook::new(2.0);
        let mut claims = Vec::new();
        let refused = (0..256).find_map(|_| match book.admit(512, 24 << 10, 20 << 10) {
            Ok(c) => {
                claims.push(c);
                None
            }
            Err(r) => Some(r),
        });
        assert_eq!(claims.len(), 96);
        let r = refused.unwrap();
        assert!(r.may_retry);
        assert!(r.message.contains("48 GiB of the 48 GiB serve promises (--memory-overcommit 2"), "{}", r.message);
        claims.pop();
        let again = book.admit(512, 24 << 10, 20 << 10).unwrap();
        drop(claims);
        drop(again);
        assert_eq!(*book.promised_mb.lock().unwrap(), 0);
    }

    #[test]
    fn a_sandbox_larger_than_the_host_or_what_is_free_is_refused() {
        let book = MemoryBook::new(4.0);
        let r = book.admit(64 << 10, 24 << 10, 20 << 10).unwrap_err();
        assert!(!r.may_retry, "it can never fit");
        assert!(r.message.contains("asks for 64 GiB, the host has 24 GiB"), "{}", r.message);
        // At 4 times, a sandbox needs a quarter of its memory free now.
        let r = book.admit(8 << 10, 24 << 10, 1 << 10).unwrap_err();
        assert!(r.may_retry);
        assert!(
            r.message.ends_with("needs 2 GiB available at --memory-overcommit 4, and the host has 1 GiB available now"),
            "{}",
            r.message
        );
        book.admit(8 << 10, 24 << 10, 2 << 10).unwrap();
        let strict = MemoryBook::new(1.0);
        assert!(strict.admit(3 << 10, 24 << 10, 2 << 10).is_err());
        strict.admit(2 << 10, 24 << 10, 2 << 10).unwrap();
    }

    #[test]
    fn the_host_memory_is_read() {
        let (total, available) = host_memory_mb();
        assert!(total > 0 && available <= total, "{total} {available}");
    }
}

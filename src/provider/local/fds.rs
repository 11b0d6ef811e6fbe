//! The runner's (or `serve`'s) descriptors that sandboxes' networks may hold, admitted as disks
//! and memory are (issue 35: "the proxy has an idle timeout and a per-sandbox connection cap
//! that admission counts").
//!
//! A sandbox's network holds descriptors of this process on the sandbox's behalf: its
//! namespace and stack, its resolver's sockets and, at worst, one socket per DNS query in
//! flight and two per TCP DNS connection ([`NET_FDS`] in all); once its policy names domains,
//! its egress proxy too, two per connection up to the sandbox's cap
//! ([`proxy::connection_cap`](super::proxy)). Caps per sandbox keep one sandbox from taking
//! them all; this book keeps the sandboxes together from promising more than the process may
//! open: a network (made for a sandbox, a build, or ahead in the pool) and a proxy are each
//! charged before they exist, against the soft `RLIMIT_NOFILE` (raised to the hard limit, at
//! most [`RAISE_TO`], at first use, as Go's runtime does) less a part kept for everything else
//! (clients, files, pipes: a quarter, at least [`MIN_KEPT`]). Past it, the create or the
//! policy update is refused for want of capacity (`io::ErrorKind::QuotaExceeded`, which the
//! provider reports as [`ErrorKind::Capacity`](crate::provider::ErrorKind::Capacity), 507
//! through serve), before anything is made; a charge is given back when its network goes.

use std::io;
use std::sync::{Mutex, OnceLock};

/// What one network may hold at worst without a proxy: its namespace, the stack's process and
/// pipe, the resolver's two sockets and its proxy's listener (8), one socket per UDP query in
/// flight (64) and two per TCP DNS connection (2 × 16).
pub(crate) const NET_FDS: u64 = 8 + 64 + 2 * 16;
/// The soft limit is raised no higher than this (a larger soft limit slows programs that close
/// every descriptor up to it, and sandboxes' processes inherit it).
pub(crate) const RAISE_TO: u64 = 65_536;
/// The least kept for everything else.
pub(crate) const MIN_KEPT: u64 = 256;

/// Descriptors promised to live networks and proxies.
#[derive(Debug)]
pub(crate) struct Book {
    /// The soft `RLIMIT_NOFILE` this book holds promises against.
    limit: u64,
    promised: Mutex<u64>,
}

/// A network's or proxy's promise, given back when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    book: &'static Book,
    n: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let mut p = self.book.promised.lock().expect("descriptor book");
        *p = p.saturating_sub(self.n);
    }
}

impl Book {
    pub(crate) const fn new(limit: u64) -> Self {
        Self { limit, promised: Mutex::new(0) }
    }

    /// What may be promised: the limit less what is kept for everything else.
    fn budget(&self) -> u64 {
        self.limit.saturating_sub((self.limit / 4).max(MIN_KEPT))
    }

    /// Promises `n` descriptors to `what` (a sandbox's network, its proxy), or refuses.
    pub(crate) fn charge(&'static self, n: u64, what: &str) -> io::Result<Charge> {
        let mut p = self.promised.lock().expect("descriptor book");
        if p.saturating_add(n) > self.budget() {
            return Err(io::Error::new(
                io::ErrorKind::QuotaExceeded,
                format!(
                    "too many descriptors promised: {what} may hold {n} of this process's descriptors, and live sandboxes' networks may hold {} of the {} admitted (RLIMIT_NOFILE {} less {} kept for the rest); kill some sandboxes, lower SCENARIO_RUN_PROXY_CONNS, or raise the limit (ulimit -n)",
                    *p,
                    self.budget(),
                    self.limit,
                    self.limit - self.budget()
                ),
            ));
        }
        *p += n;
        Ok(Charge { book: self, n })
    }
}

/// The process's book: the soft `RLIMIT_NOFILE`, raised first (see the module documentation).
pub(crate) fn book() -> &'static Book {
    static BOOK: OnceLock<Book> = OnceLock::new();
    BOOK.get_or_init(|| Book::new(raise_nofile()))
}

/// Raises the soft `RLIMIT_NOFILE` towards the hard one (at most [`RAISE_TO`]); returns the
/// soft limit then in force.
fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let want = now.maximum.unwrap_or(u64::MAX).min(RAISE_TO);
    if want > soft && setrlimit(Resource::Nofile, Rlimit { current: Some(want), maximum: now.maximum }).is_ok() {
        return want;
    }
    soft.min(u64::MAX / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaked(limit: u64) -> &'static Book {
        Box::leak(Box::new(Book::new(limit)))
    }

    #[test]
    fn promises_stay_within_the_limit_less_what_is_kept_and_come_back() {
        // 2,000 descriptors: 500 kept, 1,500 promised at most.
        let b = leaked(2000);
        let nets: Vec<Charge> = (0..14).map(|_| b.charge(NET_FDS, "a network").unwrap()).collect();
        let e = b.charge(257, "sandbox x's egress proxy").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::QuotaExceeded);
        let m = e.to_string();
        assert!(
            m.contains("sandbox x's egress proxy may hold 257")
                && m.contains("may hold 1456 of the 1500 admitted (RLIMIT_NOFILE 2000 less 500"),
            "{m}"
        );
        assert!(m.contains("SCENARIO_RUN_PROXY_CONNS") && m.contains("ulimit -n"), "the knobs are named: {m}");
        drop(nets);
        assert_eq!(*b.promised.lock().unwrap(), 0);
        b.charge(1500, "all").unwrap();
    }

    #[test]
    fn a_small_limit_keeps_at_least_the_minimum() {
        let b = leaked(300);
        assert_eq!(b.budget(), 300 - MIN_KEPT);
        assert!(b.charge(NET_FDS, "a network").is_err());
        assert_eq!(leaked(100).budget(), 0);
    }

    #[test]
    fn the_process_book_raises_the_soft_limit() {
        let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let b = book();
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
        assert_eq!(b.limit, soft.min(u64::MAX / 2));
        if let Some(hard) = lim.maximum {
            assert_eq!(soft, hard.min(RAISE_TO).max(lim.current.unwrap_or(0)));
        }
    }
}

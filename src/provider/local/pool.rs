//! Things made ahead: one refill machine for the provider's pools (networks, disk images,
//! booted sandboxes).
//!
//! A [`Pool`] keeps spares a [`Maker`] makes, up to what the maker plans from the spares
//! ready and the pool's target. Taking one starts the refill: one task that makes one spare
//! after another, and stops when the maker plans nothing more, when making one fails (the
//! failure shows on the next take, which makes its own and reports it; the one after that
//! starts the refill again, so a maker that always fails is tried once per take, never in a
//! loop) or when the pool is closed. The task holds no reference to the pool while it makes a
//! spare, so the pool goes when its owner drops it; a spare made after that, or after the
//! pool was closed or cleared, is destroyed at once. So every spare is destroyed whichever
//! way the pool ends: [`Pool::close`] (waiting for the spare being made),
//! [`Pool::close_now`] (the spares ready are handed back; the one being made is destroyed
//! when its making returns), or a drop (the spares' own drops).

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

/// What a pool keeps: how one spare is made and destroyed, and which to make next.
#[async_trait]
pub(super) trait Maker: Send + Sync + 'static {
    type Spare: Send + 'static;
    /// What a spare is made to and taken by (a booted sandbox's shape; `()` for a pool of one
    /// kind).
    type Kind: Clone + PartialEq + Send + Sync + 'static;

    /// What to make next, given the kinds of the spares ready (oldest first) and the pool's
    /// target; None when nothing is short.
    fn next(&self, ready: &[&Self::Kind], target: usize) -> Option<Next<Self::Kind>>;

    /// Makes one spare; None if that failed.
    async fn make(&self, kind: &Self::Kind) -> Option<Self::Spare>;

    /// Whether a spare ready is still fit to hand out (an unfit one is destroyed instead).
    fn usable(&self, _spare: &Self::Spare) -> bool {
        true
    }

    /// Destroys a spare; the synchronous way, for where no runtime is at hand.
    fn destroy_now(&self, spare: Self::Spare);

    /// Destroys a spare.
    async fn destroy(&self, spare: Self::Spare) {
        self.destroy_now(spare);
    }
}

/// What the refill makes next: a spare of `kind`, after destroying the spare ready at
/// `evict` (an index into the spares ready) to make room.
pub(super) struct Next<K> {
    pub kind: K,
    pub evict: Option<usize>,
}

/// [`Maker::next`] for a pool of one kind: one more while fewer than `target` are ready.
pub(super) fn up_to_target(ready: &[&()], target: usize) -> Option<Next<()>> {
    (ready.len() < target).then_some(Next { kind: (), evict: None })
}

/// A pool's target from the variable `var` (a number), else `default`; at most `max`.
pub(super) fn target_from_env(var: &str, default: usize, max: usize) -> usize {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default).min(max)
}

/// How long [`Pool::close`] waits for the spare being made.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

/// Spares made ahead (see the module documentation).
pub(super) struct Pool<M: Maker> {
    maker: Arc<M>,
    target: usize,
    state: Mutex<State<M>>,
    /// The refill task runs.
    filling: AtomicBool,
    closed: AtomicBool,
    /// Told whenever the refill task stops.
    idle: tokio::sync::Notify,
}

struct State<M: Maker> {
    /// Spares ready, oldest first.
    ready: Vec<(M::Kind, M::Spare)>,
    /// Bumped by [`Pool::clear`]: a spare planned before it is destroyed instead of kept.
    epoch: u64,
}

impl<M: Maker> Pool<M> {
    /// A pool of what `maker` makes; `target` is handed to [`Maker::next`], and 0 keeps
    /// nothing (no refill ever runs).
    pub(super) fn new(maker: M, target: usize) -> Arc<Self> {
        Arc::new(Self {
            maker: Arc::new(maker),
            target,
            state: Mutex::new(State { ready: Vec::new(), epoch: 0 }),
            filling: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            idle: tokio::sync::Notify::new(),
        })
    }

    pub(super) fn maker(&self) -> &M {
        &self.maker
    }

    pub(super) fn target(&self) -> usize {
        self.target
    }

    /// The newest usable spare of `kind`, if one is ready (unfit ones met on the way are
    /// destroyed); starts the refill either way.
    pub(super) fn take(self: &Arc<Self>, kind: &M::Kind) -> Option<M::Spare> {
        let (found, unfit) = {
            let mut st = self.state.lock().expect("pool");
            let mut unfit = Vec::new();
            let mut found = None;
            while let Some(i) = st.ready.iter().rposition(|(k, _)| k == kind) {
                let (_, s) = st.ready.remove(i);
                if self.maker.usable(&s) {
                    found = Some(s);
                    break;
                }
                unfit.push(s);
            }
            (found, unfit)
        };
        self.destroy_later(unfit);
        self.refill();
        found
    }

    /// Starts the refill task unless it runs, the pool is closed or keeps nothing, or no
    /// runtime is at hand.
    pub(super) fn refill(self: &Arc<Self>) {
        if self.target == 0 || self.closed.load(SeqCst) || self.filling.swap(true, SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.stop_filling();
            return;
        };
        let (pool, maker) = (Arc::downgrade(self), self.maker.clone());
        rt.spawn(async move {
            loop {
                let Some((kind, epoch)) = pool.upgrade().and_then(|p| p.plan()) else { return };
                let made = maker.make(&kind).await;
                let Some(p) = pool.upgrade() else {
                    if let Some(s) = made {
                        maker.destroy(s).await;
                    }
                    return;
                };
                let Some(spare) = made else {
                    p.stop_filling();
                    return;
                };
                // Under the lock `close_now` and `clear` take: a spare is either handed to
                // them or destroyed here.
                let unkept = {
                    let mut st = p.state.lock().expect("pool");
                    if !p.closed.load(SeqCst) && st.epoch == epoch {
                        st.ready.push((kind, spare));
                        None
                    } else {
                        Some(spare)
                    }
                };
                if let Some(s) = unkept {
                    maker.destroy(s).await;
                }
            }
        });
    }

    /// What the refill makes next, making room for it if the maker says so, and the pool's
    /// epoch then; None stops the refill.
    fn plan(&self) -> Option<(M::Kind, u64)> {
        let mut evicted = Vec::new();
        let next = {
            let mut st = self.state.lock().expect("pool");
            let next = if self.closed.load(SeqCst) {
                None
            } else {
                let kinds: Vec<&M::Kind> = st.ready.iter().map(|(k, _)| k).collect();
                self.maker.next(&kinds, self.target)
            };
            match next {
                Some(n) => {
                    if let Some(i) = n.evict {
                        evicted.push(st.ready.remove(i).1);
                    }
                    Some((n.kind, st.epoch))
                }
                None => {
                    self.stop_filling();
                    None
                }
            }
        };
        self.destroy_later(evicted);
        next
    }

    fn stop_filling(&self) {
        self.filling.store(false, SeqCst);
        self.idle.notify_waiters();
    }

    /// Destroys every spare ready, and the one being made when its making returns; the pool
    /// goes on refilling.
    pub(super) async fn clear(&self) {
        let spares = {
            let mut st = self.state.lock().expect("pool");
            st.epoch += 1;
            st.ready.drain(..).map(|(_, s)| s).collect()
        };
        destroy_all(&self.maker, spares).await;
    }

    /// No more spares: waits (bounded) for the one being made, then destroys every spare.
    pub(super) async fn close(&self) {
        self.closed.store(true, SeqCst);
        let deadline = tokio::time::Instant::now() + CLOSE_WAIT;
        while self.filling.load(SeqCst) {
            let idle = self.idle.notified();
            if !self.filling.load(SeqCst) || tokio::time::timeout_at(deadline, idle).await.is_err() {
                break;
            }
        }
        self.clear().await;
    }

    /// No more spares; hands back those ready, for the caller to destroy at once (the
    /// synchronous last resort). The one being made is destroyed when its making returns.
    pub(super) fn close_now(&self) -> Vec<M::Spare> {
        let mut st = self.state.lock().expect("pool");
        self.closed.store(true, SeqCst);
        st.ready.drain(..).map(|(_, s)| s).collect()
    }

    fn destroy_later(&self, spares: Vec<M::Spare>) {
        if spares.is_empty() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let maker = self.maker.clone();
                rt.spawn(async move { destroy_all(&maker, spares).await });
            }
            Err(_) => spares.into_iter().for_each(|s| self.maker.destroy_now(s)),
        }
    }
}

/// Destroys `spares` side by side.
async fn destroy_all<M: Maker>(maker: &Arc<M>, spares: Vec<M::Spare>) {
    let mut set = tokio::task::JoinSet::new();
    for s in spares {
        let maker = maker.clone();
        set.spawn(async move { maker.destroy(s).await });
    }
    while set.join_next().await.is_some() {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Numbers as spares; counts what it makes and destroys, and can be held up or fail.
    #[derive(Default)]
    struct Counter {
        made: AtomicUsize,
        destroyed: AtomicUsize,
        tries: AtomicUsize,
        /// Makings under way now, and the most at once.
        making: AtomicUsize,
        most: AtomicUsize,
        fail: AtomicBool,
        /// When set, each making waits for a permit.
        gate: Option<tokio::sync::Semaphore>,
    }

    #[async_trait]
    impl Maker for Counter {
        type Spare = usize;
        type Kind = ();

        fn next(&self, ready: &[&()], target: usize) -> Option<Next<()>> {
            up_to_target(ready, target)
        }

        async fn make(&self, _: &()) -> Option<usize> {
            self.tries.fetch_add(1, SeqCst);
            let now = self.making.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            if let Some(g) = &self.gate {
                g.acquire().await.expect("gate").forget();
            } else {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            self.making.fetch_sub(1, SeqCst);
            if self.fail.load(SeqCst) {
                return None;
            }
            Some(self.made.fetch_add(1, SeqCst))
        }

        fn destroy_now(&self, _: usize) {
            self.destroyed.fetch_add(1, SeqCst);
        }
    }

    fn gated() -> Counter {
        Counter { gate: Some(tokio::sync::Semaphore::new(0)), ..Default::default() }
    }

    fn ready<M: Maker>(p: &Pool<M>) -> usize {
        p.state.lock().unwrap().ready.len()
    }

    /// Waits (at most 5 s) until `f` holds.
    async fn until(what: &str, f: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !f() {
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    #[tokio::test]
    async fn a_take_refills_to_the_target_one_at_a_time_and_no_further() {
        let p = Pool::new(Counter::default(), 3);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(p.maker().tries.load(SeqCst), 0, "nothing is made before the first take");
        assert_eq!(p.take(&()), None);
        until("three are ready", || ready(&p) == 3).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(p.maker().made.load(SeqCst), 3, "no more than the target");
        assert_eq!(p.maker().most.load(SeqCst), 1, "one refill task");
        assert!(!p.filling.load(SeqCst), "the refill stopped");
        // Newest first; the one taken is made again.
        assert_eq!(p.take(&()), Some(2));
        until("the taken one is made again", || p.maker().made.load(SeqCst) == 4).await;
        until("three are ready again", || ready(&p) == 3).await;
        assert_eq!(p.maker().destroyed.load(SeqCst), 0);
    }

    #[tokio::test]
    async fn takes_while_filling_get_what_is_ready_and_start_no_second_refill() {
        let p = Pool::new(gated(), 2);
        assert_eq!(p.take(&()), None);
        assert_eq!(p.take(&()), None, "nothing is ready while the first is being made");
        p.maker().gate.as_ref().unwrap().add_permits(1);
        until("one is ready", || ready(&p) == 1).await;
        assert_eq!(p.take(&()), Some(0), "taken while the next is being made");
        assert_eq!(p.take(&()), None);
        p.maker().gate.as_ref().unwrap().add_permits(3);
        until("two are ready", || ready(&p) == 2).await;
        assert_eq!(p.maker().most.load(SeqCst), 1, "one refill task");
        assert_eq!(p.maker().made.load(SeqCst), 3);
    }

    #[tokio::test]
    async fn close_destroys_every_spare_and_the_one_being_made() {
        let p = Pool::new(gated(), 3);
        p.take(&());
        p.maker().gate.as_ref().unwrap().add_permits(2);
        until("two are ready and a third is being made", || ready(&p) == 2 && p.maker().making.load(SeqCst) == 1).await;
        let closing = tokio::spawn({
            let p = p.clone();
            async move { p.close().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!closing.is_finished(), "close waits for the spare being made");
        p.maker().gate.as_ref().unwrap().add_permits(1);
        closing.await.unwrap();
        assert_eq!(p.maker().made.load(SeqCst), 3);
        assert_eq!(p.maker().destroyed.load(SeqCst), 3, "every spare made is destroyed");
        assert_eq!(ready(&p), 0);
        assert_eq!(p.take(&()), None, "a closed pool hands out nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(p.maker().tries.load(SeqCst), 3, "and makes nothing more");
    }

    #[tokio::test]
    async fn close_now_hands_back_the_spares_and_the_one_being_made_is_destroyed() {
        let p = Pool::new(gated(), 3);
        p.take(&());
        p.maker().gate.as_ref().unwrap().add_permits(1);
        until("one is ready and another is being made", || ready(&p) == 1 && p.maker().making.load(SeqCst) == 1).await;
        assert_eq!(p.close_now(), vec![0]);
        p.maker().gate.as_ref().unwrap().add_permits(1);
        until("the one being made is destroyed", || p.maker().destroyed.load(SeqCst) == 1).await;
        assert_eq!(ready(&p), 0);
        assert!(!p.filling.load(SeqCst));
        assert_eq!(p.maker().made.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn a_spare_made_after_the_pool_is_dropped_is_destroyed() {
        let p = Pool::new(gated(), 3);
        p.take(&());
        until("one is being made", || p.maker().making.load(SeqCst) == 1).await;
        let maker = p.maker.clone();
        drop(p);
        maker.gate.as_ref().unwrap().add_permits(1);
        until("it is destroyed", || maker.destroyed.load(SeqCst) == 1).await;
        assert_eq!(maker.made.load(SeqCst), 1);
    }

    #[tokio::test]
    async fn clear_destroys_the_spares_and_the_one_being_made_and_refills_later() {
        let p = Pool::new(gated(), 2);
        p.take(&());
        p.maker().gate.as_ref().unwrap().add_permits(1);
        until("one is ready and another is being made", || ready(&p) == 1 && p.maker().making.load(SeqCst) == 1).await;
        p.clear().await;
        assert_eq!(p.maker().destroyed.load(SeqCst), 1);
        p.maker().gate.as_ref().unwrap().add_permits(1);
        until("the one being made is destroyed", || p.maker().destroyed.load(SeqCst) == 2).await;
        p.maker().gate.as_ref().unwrap().add_permits(2);
        until("two are ready", || ready(&p) == 2).await;
        assert_eq!(p.maker().made.load(SeqCst), 4);
    }

    #[tokio::test]
    async fn a_failing_maker_is_tried_once_per_take() {
        let c = Counter::default();
        c.fail.store(true, SeqCst);
        let p = Pool::new(c, 3);
        assert_eq!(p.take(&()), None);
        until("the refill stopped", || p.maker().tries.load(SeqCst) == 1 && !p.filling.load(SeqCst)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(p.maker().tries.load(SeqCst), 1, "not tried again until the next take");
        assert_eq!(p.take(&()), None);
        until("tried once more", || p.maker().tries.load(SeqCst) == 2 && !p.filling.load(SeqCst)).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(p.maker().tries.load(SeqCst), 2);
        // Once it works again, a take fills the pool.
        p.maker().fail.store(false, SeqCst);
        p.take(&());
        until("three are ready", || ready(&p) == 3).await;
    }

    #[tokio::test]
    async fn a_pool_with_no_target_makes_nothing() {
        let p = Pool::new(Counter::default(), 0);
        assert_eq!(p.take(&()), None);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(p.maker().tries.load(SeqCst), 0);
    }

    /// Spares of the kinds wanted (`target` of each), at most two in all: the refill evicts the
    /// oldest spare of another kind to make one short. Spare 0 is unusable.
    #[derive(Default)]
    struct Kinds {
        wanted: Mutex<Vec<char>>,
        made: AtomicUsize,
        destroyed: Mutex<Vec<(char, usize)>>,
    }

    #[async_trait]
    impl Maker for Kinds {
        type Spare = (char, usize);
        type Kind = char;

        fn next(&self, ready: &[&char], target: usize) -> Option<Next<char>> {
            let wanted = self.wanted.lock().unwrap();
            let short = *wanted.iter().rev().find(|w| ready.iter().filter(|r| **r == *w).count() < target)?;
            if ready.len() < 2 {
                return Some(Next { kind: short, evict: None });
            }
            let i = ready.iter().position(|r| **r != short)?;
            Some(Next { kind: short, evict: Some(i) })
        }

        async fn make(&self, kind: &char) -> Option<(char, usize)> {
            Some((*kind, self.made.fetch_add(1, SeqCst)))
        }

        fn usable(&self, spare: &(char, usize)) -> bool {
            spare.1 != 0
        }

        fn destroy_now(&self, spare: (char, usize)) {
            self.destroyed.lock().unwrap().push(spare);
        }
    }

    #[tokio::test]
    async fn spares_of_kinds_are_taken_by_kind_and_evicted_for_the_one_wanted() {
        let p = Pool::new(Kinds::default(), 1);
        let want = |k: char| {
            let mut w = p.maker().wanted.lock().unwrap();
            w.push(k);
            if w.len() > 2 {
                w.remove(0);
            }
        };
        want('a');
        assert_eq!(p.take(&'a'), None);
        until("one of `a` is ready", || ready(&p) == 1).await;
        want('b');
        assert_eq!(p.take(&'b'), None);
        until("one of `b` is ready too", || ready(&p) == 2).await;
        want('c');
        assert_eq!(p.take(&'c'), None);
        until("one of `c` is made", || p.maker().made.load(SeqCst) == 3).await;
        until("the oldest spare of another kind is evicted", || p.maker().destroyed.lock().unwrap().len() == 1).await;
        assert_eq!(p.maker().destroyed.lock().unwrap()[0], ('a', 0));
        until("`b` and `c` are ready", || {
            p.state.lock().unwrap().ready.iter().map(|(k, _)| *k).collect::<Vec<_>>() == ['b', 'c']
        })
        .await;
        assert_eq!(p.take(&'b'), Some(('b', 1)));
        assert_eq!(p.take(&'a'), None);
    }

    #[tokio::test]
    async fn an_unusable_spare_is_destroyed_and_the_next_taken() {
        let p = Pool::new(Kinds::default(), 2);
        p.maker().wanted.lock().unwrap().push('a');
        p.take(&'a');
        until("two are ready", || ready(&p) == 2).await;
        // Spare 0 is unusable; the newest (1) is taken first anyway.
        assert_eq!(p.take(&'a'), Some(('a', 1)));
        until("one is made again", || p.maker().made.load(SeqCst) == 3).await;
        until("two are ready again", || ready(&p) == 2).await;
        assert_eq!(p.take(&'a'), Some(('a', 2)));
        assert_eq!(p.take(&'a'), None, "spare 0 is not handed out");
        until("spare 0 is destroyed", || p.maker().destroyed.lock().unwrap().contains(&('a', 0))).await;
    }
}

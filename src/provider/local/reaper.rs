//! Cleanups that must wait, started where waiting is not allowed.
//!
//! Removing a killed sandbox's cgroup waits for its last processes to exit (a group is busy
//! until then), and its state directory is removed only once nothing writes into it. A `Drop`
//! (of the provider, of a sandbox whose owner went away mid-create) must not wait: it may run
//! on a runtime worker, and sleeping there stalls every task of the runtime (on a
//! current-thread runtime, all of them) for as long. So `Drop` does what is instant (SIGKILL)
//! itself and hands the rest to [`run`], which runs it on a thread of its own.
//!
//! A thread of its own, not the runtime's blocking pool: a drop also happens while a runtime
//! shuts down, when its pool takes no new work. And as the process's exit does not wait for
//! such a thread, the ways out wait for them with [`wait`] (`cli::block_on` once its runtime
//! is gone, [`super::LocalProvider`]'s `destroy_all_now` before the exit of a second Ctrl-C),
//! so an exit right after a drop leaves nothing behind.
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Cleanups handed off and not yet done.
static PENDING: Mutex<usize> = Mutex::new(0);
static DONE: Condvar = Condvar::new();

/// Counts a cleanup done when dropped (also when it panicked).
struct Done;

impl Drop for Done {
    fn drop(&mut self) {
        let mut n = PENDING.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        DONE.notify_all();
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on a thread of its own, counted until it returns. Where no thread can be
/// started, runs it here (blocking, but never left undone).
pub(crate) fn run(job: impl FnOnce() + Send + 'static) {
    *PENDING.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    let slot: Arc<Mutex<Option<Job>>> = Arc::new(Mutex::new(Some(Box::new(job))));
    let take_and_run = |slot: &Mutex<Option<Job>>| {
        let job = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(job) = job {
            let _done = Done;
            job();
        }
    };
    let s = slot.clone();
    if std::thread::Builder::new().name("sandbox-cleanup".into()).spawn(move || take_and_run(&s)).is_err() {
        take_and_run(&slot);
    }
}

/// Waits until every cleanup handed to [`run`] is done, at most `timeout`. True if all are.
pub(crate) fn wait(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let mut n = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    while *n > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        n = DONE.wait_timeout(n, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    /// A cleanup runs elsewhere at once, and `wait` returns only once it is done (or says it
    /// is not, past its timeout).
    #[test]
    fn run_does_not_wait_and_wait_waits_for_the_cleanup() {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let t = Instant::now();
        run(move || {
            std::thread::sleep(Duration::from_millis(300));
            d.store(true, SeqCst);
        });
        assert!(t.elapsed() < Duration::from_millis(100), "run waited {:?}", t.elapsed());
        assert!(!wait(Duration::from_millis(10)), "wait said done before the cleanup was");
        assert!(wait(Duration::from_secs(10)));
        assert!(done.load(SeqCst), "wait returned before the cleanup ended");
    }
}

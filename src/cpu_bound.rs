//! CPU-bound work (masking, encoding, converting a big output) done on an async worker
//! thread without stalling the other tasks queued on it.
//!
//! A run is many scenarios on one multi-threaded tokio runtime with as many workers as cores
//! (two here). Masking, converting or encoding a step's 100 MiB output takes seconds of CPU;
//! done in place it holds its worker, and the tasks queued on that worker (another scenario's
//! HTTP call, its timer) wait with it: a kill then went unanswered past its 30 s timeout.
//! [`off_runtime`] hands the worker's queue to another thread first (`block_in_place`) when the job is
//! big enough to matter, so only the scenario that owns the big output waits for it.

/// Bytes of data from which a job is worth moving off the async workers.
pub const OFF_RUNTIME_BYTES: usize = 1 << 20;

/// Runs `f`. When `bytes` (the size of what `f` works on) is at least [`OFF_RUNTIME_BYTES`] and this is
/// a worker of a multi-threaded runtime, its other tasks are moved to another thread first.
pub fn off_runtime<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let multi = Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if bytes >= OFF_RUNTIME_BYTES && multi {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// The bytes of text in `v` (its strings and keys), counted up to `limit`: enough to tell a
/// big output from a small one without walking all of a big one.
pub fn json_text_bytes(v: &serde_json::Value, limit: usize) -> usize {
    use serde_json::Value;
    let mut total = 0usize;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        if total >= limit {
            break;
        }
        match v {
            Value::String(s) => total += s.len(),
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(o) => {
                for (k, v) in o {
                    total += k.len();
                    stack.push(v);
                }
            }
            _ => total += 8,
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_count_strings_and_keys_up_to_the_limit() {
        let v = serde_json::json!({"ab": "xyz", "n": [1, "12345"]});
        assert_eq!(json_text_bytes(&v, usize::MAX), 2 + 3 + 1 + 8 + 5);
        let big = serde_json::json!(["a".repeat(10), "b".repeat(10), "c".repeat(10)]);
        assert!(json_text_bytes(&big, 15) < 30, "stops once past the limit");
    }

    #[test]
    fn outside_a_runtime_it_just_runs() {
        assert_eq!(off_runtime(OFF_RUNTIME_BYTES, || 7), 7);
    }
}

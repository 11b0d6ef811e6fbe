//! What a provider keeps of a command's output: the first `max_output` bytes of each
//! stream. Whatever comes after is still sent to a live listener, but only counted here.

use super::{ExecRequest, ExecResult, MAX_OUTPUT};

#[derive(Debug)]
pub(crate) struct Captured {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stdout_dropped: u64,
    stderr_dropped: u64,
    cap: usize,
}

impl Default for Captured {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Captured {
    /// Keeps up to `max_output` bytes of each stream ([`MAX_OUTPUT`] if None).
    pub fn new(max_output: Option<usize>) -> Self {
        let cap = max_output.unwrap_or(MAX_OUTPUT);
        Self { stdout: Vec::new(), stderr: Vec::new(), stdout_dropped: 0, stderr_dropped: 0, cap }
    }

    pub fn for_request(req: &ExecRequest) -> Self {
        Self::new(req.max_output)
    }

    pub fn stdout(&mut self, chunk: &[u8]) {
        keep(&mut self.stdout, &mut self.stdout_dropped, chunk, self.cap);
    }

    pub fn stderr(&mut self, chunk: &[u8]) {
        keep(&mut self.stderr, &mut self.stderr_dropped, chunk, self.cap);
    }

    /// A result holding a copy of what was kept; the caller fills in the status.
    pub fn result(&self) -> ExecResult {
        ExecResult {
            stdout: self.stdout.clone(),
            stderr: self.stderr.clone(),
            stdout_dropped: self.stdout_dropped,
            stderr_dropped: self.stderr_dropped,
            ..ExecResult::default()
        }
    }
}

/// Appends what fits of `chunk` under `cap` to `buf`; counts the rest in `dropped`.
pub(crate) fn keep(buf: &mut Vec<u8>, dropped: &mut u64, chunk: &[u8], cap: usize) {
    let n = cap.saturating_sub(buf.len()).min(chunk.len());
    buf.extend_from_slice(&chunk[..n]);
    *dropped += (chunk.len() - n) as u64;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let mut c = Captured::new(Some(5));
        c.stdout(b"abc");
        c.stdout(b"defg");
        c.stdout(b"hi");
        c.stderr(b"12345");
        let r = c.result();
        assert_eq!((r.stdout.as_slice(), r.stdout_dropped), (&b"abcde"[..], 4));
        assert_eq!((r.stderr.as_slice(), r.stderr_dropped), (&b"12345"[..], 0));
    }

    #[test]
    fn a_request_sets_the_cap() {
        let mut c = Captured::for_request(&ExecRequest { max_output: Some(0), ..ExecRequest::default() });
        c.stdout(b"x");
        assert_eq!((c.result().stdout.len(), c.result().stdout_dropped), (0, 1));
        assert_eq!(Captured::default().cap, MAX_OUTPUT);
    }
}

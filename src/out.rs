//! Writing to standard output and standard error without panicking.
//!
//! `print!`, `println!` and `eprintln!` panic when the write fails, and a closed pipe is an
//! ordinary way for a write to fail: `scenario-run --list | head` closes stdout after ten
//! lines, and the panic made the run exit 101. Rust ignores SIGPIPE, so the write returns
//! `EPIPE` instead of killing the process (which would also skip sandbox cleanup); here that
//! error is data. Stderr problems are ignored (there is nowhere left to say anything); stdout
//! problems are returned, so a command can end quietly when its reader has gone.

use std::io::{self, Write};

/// Write `text` to stdout and flush. `Ok` also when the reader has gone (broken pipe): the
/// output was not wanted any more, which is not an error of ours.
pub fn stdout(text: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Write `text` to stderr, ignoring failure.
pub fn stderr(text: &str) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::stderr(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `println!` that never panics; a reader that has gone is ignored (see [`stdout`]).
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {{
        let _ = $crate::out::stdout(&format!("{}\n", format_args!($($arg)*)));
    }};
}

/// The width of the terminal on standard output, else `COLUMNS`, else `None` (a pipe or a
/// file: nothing is cut to fit).
pub fn terminal_width() -> Option<usize> {
    // fd 1 may be anything; a non-terminal only makes TIOCGWINSZ fail.
    if let Ok(ws) = rustix::termios::tcgetwinsize(rustix::stdio::stdout()) {
        if ws.ws_col > 0 {
            return Some(usize::from(ws.ws_col));
        }
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.trim().parse().ok()).filter(|&c: &usize| c > 0)
}

/// While alive, the terminal on standard input does not echo control characters: Ctrl-C no
/// longer prints `^C`. The live view needs that: indicatif leaves the cursor at the right
/// edge of its last line, so the echoed `^C` wrapped onto a new line, the view's count of
/// its own lines was one short, and taking it down left its top line on screen. Dropped, it
/// puts the terminal back as it found it. Nothing happens when stdin is not a terminal, or
/// when the run is not in the terminal's foreground (`scenario-run … &`): the terminal is not
/// ours to change then.
pub struct NoEchoCtl(Option<rustix::termios::Termios>);

impl NoEchoCtl {
    pub fn new() -> Self {
        use rustix::termios::{tcgetattr, tcgetpgrp, LocalModes};
        let stdin = rustix::stdio::stdin();
        let Ok(before) = tcgetattr(stdin) else { return NoEchoCtl(None) };
        let foreground = tcgetpgrp(stdin).is_ok_and(|p| p == rustix::process::getpgrp());
        if !foreground || !before.local_modes.contains(LocalModes::ECHOCTL) {
            return NoEchoCtl(None);
        }
        let mut quiet = before.clone();
        quiet.local_modes.remove(LocalModes::ECHOCTL);
        match set_attrs(&quiet) {
            Ok(()) => NoEchoCtl(Some(before)),
            Err(_) => NoEchoCtl(None),
        }
    }
}

/// `tcsetattr` on stdin with SIGTTOU ignored meanwhile: a run moved to the background after
/// the view went up (Ctrl-Z, `bg`) would otherwise be stopped by the kernel when it puts the
/// terminal back.
fn set_attrs(t: &rustix::termios::Termios) -> rustix::io::Result<()> {
    // SAFETY: swapping a signal's disposition to SIG_IGN and back; no handler runs.
    let old = unsafe { libc::signal(libc::SIGTTOU, libc::SIG_IGN) };
    let r = rustix::termios::tcsetattr(rustix::stdio::stdin(), rustix::termios::OptionalActions::Now, t);
    // SAFETY: as above, restoring what was there.
    unsafe { libc::signal(libc::SIGTTOU, old) };
    r
}

impl Default for NoEchoCtl {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NoEchoCtl {
    fn drop(&mut self) {
        if let Some(before) = self.0.take() {
            // Only the flag we cleared: anything else changed meanwhile stays.
            let now = rustix::termios::tcgetattr(rustix::stdio::stdin()).map(|mut now| {
                now.local_modes.insert(rustix::termios::LocalModes::ECHOCTL);
                now
            });
            let _ = set_attrs(now.as_ref().unwrap_or(&before));
        }
    }
}

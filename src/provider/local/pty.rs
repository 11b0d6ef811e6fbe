//! Pseudo-terminals for commands (envd's PTY sessions).
//!
//! The terminal is allocated from the sandbox's own `devpts` (its `/dev/pts/ptmx`, opened in
//! its root), so inside it is a real `/dev/pts/N` of the sandbox. The command gets the
//! terminal's peer as stdin, stdout and stderr and makes it its controlling terminal (see
//! `enter`), so job control, `tput` and `SIGWINCH` on resize behave as in a terminal. What
//! the command writes is read from the master by a thread until the last peer closes.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

use super::files::Root;
use crate::provider::{OutputChunk, OutputTx, ProviderError, Result};

/// A terminal: the master kept by the provider, the peer handed to the command.
pub(crate) struct Pty {
    pub master: OwnedFd,
    pub peer: OwnedFd,
}

/// Opens a terminal of `cols` × `rows` in the sandbox of `root`.
pub(crate) fn open(root: &Root, cols: u16, rows: u16) -> Result<Pty> {
    let master = root.open_device("/dev/pts/ptmx", libc::O_RDWR | libc::O_NOCTTY)?;
    let infra = |what: &str, e: Errno| ProviderError::infra(format!("{what}: {}", std::io::Error::from(e)));
    // TIOCSPTLCK with 0.
    rustix::pty::unlockpt(&master).map_err(|e| infra("cannot unlock the terminal", e))?;
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let peer =
        rustix::pty::ioctl_tiocgptpeer(&master, flags).map_err(|e| infra("cannot open the terminal's peer", e))?;
    resize(master.as_fd(), cols, rows).map_err(|e| ProviderError::infra(format!("cannot size the terminal: {e}")))?;
    Ok(Pty { master, peer })
}

/// Sets the terminal's size (the command's foreground group gets `SIGWINCH`).
pub(crate) fn resize(master: BorrowedFd<'_>, cols: u16, rows: u16) -> std::io::Result<()> {
    let ws = Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // TIOCSWINSZ.
    Ok(rustix::termios::tcsetwinsize(master, ws)?)
}

/// Writes `data` to the terminal (what the user types), all of it.
pub(crate) fn write(master: BorrowedFd<'_>, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        match rustix::io::write(master, data) {
            Ok(n) => data = &data[n..],
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Forwards what the command writes to `tx` (as stdout chunks of up to 16 KiB, envd's PTY
/// chunk), on a thread, until every peer is closed.
pub(crate) fn forward(master: &OwnedFd, tx: OutputTx) -> Result<()> {
    let reader = master.try_clone().map_err(|e| ProviderError::infra(format!("cannot read the terminal: {e}")))?;
    std::thread::Builder::new()
        .name("sandbox-pty".into())
        .spawn(move || {
            let mut f = std::fs::File::from(reader);
            let mut buf = vec![0u8; 16 << 10];
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.blocking_send(OutputChunk::Stdout(buf[..n].to_vec())).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // EIO once the last peer closed.
                    Err(_) => break,
                }
            }
        })
        .map_err(|e| ProviderError::infra(format!("cannot start a terminal thread: {e}")))?;
    Ok(())
}

//! Pseudo-terminals for commands (envd's PTY sessions).
//!
//! The terminal is allocated from the sandbox's own `devpts` (its `/dev/pts/ptmx`, opened in
//! its root), so inside it is a real `/dev/pts/N` of the sandbox. The command gets the
//! terminal's peer as stdin, stdout and stderr and makes it its controlling terminal (see
//! `enter`), so job control, `tput` and `SIGWINCH` on resize behave as in a terminal. What
//! the command writes is read from the master by a thread until the last peer closes.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

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
    let infra = |what: &str| ProviderError::infra(format!("{what}: {}", std::io::Error::last_os_error()));
    let unlock: libc::c_int = 0;
    // SAFETY: ioctls on a descriptor we own, with the argument types they take.
    let peer = unsafe {
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return Err(infra("cannot unlock the terminal"));
        }
        let fd = libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(infra("cannot open the terminal's peer"));
        }
        OwnedFd::from_raw_fd(fd)
    };
    resize(master.as_raw_fd(), cols, rows)
        .map_err(|e| ProviderError::infra(format!("cannot size the terminal: {e}")))?;
    Ok(Pty { master, peer })
}

/// Sets the terminal's size (the command's foreground group gets `SIGWINCH`).
pub(crate) fn resize(master: RawFd, cols: u16, rows: u16) -> std::io::Result<()> {
    let ws = libc::winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads one winsize.
    if unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `data` to the terminal (what the user types), all of it.
pub(crate) fn write(master: RawFd, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        // SAFETY: valid descriptor and buffer.
        let n = unsafe { libc::write(master, data.as_ptr().cast(), data.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        data = &data[n as usize..];
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

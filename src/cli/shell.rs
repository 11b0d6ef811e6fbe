//! `scenario-run shell <sandbox>`: a terminal in a sandbox, typically one `--keep-on-failure`
//! kept, through the provider's `pty` capability; or, with `-- CMD`, one command and its exit
//! code (what a script or a test uses, and the way in when standard input is no terminal).
//!
//! The session itself ([`session`]) runs where the provider is. For a remote provider (docker,
//! e2b, alicloud, opensandbox) that is this process. A local sandbox lives inside the run that
//! made it (it dies with that process), so the run that kept it listens on a Unix socket beside
//! the sandbox's state (`<state dir>/<id>.shell/sock`, in a directory of mode 700, see `cli::keep`), runs the
//! session there, and this process only relays its terminal over the socket. Both sides speak
//! the same few frames ([`Up`], [`Down`]), so the terminal handling is the same either way.
//!
//! On a terminal the local one is put in raw mode (restored on every way out), its size is
//! the remote terminal's and a resize (SIGWINCH) is forwarded; the exit code is the remote
//! command's (128 + the signal that ended it, as a shell reports one).

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::wiring::{block_on, make_provider};
use crate::errln;
use crate::provider::factory::{self, ProviderKind};
use crate::provider::Capability;
use crate::provider::{ExecRequest, OutputChunk, Provider};

/// What the shell starts without a command: an interactive login shell, as the `pty` step's.
const SHELL: &str = "exec /bin/bash -i -l 2>/dev/null || exec /bin/sh -i";

/// How a session opens: the command (`None`: a shell), whether it gets a terminal, its size.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct Open {
    pub cmd: Option<String>,
    pub tty: bool,
    pub cols: u16,
    pub rows: u16,
}

/// From the user's side to the session.
#[derive(Debug)]
pub(super) enum Up {
    Input(Vec<u8>),
    Resize(u16, u16),
    /// Standard input ended (a command's stdin is complete).
    Eof,
}

/// From the session to the user's side.
#[derive(Debug)]
pub(super) enum Down {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The command ended with this code (128 + signal for a signal).
    Exit(i32),
    /// The session could not start or broke: said on stderr, exit 4.
    Error(String),
}

/// The private directory (0700, the run's user) a kept local sandbox's session listens in.
pub(super) fn socket_dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join(format!("{id}.shell"))
}

/// Where a kept local sandbox's session listens: in [`socket_dir`], so no other user reaches
/// the socket whatever the state directory's mode or the umask it was made under.
pub(super) fn socket_path(state_dir: &Path, id: &str) -> PathBuf {
    socket_dir(state_dir, id).join("sock")
}

/// A sandbox id is a name, never a path.
fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The session: the command in sandbox `id` of `provider`, fed from `up`, reported on `down`.
pub(super) async fn session(
    provider: Arc<dyn Provider>,
    id: String,
    open: Open,
    mut up: mpsc::Receiver<Up>,
    down: mpsc::Sender<Down>,
) {
    let sb = provider.sandbox(&id);
    if !open.tty {
        // One command: its stdin is what came before Eof.
        let mut stdin = Vec::new();
        while let Some(m) = up.recv().await {
            match m {
                Up::Input(d) => stdin.extend_from_slice(&d),
                Up::Eof => break,
                Up::Resize(..) => {}
            }
        }
        let req = ExecRequest {
            cmd: open.cmd.unwrap_or_default(),
            stdin: (!stdin.is_empty()).then_some(stdin),
            ..Default::default()
        };
        let (tx, mut rx) = crate::provider::output_channel();
        let fwd = {
            let down = down.clone();
            tokio::spawn(async move {
                while let Some(chunk) = rx.recv().await {
                    let m = match chunk {
                        OutputChunk::Stdout(b) => Down::Stdout(b),
                        OutputChunk::Stderr(b) => Down::Stderr(b),
                    };
                    if down.send(m).await.is_err() {
                        break;
                    }
                }
            })
        };
        let r = sb.exec(req, Some(tx)).await;
        let _ = fwd.await;
        let _ = down
            .send(match r {
                Ok(r) => Down::Exit(r.exit_code.unwrap_or_else(|| 128 + r.signal.unwrap_or(9))),
                Err(e) => Down::Error(format!("cannot run the command in {id}: {e}")),
            })
            .await;
        return;
    }
    if !provider.capabilities().contains(&Capability::Pty) {
        let _ = down
            .send(Down::Error(format!(
                "the {} provider has no `pty` capability, so it cannot give sandbox {id} a terminal; \
                 run one command instead: scenario-run shell {id} --provider {} -- CMD",
                provider.name(),
                provider.name()
            )))
            .await;
        return;
    }
    let req = ExecRequest { cmd: open.cmd.unwrap_or_else(|| SHELL.to_string()), ..Default::default() };
    let mut live = match sb.spawn_pty(req, open.cols.max(1), open.rows.max(1)).await {
        Ok(l) => l,
        Err(e) => {
            let _ = down.send(Down::Error(format!("cannot open a terminal in {id}: {e}"))).await;
            return;
        }
    };
    let pid = live.pid;
    loop {
        tokio::select! {
            m = up.recv() => match m {
                Some(Up::Input(d)) => { let _ = sb.write_pty(pid, d).await; }
                Some(Up::Resize(c, r)) => { let _ = sb.resize_pty(pid, c.max(1), r.max(1)).await; }
                Some(Up::Eof) => {}
                None => {
                    // The user's side went away: the terminal's command goes too.
                    let _ = sb.signal(pid, libc::SIGKILL).await;
                    return;
                }
            },
            chunk = live.output.recv() => match chunk {
                Some(OutputChunk::Stdout(b) | OutputChunk::Stderr(b)) => {
                    if down.send(Down::Stdout(b)).await.is_err() {
                        let _ = sb.signal(pid, libc::SIGKILL).await;
                        return;
                    }
                }
                None => break,
            },
        }
    }
    let code = match sb.wait(pid, Duration::from_secs(5)).await {
        Ok(r) => r.exit_code.unwrap_or_else(|| 128 + r.signal.unwrap_or(9)),
        Err(_) => 255,
    };
    let _ = down.send(Down::Exit(code)).await;
}

// Frames on the socket: a tag byte, a big-endian u32 length, the payload.

async fn write_frame<W: AsyncWriteExt + Unpin>(w: &mut W, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(tag);
    buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf).await?;
    w.flush().await
}

/// A frame, or `None` at the end of the stream. Frames are at most 16 MiB.
async fn read_frame<R: AsyncReadExt + Unpin>(r: &mut R) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > 16 << 20 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "frame too large"));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await?;
    Ok(Some((head[0], payload)))
}

/// The run side of a kept local sandbox's socket: one connection, one session.
pub(super) async fn serve_connection(provider: Arc<dyn Provider>, id: String, stream: tokio::net::UnixStream) {
    let (mut rd, mut wr) = stream.into_split();
    let Ok(Some((b'h', hello))) = read_frame(&mut rd).await else { return };
    let Ok(open) = serde_json::from_slice::<Open>(&hello) else { return };
    let (up_tx, up_rx) = mpsc::channel::<Up>(64);
    let (down_tx, mut down_rx) = mpsc::channel::<Down>(64);
    let sess = tokio::spawn(session(provider, id, open, up_rx, down_tx));
    let reader = tokio::spawn(async move {
        while let Ok(Some((tag, p))) = read_frame(&mut rd).await {
            let m = match tag {
                b'i' => Up::Input(p),
                b'r' if p.len() == 4 => Up::Resize(u16::from_be_bytes([p[0], p[1]]), u16::from_be_bytes([p[2], p[3]])),
                b'e' => Up::Eof,
                _ => continue,
            };
            if up_tx.send(m).await.is_err() {
                break;
            }
        }
        // Dropping `up_tx` tells the session the user has gone.
    });
    while let Some(m) = down_rx.recv().await {
        let r = match &m {
            Down::Stdout(b) => write_frame(&mut wr, b'o', b).await,
            Down::Stderr(b) => write_frame(&mut wr, b'E', b).await,
            Down::Exit(c) => write_frame(&mut wr, b'x', &c.to_be_bytes()).await,
            Down::Error(e) => write_frame(&mut wr, b'!', e.as_bytes()).await,
        };
        if r.is_err() {
            break;
        }
    }
    reader.abort();
    let _ = sess.await;
}

/// The local terminal in raw mode until dropped.
struct RawMode(Option<libc::termios>);

impl RawMode {
    fn on() -> Self {
        // SAFETY: termios calls on descriptor 0 with a zeroed struct they fill in.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut t) != 0 {
                return Self(None);
            }
            let saved = t;
            libc::cfmakeraw(&mut t);
            if libc::tcsetattr(0, libc::TCSANOW, &t) != 0 {
                return Self(None);
            }
            Self(Some(saved))
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            // SAFETY: restores the settings read in `on`.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) };
        }
    }
}

/// The local terminal's size (80×24 when it has none).
fn window_size() -> (u16, u16) {
    for fd in [0, 1, 2] {
        // SAFETY: TIOCGWINSZ fills a winsize.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 && ws.ws_row > 0 {
            return (ws.ws_col, ws.ws_row);
        }
    }
    (80, 24)
}

/// `shell <id> [--provider P] [-- CMD…]`: the exit code of the command, or 2 for a usage
/// error, 4 when the sandbox cannot be reached.
pub fn shell(id: &str, provider: ProviderKind, command: &[String], env_files: &[String]) -> u8 {
    let env = match crate::config::environment(Path::new(".env"), env_files) {
        Ok(e) => e,
        Err(e) => {
            errln!("error: {e}");
            return 2;
        }
    };
    if !valid_id(id) {
        errln!("error: `{id}` is not a sandbox id (letters, digits, `-` and `_`)");
        return 2;
    }
    let tty = command.is_empty();
    if tty && !std::io::stdin().is_terminal() {
        errln!(
            "error: standard input is not a terminal, so there is no terminal to open in {id}\n  \
             = help: run one command instead: scenario-run shell {id} --provider {} -- CMD",
            provider.name()
        );
        return 2;
    }
    let (cols, rows) = window_size();
    let open = Open { cmd: (!tty).then(|| command.join(" ")), tty, cols, rows };
    block_on(async move {
        let (up_tx, up_rx) = mpsc::channel::<Up>(64);
        let (down_tx, down_rx) = mpsc::channel::<Down>(64);
        if provider == ProviderKind::Local {
            let dir = factory::local_options(crate::provider::local::Isolation::Auto, &env).state_dir;
            let path = socket_path(&dir, id);
            let stream = match tokio::net::UnixStream::connect(&path).await {
                Ok(s) => s,
                Err(_) => {
                    errln!(
                        "error: no kept local sandbox {id}: a local sandbox lives only as long as the run that made \
                         it, and a run started with --keep-on-failure holds the sandboxes it kept until Ctrl-C; \
                         is that run still waiting?"
                    );
                    return 4;
                }
            };
            tokio::spawn(relay_socket(stream, open.clone(), up_rx, down_tx));
        } else {
            let p = match make_provider(provider, "auto", &env) {
                Ok(p) => p,
                Err(e) => {
                    errln!("error: {e}");
                    return 4;
                }
            };
            let missing = p.required_credentials();
            if !missing.is_empty() {
                errln!("error: missing credentials [{}]", missing.join(", "));
                return 4;
            }
            if let Err(e) = p.connect(id, None).await {
                errln!("error: cannot reach sandbox {id} on {}: {e}", p.name());
                return 4;
            }
            tokio::spawn(session(p, id.to_string(), open.clone(), up_rx, down_tx));
        }
        terminal(open.tty, up_tx, down_rx).await
    })
}

/// This process's side of a local session: `up` to the socket, the socket to `down`.
async fn relay_socket(
    stream: tokio::net::UnixStream,
    open: Open,
    mut up: mpsc::Receiver<Up>,
    down: mpsc::Sender<Down>,
) {
    let (mut rd, mut wr) = stream.into_split();
    let hello = serde_json::to_vec(&open).expect("serializable");
    if write_frame(&mut wr, b'h', &hello).await.is_err() {
        let _ = down.send(Down::Error("the run holding the sandbox closed the connection".into())).await;
        return;
    }
    let writer = tokio::spawn(async move {
        while let Some(m) = up.recv().await {
            let r = match m {
                Up::Input(d) => write_frame(&mut wr, b'i', &d).await,
                Up::Resize(c, r) => {
                    let mut p = c.to_be_bytes().to_vec();
                    p.extend_from_slice(&r.to_be_bytes());
                    write_frame(&mut wr, b'r', &p).await
                }
                Up::Eof => write_frame(&mut wr, b'e', &[]).await,
            };
            if r.is_err() {
                break;
            }
        }
    });
    loop {
        let m = match read_frame(&mut rd).await {
            Ok(Some((b'o', p))) => Down::Stdout(p),
            Ok(Some((b'E', p))) => Down::Stderr(p),
            Ok(Some((b'x', p))) if p.len() == 4 => Down::Exit(i32::from_be_bytes([p[0], p[1], p[2], p[3]])),
            Ok(Some((b'!', p))) => Down::Error(String::from_utf8_lossy(&p).into_owned()),
            Ok(Some(_)) => continue,
            _ => Down::Error("the run holding the sandbox ended the session (was it stopped?)".into()),
        };
        let last = matches!(m, Down::Exit(_) | Down::Error(_));
        if down.send(m).await.is_err() || last {
            break;
        }
    }
    writer.abort();
}

/// The user's terminal (or pipes): stdin to `up`, `down` to stdout and stderr; the exit code.
async fn terminal(tty: bool, up: mpsc::Sender<Up>, mut down: mpsc::Receiver<Down>) -> u8 {
    let raw = tty.then(RawMode::on);
    // Standard input: read by a thread of its own (a read on a terminal cannot be cancelled;
    // the process ends without waiting for it). A terminal's stdin is not read in command mode.
    let read_stdin = tty || !std::io::stdin().is_terminal();
    let input = up.clone();
    std::thread::spawn(move || {
        if read_stdin {
            let mut stdin = std::io::stdin().lock();
            let mut buf = [0u8; 8192];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if input.blocking_send(Up::Input(buf[..n].to_vec())).is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let _ = input.blocking_send(Up::Eof);
    });
    if tty {
        let resize = up.clone();
        tokio::spawn(async move {
            let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()) else {
                return;
            };
            while winch.recv().await.is_some() {
                let (c, r) = window_size();
                if resize.send(Up::Resize(c, r)).await.is_err() {
                    break;
                }
            }
        });
    }
    drop(up);
    let code = loop {
        match down.recv().await {
            Some(Down::Stdout(b)) => {
                let mut out = std::io::stdout().lock();
                if out.write_all(&b).and_then(|()| out.flush()).is_err() {
                    break 4;
                }
            }
            Some(Down::Stderr(b)) => {
                let _ = std::io::stderr().lock().write_all(&b);
            }
            Some(Down::Exit(c)) => break u8::try_from(c).unwrap_or(255),
            Some(Down::Error(e)) => {
                drop(raw);
                errln!("error: {e}");
                return 4;
            }
            None => {
                drop(raw);
                errln!("error: the session ended without an exit code");
                return 4;
            }
        }
    };
    drop(raw);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_names_not_paths() {
        assert!(valid_id("sbx-0a1b2c"));
        assert!(!valid_id("../x") && !valid_id("a/b") && !valid_id(""));
    }
}

//! `serve`: the E2B-compatible server over the local provider until SIGINT, SIGTERM, SIGHUP
//! or SIGQUIT, then every sandbox it made is destroyed. Here: the provider, the listener, the
//! signals and serve's certificate authority; the server itself is [`crate::server`].
//!
//! The server is a binary of its own, `scenario-run-serve`, installed beside `scenario-run`;
//! `scenario-run serve` becomes it ([`exec_serve`]). So the client binary holds none of the
//! server's code: what a client run keeps resident is mostly the code pages it touches, and
//! serve's two protocols had made those a third larger (BENCHMARKS.md, the clients row).

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use super::wiring::block_on;
use crate::exit::Exit;
use crate::provider::factory::{self, local_options, prepare};
use crate::provider::local::LocalProvider;
use crate::server::tls::{self, Ca, Certs};
use crate::server::ServeArgs;
use crate::{config, errln, outln};

/// The server binary's name; it is built and installed beside `scenario-run`.
pub const SERVE_BIN: &str = "scenario-run-serve";

/// `scenario-run serve FLAGS…`: this process becomes the server binary (same PID, environment
/// and standard streams; the flags are the server's to parse, `--help` too). It is looked for
/// beside this binary, then on PATH. Returns only when it cannot be started.
pub fn exec_serve(args: &[std::ffi::OsString]) -> Exit {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe().ok().map(|me| me.with_file_name(SERVE_BIN)).filter(|p| p.is_file());
    let bin = beside.unwrap_or_else(|| SERVE_BIN.into());
    let err = std::process::Command::new(&bin).args(args).exec();
    errln!(
        "error: serve: cannot start {}: {err} (it is built with scenario-run, `cargo build` or `cargo install`, and must be installed beside it or on PATH)",
        bin.display()
    );
    Exit::Infra
}

/// `serve`, until a signal; then every sandbox it made is destroyed.
pub fn serve(args: &ServeArgs) -> Exit {
    if args.fault.iter().any(|f| f == "list") {
        outln!("{}", crate::server::mutants::catalog_table().trim_end());
        return Exit::Ok;
    }
    let mut opts = match args.options() {
        Ok(o) => o,
        Err(e) => {
            errln!("error: {e}");
            return Exit::Usage;
        }
    };
    for w in args.key_warnings() {
        errln!("warning: {w}");
    }
    if !opts.mutants.is_empty() {
        // Said plainly: a serve with faults gives wrong answers on purpose.
        errln!("serve: platform faults on (--fault): {}", opts.mutants.names().join(", "));
    }
    let (listen, isolation) = (args.listen, args.isolation.as_str());
    let ca_dir_given = args.ca_dir.is_some();
    let ca_dir = args.ca_dir.clone().unwrap_or_else(tls::default_ca_dir);
    block_on(async move {
        let isolation = factory::isolation(isolation);
        let env = config::environment(Path::new(".env"), &[]).unwrap_or_default();
        opts.templates_dir = env.get(crate::templates::TEMPLATES_DIR_ENV).cloned().filter(|v| !v.is_empty());
        errln!("{}", templates_line(opts.templates_dir.as_deref()));
        let provider = match LocalProvider::new(local_options(isolation, &env)) {
            Ok(p) => p,
            Err(e) => {
                errln!("error: local provider: {e}");
                return Exit::Infra;
            }
        };
        if let Some(w) = provider.warning() {
            errln!("warning: {w}");
        }
        // Build `base` before listening, so no client's first create waits a minute on it.
        if let Err(e) = prepare(&provider, &CancellationToken::new(), true).await {
            errln!("error: {e}");
            return Exit::Infra;
        }
        let listener = match tokio::net::TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                errln!("error: cannot listen on {listen}: {e}");
                return Exit::Usage;
            }
        };
        let (Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut quit)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
            signal(SignalKind::quit()),
        ) else {
            errln!("error: cannot install signal handlers");
            return Exit::Infra;
        };
        let addr = listener.local_addr().unwrap_or(listen);
        opts.tls = match certificates(&ca_dir, ca_dir_given, addr) {
            Ok(certs) => certs,
            Err(exit) => return exit,
        };
        let _ = std::io::stdout().flush();
        let shutdown = async move {
            // A closed terminal (SIGHUP) or SIGQUIT stops serve as SIGTERM does: every sandbox
            // it made is destroyed.
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
                _ = hup.recv() => {}
                _ = quit.recv() => {}
            }
        };
        match crate::server::serve(listener, Arc::new(provider), opts, shutdown).await {
            Ok(n) => {
                errln!("serve: stopped; destroyed {n} sandbox{}", if n == 1 { "" } else { "es" });
                Exit::Ok
            }
            Err(e) => {
                errln!("error: serve: {e}");
                Exit::Infra
            }
        }
    })
}

/// What serve can build, said at start on stderr: the folder of template folders it uses
/// (`SCENARIO_RUN_TEMPLATES_DIR`, from the environment or `./.env`, else `templates/` nearest
/// above the working folder) and the templates in it with a Dockerfile.
fn templates_line(root: Option<&str>) -> String {
    let cwd = std::env::current_dir().unwrap_or_default();
    let dir = match root {
        Some(r) => std::path::PathBuf::from(r),
        None => cwd.ancestors().map(|d| d.join("templates")).find(|d| d.is_dir()).unwrap_or(cwd.join("templates")),
    };
    let whence = match root {
        Some(_) => format!("{} (from {})", dir.display(), crate::templates::TEMPLATES_DIR_ENV),
        None => dir.display().to_string(),
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return format!(
            "serve: no template folder at {whence}; creates can name `base` and templates built through the API (set {} to a folder of template folders)",
            crate::templates::TEMPLATES_DIR_ENV
        );
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().join("Dockerfile").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names.is_empty() {
        return format!("serve: templates from {whence}: none with a Dockerfile");
    }
    let (official, others): (Vec<&String>, Vec<&String>) =
        names.iter().partition(|n| crate::server::BUILT_OFFICIAL.contains(&n.as_str()));
    let list = |v: &[&String]| v.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
    let mut line = format!("serve: templates from {whence}: {}", names.join(", "));
    if !official.is_empty() {
        line.push_str(&format!("; built on the first create that names them: {}", list(&official)));
    }
    if !others.is_empty() {
        line.push_str(&format!("; the others through the template API (`e2b template build`): {}", list(&others)));
    }
    line
}

/// Serve's certificate authority in `ca_dir` (made on first use) and the certificates for
/// https on `addr`, said on stdout. Without them serve speaks http only, with a warning;
/// unless the directory was named (`--ca-dir`): then that directory or nothing.
fn certificates(ca_dir: &Path, given: bool, addr: SocketAddr) -> Result<Option<Arc<Certs>>, Exit> {
    let certs = Ca::load_or_create(ca_dir).and_then(|ca| Certs::new(ca, addr));
    let certs = match certs {
        Ok(c) => Some(Arc::new(c)),
        Err(e) if given => {
            errln!("error: serve's certificate authority in {}: {e}", ca_dir.display());
            return Err(Exit::Infra);
        }
        Err(e) => {
            errln!(
                "warning: no https (serve's certificate authority in {}: {e}); name another with --ca-dir",
                ca_dir.display()
            );
            None
        }
    };
    outln!("listening on http://{addr}");
    match &certs {
        Some(c) => {
            outln!(
                "https on the same port; ca certificate: {} ({}; trust it with SSL_CERT_FILE or REQUESTS_CA_BUNDLE (Python), NODE_EXTRA_CA_CERTS (Node))",
                c.ca_path().display(),
                if c.ca_created() { "made now" } else { "kept from before" }
            );
        }
        None => {
            outln!("no https");
        }
    }
    Ok(certs)
}

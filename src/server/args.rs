//! The command line of `scenario-run serve`: its flags live here, beside what they configure,
//! so `main.rs` only wires them to the local provider.

use std::sync::Arc;
use std::time::Duration;

use super::state::{Faults, Limits};

/// Where the key comes from when neither `--api-key-file` nor `--api-key` is given.
pub const API_KEY_VAR: &str = "E2B_API_KEY";

/// The shortest API key accepted: the key is the only credential of the control plane, and
/// serve may listen beyond loopback. E2B's keys are `e2b_` and 40 hex digits (44).
pub const MIN_API_KEY_LEN: usize = 32;

/// Options of [`super::serve`], which [`ServeArgs::options`] makes of the flags.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The API key clients must send.
    pub api_key: String,
    pub faults: Faults,
    /// Platform faults (`--fault`, see `mutants`); none by default.
    pub mutants: super::mutants::Mutants,
    pub limits: Limits,
    /// HTTPS beside plain HTTP on the port (see `tls`), with these certificates.
    pub tls: Option<Arc<super::tls::Certs>>,
    /// Whether a sandbox whose create does not say `network.allowPublicTraffic` gets E2B's
    /// default, public ports (`--allow-public-traffic`); otherwise its ports need its traffic
    /// token, as with `allowPublicTraffic: false`.
    pub public_traffic: bool,
    /// Where OpenSandbox's volumes may come from (`--host-volume-prefix`, `--volumes-dir`).
    pub volumes: super::opensandbox::VolumeConfig,
    /// `SCENARIO_RUN_TEMPLATES_DIR` as the run reads it (the environment, then `./.env`).
    pub templates_dir: Option<String>,
    /// `-v`: one line per request on stderr (see `access_log`).
    pub log_requests: bool,
}

/// Flags of `scenario-run serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default). Plain HTTP and HTTPS share it.
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: std::net::SocketAddr,
    /// Where serve's local certificate authority is kept (made on first use): ca.pem for
    /// clients to trust, ca-key.pem (0600). Default: $XDG_STATE_HOME/scenario-run/serve-ca,
    /// else ~/.local/state/scenario-run/serve-ca.
    #[arg(long, value_name = "DIR")]
    pub ca_dir: Option<std::path::PathBuf>,
    /// Sandboxes whose create does not say network.allowPublicTraffic get public ports, as
    /// on E2B (no traffic token needed); without it they need the token.
    #[arg(long)]
    pub allow_public_traffic: bool,
    /// OpenSandbox's host volumes may bind directories under DIR (repeatable); without it
    /// they are refused (400 VOLUME::HOST_PATH_NOT_ALLOWED).
    #[arg(long = "host-volume-prefix", value_name = "DIR")]
    pub host_volume_prefixes: Vec<std::path::PathBuf>,
    /// Where OpenSandbox's named (pvc) volumes live, one directory each, kept across runs.
    /// Default: $XDG_STATE_HOME/scenario-run/serve-volumes, else
    /// ~/.local/state/scenario-run/serve-volumes.
    #[arg(long, value_name = "DIR")]
    pub volumes_dir: Option<std::path::PathBuf>,
    /// The API key clients must send (X-API-KEY or Authorization: Bearer); at least 32
    /// characters, e.g. `e2b_` and 40 hex digits. Prefer --api-key-file or E2B_API_KEY: a
    /// flag's value is readable by every local user (/proc/<pid>/cmdline, ps).
    #[arg(long, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// A file holding the API key (its first line); it should be readable by its owner only
    /// (chmod 600). Without it and --api-key, the key is E2B_API_KEY's.
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Local provider isolation: auto (namespaces when the host allows), namespaces, none.
    #[arg(long, default_value = "auto", value_parser = ["auto", "namespaces", "none"], env = "SCENARIO_RUN_ISOLATION")]
    pub isolation: String,
    /// Most sandboxes alive at once; a create past it answers 429.
    #[arg(long, default_value_t = Limits::default().max_sandboxes, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_sandboxes: u32,
    /// Most bytes one /files upload may write (after decompression); 413 past it.
    #[arg(long, default_value = "1GiB", value_name = "SIZE", value_parser = parse_size)]
    pub max_upload: u64,
    /// Most a gzip upload may inflate, as a multiple of its compressed size (past its
    /// first MiB); 413 past it.
    #[arg(long, default_value_t = Limits::default().max_inflate_ratio, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_inflate_ratio: u64,
    /// The memory promised to live sandboxes (each its declared memoryMB, 512 MiB if none),
    /// as a multiple of the host's; a create past it, or whose share (its memory over this
    /// ratio) the host does not have available now, answers 429.
    #[arg(long, default_value_t = Limits::default().memory_overcommit, value_name = "RATIO", value_parser = parse_ratio)]
    pub memory_overcommit: f64,
    /// Fault injection: delay every request by this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub fault_latency: Option<u64>,
    /// Fault injection: answer every Nth request 429 (with Retry-After: 1).
    #[arg(long, value_name = "N")]
    pub fault_429_every: Option<u64>,
    /// Fault injection: answer every Nth request 503.
    #[arg(long, value_name = "N")]
    pub fault_5xx_every: Option<u64>,
    /// Fault injection: abort streamed responses (process output, downloads) after BYTES.
    #[arg(long, value_name = "BYTES")]
    pub fault_cut_stream_after: Option<u64>,
    /// Fault injection: 429/503 faults hit control-plane requests only, not envd.
    #[arg(long)]
    pub fault_control_plane_only: bool,
    /// Platform faults to inject (issue 40), comma-separated or repeated: wrong answers a
    /// suite must catch, for mutation testing (`scripts/mutation`). `--fault list` prints the
    /// catalog. Host-side only: no client can turn one on.
    #[arg(long = "fault", value_name = "NAME[,NAME]")]
    pub fault: Vec<String>,
    /// Log each request on stderr: method, path (keys and tokens masked), status, time and
    /// the sandbox it was for.
    #[arg(short, long)]
    pub verbose: bool,
}

/// A `--memory-overcommit` that is not a number of at least 0.1.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a ratio of at least 0.1 (2 promises twice the host's memory), got {0:?}")]
pub struct RatioError(String);

fn parse_ratio(s: &str) -> Result<f64, RatioError> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 0.1 => Ok(r),
        _ => Err(RatioError(s.to_string())),
    }
}

fn parse_size(s: &str) -> Result<u64, crate::size::ParseSizeError> {
    crate::size::parse(s).map(|n| n as u64)
}

/// Flags that parse one by one but make no server together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServeArgsError {
    #[error(
        "serve needs an API key: --api-key-file PATH (a file readable by you only), or E2B_API_KEY in its environment"
    )]
    NoApiKey,
    #[error("the API key (--api-key-file, E2B_API_KEY or --api-key) must not be empty")]
    EmptyApiKey,
    #[error(
        "the API key (--api-key-file, E2B_API_KEY or --api-key) is {chars} characters; use at least {min}, e.g. `e2b_` and 40 hex digits",
        min = MIN_API_KEY_LEN
    )]
    ShortApiKey { chars: usize },
    /// The key file cannot be read; `why` is the system's reason (the path is the user's own).
    #[error("cannot read the API key from --api-key-file {path}: {why}")]
    KeyFile { path: String, why: String },
    #[error(transparent)]
    UnknownFault(#[from] super::mutants::UnknownFault),
}

impl ServeArgs {
    /// The API key: `--api-key-file`'s first line, else `--api-key`, else `env` (E2B_API_KEY).
    fn api_key_from(&self, env: Option<String>) -> Result<String, ServeArgsError> {
        let key = match (&self.api_key_file, &self.api_key) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| ServeArgsError::KeyFile { path: path.display().to_string(), why: e.to_string() })?;
                text.lines().next().unwrap_or("").to_string()
            }
            (None, Some(k)) => k.clone(),
            (None, None) => env.ok_or(ServeArgsError::NoApiKey)?,
        };
        let key = key.trim();
        if key.is_empty() {
            return Err(ServeArgsError::EmptyApiKey);
        }
        if key.chars().count() < MIN_API_KEY_LEN {
            return Err(ServeArgsError::ShortApiKey { chars: key.chars().count() });
        }
        Ok(key.to_string())
    }

    /// What serve says on stderr about how it was given its key: a key on the command line
    /// is readable by every local user, and so is a key file that group or others may read.
    pub fn key_warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.api_key.is_some() {
            w.push(
                "--api-key puts the key where every local user can read it (/proc/<pid>/cmdline, ps): use --api-key-file PATH or E2B_API_KEY"
                    .to_string(),
            );
        }
        if let Some(path) = &self.api_key_file {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(m) = std::fs::metadata(path) {
                let mode = m.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    w.push(format!(
                        "the API key file {} is readable beyond its owner (mode {mode:03o}): chmod 600 it",
                        path.display()
                    ));
                }
            }
        }
        w
    }

    /// The server's options, or what is wrong with the flags.
    pub fn options(&self) -> Result<ServeOptions, ServeArgsError> {
        let key = self.api_key_from(std::env::var(API_KEY_VAR).ok())?;
        Ok(ServeOptions {
            api_key: key,
            faults: Faults {
                latency: self.fault_latency.map(Duration::from_millis),
                every_429: self.fault_429_every,
                every_5xx: self.fault_5xx_every,
                cut_stream_after: self.fault_cut_stream_after,
                control_plane_only: self.fault_control_plane_only,
            },
            limits: Limits {
                max_sandboxes: self.max_sandboxes,
                max_upload: self.max_upload,
                max_inflate_ratio: self.max_inflate_ratio,
                memory_overcommit: self.memory_overcommit,
            },
            mutants: super::mutants::Mutants::parse(&self.fault)?,
            tls: None,
            templates_dir: None,
            log_requests: self.verbose,
            public_traffic: self.allow_public_traffic,
            volumes: super::opensandbox::VolumeConfig {
                host_prefixes: self.host_volume_prefixes.clone(),
                dir: self.volumes_dir.clone().unwrap_or_else(super::opensandbox::VolumeConfig::default_dir),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    /// The options, or the message: a flag clap refuses or a key `options` refuses.
    fn parse(args: &[&str]) -> Result<ServeOptions, String> {
        let cli =
            Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).map_err(|e| e.to_string())?;
        cli.serve.options().map_err(|e| e.to_string())
    }

    fn cli(args: &[&str]) -> ServeArgs {
        Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied())).unwrap().serve
    }

    /// Issue 35 item 8: the key comes from a file (its first line, trimmed) or the
    /// environment, and a flag still works with a warning.
    #[test]
    fn the_key_comes_from_a_file_or_the_environment() {
        use std::os::unix::fs::PermissionsExt;
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, format!("  {key}\nsecond line\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = file.to_str().unwrap();
        let a = cli(&["--api-key-file", f]);
        assert_eq!(a.api_key_from(Some("e2b_other_other_other_other_other_other".into())).unwrap(), key);
        assert!(a.key_warnings().is_empty(), "{:?}", a.key_warnings());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let w = a.key_warnings();
        assert!(w.len() == 1 && w[0].contains("(mode 644): chmod 600"), "{w:?}");
        let none = cli(&[]);
        assert_eq!(none.api_key_from(Some(key.into())).unwrap(), key);
        assert!(none.key_warnings().is_empty());
        assert_eq!(none.api_key_from(None).unwrap_err(), ServeArgsError::NoApiKey);
        let flag = cli(&["--api-key", key]);
        assert_eq!(flag.api_key_from(None).unwrap(), key);
        assert!(flag.key_warnings()[0].contains("every local user can read it"), "{:?}", flag.key_warnings());
        let e = cli(&["--api-key-file", "/no/such/key"]).api_key_from(None).unwrap_err();
        assert!(e.to_string().starts_with("cannot read the API key from --api-key-file /no/such/key: "), "{e}");
        std::fs::write(&file, "short\n").unwrap();
        assert_eq!(a.api_key_from(None).unwrap_err(), ServeArgsError::ShortApiKey { chars: 5 });
        assert!(Cli::try_parse_from(["serve", "--api-key", key, "--api-key-file", f]).is_err(), "one or the other");
    }

    /// Issue 28 item 4: the key's refusals are kinds, with the text they had; a bad ratio or
    /// size still reaches the user through clap with its own message.
    #[test]
    fn refusals_have_kinds() {
        assert_eq!(cli(&["--api-key", " "]).options().unwrap_err(), ServeArgsError::EmptyApiKey);
        let e = cli(&["--api-key", "e2b_short"]).options().unwrap_err();
        assert_eq!(e, ServeArgsError::ShortApiKey { chars: 9 });
        assert_eq!(
            e.to_string(),
            "the API key (--api-key-file, E2B_API_KEY or --api-key) is 9 characters; use at least 32, e.g. `e2b_` and 40 hex digits"
        );
        assert_eq!(
            parse_ratio("0.05").unwrap_err().to_string(),
            "expected a ratio of at least 0.1 (2 promises twice the host's memory), got \"0.05\""
        );
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let e = parse(&["--api-key", key, "--max-upload", "1 parsec"]).unwrap_err();
        assert!(e.contains("invalid size `1 parsec`: unknown unit `parsec`"), "{e}");
        let e = parse(&["--api-key", key, "--memory-overcommit", "0"]).unwrap_err();
        assert!(e.contains("expected a ratio of at least 0.1"), "{e}");
    }

    #[test]
    fn short_keys_are_refused() {
        let e = parse(&["--api-key", "e2b_short"]).unwrap_err();
        assert!(e.contains("is 9 characters") && e.contains("at least 32"), "{e}");
        assert!(parse(&["--api-key", "   "]).unwrap_err().contains("must not be empty"));
        let ok = parse(&["--api-key", "e2b_0123456789abcdef0123456789abcdef01234567"]).unwrap();
        assert_eq!(ok.limits.max_sandboxes, 256);
        assert_eq!(ok.limits.max_upload, 1 << 30);
    }

    #[test]
    fn limits_parse() {
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let o = parse(&["--api-key", key, "--max-sandboxes", "3", "--max-upload", "10MiB", "--max-inflate-ratio", "7"])
            .unwrap();
        assert_eq!((o.limits.max_sandboxes, o.limits.max_upload, o.limits.max_inflate_ratio), (3, 10 << 20, 7));
        assert!(parse(&["--api-key", key, "--max-sandboxes", "0"]).is_err());
    }
}

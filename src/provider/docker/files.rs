//! Files of a container.
//!
//! Reads and writes go through the engine's archive API: `HEAD /containers/{id}/archive`
//! stats a path, `GET` returns it as a tar stream, `PUT` extracts a tar into the container.
//! The engine resolves paths and extracts *inside the container's root* (symlinks included),
//! so a symlink planted in the sandbox cannot redirect a write onto the host. A write is a tar
//! holding one regular file at its full path: the engine creates missing parent directories
//! (0755, root), and `noOverwriteDirNonDir` keeps it from replacing a directory with the file.
//! Before writing, the path is stat'ed: a directory is refused ("is a directory", as on local),
//! a final symlink is followed (the engine reports where it fully resolves), and the mode of an
//! existing file is kept unless a mode is given. Files are written as uid/gid 0.
//!
//! Listing, mkdir, rename and remove have no archive-API form; they run a short `/bin/sh`
//! script (POSIX sh, `stat -c`, `mkdir -p`, `mv`, `rm -rf`: present in Debian and busybox
//! images) that reports failures as `ERRNO path` on stderr with exit 3, which map to the same
//! kinds and messages as the local provider's. Names containing a newline are not listed.

use std::io::Read;

use bollard::body_full;
use bollard::container::PathStatResponse;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{ContainerArchiveInfoOptions, DownloadFromContainerOptions, UploadToContainerOptions};
use bollard::Docker;
use futures_util::StreamExt;

use super::exec::{run_helper_as, ProcTable, DEFAULT_USER};
use crate::provider::{file_too_large, not_regular, ErrorKind, FileEntry, ProviderError, Result, MAX_FILE_READ};

/// Go's `os.FileMode` bits in the engine's stat header.
const GO_DIR: u32 = 1 << 31;
const GO_SYMLINK: u32 = 1 << 27;
const GO_SETUID: u32 = 1 << 23;
const GO_SETGID: u32 = 1 << 22;
const GO_STICKY: u32 = 1 << 20;
const GO_DEVICE: u32 = 1 << 26;
const GO_NAMED_PIPE: u32 = 1 << 25;
const GO_SOCKET: u32 = 1 << 24;
const GO_CHAR_DEVICE: u32 = 1 << 21;
const GO_IRREGULAR: u32 = 1 << 19;

/// Absolute, `.`/`..`-free sandbox paths: one rule for every provider.
pub(crate) use crate::provider::normalize_path as normalize;

fn name_of(abs: &str) -> String {
    if abs == "/" {
        "/".into()
    } else {
        abs.rsplit('/').next().unwrap_or(abs).to_string()
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Maps an archive-API error on `abs`.
fn path_err(e: DockerError, abs: &str) -> ProviderError {
    match &e {
        DockerError::DockerResponseServerError { status_code: 404, .. } => {
            ProviderError::not_found(format!("no such file or directory: {abs}"))
        }
        DockerError::DockerResponseServerError { status_code, message } => {
            let m = message.trim().to_lowercase();
            if m.contains("not a directory") {
                ProviderError::invalid(format!("not a directory: {abs}"))
            } else if *status_code < 500 || m.contains("file exists") || m.contains("cannot overwrite") {
                ProviderError::invalid(format!("{m}: {abs}"))
            } else {
                ProviderError::infra(format!("file operation on {abs} failed: {m}"))
            }
        }
        _ => ProviderError::infra(format!("file operation on {abs} failed: {e}")),
    }
}

async fn stat_raw(docker: &Docker, container: &str, abs: &str) -> Result<PathStatResponse> {
    let opts = ContainerArchiveInfoOptions { path: abs.to_string() };
    docker.get_container_archive_info(container, Some(opts)).await.map_err(|e| path_err(e, abs))
}

fn entry_from(abs: &str, st: &PathStatResponse) -> FileEntry {
    let fm = st.file_mode;
    let kind = if fm & GO_DIR != 0 {
        "dir"
    } else if fm & GO_SYMLINK != 0 {
        "symlink"
    } else {
        "file"
    };
    let mut mode = fm & 0o777;
    for (go, unix) in [(GO_SETUID, 0o4000), (GO_SETGID, 0o2000), (GO_STICKY, 0o1000)] {
        if fm & go != 0 {
            mode |= unix;
        }
    }
    FileEntry {
        name: name_of(abs),
        path: abs.to_string(),
        kind: kind.into(),
        size: st.size.max(0) as u64,
        mode,
        modified: st.modification_time.as_deref().and_then(parse_rfc3339).unwrap_or(0),
    }
}

/// Unix seconds of an RFC 3339 time as Go prints it (`2026-12-02T17:42:11.5+01:00`).
fn parse_rfc3339(s: &str) -> Option<u64> {
    let ts: jiff::Timestamp = s.trim().parse().ok()?;
    u64::try_from(ts.as_second()).ok()
}

pub(crate) async fn stat(docker: &Docker, container: &str, abs: &str) -> Result<FileEntry> {
    Ok(entry_from(abs, &stat_raw(docker, container, abs).await?))
}

pub(crate) async fn exists(docker: &Docker, container: &str, abs: &str) -> Result<bool> {
    match stat_raw(docker, container, abs).await {
        Ok(_) => Ok(true),
        Err(e) if e.kind == ErrorKind::NotFound || e.message.starts_with("not a directory") => Ok(false),
        Err(e) => Err(e),
    }
}

/// Follows a final symlink: the path to operate on and its stat (None if it does not exist).
async fn resolve(docker: &Docker, container: &str, abs: &str) -> Result<(String, Option<PathStatResponse>)> {
    let mut target = abs.to_string();
    for _ in 0..8 {
        match stat_raw(docker, container, &target).await {
            Ok(st) if st.file_mode & GO_DIR != 0 => {
                return Err(ProviderError::invalid(format!("is a directory: {abs}")));
            }
            Ok(st) if st.file_mode & GO_SYMLINK != 0 && !st.link_target.is_empty() && st.link_target != target => {
                target = normalize(&st.link_target)?;
            }
            Ok(st) => return Ok((target, Some(st))),
            Err(e) if e.kind == ErrorKind::NotFound => return Ok((target, None)),
            Err(e) => return Err(e),
        }
    }
    Err(ProviderError::invalid(format!("too many levels of symbolic links: {abs}")))
}

/// Extracts one regular file at `abs` (parents are created by the engine).
pub(crate) async fn put_file(docker: &Docker, container: &str, abs: &str, data: &[u8], mode: u32) -> Result<()> {
    put_file_owned(docker, container, abs, data, mode, 0).await
}

/// [`put_file`] owned by uid and gid `owner`.
async fn put_file_owned(docker: &Docker, container: &str, abs: &str, data: &[u8], mode: u32, owner: u64) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(mode & 0o7777);
    header.set_mtime(now_secs());
    header.set_uid(owner);
    header.set_gid(owner);
    let mut b = tar::Builder::new(Vec::with_capacity(data.len() + 2048));
    b.append_data(&mut header, abs.trim_start_matches('/'), data)
        .map_err(|e| ProviderError::invalid(format!("cannot write {abs}: {e}")))?;
    let tarball = b.into_inner().map_err(|e| ProviderError::infra(format!("cannot write {abs}: {e}")))?;
    let opts = UploadToContainerOptions {
        path: "/".into(),
        no_overwrite_dir_non_dir: Some("true".into()),
        ..Default::default()
    };
    docker.upload_to_container(container, Some(opts), body_full(tarball.into())).await.map_err(|e| path_err(e, abs))
}

/// As the sandbox user (uid 1000): the parents it lacks are made by it, a directory or file
/// it may not write is refused, and the file is its own, as on E2B and on local.
const WRITABLE: &str = r#"
err=$(mkdir -p -- "$1" 2>&1) || { case $err in *ermission*) echo "EACCES $1";; *) echo "ENOTDIR $1";; esac >&2; exit 3; }
test -w "$1" || { echo "EACCES $2" >&2; exit 3; }
test ! -e "$2" || test -w "$2" || { echo "EACCES $2" >&2; exit 3; }
"#;

/// The sandbox user's uid and gid.
const USER_ID: u64 = 1000;

pub(crate) async fn write(procs: &ProcTable, abs: &str, data: Vec<u8>, mode: Option<u32>) -> Result<FileEntry> {
    if abs == "/" {
        return Err(ProviderError::invalid("is a directory: /"));
    }
    let (docker, container) = (procs.docker(), procs.container());
    let (target, existing) = resolve(docker, container, abs).await?;
    let parent = target.rsplit_once('/').map(|(p, _)| if p.is_empty() { "/" } else { p }).unwrap_or("/");
    script(procs, WRITABLE, &[parent, &target]).await?;
    let mode = mode.or_else(|| existing.map(|st| entry_from(&target, &st).mode)).unwrap_or(0o644);
    put_file_owned(docker, container, &target, &data, mode, USER_ID).await?;
    stat(docker, container, abs).await
}

/// Why a file of Go file mode `fm` and `size` (the engine's stat) cannot be read, if it
/// cannot: only regular files are, up to [`MAX_FILE_READ`].
fn unreadable(fm: u32, size: i64, abs: &str) -> Option<ProviderError> {
    let what = if fm & GO_DIR != 0 {
        return Some(ProviderError::invalid(format!("is a directory: {abs}")));
    } else if fm & GO_NAMED_PIPE != 0 {
        "a FIFO"
    } else if fm & GO_CHAR_DEVICE != 0 {
        "a character device"
    } else if fm & GO_DEVICE != 0 {
        "a block device"
    } else if fm & GO_SOCKET != 0 {
        "a socket"
    } else if fm & (GO_SYMLINK | GO_IRREGULAR) != 0 {
        "an unknown kind of file"
    } else if size.max(0) as u64 > MAX_FILE_READ {
        return Some(file_too_large(abs));
    } else {
        return None;
    };
    Some(not_regular(what, abs))
}

/// The content of the one regular file in the engine's `tarball` of `abs`.
fn file_of_tarball(tarball: &[u8], abs: &str) -> Result<Vec<u8>> {
    let mut archive = tar::Archive::new(tarball);
    let bad = |e: std::io::Error| ProviderError::infra(format!("cannot read {abs}: bad archive from the engine: {e}"));
    let mut entries = archive.entries().map_err(bad)?;
    let mut entry = entries
        .next()
        .ok_or_else(|| ProviderError::not_found(format!("no such file or directory: {abs}")))?
        .map_err(bad)?;
    let what = match entry.header().entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => None,
        tar::EntryType::Directory => return Err(ProviderError::invalid(format!("is a directory: {abs}"))),
        tar::EntryType::Fifo => Some("a FIFO"),
        tar::EntryType::Char => Some("a character device"),
        tar::EntryType::Block => Some("a block device"),
        _ => Some("an unknown kind of file"),
    };
    if let Some(what) = what {
        return Err(not_regular(what, abs));
    }
    if entry.size() > MAX_FILE_READ {
        return Err(file_too_large(abs));
    }
    let mut data = Vec::with_capacity(entry.size() as usize);
    entry.read_to_end(&mut data).map_err(bad)?;
    Ok(data)
}

/// The content of regular file `abs` (a final link followed), up to [`MAX_FILE_READ`]: what
/// is not a regular file is refused by the engine's stat before anything is downloaded, and
/// the download stops once it holds more than the limit could need.
pub(crate) async fn read(docker: &Docker, container: &str, abs: &str) -> Result<Vec<u8>> {
    let (target, existing) = resolve(docker, container, abs).await?;
    let Some(st) = existing else {
        return Err(ProviderError::not_found(format!("no such file or directory: {abs}")));
    };
    if let Some(e) = unreadable(st.file_mode, st.size, abs) {
        return Err(e);
    }
    let opts = DownloadFromContainerOptions { path: target.clone() };
    let mut stream = docker.download_from_container(container, Some(opts));
    let mut tarball = Vec::new();
    // The file, its headers (a long name's too) and the archive's end.
    let most = MAX_FILE_READ + (1 << 20);
    while let Some(chunk) = stream.next().await {
        tarball.extend_from_slice(&chunk.map_err(|e| path_err(e, abs))?);
        if tarball.len() as u64 > most {
            return Err(file_too_large(abs));
        }
    }
    file_of_tarball(&tarball, abs)
}

/// Runs a file script; exit 3 with `ERRNO path` on stderr is a typed failure.
async fn script(procs: &ProcTable, body: &str, args: &[&str]) -> Result<Vec<u8>> {
    let mut argv = vec!["/bin/sh", "-c", body, "sh"];
    argv.extend_from_slice(args);
    procs.ensure_user(DEFAULT_USER).await?;
    let (code, out, err) = run_helper_as(procs.docker(), procs.container(), &argv, DEFAULT_USER).await?;
    if code == 0 {
        return Ok(out);
    }
    let err = String::from_utf8_lossy(&err).trim().to_string();
    let (errno, path) = err.split_once(' ').unwrap_or((&err, args.first().copied().unwrap_or("")));
    Err(match (code, errno) {
        (3, "ENOENT") => ProviderError::not_found(format!("no such file or directory: {path}")),
        (3, "ENOTDIR") => ProviderError::invalid(format!("not a directory: {path}")),
        (3, "EISDIR") => ProviderError::invalid(format!("is a directory: {path}")),
        (3, "EEXIST") => ProviderError::invalid(format!("file exists: {path}")),
        (3, "ENOTEMPTY") => ProviderError::invalid(format!("directory not empty: {path}")),
        (3, "EACCES") => ProviderError::invalid(format!("permission denied: {path}")),
        _ => ProviderError::invalid(format!("file operation failed (exit {code}): {}", err.to_lowercase())),
    })
}

const LIST: &str = r#"
if [ ! -e "$1" ]; then echo "ENOENT $1" >&2; exit 3; fi
if [ ! -d "$1" ]; then echo "ENOTDIR $1" >&2; exit 3; fi
cd -- "$1" || { echo "EACCES $1" >&2; exit 3; }
for f in * .[!.]* ..?*; do
  if [ -e "$f" ] || [ -L "$f" ]; then stat -c '%f %s %Y %n' -- "$f" 2>/dev/null || true; fi
done
"#;

pub(crate) async fn list(procs: &ProcTable, abs: &str) -> Result<Vec<FileEntry>> {
    let out = script(procs, LIST, &[abs]).await?;
    let mut entries: Vec<FileEntry> = String::from_utf8_lossy(&out)
        .lines()
        .filter_map(|line| {
            let mut it = line.splitn(4, ' ');
            let raw = u32::from_str_radix(it.next()?, 16).ok()?;
            let size: u64 = it.next()?.parse().ok()?;
            let modified: u64 = it.next()?.parse().ok()?;
            let name = it.next()?.to_string();
            let kind = match raw & 0o170000 {
                0o040000 => "dir",
                0o120000 => "symlink",
                _ => "file",
            };
            let path = if abs == "/" { format!("/{name}") } else { format!("{abs}/{name}") };
            Some(FileEntry { name, path, kind: kind.into(), size, mode: raw & 0o7777, modified })
        })
        .collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

const MKDIR: &str = r#"
if [ -e "$1" ] && [ ! -d "$1" ]; then echo "EEXIST $1" >&2; exit 3; fi
err=$(mkdir -p -- "$1" 2>&1) || { case $err in *ermission*) echo "EACCES $1";; *) echo "ENOTDIR $1";; esac >&2; exit 3; }
"#;

pub(crate) async fn make_dir(procs: &ProcTable, abs: &str) -> Result<FileEntry> {
    script(procs, MKDIR, &[abs]).await?;
    stat(procs.docker(), procs.container(), abs).await
}

/// rename(2) semantics: a directory replaces only an empty directory, a file never replaces
/// a directory, and nothing is moved *into* an existing directory.
const RENAME: &str = r#"
if [ ! -e "$1" ] && [ ! -L "$1" ]; then echo "ENOENT $1" >&2; exit 3; fi
if [ -d "$2" ] && [ ! -L "$2" ]; then
  if [ ! -d "$1" ] || [ -L "$1" ]; then echo "EISDIR $2" >&2; exit 3; fi
  rmdir -- "$2" 2>/dev/null || { echo "ENOTEMPTY $2" >&2; exit 3; }
elif [ -e "$2" ] && [ -d "$1" ] && [ ! -L "$1" ]; then echo "ENOTDIR $2" >&2; exit 3; fi
mv -f -- "$1" "$2" 2>/dev/null || { echo "ENOENT $2" >&2; exit 3; }
"#;

pub(crate) async fn rename(procs: &ProcTable, from: &str, to: &str) -> Result<FileEntry> {
    if from == "/" || to == "/" {
        return Err(ProviderError::invalid("cannot rename /"));
    }
    script(procs, RENAME, &[from, to]).await?;
    stat(procs.docker(), procs.container(), to).await
}

const REMOVE: &str = r#"
if [ ! -e "$1" ] && [ ! -L "$1" ]; then echo "ENOENT $1" >&2; exit 3; fi
rm -rf -- "$1" 2>/dev/null || { echo "EACCES $1" >&2; exit 3; }
"#;

pub(crate) async fn remove(procs: &ProcTable, abs: &str) -> Result<()> {
    if abs == "/" {
        return Err(ProviderError::invalid("cannot remove /"));
    }
    script(procs, REMOVE, &[abs]).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 23, item 10: a FIFO, a device or a file past the limit is refused by the
    /// engine's stat, before any download; the archive's entry is held to the same rule.
    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let msg = |fm: u32, size: i64| unreadable(fm, size, "/x").map(|e| e.message);
        assert_eq!(msg(0o644, 10), None);
        assert_eq!(msg(GO_NAMED_PIPE | 0o644, 0).as_deref(), Some("is a FIFO, not a regular file: /x"));
        assert_eq!(
            msg(GO_DEVICE | GO_CHAR_DEVICE | 0o666, 0).as_deref(),
            Some("is a character device, not a regular file: /x")
        );
        assert_eq!(msg(GO_DEVICE | 0o660, 0).as_deref(), Some("is a block device, not a regular file: /x"));
        assert_eq!(msg(GO_SOCKET | 0o777, 0).as_deref(), Some("is a socket, not a regular file: /x"));
        assert!(msg(0o644, MAX_FILE_READ as i64 + 1).unwrap().starts_with("is larger than 1 GiB"));
        let tarball = |kind: tar::EntryType, data: &[u8]| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, "x", data).unwrap();
            b.into_inner().unwrap()
        };
        assert_eq!(file_of_tarball(&tarball(tar::EntryType::Regular, b"hi"), "/x").unwrap(), b"hi");
        let e = file_of_tarball(&tarball(tar::EntryType::Fifo, b""), "/x").unwrap_err();
        assert_eq!(e.message, "is a FIFO, not a regular file: /x");
        let e = file_of_tarball(&tarball(tar::EntryType::Char, b""), "/x").unwrap_err();
        assert_eq!(e.message, "is a character device, not a regular file: /x");
    }

    #[test]
    fn rfc3339_times() {
        for (text, secs) in [
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2026-12-02T17:42:11.123456789Z", Some(1796233331)),
            ("2026-12-02T18:42:11+01:00", Some(1796233331)),
            ("garbage", None),
        ] {
            assert_eq!(parse_rfc3339(text), secs, "{text}");
        }
    }

    #[test]
    fn go_file_modes() {
        let st = |file_mode| PathStatResponse {
            name: "x".into(),
            size: 3,
            file_mode,
            modification_time: None,
            link_target: String::new(),
        };
        let e = entry_from("/a/x", &st(GO_DIR | GO_STICKY | 0o777));
        assert_eq!((e.kind.as_str(), e.mode, e.name.as_str()), ("dir", 0o1777, "x"));
        assert_eq!(entry_from("/x", &st(GO_SYMLINK | 0o777)).kind, "symlink");
        assert_eq!(entry_from("/x", &st(GO_SETUID | 0o755)).mode, 0o4755);
    }
}

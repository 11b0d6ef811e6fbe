//! Importing an unpacked image into a Docker engine, so `FROM <offline name>` builds there.
//!
//! Docker Hub is unreachable, so a template that says `FROM python:3.11-slim-bookworm` would
//! fail on the docker provider. The offline image the local provider uses is the answer on
//! docker too: its tree is streamed as a tar with the ids shifted back to the image's own
//! (the engine must see root as 0, and `user` as 1000) to the engine's image import API
//! (`POST /images/create?fromSrc=-`, what `docker import` calls), with the image config as
//! `--change` instructions (ENV, WORKDIR, USER, EXPOSE, ENTRYPOINT, CMD). It is imported
//! once per digest (`scenario-run/offline-<recipe>:<digest12>`, labelled with the digest)
//! and tagged with the public name the Dockerfile uses, so the classic builder finds it
//! locally and never tries the Hub.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use bollard::query_parameters::{CreateImageOptionsBuilder, TagImageOptionsBuilder};
use bollard::Docker;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use super::error::{ImageError, Result};
use super::idmap::IdMap;
use super::Rootfs;

/// The label that records which image digest an imported image is.
pub const LABEL_DIGEST: &str = "scenario-run.image-digest";

/// A `Write` that sends 256 KiB chunks down a channel (the engine request's body).
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= 256 << 10 {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.buf.is_empty() {
            let chunk = Bytes::from(std::mem::take(&mut self.buf));
            self.tx.blocking_send(Ok(chunk)).map_err(|_| io::Error::other("the engine stopped reading"))?;
        }
        Ok(())
    }
}

/// Writes the tree at `root` as a tar with owners shifted back by `ids` (blocking).
/// Symlinks are stored as links, never followed; hard links stay hard links.
pub(crate) fn write_tar<W: Write>(root: &Path, ids: IdMap, out: W) -> io::Result<W> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    let mut seen: HashMap<(u64, u64), std::path::PathBuf> = HashMap::new();
    let mut stack = vec![std::path::PathBuf::new()];
    let unshift = |id: u32| ids.to_image(id).unwrap_or(0);
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<_> = std::fs::read_dir(&dir)?.collect::<io::Result<Vec<_>>>()?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let path = rel.join(e.file_name());
            let full = root.join(&path);
            let md = std::fs::symlink_metadata(&full)?;
            let mut h = tar::Header::new_gnu();
            h.set_metadata_in_mode(&md, tar::HeaderMode::Complete);
            h.set_uid(u64::from(unshift(md.uid())));
            h.set_gid(u64::from(unshift(md.gid())));
            let ft = md.file_type();
            if ft.is_dir() {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                b.append_data(&mut h, &path, io::empty())?;
                stack.push(path);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&full)?;
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                b.append_link(&mut h, &path, &target)?;
            } else if ft.is_file() {
                if md.nlink() > 1 {
                    if let Some(first) = seen.get(&(md.dev(), md.ino())) {
                        h.set_entry_type(tar::EntryType::Link);
                        h.set_size(0);
                        b.append_link(&mut h, &path, first)?;
                        continue;
                    }
                    seen.insert((md.dev(), md.ino()), path.clone());
                }
                let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&full)?;
                b.append_data(&mut h, &path, f)?;
            } else if ft.is_fifo() {
                // Kept as in the image; sockets and devices are not part of images.
                h.set_entry_type(tar::EntryType::Fifo);
                h.set_size(0);
                b.append_data(&mut h, &path, io::empty())?;
            }
        }
    }
    b.into_inner()
}

/// The repository and tag of `name` (`python:3.11` -> `python`, `3.11`).
fn repo_tag(name: &str) -> (String, String) {
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, t)) => (name[..name.len() - t.len() - 1].to_string(), t.to_string()),
        None => (name.to_string(), "latest".to_string()),
    }
}

fn api_err(e: bollard::errors::Error, what: &str) -> ImageError {
    ImageError::infra(format!("{what}: {e}"))
}

/// Imports `rootfs` into the engine as `tag` (ids shifted back by `ids`), with its config.
pub async fn import(docker: &Docker, rootfs: &Rootfs, ids: IdMap, tag: &str) -> Result<()> {
    let (repo, t) = repo_tag(tag);
    let mut changes = rootfs.config.docker_changes();
    changes.push(format!("LABEL {LABEL_DIGEST}={}", rootfs.digest));
    let opts = CreateImageOptionsBuilder::default().from_src("-").repo(&repo).tag(&t).changes(changes).build();
    let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(8);
    let dir = rootfs.dir.clone();
    let writer = tokio::task::spawn_blocking(move || {
        let w = ChannelWriter { tx: tx.clone(), buf: Vec::new() };
        match write_tar(&dir, ids, w).and_then(|mut w| w.flush()) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = tx.blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
                Err(e)
            }
        }
    });
    let body = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let mut stream = docker.create_image(Some(opts), Some(bollard::body_try_stream(body)), None);
    let mut failure = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(info) => {
                if let Some(d) = info.error_detail {
                    failure = Some(d.message.unwrap_or_else(|| "the import failed".into()));
                }
            }
            Err(e) => failure = Some(api_err(e, "send the image").message),
        }
    }
    let written = writer.await.map_err(|e| ImageError::infra(e.to_string()))?;
    if let Err(e) = written {
        return Err(ImageError::infra(format!(
            "import {} into the Docker engine: read {}: {e}",
            rootfs.reference,
            rootfs.dir.display()
        )));
    }
    if let Some(f) = failure {
        return Err(ImageError::infra(format!("import {} into the Docker engine as {tag}: {f}", rootfs.reference)));
    }
    Ok(())
}

/// The engine's image for `rootfs`, imported once per digest, also tagged `name` (the
/// public name a Dockerfile uses). Returns true if it was imported now.
pub async fn ensure(docker: &Docker, rootfs: &Rootfs, ids: IdMap, name: &str) -> Result<bool> {
    let recipe = rootfs
        .resolved
        .strip_prefix("offline:")
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("image")
        .to_string();
    let hex = rootfs.digest.trim_start_matches("sha256:");
    let canonical = format!("scenario-run/offline-{recipe}:{}", &hex[..hex.len().min(12)]);
    let have = docker
        .inspect_image(&canonical)
        .await
        .ok()
        .and_then(|i| i.config.and_then(|c| c.labels).and_then(|l| l.get(LABEL_DIGEST).cloned()))
        .is_some_and(|d| d == rootfs.digest);
    if !have {
        import(docker, rootfs, ids, &canonical).await?;
    }
    let (repo, tag) = repo_tag(name);
    let opts = TagImageOptionsBuilder::default().repo(&repo).tag(&tag).build();
    docker.tag_image(&canonical, Some(opts)).await.map_err(|e| api_err(e, &format!("tag {canonical} as {name}")))?;
    Ok(!have)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repos_and_tags() {
        assert_eq!(repo_tag("python:3.11-slim"), ("python".into(), "3.11-slim".into()));
        assert_eq!(repo_tag("localhost:5000/a/b"), ("localhost:5000/a/b".into(), "latest".into()));
        assert_eq!(repo_tag("localhost:5000/a:t"), ("localhost:5000/a".into(), "t".into()));
    }
}

//! A local sandbox's disk: a writable layer of a declared size, so a sandbox that writes past
//! its disk gets `ENOSPC` inside, as in a cloud VM, and nothing of it lands on the host beyond.
//!
//! The sandbox's overlay upper and work directories live on an ext4 filesystem in a sparse
//! image file in its state directory (`disk.img`, only the blocks written take host disk),
//! made with `mkfs.ext4` from a seed directory (`-d`: the upper layer's first files) with one
//! inode per 16 KiB, so inodes are bounded too. When the sandbox is made, the image is
//! attached to a loop device that detaches itself once unused (`LO_FLAGS_AUTOCLEAR`); each
//! boot mounts that device, by host root, in the boot's private mount namespace only, at
//! `<dir>/disk`: no host mount exists, and the device goes with the sandbox (its descriptor is
//! held until then; a SIGKILL of the runner closes it too). One device for the sandbox's
//! whole life matters: a filesystem can outlive its last mount namespace for a moment (an
//! open file, a watch), and mounting the same device again finds that same filesystem, where
//! a second device over the same image would mount a stale copy beside it. From the host, the
//! live filesystem is reached through the outer bubblewrap process's root
//! (`/proc/<pid>/root/<dir>/disk`); a stopped sandbox's is mounted read-only, in a mount
//! namespace of its own, by the one command that reads it.
//!
//! The size is `disk` (MiB) in `template.yaml`, else `create`'s (Alibaba's `diskSizeMB`), else
//! [`DEFAULT_MB`]: E2B gives a Hobby-tier sandbox 10 GiB of disk. Making an image costs about
//! 10 ms (more under load) and attaching one 1–9 ms, so images of the default size are made
//! and attached ahead ([`Pool`]): a spare is its image and the loop device over it, which
//! detaches itself when the pool lets the spare go (or the runner dies), like a sandbox's.
//!
//! Sparse images promise more than they take, so a create is admitted by the disk it declares
//! ([`Book`], issue 35 item 5: 1 TiB disks were accepted on a host with 80 GiB free, and their
//! sandboxes could fill the host's disk). No one disk is larger than the space free now
//! (`statvfs`) on the filesystem the images live on (the state directory's) less
//! [`RESERVE_MB`] kept for the host, so one sandbox alone meets `ENOSPC` before the host does:
//! a disk declared larger is refused, and the default disk (nothing declared) is made smaller
//! to fit, down to [`MIN_DEFAULT_MB`] (a laptop with 8 GiB free runs scenarios; a 10 GiB
//! default refused there would be a surprise, not a defence). The disks declared by live
//! sandboxes, the new one's included, stay within `SCENARIO_RUN_DISK_OVERCOMMIT` (default
//! [`DEFAULT_OVERCOMMIT`]) times that free space; default disks count towards it but are never
//! refused by it (they are the platform's own size, not a client's choice). A refusal is
//! [`ErrorKind::Capacity`](crate::provider::ErrorKind::Capacity), naming the declared size, what
//! is free and the knob (serve answers it 507); a sandbox's claim is given back when its record
//! goes.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::pool;

/// A sandbox's disk when nothing says otherwise, in MiB (E2B's Hobby tier).
pub const DEFAULT_MB: u64 = 10 * 1024;
/// The smallest disk a sandbox may have, in MiB (ext4 needs some room of its own).
pub const MIN_MB: u64 = 16;
/// The largest: 1 TiB.
pub const MAX_MB: u64 = 1 << 20;
/// Space kept free for the host: no disk is admitted past the free space less this, in MiB.
pub const RESERVE_MB: u64 = 1024;
/// The smallest the default disk is made to fit a nearly full host, in MiB; below it, the
/// create is refused.
pub const MIN_DEFAULT_MB: u64 = 512;
/// One inode per this many bytes of disk (ext4's default ratio).
const BYTES_PER_INODE: u64 = 16 * 1024;
/// Declared disks may add up to this many times the free space when
/// `SCENARIO_RUN_DISK_OVERCOMMIT` does not say: sandboxes under test write a small part of
/// their disk.
pub const DEFAULT_OVERCOMMIT: f64 = 4.0;
/// The variable that sets the overcommit.
pub const OVERCOMMIT_VAR: &str = "SCENARIO_RUN_DISK_OVERCOMMIT";

/// The disks declared by live sandboxes; see the module documentation.
#[derive(Debug)]
pub(crate) struct Book {
    declared_mb: Mutex<u64>,
    overcommit: f64,
}

/// A live sandbox's declared disk, given back when dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    book: Arc<Book>,
    mb: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut d = self.book.declared_mb.lock().expect("disk book");
        *d = d.saturating_sub(self.mb);
    }
}

/// The space free to an unprivileged writer (`f_bavail`) on the filesystem of `dir`, MiB.
pub(crate) fn free_mb(dir: &Path) -> io::Result<u64> {
    let v = rustix::fs::statvfs(dir)?;
    Ok(v.f_bavail.saturating_mul(v.f_frsize) >> 20)
}

impl Book {
    pub(crate) fn new(overcommit: f64) -> Arc<Self> {
        Arc::new(Self { declared_mb: Mutex::new(0), overcommit })
    }

    /// A book with the overcommit of `SCENARIO_RUN_DISK_OVERCOMMIT` (`value`), else the default.
    pub(crate) fn from_var(value: Option<&str>) -> Result<Arc<Self>, String> {
        let ratio = match value.map(str::trim).filter(|v| !v.is_empty()) {
            None => DEFAULT_OVERCOMMIT,
            Some(v) => match v.parse::<f64>() {
                Ok(r) if r.is_finite() && r >= 0.1 => r,
                _ => {
                    return Err(format!(
                        "{OVERCOMMIT_VAR}={v:?}: expected a ratio of at least 0.1 (4 admits declared disks up to four times the free space)"
                    ))
                }
            },
        };
        Ok(Self::new(ratio))
    }

    /// Admits a sandbox's disk when `free` MiB are free where the images live: `declared` MiB,
    /// or the default size (made smaller to fit) when nothing declares one. The claim holds the
    /// size the disk is made with.
    pub(crate) fn admit(self: &Arc<Self>, declared: Option<u64>, free: u64) -> Result<Claim, String> {
        let human = |mib: u64| crate::size::human(mib.saturating_mul(1 << 20));
        let room = free.saturating_sub(RESERVE_MB);
        let mb = match declared {
            Some(mb) if mb > room => {
                return Err(format!(
                    "not enough disk space on this host: the sandbox declares a disk of {}, and the filesystem sandbox disks live on (the state directory's) has {} free, of which {} is kept for the host; no one disk is admitted past the rest, whatever {OVERCOMMIT_VAR} says: declare a smaller `disk` (diskSizeMB), or free space",
                    human(mb),
                    human(free),
                    human(RESERVE_MB)
                ))
            }
            Some(mb) => mb,
            None if room < MIN_DEFAULT_MB => {
                return Err(format!(
                    "not enough disk space on this host: the filesystem sandbox disks live on (the state directory's) has {} free, of which {} is kept for the host, and a sandbox's disk needs at least {}: free space",
                    human(free),
                    human(RESERVE_MB),
                    human(MIN_DEFAULT_MB)
                ))
            }
            None => DEFAULT_MB.min(room),
        };
        let cap = (free as f64 * self.overcommit) as u64;
        let mut live = self.declared_mb.lock().expect("disk book");
        if declared.is_some() && live.saturating_add(mb) > cap {
            return Err(format!(
                "not enough disk space on this host: the sandbox declares a disk of {}, and live sandboxes declare {} of the {} admitted ({OVERCOMMIT_VAR}={} times the {} free on the state directory's filesystem); kill some, free space, or raise {OVERCOMMIT_VAR}",
                human(mb),
                human(*live),
                human(cap),
                self.overcommit,
                human(free)
            ));
        }
        *live += mb;
        Ok(Claim { book: self.clone(), mb })
    }
}

impl Claim {
    /// The size the sandbox's disk is made with, MiB.
    pub(crate) fn mb(&self) -> u64 {
        self.mb
    }
}

/// One sandbox's disk: its image, its loop device once attached, and where it is mounted in
/// the sandbox's mount namespace.
#[derive(Debug, Clone)]
pub(crate) struct Disk {
    pub image: PathBuf,
    pub mount: PathBuf,
    pub size_mb: u64,
    pub dev: Option<Arc<Loop>>,
}

impl Disk {
    pub(crate) fn new(dir: &Path, size_mb: u64) -> Self {
        Self { image: dir.join("disk.img"), mount: dir.join("disk"), size_mb, dev: None }
    }

    /// The overlay's upper and work directories on it.
    pub(crate) fn upper(&self) -> PathBuf {
        self.mount.join("upper")
    }
    pub(crate) fn work(&self) -> PathBuf {
        self.mount.join("work")
    }
}

/// Where `mkfs.ext4` is.
fn mkfs() -> io::Result<PathBuf> {
    ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4", "/usr/bin/mkfs.ext4"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| io::Error::other("sandbox disks need mkfs.ext4 (apt-get install e2fsprogs)"))
}

/// Makes a sparse ext4 image of `size_mb` at `image` holding `seed` (its contents become the
/// filesystem's root, owners and modes kept). Blocking.
pub(crate) fn make_image(image: &Path, size_mb: u64, seed: &Path) -> io::Result<()> {
    let size_mb = size_mb.max(MIN_MB);
    {
        let f = std::fs::OpenOptions::new().write(true).create_new(true).open(image)?;
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.set_len(size_mb * 1024 * 1024)?;
    }
    let inodes = (size_mb * 1024 * 1024 / BYTES_PER_INODE).max(1024);
    let out = std::process::Command::new(mkfs()?)
        .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", "-m", "0"])
        .arg("-N")
        .arg(inodes.to_string())
        .arg("-d")
        .arg(seed)
        .arg(image)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()?;
    if !out.status.success() {
        let _ = std::fs::remove_file(image);
        return Err(io::Error::other(format!(
            "mkfs.ext4 failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// A loop device attached to an image; it detaches itself once its last user (a mount, this
/// descriptor) is gone.
#[derive(Debug)]
pub(crate) struct Loop {
    _fd: OwnedFd,
    pub path: CString,
}

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// Attaches `image` (read-write, or read-only) to a free loop device. Blocking.
pub(crate) fn attach(image: &Path, read_only: bool) -> io::Result<Loop> {
    const LO_FLAGS_READ_ONLY: u32 = 1;
    let file = std::fs::OpenOptions::new().read(true).write(!read_only).open(image)?;
    let control = std::fs::OpenOptions::new().read(true).write(true).open("/dev/loop-control")?;
    // Another process may take the device we were offered before we configure it: try again.
    let mut last = io::Error::other("no free loop device");
    for _ in 0..16 {
        // SAFETY: an ioctl without argument on a descriptor we own; it returns a number.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let path = format!("/dev/loop{n}");
        let dev = match std::fs::OpenOptions::new().read(true).write(!read_only).open(&path) {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        // SAFETY: LoopConfig is plain integers and byte arrays; all zeroes is valid.
        let mut config: LoopConfig = unsafe { std::mem::zeroed() };
        config.fd = file.as_raw_fd() as u32;
        config.info.lo_flags = LO_FLAGS_AUTOCLEAR | if read_only { LO_FLAGS_READ_ONLY } else { 0 };
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `config` is (the same
        // layout: repr(C), the kernel's field types), from memory that outlives the call.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &config as *const LoopConfig) };
        if r == 0 {
            let path = CString::new(path).expect("no NUL in a device path");
            return Ok(Loop { _fd: dev.into(), path });
        }
        last = io::Error::last_os_error();
        if last.raw_os_error() != Some(libc::EBUSY) {
            return Err(last);
        }
    }
    Err(last)
}

/// Runs `cmd` with `disk`'s filesystem mounted read-only at `disk.mount`, in a mount namespace
/// of the command's own (for a sandbox that is not running). Blocking.
pub(crate) fn with_mounted(disk: &Disk, mut cmd: std::process::Command) -> io::Result<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let dev = disk.dev.clone().ok_or_else(|| io::Error::other("the disk has no loop device"))?;
    std::fs::create_dir_all(&disk.mount)?;
    let source = dev.path.clone();
    let target = CString::new(disk.mount.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: `pre_exec` needs an async-signal-safe closure: unshare and mount, raw system
    // calls on C strings made before the fork.
    unsafe {
        cmd.pre_exec(move || {
            use rustix::mount::{MountFlags, MountPropagationFlags};
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            // A slave copy, as the sandbox's own (see `sandbox::bwrap_command`): it lets go of what
            // the host unmounts meanwhile.
            rustix::mount::mount_change(c"/", MountPropagationFlags::REC | MountPropagationFlags::DOWNSTREAM)?;
            let flags = MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID;
            rustix::mount::mount(source.as_c_str(), target.as_c_str(), c"ext4", flags, c"")?;
            Ok(())
        });
    }
    let out = cmd.output();
    drop(dev);
    out
}

/// How full a mounted disk is: (bytes used, bytes in all).
pub(crate) fn usage(mounted_at: &Path) -> Option<(u64, u64)> {
    let v = rustix::fs::statvfs(mounted_at).ok()?;
    Some(((v.f_blocks - v.f_bfree) * v.f_frsize, v.f_blocks * v.f_frsize))
}

/// Writes a seed directory (see [`make_image`]).
type SeedWriter = dyn Fn(&Path) -> io::Result<()> + Send + Sync;

/// Images of the default size made ahead, in `<state>/disk-pool.<owner>`, from one seed.
pub(crate) struct Pool(Arc<pool::Pool<Images>>);

/// What [`Pool`] keeps: images of the default size holding the seed, in its directory, each
/// attached to its loop device.
struct Images(Arc<Dir>);

/// One image made and attached ahead.
struct Attached {
    image: PathBuf,
    dev: Loop,
}

/// The pool's directory, and the seed in it.
struct Dir {
    path: PathBuf,
    write_seed: Box<SeedWriter>,
    seeded: std::sync::OnceLock<Result<PathBuf, SeedFailed>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("dir", &self.0.maker().0.path).field("target", &self.0.target()).finish()
    }
}

/// The seed could not be written. It is kept, and every later caller gets the same error, so
/// one failure is not retried for each sandbox.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot write the sandboxes' disk seed: {0}")]
struct SeedFailed(Arc<io::Error>);

/// Images kept ready when `SCENARIO_RUN_DISK_POOL` does not say.
const DEFAULT_POOL: usize = 3;

impl Dir {
    fn seed(&self) -> io::Result<&Path> {
        let r = self.seeded.get_or_init(|| {
            let seed = self.path.join("seed");
            crate::owner::create_dir(&self.path)
                .and_then(|()| (self.write_seed)(&seed))
                .map(|()| seed)
                .map_err(|e| SeedFailed(Arc::new(e)))
        });
        match r {
            Ok(p) => Ok(p.as_path()),
            Err(e) => Err(io::Error::new(e.0.kind(), e.clone())),
        }
    }
}

#[async_trait::async_trait]
impl pool::Maker for Images {
    type Spare = Attached;
    type Kind = ();

    fn next(&self, ready: &[&()], target: usize) -> Option<pool::Next<()>> {
        pool::up_to_target(ready, target)
    }

    async fn make(&self, _: &()) -> Option<Attached> {
        let dir = self.0.clone();
        let made = tokio::task::spawn_blocking(move || {
            let image = dir.path.join(format!("{}.img", crate::random::hex(6)));
            let made = dir.seed().and_then(|seed| make_image(&image, DEFAULT_MB, seed));
            match made.and_then(|()| attach(&image, false)) {
                Ok(dev) => Some(Attached { image, dev }),
                Err(_) => {
                    let _ = std::fs::remove_file(&image);
                    None
                }
            }
        });
        made.await.ok().flatten()
    }

    /// The device detaches itself once its descriptor is closed; then the image goes.
    fn destroy_now(&self, spare: Attached) {
        drop(spare.dev);
        let _ = std::fs::remove_file(spare.image);
    }

    async fn destroy(&self, spare: Attached) {
        let _ = tokio::task::spawn_blocking(move || {
            drop(spare.dev);
            std::fs::remove_file(spare.image)
        })
        .await;
    }
}

impl Pool {
    /// A pool in `state_dir` whose images hold what `write_seed` writes into a directory (made
    /// once, when first needed). The directory carries the owner file, so the next run sweeps
    /// what a killed one left.
    pub(crate) fn new(state_dir: &Path, write_seed: Box<SeedWriter>) -> Arc<Self> {
        let path = state_dir.join(format!("disk-pool.{}", crate::owner::token().replace(':', ".")));
        let dir = Dir { path, write_seed, seeded: std::sync::OnceLock::new() };
        let target = pool::target_from_env("SCENARIO_RUN_DISK_POOL", DEFAULT_POOL, 64);
        Arc::new(Self(pool::Pool::new(Images(Arc::new(dir)), target)))
    }

    /// Puts a ready image of `size_mb` holding the pool's seed at `image` and hands back the
    /// loop device it is attached to: one made and attached ahead when the size is the default,
    /// else a new one. (A device follows its image's inode, not its name: the rename keeps it.)
    /// Blocking; starts the refill.
    pub(crate) fn take(&self, image: &Path, size_mb: u64) -> io::Result<Loop> {
        let seed = self.0.maker().0.seed()?.to_path_buf();
        let pooled = if size_mb == DEFAULT_MB {
            self.0.take(&())
        } else {
            self.0.refill();
            None
        };
        if let Some(spare) = pooled {
            if std::fs::rename(&spare.image, image).is_ok() {
                return Ok(spare.dev);
            }
            pool::Maker::destroy_now(self.0.maker(), spare);
        }
        make_image(image, size_mb, &seed)?;
        attach(image, false)
    }

    /// Removes every image made ahead; no more are made.
    pub(crate) fn close(&self) {
        // The images go with their directory.
        drop(self.0.close_now());
        let _ = std::fs::remove_dir_all(&self.0.maker().0.path);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35 item 5: declared disks add up to the overcommit times what is free, and come
    /// back when their sandboxes go.
    #[test]
    fn declared_disks_add_up_to_the_overcommit_of_the_free_space() {
        let book = Book::new(4.0);
        // 80 GiB free, 10 GiB disks: 32 fit at 4 times.
        let mut claims: Vec<Claim> = (0..32).map(|_| book.admit(Some(10 << 10), 80 << 10).unwrap()).collect();
        let e = book.admit(Some(10 << 10), 80 << 10).unwrap_err();
        assert!(
            e.contains("declares a disk of 10 GiB, and live sandboxes declare 320 GiB of the 320 GiB admitted (SCENARIO_RUN_DISK_OVERCOMMIT=4 times the 80 GiB free"),
            "{e}"
        );
        claims.pop();
        let again = book.admit(Some(10 << 10), 80 << 10).unwrap();
        drop(claims);
        drop(again);
        assert_eq!(*book.declared_mb.lock().unwrap(), 0);
    }

    #[test]
    fn one_disk_is_never_larger_than_the_free_space_less_the_reserve() {
        let book = Book::new(100.0);
        let e = book.admit(Some(MAX_MB), 80 << 10).unwrap_err();
        assert!(e.contains("declares a disk of 1 TiB") && e.contains("has 80 GiB free"), "{e}");
        assert!(e.contains(OVERCOMMIT_VAR), "the knob is named: {e}");
        assert_eq!(*book.declared_mb.lock().unwrap(), 0, "a refusal claims nothing");
        let e = book.admit(Some(80 << 10), 80 << 10).unwrap_err();
        assert!(e.contains("of which 1 GiB is kept for the host"), "{e}");
        assert_eq!(book.admit(Some(79 << 10), 80 << 10).unwrap().mb(), 79 << 10);
    }

    /// The CI of 2026-12-07: with 9.6 GiB free (a Docker engine's images beside), every
    /// sandbox was refused for the 10 GiB default nobody had asked for.
    #[test]
    fn the_default_disk_shrinks_to_fit_and_is_never_refused_by_the_overcommit() {
        let book = Book::new(4.0);
        let plenty = book.admit(None, 80 << 10).unwrap();
        assert_eq!(plenty.mb(), DEFAULT_MB);
        let free = 9830; // 9.6 GiB
        let claims: Vec<Claim> = (0..10).map(|_| book.admit(None, free).unwrap()).collect();
        assert!(claims.iter().all(|c| c.mb() == free - RESERVE_MB), "fits the room left");
        // Past the overcommit now (10 × 8.6 GiB > 4 × 9.6 GiB): a declared disk is refused,
        // the default one is not.
        assert!(book.admit(Some(64), free).unwrap_err().contains("live sandboxes declare"));
        book.admit(None, free).unwrap();
        let e = book.admit(None, RESERVE_MB + MIN_DEFAULT_MB - 1).unwrap_err();
        assert!(e.contains("a sandbox's disk needs at least 512 MiB: free space"), "{e}");
        drop(plenty);
        drop(claims);
    }

    #[test]
    fn the_overcommit_comes_from_the_variable() {
        assert_eq!(Book::from_var(None).unwrap().overcommit, DEFAULT_OVERCOMMIT);
        assert_eq!(Book::from_var(Some("1.5")).unwrap().overcommit, 1.5);
        let e = Book::from_var(Some("0")).unwrap_err();
        assert!(e.starts_with("SCENARIO_RUN_DISK_OVERCOMMIT=\"0\": expected a ratio"), "{e}");
        assert!(free_mb(Path::new("/")).unwrap() > 0);
    }
}

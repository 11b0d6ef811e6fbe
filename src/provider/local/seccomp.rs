//! The seccomp filter every sandbox process runs under.
//!
//! A sandbox already runs in a user namespace of its own, so the kernel refuses what needs a
//! privilege on the host (block-device mounts, device nodes, module loading, host cgroups).
//! The filter is the second wall: it denies the system calls a sandbox never needs, so a
//! kernel bug behind one of them is out of reach too. It is a deny list, as Docker's default
//! profile is in effect, because sandboxes run arbitrary programs (apt, pip, npm, Chromium,
//! agent CLIs) whose system calls nobody can list in advance.
//!
//! Denied with `EPERM`:
//! * mounting and namespace surgery: `mount`, `umount2`, `pivot_root`, the new mount API
//!   (`open_tree`, `move_mount`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr`),
//!   `setns`, and `unshare`/`clone` with any `CLONE_NEW*` flag (no nested namespaces);
//! * the kernel keyring (`keyctl`, `add_key`, `request_key`), `bpf`, `perf_event_open`,
//!   `userfaultfd`, `io_uring_*`;
//! * modules, reboot and kexec; swap; `acct`; `quotactl`; setting the clock; `syslog`;
//!   `iopl`/`ioperm`; `open_by_handle_at`/`name_to_handle_at`; `lookup_dcookie`; `vhangup`;
//! * `mknod`/`mknodat` of character or block devices (FIFOs, sockets and files stay allowed);
//! * everything else Docker's default profile (moby `profiles/seccomp/default.json`) refuses a
//!   container with Docker's capability set, which is the set a sandbox's root keeps:
//!   `fanotify_init`, `kcmp`, `pidfd_getfd`, `process_madvise`, the NUMA policy calls
//!   (`mbind`, `get_mempolicy`, `set_mempolicy`, `set_mempolicy_home_node`, `migrate_pages`,
//!   `move_pages`), `sethostname`/`setdomainname`, `quotactl_fd`, `uselib`, `ustat`, `sysfs`
//!   and the long-removed calls (`_sysctl`, `create_module`, …); sockets of the `AF_VSOCK`
//!   family (a VM's vsock ports are shared with the host's); `personality` other than the
//!   values Docker allows (0, `PER_LINUX32`, `UNAME26` and their combination, and the query
//!   `0xffffffff`: so not `READ_IMPLIES_EXEC` nor `ADDR_NO_RANDOMIZE`); and `modify_ldt`
//!   (16-bit segments: only DOS and Windows emulators want them; newer Docker profiles
//!   refuse it too). The filter is thus at least as strict as Docker's, and stricter where
//!   the list above says (`io_uring_*`, `userfaultfd`), while system calls newer than the
//!   profile (`fchmodat2`, `cachestat`, `futex_wait`, …) stay allowed, so a newer libc in an
//!   image does not break.
//!
//! `clone3` answers `ENOSYS`: its flags live in memory the filter cannot read, and on
//! `ENOSYS` glibc falls back to `clone`, whose flags it can. System calls of another ABI
//! (i386 through `int 0x80`, x32) answer `ENOSYS` as well, so the list cannot be bypassed by
//! a second numbering.
//!
//! The program is built once, as classic BPF, and installed in each command right before it
//! becomes the sandbox user (see `enter`); installing needs no `no_new_privs`, so `sudo`
//! inside keeps working.

/// One classic BPF instruction (`struct sock_filter`).
pub(crate) type Insn = libc::sock_filter;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Offsets in `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const fn off_arg_lo(n: u32) -> u32 {
    16 + 8 * n
}

const RET_ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// Namespace flags a sandbox may not ask `clone`/`unshare` for.
const NS_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP
    | 0x80) as u32; // CLONE_NEWTIME

/// Denied outright (EPERM).
const DENIED: &[libc::c_long] = &[
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setns,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
    // Refused by Docker's default profile to a container without CAP_SYS_ADMIN,
    // CAP_SYS_PTRACE or CAP_SYS_NICE (see the module documentation).
    libc::SYS_fanotify_init,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_process_madvise,
    libc::SYS_mbind,
    libc::SYS_get_mempolicy,
    libc::SYS_set_mempolicy,
    libc::SYS_set_mempolicy_home_node,
    libc::SYS_migrate_pages,
    libc::SYS_move_pages,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_quotactl_fd,
    libc::SYS_modify_ldt,
    libc::SYS_uselib,
    libc::SYS_ustat,
    libc::SYS_sysfs,
    libc::SYS__sysctl,
    174, // create_module
    177, // get_kernel_syms
    178, // query_module
    libc::SYS_nfsservctl,
    libc::SYS_getpmsg,
    libc::SYS_putpmsg,
    libc::SYS_afs_syscall,
    libc::SYS_tuxcall,
    libc::SYS_security,
    libc::SYS_vserver,
    // open_tree with mount attributes (Linux 6.15): the mount API again.
    OPEN_TREE_ATTR,
];

/// `open_tree_attr`, newer than the libc crate's table.
const OPEN_TREE_ATTR: libc::c_long = 467;

/// `AF_VSOCK`.
const AF_VSOCK: u32 = 40;

/// The `personality` values Docker's default profile allows: Linux, `PER_LINUX32`,
/// `UNAME26`, both, and the query.
const PERSONALITIES: [u32; 5] = [0x0, 0x8, 0x2_0000, 0x2_0008, 0xffff_ffff];

fn stmt(code: u32, k: u32) -> Insn {
    Insn { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> Insn {
    Insn { code: code as u16, jt, jf, k }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET_K: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const AND_K: u32 = libc::BPF_ALU | libc::BPF_AND | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;

/// The filter program (see the module documentation).
pub(crate) fn program() -> Vec<Insn> {
    let mut p = vec![
        // Another ABI: ENOSYS.
        stmt(LD_W_ABS, OFF_ARCH),
        jump(JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(RET_K, RET_ENOSYS),
        stmt(LD_W_ABS, OFF_NR),
        jump(JGE_K, X32_SYSCALL_BIT, 0, 1),
        stmt(RET_K, RET_ENOSYS),
    ];
    for &nr in DENIED {
        p.push(jump(JEQ_K, nr as u32, 0, 1));
        p.push(stmt(RET_K, RET_EPERM));
    }
    p.push(jump(JEQ_K, libc::SYS_clone3 as u32, 0, 1));
    p.push(stmt(RET_K, RET_ENOSYS));
    // clone(flags, …) and unshare(flags): no namespace flags. (clone's low byte is the exit
    // signal, so CLONE_NEWTIME's bit is not a flag there.)
    for (nr, mask) in [(libc::SYS_clone, NS_FLAGS & !0xff), (libc::SYS_unshare, NS_FLAGS)] {
        p.push(jump(JEQ_K, nr as u32, 0, 4));
        p.push(stmt(LD_W_ABS, off_arg_lo(0)));
        p.push(jump(JSET_K, mask, 0, 1));
        p.push(stmt(RET_K, RET_EPERM));
        p.push(stmt(LD_W_ABS, OFF_NR));
    }
    // socket(AF_VSOCK, …): refused; every other family goes on.
    p.push(jump(JEQ_K, libc::SYS_socket as u32, 0, 4));
    p.push(stmt(LD_W_ABS, off_arg_lo(0)));
    p.push(jump(JEQ_K, AF_VSOCK, 0, 1));
    p.push(stmt(RET_K, RET_EPERM));
    p.push(stmt(LD_W_ABS, OFF_NR));
    // personality(persona): only the values in PERSONALITIES (a jump past the refusal for
    // each; anything else falls through to it).
    let n = PERSONALITIES.len() as u8;
    p.push(jump(JEQ_K, libc::SYS_personality as u32, 0, n + 3));
    p.push(stmt(LD_W_ABS, off_arg_lo(0)));
    for (i, v) in PERSONALITIES.iter().enumerate() {
        p.push(jump(JEQ_K, *v, n - i as u8, 0));
    }
    p.push(stmt(RET_K, RET_EPERM));
    p.push(stmt(LD_W_ABS, OFF_NR));
    // mknod(path, mode, dev) and mknodat(dirfd, path, mode, dev): no device nodes.
    for (nr, arg) in [(libc::SYS_mknod, 1), (libc::SYS_mknodat, 2)] {
        p.push(jump(JEQ_K, nr as u32, 0, 6));
        p.push(stmt(LD_W_ABS, off_arg_lo(arg)));
        p.push(stmt(AND_K, libc::S_IFMT));
        p.push(jump(JEQ_K, libc::S_IFCHR, 1, 0));
        p.push(jump(JEQ_K, libc::S_IFBLK, 0, 1));
        p.push(stmt(RET_K, RET_EPERM));
        p.push(stmt(LD_W_ABS, OFF_NR));
    }
    p.push(stmt(RET_K, RET_ALLOW));
    p
}

/// Installs `prog` in the calling thread. For a forked child between fork and exec: only
/// `prctl`, which is async-signal-safe. Needs `CAP_SYS_ADMIN` in the current user namespace
/// (or `no_new_privs`). A raw call: rustix has no form of `PR_SET_SECCOMP` with a filter.
pub(crate) fn install(prog: &[Insn]) -> std::io::Result<()> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut Insn };
    // SAFETY: the kernel reads `fprog` and the `len` instructions it points at (`Insn` has
    // the layout of `sock_filter`), copies them and keeps no pointer; both outlive the call.
    // `len` is the slice's own length (the program is far below u16::MAX instructions).
    let r = unsafe {
        libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER as libc::c_ulong, &fprog as *const _ as usize, 0, 0)
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The program as bytes, the format bubblewrap's `--seccomp FD` reads.
pub(crate) fn to_bytes(prog: &[Insn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * 8);
    for i in prog {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.push(i.jt);
        out.push(i.jf);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child under the filter and returns the errnos it recorded. The
    /// child allocates nothing (the test process has other threads).
    fn under_filter(f: &dyn Fn(&mut [i32; 16]) -> usize) -> Vec<i32> {
        let prog = program();
        let (r, w) = crate::provider::local::sys::cloexec_pipe().unwrap();
        // SAFETY: the test process has other threads, so the child may only make raw system
        // calls on memory prepared before the fork (no allocation, no locks), then `_exit`
        // (no destructors, no atexit handlers); `f` holds to the same.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let _ = rustix::thread::set_no_new_privs(true);
            let code = if install(&prog).is_err() {
                2
            } else {
                let mut out = [0i32; 16];
                let n = f(&mut out).min(out.len());
                let mut raw = [0u8; 64];
                for (i, v) in out[..n].iter().enumerate() {
                    raw[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
                }
                let _ = rustix::io::write(&w, &raw[..n * 4]);
                0
            };
            crate::provider::local::sys::exit_now(code);
        }
        drop(w);
        let mut buf = Vec::new();
        use std::io::Read;
        std::fs::File::from(r).read_to_end(&mut buf).unwrap();
        let pid = rustix::process::Pid::from_raw(pid).expect("a child pid");
        let (_, status) = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
            .expect("waitpid")
            .expect("the child's status");
        assert_eq!(status.as_raw(), 0, "child failed");
        buf.chunks(4).map(|c| i32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    fn errno_of(r: libc::c_long) -> i32 {
        if r < 0 {
            // errno, read without allocating.
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            0
        }
    }

    #[test]
    fn denied_calls_fail_and_ordinary_ones_work() {
        let dir = tempfile::tempdir().unwrap();
        let dev = std::ffi::CString::new(dir.path().join("dev").to_str().unwrap()).unwrap();
        let fifo = std::ffi::CString::new(dir.path().join("fifo").to_str().unwrap()).unwrap();
        let tmp = c"/tmp";
        // SAFETY: the point of the test is the raw system calls the filter sees (denied ones
        // included, which rustix would not even issue); they take integers and C strings
        // made before the fork, and write nothing but the child's stack.
        let got = under_filter(&|out| unsafe {
            let calls: [&dyn Fn() -> libc::c_long; 10] = [
                &|| libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0),
                &|| libc::syscall(libc::SYS_mount, tmp.as_ptr(), tmp.as_ptr(), tmp.as_ptr(), 0, 0),
                &|| libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER),
                &|| libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS),
                &|| libc::syscall(libc::SYS_bpf, 0, 0, 0),
                &|| libc::syscall(libc::SYS_mknodat, libc::AT_FDCWD, dev.as_ptr(), libc::S_IFCHR | 0o600, 0),
                &|| libc::syscall(libc::SYS_mknod, dev.as_ptr(), libc::S_IFBLK | 0o600, 0),
                &|| libc::syscall(libc::SYS_clone3, 0, 0),
                &|| libc::syscall(libc::SYS_init_module, 0, 0, 0),
                // x32 numbering of a denied call.
                &|| libc::syscall(libc::SYS_keyctl | X32_SYSCALL_BIT as libc::c_long, 0, 0, 0, 0, 0),
            ];
            for (i, c) in calls.iter().enumerate() {
                out[i] = errno_of(c());
            }
            // Allowed: plain calls, unshare without namespace flags, FIFOs.
            out[10] = errno_of(libc::syscall(libc::SYS_getpid));
            out[11] = errno_of(libc::syscall(libc::SYS_unshare, libc::CLONE_FILES));
            out[12] =
                errno_of(libc::syscall(libc::SYS_mknodat, libc::AT_FDCWD, fifo.as_ptr(), libc::S_IFIFO | 0o600, 0));
            13
        });
        let (e, n) = (libc::EPERM, libc::ENOSYS);
        assert_eq!(got, [e, e, e, e, e, e, e, n, e, n, 0, 0, 0]);
        assert!(dir.path().join("fifo").exists());
        assert!(!dir.path().join("dev").exists());
    }

    /// What Docker's default profile refuses is refused here too (issue 23 item 8: AF_VSOCK,
    /// modify_ldt, personality(READ_IMPLIES_EXEC) and fanotify_init went through), and the
    /// neighbours that must keep working do.
    #[test]
    fn what_dockers_default_profile_refuses_is_refused() {
        // SAFETY: raw system calls with integer arguments (and a null pointer modify_ldt never
        // reads: it is refused before the kernel sees it, and with count 0 would read nothing).
        let got = under_filter(&|out| unsafe {
            out[0] = errno_of(libc::syscall(libc::SYS_socket, AF_VSOCK, libc::SOCK_STREAM, 0));
            out[1] = errno_of(libc::syscall(libc::SYS_modify_ldt, 0, std::ptr::null::<u8>(), 0));
            out[2] = errno_of(libc::syscall(libc::SYS_personality, 0x0040_0000)); // READ_IMPLIES_EXEC
            out[3] = errno_of(libc::syscall(libc::SYS_personality, 0x0004_0000)); // ADDR_NO_RANDOMIZE
            out[4] = errno_of(libc::syscall(libc::SYS_fanotify_init, 0, 0));
            out[5] = errno_of(libc::syscall(libc::SYS_kcmp, 0, 0, 0, 0, 0));
            out[6] = errno_of(libc::syscall(libc::SYS_get_mempolicy, 0, 0, 0, 0, 0));
            out[7] = errno_of(libc::syscall(libc::SYS_pidfd_getfd, 0, 0, 0));
            // Still allowed: other socket families, the personality query and PER_LINUX.
            let s = libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM, 0);
            out[8] = errno_of(s);
            out[9] = errno_of(libc::syscall(libc::SYS_personality, 0xffff_ffffu32));
            out[10] = errno_of(libc::syscall(libc::SYS_personality, 0));
            11
        });
        let e = libc::EPERM;
        assert_eq!(got, [e, e, e, e, e, e, e, e, 0, 0, 0]);
    }

    #[test]
    fn bytes_are_eight_per_instruction() {
        let p = program();
        assert_eq!(to_bytes(&p).len(), p.len() * 8);
        assert!(p.len() < 4096, "BPF programs are limited to 4096 instructions");
    }
}

#!/usr/bin/env bash
# The floor for the engine-overhead row: what the local provider does for one sandbox, as a
# plain shell script with the same isolation. Reproduces src/provider/local/{sandbox,enter}.rs:
#   state dirs owned by the sandbox's root id + the BASH_ENV hook in the upper layer; a cgroup
#   (memory, cpu, pids) the script joins, so all it starts is in it; a user namespace whose
#   0..65535 map to the host's 100000000.. (a holder process, maps written as root); `unshare -m`
#   + make / private + overlay of the image (nodev), then bwrap run as that namespace's root
#   (`nsenter --user`) with its own pid/net/ipc/uts/cgroup namespaces, /dev, /proc,
#   --die-with-parent --info-fd 3 -- /bin/sh -c 'echo ready && exec sleep infinity'; read
#   child-pid and "ready"; then N times `nsenter -t PID` into every namespace as uid 1000 in
#   /home/user with the same environment, /bin/bash -l -c true, collecting stdout/stderr; SIGKILL
#   pid 1, wait for bwrap, remove the cgroup and the state.
#   Since issue 23/24 a sandbox also has a network and a disk of its own, so the floor makes them
#   too: a network namespace with slirp4netns attached (ready-fd) and the fixed egress rules
#   loaded with `nft -f`, joined by bwrap instead of --unshare-net; and a sparse ext4 image
#   (`mkfs.ext4 -d` of the upper layer's seed, 10 GiB), attached to a loop device and mounted
#   under the overlay's upper and work directories. (The engine makes both ahead, in pools;
#   the floor makes them in line: the work is the same.)
#   (Not reproduced: the seccomp filter, the bounding-set drop and the nested user namespace
#   of commands, a few system calls and one short-lived process.)
# Usage: floor.sh STATE_DIR ID COMMANDS ROOTFS    (bench/run drives it with xargs -P)
set -u
# One clean environment for the whole script, as scenario-run gives each command exactly its own.
[ -n "${FLOOR_CLEAN-}" ] || exec env -i FLOOR_CLEAN=1 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$0" "$@"
state=$1 id=$2 n=$3 rootfs=$4
base=100000000
d="$state/fl-$id"
rm -rf "$d"
mkdir -p "$d/seed/upper/etc/scenario-run" "$d/seed/work" "$d/merged" "$d/disk"
printf '%s\n' '# Written by scenario-run: the login profile resets PATH; restore the requested one.' \
  'if [ -n "${SCENARIO_RUN_PATH-}" ]; then PATH=$SCENARIO_RUN_PATH; export PATH; fi' \
  'unset SCENARIO_RUN_PATH BASH_ENV' >"$d/seed/upper/etc/scenario-run/bash_env.sh"
echo "nameserver 10.0.2.3" >"$d/seed/upper/etc/resolv.conf"
chown -R "$base:$base" "$d/seed" "$d/merged"
chown "$base:$base" "$d"
chmod 700 "$d"
# The disk: a sparse ext4 image of the seed, on a loop device that goes when unused.
truncate -s 10G "$d/disk.img"
mkfs.ext4 -q -F -O ^has_journal -E lazy_itable_init=1,nodiscard -m 0 -N 655360 -d "$d/seed" "$d/disk.img"
loopdev=$(losetup -f --show "$d/disk.img")
# The network: a namespace of its own, slirp4netns on it, the fixed rules.
unshare --net sleep infinity &
netholder=$!
until [ "$(readlink /proc/$netholder/ns/net)" != "$(readlink /proc/self/ns/net)" ]; do :; done
mkfifo "$d/slirp-ready"
exec 6<>"$d/slirp-ready"
# In a mount namespace of its own whose mounts follow the host's but never go back: its
# --enable-sandbox pivots and unmounts, which with shared propagation unmounts the host's mounts.
unshare -m --propagation slave slirp4netns --configure --mtu=65520 --disable-host-loopback --enable-sandbox --enable-seccomp \
  --netns-type=path --ready-fd=7 "/proc/$netholder/ns/net" eth0 7>"$d/slirp-ready" >/dev/null 2>&1 &
slirp=$!
trap 'kill "$slirp" "$netholder" 2>/dev/null; losetup -d "$loopdev" 2>/dev/null' EXIT
read -r -n 1 _ <&6
exec 6<&-
nsenter --net="/proc/$netholder/ns/net" nft -f - <<'RULES'
add table inet scenario_run
add set inet scenario_run fixed_deny { type ipv4_addr; flags interval; auto-merge; elements = { 0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, 169.254.0.0/16, 172.16.0.0/12, 192.0.0.0/24, 192.168.0.0/16, 198.18.0.0/15, 224.0.0.0/3 }; }
add chain inet scenario_run filter_out { type filter hook output priority 0; policy accept; }
add rule inet scenario_run filter_out oifname "lo" accept
add rule inet scenario_run filter_out ip daddr 10.0.2.3 udp dport 53 accept
add rule inet scenario_run filter_out ct state established,related accept
add rule inet scenario_run filter_out ip daddr @fixed_deny reject with icmp type admin-prohibited
RULES
cg=()
for c in memory cpu pids; do
  g="/sys/fs/cgroup/$c/scenario-run-floor/fl-$id"
  mkdir -p "$g" && cg+=("$g")
done
echo $((512 << 20)) >"/sys/fs/cgroup/memory/scenario-run-floor/fl-$id/memory.limit_in_bytes"
echo 200000 >"/sys/fs/cgroup/cpu/scenario-run-floor/fl-$id/cpu.cfs_quota_us"
echo 1024 >"/sys/fs/cgroup/pids/scenario-run-floor/fl-$id/pids.max"
for g in "${cg[@]}"; do echo $$ >"$g/cgroup.procs"; done
unshare -U sleep 30 &
holder=$!
until [ "$(readlink /proc/$holder/ns/user)" != "$(readlink /proc/self/ns/user)" ]; do :; done
echo "0 $base 65536" >/proc/$holder/uid_map
echo "0 $base 65536" >/proc/$holder/gid_map
mkfifo "$d/info" "$d/ready"
# O_RDWR on a fifo does not block: the reader of "ready" is open before bwrap writes to it.
exec 5<>"$d/ready"
nsenter --net="/proc/$netholder/ns/net" unshare -m /bin/sh -c 'mount --make-rprivate / &&
  mount -o nodev,nosuid,noatime "$4" "$1/disk" &&
  mount -t overlay overlay -o "nodev,lowerdir=$2,upperdir=$1/disk/upper,workdir=$1/disk/work" "$1/merged" &&
  exec nsenter --user=/proc/$3/ns/user -S 0 -G 0 -- bwrap --bind "$1/merged" / --dev /dev --proc /proc \
    --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup --hostname localhost \
    --die-with-parent --cap-drop ALL --info-fd 3 --chdir / -- /bin/sh -c "echo ready && exec sleep infinity"' \
  sh "$d" "$rootfs" "$holder" "$loopdev" 3>"$d/info" >"$d/ready" 2>"$d/bwrap.log" </dev/null &
bwrap_pid=$!
info=$(cat "$d/info")
read -r ready <&5
exec 5<&-
kill "$holder"
[ "$ready" = ready ] || { echo "floor: sandbox $id did not start: $(cat "$d/bwrap.log")" | tee -a "$state/errors.log" >&2; exit 1; }
pid=${info#*\"child-pid\": }
pid=${pid%%[!0-9]*}
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for ((i = 0; i < n; i++)); do
  # output collected into a file: no subshell fork, so the floor is not slowed by the shell
  HOME=/home/user PATH=$path USER=user LOGNAME=user SCENARIO_RUN_PATH=$path \
    BASH_ENV=/etc/scenario-run/bash_env.sh \
    nsenter -t "$pid" --user --mount --pid --net --ipc --uts --cgroup --root -S 1000 -G 1000 -- \
    /bin/bash -l -c "cd /home/user && true" >"$d/out" 2>"$d/err" </dev/null || {
    echo "floor: command failed in $id: $(cat "$d/err")" | tee -a "$state/errors.log" >&2; exit 1; }
done
kill -KILL "$pid"
wait "$bwrap_pid" 2>/dev/null
kill "$slirp" "$netholder" 2>/dev/null
wait "$slirp" "$netholder" 2>/dev/null
losetup -d "$loopdev" 2>/dev/null
for g in "${cg[@]}"; do echo $$ >"${g%/scenario-run-floor/*}/cgroup.procs"; rmdir "$g" 2>/dev/null; done
rm -rf "$d"

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
#   (Not reproduced: the seccomp filter and the bounding-set drop, a few system calls.)
# Usage: floor.sh STATE_DIR ID COMMANDS ROOTFS    (bench/run drives it with xargs -P)
set -u
# One clean environment for the whole script, as scenario-run gives each command exactly its own.
[ -n "${FLOOR_CLEAN-}" ] || exec env -i FLOOR_CLEAN=1 PATH=/usr/sbin:/usr/bin:/sbin:/bin "$0" "$@"
state=$1 id=$2 n=$3 rootfs=$4
base=100000000
d="$state/fl-$id"
mkdir -p "$d/upper/etc/scenario-run" "$d/work" "$d/merged"
printf '%s\n' '# Written by scenario-run: the login profile resets PATH; restore the requested one.' \
  'if [ -n "${SCENARIO_RUN_PATH-}" ]; then PATH=$SCENARIO_RUN_PATH; export PATH; fi' \
  'unset SCENARIO_RUN_PATH BASH_ENV' >"$d/upper/etc/scenario-run/bash_env.sh"
chown -R "$base:$base" "$d"
chmod 700 "$d"
cg=()
for c in memory cpu pids; do
  g="/sys/fs/cgroup/$c/scenario-run/fl-$id"
  mkdir -p "$g" && cg+=("$g")
done
echo $((512 << 20)) >"/sys/fs/cgroup/memory/scenario-run/fl-$id/memory.limit_in_bytes"
echo 200000 >"/sys/fs/cgroup/cpu/scenario-run/fl-$id/cpu.cfs_quota_us"
echo 1024 >"/sys/fs/cgroup/pids/scenario-run/fl-$id/pids.max"
for g in "${cg[@]}"; do echo $$ >"$g/cgroup.procs"; done
unshare -U sleep 30 &
holder=$!
until [ "$(readlink /proc/$holder/ns/user)" != "$(readlink /proc/self/ns/user)" ]; do :; done
echo "0 $base 65536" >/proc/$holder/uid_map
echo "0 $base 65536" >/proc/$holder/gid_map
mkfifo "$d/info" "$d/ready"
# O_RDWR on a fifo does not block: the reader of "ready" is open before bwrap writes to it.
exec 5<>"$d/ready"
unshare -m /bin/sh -c 'mount --make-rprivate / &&
  mount -t overlay overlay -o "nodev,lowerdir=$2,upperdir=$1/upper,workdir=$1/work" "$1/merged" &&
  exec nsenter --user=/proc/$3/ns/user -S 0 -G 0 -- bwrap --bind "$1/merged" / --dev /dev --proc /proc \
    --unshare-pid --unshare-ipc --unshare-uts --unshare-cgroup --unshare-net --hostname localhost \
    --die-with-parent --cap-drop ALL --info-fd 3 --chdir / -- /bin/sh -c "echo ready && exec sleep infinity"' \
  sh "$d" "$rootfs" "$holder" 3>"$d/info" >"$d/ready" 2>"$d/bwrap.log" </dev/null &
bwrap_pid=$!
info=$(cat "$d/info")
read -r ready <&5
exec 5<&-
kill "$holder"
[ "$ready" = ready ] || { echo "floor: sandbox $id did not start: $(cat "$d/bwrap.log")" >&2; exit 1; }
pid=${info#*\"child-pid\": }
pid=${pid%%[!0-9]*}
path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
for ((i = 0; i < n; i++)); do
  # output collected into a file: no subshell fork, so the floor is not slowed by the shell
  HOME=/home/user PATH=$path USER=user LOGNAME=user SCENARIO_RUN_PATH=$path \
    BASH_ENV=/etc/scenario-run/bash_env.sh \
    nsenter -t "$pid" --user --mount --pid --net --ipc --uts --cgroup --root -S 1000 -G 1000 -- \
    /bin/bash -l -c "cd /home/user && true" >"$d/out" 2>"$d/err" </dev/null || {
    echo "floor: command failed in $id: $(cat "$d/err")" >&2; exit 1; }
done
kill -KILL "$pid"
wait "$bwrap_pid" 2>/dev/null
for g in "${cg[@]}"; do echo $$ >"${g%/scenario-run/*}/cgroup.procs"; rmdir "$g" 2>/dev/null; done
rm -rf "$d"

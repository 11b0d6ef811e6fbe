#!/usr/bin/env bash
# The floor for the engine-overhead row: what the local provider does for one sandbox, as a
# plain shell script. Reproduces src/provider/local/sandbox.rs and process.rs:
#   state dirs + the BASH_ENV hook in the upper layer; `unshare -m` + make / private + overlay
#   mount, exec `bwrap ... --unshare-all --die-with-parent --info-fd 3 -- /bin/sh -c 'echo
#   ready && exec sleep infinity'`; read child-pid from the info fd and "ready" from stdout;
#   then N times `nsenter -t PID --mount --pid --net --ipc --uts --root -- /bin/sh -c PRELUDE
#   sh /usr/bin/env -i -C /home/user <env> /bin/bash -l -c true` (the pid report on fd 3, the
#   same environment), collecting stdout/stderr; SIGKILL pid 1, wait for bwrap, rm -rf.
# Usage: floor.sh STATE_DIR ID COMMANDS    (bench/run drives it with xargs -P)
set -u
state=$1 id=$2 n=$3
d="$state/fl-$id"
mkdir -p "$d/upper/etc/scenario-run" "$d/work" "$d/merged" "$d/home"
printf '%s\n' '# Written by scenario-run: the login profile resets PATH; restore the requested one.' \
  'if [ -n "${SCENARIO_RUN_PATH-}" ]; then PATH=$SCENARIO_RUN_PATH; export PATH; fi' \
  'unset SCENARIO_RUN_PATH BASH_ENV' >"$d/upper/etc/scenario-run/bash_env.sh"
mkfifo "$d/info" "$d/ready"
# O_RDWR on a fifo does not block: the reader of "ready" is open before bwrap writes to it.
exec 5<>"$d/ready"
unshare -m /bin/sh -c 'mount --make-rprivate / &&
  mount -t overlay overlay -o "lowerdir=/,upperdir=$1/upper,workdir=$1/work" "$1/merged" &&
  exec bwrap --bind "$1/merged" / --dev /dev --proc /proc --tmpfs /tmp --bind "$1/home" /home/user \
    --unshare-all --die-with-parent --info-fd 3 --chdir / -- /bin/sh -c "echo ready && exec sleep infinity"' \
  sh "$d" 3>"$d/info" >"$d/ready" 2>"$d/bwrap.log" </dev/null &
bwrap_pid=$!
info=$(cat "$d/info")
read -r ready <&5
exec 5<&-
[ "$ready" = ready ] || { echo "floor: sandbox $id did not start: $(cat "$d/bwrap.log")" >&2; exit 1; }
pid=${info#*\"child-pid\": }
pid=${pid%%[!0-9]*}
path=$PATH
for ((i = 0; i < n; i++)); do
  # output collected into a file: no subshell fork, so the floor is not slowed by the shell
  nsenter -t "$pid" --mount --pid --net --ipc --uts --root -- /bin/sh -c 'echo $$ >&3; exec 3>&-; exec "$@"' \
    sh /usr/bin/env -i -C /home/user "HOME=/home/user" "PATH=$path" "USER=root" "SCENARIO_RUN_PATH=$path" \
    "BASH_ENV=/etc/scenario-run/bash_env.sh" /bin/bash -l -c true 3>/dev/null >"$d/out" 2>"$d/err" </dev/null || {
    echo "floor: command failed in $id" >&2; exit 1; }
done
kill -KILL "$pid"
wait "$bwrap_pid" 2>/dev/null
rm -rf "$d"

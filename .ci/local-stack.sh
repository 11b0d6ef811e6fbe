#!/usr/bin/env bash
# local-stack.sh - bring up a loopback-only container stack for end-to-end tests
# on Debian 12 (root, no Docker Hub): private dockerd + OCI registry + base images.
#
# scenario-run's copy of shared/tools/local-stack.sh (see shared/docs/local-stack.md), run by
# scripts/test for the docker provider's tests. Changes from the reference: base-python also
# carries procps and curl (what templates/base/Dockerfile installs, so the shipped scenarios
# find `ps` and `curl`), and the image cache is this project's own directory (the reference
# prunes every other base-python-*.tar.zst in its cache, which would evict other projects').
#
#   local-stack.sh up          install missing packages, start dockerd + registry,
#                              create/load base images, push them to the registry
#   local-stack.sh selftest    push/pull round trip, run both images with --network host,
#                              docker build (FROM base-python, pip install from PyPI),
#                              latency measurements -> $STACK_DIR/log/timings.tsv
#   local-stack.sh podman      optional: rootful podman smoke test (host networking)
#   local-stack.sh env         print "export DOCKER_HOST=..." (eval "$(local-stack.sh env)")
#   local-stack.sh status      show what is running; fails if a bridge network exists
#   local-stack.sh down [--purge]  stop our registry + dockerd by PID (purge: unmount + rm state)
#
# Network policy: dockerd runs with --bridge=none --iptables=false --ip-masq=false, so no
# docker0/172.17 bridge and no NAT exist; containers and builds must use --network host
# (or none). The registry listens on 127.0.0.1 only.
#
# Configuration (env vars, all optional):
#   STACK_DIR=$TMPDIR/local-stack                state: socket, data-root, exec-root, pidfiles, logs
#   DOCKER_SOCK=$STACK_DIR/docker.sock
#   DOCKER_DATA_ROOT=$STACK_DIR/data   DOCKER_EXEC_ROOT=$STACK_DIR/exec
#   DOCKER_PIDFILE=$STACK_DIR/docker.pid
#   STORAGE_DRIVER=overlay2            (falls back to vfs if overlay2 cannot start)
#   CGROUP_PARENT=/local-stack         cgroup parent for our containers
#   LS_REGISTRY_ADDR=127.0.0.1:5000    must be loopback
#   LS_REGISTRY_STORAGE=$STACK_DIR/registry/storage  point at a persistent dir to keep pushed
#                                      images (and base-python:<key>) across runs
#   (not named REGISTRY_*: docker-registry reads REGISTRY_* env vars as config overrides;
#    the registry is started with a clean environment for the same reason)
#   REG=localhost:5000                 image name prefix (docker trusts 127.0.0.0/8 over http)
#   LS_AUTH_REGISTRY_ADDR=127.0.0.1:<registry port + 1>  a second registry, with authentication
#                                      (htpasswd, bcrypt), standing in for a private registry such
#                                      as ACR. Its user is LS_AUTH_REGISTRY_USER (default
#                                      stack-robot), its password random, made once per STACK_DIR;
#                                      `up` pushes base-python there too and writes
#                                      LOCAL_STACK_AUTH_REGISTRY{,_USERNAME,_PASSWORD} into
#                                      $STACK_DIR/env. LS_AUTH_REGISTRY=0: no such registry.
#   PY_METHOD=mmdebstrap|debootstrap|hostclone   how base-python is made (default mmdebstrap,
#                                      falls back to hostclone = copy of host's installed pkgs)
#   PY_PACKAGES="python3 python3-pip python3-venv ca-certificates procps curl"
#   DEBIAN_MIRROR=<from /etc/apt/sources.list*>  SUITE=<VERSION_CODENAME>
#   INJECT_HOST_CA=1                   add /usr/local/share/ca-certificates/*.crt to base-python
#                                      (needed where HTTPS egress goes through a TLS proxy)
#   LOCAL_STACK_CACHE=/var/cache/scenario-run-stack   cache of built base images (docker save|zstd);
#                                      set empty to disable
#   DOCKER=/usr/bin/docker             client (Debian's 20.10 client matches the daemon)
#   LS_ALLOW_DOCKER0_DELETE=0          dockerd --bridge=none deletes an existing "docker0" link
#                                      (e.g. another dockerd's bridge); we refuse unless this is 1
set -Eeuo pipefail

STACK_DIR=${STACK_DIR:-${TMPDIR:-/tmp}/local-stack}
DOCKER_SOCK=${DOCKER_SOCK:-$STACK_DIR/docker.sock}
DOCKER_DATA_ROOT=${DOCKER_DATA_ROOT:-$STACK_DIR/data}
DOCKER_EXEC_ROOT=${DOCKER_EXEC_ROOT:-$STACK_DIR/exec}
DOCKER_PIDFILE=${DOCKER_PIDFILE:-$STACK_DIR/docker.pid}
STORAGE_DRIVER=${STORAGE_DRIVER:-overlay2}
CGROUP_PARENT=${CGROUP_PARENT:-/local-stack}
REGISTRY_ADDR=${LS_REGISTRY_ADDR:-127.0.0.1:5000}
REGISTRY_DIR=${LS_REGISTRY_DIR:-$STACK_DIR/registry}
REGISTRY_STORAGE=${LS_REGISTRY_STORAGE:-$REGISTRY_DIR/storage}
REGISTRY_PIDFILE=${LS_REGISTRY_PIDFILE:-$STACK_DIR/registry.pid}
REG=${REG:-localhost:${REGISTRY_ADDR##*:}}
AUTH_REGISTRY=${LS_AUTH_REGISTRY:-1}
AUTH_REGISTRY_ADDR=${LS_AUTH_REGISTRY_ADDR:-127.0.0.1:$(( ${REGISTRY_ADDR##*:} + 1 ))}
AUTH_REGISTRY_DIR=$STACK_DIR/auth-registry
AUTH_REGISTRY_PIDFILE=$STACK_DIR/auth-registry.pid
AUTH_REGISTRY_USER=${LS_AUTH_REGISTRY_USER:-stack-robot}
AUTH_REG=localhost:${AUTH_REGISTRY_ADDR##*:}
PY_METHOD=${PY_METHOD:-mmdebstrap}
PY_PACKAGES=${PY_PACKAGES:-python3 python3-pip python3-venv ca-certificates procps curl}
INJECT_HOST_CA=${INJECT_HOST_CA:-1}
LOCAL_STACK_CACHE=${LOCAL_STACK_CACHE-/var/cache/scenario-run-stack}
DOCKER=${DOCKER:-/usr/bin/docker}
DOCKERD=${DOCKERD:-/usr/sbin/dockerd}
LOG_DIR=$STACK_DIR/log
TIMINGS=$LOG_DIR/timings.tsv
RECIPE_VERSION=3   # bump to invalidate cached base images

BUSYBOX_REF=$REG/base-busybox:latest
PYTHON_REF=$REG/base-python:latest
NODE_REF=$REG/base-node:latest
NODE_BIN=${NODE_BIN:-/usr/bin/node}
NODE_MODULES=${NODE_MODULES:-/usr/lib/node_modules}
TEMPLATE_REF=$REG/e2e-template:latest

export DOCKER_HOST="unix://$DOCKER_SOCK"

log()  { printf '[local-stack %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die()  { log "ERROR: $*"; exit 1; }
now()  { date +%s.%N; }
since(){ awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }
timing(){ mkdir -p "$LOG_DIR"; printf '%s\t%s\n' "$1" "$2" >> "$TIMINGS"; log "timing: $1 = $2"; }
dk()   { "$DOCKER" "$@"; }

case "$REGISTRY_ADDR" in 127.*|localhost:*) ;; *) die "LS_REGISTRY_ADDR must be loopback (got $REGISTRY_ADDR)";; esac
case "$AUTH_REGISTRY_ADDR" in 127.*|localhost:*) ;; *) die "LS_AUTH_REGISTRY_ADDR must be loopback (got $AUTH_REGISTRY_ADDR)";; esac
[ "$(id -u)" = 0 ] || die "must run as root"

# ---------------------------------------------------------------- packages
pkg_installed() { [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = installed ]; }

ensure_packages() {
  local need=() p
  for p in "$@"; do pkg_installed "$p" || need+=("$p"); done
  [ ${#need[@]} -eq 0 ] && return 0
  log "apt-get install ${need[*]}"
  # Never let package postinst scripts start the *system* dockerd / registry
  # (the system dockerd would create docker0 on 172.17.0.0/16 and bind :5000 on all IFs).
  local added_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; added_policy=1
  fi
  local t0; t0=$(now)
  local aptenv=(env DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1)
  if ! "${aptenv[@]}" apt-get install -y -q --no-install-recommends "${need[@]}" >>"$LOG_DIR/apt.log" 2>&1; then
    log "install failed, running apt-get update and retrying"
    "${aptenv[@]}" apt-get update -q >>"$LOG_DIR/apt.log" 2>&1
    "${aptenv[@]}" apt-get install -y -q --no-install-recommends "${need[@]}" >>"$LOG_DIR/apt.log" 2>&1 \
      || { [ $added_policy = 1 ] && rm -f /usr/sbin/policy-rc.d; die "apt-get install failed, see $LOG_DIR/apt.log"; }
  fi
  [ $added_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
  timing "apt_install(${need[*]})" "$(since "$t0")"
}

# ---------------------------------------------------------------- process helpers
# pid_alive PIDFILE PATTERN: true if the pid in PIDFILE runs and its cmdline contains PATTERN
pid_alive() {
  local pid; pid=$(cat "$1" 2>/dev/null || true)
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "$2"
}
stop_pid() {  # stop_pid PIDFILE PATTERN NAME
  local pid; pid=$(cat "$1" 2>/dev/null || true)
  if pid_alive "$1" "$2"; then
    log "stopping $3 (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do [ -d "/proc/$pid" ] || break; sleep 0.2; done
    [ -d "/proc/$pid" ] && { log "$3 did not exit, SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; }
  fi
  rm -f "$1"
}

# ---------------------------------------------------------------- dockerd
docker_ready() { dk version >/dev/null 2>&1; }

# dockerd --bridge=none DELETES any link named "docker0" when it starts
# (moby daemon_unix.go: removeDefaultBridgeInterface). On a shared host this silently breaks
# the default bridge of another dockerd. Refuse unless explicitly allowed.
guard_docker0() {
  local br=${LS_DEFAULT_BRIDGE_NAME:-docker0}
  ip link show "$br" >/dev/null 2>&1 || return 0
  if [ "${LS_ALLOW_DOCKER0_DELETE:-0}" = 1 ]; then
    log "WARNING: '$br' exists and will be deleted by dockerd --bridge=none (LS_ALLOW_DOCKER0_DELETE=1)"
  else
    die "network link '$br' exists (another dockerd?). dockerd --bridge=none deletes it at startup and breaks that daemon's default bridge. Stop that daemon first, or set LS_ALLOW_DOCKER0_DELETE=1."
  fi
}

start_dockerd() {
  if pid_alive "$DOCKER_PIDFILE" "$DOCKER_SOCK" && docker_ready; then
    log "dockerd already running (pid $(cat "$DOCKER_PIDFILE")) on $DOCKER_SOCK"; return 0
  fi
  pid_alive "$DOCKER_PIDFILE" "$DOCKER_SOCK" && die "dockerd pid $(cat "$DOCKER_PIDFILE") alive but not answering"
  guard_docker0
  rm -f "$DOCKER_PIDFILE" "$DOCKER_SOCK"
  mkdir -p "$DOCKER_DATA_ROOT" "$DOCKER_EXEC_ROOT" "$LOG_DIR"
  echo '{}' > "$STACK_DIR/daemon.json"     # keep any /etc/docker/daemon.json out of it
  local fresh=warm; [ -z "$(ls -A "$DOCKER_DATA_ROOT" 2>/dev/null)" ] && fresh=fresh
  local driver
  for driver in "$STORAGE_DRIVER" vfs; do
    local t0; t0=$(now)
    log "starting dockerd (storage-driver=$driver, data-root=$DOCKER_DATA_ROOT, $fresh)"
    setsid "$DOCKERD" \
      --config-file "$STACK_DIR/daemon.json" \
      --host "unix://$DOCKER_SOCK" \
      --data-root "$DOCKER_DATA_ROOT" \
      --exec-root "$DOCKER_EXEC_ROOT" \
      --pidfile "$DOCKER_PIDFILE" \
      --bridge=none --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
      --cgroup-parent="$CGROUP_PARENT" \
      --storage-driver="$driver" \
      >>"$LOG_DIR/dockerd.log" 2>&1 </dev/null &
    local pid=$!
    for _ in $(seq 1 600); do
      docker_ready && break
      [ -d "/proc/$pid" ] || break
      sleep 0.05
    done
    if docker_ready; then
      timing "dockerd_start_${fresh}_${driver}" "$(since "$t0")"
      return 0
    fi
    log "dockerd with $driver failed; tail of log:"; tail -5 "$LOG_DIR/dockerd.log" >&2 || true
    kill -TERM "$pid" 2>/dev/null || true; sleep 1
    [ "$driver" = vfs ] && break
  done
  die "dockerd did not come up; see $LOG_DIR/dockerd.log"
}

# ---------------------------------------------------------------- registry
registry_ready() { curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1; }

start_registry() {
  local cfg=$REGISTRY_DIR/config.yml
  if pid_alive "$REGISTRY_PIDFILE" "$cfg" && registry_ready; then
    log "registry already running (pid $(cat "$REGISTRY_PIDFILE")) on $REGISTRY_ADDR"; return 0
  fi
  registry_ready && die "something else already answers on $REGISTRY_ADDR"
  mkdir -p "$REGISTRY_DIR" "$REGISTRY_STORAGE" "$LOG_DIR"
  cat > "$cfg" <<EOF
version: 0.1
log:
  level: warn
storage:
  cache:
    blobdescriptor: inmemory
  filesystem:
    rootdirectory: $REGISTRY_STORAGE
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  secret: local-stack-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
  headers:
    X-Content-Type-Options: [nosniff]
EOF
  local t0; t0=$(now)
  setsid env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/bin/docker-registry serve "$cfg" \
    >>"$LOG_DIR/registry.log" 2>&1 </dev/null &
  echo $! > "$REGISTRY_PIDFILE"
  for _ in $(seq 1 200); do registry_ready && break; sleep 0.05; done
  registry_ready || die "registry did not come up; see $LOG_DIR/registry.log"
  timing registry_start "$(since "$t0")"
}

# ---------------------------------------------------------------- authenticated registry
# The same registry binary with htpasswd authentication (bcrypt, as distribution requires):
# every request without the login answers 401 with a Basic challenge.
auth_registry_code() {  # auth_registry_code [USER:PASSWORD] -> HTTP status of GET /v2/
  curl -s -o /dev/null -w '%{http_code}' ${1:+-u "$1"} "http://$AUTH_REGISTRY_ADDR/v2/" 2>/dev/null || true
}
auth_password() { cat "$AUTH_REGISTRY_DIR/password"; }
auth_registry_ready() { [ "$(auth_registry_code "$AUTH_REGISTRY_USER:$(auth_password)")" = 200 ]; }

start_auth_registry() {
  local cfg=$AUTH_REGISTRY_DIR/config.yml
  mkdir -p "$AUTH_REGISTRY_DIR/storage" "$LOG_DIR"
  if [ ! -s "$AUTH_REGISTRY_DIR/password" ]; then
    (umask 077; od -An -N18 -tx1 /dev/urandom | tr -d ' \n' > "$AUTH_REGISTRY_DIR/password")
  fi
  if pid_alive "$AUTH_REGISTRY_PIDFILE" "$cfg" && auth_registry_ready; then
    log "authenticated registry already running (pid $(cat "$AUTH_REGISTRY_PIDFILE")) on $AUTH_REGISTRY_ADDR"; return 0
  fi
  [ "$(auth_registry_code)" = 000 ] || die "something else already answers on $AUTH_REGISTRY_ADDR"
  ensure_packages apache2-utils
  (umask 077; htpasswd -Bbn "$AUTH_REGISTRY_USER" "$(auth_password)" > "$AUTH_REGISTRY_DIR/htpasswd")
  cat > "$cfg" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $AUTH_REGISTRY_DIR/storage
  delete:
    enabled: true
auth:
  htpasswd:
    realm: local-stack
    path: $AUTH_REGISTRY_DIR/htpasswd
http:
  addr: $AUTH_REGISTRY_ADDR
  secret: local-stack-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
EOF
  local t0; t0=$(now)
  setsid env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin /usr/bin/docker-registry serve "$cfg" \
    >>"$LOG_DIR/auth-registry.log" 2>&1 </dev/null &
  echo $! > "$AUTH_REGISTRY_PIDFILE"
  for _ in $(seq 1 200); do auth_registry_ready && break; sleep 0.05; done
  auth_registry_ready || die "authenticated registry did not come up; see $LOG_DIR/auth-registry.log"
  [ "$(auth_registry_code)" = 401 ] || die "the registry on $AUTH_REGISTRY_ADDR answers without a login"
  timing auth_registry_start "$(since "$t0")"
}

# Pushes base-python to the authenticated registry with a login kept out of ~/.docker.
push_to_auth_registry() {
  local conf=$STACK_DIR/docker-config t0; t0=$(now)
  mkdir -p "$conf"
  auth_password | dk --config "$conf" login -u "$AUTH_REGISTRY_USER" --password-stdin "$AUTH_REG" >/dev/null
  dk tag "$PYTHON_REF" "$AUTH_REG/base-python:latest"
  dk --config "$conf" push "$AUTH_REG/base-python:latest" >/dev/null
  dk --config "$conf" logout "$AUTH_REG" >/dev/null 2>&1 || true
  rm -rf "$conf"
  timing push_auth_base-python "$(since "$t0")"
}

# ---------------------------------------------------------------- base images
image_exists() { dk image inspect "$1" >/dev/null 2>&1; }
drop_image() {  # drop_image OLD_ID REF: remove a superseded image unless REF still points at it
  [ -n "$1" ] || return 0
  [ "$(dk image inspect -f '{{.Id}}' "$2" 2>/dev/null || true)" = "$1" ] && return 0
  dk image rm -f "$1" >/dev/null 2>&1 || true
  dk image prune -f >/dev/null 2>&1 || true   # dangling leftovers (private daemon, safe)
}
image_label()  { dk image inspect -f "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true; }

ensure_busybox_image() {
  if image_exists "$BUSYBOX_REF"; then log "$BUSYBOX_REF present"; return 0; fi
  local ctx=$STACK_DIR/ctx/busybox t0; t0=$(now)
  rm -rf "$ctx"; mkdir -p "$ctx/etc"
  cp /bin/busybox "$ctx/busybox"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$ctx/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$ctx/etc/group"
  cat > "$ctx/Dockerfile" <<'EOF'
FROM scratch
COPY busybox /bin/busybox
COPY etc/ /etc/
RUN ["/bin/busybox", "sh", "-c", "/bin/busybox --install -s /bin && mkdir -p /tmp /root && chmod 1777 /tmp"]
ENV PATH=/bin
CMD ["/bin/sh"]
EOF
  dk build -q --force-rm --network none -t "$BUSYBOX_REF" "$ctx" >/dev/null
  timing build_base_busybox "$(since "$t0")"
}

debian_mirror() {
  [ -n "${DEBIAN_MIRROR:-}" ] && { echo "$DEBIAN_MIRROR"; return; }
  local m
  m=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1 || true)
  [ -z "$m" ] && m=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}' | grep -v security | head -1 || true)
  echo "${m:-http://deb.debian.org/debian}"
}
suite() { [ -n "${SUITE:-}" ] && echo "$SUITE" || (. /etc/os-release; echo "${VERSION_CODENAME:-bookworm}"); }

host_cas() { [ "$INJECT_HOST_CA" = 1 ] && ls /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; }

# rootfs tarball builders: $1 = output tar
build_rootfs_mmdebstrap() {
  local cas; cas=$(host_cas | tr '\n' ' ')
  mmdebstrap --variant=minbase --include="$(echo $PY_PACKAGES | tr ' ' ,)" \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="for c in $cas; do mkdir -p \"\$1/usr/local/share/ca-certificates\"; cp \"\$c\" \"\$1/usr/local/share/ca-certificates/\"; done; [ -z '$cas' ] || chroot \"\$1\" update-ca-certificates >/dev/null 2>&1" \
    --customize-hook='rm -f "$1"/var/cache/apt/*.bin' \
    "$(suite)" "$1" "$(debian_mirror)" >>"$LOG_DIR/rootfs.log" 2>&1
}

build_rootfs_debootstrap() {
  local root=$STACK_DIR/rootfs-debootstrap c
  rm -rf "$root"; mkdir -p "$STACK_DIR/debcache"
  debootstrap --variant=minbase --include="$(echo $PY_PACKAGES | tr ' ' ,)" \
    --cache-dir="$STACK_DIR/debcache" "$(suite)" "$root" "$(debian_mirror)" >>"$LOG_DIR/rootfs.log" 2>&1 || return 1
  for c in $(host_cas); do mkdir -p "$root/usr/local/share/ca-certificates"; cp "$c" "$root/usr/local/share/ca-certificates/"; done
  [ -n "$(host_cas)" ] && chroot "$root" update-ca-certificates >/dev/null 2>&1
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar -C "$root" --numeric-owner -cf "$1" . || return 1
  rm -rf "$root"
}

# Fully offline: copy the host's *installed* Debian packages (dependency closure of
# PY_PACKAGES + a minimal base) into a rootfs, with a matching dpkg database.
build_rootfs_hostclone() {
  local base="base-files base-passwd bash dash coreutils debianutils diffutils findutils grep gzip sed tar mawk hostname login passwd util-linux apt dpkg ncurses-base usr-is-merged libc-bin"
  local stage; stage=$(mktemp -d "$STACK_DIR/hostclone.XXXXXX")
  local pkgs inst p n
  # shellcheck disable=SC2086
  pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
          --no-replaces --no-enhances $base $PY_PACKAGES 2>/dev/null | grep -E '^[a-z0-9]' | sort -u)
  # shellcheck disable=SC2086
  inst=$(dpkg-query -W -f='${binary:Package} ${db:Status-Status}\n' $pkgs 2>/dev/null \
          | awk '$2=="installed"{print $1}' | sort -u || true)
  for p in $PY_PACKAGES; do pkg_installed "$p" || { log "hostclone: $p is not installed on the host"; return 1; }; done
  for p in $inst; do dpkg -L "$p"; done | python3 -c '
import os, sys
seen = set()
for line in sys.stdin:
    p = line.rstrip("\n")
    if not p.startswith("/") or p == "/.": continue
    q = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))  # merged-/usr
    if os.path.lexists(q) and q not in seen:
        seen.add(q); print(q[1:])
' > "$stage.list"
  tar -C / --no-recursion -cf - -T "$stage.list" | tar -C "$stage" -xpf - || return 1
  ( cd "$stage"
    for l in bin sbin lib lib64; do [ -e "$l" ] || ln -s "usr/$l" "$l"; done
    mkdir -p proc sys dev run root tmp var/tmp home etc/ssl var/lib/dpkg/info \
             var/lib/apt/lists/partial var/cache/apt/archives/partial
    chmod 1777 tmp var/tmp; chmod 700 root
    rm -rf usr/share/doc/* usr/share/man/* usr/share/locale/*
    cp -a /etc/ssl/certs etc/ssl/       # generated bundle, already contains host's extra CAs
    cp /usr/share/base-passwd/passwd.master etc/passwd
    cp /usr/share/base-passwd/group.master etc/group
    cp -a /etc/apt/sources.list.d/debian.sources etc/apt/sources.list.d/ 2>/dev/null \
      || echo "deb $(debian_mirror) $(suite) main" > etc/apt/sources.list
    # shellcheck disable=SC2086
    dpkg-query -s $inst > var/lib/dpkg/status
    for p in $inst; do n=${p%%:*}; cp -a /var/lib/dpkg/info/"$n".* /var/lib/dpkg/info/"$n":*.* var/lib/dpkg/info/ 2>/dev/null || true; done )
  chroot "$stage" /sbin/ldconfig || return 1
  chroot "$stage" python3 -c 'import ssl, json' || return 1   # sanity check
  tar -C "$stage" --numeric-owner -cf "$1" . || return 1
  rm -rf "$stage" "$stage.list"
}

registry_has_tag() {  # registry_has_tag NAME TAG
  curl -fsS -o /dev/null -I \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "http://$REGISTRY_ADDR/v2/$1/manifests/$2" 2>/dev/null
}

python_key() {
  { echo "v$RECIPE_VERSION $PY_METHOD $(suite) $PY_PACKAGES"
    [ "$PY_METHOD" = hostclone ] && dpkg-query -W -f='${Package}=${Version}\n' $PY_PACKAGES 2>/dev/null
    for c in $(host_cas); do sha256sum < "$c"; done; } | sha256sum | cut -c1-16
}

ensure_python_image() {
  local key; key=$(python_key)
  if image_exists "$PYTHON_REF" && [ "$(image_label "$PYTHON_REF" local-stack.key)" = "$key" ]; then
    log "$PYTHON_REF present (key $key)"; return 0
  fi
  local old_id; old_id=$(dk image inspect -f '{{.Id}}' "$PYTHON_REF" 2>/dev/null || true)
  # the registry (e.g. a persistent LS_REGISTRY_STORAGE) may already hold this recipe as :<key>
  if registry_has_tag base-python "$key"; then
    local t0; t0=$(now)
    log "pulling base-python:$key from the registry"
    if dk pull -q "$REG/base-python:$key" >/dev/null && dk tag "$REG/base-python:$key" "$PYTHON_REF" \
       && [ "$(image_label "$PYTHON_REF" local-stack.key)" = "$key" ]; then
      timing pull_base_python_from_registry_cache "$(since "$t0")"
      drop_image "$old_id" "$PYTHON_REF"; return 0
    fi
  fi
  local cache=""
  [ -n "$LOCAL_STACK_CACHE" ] && cache=$LOCAL_STACK_CACHE/base-python-$key.tar.zst
  if [ -n "$cache" ] && [ -s "$cache" ]; then
    local t0; t0=$(now)
    log "loading $PYTHON_REF from cache $cache"
    if zstd -dc "$cache" | dk load -q >/dev/null && [ "$(image_label "$PYTHON_REF" local-stack.key)" = "$key" ]; then
      timing load_base_python_from_cache "$(since "$t0")"
      drop_image "$old_id" "$PYTHON_REF"; return 0
    fi
    log "cache file unusable, rebuilding"; rm -f "$cache"
  fi
  local method=$PY_METHOD tar=$STACK_DIR/base-python-rootfs.tar t0; t0=$(now)
  log "building base-python rootfs with $method (mirror $(debian_mirror), suite $(suite))"
  if ! "build_rootfs_$method" "$tar"; then
    [ "$method" = hostclone ] && die "hostclone failed"
    log "$method failed (see $LOG_DIR/rootfs.log); falling back to hostclone (offline)"
    method=hostclone; rm -f "$tar"; build_rootfs_hostclone "$tar" || die "hostclone failed too"
    key="$key-fallback"   # never matches a computed key: next run retries $PY_METHOD
  fi
  timing "rootfs_$method" "$(since "$t0")"
  t0=$(now)
  dk import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL local-stack.key=$key local-stack.method=$method" \
    --change 'CMD ["/bin/bash"]' \
    "$tar" "$PYTHON_REF" >/dev/null
  rm -f "$tar"
  timing docker_import_base_python "$(since "$t0")"
  drop_image "$old_id" "$PYTHON_REF"
  if [ -n "$cache" ] && [ "$method" = "$PY_METHOD" ]; then   # never cache a fallback build
    t0=$(now); mkdir -p "$LOCAL_STACK_CACHE"
    rm -f "$LOCAL_STACK_CACHE"/base-python-*.tar.zst   # keep only the current key
    dk save "$PYTHON_REF" | zstd -q -T0 -3 > "$cache.tmp" && mv "$cache.tmp" "$cache"
    timing save_base_python_to_cache "$(since "$t0")"
  fi
}

# base-node: base-python plus the host's Node (the Debian/nodesource package `nodejs`: one
# binary needing only libc/libstdc++, which base-python has, plus npm's and corepack's module
# dirs and the shims). Offline: nothing is fetched. Rebuilt only when the key (node's and
# npm's versions, the base-python image) changes.
node_key() {
  { echo "v$RECIPE_VERSION n2"; "$NODE_BIN" --version; sha256sum < "$NODE_MODULES/npm/package.json"
    dk image inspect -f '{{.Id}}' "$PYTHON_REF"; } | sha256sum | cut -c1-16
}

ensure_node_image() {
  [ -x "$NODE_BIN" ] && [ -d "$NODE_MODULES/npm" ] || { log "no host Node at $NODE_BIN: skipping $NODE_REF"; return 0; }
  local key old ctx=$STACK_DIR/ctx/node t0; key=$(node_key); t0=$(now)
  if [ "$(image_label "$NODE_REF" local-stack.key)" = "$key" ]; then log "$NODE_REF present (key $key)"; return 0; fi
  old=$(dk image inspect -f '{{.Id}}' "$NODE_REF" 2>/dev/null || true)
  rm -rf "$ctx"; mkdir -p "$ctx/node_modules"
  cp "$NODE_BIN" "$ctx/node"
  cp -a "$NODE_MODULES/npm" "$ctx/node_modules/"
  if [ -d "$NODE_MODULES/corepack" ]; then cp -a "$NODE_MODULES/corepack" "$ctx/node_modules/"; fi
  cat > "$ctx/Dockerfile" <<EOF
FROM $PYTHON_REF
LABEL local-stack.key=$key
COPY node /usr/bin/node
COPY node_modules/ /usr/lib/node_modules/
# Node has its own CA list: make it trust the system store (which carries the host's CAs).
ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
RUN ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/bin/npm \\
 && ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/bin/npx \\
 && if [ -d /usr/lib/node_modules/corepack ]; then ln -sf ../lib/node_modules/corepack/dist/corepack.js /usr/bin/corepack; fi \\
 && node --version && npm --version
EOF
  dk build -q --force-rm --network none -t "$NODE_REF" "$ctx" >/dev/null || die "building $NODE_REF failed"
  drop_image "$old" "$NODE_REF"
  timing build_base_node "$(since "$t0")"
}

push_images() {
  local ref t0
  for ref in "$@"; do
    t0=$(now); dk push "$ref" >/dev/null; timing "push_${ref##*/}" "$(since "$t0")"
  done
}

# ---------------------------------------------------------------- commands
cmd_up() {
  mkdir -p "$STACK_DIR" "$LOG_DIR"
  ensure_packages docker.io docker-registry busybox-static curl zstd ca-certificates python3 iproute2
  case "$PY_METHOD" in
    mmdebstrap)  ensure_packages mmdebstrap ;;
    debootstrap) ensure_packages debootstrap ;;
    # shellcheck disable=SC2086  # hostclone copies the host's installed packages
    hostclone)   ensure_packages $PY_PACKAGES ;;
  esac
  start_dockerd
  start_registry
  ensure_busybox_image
  ensure_python_image
  ensure_node_image
  local key; key=$(image_label "$PYTHON_REF" local-stack.key)
  dk tag "$PYTHON_REF" "$REG/base-python:$key"
  push_images "$BUSYBOX_REF" "$PYTHON_REF" "$REG/base-python:$key"
  if image_exists "$NODE_REF"; then push_images "$NODE_REF"; fi
  printf 'export DOCKER_HOST=%q\nexport LOCAL_STACK_REGISTRY=%q\n' "$DOCKER_HOST" "$REG" > "$STACK_DIR/env"
  if [ "$AUTH_REGISTRY" != 0 ]; then
    start_auth_registry
    push_to_auth_registry
    printf 'export LOCAL_STACK_AUTH_REGISTRY=%q\nexport LOCAL_STACK_AUTH_REGISTRY_USERNAME=%q\nexport LOCAL_STACK_AUTH_REGISTRY_PASSWORD=%q\n' \
      "$AUTH_REG" "$AUTH_REGISTRY_USER" "$(auth_password)" >> "$STACK_DIR/env"
    chmod 600 "$STACK_DIR/env"
  fi
  log "up: DOCKER_HOST=$DOCKER_HOST registry=$REGISTRY_ADDR images: $BUSYBOX_REF $PYTHON_REF $NODE_REF"
  log "    source $STACK_DIR/env   # in CI scripts"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END{ if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2 }'; }
ms_loop() {  # ms_loop N cmd... -> prints list of ms
  local n=$1 a b out=""; shift
  for _ in $(seq 1 "$n"); do a=$(date +%s%N); "$@" >/dev/null; b=$(date +%s%N); out+="$(( (b-a)/1000000 )) "; done
  echo "$out"
}

cmd_selftest() {
  docker_ready && registry_ready || die "stack not up; run: $0 up"
  local t0 ref d_push d_pull rmout
  # 1. push/pull round trip: push, delete local copy, pull back, compare digests
  dk image rm -f "$TEMPLATE_REF" "$TEMPLATE_REF-bk" >/dev/null 2>&1 || true
  for ref in "$BUSYBOX_REF" "$PYTHON_REF"; do
    d_push=$(dk push "$ref" | awk '/digest: /{print $3}')
    rmout=$(dk image rm -f "$(dk image inspect -f '{{.Id}}' "$ref")")   # all tags + layers
    grep -q '^Deleted: ' <<<"$rmout" || die "$ref was only untagged (other tags/children); cannot prove pull"
    image_exists "$ref" && die "$ref still present after rmi"
    t0=$(now); dk pull -q "$ref" >/dev/null; timing "pull_${ref##*/}" "$(since "$t0")"
    d_pull=$(dk image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$ref" | awk -F@ '{print $2}' | head -1)
    [ -n "$d_push" ] && [ "$d_push" = "$d_pull" ] || die "digest mismatch for $ref: pushed=$d_push pulled=$d_pull"
    log "round trip OK: $ref $d_pull"
  done
  log "registry catalog: $(curl -fsS "http://$REGISTRY_ADDR/v2/_catalog")"

  # 2. run containers (host network; loopback registry reachable from inside)
  dk run --rm --network host "$BUSYBOX_REF" sh -c \
     'echo "busybox: $(uname -sr) uid=$(id -u)"; wget -q -O- http://127.0.0.1:'"${REGISTRY_ADDR##*:}"'/v2/_catalog; echo'
  dk run --rm --network host "$PYTHON_REF" python3 -c \
     'import sys,platform,urllib.request as u; print("python", platform.python_version(), open("/etc/debian_version").read().strip(), u.urlopen("http://127.0.0.1:'"${REGISTRY_ADDR##*:}"'/v2/_catalog").read().decode().strip())'

  # 3. real docker build FROM base-python that pip-installs from PyPI (needs --network host)
  local ctx=$STACK_DIR/ctx/template
  rm -rf "$ctx"; mkdir -p "$ctx"
  cat > "$ctx/Dockerfile" <<EOF
FROM $PYTHON_REF
RUN python3 -m venv /opt/venv \\
 && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check six==1.16.0
ENV PATH=/opt/venv/bin:\$PATH
CMD ["python", "-c", "import six, sys; print('template ok: six', six.__version__, sys.prefix)"]
EOF
  t0=$(now); dk build -q --force-rm --network host -t "$TEMPLATE_REF" "$ctx" >/dev/null
  timing build_template_legacy_pip "$(since "$t0")"
  dk run --rm --network host "$TEMPLATE_REF"
  t0=$(now); DOCKER_BUILDKIT=1 dk build -q --no-cache --network host -t "$TEMPLATE_REF-bk" "$ctx" >/dev/null
  timing build_template_buildkit_pip "$(since "$t0")"
  dk run --rm --network host "$TEMPLATE_REF-bk"
  push_images "$TEMPLATE_REF"

  # 4. latencies
  local l
  l=$(ms_loop 10 dk run --rm --network host "$BUSYBOX_REF" true);  log "run busybox true ms: $l"
  timing run_rm_busybox_true_median_ms "$(echo "$l" | median)"
  l=$(ms_loop 10 dk run --rm --network host "$PYTHON_REF" true);   log "run python true ms: $l"
  timing run_rm_python_true_median_ms "$(echo "$l" | median)"
  l=$(ms_loop 5 dk run --rm --network host "$PYTHON_REF" python3 -c 'print(1)'); log "run python3 -c ms: $l"
  timing run_rm_python3_print_median_ms "$(echo "$l" | median)"
  dk rm -f ls-exec >/dev/null 2>&1 || true
  dk run -d --name ls-exec --network host "$PYTHON_REF" sleep 600 >/dev/null
  l=$(ms_loop 10 dk exec ls-exec true); log "exec true ms: $l"
  timing exec_true_median_ms "$(echo "$l" | median)"
  dk rm -f ls-exec >/dev/null
  check_no_bridge_networks
  log "selftest OK; disk: $(du -sh "$DOCKER_DATA_ROOT" | cut -f1) data-root, $(du -sh "$REGISTRY_STORAGE" | cut -f1) registry"
  dk images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -v '<none>' >&2
}

cmd_podman() {
  registry_ready || die "registry not up; run: $0 up"
  ensure_packages podman
  local pd=$STACK_DIR/podman nofile nproc
  mkdir -p "$pd/root" "$pd/run" "$pd/tmp"
  # No CAP_SYS_RESOURCE here: podman lowers its own RLIMIT_NPROC to 32768 and then cannot
  # raise rlimits for the container -> pin ulimits to values <= the current hard limits.
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
  [ "$nofile" = unlimited ] && nofile=1048576
  cat > "$pd/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
netns = "host"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$pd/events.log"
tmp_dir = "$pd/tmp"
EOF
  export CONTAINERS_CONF=$pd/containers.conf
  local P=(podman --root "$pd/root" --runroot "$pd/run" --storage-driver overlay) t0 l
  t0=$(now); "${P[@]}" pull -q --tls-verify=false "$PYTHON_REF" >/dev/null; timing podman_pull_python "$(since "$t0")"
  "${P[@]}" pull -q --tls-verify=false "$BUSYBOX_REF" >/dev/null
  "${P[@]}" run --rm --network host "$BUSYBOX_REF" sh -c 'echo "podman busybox ok: $(uname -r)"'
  "${P[@]}" run --rm --network host "$PYTHON_REF" python3 -c 'import platform; print("podman python", platform.python_version())'
  local ctx=$STACK_DIR/ctx/template
  [ -f "$ctx/Dockerfile" ] || die "run selftest first (creates $ctx)"
  t0=$(now); "${P[@]}" build -q --tls-verify=false --network host -t "$REG/e2e-template-podman:latest" "$ctx" >/dev/null
  timing podman_build_template_pip "$(since "$t0")"
  "${P[@]}" run --rm --network host "$REG/e2e-template-podman:latest"
  "${P[@]}" push -q --tls-verify=false "$REG/e2e-template-podman:latest"
  l=$(ms_loop 10 "${P[@]}" run --rm --network host "$BUSYBOX_REF" true); log "podman run true ms: $l"
  timing podman_run_rm_true_median_ms "$(echo "$l" | median)"
  "${P[@]}" rm -f -t 0 ls-pexec >/dev/null 2>&1 || true
  "${P[@]}" run -d --name ls-pexec --network host "$BUSYBOX_REF" sleep 600 >/dev/null
  l=$(ms_loop 10 "${P[@]}" exec ls-pexec true); log "podman exec true ms: $l"
  timing podman_exec_true_median_ms "$(echo "$l" | median)"
  "${P[@]}" rm -f -t 0 ls-pexec >/dev/null
  log "podman OK"
}

# Policy guard: with --bridge=none there is no default bridge, but "docker network create"
# (or a compose file without network_mode: host) could still create a bridge on a private range.
check_no_bridge_networks() {
  local n; n=$(dk network ls -q --filter driver=bridge)
  [ -z "$n" ] || die "bridge network(s) exist on our dockerd (policy: loopback only): $(dk network ls --filter driver=bridge --format '{{.Name}}' | tr '\n' ' ')"
}

cmd_status() {
  if pid_alive "$DOCKER_PIDFILE" "$DOCKER_SOCK"; then echo "dockerd: pid $(cat "$DOCKER_PIDFILE") $DOCKER_HOST"; else echo "dockerd: down"; fi
  if pid_alive "$REGISTRY_PIDFILE" "$REGISTRY_DIR/config.yml"; then echo "registry: pid $(cat "$REGISTRY_PIDFILE") http://$REGISTRY_ADDR"; else echo "registry: down"; fi
  if pid_alive "$AUTH_REGISTRY_PIDFILE" "$AUTH_REGISTRY_DIR/config.yml"; then echo "authenticated registry: pid $(cat "$AUTH_REGISTRY_PIDFILE") http://$AUTH_REGISTRY_ADDR (user $AUTH_REGISTRY_USER)"; else echo "authenticated registry: down"; fi
  if docker_ready; then
    dk ps --format '{{.ID}} {{.Image}} {{.Status}}'
    check_no_bridge_networks && echo "networks: no bridge networks (ok)"
  fi
}

cmd_down() {
  local purge=${1:-}
  if pid_alive "$DOCKER_PIDFILE" "$DOCKER_SOCK" && docker_ready; then
    # remove our containers first so no containerd-shim outlives dockerd
    dk ps -aq | xargs -r "$DOCKER" rm -f >/dev/null 2>&1 || true
  fi
  if [ -d "$STACK_DIR/podman/root" ] && command -v podman >/dev/null; then
    CONTAINERS_CONF=$STACK_DIR/podman/containers.conf podman --root "$STACK_DIR/podman/root" \
      --runroot "$STACK_DIR/podman/run" rm -a -f -t 0 >/dev/null 2>&1 || true
  fi
  stop_pid "$REGISTRY_PIDFILE" "$REGISTRY_DIR/config.yml" registry
  stop_pid "$AUTH_REGISTRY_PIDFILE" "$AUTH_REGISTRY_DIR/config.yml" "authenticated registry"
  stop_pid "$DOCKER_PIDFILE" "$DOCKER_SOCK" dockerd
  if [ "$purge" = --purge ]; then
    case "$STACK_DIR" in /|"") die "refusing to purge STACK_DIR='$STACK_DIR'";; esac
    # unmount anything still mounted below STACK_DIR (overlay layers, shm), deepest first
    awk -v d="$STACK_DIR/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    rm -rf "$STACK_DIR"
    log "purged $STACK_DIR (cache in ${LOCAL_STACK_CACHE:-<disabled>} kept)"
  fi
}

case "${1:-up}" in
  up)       cmd_up ;;
  selftest) cmd_selftest ;;
  podman)   cmd_podman ;;
  env)      echo "export DOCKER_HOST=$DOCKER_HOST"; echo "export LOCAL_STACK_REGISTRY=$REG"
            if [ "$AUTH_REGISTRY" != 0 ] && [ -s "$AUTH_REGISTRY_DIR/password" ]; then
              echo "export LOCAL_STACK_AUTH_REGISTRY=$AUTH_REG"
              echo "export LOCAL_STACK_AUTH_REGISTRY_USERNAME=$AUTH_REGISTRY_USER"
              echo "export LOCAL_STACK_AUTH_REGISTRY_PASSWORD=$(auth_password)"
            fi ;;
  status)   cmd_status ;;
  down)     cmd_down "${2:-}" ;;
  *) echo "usage: $0 {up|selftest|podman|env|status|down [--purge]}" >&2; exit 2 ;;
esac

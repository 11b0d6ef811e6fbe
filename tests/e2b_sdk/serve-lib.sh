# Sourced by run.sh and official.sh: start and stop `scenario-run serve` for an SDK run.
#   serve_start BIN LOGDIR [serve flags…]  starts it on a free loopback port with a random key
#                                          and its CA in LOGDIR/ca, waits until it listens,
#                                          exports the E2B_* variables the SDKs read and the CA
#                                          bundle they trust for https port hosts
#                                          (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS);
#                                          sets $server_pid and $server_log
#   serve_stop                             stops it (TERM, then KILL after 10 s), by PID
#   serve_clean_exit                       true if its log says it destroyed its sandboxes

serve_start() {
  local bin="$1" logs="$2"
  shift 2
  local port key
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  key="e2b_$(python3 -c 'import secrets; print(secrets.token_hex(20))')"
  server_log="$logs/serve.log"
  # The key from the environment: a flag's value is readable in /proc/<pid>/cmdline.
  E2B_API_KEY="$key" "$bin" serve --listen "127.0.0.1:$port" --ca-dir "$logs/ca" "$@" >"$logs/serve.stdout" 2>"$server_log" &
  server_pid=$!
  for _ in $(seq 1 100); do
    grep -q "^listening on http://127.0.0.1:$port" "$logs/serve.stdout" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "^listening on" "$logs/serve.stdout" 2>/dev/null; then
    echo "the server did not start:" >&2
    cat "$server_log" >&2
    return 1
  fi
  echo "$(cat "$logs/serve.stdout") (pid $server_pid)"
  export E2B_API_KEY="$key"
  export E2B_API_URL="http://127.0.0.1:$port"
  export E2B_SANDBOX_URL="http://127.0.0.1:$port"
  export E2B_DOMAIN="localhost:$port"
  unset E2B_DEBUG E2B_ACCESS_TOKEN
  # The SDKs reach a port as https://<port>-<id>.localhost:<port>: trust serve's CA, beside
  # the system's (SSL_CERT_FILE replaces Python's store; NODE_EXTRA_CA_CERTS adds to Node's).
  local system=/etc/ssl/certs/ca-certificates.crt
  { [ -r "$system" ] && cat "$system"; cat "$logs/ca/ca.pem"; } >"$logs/ca-bundle.pem" || return 1
  export SSL_CERT_FILE="$logs/ca-bundle.pem" REQUESTS_CA_BUNDLE="$logs/ca-bundle.pem"
  export NODE_EXTRA_CA_CERTS="$logs/ca/ca.pem"
  getent hosts "$port-probe.localhost" >/dev/null || {
    echo "*.localhost does not resolve here (install libnss-myhostname: scripts/setup)" >&2
    return 1
  }
}

serve_stop() {
  [ -n "${server_pid:-}" ] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid"
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$server_pid" 2>/dev/null && kill -KILL "$server_pid"
  fi
  wait "$server_pid" 2>/dev/null
  server_pid=
}

serve_clean_exit() {
  grep -q "destroyed" "$server_log"
}

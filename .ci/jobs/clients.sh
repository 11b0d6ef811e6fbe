#!/usr/bin/env bash
# Job `clients`: the real clients users call, driven from scenarios against `scenario-run
# serve` with the `e2b` and the `alicloud` preset: the official E2B Python SDK and CLI (npm
# @e2b/cli), and the product's own client (PyPI agent-sandbox-client: its Sandbox API, the
# @sandbox decorator, and @sandbox.register's call through a sandbox's https port host).
#
# What they need from serve, as tests/clients.rs gives it: --allow-public-traffic (E2B's
# default: the product client sends no traffic token to a port), and https on the port hosts
# with serve's CA trusted by the clients (SSL_CERT_FILE and REQUESTS_CA_BUNDLE for Python,
# NODE_EXTRA_CA_CERTS for Node; the system's roots, and any the caller set, included so pip
# and npm still reach their registries).
# E2B_SANDBOX_URL is set, as for every local E2B endpoint: envd traffic goes to serve, and
# agent-sandbox-client.yaml picks `base` for @sandbox's own sandbox (serve has no official
# code interpreter). Every scenario must PASS: a SKIPPED one (say, npm missing) fails the job,
# since a client job that ran no client is not a green one.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
job=clients
scenarios=(scenarios/official/e2b-python-sdk.yaml scenarios/official/e2b-cli.yaml scenarios/declarative/agent-sandbox-client.yaml)
as_root scripts/setup >&2 || finish $job 1
bin=$(scenario_run_bin) || finish $job 1
run_id=${E2E_RUN_ID:-ci-clients-$$}
key="e2b_$(od -An -tx1 -N20 /dev/urandom | tr -d ' \n')"
if [ "${GITHUB_ACTIONS:-}" = true ]; then echo "::add-mask::$key"; fi
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
tls=$(mktemp -d /tmp/sr-clients-ca.XXXXXX)
mkdir -p reports
# serve over local sandboxes needs root, as the local job does; its key comes through the
# environment (not the command line, which `ps` shows).
# Started directly (not through a shell function, whose subshell would be the pid to stop).
serve_args=(serve --listen "127.0.0.1:$port" --ca-dir "$tls/ca" --allow-public-traffic)
if [ "$(id -u)" -eq 0 ]; then
  E2B_API_KEY=$key "$bin" "${serve_args[@]}" >reports/serve.log 2>&1 &
else
  E2B_API_KEY=$key sudo --preserve-env=PATH,E2B_API_KEY "$bin" "${serve_args[@]}" >reports/serve.log 2>&1 &
fi
serve_pid=$!
stop_serve() {
  as_root kill -TERM "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
  rm -rf "$tls"
}
trap stop_serve EXIT
up=
for _ in $(seq 600); do
  if curl -sf "$url/health" >/dev/null && [ -s "$tls/ca/ca.pem" ]; then up=1; break; fi
  kill -0 "$serve_pid" 2>/dev/null || break
  sleep 0.2
done
if [ -z "$up" ]; then
  echo "clients: serve did not come up on $url; its log:" >&2
  tail -n 40 reports/serve.log >&2
  finish $job 1
fi
# The roots the clients trust: the system's, those the caller already points them at (a TLS
# proxy's, say), and serve's CA.
for f in /etc/ssl/certs/ca-certificates.crt "${SSL_CERT_FILE:-}" "${NODE_EXTRA_CA_CERTS:-}" "$tls/ca/ca.pem"; do
  if [ -n "$f" ] && [ -f "$f" ]; then cat "$f"; echo; fi
done >"$tls/bundle.pem"
# The clients are the pinned judges (tests/judges: e2b, agent-sandbox-client, e2b-cli), not
# whatever the registries hold today: the scenarios take them from these variables.
root=$PWD target=${CARGO_TARGET_DIR:-$PWD/target}
source tests/judges/lib.sh
E2B_SDK_PYTHON=$(judge_venv e2b) && AGENT_SANDBOX_CLIENT_PYTHON=$(judge_venv agent-sandbox-client) \
  && judge_npm e2b-cli "$target/judges-npm/e2b-cli" || finish $job 1
export E2B_SDK_PYTHON AGENT_SANDBOX_CLIENT_PYTHON E2B_CLI="$target/judges-npm/e2b-cli/node_modules/.bin/e2b"
rc=0
for preset in e2b alicloud; do
  if [ "$preset" = e2b ]; then
    vars=("E2B_API_KEY=$key" "E2B_API_URL=$url" "E2B_DOMAIN=localhost:$port")
  else
    vars=("ABX_SANDBOX_API_KEY=$key" "ABX_SANDBOX_BASE_URL=$url" "ABX_SANDBOX_DOMAIN=localhost:$port")
  fi
  report=reports/run-$preset.json
  # The clients run on this machine as the caller (no root needed); serve is the one as root.
  env "${vars[@]}" "E2B_SANDBOX_URL=$url" "E2E_RUN_ID=$run_id-$preset" \
    "SSL_CERT_FILE=$tls/bundle.pem" "REQUESTS_CA_BUNDLE=$tls/bundle.pem" "NODE_EXTRA_CA_CERTS=$tls/bundle.pem" \
    "$bin" --provider "$preset" "${scenarios[@]}" --no-progress --junit "reports/junit-$preset.xml" \
    --json "$report" --evidence "reports/evidence-$preset" --html "reports/report-$preset.html" || rc=1
  # Every client scenario ran and passed: a skip here would be a client never tried.
  not_passed=$(python3 - "$report" <<'PY'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    print(f"no report: {e}")
    sys.exit()
for r in doc["results"]:
    if r["outcome"] != "passed":
        print(f'{r["name"]}: {r["outcome"].upper()} {r.get("reason") or ""}')
PY
)
  if [ -n "$not_passed" ]; then
    echo "clients ($preset): every client scenario must pass here; these did not:" >&2
    echo "$not_passed" >&2
    rc=1
  fi
done
finish $job $rc

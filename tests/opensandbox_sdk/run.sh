#!/usr/bin/env bash
# `scenario-run serve` speaking OpenSandbox's protocol (issue 29), judged by OpenSandbox's own
# Python end-to-end suite: tests/python of alibaba/OpenSandbox at the commit
# tests/judges/opensandbox/suite pins, unmodified, run with the SDKs from PyPI (`opensandbox`,
# `opensandbox-code-interpreter`, pinned with the suite's test tools in
# tests/judges/opensandbox/requirements.txt). What needs something that cannot
# run here is deselected by name, each with its reason (deselect.txt), printed on every run;
# the tests written for the SDK of the suite's own commit that PyPI's 1.1.1 does not fit are run
# again against that SDK (built from the same commit), so they still judge the server.
#
#   tests/opensandbox_sdk/run.sh [PYTEST ARGS…]
#   OPENSANDBOX_REPO  the alibaba/OpenSandbox repository: a checkout or a bare git directory,
#                     used when GitHub is out of reach (tests/judges/lib.sh: a clone of the
#                     pinned commit first, then this, then ../.mirror/alibaba+OpenSandbox/repo
#                     beside the checkout); without any the suite is SKIPPED, saying so
#                     loudly; one without the pinned commit FAILS
#   JUDGES_DIR        the pins (default tests/judges; scripts/judges-latest sets the newest)
#   SKIP_BUILD=1      do not run `cargo build` first
#   JOBS              pytest-xdist workers, whole test classes per worker (default 2)
# Venvs under target/e2b-venvs/, the suite under target/opensandbox-sdk/, logs in
# target/e2b-sdk-logs/opensandbox/. Exits non-zero if anything failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venvs="$target/e2b-venvs"
work="$target/opensandbox-sdk"
logs="$target/e2b-sdk-logs/opensandbox"
jobs="${JOBS:-2}"
mkdir -p "$venvs" "$work" "$logs"
cd "$root"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CARGO_TARGET_DIR="$target" cargo build --quiet || { echo "opensandbox_sdk/run.sh: cargo build failed" >&2; exit 1; }
fi
bin="$target/debug/scenario-run"

. "$root/tests/judges/lib.sh"
judge_suite opensandbox OPENSANDBOX_REPO
case $? in
  0) ;;
  2)
    echo "== SKIPPED, LOUDLY: OpenSandbox's e2e suite does not run: github.com is out of reach, OPENSANDBOX_REPO is not set and there is no ../.mirror/alibaba+OpenSandbox/repo beside the checkout" >&2
    echo "opensandbox_sdk/run.sh: SKIPPED"
    exit 0
    ;;
  *) echo "opensandbox_sdk/run.sh: FAILED: the pinned suite is not available (above)" >&2; exit 1 ;;
esac
commit="$suite_commit" git_dir="$suite_git"
echo "== the suite: $suite_repo at $commit, from $suite_from"
# The suite (tests/python), and the SDK of the same commit for the tests written for it.
suite="$work/suite-${commit:0:12}"
if [ ! -d "$suite/tests" ]; then
  rm -rf "$suite.tmp" && mkdir -p "$suite.tmp"
  git --git-dir="$git_dir" archive "$commit" tests/python sdks/sandbox/python 2>/dev/null | tar -x -C "$suite.tmp" \
    && [ -d "$suite.tmp/tests/python/tests" ] || { echo "opensandbox_sdk/run.sh: cannot extract the suite" >&2; exit 1; }
  mv "$suite.tmp/tests/python" "$suite" && mv "$suite.tmp/sdks/sandbox/python" "$suite/.sdk" && rm -rf "$suite.tmp"
fi

# The suite's own test dependencies (its pyproject) with the SDKs from PyPI, pinned; and the
# same with the SDK of the suite's commit installed over PyPI's.
py="$(judge_venv opensandbox)" || { echo "opensandbox_sdk/run.sh: cannot install the pinned opensandbox" >&2; exit 1; }
py_checkout="$(judge_venv opensandbox "$suite/.sdk")" \
  || { echo "opensandbox_sdk/run.sh: cannot install the SDK of $commit" >&2; exit 1; }
version() { "$1" -c "import importlib.metadata as m; print(m.version('$2'))"; }
sdk_version="$(version "$py" opensandbox)"
ci_version="$(version "$py" opensandbox-code-interpreter)"

# The volumes the suite binds, prepared as its own scripts/python-e2e.sh does: a host
# directory with a marker (0777 here: a sandbox's root is an unprivileged user of this host,
# not the host's root as in Docker), the execd log directory, and the named volume
# `opensandbox-e2e-pvc-test`, seeded below through the SDK itself (serve keeps named volumes
# in --volumes-dir, fresh for every run).
e2e=/tmp/opensandbox-e2e
mkdir -p "$e2e/host-volume-test" "$e2e/logs"
echo "opensandbox-e2e-marker" >"$e2e/host-volume-test/marker.txt"
rm -f "$e2e/host-volume-test/sandbox-output.txt"
chmod 0777 "$e2e/host-volume-test" "$e2e/logs"
chmod 0644 "$e2e/host-volume-test/marker.txt"
rm -rf "$work/volumes"

. "$root/tests/e2b_sdk/serve-lib.sh"
trap serve_stop EXIT
serve_start "$bin" "$logs" --host-volume-prefix "$e2e" --volumes-dir "$work/volumes" \
  || { echo "opensandbox_sdk/run.sh: cannot start serve" >&2; exit 1; }
# What the suite reads (tests/base_e2e_test.py): serve's address and key, plain HTTP.
export OPENSANDBOX_TEST_DOMAIN="${E2B_API_URL#http://}"
export OPENSANDBOX_TEST_API_KEY="$E2B_API_KEY"
export OPENSANDBOX_TEST_PROTOCOL=http
unset OPENSANDBOX_SANDBOX_DEFAULT_IMAGE OPENSANDBOX_E2E_RUNTIME OPENSANDBOX_TEST_USE_SERVER_PROXY OPENSANDBOX_TEST_REDIS_URL

failed=0
summaries=()

echo "== warm-up: the first create of opensandbox/code-interpreter (serve builds code-interpreter-v1, or reuses the kept build); seeds the named volume"
if ! "$py" - <<'EOF' 2>&1 | tee "$logs/warmup.log"; then
import asyncio, os, time
from datetime import timedelta
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.models.sandboxes import PVC, Volume
async def main():
    cfg = ConnectionConfig(domain=os.environ["OPENSANDBOX_TEST_DOMAIN"], api_key=os.environ["OPENSANDBOX_TEST_API_KEY"],
                           request_timeout=timedelta(minutes=30))
    t = time.time()
    sb = await Sandbox.create("opensandbox/code-interpreter:latest", connection_config=cfg, timeout=timedelta(minutes=2),
                              ready_timeout=timedelta(minutes=5),
                              volumes=[Volume(name="seed", pvc=PVC(claimName="opensandbox-e2e-pvc-test"), mountPath="/data")])
    try:
        r = await sb.commands.run("echo warm")
        print(f"created in {time.time() - t:.1f}s;", r.logs.stdout[0].text)
        r = await sb.commands.run("echo pvc-marker-data > /data/marker.txt && mkdir -p /data/datasets/train"
                                  " && echo pvc-subpath-marker > /data/datasets/train/marker.txt && cat /data/marker.txt")
        assert r.error is None and r.logs.stdout[0].text == "pvc-marker-data", r
        print("seeded the named volume opensandbox-e2e-pvc-test")
    finally:
        await sb.kill()
        await sb.close()
asyncio.run(main())
EOF
  echo "opensandbox_sdk/run.sh: serve could not create opensandbox/code-interpreter (see $server_log)" >&2
  exit 1
fi

xdist=()
[ "$jobs" -gt 1 ] 2>/dev/null && xdist=(-n "$jobs" --dist loadscope)
deselect=()
checkout=()
echo "== deselected from OpenSandbox's e2e suite, by name:"
while IFS='|' read -r id reason; do
  case "$id" in "#"* | "") continue ;; esac
  id="${id%"${id##*[![:space:]]}"}"
  reason="${reason#"${reason%%[![:space:]]*}"}"
  deselect+=(--deselect "$id")
  echo "  $id: $reason"
  case "$reason" in "[checkout SDK]"*) checkout+=("$id") ;; esac
done <"$here/deselect.txt"

# pytest_run LOG PYTHON ARGS…: runs the suite from its folder (its pyproject's settings),
# prints the failures and the summary line; sets $rc.
pytest_run() {
  local log="$1" python="$2"
  shift 2
  (cd "$suite" && "$python" -m pytest -q -p no:cacheprovider -o log_cli=false -rfEs "${xdist[@]}" \
    --junitxml="${log%.log}.xml" "$@") >"$log" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR|SKIPPED) " "$log" | sed 's/^/  /'
  tail -1 "$log"
}

echo "== OpenSandbox's e2e suite ($commit) with PyPI opensandbox $sdk_version, opensandbox-code-interpreter $ci_version, $jobs workers"
pytest_run "$logs/pytest.log" "$py" "${deselect[@]}" "$@" tests
[ "$rc" -eq 0 ] || failed=1
summaries+=("suite with PyPI opensandbox $sdk_version: $(tail -1 "$logs/pytest.log" | sed 's/^=* *//; s/ *=*$//') (exit $rc)")

if [ ${#checkout[@]} -gt 0 ]; then
  echo "== the tests written for the SDK of $commit, with that SDK ($(version "$py_checkout" opensandbox)):"
  pytest_run "$logs/pytest-checkout-sdk.log" "$py_checkout" "$@" "${checkout[@]}"
  [ "$rc" -eq 0 ] || failed=1
  summaries+=("[checkout SDK] tests with the SDK of ${commit:0:12}: $(tail -1 "$logs/pytest-checkout-sdk.log" | sed 's/^=* *//; s/ *=*$//') (exit $rc)")
fi

serve_stop
trap - EXIT
if ! serve_clean_exit; then
  echo "opensandbox_sdk/run.sh: the server did not shut down cleanly:" >&2
  tail -5 "$server_log" >&2
  failed=1
fi
echo "== summary"
for s in "${summaries[@]}"; do echo "  $s"; done
[ "$failed" -eq 0 ] && echo "opensandbox_sdk/run.sh: all green" || echo "opensandbox_sdk/run.sh: FAILED"
exit "$failed"

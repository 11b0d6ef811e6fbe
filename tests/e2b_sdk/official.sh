#!/usr/bin/env bash
# The official E2B Python SDK test suite (packages/python-sdk/tests/{sync,async} of
# e2b-dev/E2B), unmodified, against `scenario-run serve`; prints pass/fail/skip counts by test
# file and every failing test. Not part of scripts/test: it needs a copy of the E2B repository
# and takes minutes. The E2B code is extracted under target/, never into the source tree.
# The tests that would make a sandbox contact a public host (now that sandboxes reach the
# internet) are deselected by name, each with its reason, printed on every run
# (official-deselect.txt); official_public_hosts.py refuses a checkout with such a test that
# the list misses.
#
#   tests/e2b_sdk/official.sh [--sdk VERSION]… [--js] [-- PYTEST ARGS…]
#
#   --sdk VERSION  an `e2b` release from PyPI to run the suite with (repeatable); default: the
#                  pinned release (tests/judges/e2b/requirements.txt) and the version the E2B
#                  commit itself is (its packages/python-sdk/package.json), which its tests
#                  are written for
#   --js           also the JS SDK's own tests (packages/js-sdk/tests, vitest, from the SDK's
#                  source; official-js.sh)
#   --js-only      only those
#   E2B_REPO       the e2b-dev/E2B repository: a checkout or a bare git directory, used when
#                  GitHub is out of reach (tests/judges/lib.sh: a clone of the commit
#                  tests/judges/e2b-official/suite pins, then this, then
#                  ../.mirror/e2b-dev+E2B/repo beside the checkout); E2B_REF picks another
#                  commit of E2B_REPO
#   JOBS           pytest-xdist workers (default 4; the suite's own default)
#   SKIP_BUILD=1   do not run `cargo build` first
#   SERVE_BIN      the scenario-run binary to serve with (default target/debug/scenario-run)
# Results: target/e2b-official/results/<sdk>.xml (JUnit) and <sdk>.txt (the summary).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
work="$target/e2b-official"
results="$work/results"
jobs="${JOBS:-4}"
sdks=()
js=0
py=1
while [ $# -gt 0 ]; do
  case "$1" in
    --sdk) sdks+=("$2"); shift 2 ;;
    --js) js=1; shift ;;
    --js-only) js=1; py=0; shift ;;
    --) shift; break ;;
    *) echo "official.sh: unknown argument $1 (see the header of this file)" >&2; exit 2 ;;
  esac
done
mkdir -p "$work" "$results"

# The suite, extracted from the repository at $ref.
. "$root/tests/judges/lib.sh"
if [ -n "${E2B_REF:-}" ]; then
  git_dir="${E2B_REPO:?E2B_REF needs E2B_REPO}"
  [ -d "$git_dir/.git" ] && git_dir="$git_dir/.git"
  commit="$(git --git-dir="$git_dir" rev-parse "$E2B_REF^{commit}" 2>/dev/null)" || {
    echo "official.sh: $E2B_REPO has no commit $E2B_REF" >&2
    exit 2
  }
else
  judge_suite e2b-official E2B_REPO
  case $? in
    0) commit="$suite_commit" git_dir="$suite_git" && echo "== the suite: $suite_repo at $commit, from $suite_from" ;;
    2) echo "== SKIPPED, LOUDLY: no e2b-dev/E2B (github.com out of reach, no E2B_REPO, no ../.mirror/e2b-dev+E2B/repo)" >&2 && exit 2 ;;
    *) exit 2 ;;
  esac
fi
src="$work/src-${commit:0:12}"
if [ ! -d "$src/packages/python-sdk/tests" ]; then
  mkdir -p "$src"
  git --git-dir="$git_dir" archive "$commit" packages/python-sdk/tests packages/python-sdk/pytest.ini \
    packages/python-sdk/package.json packages/js-sdk | tar -x -C "$src" || exit 1
fi
# The deselected tests (official-deselect.txt): `deselected LANG` prints those of
# one suite (py, js) with their reasons and sets ${desel[@]} to their ids.
deselect_file="$here/official-deselect.txt"
deselected() {
  local id reason
  desel=()
  echo "== deselected, by name ($(basename "$deselect_file")):"
  while IFS='|' read -r id reason; do
    case "$id" in "#"* | "") continue ;; esac
    id="${id%"${id##*[![:space:]]}"}"
    reason="${reason#"${reason%%[![:space:]]*}"}"
    case "$1:$id" in
      js:js:*) id="${id#js:}" ;;
      js:* | py:js:*) continue ;;
    esac
    echo "  $id: $reason"
    desel+=("$id")
  done <"$deselect_file"
}
# A test that reaches a public host and is not deselected: refuse to run the checkout.
python3 "$here/official_public_hosts.py" "$src/packages" "$deselect_file" || exit 2

own="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$src/packages/python-sdk/package.json")"
if [ ${#sdks[@]} -eq 0 ]; then
  pinned="$(sed -n 's/^e2b==//p' "$judges/e2b/requirements.txt")"
  [ -n "$pinned" ] && sdks+=("$pinned")
  [ "$own" != "${pinned:-}" ] && sdks+=("$own")
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  (cd "$root" && CARGO_TARGET_DIR="$target" cargo build --quiet) || { echo "official.sh: cargo build failed" >&2; exit 1; }
fi
bin="${SERVE_BIN:-$target/debug/scenario-run}"

# The suite's own test dependencies (its pyproject's dev group).
deps=(pytest pytest-asyncio pytest-timeout pytest-xdist python-dotenv pytest-dotenv)
venv() {
  local dir="$target/e2b-venvs/official-$1"
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir" || return 1
  fi
  "$dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('e2b') != '$1')" 2>/dev/null \
    && "$dir/bin/python" -c 'import xdist, pytest_asyncio, pytest_timeout' 2>/dev/null \
    || "$dir/bin/pip" install --quiet "e2b==$1" "${deps[@]}" || return 1
  echo "$dir/bin/python"
}

. "$here/serve-lib.sh"
trap serve_stop EXIT
status=0
[ "$py" = 1 ] || sdks=()
for v in "${sdks[@]}"; do
  py="$(venv "$v")" || { echo "official.sh: cannot install e2b==$v" >&2; status=1; continue; }
  mkdir -p "$work/logs-$v"
  # E2B's default: ports open without the traffic token unless create says otherwise (the
  # suite's port tests send none).
  serve_start "$bin" "$work/logs-$v" --allow-public-traffic || exit 1
  # As against E2B: no E2B_SANDBOX_URL, so the SDK finds envd where it does there, at
  # https://49983-<id>.<the sandbox's domain> (serve's TLS port host), and its own tests of
  # how that address is derived see the SDK's default.
  unset E2B_SANDBOX_URL
  deselected py
  args=()
  for id in "${desel[@]}"; do args+=(--deselect "$id"); done
  echo "== official Python suite ($commit, tests of SDK $own) with e2b $v, $jobs workers"
  (cd "$src/packages/python-sdk" && "$py" -m pytest -q -p no:cacheprovider -n "$jobs" \
    --junitxml="$results/py-$v.xml" -o junit_family=xunit1 "${args[@]}" "$@" tests/sync tests/async) \
    >"$work/logs-$v/pytest.log" 2>&1
  tail -1 "$work/logs-$v/pytest.log"
  serve_stop
  serve_clean_exit || { echo "official.sh: serve did not shut down cleanly (see $server_log)" >&2; status=1; }
  python3 "$here/official_summary.py" --deselected "$deselect_file" "e2b $v" "$results/py-$v.xml" | tee "$results/py-$v.txt"
done

if [ "$js" = 1 ]; then
  . "$here/official-js.sh"
fi
exit "$status"

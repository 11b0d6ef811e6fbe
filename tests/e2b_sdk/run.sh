#!/usr/bin/env bash
# Conformance tests of `scenario-run serve`, judged by the unmodified E2B SDKs:
#   * pytest in two venvs under target/e2b-venvs/: the pinned `e2b` release
#     (tests/judges/e2b) and e2b==2.31.0 (tests/judges/e2b-2.31: the version Alibaba FC pins;
#     it uses the v1 /sandboxes routes);
#   * a smoke test with the npm `e2b` SDK (tests/e2b_sdk/js/smoke.mjs, the SDK pinned by
#     tests/judges/e2b-js, installed under target/);
#   * the code interpreter of code-interpreter-v1: the official `e2b-code-interpreter` suite
#     and the product client's run_code (code-interpreter.sh, with its own serve).
# Starts target/debug/scenario-run serve on a free loopback port with a random key, runs
# everything against it, stops it by PID. Exits non-zero if anything failed.
#   SKIP_BUILD=1       do not run `cargo build` first
#   JUDGES_DIR         the pins (default tests/judges; scripts/judges-latest sets the newest)
# Arguments are passed to pytest, e.g. `run.sh -k "files or ports" -x`.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venvs="$target/e2b-venvs"
logs="$target/e2b-sdk-logs"
mkdir -p "$venvs" "$logs"
cd "$root"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  CARGO_TARGET_DIR="$target" cargo build --quiet || { echo "run.sh: cargo build failed" >&2; exit 1; }
fi
bin="$target/debug/scenario-run"
[ -x "$bin" ] || { echo "run.sh: $bin is missing" >&2; exit 1; }

. "$root/tests/judges/lib.sh"
declare -A pythons
for v in e2b e2b-2.31; do
  pythons[$v]="$(judge_venv "$v")" || { echo "run.sh: cannot install the pinned $v (tests/judges/$v)" >&2; exit 1; }
done
js="$target/judges-npm/e2b-js"
judge_npm e2b-js "$js" && cp "$here/js/smoke.mjs" "$js/" || { echo "run.sh: cannot install the pinned npm e2b" >&2; exit 1; }

. "$here/serve-lib.sh"
trap serve_stop EXIT
serve_start "$bin" "$logs" || { echo "run.sh: cannot start serve" >&2; exit 1; }

failed=0
summaries=()
for v in e2b e2b-2.31; do
  py="${pythons[$v]}"
  ver="$("$py" -c 'import importlib.metadata as m; print(m.version("e2b"))')"
  echo "== pytest with e2b $ver ($v)"
  out="$logs/pytest-$v.log"
  (cd "$here" && "$py" -m pytest -q -p no:cacheprovider -rfE "$@" .) 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || failed=1
  summaries+=("e2b $ver: $(grep -E '^(=+ )?[0-9]+ (passed|failed|error)|no tests ran' "$out" | tail -1 | sed 's/^=* *//; s/ *=*$//') (exit $rc)")
done

echo "== js smoke with npm e2b $(node -p 'require(process.argv[1] + "/node_modules/e2b/package.json").version' "$js")"
if (cd "$js" && node smoke.mjs) 2>&1 | tee "$logs/js.log"; then
  summaries+=("npm e2b: $(tail -1 "$logs/js.log")")
else
  failed=1
  summaries+=("npm e2b: FAILED (see $logs/js.log)")
fi

serve_stop
trap - EXIT
if ! serve_clean_exit; then
  echo "run.sh: the server did not shut down cleanly:" >&2
  tail -5 "$server_log" >&2
  failed=1
fi

echo "== the code interpreter (code-interpreter.sh)"
if SKIP_BUILD=1 bash "$here/code-interpreter.sh" 2>&1 | tee "$logs/code-interpreter.log"; then
  summaries+=("code interpreter: $(grep -E '^  e2b-code-interpreter' "$logs/code-interpreter.log" | tail -1 | sed 's/^ *//')")
else
  failed=1
  summaries+=("code interpreter: FAILED (see $logs/code-interpreter.log)")
fi

echo "== summary"
for s in "${summaries[@]}"; do echo "  $s"; done
[ "$failed" -eq 0 ] && echo "run.sh: all green" || echo "run.sh: FAILED"
exit "$failed"

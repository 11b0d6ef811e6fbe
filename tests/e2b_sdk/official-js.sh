# Sourced by official.sh --js: the JS SDK's own tests (packages/js-sdk/tests of the same E2B
# checkout, unmodified, run with vitest against the SDK's own source) against serve. Only the
# runtimes that need a browser, Cloudflare or Deno are left out, and the tests of
# official-deselect.txt (`js:` lines: a file leaves the config, a test is skipped by a name
# filter). Uses $src, $work, $results, $bin, `deselected` and serve-lib.sh from official.sh.
# npm installs the SDK's dependencies and the test tools (vitest, msw, dotenv) into the copy
# under target/.
js_dir="$work/js-${commit:0:12}"
if [ ! -d "$js_dir/node_modules/vitest" ]; then
  rm -rf "$js_dir"
  cp -r "$src/packages/js-sdk" "$js_dir"
  # The dependencies and only the test tools these tests use (the browser, Cloudflare and
  # code-generation tools are left out).
  python3 - "$js_dir/package.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
keep = {"vitest", "dotenv", "msw", "error-stack-parser-es", "@types/node"}
p["devDependencies"] = {k: v for k, v in p.get("devDependencies", {}).items() if k in keep}
p.pop("scripts", None)
json.dump(p, open(sys.argv[1], "w"), indent=2)
PY
  (cd "$js_dir" && npm install --no-audit --no-fund --ignore-scripts --silent) || { echo "official.sh: npm install failed" >&2; exit 1; }
fi
# The deselected tests: whole files leave both projects; single tests are skipped by a name
# filter (vitest matches its describe blocks and name joined by spaces).
deselected js
excluded=()
names=()
for id in "${desel[@]}"; do
  case "$id" in
    *" > "*) names+=("$(python3 -c 'import re, sys; print(re.sub(r"[.*+?^${}()|[\]\\/]", r"\\\g<0>", sys.argv[1].partition(" > ")[2].replace(" > ", " ")))' "$id")") ;;
    *) excluded+=("$id") ;;
  esac
done
filter=()
if [ ${#names[@]} -gt 0 ]; then
  alt="$(printf '%s|' "${names[@]}")"
  filter=(-t "^(?!(${alt%|})$)")
fi
# The suite's own projects, without the browser one (its config imports playwright).
{
  echo "import { defineConfig } from 'vitest/config'"
  echo "const deselected: string[] = $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${excluded[@]}")"
  cat <<'TS'
export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'sdk',
          include: ['tests/**/*.test.ts'],
          exclude: ['tests/runtimes/**', 'tests/template/**', 'tests/**/*.browser.test.ts', ...deselected],
          isolate: true,
          testTimeout: 30_000,
          environment: 'node',
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
          deps: { interopDefault: true },
        },
      },
      {
        test: {
          name: 'template',
          include: ['tests/template/**/*.test.ts'],
          exclude: deselected,
          testTimeout: 180_000,
          environment: 'node',
          setupFiles: ['tests/globalFetchFallback.setup.ts'],
        },
      },
    ],
  },
})
TS
} >"$js_dir/vitest.serve.config.mts"
# Files that mock the API with msw (`msw` or `msw/node`) expect the SDK's default URLs: they run once without
# serve's variables (with a placeholder key), then everything runs against serve; a test of
# such a file passes if it passed in one of the runs (its unit tests need the default URLs,
# its integration tests serve). A request msw does not answer would go to E2B's cloud
# (api.e2b.app, *.e2b.app): that run gets a network namespace of its own with loopback only,
# so nothing it sends can leave this host.
mocked="$(cd "$js_dir" && grep -rlE "from ['\"]msw(/[a-z]+)?['\"]" tests --include='*.test.ts' | grep -v '^tests/runtimes/' | sort)"
js_ver="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["version"])' "$js_dir/package.json")"
mkdir -p "$work/logs-js"
rm -f "$results/js-$js_ver-mocked.xml"
offline=()
if unshare -n true 2>/dev/null; then
  offline=(unshare -n)
elif unshare -rn true 2>/dev/null; then
  offline=(unshare -rn)
fi
if [ ${#offline[@]} -eq 0 ]; then
  echo "== SKIPPED the run with mocked APIs: no network namespace can be made here (unshare -n or -rn), and outside one a request msw misses would reach E2B's cloud"
else
  echo "== official JS suite ($commit, SDK $js_ver from source), vitest: $(echo "$mocked" | wc -w) files with mocked APIs, offline (${offline[*]})"
  (cd "$js_dir" && env -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_DOMAIN E2B_API_KEY="e2b_$(printf '0%.0s' $(seq 40))" \
    "${offline[@]}" sh -c 'ip link set lo up && exec "$@"' sh node_modules/.bin/vitest run --config vitest.serve.config.mts \
    "${filter[@]}" --reporter=default --reporter=junit --outputFile.junit="$results/js-$js_ver-mocked.xml" \
    --maxWorkers="$jobs" $mocked) >"$work/logs-js/vitest-mocked.log" 2>&1
  tail -3 "$work/logs-js/vitest-mocked.log"
fi
# E2B's default: ports open without the traffic token unless create says otherwise.
serve_start "$bin" "$work/logs-js" --allow-public-traffic || exit 1
# As against E2B: envd is found at https://49983-<id>.<the sandbox's domain> (see official.sh).
unset E2B_SANDBOX_URL
echo "== against serve"
(cd "$js_dir" && node_modules/.bin/vitest run --config vitest.serve.config.mts "${filter[@]}" --reporter=default \
  --reporter=junit --outputFile.junit="$results/js-$js_ver.xml" --maxWorkers="$jobs") >"$work/logs-js/vitest.log" 2>&1
tail -3 "$work/logs-js/vitest.log"
serve_stop
serve_clean_exit || { echo "official.sh: serve did not shut down cleanly (see $server_log)" >&2; status=1; }
reports=("$results/js-$js_ver.xml")
[ -f "$results/js-$js_ver-mocked.xml" ] && reports+=("$results/js-$js_ver-mocked.xml")
python3 "$here/official_summary.py" --deselected "$deselect_file" "js e2b $js_ver" "${reports[@]}" \
  | tee "$results/js-$js_ver.txt"

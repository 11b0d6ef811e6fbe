# Shared by the job scripts of .ci/jobs/ (sourced, not run). Each job of
# .github/workflows/e2e.yml is one script here: the workflow only calls it, and .ci/run calls
# the same scripts, so what GitHub runs is what runs on a CI machine here.

# The repository root.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2

# as_root CMD...: CMD as root (sudo when this shell is not root), keeping the variables named
# in $KEEP_ENV (comma-separated) and PATH.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  else
    sudo --preserve-env="PATH${KEEP_ENV:+,$KEEP_ENV}" "$@"
  fi
}

# The binary the job runs: $SCENARIO_RUN_BIN (.ci/run points it at the test job's build), else
# a release build, as on GitHub.
scenario_run_bin() {
  if [ -n "${SCENARIO_RUN_BIN:-}" ]; then
    if [ ! -x "$SCENARIO_RUN_BIN" ]; then
      cargo build --quiet >&2 || return 1
    fi
    echo "$SCENARIO_RUN_BIN"
  else
    cargo build --release >&2 || return 1
    echo target/release/scenario-run
  fi
}

# job_verdict JOB VERDICT: where .ci/run collects what each job came to (PASSED, FAILED,
# SKIPPED (why)); nothing outside .ci/run.
job_verdict() {
  if [ -n "${CI_JOB_VERDICTS:-}" ]; then
    printf '%s\t%s\n' "$1" "$2" >>"$CI_JOB_VERDICTS"
  fi
}

# skip_job JOB WHY: a job that cannot run here says so loudly (a banner on stderr, a warning
# annotation and the job summary in GitHub Actions, SKIPPED in .ci/run's table) and exits 0: a
# missing secret is not a failure, and not a pass either.
skip_job() {
  local job=$1 why=$2
  {
    echo "################################################################"
    echo "# SKIPPED: job $job did not run: $why"
    echo "################################################################"
  } >&2
  if [ "${GITHUB_ACTIONS:-}" = true ]; then
    echo "::warning title=SKIPPED $job::$why"
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
      printf '### SKIPPED: %s\n\n%s\n' "$job" "$why" >>"$GITHUB_STEP_SUMMARY"
    fi
  fi
  job_verdict "$job" "SKIPPED ($why)"
  exit 0
}

# finish JOB STATUS: records the verdict and exits with STATUS.
finish() {
  if [ "$2" -eq 0 ]; then job_verdict "$1" PASSED; else job_verdict "$1" "FAILED (exit $2)"; fi
  exit "$2"
}

#!/usr/bin/env bash
# Job `cloud` (one per provider and area): the scenarios of one folder on E2B or Alibaba Cloud,
# then the janitor for this run's tag. Without the provider's key (a repository secret) the job
# cannot run: it says SKIPPED loudly (see lib.sh) rather than pass with every scenario skipped.
# With it, the run is strict about every other credential (--require-credentials): a scenario
# or step that would be SKIPPED for `missing credentials [...]` (a model's key whose secret is
# gone) is an ERROR that fails the job; a skip for a capability the provider lacks stays a skip.
#   .ci/jobs/cloud.sh PROVIDER PATH AREA     e.g. .ci/jobs/cloud.sh e2b scenarios/files files
set -uo pipefail
source "$(dirname "$0")/lib.sh"
provider=${1:?usage: cloud.sh PROVIDER PATH AREA} path=${2:?} area=${3:?}
job="cloud $provider $area"
case $provider in
  e2b) key=E2B_API_KEY ;;
  alicloud) key=ABX_SANDBOX_API_KEY ;;
  *) echo "cloud.sh: unknown provider $provider (e2b or alicloud)" >&2; finish "$job" 2 ;;
esac
if [ -z "${!key:-}" ]; then
  skip_job "$job" "missing credentials [$key] (a repository secret on GitHub, the environment here)"
fi
bin=$(scenario_run_bin) || finish "$job" 1
export E2E_RUN_ID=${E2E_RUN_ID:-ci-$provider-$area-$$}
mkdir -p reports
"$bin" "$path" --provider "$provider" --require-credentials --no-progress \
  --junit reports/junit.xml --json reports/run.json --evidence reports/evidence --html reports/report.html
status=$?
"$bin" cleanup --provider "$provider" --run-id "$E2E_RUN_ID" --yes || true
finish "$job" $status

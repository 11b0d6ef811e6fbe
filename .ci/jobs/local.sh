#!/usr/bin/env bash
# Job `local` (one per area): the scenarios of one folder on the local provider, as root (the
# sandboxes need namespaces), with JUnit, JSON, evidence and HTML reports in reports/.
#   .ci/jobs/local.sh PATH AREA      e.g. .ci/jobs/local.sh scenarios/files files
# The GITHUB_* variables let the run annotate failures and write the job summary; the model
# keys, where set, let the agent templates' real-model steps run (else those steps SKIP).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
path=${1:?usage: local.sh PATH AREA} area=${2:?usage: local.sh PATH AREA}
job="local $area"
as_root scripts/setup >&2 || finish "$job" 1
bin=$(scenario_run_bin) || finish "$job" 1
mkdir -p reports
KEEP_ENV=E2E_RUN_ID,GITHUB_ACTIONS,GITHUB_STEP_SUMMARY,GITHUB_WORKSPACE,OPENAI_API_KEY,ANTHROPIC_API_KEY,DASHSCOPE_API_KEY,DEEPSEEK_API_KEY,QODER_PERSONAL_ACCESS_TOKEN \
  as_root "$bin" "$path" --no-progress \
  --junit "reports/junit-$area.xml" --json "reports/run-$area.json" \
  --evidence "reports/evidence-$area" --html "reports/report-$area.html"
finish "$job" $?

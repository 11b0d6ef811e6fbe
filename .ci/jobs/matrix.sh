#!/usr/bin/env bash
# Job `matrix`: the scenario folders (areas) as GitHub's strategy matrix, for the `local` job,
# and crossed with the cloud providers for the `cloud` job. Written to $GITHUB_OUTPUT as
# `areas=` and `cloud=` in GitHub Actions, and printed.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
bin=$(scenario_run_bin) || finish matrix 1
areas=$("$bin" matrix --emit github) || finish matrix 1
cloud=$("$bin" matrix --emit github --providers alicloud,e2b) || finish matrix 1
echo "areas=$areas"
echo "cloud=$cloud"
if [ -n "${GITHUB_OUTPUT:-}" ]; then
  { echo "areas=$areas"; echo "cloud=$cloud"; } >>"$GITHUB_OUTPUT"
fi
finish matrix 0

#!/usr/bin/env bash
# Job `test`: the test suite (scripts/test) as root: fmt, clippy, unit and integration tests on
# real sandboxes and the Docker stack, the E2B SDK tests against serve, the HTML report in a
# headless browser (CHROMIUM), actionlint. The toolchain stays the caller's (PATH, HOME).
set -uo pipefail
source "$(dirname "$0")/lib.sh"
KEEP_ENV=HOME,CHROMIUM,CI as_root scripts/test
finish test $?

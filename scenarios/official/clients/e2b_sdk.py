"""Drives the official E2B Python SDK (PyPI `e2b`) against the provider of a scenario-run run.

Reads what `{{ provider.env }}` passes: E2B_API_KEY, E2B_API_URL, E2B_DOMAIN (E2B_SANDBOX_URL
for a local server) and E2E_RUN_TAG (`e2e=<run id>`), which every sandbox made here carries so
the run's session-end sweep removes one this script leaves behind.

  e2b_sdk.py create   Sandbox.create (tagged), commands.run, files.write/read; leaves the
                      sandbox running and prints one JSON line with what it saw
  e2b_sdk.py kill ID  Sandbox.connect(ID).kill(); prints {"killed": true|false}
"""

import importlib.metadata
import json
import os
import sys

from e2b import CommandExitException, Sandbox


def run_tag():
    key, value = os.environ["E2E_RUN_TAG"].split("=", 1)
    return {key: value}


def create():
    sb = Sandbox.create(metadata={**run_tag(), "client": "e2b-python-sdk"}, envs={"FROM_SDK": "yes"}, timeout=300)
    try:
        r = sb.commands.run('echo "sdk says $FROM_SDK"; echo to-stderr >&2; id -un')
        try:
            sb.commands.run("echo failing >&2; exit 7")
            code = 0
        except CommandExitException as e:
            code = e.exit_code
        sb.files.write("/home/user/sdk/hello.txt", "written by the e2b sdk\n")
        read = sb.files.read("/home/user/sdk/hello.txt")
        info = sb.get_info()
        print(json.dumps({
            "sdk": importlib.metadata.version("e2b"),
            "id": sb.sandbox_id,
            "stdout": r.stdout,
            "stderr": r.stderr,
            "exit_code": r.exit_code,
            "failed_exit_code": code,
            "read": read,
            "metadata": info.metadata,
            "running": sb.is_running(),
        }))
    except BaseException:
        sb.kill()
        raise


def kill(sandbox_id):
    sb = Sandbox.connect(sandbox_id)
    print(json.dumps({"killed": sb.kill()}))


if __name__ == "__main__":
    if sys.argv[1] == "create":
        create()
    else:
        kill(sys.argv[2])

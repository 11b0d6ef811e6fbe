"""qoder: agent-sandbox-server on 9000 with the template's commands."""

import os
import shutil
import subprocess
import sys

from agent_sandbox.server import command, start

WORK = "/home/user/workspace"

def _run(argv, cwd=WORK, timeout=600, env=None):
    """Runs argv; a missing binary is reported as data, not a crash."""
    if shutil.which(argv[0]) is None:
        return {"error": f"{argv[0]} is not installed in this sandbox (bring your own)", "exit_code": 127}
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


@command(description="Run a Python script in the workspace")
def run_script(script: str) -> dict:
    return _run([sys.executable, "-c", script])

@command(description="Run a Python script in the workspace")
def run(script: str) -> dict:
    return _run([sys.executable, "-c", script])


@command(description="Give the Qoder CLI a task (needs the CLI and QODER_API_KEY)")
def task(prompt: str) -> dict:
    return _run(["qodercli", "-p", prompt])


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

"""qoder: agent-sandbox-server on 9000 with the Qoder CLI's commands.

- `version()`: `qodercli --version` (no key needed).
- `task(prompt)`: `qodercli -p <prompt>` in /home/user/workspace, tools allowed without prompts
  (needs a Qoder account token: QODER_PERSONAL_ACCESS_TOKEN).
- `run(script)`, `run_script(script)`: Python in the workspace.
"""

import os
import shutil
import subprocess
import sys

from agent_sandbox.server import command, start

WORK = "/home/user/workspace"


def _run(argv, cwd=WORK, timeout=600, env=None, stdin=None):
    """Runs argv in the workspace; the result is data: {stdout, stderr, exit_code}."""
    if shutil.which(argv[0]) is None:
        return {"stdout": "", "stderr": f"{argv[0]}: not found", "exit_code": 127}
    os.makedirs(cwd, exist_ok=True)
    try:
        done = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            input=stdin,
            stdin=None if stdin is not None else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return {"stdout": out, "stderr": err + f"\n(timed out after {timeout}s)", "exit_code": 124}
    return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


@command(description="Run a Python script in the workspace")
def run_script(script: str) -> dict:
    return _run([sys.executable, "-c", script])


@command(description="The Qoder CLI's version (no key needed)")
def version() -> dict:
    return _run(["qodercli", "--version"])


@command(description="Run a Python script in the workspace")
def run(script: str) -> dict:
    return _run([sys.executable, "-c", script])


@command(description="Give the Qoder CLI a task (needs QODER_PERSONAL_ACCESS_TOKEN)")
def task(prompt: str, timeout: int = 600) -> dict:
    return _run(["qodercli", "-p", prompt, "--yolo"], timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

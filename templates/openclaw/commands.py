"""openclaw: agent-sandbox-server on 9000 with OpenClaw's commands.

- `version()`: `openclaw --version` (no key needed).
- `start()`: the OpenClaw gateway on 18789, in the background (log in /tmp/openclaw.log).
- `agent(message)`: one agent turn, run locally (`openclaw agent --local`), in
  /home/user/workspace (needs a model key: ANTHROPIC_API_KEY or OPENAI_API_KEY).
- `run_script(script)`: Python in the workspace.
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


@command(description="OpenClaw's version (no key needed)")
def version() -> dict:
    return _run(["openclaw", "--version"])


@command(name="start", description="Start the OpenClaw gateway on port 18789 (background)")
def start_gateway() -> dict:
    if shutil.which("openclaw") is None:
        return {"error": "openclaw: not found", "exit_code": 127}
    log = open("/tmp/openclaw.log", "ab")
    argv = ["openclaw", "gateway", "--port", "18789", "--allow-unconfigured"]
    p = subprocess.Popen(argv, cwd=WORK, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return {"pid": p.pid, "log": log.name}


@command(description="One OpenClaw agent turn, run locally (needs a model key)")
def agent(message: str, timeout: int = 600) -> dict:
    return _run(["openclaw", "agent", "--local", "--message", message], timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

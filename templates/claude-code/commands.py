"""claude-code: agent-sandbox-server on 9000 with Claude Code's commands.

- `version()`: `claude --version` (no key needed).
- `run(task, model="", base_url="", api_key="")`: `claude -p <task> --output-format json` in
  /home/user/workspace, tools allowed without prompts (the sandbox is the boundary; Claude Code
  allows that only when not root, which is why the server runs as `user`). The key is
  `api_key`, else ANTHROPIC_API_KEY; another endpoint is `base_url` (or ANTHROPIC_BASE_URL;
  Messages API).
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


@command(description="Claude Code's version (no key needed)")
def version() -> dict:
    return _run(["claude", "--version"])


@command(description="Give Claude Code a task in the workspace (needs ANTHROPIC_API_KEY, or base_url and api_key of another endpoint)")
def run(task: str, model: str = "", base_url: str = "", api_key: str = "", timeout: int = 600) -> dict:
    argv = ["claude", "-p", task, "--output-format", "json", "--dangerously-skip-permissions"]
    if model:
        argv += ["--model", model]
    env = {}
    if base_url:
        env["ANTHROPIC_BASE_URL"] = base_url
    if api_key:
        env["ANTHROPIC_API_KEY"] = api_key
    return _run(argv, env=env, timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

"""hermes-agent: agent-sandbox-server on 9000 with Hermes Agent's commands.

- `version()`: `hermes --version` (no key needed).
- `run(prompt, model, toolsets, base_url="", api_key="")`: one Hermes turn (`hermes -z <prompt>`:
  the agent loop with its file and terminal tools, approvals bypassed) in /home/user/workspace,
  against the provider `openai-api`: `base_url`, else OPENAI_BASE_URL (OpenAI's by default), and
  `api_key`, else OPENAI_API_KEY.
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


@command(description="Hermes Agent's version (no key needed)")
def version() -> dict:
    return _run(["hermes", "--version"])


@command(description="One Hermes Agent turn with file and terminal tools (needs OPENAI_API_KEY, or base_url and api_key)")
def run(
    prompt: str, model: str = "gpt-4.1-mini", toolsets: str = "file,terminal", base_url: str = "",
    api_key: str = "", timeout: int = 600,
) -> dict:
    argv = ["hermes", "-z", prompt, "--provider", "openai-api", "--model", model, "--toolsets", toolsets]
    env = {}
    if base_url:
        env["OPENAI_BASE_URL"] = base_url
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return _run(argv, env=env, timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

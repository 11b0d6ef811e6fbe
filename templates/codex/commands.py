"""codex: agent-sandbox-server on 9000 with the Codex CLI's commands.

- `version()`: `codex --version` (no key needed).
- `run(prompt, model="", base_url="", api_key="")`: `codex exec` in /home/user/workspace,
  non-interactive, with the sandbox mode of CODEX_SANDBOX_MODE (default danger-full-access: the
  sandbox itself is the boundary, and Codex's own Linux sandbox needs namespaces a sandbox does
  not grant). The model endpoint is OpenAI's unless `base_url` (or OPENAI_BASE_URL) names
  another (Responses API); the key is `api_key`, else OPENAI_API_KEY.
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


@command(description="The Codex CLI's version (no key needed)")
def version() -> dict:
    return _run(["codex", "--version"])


@command(description="Give Codex a task in the workspace (codex exec; needs OPENAI_API_KEY, or base_url and api_key of another endpoint)")
def run(prompt: str, model: str = "", base_url: str = "", api_key: str = "", timeout: int = 600) -> dict:
    mode = os.environ.get("CODEX_SANDBOX_MODE") or "danger-full-access"
    argv = ["codex", "exec", "--skip-git-repo-check", "--sandbox", mode, "--color", "never"]
    if model:
        argv += ["--model", model]
    env = {"OPENAI_API_KEY": api_key} if api_key else {}
    base = base_url or os.environ.get("OPENAI_BASE_URL")
    if base:
        # A provider of our own for another endpoint (Responses API, key from OPENAI_API_KEY).
        argv += [
            "-c", f'model_providers.custom={{name="custom",base_url="{base}",env_key="OPENAI_API_KEY",wire_api="responses"}}',
            "-c", "model_provider=custom",
        ]
    return _run(argv + [prompt], env=env, timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

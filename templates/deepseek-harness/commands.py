"""deepseek-harness: agent-sandbox-server on 9000 with the DeepSeek agent's commands.

- `version()`: versions of dsh-agent, deepseek-harness and openai (no key needed).
- `self_test()`: the agent's tool loop without a model: a tool call DeepSeek leaked into text is
  salvaged by the harness and carried out (a file written and read back) (no key needed).
- `run(task, model="deepseek-chat", base_url="", api_key="")`: `dsh-agent <task>` in
  /home/user/workspace against `base_url`, else DEEPSEEK_BASE_URL (https://api.deepseek.com by
  default), with `api_key`, else DEEPSEEK_API_KEY.
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


@command(description="Versions of dsh-agent and its libraries (no key needed)")
def version() -> dict:
    return _run(["dsh-agent", "--version"])


@command(description="The agent's tool loop without a model: salvage a leaked tool call and run it")
def self_test() -> dict:
    return _run(["dsh-agent", "--self-test"])


@command(description="Give the DeepSeek agent a task in the workspace (needs DEEPSEEK_API_KEY, or base_url and api_key)")
def run(
    task: str, model: str = "deepseek-chat", max_turns: int = 20, base_url: str = "", api_key: str = "",
    timeout: int = 600,
) -> dict:
    env = {}
    if base_url:
        env["DEEPSEEK_BASE_URL"] = base_url
    if api_key:
        env["DEEPSEEK_API_KEY"] = api_key
    return _run(["dsh-agent", "--model", model, "--max-turns", str(max_turns), task], env=env, timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

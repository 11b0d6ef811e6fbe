"""qwen-code: agent-sandbox-server on 9000 with the Qwen Code CLI's commands.

- `version()`: `qwen --version` (no key needed).
- `deploy(prompt, max_turns=100, base_url="", model="", api_key="")`: `qwen -p <prompt> --yolo
  --output-format json` in /home/user/workspace against `base_url`, else OPENAI_BASE_URL
  (DashScope's compatible mode by default), with the key `api_key`, else DASHSCOPE_API_KEY,
  else OPENAI_API_KEY, and the model `model`, else OPENAI_MODEL.
- `run(script)`, `run_script(script)`: Python in the workspace (dashscope and openai installed).
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


@command(description="The Qwen Code CLI's version (no key needed)")
def version() -> dict:
    return _run(["qwen", "--version"])


@command(description="Run a Python script in the workspace")
def run(script: str) -> dict:
    return _run([sys.executable, "-c", script])


@command(description="Let Qwen Code carry out a prompt (qwen -p ... --yolo --output-format json)")
def deploy(
    prompt: str, max_turns: int = 100, base_url: str = "", model: str = "", api_key: str = "", timeout: int = 1800
) -> dict:
    key = api_key or os.environ.get("DASHSCOPE_API_KEY") or os.environ.get("OPENAI_API_KEY", "")
    env = {"OPENAI_API_KEY": key, "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"}
    if base_url:
        env["OPENAI_BASE_URL"] = base_url
    if model:
        env["OPENAI_MODEL"] = model
    argv = ["qwen", "-p", prompt, "--yolo", "--output-format", "json", "--max-session-turns", str(max_turns)]
    return _run(argv, env=env, timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

"""openclaw: agent-sandbox-server on 9000 with OpenClaw's commands.

- `version()`: `openclaw --version` (no key needed).
- `start()`: the OpenClaw gateway on 18789, in the background (log in /tmp/openclaw.log).
- `agent(message, base_url="", model="", api_key="")`: one agent turn of the `main` agent, run
  locally (`openclaw agent --local --json`), in /home/user/workspace: with a model key in the
  environment (ANTHROPIC_API_KEY or OPENAI_API_KEY), or against the OpenAI-compatible endpoint
  `base_url`, registered as the provider `custom` with the model `model`.
- `run_script(script)`: Python in the workspace.
"""

import json
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


def _use_endpoint(base_url: str, model: str, api_key: str) -> None:
    """Registers an OpenAI-compatible endpoint as the provider `custom` (models.providers in
    ~/.openclaw/openclaw.json) and makes `custom/<model>` the agents' default model."""
    path = os.path.expanduser("~/.openclaw/openclaw.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    config = {
        "models": {"mode": "merge", "providers": {"custom": {
            "baseUrl": base_url, "apiKey": api_key or "none", "api": "openai-completions",
            "models": [{"id": model, "name": model, "reasoning": False, "input": ["text"],
                        "contextWindow": 128000, "maxTokens": 8000}],
        }}},
        "agents": {"defaults": {"model": {"primary": f"custom/{model}"}, "workspace": WORK}},
    }
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


@command(description="One OpenClaw agent turn, run locally (needs a model key, or base_url of an OpenAI-compatible endpoint)")
def agent(message: str, base_url: str = "", model: str = "", api_key: str = "", timeout: int = 600) -> dict:
    if base_url:
        _use_endpoint(base_url, model or "default", api_key)
    return _run(["openclaw", "agent", "--local", "--agent", "main", "--message", message, "--json"], timeout=timeout)


if __name__ == "__main__":
    os.makedirs(WORK, exist_ok=True)
    start(9000)

"""python-hello: agent-sandbox-server on port 9000 with two named commands and a custom route.

Run directly (the template's start command): `python3 /app/commands.py`.
"""

import os
import platform
import subprocess
import sys

from agent_sandbox.server import CapabilityGroup, ServerResponse, command, default_table, start

PORT = int(os.environ.get("PYTHON_HELLO_PORT", "9000"))


@command(description="Say hello")
def hello(name: str = "world", times: int = 1) -> dict:
    return {"message": " ".join([f"Hello, {name}!"] * times)}


@command(description="Run a Python script and return its output")
def run_script(code: str, timeout: int = 30) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


@default_table().route(
    "GET",
    "/custom/status/{item}",
    group=CapabilityGroup.SYSTEM,
    summary="Report the status of one item (python-hello's custom route).",
)
def status(req):
    return ServerResponse.ok(
        {
            "item": req.path_params["item"],
            "query": req.query,
            "template": "python-hello",
            "python": platform.python_version(),
        }
    )


if __name__ == "__main__":
    start(PORT)

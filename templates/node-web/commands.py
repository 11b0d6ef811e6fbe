"""node-web: agent-sandbox-server on 9000; `dev`, `build` and `start` drive the app in /app."""

import subprocess

from agent_sandbox.server import command, start

APP = "/app"


def _npm(script: str, background: bool) -> dict:
    if background:
        log = open(f"/tmp/node-web-{script}.log", "ab")
        p = subprocess.Popen(["npm", "run", script], cwd=APP, stdout=log, stderr=subprocess.STDOUT)
        return {"pid": p.pid, "log": log.name}
    done = subprocess.run(["npm", "run", "--silent", script], cwd=APP, capture_output=True, text=True, timeout=300)
    return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


@command(description="Start the app under nodemon (background)")
def dev() -> dict:
    return _npm("dev", background=True)


@command(description="Build the app (npm run build)")
def build() -> dict:
    return _npm("build", background=False)


@command(name="start", description="Start the app on port 3000 (background)")
def start_app() -> dict:
    return _npm("start", background=True)


if __name__ == "__main__":
    start(9000)

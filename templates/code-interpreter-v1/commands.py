"""code-interpreter-v1: agent-sandbox-server on 9000 and a stateful Python interpreter.

`run_code(code, context="default", timeout=60)` executes `code` in an IPython kernel (one per
context, started on first use and kept for the sandbox's life, driven through Jupyter's own
client), so variables, imports and functions survive between calls, as in the official code
interpreter. It answers with data, never a crash:

    {"context", "execution_count", "stdout", "stderr",
     "results": [{"text", "formats", "is_main_result", "png"?, "json"?}],
     "error": null | {"name", "value", "traceback"}}

`contexts()` lists the live contexts; `restart(context)` starts a context afresh.
The server's own routes (files, processes, /code/run of dev_tools, ...) are as in every template.
"""

import os
import queue
import re
import threading
import time

from agent_sandbox.server import command, start
from jupyter_client.manager import KernelManager

HOME = os.environ.get("HOME", "/home/user")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

_lock = threading.Lock()
# context -> (manager, client, lock held while a cell runs)
_kernels: dict = {}


def _kernel(context: str):
    with _lock:
        k = _kernels.get(context)
        if k is not None and k[0].is_alive():
            return k
        km = KernelManager(kernel_name="python3")
        # Charts come back as images (matplotlib's inline backend), not the Agg of scripts.
        env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
        km.start_kernel(cwd=HOME, env=env)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        k = (km, kc, threading.Lock())
        _kernels[context] = k
        return k


def _result(kind: str, data: dict) -> dict:
    r = {"text": data.get("text/plain"), "formats": sorted(data), "is_main_result": kind == "execute_result"}
    if "image/png" in data:
        r["png"] = data["image/png"]
    if "application/json" in data:
        r["json"] = data["application/json"]
    return r


@command(description="Run Python in a stateful interpreter: variables survive between calls of one context")
def run_code(code: str, context: str = "default", timeout: int = 60) -> dict:
    km, kc, busy = _kernel(context)
    out = {"context": context, "execution_count": None, "stdout": "", "stderr": "", "results": [], "error": None}
    with busy:
        msg_id = kc.execute(code, store_history=True)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                km.interrupt_kernel()
                out["error"] = {"name": "TimeoutError", "value": f"the cell ran longer than {timeout}s", "traceback": ""}
                # Drain until the interrupted cell reports idle, so the next call starts clean.
                _drain(kc, msg_id, 10)
                break
            try:
                msg = kc.get_iopub_msg(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out["stdout" if content.get("name") == "stdout" else "stderr"] += content.get("text", "")
            elif kind in ("execute_result", "display_data"):
                out["results"].append(_result(kind, content.get("data", {})))
                if kind == "execute_result":
                    out["execution_count"] = content.get("execution_count")
            elif kind == "execute_input":
                out["execution_count"] = content.get("execution_count")
            elif kind == "error":
                out["error"] = {
                    "name": content.get("ename"),
                    "value": content.get("evalue"),
                    "traceback": ANSI.sub("", "\n".join(content.get("traceback", []))),
                }
            elif kind == "status" and content.get("execution_state") == "idle":
                break
    return out


def _drain(kc, msg_id: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            msg = kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if (
            msg.get("parent_header", {}).get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"].get("execution_state") == "idle"
        ):
            return


@command(description="The interpreter contexts that are alive")
def contexts() -> dict:
    with _lock:
        return {"contexts": sorted(c for c, k in _kernels.items() if k[0].is_alive())}


@command(description="Start a context afresh (its variables are gone)")
def restart(context: str = "default") -> dict:
    with _lock:
        k = _kernels.pop(context, None)
    if k is not None:
        k[1].stop_channels()
        k[0].shutdown_kernel(now=True)
    return {"context": context, "restarted": k is not None}


@command(description="Versions of the interpreter and its libraries (no key, no network)")
def version() -> dict:
    import importlib.metadata as md
    import platform

    names = ["numpy", "pandas", "matplotlib", "ipykernel", "jupyter_client", "agent-sandbox-server"]
    return {"python": platform.python_version(), "packages": {n: md.version(n) for n in names}}


if __name__ == "__main__":
    start(9000)

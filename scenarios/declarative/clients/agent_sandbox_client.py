"""Drives the product's own client (PyPI `agent-sandbox-client`) against the provider of a
scenario-run run: its native `Sandbox` (`agent_sandbox.api.sandbox.Sandbox`, what the
declarative layer uses) and its declarative remote execution (`agent_sandbox.declarative.sandbox`).

Reads what `{{ provider.env }}` passes: ABX_SANDBOX_API_KEY, ABX_SANDBOX_BASE_URL,
ABX_SANDBOX_DOMAIN (on the e2b preset only the E2B_* names, mapped here) and E2E_RUN_TAG
(`e2e=<run id>`), which every sandbox made here carries so the run's session-end sweep removes
one this script leaves behind. The decorator takes no metadata, so `Sandbox.create` is wrapped
to add the tag to the sandboxes it makes too (the call itself is the client's own).

  agent_sandbox_client.py sandbox          Sandbox.create (tagged), commands.run, files.write/
                                           read/list; leaves the sandbox running; one JSON line
  agent_sandbox_client.py remote ID TPL    @sandbox on sandbox ID: a wheel installed through
                                           `packages`, a function called, its JSON result; a
                                           raising function; then @sandbox's own lifecycle on
                                           template TPL (created, called, destroyed); one JSON line
  agent_sandbox_client.py registered TPL   @sandbox.register of `run_script`, then
                                           sandbox.run("run_script"): a sandbox made, POST
                                           /commands/run_script to its
                                           agent-sandbox-server through its https port host
                                           (https://9000-<id>.<domain>), destroyed; TPL stands
                                           in for the code-interpreter-v1 sandbox.run makes
                                           (a template whose server has `run_script`); one
                                           JSON line
  agent_sandbox_client.py kill ID          Sandbox.kill_by_id(ID); prints {"killed": true}
"""

import asyncio
import io
import json
import os
import sys
import zipfile

# The e2b preset of scenario-run hands out only the E2B_* names; the client reads ABX_*.
for abx, e2b in (
    ("ABX_SANDBOX_API_KEY", "E2B_API_KEY"),
    ("ABX_SANDBOX_BASE_URL", "E2B_API_URL"),
    ("ABX_SANDBOX_DOMAIN", "E2B_DOMAIN"),
):
    if not os.environ.get(abx) and os.environ.get(e2b):
        os.environ[abx] = os.environ[e2b]

import importlib.metadata  # noqa: E402

from agent_sandbox.api import sandbox as api_sandbox  # noqa: E402
from agent_sandbox.declarative import sandbox  # noqa: E402
from agent_sandbox.models.errors import SandboxNotFoundError  # noqa: E402

Sandbox = api_sandbox.Sandbox
CLIENT = "agent-sandbox-client"
# The sandbox's system pip refuses installs without this (PEP 668 on Debian-based images).
ENVS = {"FROM_ABX": "yes", "PIP_BREAK_SYSTEM_PACKAGES": "1"}
WHEEL = "/home/user/abx/e2e_helpers-1.2.3-py3-none-any.whl"


def run_tag():
    key, value = os.environ["E2E_RUN_TAG"].split("=", 1)
    return {key: value}


# Every sandbox the client makes here, including those @sandbox makes, carries the run tag.
_create = Sandbox.create
created = []
# Templates asked for by name that another stands in for (see `registered`).
stand_ins = {}


async def _tagged_create(*args, metadata=None, **kwargs):
    if kwargs.get("template") in stand_ins:
        kwargs["template"] = stand_ins[kwargs["template"]]
    # serve builds an official template on its first create (a minute or two on a new
    # machine); the client's default request timeout would give up first.
    kwargs.setdefault("request_timeout", 1800)
    sb = await _create(*args, metadata={**run_tag(), "client": CLIENT, **(metadata or {})}, **kwargs)
    created.append(sb.id)
    return sb


Sandbox.create = staticmethod(_tagged_create)


def wheel():
    """A pure-Python wheel made here: the install works where sandboxes have no network."""
    name, ver = "e2e_helpers", "1.2.3"
    info = f"{name}-{ver}.dist-info"
    files = {
        f"{name}.py": "VERSION = '1.2.3'\ndef spread(xs):\n    return max(xs) - min(xs)\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: e2e-helpers\nVersion: {ver}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return buf.getvalue()


async def make_sandbox():
    sb = await Sandbox.create(envs=ENVS, timeout=300)
    try:
        r = await sb.commands.run('sh -c \'echo "abx says $FROM_ABX"; echo to-stderr >&2; id -un\'')
        failed = await sb.commands.run("sh -c 'echo failing >&2; exit 7'")
        await sb.files.write("/home/user/abx/hello.txt", "written by agent-sandbox-client\n")
        read = await sb.files.read("/home/user/abx/hello.txt")
        names = sorted(f.name for f in await sb.files.list("/home/user/abx"))
        info = await Sandbox.get_info_by_id(sb.id)
        print(json.dumps({
            "client": importlib.metadata.version(CLIENT),
            "id": sb.id,
            "stdout": r.stdout,
            "stderr": r.stderr,
            "exit_code": r.exit_code,
            "failed_exit_code": failed.exit_code,
            "failed_stderr": failed.stderr,
            "read": read,
            "listed": names,
            "metadata": info.metadata,
            "state": info.status.value,
        }))
        await sb.close()
    except BaseException:
        await sb.kill()
        raise


async def upload_wheel(sandbox_id):
    sb = await Sandbox.connect(sandbox_id)
    try:
        await sb.files.write(WHEEL, wheel())
    finally:
        await sb.close()


async def gone(sandbox_id):
    try:
        info = await Sandbox.get_info_by_id(sandbox_id)
    except SandboxNotFoundError:
        return True
    return info.status.value not in ("running", "paused")


def remote(sandbox_id, template):
    asyncio.run(upload_wheel(sandbox_id))

    # The declarative flow on the tagged sandbox: `packages` pip-installs the wheel, the
    # function's source and JSON arguments run there, the last stdout line is its JSON result.
    @sandbox(sandbox_id=sandbox_id, packages=[WHEEL])
    def summarize(values, label="values"):
        import getpass
        import json
        import os
        import statistics

        import e2e_helpers

        os.makedirs("/home/user/abx", exist_ok=True)
        with open("/home/user/abx/remote.json", "w") as f:
            json.dump({"label": label, "values": values}, f)
        return {"n": len(values), "mean": statistics.mean(values), "spread": e2e_helpers.spread(values),
                "helpers": e2e_helpers.VERSION, "label": label, "user": getpass.getuser()}

    result = summarize([3, 1, 4, 1, 5], label="from the decorator")

    @sandbox(sandbox_id=sandbox_id)
    def explode(x):
        raise ValueError(f"remote failure {x}")

    try:
        explode(42)
        raised = None
    except RuntimeError as e:
        raised = str(e)

    # @sandbox's own lifecycle: it creates a sandbox (tagged through the wrapper), runs the
    # function there and destroys it.
    before = len(created)

    @sandbox(template=template, timeout=300, envs={"FROM_DECORATOR": "own"})
    def own(a, b):
        import os

        return {"product": a * b, "env": os.environ.get("FROM_DECORATOR")}

    own_result = own(6, 7)
    own_ids = created[before:]
    print(json.dumps({
        "result": result,
        "raised": raised,
        "own": own_result,
        "own_ids": own_ids,
        "own_gone": all(asyncio.run(gone(i)) for i in own_ids),
    }))


def registered(template):
    # sandbox.run always makes its sandbox from `code-interpreter-v1`, and the server there
    # must know the command: TPL (python-hello, deployed by the scenario) has `run_script`.
    stand_ins["code-interpreter-v1"] = template

    @sandbox.register
    def run_script(code: str, timeout: int = 30) -> dict:
        import subprocess
        import sys

        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}

    listed = sandbox.list_registered()
    before = len(created)
    # Arguments are coerced to the declared types: the string "20" is sent as 20.
    result = sandbox.run("run_script", code="import getpass; print(6 * 7, getpass.getuser())", timeout="20")
    ids = created[before:]
    print(json.dumps({
        "listed": listed,
        "result": result,
        "ids": ids,
        "gone": all(asyncio.run(gone(i)) for i in ids),
    }))


def kill(sandbox_id):
    asyncio.run(Sandbox.kill_by_id(sandbox_id))
    print(json.dumps({"killed": asyncio.run(gone(sandbox_id))}))


if __name__ == "__main__":
    if sys.argv[1] == "sandbox":
        asyncio.run(make_sandbox())
    elif sys.argv[1] == "remote":
        remote(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "registered":
        registered(sys.argv[2])
    else:
        kill(sys.argv[2])

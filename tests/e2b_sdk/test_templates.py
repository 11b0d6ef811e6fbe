"""Template builds (protocol doc §8.1) with the SDK's own `Template.build()`: its uploads of
COPY contexts, its status polling and its error handling are the judge of serve's routes.

serve builds with its local provider, which needs root and bubblewrap; elsewhere these skip.
"""

import json
import os
import shutil
import urllib.error
import urllib.request
import uuid

import pytest
from e2b import Sandbox

e2b = pytest.importorskip("e2b")
Template = getattr(e2b, "Template", None)

pytestmark = [
    pytest.mark.skipif(Template is None, reason="this e2b has no Template build API"),
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("bwrap") is None, reason="builds need root and bwrap"),
]


def api(method: str, path: str) -> int:
    req = urllib.request.Request(
        os.environ["E2B_API_URL"] + path, method=method, headers={"X-API-KEY": os.environ["E2B_API_KEY"]}
    )
    try:
        with urllib.request.urlopen(req) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture
def context(tmp_path):
    (tmp_path / "hello.py").write_text('print("hi from the sdk")\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "data.txt").write_text("data\n")
    return tmp_path


def test_build_copy_env_workdir_start_and_delete(context):
    name = f"sdk-{uuid.uuid4().hex[:8]}"
    t = (
        Template(file_context_path=str(context))
        .from_image("python:3.11-slim")
        .set_envs({"GREETING": "hello"})
        .set_workdir("/app")
        .copy("hello.py", "/app/hello.py")
        .copy("pkg", "/app/pkg")
        .run_cmd("echo built by $GREETING > /app/marker")
        .set_start_cmd("echo started > /tmp/started; sleep 1000", "test -f /tmp/started")
    )
    logs = []
    info = Template.build(t, alias=name, cpu_count=1, memory_mb=512, on_build_logs=lambda e: logs.append(e.message))
    try:
        # serve ran its local provider's builder, which says what the FROM image became.
        assert any("FROM python:3.11-slim maps to " in m for m in logs), logs
        sb = Sandbox.create(name, timeout=60)
        try:
            r = sb.commands.run("cat /app/marker /app/pkg/data.txt; python3 /app/hello.py; pwd; cat /tmp/started")
            assert r.stdout == "built by hello\ndata\nhi from the sdk\n/app\nstarted\n"
        finally:
            sb.kill()
    finally:
        assert api("DELETE", f"/templates/{info.template_id}") == 204
    assert api("GET", f"/templates/{info.template_id}") == 404


def test_a_failing_step_raises_build_exception_naming_it(context):
    bad = Template(file_context_path=str(context)).from_image("python:3.11-slim").run_cmd("echo ok").run_cmd("exit 3")
    name = f"sdk-bad-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception) as e:
        Template.build(bad, alias=name)
    assert type(e.value).__name__ == "BuildException"
    assert "step 2 (RUN exit 3) failed: the command exited with 3" in str(e.value)
    # The failed template is still known; delete it.
    with urllib.request.urlopen(
        urllib.request.Request(os.environ["E2B_API_URL"] + "/templates", headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    ) as r:
        ids = [t["templateID"] for t in json.load(r) if name in t["names"]]
    assert len(ids) == 1
    assert api("DELETE", f"/templates/{ids[0]}") == 204

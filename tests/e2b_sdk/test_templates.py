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


def test_from_ubuntu_and_a_run_as_a_missing_user_fails_as_e2b_says():
    """`from_image("ubuntu:22.04")` is the offline Ubuntu recipe (a step checks it is jammy);
    a `run_cmd` as a user the image lacks fails with E2B's own words, which the official
    suite's test_run_command_as_user_that_does_not_exist looks for."""
    name = f"sdk-ubuntu-{uuid.uuid4().hex[:8]}"
    t = (
        Template()
        .from_image("ubuntu:22.04")
        .run_cmd('. /etc/os-release && test "$ID $VERSION_ID" = "ubuntu 22.04"')
        .run_cmd("whoami", user="root123")
    )
    with pytest.raises(Exception) as e:
        Template.build(t, alias=name)
    assert type(e.value).__name__ == "BuildException"
    assert (
        "step 2 (RUN whoami root123) failed: failed to run command 'whoami': command failed: "
        "unauthenticated: invalid username: 'root123'" in str(e.value)
    ), str(e.value)
    delete_template(name)


def stack_auth_registry():
    """The local stack's registry that asks for a login (.ci/local-stack.sh writes it into
    $STACK_DIR/env, with base-python pushed there): (host:port, user, password) or None."""
    names = ["LOCAL_STACK_AUTH_REGISTRY", "LOCAL_STACK_AUTH_REGISTRY_USERNAME", "LOCAL_STACK_AUTH_REGISTRY_PASSWORD"]
    values = [os.environ.get(n, "") for n in names]
    return tuple(values) if all(values) else None


def delete_template(name: str):
    with urllib.request.urlopen(
        urllib.request.Request(os.environ["E2B_API_URL"] + "/templates", headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    ) as r:
        ids = [t["templateID"] for t in json.load(r) if name in t["names"]]
    for i in ids:
        assert api("DELETE", f"/templates/{i}") == 204


@pytest.mark.skipif(stack_auth_registry() is None, reason="no authenticated registry (.ci/local-stack.sh up, source its env)")
def test_from_image_of_a_registry_that_asks_for_a_login():
    """`from_image(image, username=, password=)`: the SDK sends the login as fromImageRegistry,
    serve pulls the image with it; without the login the same build fails."""
    registry, user, password = stack_auth_registry()
    image = f"{registry}/base-python:latest"

    name = f"sdk-noauth-{uuid.uuid4().hex[:8]}"
    with pytest.raises(Exception) as e:
        Template.build(Template().from_image(image).run_cmd("true"), alias=name)
    assert type(e.value).__name__ == "BuildException"
    why = str(e.value)
    assert f"pull {image}" in why and ("username and password" in why or "401" in why), why
    delete_template(name)

    name = f"sdk-auth-{uuid.uuid4().hex[:8]}"
    t = Template().from_image(image, username=user, password=password).run_cmd("echo pulled with a login > /tmp/marker")
    logs = []
    Template.build(t, alias=name, on_build_logs=lambda e: logs.append(e.message))
    try:
        assert any(f"FROM {image} maps to {registry}/base-python@sha256:" in m for m in logs), logs
        assert not any(password in m for m in logs), "the registry password shows in the build log"
        sb = Sandbox.create(template=name, timeout=60)
        try:
            # base-python carries procps and curl (local-stack.sh); the marker is the RUN's.
            r = sb.commands.run("cat /tmp/marker; command -v ps curl python3", user="root")
            assert r.stdout == "pulled with a login\n/usr/bin/ps\n/usr/bin/curl\n/usr/bin/python3\n", r.stdout
        finally:
            sb.kill()
    finally:
        delete_template(name)


@pytest.mark.skipif(not hasattr(Template, "from_dockerfile"), reason="this e2b has no from_dockerfile")
def test_a_dockerfile_template_with_copy_and_run(context):
    """`Template().from_dockerfile(...)`: the SDK turns the Dockerfile into steps (its COPY
    contexts uploaded, its RUN run), serve builds them, and a sandbox has the result."""
    dockerfile = (
        "FROM python:3.11-slim\n"
        "WORKDIR /app\n"
        "COPY hello.py /app/hello.py\n"
        "COPY pkg /app/pkg\n"
        "ENV GREETING=hi\n"
        'RUN python3 /app/hello.py > /app/out.txt && cat /app/pkg/data.txt >> /app/out.txt && echo "$GREETING" >> /app/out.txt\n'
    )
    t = Template(file_context_path=str(context)).from_dockerfile(dockerfile)
    name = f"sdk-dockerfile-{uuid.uuid4().hex[:8]}"
    info = Template.build(t, alias=name)
    try:
        sb = Sandbox.create(template=name, timeout=60)
        try:
            r = sb.commands.run("cat /app/out.txt; echo $GREETING; whoami; pwd")
            # The SDK appends `USER user` to a Dockerfile without a USER; the WORKDIR is the Dockerfile's.
            assert r.stdout == "hi from the sdk\ndata\nhi\nhi\nuser\n/app\n", r.stdout
        finally:
            sb.kill()
    finally:
        assert api("DELETE", f"/templates/{info.template_id}") == 204

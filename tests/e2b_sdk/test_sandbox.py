"""Control plane: create, get_info, list with a metadata query, connect, set_timeout, kill,
authentication, and isolation between sandboxes."""

import os
import re
import time

import pytest
from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from conftest import RUN_ID


def test_create_with_metadata_and_envs():
    sb = Sandbox.create(metadata={"owner": "me", "run": RUN_ID}, envs={"FOO": "bar", "TWO": "a b"}, timeout=60)
    try:
        assert re.fullmatch(r"[a-z0-9]{20}", sb.sandbox_id)
        r = sb.commands.run('echo "$FOO|$TWO|$E2B_SANDBOX|$E2B_SANDBOX_ID"')
        assert r.stdout == f"bar|a b|true|{sb.sandbox_id}\n"
        # Create-time envs reach background commands too, and per-command envs win.
        r = sb.commands.run("echo $FOO", envs={"FOO": "override"})
        assert r.stdout == "override\n"
        info = sb.get_info()
        assert info.metadata == {"owner": "me", "run": RUN_ID}
    finally:
        sb.kill()


def test_get_info(sandbox):
    info = sandbox.get_info()
    assert info.sandbox_id == sandbox.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.metadata["run"] == RUN_ID
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert 118 <= lifetime <= 122, lifetime
    assert info.cpu_count >= 1 and info.memory_mb > 0


def test_list_with_metadata_query():
    tag = f"t{time.time_ns()}"
    a = Sandbox.create(metadata={"tag": tag, "k y": "v&1", "run": RUN_ID}, timeout=60)
    b = Sandbox.create(metadata={"tag": tag, "k y": "other", "run": RUN_ID}, timeout=60)
    c = Sandbox.create(metadata={"tag": "unrelated", "run": RUN_ID}, timeout=60)
    try:
        both = Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert sorted(s.sandbox_id for s in both) == sorted([a.sandbox_id, b.sandbox_id])
        # Keys and values with spaces and '&' survive the SDK's layered encoding.
        only_a = Sandbox.list(query=SandboxQuery(metadata={"tag": tag, "k y": "v&1"})).next_items()
        assert [s.sandbox_id for s in only_a] == [a.sandbox_id]
        assert only_a[0].metadata == {"tag": tag, "k y": "v&1", "run": RUN_ID}
        assert only_a[0].state == SandboxState.RUNNING
        mine = Sandbox.list(query=SandboxQuery(metadata={"run": RUN_ID})).next_items()
        assert {a.sandbox_id, b.sandbox_id, c.sandbox_id} <= {s.sandbox_id for s in mine}
        none = Sandbox.list(query=SandboxQuery(metadata={"tag": tag + "x"})).next_items()
        assert none == []
    finally:
        for s in (a, b, c):
            s.kill()


def test_list_paginates():
    tag = f"p{time.time_ns()}"
    made = [Sandbox.create(metadata={"tag": tag, "run": RUN_ID}, timeout=60) for _ in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        first = pager.next_items()
        assert len(first) == 2 and pager.has_next
        second = pager.next_items()
        assert len(second) == 1 and not pager.has_next
        assert sorted(s.sandbox_id for s in first + second) == sorted(s.sandbox_id for s in made)
    finally:
        for s in made:
            s.kill()


def test_connect(sandbox):
    sandbox.files.write("/home/user/marker.txt", "from the first handle")
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.sandbox_id == sandbox.sandbox_id
    assert again.files.read("/home/user/marker.txt") == "from the first handle"
    assert again.commands.run("cat ~/marker.txt").stdout == "from the first handle"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("doesnotexist000000000")


def test_set_timeout_extends_and_expires(sandbox):
    sandbox.set_timeout(600)
    info = sandbox.get_info()
    assert 595 <= (info.end_at - info.started_at).total_seconds() <= 610
    sandbox.set_timeout(2)
    assert sandbox.is_running()
    deadline = time.time() + 15
    while time.time() < deadline and sandbox.is_running():
        time.sleep(0.25)
    assert not sandbox.is_running()
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()


def test_kill():
    sb = Sandbox.create(timeout=60)
    assert sb.is_running()
    assert sb.kill() is True
    assert not sb.is_running()
    assert Sandbox.kill(sb.sandbox_id) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sb.sandbox_id)
    ids = [s.sandbox_id for s in Sandbox.list().next_items()]
    assert sb.sandbox_id not in ids


def test_wrong_key_is_refused():
    wrong = "e2b_" + "0" * 40
    assert wrong != os.environ["E2B_API_KEY"]
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key=wrong)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=wrong).next_items()


def test_sandboxes_are_isolated():
    a = Sandbox.create(timeout=60)
    b = Sandbox.create(timeout=60)
    try:
        a.files.write("/tmp/same-path.txt", "A")
        b.files.write("/tmp/same-path.txt", "B")
        a.commands.run("echo a-home > ~/home.txt")
        assert a.files.read("/tmp/same-path.txt") == "A"
        assert b.files.read("/tmp/same-path.txt") == "B"
        assert b.commands.run("cat /tmp/same-path.txt").stdout == "B"
        assert not b.files.exists("/home/user/home.txt")
        # A process in one sandbox is invisible to the other.
        h = a.commands.run("sleep 30", background=True)
        ps_b = b.commands.run("ps -eo args").stdout
        assert "sleep 30" not in ps_b
        assert "sleep 30" in a.commands.run("ps -eo args").stdout
        h.kill()
    finally:
        a.kill()
        b.kill()

"""Egress through the SDK (`allow_internet_access=`, `network=` on create, `update_network`,
`get_info`): serve's local sandboxes reach the internet by default, as on E2B, never this
host, and decide by address and (for TLS) by server name. "The internet" is what this machine
reaches: the package registries (PyPI and npm). Nothing else outside is contacted."""

import socket
import subprocess
import threading

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from conftest import RUN_ID

ALL = "0.0.0.0/0"

PROBE = """python3 -c "
import socket, errno
try:
    print(socket.create_connection(('{addr}', {port}), 3).recv(5).decode() or 'closed')
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
" """


def status(sb, url):
    """The HTTP status of a GET from inside, or curl's exit code as `rc=N`."""
    r = sb.commands.run(f"curl -s -o /dev/null -m 20 -w '%{{http_code}}' {url} || echo \" rc=$?\"")
    return r.stdout.strip()


def host_addresses():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    return [words[i + 1].split("/")[0] for i, w in enumerate(words) if w == "inet"]


@pytest.fixture
def hello_server():
    """A server on every host address that answers each connection with `hello`."""
    srv = socket.socket()
    srv.bind(("0.0.0.0", 0))
    srv.listen()

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            c.sendall(b"hello")
            c.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def create(**kw):
    return Sandbox.create(metadata={"suite": "e2b-sdk", "run": RUN_ID}, timeout=120, **kw)


def test_a_sandbox_reaches_the_internet_by_default():
    sb = create()
    try:
        assert status(sb, "https://pypi.org/simple/six/") == "200"
        assert sb.get_info().allow_internet_access is True
    finally:
        sb.kill()


def test_a_name_in_allow_out_decides_tls_by_its_server_name():
    # PyPI and npm share their address on some networks: only the server name tells them apart.
    sb = create(network={"allow_out": ["pypi.org", "*.pythonhosted.org"], "deny_out": [ALL]})
    try:
        assert status(sb, "https://pypi.org/simple/six/") == "200"
        assert status(sb, "https://registry.npmjs.org/is-number").startswith(("000", " rc="))
        info = sb.get_info()
        assert info.allow_internet_access is False
    finally:
        sb.kill()


def test_internet_access_off_and_an_update_that_turns_it_back_on():
    sb = create(allow_internet_access=False)
    try:
        assert status(sb, "https://pypi.org/simple/six/") != "200"
        assert sb.get_info().allow_internet_access is False
        sb.update_network({})
        assert status(sb, "https://pypi.org/simple/six/") == "200"
        assert sb.get_info().allow_internet_access is True
        sb.update_network({"deny_out": [ALL]})
        assert status(sb, "https://pypi.org/simple/six/") != "200"
    finally:
        sb.kill()


def test_the_host_is_never_reached_whatever_the_policy(hello_server):
    for network in (None, {"allow_out": [ALL, "*"]}):
        sb = create(network=network) if network else create()
        try:
            for addr in host_addresses() + ["10.0.2.2"]:
                got = sb.commands.run(PROBE.format(addr=addr, port=hello_server)).stdout.strip()
                assert got != "hello", f"{addr}:{hello_server} reached with {network}"
        finally:
            sb.kill()


def test_a_domain_in_deny_out_is_refused_as_e2b_refuses_it():
    with pytest.raises(SandboxException) as e:
        create(network={"deny_out": ["example.com"]})
    assert "allowOut only" in str(e.value)

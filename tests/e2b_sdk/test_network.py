"""Egress policies through the SDK (`network=` on create, `update_network`, `get_info`):
serve enforces them in the local sandbox's network namespace. The target is a server this
test starts on one of this host's addresses (the internet is not reachable from a local
sandbox, see the README's "Network policy")."""

import socket
import subprocess
import threading

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from conftest import RUN_ID

PROBE = """python3 -c "
import socket, errno
try:
    print(socket.create_connection(('{addr}', {port}), 3).recv(5).decode())
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
" """


def host_address() -> str:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    assert "inet" in words, f"this host has no global IPv4 address to test egress with: {out.stdout}"
    return words[words.index("inet") + 1].split("/")[0]


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
    yield host_address(), srv.getsockname()[1]
    srv.close()


def reach(sb, addr, port):
    return sb.commands.run(PROBE.format(addr=addr, port=port)).stdout.strip()


def test_allow_out_reaches_exactly_the_named_address_and_updates_replace_it(hello_server):
    addr, port = hello_server
    sb = Sandbox.create(
        metadata={"run": RUN_ID}, timeout=60, network={"allow_out": [addr], "deny_out": ["0.0.0.0/0"]}
    )
    try:
        assert reach(sb, addr, port) == "hello"
        assert reach(sb, "10.255.255.1", port) == "ENETUNREACH"
        info = sb.get_info()
        assert info.allow_internet_access is False
        sb.update_network({})
        assert reach(sb, addr, port) == "ENETUNREACH"
        sb.update_network({"allow_out": [f"{addr}/32"]})
        assert reach(sb, addr, port) == "hello"
    finally:
        sb.kill()


def test_without_a_policy_nothing_outside_is_reached(hello_server):
    addr, port = hello_server
    sb = Sandbox.create(metadata={"run": RUN_ID}, timeout=60)
    try:
        assert reach(sb, addr, port) == "ENETUNREACH"
    finally:
        sb.kill()


def test_domain_names_are_refused_not_ignored():
    with pytest.raises(SandboxException) as e:
        Sandbox.create(metadata={"run": RUN_ID}, timeout=60, network={"allow_out": ["example.com"]})
    assert "domain names" in str(e.value)

"""Egress through the SDK (`allow_internet_access=`, `network=` on create, `update_network`,
`get_info`): serve's local sandboxes reach the internet by default, as on E2B, never this
host, and decide by address and (for TLS) by server name. "The internet" is what this machine
reaches: the package registries (PyPI, npm, Debian's apt). Nothing else outside is contacted.

The official suites' network tests curl 1.1.1.1, 8.8.8.8 and a public host, so official.sh
deselects them (official-deselect.txt); what they prove is proven here with registry hosts:
an allowed address wins over denying all, one address denied and the rest reached, all
denied, `update_network` applying rules and clearing them, internet access by default,
enabled and disabled. The registries may share one address (they do behind this machine's
egress proxy), so "one address and not the others" is told apart by port (HTTPS to PyPI on
443, HTTP to Debian's apt on 80) and by name, and the address is the one the sandbox
resolves. Probes name the address with `curl --resolve`, as the official tests name an IP,
so a rule is what decides, not whether DNS answered."""

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


PYPI = "https://pypi.org/simple/six/"
NPM = "https://registry.npmjs.org/is-number"
APT = "http://deb.debian.org/debian/dists/bookworm/Release"


def status(sb, url, addr=None):
    """The HTTP status of a GET from inside, or curl's exit code as `rc=N`; with `addr`, the
    URL's host is that address (`--resolve`, no DNS)."""
    resolve = ""
    if addr:
        scheme, _, rest = url.partition("://")
        host = rest.split("/")[0]
        resolve = f"--resolve {host}:{443 if scheme == 'https' else 80}:{addr}"
    r = sb.commands.run(
        f"curl -s -o /dev/null --connect-timeout 5 -m 20 -w '%{{http_code}}' {resolve} {url} || echo \" rc=$?\""
    )
    return r.stdout.strip()


def blocked(code):
    return code.startswith(("000", " rc="))


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


RESOLVE = "python3 -c \"import socket; print(socket.gethostbyname('{host}'))\""


@pytest.fixture(scope="module")
def registry():
    """The addresses of the registries as a sandbox with the open policy resolves them."""
    sb = create()
    try:
        hosts = ("pypi.org", "registry.npmjs.org", "deb.debian.org")
        return {h: sb.commands.run(RESOLVE.format(host=h)).stdout.strip() for h in hosts}
    finally:
        sb.kill()


def test_a_sandbox_reaches_the_internet_by_default():
    sb = create()
    try:
        assert status(sb, "https://pypi.org/simple/six/") == "200"
        assert sb.get_info().allow_internet_access is True
    finally:
        sb.kill()


def test_internet_access_enabled_reaches_https_and_http():
    sb = create(allow_internet_access=True)
    try:
        assert status(sb, PYPI) == "200"
        assert status(sb, APT) == "200"
        assert sb.get_info().allow_internet_access is True
    finally:
        sb.kill()


def test_internet_access_disabled_reaches_nothing_even_by_address(registry):
    sb = create(allow_internet_access=False)
    try:
        assert blocked(status(sb, PYPI, registry["pypi.org"]))
        assert blocked(status(sb, APT, registry["deb.debian.org"]))
        # Nor does DNS answer (E2B's nameserver, 8.8.8.8, is denied too).
        assert sb.commands.run(RESOLVE.format(host="pypi.org") + " || echo no-dns").stdout.strip().endswith("no-dns")
    finally:
        sb.kill()


def test_deny_all_then_an_allowed_address_and_port_wins(registry):
    # The official test_allow_specific_ip_with_deny_all and test_allow_takes_precedence_over_deny:
    # deny everything, allow one destination; it is reached, the rest is not.
    addr = registry["pypi.org"]
    sb = create(network={"deny_out": [ALL], "allow_out": [f"{addr}:443"]})
    try:
        assert status(sb, PYPI, addr) == "200"
        assert blocked(status(sb, APT, registry["deb.debian.org"]))
        assert sb.get_info().allow_internet_access is False
    finally:
        sb.kill()
    # Allowing the whole address (both ports) lets both through.
    sb = create(network={"deny_out": [ALL], "allow_out": [addr, registry["deb.debian.org"]]})
    try:
        assert status(sb, PYPI, addr) == "200"
        assert status(sb, APT, registry["deb.debian.org"]) == "200"
    finally:
        sb.kill()


def test_an_allowed_name_wins_over_its_denied_address(registry):
    # allow_out beats deny_out across kinds: the address is denied, one name on it allowed.
    addr = registry["pypi.org"]
    sb = create(network={"deny_out": [addr], "allow_out": ["pypi.org"]})
    try:
        assert status(sb, PYPI) == "200"
        if registry["registry.npmjs.org"] == addr:
            assert blocked(status(sb, NPM))
        if registry["deb.debian.org"] == addr:
            assert blocked(status(sb, APT, addr))
    finally:
        sb.kill()


def test_deny_one_destination_and_the_rest_is_reached(registry):
    # The official test_deny_specific_ip: one destination denied, everything else reached.
    apt = registry["deb.debian.org"]
    sb = create(network={"deny_out": [f"{apt}:80"]})
    try:
        assert blocked(status(sb, APT, apt))
        assert status(sb, PYPI) == "200"
        assert sb.get_info().allow_internet_access is True
    finally:
        sb.kill()
    # The whole address denied: both ports, while DNS (another address) still answers.
    sb = create(network={"deny_out": [apt]})
    try:
        assert blocked(status(sb, APT, apt))
        if registry["pypi.org"] == apt:
            assert blocked(status(sb, PYPI, apt))
        assert sb.commands.run(RESOLVE.format(host="pypi.org")).stdout.strip() == registry["pypi.org"]
    finally:
        sb.kill()


def test_deny_all_reaches_nothing(registry):
    # The official test_deny_all_traffic (its `all_traffic` selector is 0.0.0.0/0).
    sb = create(network={"deny_out": [ALL]})
    try:
        assert blocked(status(sb, PYPI, registry["pypi.org"]))
        assert blocked(status(sb, NPM, registry["registry.npmjs.org"]))
        assert blocked(status(sb, APT, registry["deb.debian.org"]))
        assert sb.get_info().allow_internet_access is False
    finally:
        sb.kill()


def test_update_network_applies_a_deny_to_a_running_sandbox(registry):
    # The official test_update_network_applies_restrictions.
    apt = registry["deb.debian.org"]
    sb = create()
    try:
        assert status(sb, APT, apt) == "200"
        sb.update_network({"deny_out": [f"{apt}:80"]})
        assert blocked(status(sb, APT, apt))
        assert status(sb, PYPI) == "200"
    finally:
        sb.kill()


def test_update_network_with_nothing_clears_the_rules(registry):
    # The official test_update_network_clears_existing_rules: omitted fields are cleared.
    addr = registry["pypi.org"]
    sb = create(network={"deny_out": [ALL], "allow_out": [f"{addr}:443"]})
    try:
        assert blocked(status(sb, APT, registry["deb.debian.org"]))
        sb.update_network({})
        assert status(sb, APT) == "200"
        assert status(sb, PYPI) == "200"
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

"""get_host and HTTP into a server running inside the sandbox, through the
`{port}-{id}.localhost:PORT` host routing of scenario-run serve, over plain HTTP and over
HTTPS as the SDKs build the URL (`https://{get_host(port)}`: `*.localhost` resolves through
libnss-myhostname, and serve-lib.sh makes httpx trust serve's CA). Ports are behind E2B's
private ingress unless create asks for public traffic: a request carries the sandbox's
`traffic_access_token` as `e2b-traffic-access-token`, or is refused with 403, as E2B's proxy
does."""

import time

import httpx
from e2b import Sandbox

from conftest import RUN_ID, server_port


def get_via_host(host: str, path: str = "/", headers: dict | None = None) -> httpx.Response:
    # `*.localhost` does not resolve under plain glibc: connect to the server and name the
    # sandbox port in the Host header, as a browser or curl would after resolving it.
    return httpx.get(f"http://127.0.0.1:{server_port()}{path}", headers={"Host": host, **(headers or {})}, timeout=5)


def traffic(sandbox) -> dict:
    token = sandbox.traffic_access_token
    assert isinstance(token, str) and len(token) == 64, token
    return {"e2b-traffic-access-token": token}


def test_get_host_and_http(sandbox):
    host = sandbox.get_host(8080)
    assert host == f"8080-{sandbox.sandbox_id}.localhost:{server_port()}"
    sandbox.files.write("/home/user/www/index.html", f"hello from {sandbox.sandbox_id}")
    sandbox.commands.run("python3 -m http.server 8080 --bind 127.0.0.1", cwd="/home/user/www", background=True)
    deadline = time.time() + 15
    r = None
    while time.time() < deadline:
        r = get_via_host(host, "/index.html", traffic(sandbox))
        if r.status_code == 200:
            break
        time.sleep(0.2)
    assert r is not None and r.status_code == 200, r and r.text
    assert r.text == f"hello from {sandbox.sandbox_id}"
    missing = get_via_host(host, "/missing.html", traffic(sandbox))
    assert missing.status_code == 404
    # The E2B edge's other form: a bare host plus the sandbox id and port headers.
    r = httpx.get(
        f"http://127.0.0.1:{server_port()}/index.html",
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8080", **traffic(sandbox)},
        timeout=5,
    )
    assert r.status_code == 200 and r.text == f"hello from {sandbox.sandbox_id}"


def test_ports_refuse_requests_without_the_traffic_token(sandbox):
    host = sandbox.get_host(8080)
    sandbox.files.write("/home/user/www/index.html", "private")
    sandbox.commands.run("python3 -m http.server 8080 --bind 127.0.0.1", cwd="/home/user/www", background=True)
    deadline = time.time() + 15
    while time.time() < deadline and get_via_host(host, "/", traffic(sandbox)).status_code != 200:
        time.sleep(0.2)
    assert get_via_host(host, "/index.html", traffic(sandbox)).text == "private"
    for headers, why in [
        ({}, "missing traffic access token"),
        ({"e2b-traffic-access-token": "0" * 64}, "invalid traffic access token"),
    ]:
        r = get_via_host(host, "/index.html", headers)
        assert r.status_code == 403, r.text
        assert r.json()["sandboxId"] == sandbox.sandbox_id
        assert why in r.json()["message"]
    r = httpx.get(
        f"http://127.0.0.1:{server_port()}/index.html",
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8080"},
        timeout=5,
    )
    assert r.status_code == 403


def test_closed_port_is_502(sandbox):
    r = get_via_host(sandbox.get_host(8999), "/", traffic(sandbox))
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"]


def test_unknown_sandbox_is_502():
    r = get_via_host(f"8080-nosuchsandbox0000000.localhost:{server_port()}")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]


def serve_www(sandbox, text: str, headers: dict) -> str:
    """Starts a static server on 8080 serving `text`; its https URL once it answers."""
    sandbox.files.write("/home/user/www/index.html", text)
    sandbox.commands.run("python3 -m http.server 8080 --bind 127.0.0.1", cwd="/home/user/www", background=True)
    url = f"https://{sandbox.get_host(8080)}/index.html"
    deadline = time.time() + 15
    while time.time() < deadline:
        try:
            if httpx.get(url, headers=headers, timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return url


def test_https_port_host_as_the_sdk_builds_it(sandbox):
    url = serve_www(sandbox, f"tls {sandbox.sandbox_id}", traffic(sandbox))
    r = httpx.get(url, headers=traffic(sandbox), timeout=5)
    assert r.status_code == 200 and r.text == f"tls {sandbox.sandbox_id}", r.text
    assert httpx.get(url, timeout=5).status_code == 403
    # Without serve's CA (certifi's roots only, SSL_CERT_FILE ignored) the certificate is
    # refused: the TLS is real.
    try:
        httpx.get(url, headers=traffic(sandbox), timeout=5, trust_env=False)
    except httpx.ConnectError as e:
        assert "CERTIFICATE_VERIFY_FAILED" in str(e), e
    else:
        raise AssertionError("a client without serve's CA accepted its certificate")


def test_allow_public_traffic():
    public = Sandbox.create(metadata={"suite": "e2b-sdk", "run": RUN_ID}, timeout=120, network={"allow_public_traffic": True})
    try:
        assert public.traffic_access_token is None
        url = serve_www(public, "public", {})
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        public.kill()
    private = Sandbox.create(metadata={"suite": "e2b-sdk", "run": RUN_ID}, timeout=120, network={"allow_public_traffic": False})
    try:
        url = serve_www(private, "private", traffic(private))
        assert httpx.get(url, headers=traffic(private), timeout=5).text == "private"
        r = httpx.get(url, timeout=5)
        assert r.status_code == 403 and "missing traffic access token" in r.json()["message"], r.text
    finally:
        private.kill()

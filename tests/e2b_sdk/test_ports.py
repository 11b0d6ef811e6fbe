"""get_host and HTTP into a server running inside the sandbox, through the
`{port}-{id}.localhost:PORT` host routing of scenario-run serve."""

import time

import httpx

from conftest import server_port


def get_via_host(host: str, path: str = "/") -> httpx.Response:
    # `*.localhost` does not resolve under plain glibc: connect to the server and name the
    # sandbox port in the Host header, as a browser or curl would after resolving it.
    return httpx.get(f"http://127.0.0.1:{server_port()}{path}", headers={"Host": host}, timeout=5)


def test_get_host_and_http(sandbox):
    host = sandbox.get_host(8080)
    assert host == f"8080-{sandbox.sandbox_id}.localhost:{server_port()}"
    sandbox.files.write("/home/user/www/index.html", f"hello from {sandbox.sandbox_id}")
    sandbox.commands.run("python3 -m http.server 8080 --bind 127.0.0.1", cwd="/home/user/www", background=True)
    deadline = time.time() + 15
    r = None
    while time.time() < deadline:
        r = get_via_host(host, "/index.html")
        if r.status_code == 200:
            break
        time.sleep(0.2)
    assert r is not None and r.status_code == 200, r and r.text
    assert r.text == f"hello from {sandbox.sandbox_id}"
    missing = get_via_host(host, "/missing.html")
    assert missing.status_code == 404
    # The E2B edge's other form: a bare host plus the sandbox id and port headers.
    r = httpx.get(
        f"http://127.0.0.1:{server_port()}/index.html",
        headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "8080"},
        timeout=5,
    )
    assert r.status_code == 200 and r.text == f"hello from {sandbox.sandbox_id}"


def test_closed_port_is_502(sandbox):
    r = get_via_host(sandbox.get_host(8999))
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"]


def test_unknown_sandbox_is_502():
    r = get_via_host(f"8080-nosuchsandbox0000000.localhost:{server_port()}")
    assert r.status_code == 502
    assert "was not found" in r.json()["message"]

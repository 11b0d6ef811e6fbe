"""The data plane's credentials, as the SDK sees them: every sandbox gets an envd access token
(sent by the SDK as X-Access-Token) and a traffic access token; envd refuses calls without
the token, and `download_url()`/`upload_url()` give signed URLs that work without it."""

import inspect
import os
import urllib.parse

import httpx
import pytest
from e2b import Sandbox

from conftest import RUN_ID


def envd(path: str) -> str:
    return os.environ["E2B_SANDBOX_URL"] + path


def test_create_and_connect_hand_out_tokens(sandbox):
    token = sandbox._envd_access_token
    assert isinstance(token, str) and len(token) == 64
    assert isinstance(sandbox.traffic_access_token, str) and sandbox.traffic_access_token != token
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again._envd_access_token == token
    assert again.commands.run("echo ok").stdout == "ok\n"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/process.Process/List", b"{}"),
        ("/filesystem.Filesystem/ListDir", b'{"path": "/home/user"}'),
        ("/filesystem.Filesystem/Remove", b'{"path": "/home/user"}'),
    ],
)
def test_envd_refuses_calls_without_the_token(sandbox, path, body):
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "Content-Type": "application/json", "Connect-Protocol-Version": "1"}
    for extra in [{}, {"X-Access-Token": "0" * 64}]:
        r = httpx.post(envd(path), headers={**headers, **extra}, content=body, timeout=10)
        assert r.status_code == 401, r.text
        assert "unauthorized access" in r.json()["message"]
    ok = {**headers, "X-Access-Token": sandbox._envd_access_token}
    r = httpx.post(envd("/process.Process/List"), headers=ok, content=b"{}", timeout=10)
    assert r.status_code == 200, r.text
    # The refused Remove removed nothing.
    assert sandbox.files.exists("/home/user")


def test_files_without_the_token_are_refused(sandbox):
    sandbox.files.write("/home/user/secret.txt", "s3cret")
    r = httpx.get(envd("/files"), params={"path": "/home/user/secret.txt"}, headers={"E2b-Sandbox-Id": sandbox.sandbox_id})
    assert r.status_code == 401
    assert "s3cret" not in r.text


def test_signed_urls(sandbox):
    sandbox.files.write("/home/user/signed.txt", "signed content")
    url = sandbox.download_url("/home/user/signed.txt")
    assert "signature=v1_" in url
    # No token, no sandbox header: the signature alone opens it.
    r = httpx.get(url, timeout=10)
    assert r.status_code == 200 and r.text == "signed content"
    up = sandbox.upload_url("/home/user/uploaded.txt")
    r = httpx.post(up, files={"file": ("uploaded.txt", b"from a signed url")}, timeout=10)
    assert r.status_code == 200, r.text
    assert sandbox.files.read("/home/user/uploaded.txt") == "from a signed url"
    timed = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=60)
    assert "signature_expiration=" in timed
    assert httpx.get(timed, timeout=10).status_code == 200


def test_bad_signatures_are_refused(sandbox):
    sandbox.files.write("/home/user/signed.txt", "signed content")
    url = sandbox.download_url("/home/user/signed.txt")
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    def with_query(q):
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(q, quote_via=urllib.parse.quote)))
    expired = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=-10)
    cases = [
        (with_query({**query, "signature": query["signature"][:-2] + "AA"}), "invalid signature"),
        (with_query({**query, "path": "/etc/passwd"}), "invalid signature"),
        (with_query({k: v for k, v in query.items() if k != "signature"}), None),
        (expired, "signature is already expired"),
    ]
    for bad, why in cases:
        r = httpx.get(bad, headers={"E2b-Sandbox-Id": sandbox.sandbox_id}, timeout=10)
        assert r.status_code == 401, (bad, r.text)
        assert "signed content" not in r.text
        if why:
            assert why in r.json()["message"]


def test_an_insecure_create_is_secured_anyway():
    # SDK <= 2.50 sends `secure` (true by default); asking for an insecure sandbox still
    # gives a token, and envd still refuses calls without it.
    if "secure" not in inspect.signature(Sandbox.create).parameters:
        pytest.skip("this SDK has no `secure` parameter")
    sb = Sandbox.create(secure=False, metadata={"suite": "e2b-sdk", "run": RUN_ID}, timeout=60)
    try:
        assert isinstance(sb._envd_access_token, str)
        assert sb.commands.run("echo secured").stdout == "secured\n"
        r = httpx.post(
            envd("/process.Process/List"),
            headers={"E2b-Sandbox-Id": sb.sandbox_id, "Content-Type": "application/json"},
            content=b"{}",
            timeout=10,
        )
        assert r.status_code == 401
    finally:
        sb.kill()

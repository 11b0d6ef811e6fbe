"""Fixtures for the E2B SDK conformance tests against `scenario-run serve`.

run.sh starts the server and sets E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL and E2B_DOMAIN;
the SDK under test is whatever `e2b` the running venv has (the newest release, and 2.31.0).
"""

import os
import uuid

import pytest
from e2b import Sandbox

# One id per pytest run, put into every sandbox's metadata, so list queries only see ours.
RUN_ID = uuid.uuid4().hex[:12]


def server_port() -> int:
    return int(os.environ["E2B_API_URL"].rsplit(":", 1)[1])


@pytest.fixture
def sandbox():
    sb = Sandbox.create(metadata={"suite": "e2b-sdk", "run": RUN_ID}, timeout=120)
    yield sb
    try:
        sb.kill()
    except Exception:
        pass

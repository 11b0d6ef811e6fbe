#!/bin/bash
# Ready when both servers answer /health.
/opt/abx/bin/agent-sandbox-server healthcheck --port 9000 \
  && /opt/abx/bin/python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:49999/health', timeout=2)" 2>/dev/null

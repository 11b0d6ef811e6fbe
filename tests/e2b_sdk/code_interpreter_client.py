"""The product client's code interpreter against serve: `agent_sandbox.code_interpreter`
(PyPI `agent-sandbox-client`, whose `Sandbox` creates `code-interpreter-v1` and posts to
`https://49999-<id>.<domain>/execute`), as code-interpreter.sh runs it. Exits non-zero, saying
what differed, if a check fails; the last line is the count of checks."""

import os
import sys

from agent_sandbox.code_interpreter import Sandbox

checks = 0


def check(what, got, want):
    global checks
    if got != want:
        sys.exit(f"{what}: expected {want!r}, got {got!r}")
    checks += 1


tag = os.environ.get("E2E_RUN_TAG", "e2e=code-interpreter-sh").split("=", 1)
sb = Sandbox.create(timeout=120, metadata={tag[0]: tag[1]})
try:
    check("a result", sb.run_code("x = 20; x + 1").text, "21")
    check("state across calls", sb.run_code("x * 2").text, "40")
    out = sb.run_code("print('hi'); import sys; print('oops', file=sys.stderr)")
    check("stdout", out.logs.stdout, ["hi\n"])
    check("stderr", out.logs.stderr, ["oops\n"])
    err = sb.run_code("1 / 0").error
    check("an error as data", (err.name, err.value), ("ZeroDivisionError", "division by zero"))
    ctx = sb.create_code_context()
    check("a context of its own", sb.run_code("x", context=ctx).error.name, "NameError")
    check("JavaScript", sb.run_code("[1, 2].map(n => n * 3).join(',')", language="js").text, "3,6")
    check("Bash", sb.run_code("echo $((6 * 7))", language="bash").logs.stdout, ["42\n"])
finally:
    sb.kill()
print(f"{checks} checks passed")

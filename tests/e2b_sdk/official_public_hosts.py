"""Refuses an E2B checkout whose suites have a test that makes a sandbox contact a public host
and that official-deselect.txt does not deselect (official.sh runs it before the suites).

    python3 official_public_hosts.py PACKAGES_DIR official-deselect.txt

A test "makes a sandbox contact" a host when one of its string literals is a shell command
that reaches out (curl, wget, nc, ping, dig, git clone…) and names that host as a URL or an
IPv4 address. Public: anything but loopback (`localhost`, `*.localhost`, 127/8, 0.0.0.0),
the private and link-local ranges, and hosts the test computes (`https://{host}` is
counted as public: it cannot be told here). A literal outside every test counts for every
test of its file. The check is a tripwire for a newer checkout, not a proof: reading the
files is (official-deselect.txt says what was read and why the rest is kept).
"""

import ast
import ipaddress
import pathlib
import re
import sys

COMMAND = re.compile(r"\b(curl|wget|nc|ncat|ping|dig|nslookup|telnet|git\s+(clone|fetch|pull|ls-remote))\b")
URL = re.compile(r"\b(?:https?|git|ftp)://(\[[^\]]*\]|[^/\s'\"`:?#]+)")
IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(?![\w.])")
LOCAL_NAMES = re.compile(r"^(localhost|.*\.localhost)$", re.I)


def public_hosts(text: str) -> list[str]:
    """The public hosts a shell command in `text` reaches, if it is one."""
    if not COMMAND.search(text):
        return []
    hosts = [m.group(1) for m in URL.finditer(text)] + [m.group(1) for m in IPV4.finditer(text)]
    found = []
    for h in hosts:
        h = h.strip("[]")
        if "{" in h or "$" in h:
            found.append(h)  # computed by the test: cannot be told
            continue
        if LOCAL_NAMES.match(h):
            continue
        try:
            ip = ipaddress.ip_address(h)
        except ValueError:
            found.append(h)
            continue
        if ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_unspecified:
            continue
        found.append(h)
    return found


def python_findings(path: pathlib.Path) -> list[tuple[str | None, int, str]]:
    """(test name or None for the whole file, line, host) for a Python test file."""
    tree = ast.parse(path.read_text(), str(path))
    tests = [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
    ]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}" for v in node.values
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        for host in public_hosts(text):
            owner = next((t.name for t in tests if t.lineno <= node.lineno <= (t.end_lineno or t.lineno)), None)
            out.append((owner, node.lineno, host))
    return out


JS_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"|`(?:[^`\\]|\\.)*`", re.S)
JS_TEST = re.compile(r"\b(?:sandboxTest|test|it|buildTemplateTest)(?:\.\w+(?:\([^()]*\))?)*\(\s*(['\"`])(.+?)\1", re.S)


def js_findings(path: pathlib.Path) -> list[tuple[str | None, int, str]]:
    text = path.read_text()
    line_of = lambda pos: text.count("\n", 0, pos) + 1  # noqa: E731
    tests = [(m.start(), m.group(2)) for m in JS_TEST.finditer(text)]
    out = []
    for m in JS_STRING.finditer(text):
        for host in public_hosts(m.group(0)):
            owner = None
            for start, name in tests:
                if start < m.start():
                    owner = name
            out.append((owner, line_of(m.start()), host))
    return out


def main() -> int:
    packages, deselect_file = pathlib.Path(sys.argv[1]), sys.argv[2]
    py_ids, js_files, js_names = set(), set(), set()
    for line in open(deselect_file):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        ident = line.split("|", 1)[0].strip()
        if ident.startswith("js:"):
            file, _, name = ident[3:].partition(" > ")
            if name:
                js_names.add((file, name.split(" > ")[-1]))
            else:
                js_files.add(file)
            where = packages / "js-sdk" / file
        else:
            py_ids.add(ident)
            where = packages / "python-sdk" / ident.split("::")[0]
        if not where.exists():
            print(f"official_public_hosts.py: {ident} is deselected but {where} is not in this checkout", file=sys.stderr)
    missed = []
    py_root = packages / "python-sdk"
    for path in sorted([*py_root.glob("tests/sync/**/*.py"), *py_root.glob("tests/async/**/*.py")]):
        rel = path.relative_to(py_root).as_posix()
        findings = python_findings(path)
        whole_file = any(owner is None for owner, _, _ in findings)
        names = {
            n.name
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test")
        }
        for owner, line, host in findings:
            for name in sorted(names) if whole_file and owner is None else [owner]:
                if name and f"{rel}::{name}" not in py_ids:
                    missed.append(f"{rel}::{name} (line {line}: {host})")
    js_root = packages / "js-sdk"
    for path in sorted(js_root.glob("tests/**/*.ts")):
        rel = path.relative_to(js_root).as_posix()
        if rel.startswith("tests/runtimes/") or rel.endswith(".browser.test.ts") or rel in js_files:
            continue
        for owner, line, host in js_findings(path):
            if owner is None or (rel, owner) not in js_names:
                missed.append(f"{rel} > {owner or '(the whole file)'} (line {line}: {host})")
    if missed:
        print(
            "official_public_hosts.py: these tests make a sandbox contact a public host and are not in "
            f"{pathlib.Path(deselect_file).name}; deselect them (with the reason) before running this checkout:",
            file=sys.stderr,
        )
        for m in dict.fromkeys(missed):
            print(f"  {m}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

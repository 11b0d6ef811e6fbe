"""Summarises a JUnit XML report of the official E2B SDK suites (official.sh).

    python3 official_summary.py [--deselected official-deselect.txt] LABEL REPORT.xml [REPORT.xml…]

Prints one line per test file (passed, failed, skipped) and then every failing test with the
first line of its error, so two runs can be compared with diff. A test found in several
reports (the JS suite's files that mock the API run twice: with the SDK's default URLs and
against serve) counts as passed if it passed in one of them. With --deselected, the tests of
that list are counted apart: vitest reports a test its name filter left out as skipped (a file
left out is in no report, and not counted), pytest leaves a deselected test out of its report
(each of the list's tests missing from a pytest report is counted).
"""

import collections
import sys
import xml.etree.ElementTree as ET


def file_of(case: ET.Element) -> str:
    f = case.get("file")
    if f:
        return f
    # vitest: classname is the test file's path.
    if "/" in case.get("classname", ""):
        return case.get("classname")
    # xunit1 without `file`: classname is the dotted module path (and the class, if any).
    parts = case.get("classname", "?").split(".")
    while parts and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def read_deselected(path: str) -> tuple[set, set]:
    """(python (file, name) pairs, js (file, name) pairs; name None for a whole file)."""
    py, js = set(), set()
    for line in open(path):
        ident = line.split("|", 1)[0].strip()
        if not ident or ident.startswith("#"):
            continue
        if ident.startswith("js:"):
            file, _, name = ident[3:].partition(" > ")
            js.add((file, name or None))
        else:
            file, _, name = ident.partition("::")
            py.add((file, name))
    return py, js


def is_deselected(js: set, file: str, name: str) -> bool:
    """vitest's JUnit name is the test's describe blocks and name joined by ` > `, some
    describe blocks left out: the list's name must end with it."""
    return any(
        f == file and (n is None or n == name or n.endswith(" > " + name)) for f, n in js
    )


def main() -> None:
    args = sys.argv[1:]
    py_desel, js_desel = set(), set()
    if args[:1] == ["--deselected"]:
        py_desel, js_desel = read_deselected(args[1])
        args = args[2:]
    label, reports = args[0], args[1:]
    deselected = 0
    counts = collections.defaultdict(lambda: [0, 0, 0])
    failing = []
    best = {}
    for r in reports:
        # vitest's JUnit names leave out some describe blocks, so one file can hold the same
        # name twice: the n-th occurrence in a report is its own test (the order of a file's
        # tests is the same in every run).
        seen = collections.Counter()
        for c in ET.parse(r).getroot().iter("testcase"):
            name = (file_of(c), c.get("name"))
            seen[name] += 1
            key = (*name, seen[name])
            failed = c.find("failure") is not None or c.find("error") is not None
            if key not in best or not failed:
                best[key] = c
    present = {(file_of(c), c.get("name")) for c in best.values()}
    if not any("/" in c.get("classname", "") for c in best.values()):  # a pytest report
        deselected += sum(1 for key in py_desel if key not in present)
    for case in best.values():
        f = file_of(case)
        if case.find("skipped") is not None and is_deselected(js_desel, f, case.get("name")):
            deselected += 1
            continue
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts[f][1] += 1
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            failing.append((f, case.get("name"), msg[0][:160] if msg else ""))
        elif case.find("skipped") is not None:
            counts[f][2] += 1
        else:
            counts[f][0] += 1
    width = max((len(f) for f in counts), default=10)
    print(f"== {label}: by file (passed failed skipped)")
    for f in sorted(counts):
        p, x, s = counts[f]
        print(f"  {f:<{width}} {p:4} {x:4} {s:4}")
    tp, tx, ts = (sum(c[i] for c in counts.values()) for i in range(3))
    print(f"== {label}: failing tests")
    for f, name, msg in sorted(failing):
        print(f"  {f}::{name}: {msg}")
    tail = f", {deselected} deselected" if py_desel or js_desel else ""
    print(f"{label}: {tp} passed, {tx} failed, {ts} skipped{tail}")


if __name__ == "__main__":
    main()

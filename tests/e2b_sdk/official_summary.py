"""Summarises a JUnit XML report of the official E2B SDK suites (official.sh).

    python3 official_summary.py LABEL REPORT.xml [REPORT.xml…]

Prints one line per test file (passed, failed, skipped) and then every failing test with the
first line of its error, so two runs can be compared with diff. A test found in several
reports (the JS suite's files that mock the API run twice: with the SDK's default URLs and
against serve) counts as passed if it passed in one of them.
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


def main() -> None:
    label, reports = sys.argv[1], sys.argv[2:]
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
    for case in best.values():
        f = file_of(case)
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
    print(f"{label}: {tp} passed, {tx} failed, {ts} skipped")


if __name__ == "__main__":
    main()

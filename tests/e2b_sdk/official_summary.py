"""Summarises a JUnit XML report of the official E2B SDK suites (official.sh).

    python3 official_summary.py REPORT.xml LABEL

Prints one line per test file (passed, failed, skipped) and then every failing test with the
first line of its error, so two runs can be compared with diff.
"""

import collections
import sys
import xml.etree.ElementTree as ET


def file_of(case: ET.Element) -> str:
    f = case.get("file")
    if f:
        return f
    # xunit1 without `file`: classname is the dotted module path (and the class, if any).
    parts = case.get("classname", "?").split(".")
    while parts and parts[-1][:1].isupper():
        parts.pop()
    return "/".join(parts) + ".py"


def main() -> None:
    report, label = sys.argv[1], sys.argv[2]
    counts = collections.defaultdict(lambda: [0, 0, 0])
    failing = []
    for case in ET.parse(report).getroot().iter("testcase"):
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

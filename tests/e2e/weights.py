"""Longest file first: the order the e2e and timing files are handed to the xdist workers.

`--dist loadfile` keeps a file on one worker (its module fixtures, and tests that follow one
another, stay together) and hands the files out in collection order as workers free up
(`--no-loadscope-reorder`, else xdist orders them by test count). A long file handed out last
leaves the other worker idle for as long as it runs; handed out first, the short files fill in
around it (longest-processing-time-first scheduling). weights.json holds what each file of
tests/e2e and tests/timing took on one worker of a two-core machine (by file name: the two
directories share no name, tests/unit/test_tiers.py checks it); refresh it from the JUnit
reports of both tiers with

    python -m tests.e2e.weights .test-report-e2e.xml .test-report-timing.xml

A file missing here (a new one) counts as DEFAULT_SECONDS: its place is a guess, nothing more.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

WEIGHTS = Path(__file__).with_name("weights.json")
DEFAULT_SECONDS = 30.0


WEIGHED = ("e2e", "timing")  # the tiers whose files are ordered by weight


def file_seconds() -> dict[str, float]:
    """tests/e2e or tests/timing file name -> seconds, as measured."""
    loaded = json.loads(WEIGHTS.read_text())
    return {str(name): float(seconds) for name, seconds in loaded.items()}


def weight(path: Path, seconds: dict[str, float]) -> float:
    return seconds.get(path.name, DEFAULT_SECONDS)


def from_junit(*reports: Path) -> dict[str, float]:
    """Seconds per e2e or timing file in JUnit reports (pytest's classname is the module's
    dotted path)."""
    totals: dict[str, float] = {}
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            parts = (case.get("classname") or "").split(".")
            if parts[0] == "tests" and len(parts) > 2 and parts[1] in WEIGHED:
                name = parts[2] + ".py"
                totals[name] = totals.get(name, 0.0) + float(case.get("time") or 0)
    ranked = sorted(totals.items(), key=lambda item: -item[1])
    return {name: round(seconds, 1) for name, seconds in ranked}


if __name__ == "__main__":
    measured = from_junit(*map(Path, sys.argv[1:]))
    WEIGHTS.write_text(json.dumps(measured, indent=1) + "\n")
    print(f"{len(measured)} files, {sum(measured.values()):.0f} s in all -> {WEIGHTS}")

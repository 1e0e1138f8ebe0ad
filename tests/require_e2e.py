"""Fail a CI run whose end-to-end tests were skipped or missing (they prove the real thing)."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET


def needs_sandbox(case: ET.Element) -> bool:
    """Whether a test case is end-to-end: tests/conftest.py records each test's tier markers
    (`tiers`), `e2e` for the tests of tests/e2e and the timing tests that use the sandbox."""
    return any(
        prop.get("name") == "tiers" and "e2e" in (prop.get("value") or "").split()
        for prop in case.iter("property")
    )


def main(reports: list[str]) -> int:
    """The JUnit reports of one run (one per tier, see ./run test)."""
    e2e_run = 0
    skipped: list[str] = []
    cases = [case for report in reports for case in ET.parse(report).getroot().iter("testcase")]
    for case in cases:
        if not needs_sandbox(case):
            continue
        if case.find("skipped") is not None:
            skipped.append(f"{case.get('classname')}::{case.get('name')}")
        else:
            e2e_run += 1
    print(f"end-to-end tests executed: {e2e_run}, skipped: {len(skipped)}")
    if os.environ.get("CI") == "true" and (skipped or e2e_run == 0):
        for name in skipped[:20]:
            print(f"  skipped: {name}", file=sys.stderr)
        print("CI requires the end-to-end tests to run (root, lxc, sshd, tmux)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or [".test-report.xml"]))

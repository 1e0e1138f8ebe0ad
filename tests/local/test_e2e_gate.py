"""CI's end-to-end gate (tests/require_e2e.py) counts the timing tests that use the sandbox, and
fails a CI run where they were skipped: a real pytest run's JUnit report, read by the gate."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import require_e2e

ROOT = Path(__file__).resolve().parents[2]
SANDBOX_TIMING = "tests/timing/test_command_deadline.py"  # uses the sandbox
PURE = "tests/unit/test_tiers.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of a sandbox timing test and a unit module, on a PATH without ssh or LXC: the
    sandbox fixture skips the timing test, as it would on a CI runner that lacks them."""
    path = tmp_path_factory.mktemp("gate") / "report.xml"
    env = {**os.environ, "PATH": "/nonexistent", "PYTHONPATH": str(ROOT)}
    pytest_argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    subprocess.run(
        [*pytest_argv, f"--junitxml={path}", SANDBOX_TIMING, PURE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    return path


def cases(report: Path) -> dict[str, ET.Element]:
    root = ET.parse(report).getroot()
    return {f"{c.get('classname')}::{c.get('name')}": c for c in root.iter("testcase")}


def test_the_report_says_which_tests_need_the_sandbox(report: Path) -> None:
    found = cases(report)
    deadline = found["tests.timing.test_command_deadline::test_command_deadline"]
    assert require_e2e.needs_sandbox(deadline)
    assert deadline.find("skipped") is not None
    pure = [case for name, case in found.items() if name.startswith("tests.unit.test_tiers::")]
    assert pure and not any(require_e2e.needs_sandbox(case) for case in pure)


def test_a_skipped_sandbox_timing_test_fails_ci(
    report: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CI", "true")
    assert require_e2e.main([str(report)]) == 1
    out, err = capsys.readouterr()
    assert "end-to-end tests executed: 0, skipped: 1" in out
    assert "tests.timing.test_command_deadline::test_command_deadline" in err
    monkeypatch.setenv("CI", "false")
    assert require_e2e.main([str(report)]) == 0

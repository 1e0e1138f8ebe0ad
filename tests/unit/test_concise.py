"""Concise by default: a healthy verify or status is a few lines; `-v` shows every check with
its expectation; the table of several targets shows each one's state and reason."""

from __future__ import annotations

from launcher.core.errors import ExitCode
from launcher.probe.report import render_text
from launcher.targets.fleet import Outcome, render_table
from tests.unit.test_htmlreport import probe


def test_a_healthy_probe_is_a_few_short_lines() -> None:
    healthy = probe()
    assert healthy.verdict == "healthy", healthy.reason
    lines = render_text("prod", healthy, ["q_pre", "q_hs"]).splitlines()
    assert len(lines) <= 4, lines
    assert lines[0].startswith("prod: HEALTHY (exit 0)")
    assert (
        lines[-1] == f"  checks: all {len(healthy.checks)} passed (-v: each with its expectation)"
    )
    assert not any("(expected" in line for line in lines)
    verbose = render_text("prod", healthy, ["q_pre", "q_hs"], verbose=True).splitlines()
    assert sum("(expected" in line for line in verbose) == len(healthy.checks)


def test_an_unhealthy_probe_shows_what_failed_with_its_expectation() -> None:
    crashed = probe(crash_at=9)
    text = render_text("prod", crashed, ["q_pre"])
    assert "FAIL  alive  pane dead, exit status 1  (expected session running, pane alive)" in text
    assert " more passed (-v: each with its expectation)" in text and "last lines:" in text
    assert "PASS" not in text


def test_the_fleet_table_shows_state_and_reason() -> None:
    crashed = probe(crash_at=9)
    outcomes = [
        Outcome("a", ExitCode.OK, "step 20 · loss 5.8 · 28.0 Ktok/s", {"probe": probe()}),
        Outcome("b", ExitCode.UNHEALTHY, crashed.reason, {"probe": crashed}),
        Outcome("c", ExitCode.UNREACHABLE, "c: cannot connect\nhint: check"),
    ]
    lines = render_table(outcomes, title="status").splitlines()
    assert lines[1].split() == ["target", "state", "exit", "reason"]
    assert lines[2].split()[:3] == ["a", "healthy", "0"]
    assert lines[3].split()[:3] == ["b", "unhealthy", "1"] and "alive: pane dead" in lines[3]
    assert lines[4].split()[:3] == ["c", "unreachable", "3"] and lines[4].endswith("hint: check")

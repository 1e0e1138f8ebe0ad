"""How soon verify fails a broken run: every definite failure ends it within wait +
failure_threshold x interval + a few seconds of appearing, and a hung `pct` holds neither
verify nor status past their deadlines. The healthy kinds: tests/e2e/test_verdicts.py."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from tests.e2e.project import Project
from tests.e2e.test_verdicts import (
    INTERVAL,
    SLACK,
    THRESHOLD,
    VMID,
    WAIT,
    checks,
    deploy,
    verify,
)

SAG = r"throughput \d+\.\d Ktok/s, \d+ % of this run's peak \d+\.\d Ktok/s, for 3 polls"

LOOP = "while true; do python3 train_demo.py; sleep 0.2; done"


DEFINITE = [
    # mode, its environment, verify settings, the failing check, the reason (a regex)
    ("crashloop", {"DEMO_CRASH_AFTER": "2.5", "DEMO_CHECKPOINT_EVERY": "2"}, {}, "restarts",
     r"restarted (once|\d+ times) \(.*"),
    ("diverge", {"DEMO_DIVERGE_AFTER": "2"}, {"loss": {"ceiling": 10.4}}, "loss",
     r".*near the ceiling 10\.4.*"),
    ("sag", {"DEMO_SAG_AFTER": "2.5"}, {}, "throughput", SAG + ".*"),
    ("nan-gradnorm", {"DEMO_NAN_AFTER": "2"}, {}, "finite", r"finite: grad_norm=nan \(while.*"),
]  # fmt: skip


@pytest.mark.parametrize(("mode", "env", "verify_cfg", "check", "reason"), DEFINITE)
def test_definite_failure_ends_verify_within_the_threshold(
    project: Project,
    mode: str,
    env: dict[str, str],
    verify_cfg: dict[str, Any],
    check: str,
    reason: str,
) -> None:
    command = {"command": LOOP} if mode == "crashloop" else {}
    deploy(project, mode, env={"DEMO_MODE": mode, **env}, verify=verify_cfg, **command)
    code, report, elapsed = verify(project)
    assert code == 1, report
    assert checks(report)[check]["verdict"] == "fail", report["checks"]
    assert checks(report)[check]["failure"] == "definite"
    assert re.fullmatch(reason, report["reason"]), report["reason"]
    # Each failure appears by the end of the warmup: the threshold's polls, then exit 1. The
    # probe's own duration (from its first poll), so a slow start of the CLI does not count.
    duration = report["timings"]["duration"]
    assert duration < WAIT + THRESHOLD * INTERVAL + SLACK, (duration, report["reason"])
    assert elapsed < duration + 2 * SLACK
    project.kill_session(VMID, mode)


def test_hung_pct_holds_neither_verify_nor_status_past_their_deadlines(project: Project) -> None:
    host = project.host(command_timeout=2)
    project.write({"hung": (VMID, project.playbook("hung"))}, host=host)
    project.sandbox.set_faults(pct_latency=8)
    code, report, elapsed = verify(project, "--wait", "2", "--window", "2", "--interval", "1")
    assert code == 3, report
    # wait + window, then at most one poll bounded by command_timeout
    assert report["timings"]["duration"] < 2 + 2 + 2 + 1, report["timings"]
    assert elapsed < 2 + 2 + 2 + 2 * SLACK, elapsed
    assert "did not finish within 2 s" in report["reason"]
    started = time.monotonic()
    status = project.launcher("status", "--json")
    assert status.returncode == 3, status.stdout + status.stderr
    assert time.monotonic() - started < 2 + 2 * SLACK

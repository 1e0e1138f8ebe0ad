"""`logs -f` returns soon after the run it follows ends. The other log and stop paths:
tests/e2e/test_operate.py."""

from __future__ import annotations

import time

from tests.e2e.project import Project
from tests.e2e.test_operate import VMID, agents_in, ok


# the crash must come after following began (4 s after the start)
def test_logs_follow_returns_when_the_run_ends(project: Project) -> None:
    book = project.playbook("opscrash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "10"})
    project.write({"opscrash": (VMID, book)})
    ok(project.launcher("deploy", "--restart"))
    project.wait_for(
        lambda: "step=" in project.launcher("logs", "--tail", "5").stdout, what="status lines"
    )
    started = time.monotonic()
    followed = project.launcher("logs", "-f", "--tail", "1", timeout=30)
    out = ok(followed)
    assert time.monotonic() - started < 20
    assert "Traceback" in out, out  # written after following began
    assert "ended with exit code 1" in followed.stderr
    assert agents_in(project, VMID) == []
    # The run is over: -f shows the tail and says why it does not follow.
    again = project.launcher("logs", "-f", "--tail", "3")
    assert "not following" in ok(again) + again.stderr
    project.kill_session(VMID, "opscrash")

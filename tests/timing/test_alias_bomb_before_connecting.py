"""An alias bomb in a playbook is refused within a second of the interpreter's start, before
any connection: no `pct` call, no login. Other hostile input: tests/e2e/test_hostile_input.py."""

from __future__ import annotations

import yaml

from tests.e2e.project import Project
from tests.e2e.test_hostile_input import VMID, timed
from tests.timing.test_yaml_limits_are_fast import LAUGHS


def test_billion_laughs_fails_in_under_a_second(project: Project) -> None:
    book = project.playbook("laughs")
    project.write({"laughs": (VMID, book)})
    baseline, baseline_time = timed(project, "inventory", "check")
    assert baseline.returncode == 0, baseline.stderr
    playbook = project.root / "playbooks" / "laughs.yaml"
    playbook.write_text(LAUGHS + yaml.safe_dump(book, sort_keys=False))
    assert playbook.stat().st_size < 1024
    pct_calls, logins = project.sandbox.pct_calls(), project.sshd_logins()
    for args in (["inventory", "check"], ["deploy", "--restart"]):
        result, elapsed = timed(project, *args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith(f"error: {playbook}:")
        assert "playbook refused: more than 20000 values (aliases expanded)" in result.stderr
        # Loading the bomb adds under a second to what the interpreter's start-up costs.
        assert elapsed < baseline_time + 1.0, (elapsed, baseline_time)
    assert project.sandbox.pct_calls() == pct_calls
    assert project.sshd_logins() == logins

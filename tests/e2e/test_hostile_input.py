"""Hostile input on the sandbox: bad numbers, an alias bomb, a `//` workdir.

Each is refused with exit 2 and a message naming the option or file:line, before any connection:
the running session, its checkpoints and the container are untouched, and sshd sees no login.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.e2e.project import Project, json_out, tree

pytestmark = pytest.mark.e2e

VMID = 201
NAME = "numbers"
WORKDIR = f"/root/{NAME}"

BAD_NUMBERS = [
    (["deploy", "--restart", "--grace", "inf"], "--grace", "'inf' is not a duration"),
    (["deploy", "--restart", "--grace", "nan"], "--grace", "'nan' is not a duration"),
    (
        ["deploy", "--restart", "--purge-checkpoints", "--grace", "-5"],
        "--grace",
        "-5 is out of range: 0 s to 1 h",
    ),
    (["stop", "--grace", "inf"], "--grace", "'inf' is not a duration"),
    (["stop", "--grace", "-5"], "--grace", "-5 is out of range"),
    (["rollback", "--restart", "--grace", "nan"], "--grace", "'nan' is not a duration"),
    (["verify", "--wait", "nan"], "--wait", "'nan' is not a duration"),
    (["verify", "--wait", "inf"], "--wait", "'inf' is not a duration"),
    (["verify", "--wait", "-1"], "--wait", "-1 is out of range: 0 s to 7 days"),
    (["verify", "--interval", "0"], "--interval", "0 is out of range: 0.2 s to 1 h"),
    (["smoke", "--window", "inf"], "--window", "'inf' is not a duration"),
    (["logs", "--tail", "-1"], "--tail", "is not in the range"),
]


def container_state(project: Project) -> dict[str, object]:
    """What a deploy, stop or purge would change: the pane, the records, the workdir's files."""
    pane = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", f"={NAME}:", "#{pane_pid}")
    files = [line for line in tree(project, VMID, WORKDIR) if ".log " not in line]
    return {"pane": pane.strip(), "files": files, "root": project.ct_text(VMID, "ls", "-a", "/")}


def timed(project: Project, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    # Before the fix `verify --wait inf` never returned: the timeout turns that into a failure.
    result = project.launcher(*args, timeout=30)
    return result, time.monotonic() - started


@pytest.fixture
def running(project: Project) -> Iterator[Project]:
    """A healthy run with a checkpoint folder that only this test writes to."""
    book = project.playbook(NAME, env={"DEMO_CHECKPOINT_EVERY": "0"})
    project.write({NAME: (VMID, book)})
    result = project.launcher("deploy")
    assert result.returncode == 0, result.stdout + result.stderr
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the trainer")
    marker = f"{WORKDIR}/checkpoints/step_100.pt"
    project.ct(VMID, "sh", "-c", f"mkdir -p {WORKDIR}/checkpoints && echo weights > {marker}")
    yield project
    project.kill_session(VMID, NAME)
    project.ct(VMID, "pkill", "-KILL", "-f", "train_demo.py")
    project.ct(VMID, "rm", "-rf", WORKDIR)


def test_bad_numbers_exit_2_and_touch_nothing(running: Project) -> None:
    project = running
    before = container_state(project)
    pct_calls, logins = project.sandbox.pct_calls(), project.sshd_logins()
    assert logins > 0, "sshd.log records logins (the deploy made one)"
    for args, option, message in BAD_NUMBERS:
        result, elapsed = timed(project, *args)
        assert result.returncode == 2, (args, result.stdout + result.stderr)
        assert f"Invalid value for '{option}'" in result.stderr, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert elapsed < 10, (args, elapsed)
    assert project.sandbox.pct_calls() == pct_calls, "a command reached the host"
    assert project.sshd_logins() == logins, "a command logged in to sshd"
    assert container_state(project) == before
    assert "step_100.pt" in "".join(before["files"])  # type: ignore[arg-type]


def test_a_duration_with_a_unit_is_accepted(running: Project) -> None:
    # 0.05m is 3 s of warmup: a unit and a fraction, parsed, and the probe runs with it.
    result = running.launcher(
        "verify", "--wait", "0.05m", "--interval", "1s", "--window", "0.5m", "--json"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    timings = json_out(result)["timings"]
    assert (timings["wait"], timings["interval"], timings["window"]) == (3.0, 1.0, 30.0)


@pytest.mark.parametrize(
    ("workdir", "message"),
    [
        ("//", "workdir: must be a directory below / without '..' (got '//')"),
        ("///etc", "workdir: /etc is a system directory"),
        ("//proc/1/root", "workdir: /proc/1/root is inside the system directory /proc"),
    ],
)
def test_a_root_or_system_workdir_is_refused_at_config_time(
    project: Project, workdir: str, message: str
) -> None:
    project.write({"rootwd": (VMID, project.playbook("rootwd", workdir=workdir))})
    playbook = project.root / "playbooks" / "rootwd.yaml"
    line = playbook.read_text().splitlines().index(f"workdir: {workdir}") + 1
    root_before = project.ct_text(VMID, "ls", "-a", "/")
    pct_calls, logins = project.sandbox.pct_calls(), project.sshd_logins()
    result = project.launcher("deploy", "--restart", "--purge-checkpoints")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {playbook}:{line}: {message}"), result.stderr
    assert project.sandbox.pct_calls() == pct_calls
    assert project.sshd_logins() == logins
    assert project.ct_text(VMID, "ls", "-a", "/") == root_before

"""No request acts after its client gave up, and a frozen CT is paused, not down: the hostile
cases on the sandbox (a `pct` stalled on the host, a CT frozen by a backup mid-deploy).

The stall and the freeze are the sandbox's own (`launcher sandbox stall`, `launcher sandbox
freeze`): the stand-in `pct` waits on the host before doing anything, so the host's shell has
stamped the request when it reaches the container much later; a freeze sets `lock: backup` and
freezes the CT's cgroup as vzdump's suspend mode does, and `pct exec` hangs in it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.agent.protocol import LOCK_PATH
from tests.e2e.project import Project, local_processes

pytestmark = pytest.mark.e2e

MAY_COMPLETE = "may still complete in the container"
PAUSED = "is locked (backup) — the run is paused, not down"


def run_marker(project: Project, vmid: int, session: str) -> str:
    """The run marker of the session's run, read in the container (no launcher involved)."""
    out = project.ct_text(vmid, "tmux", "show-options", "-v", "-t", f"={session}:", "@launcher_run")
    return out.strip()


def healthy(project: Project, name: str) -> bool:
    return project.launcher("status", "-t", name, "--json").returncode == 0


def agents(project: Project, vmid: int) -> list[str]:
    return project.processes(vmid, "launcher_agent")


def pct_calls_running(project: Project) -> list[int]:
    """The sandbox's `pct` calls running on its host (this machine) now, stalled ones included."""
    pct = str(project.sandbox.state_dir / "bin" / "pct").encode()
    return [pid for pid, cmdline, _ in local_processes() if pct in cmdline.split(b"\0")]


def lock_opened_in(project: Project, vmid: int) -> bool:
    """Whether a process in the CT has its deploy lock open: a deploy's agent taking the lock,
    which keeps the file open while it waits for the lock's holder."""
    fds = project.ct_text(vmid, "sh", "-c", "ls -l /proc/[0-9]*/fd/ 2>/dev/null; true")
    return f"-> {LOCK_PATH}" in fds


def watched_status(state: Path, name: str) -> str | None:
    """The status a watcher's state file gives the target (written atomically)."""
    try:
        return str(json.loads(state.read_text())["targets"][name]["status"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture
def thawed(project: Project) -> Iterator[list[int]]:
    """CTs a test froze, thawed (and unlocked) whatever happens: a frozen CT would hang the
    next test's every call."""
    frozen: list[int] = []
    yield frozen
    for vmid in frozen:
        project.sandbox.thaw(vmid)


def test_an_abandoned_stop_never_kills_the_run_deployed_after_it(project: Project) -> None:
    """The worst case: `stop` gave up (exit 3) while `pct` was blocked 70 s on the host;
    the operator redeployed; at second 70 the abandoned stop killed the new run. Now the stop
    names the run it is for and carries a deadline: it is refused in the container."""
    name = "abandon"
    project.deploy_healthy(name, 200, host=project.host(command_timeout=3))
    old = run_marker(project, 200, name)
    # The stop's first look (a poll) passes; its own call waits 70 s on the host.
    project.sandbox.stall_pct(70, skip=1)
    started = time.monotonic()
    stop = project.launcher("stop", "-t", name, "--grace", "1", timeout=90)
    gave_up = time.monotonic() - started
    assert stop.returncode == 3, stop.stderr
    assert f"the stop {MAY_COMPLETE}" in stop.stderr and "launcher status" in stop.stderr
    assert gave_up < 1 + 30 + 3 + 10  # its own deadline (grace + 30 + command_timeout), then out
    assert run_marker(project, 200, name) == old  # nothing happened yet: the stop is on its way

    redeployed = project.launcher("deploy", "-t", name, "--restart")
    assert redeployed.returncode == 0, redeployed.stderr
    new = run_marker(project, 200, name)
    assert new != old
    project.wait_for(lambda: healthy(project, name), timeout=30, what="the new run healthy")
    # The stalled call reaches the container at second 70; once its `pct` has ended on the
    # host, its agent has answered.
    project.wait_for(
        lambda: not pct_calls_running(project),
        timeout=max(1.0, started + 70 + 20 - time.monotonic()),
        what="the stalled pct call to end",
    )
    project.wait_for(lambda: not agents(project, 200), timeout=20, what="the late stop to end")
    assert run_marker(project, 200, name) == new
    assert project.processes(200, "train_demo.py"), "the new run was killed"
    assert healthy(project, name)


def hold_deploy_lock(project: Project, vmid: int) -> int:
    """The CT's deploy lock, held from the host (so a freeze of the CT does not freeze its
    holder): another deploy, as far as the agent can tell."""
    init = subprocess.run(
        ["lxc-info", "-n", str(vmid), "-P", str(project.sandbox.lxcpath), "-p", "-H"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    root = Path(f"/proc/{init}/root/run/launcher")
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "deploy.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    holder = {"operator": "backup-test", "from_host": "host", "since": "now"}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(holder).encode())
    return fd


def test_a_deploy_frozen_mid_transaction_does_not_go_on_after_the_thaw(
    project: Project, thawed: list[int]
) -> None:
    """A deploy frozen mid-way: a vzdump suspend backup froze the CT while the transaction
    ran its checks; launcher gave up (exit 3) and, after the thaw, the transaction stopped the
    old run and launched a new one. Now it is refused at its first change: the old run stays."""
    name = "frozen"
    project.deploy_healthy(name, 201, host=project.host(command_timeout=4))
    old = run_marker(project, 201, name)
    lock = hold_deploy_lock(project, 201)
    try:
        deploy = subprocess.Popen(
            project.argv("deploy", "-t", name, "--restart", "--wait-lock", "10"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Mid-transaction: its agent is in the container, waiting for the lock (a check).
        project.wait_for(
            lambda: lock_opened_in(project, 201), timeout=30, what="the deploy's wait for the lock"
        )
        project.sandbox.freeze(201)
        thawed.append(201)
    finally:
        os.close(lock)  # the other deploy ends while the CT is frozen
    _, err = deploy.communicate(timeout=60)
    assert deploy.returncode == 3, err
    assert f"CT 201 {PAUSED}" in err
    assert f"the deploy {MAY_COMPLETE}" in err
    project.sandbox.thaw(201)
    thawed.clear()
    project.wait_for(lambda: not agents(project, 201), timeout=30, what="the deploy to end")
    assert run_marker(project, 201, name) == old, "the abandoned deploy replaced the run"
    history = project.launcher("history", "-t", name, "--json")
    records = json.loads(history.stdout)["records"]
    assert [r["run"] for r in records[:1]] == [old]  # no deploy recorded after the old run's
    assert healthy(project, name)


def test_a_frozen_ct_is_paused_for_status_and_watch_never_restarts_it(
    project: Project, thawed: list[int], tmp_path: Path
) -> None:
    """A backup freezes the CT under a watched run: status exits 3 in seconds naming the lock;
    watch --restart-on-failure says paused, then resumed, and neither restarts the run nor
    calls it unhealthy once it thaws (its log stood still for the whole freeze)."""
    name = "paused"
    project.deploy_healthy(name, 200, host=project.host(command_timeout=60))
    old = run_marker(project, 200, name)
    watch = subprocess.Popen(
        project.argv("watch", "-t", name, "--restart-on-failure", "--for", "40", "--interval",
                     "1", "--wait", "2", "--state", str(tmp_path / "watch.json"), "--json"),
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    project.wait_for(
        lambda: watched_status(tmp_path / "watch.json", name) == "healthy",
        timeout=30,
        what="the watcher's judging the run healthy first",
    )
    project.sandbox.freeze(200)
    thawed.append(200)

    started = time.monotonic()
    status = project.launcher("status", "-t", name, timeout=60)
    took = time.monotonic() - started
    assert status.returncode == 3, status.stderr
    assert f"CT 200 {PAUSED}" in status.stderr + status.stdout
    # Asked about on the host after 5 s without an answer: well within its deadline (60 s).
    assert took < 5 + 10

    time.sleep(max(0.0, started + 15 - time.monotonic()))  # a backup's freeze: 15 s or so
    project.sandbox.thaw(200)
    thawed.clear()
    out, err = watch.communicate(timeout=90)
    kinds = [json.loads(line)["kind"] for line in out.splitlines() if line.startswith("{")]
    assert "paused" in kinds and "resumed" in kinds, (out, err)
    assert kinds.index("paused") < kinds.index("resumed")
    assert not {"restart", "unreachable", "unhealthy", "gave_up"} & set(kinds), kinds
    assert watch.returncode == 0, err
    assert run_marker(project, 200, name) == old
    assert healthy(project, name)


def test_the_sandbox_pct_sees_a_frozen_ct_as_proxmox_does(
    project: Project, thawed: list[int], ssh: Any
) -> None:
    """Frozen and locked: still `running` for pct (its LXC monitor answers), `lock: backup` in
    its config and in `pct status --verbose`, and `pct exec` hangs instead of failing."""
    sb = project.sandbox
    sb.freeze(201)
    thawed.append(201)
    verbose = ssh("pct", "status", "201", "--verbose").stdout.decode()
    assert "status: running\n" in verbose and "lock: backup\n" in verbose
    assert "lock: backup\n" in ssh("pct", "config", "201").stdout.decode()
    assert "backup" in ssh("pct", "list").stdout.decode()
    with pytest.raises(subprocess.TimeoutExpired):
        ssh("pct", "exec", "201", "--", "true", timeout=3)
    sb.thaw(201)
    thawed.clear()
    assert ssh("pct", "exec", "201", "--", "true").returncode == 0
    assert "lock:" not in ssh("pct", "status", "201", "--verbose").stdout.decode()
    refused = ssh("pct", "set", "201", "--lock", "nonsense")
    assert refused.returncode == 255 and b"enumeration" in refused.stderr

"""The day-two cycle on containers made from Debian's own root filesystems, as a Proxmox CT made
from a template is: their python3 (3.9, 3.11, 3.13) runs the agent and the trainer, their tmux
(3.1c, 3.3a, 3.5a) holds the run. deploy -> verify -> status -> logs -f -> stop -> rollback."""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.core.errors import UsageError
from launcher.sandbox import Sandbox, SandboxInfo, rootfs
from tests.e2e.conftest import missing_requirements, warm_agent_cache
from tests.e2e.project import DEMO_TRAINER, Project, json_out, verify_json
from tests.e2e.test_operate import lines_of, ok, popen, wait_line
from tests.e2e.test_proxmox_node import (
    check_the_run_is_found_and_never_doubled,
    delete_socket_under_a_live_run,
)

pytestmark = pytest.mark.e2e

# distro -> (vmid, python3 -V, tmux -V)
MATRIX = {
    "bullseye": (220, "Python 3.9.", "tmux 3.1c"),
    "bookworm": (221, "Python 3.11.", "tmux 3.3a"),
    "trixie": (222, "Python 3.13.", "tmux 3.5a"),
}
TRAINER_SHA = hashlib.sha256(DEMO_TRAINER.read_bytes()).hexdigest()


def build_root_filesystems() -> None:
    """The first run on a machine builds the three (cached for every later run), in parallel:
    downloading is most of it."""
    errors: list[BaseException] = []

    def build(distro: str) -> None:
        try:
            rootfs.cached(distro)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=build, args=(d,)) for d in MATRIX]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@pytest.fixture(scope="module")
def distro_sandbox(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Sandbox, SandboxInfo]]:
    """A sandbox of its own with one container per release (the session's sandbox is `host`)."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    build_root_filesystems()
    sb = Sandbox(tmp_path_factory.mktemp("distros"), stock_home=True)
    try:
        for distro, (vmid, _, _) in MATRIX.items():
            info = sb.up([vmid], gpus=2, distro=distro)
        warm_agent_cache(sb, info.vmids)
        yield sb, info
    finally:
        sb.down()


@pytest.fixture
def distro_project(
    distro_sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path
) -> Iterator[Project]:
    sb, info = distro_sandbox
    yield Project(tmp_path / "project", sb, info)
    # Every run of the test gone before the next one deploys: a trainer that outlives its tmux
    # server (its socket removed, or SIGHUP still being handled) holds GPUs the next run wants.
    for vmid, _, _ in MATRIX.values():
        sb.ct_exec(
            vmid, ["sh", "-c", "tmux kill-server 2>/dev/null; pkill -KILL -f '[t]rain_demo'; true"]
        )


@pytest.mark.parametrize("distro", list(MATRIX))
def test_container_is_what_a_template_gives(
    distro_sandbox: tuple[Sandbox, SandboxInfo], distro: str
) -> None:
    """Its own python3 and tmux and /etc (not the host's), loopback up, its name resolving."""
    sb, _ = distro_sandbox
    vmid, python, tmux = MATRIX[distro]
    assert sb.distro(vmid) == distro
    assert sb.ct_exec(vmid, ["python3", "-V"]).stdout.decode().startswith(python)
    assert sb.ct_exec(vmid, ["tmux", "-V"]).stdout.decode().strip() == tmux
    release = sb.ct_exec(vmid, ["cat", "/etc/os-release"]).stdout.decode()
    assert f"VERSION_CODENAME={distro}" in release
    assert "/usr" not in sb.ct_exec(vmid, ["cat", "/proc/mounts"]).stdout.decode().split()
    # a local port: listen on the hostname's address, connect to it (torchrun's rendezvous)
    probe = (
        "import socket; a = socket.gethostbyname(socket.gethostname()); s = socket.socket(); "
        "s.bind((a, 0)); s.listen(); socket.create_connection(s.getsockname()).close(); print(a)"
    )
    result = sb.ct_exec(vmid, ["python3", "-c", probe])
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == "127.0.1.1"
    assert socket.gethostname() != f"sandbox-{vmid}"


@pytest.mark.parametrize("distro", list(MATRIX))
def test_day_two_cycle(distro_project: Project, distro: str) -> None:
    project = distro_project
    vmid = MATRIX[distro][0]
    name = f"cycle{distro}"
    book = project.playbook(name, gpus=2)
    project.write({name: (vmid, book)})
    ok(project.launcher("deploy", "--restart"))
    v2 = project.root / "train_v2.py"
    v2.write_bytes(DEMO_TRAINER.read_bytes() + b"\n# v2\n")
    book["script"]["source"] = str(v2)
    project.write({name: (vmid, book)})
    ok(project.launcher("deploy", "--restart"))

    code, report, _ = verify_json(project)
    assert code == 0, report
    assert report["verdict"] == "healthy"
    status = json_out(project.launcher("status", "--json"))
    assert status["verdict"] == "healthy", status

    follower = popen(project, "logs", "-f", "--tail", "0")
    found = lines_of(follower)
    wait_line(found, "step=")
    wait_line(found, "step=")
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=15)
    assert follower.returncode == 0, err
    assert "stopped following" in err

    stopped = project.launcher("stop", "--grace", "5")
    assert "session " in ok(stopped) + stopped.stderr
    assert project.processes(vmid, "train_demo.py") == []

    rolled = project.launcher("rollback", "--restart")
    assert f"sha256 {TRAINER_SHA[:12]}" in ok(rolled), rolled.stderr
    sha = project.ct_text(vmid, "sha256sum", f"/root/{name}/train_demo.py").split()[0]
    assert sha == TRAINER_SHA
    project.wait_for(lambda: project.processes(vmid, "train_demo.py"), what="the relaunch")
    ok(project.launcher("stop", "--grace", "5"))
    assert project.processes(vmid, "train_demo.py") == []


def test_a_container_keeps_its_root_filesystem(
    distro_sandbox: tuple[Sandbox, SandboxInfo],
) -> None:
    """`up` with another --distro for an existing VMID is refused, the container untouched;
    `up` without one keeps each container's own."""
    sb, _ = distro_sandbox
    vmid = MATRIX["bullseye"][0]
    with pytest.raises(UsageError, match=rf"{vmid} \(bullseye\) exist with another"):
        sb.up([vmid], gpus=2, distro="trixie")
    with pytest.raises(UsageError, match=rf"{vmid} \(bullseye\) exist with another"):
        sb.up([vmid], gpus=2, distro="host")
    sb.up([vmid], gpus=2)  # no --distro: repaired, as it was made
    assert sb.distro(vmid) == "bullseye"
    assert sb.ct_exec(vmid, ["python3", "-V"]).stdout.decode().startswith("Python 3.9.")


def test_sandbox_up_distro_on_the_command_line(tmp_path: Path) -> None:
    """`launcher sandbox up --distro`, as the README shows it; a mixed sandbox repairs; status
    names each container's root filesystem; an unknown release is a usage error."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    build_root_filesystems()
    state = str(tmp_path / "sb")

    def sandbox(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "launcher", "sandbox", *args, "--state-dir", state]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)

    try:
        up = sandbox("up", "--vmid", "225", "--distro", "bullseye", "--gpus", "1")
        assert up.returncode == 0, up.stderr
        assert "containers: 225 running (bullseye)" in up.stdout
        mixed = sandbox("up", "--vmid", "225,226", "--gpus", "1")
        assert mixed.returncode == 0, mixed.stderr
        status = sandbox("status")
        assert "containers: 225 running (bullseye), 226 running (host)" in status.stdout
        refused = sandbox("up", "--vmid", "226", "--distro", "trixie")
        assert refused.returncode == 2
        assert "226 (host) exist with another root filesystem than trixie" in refused.stderr
        unknown = sandbox("up", "--vmid", "227", "--distro", "sid")
        assert unknown.returncode == 2 and "'sid' is not one of" in unknown.stderr
    finally:
        assert sandbox("down").returncode == 0
    assert not Path(state).exists()


@pytest.mark.parametrize("distro", list(MATRIX))
def test_the_container_boots_systemd_as_a_proxmox_ct_does(
    distro_sandbox: tuple[Sandbox, SandboxInfo], distro: str
) -> None:
    """PID 1 is the distribution's systemd, with journald, logind and the timer that ages /tmp
    (systemd-tmpfiles-clean), as in a CT made from a Proxmox template."""
    sb, _ = distro_sandbox
    vmid = MATRIX[distro][0]
    assert sb.ct_exec(vmid, ["cat", "/proc/1/comm"]).stdout == b"systemd\n"
    state = sb.ct_exec(vmid, ["systemctl", "is-system-running", "--wait"]).stdout.decode()
    assert state.strip() in ("running", "degraded"), state
    for unit in ("systemd-journald.service", "systemd-tmpfiles-clean.timer"):
        active = sb.ct_exec(vmid, ["systemctl", "is-active", unit]).stdout.decode().strip()
        assert active == "active", (unit, active)


def test_watch_on_a_systemd_container(distro_project: Project) -> None:
    project = distro_project
    vmid = MATRIX["trixie"][0]
    project.write({"watched": (vmid, project.playbook("watched", gpus=2))})
    ok(project.launcher("deploy", "--restart"))
    watched = project.launcher("watch", "--for", "8", "--interval", "2", "--wait", "3", "--json")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    assert project.processes(vmid, "train_demo.py"), "watch left the healthy run alone"


def test_a_systemd_containers_removed_tmux_socket(distro_project: Project) -> None:
    """Debian 13's systemd-tmpfiles ages /tmp, where tmux keeps its socket (tmux/tmux#4640):
    deleted under a live run, the run is still found and never doubled."""
    project = distro_project
    vmid = MATRIX["trixie"][0]
    delete_socket_under_a_live_run(project, vmid)
    check_the_run_is_found_and_never_doubled(project, vmid)

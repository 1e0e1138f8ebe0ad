"""Fixtures for end-to-end tests against the local sandbox (real sshd, LXC, tmux; needs root)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from launcher.sandbox import Sandbox, SandboxInfo
from launcher.sandbox.gpus import driver_dir
from launcher.sandbox.nvidia_smi import still_held
from launcher.transport import persist
from tests.e2e.project import Project

# Four containers: the fleet tests use all of them, the others mostly 200 and 201.
SANDBOX_VMIDS = (200, 201, 202, 203)
SANDBOX_GPUS = 8
REQUIRED = ("lxc-start", "lxc-attach", "lxc-info", "ssh", "ssh-keygen", "tmux", "/usr/sbin/sshd")

SshRunner = Callable[..., "subprocess.CompletedProcess[bytes]"]


def missing_requirements() -> str | None:
    """Why the sandbox cannot run here, or None."""
    if os.geteuid() != 0:
        return "end-to-end tests need root (LXC containers and sshd): run them with sudo"
    missing = [tool for tool in REQUIRED if shutil.which(tool) is None]
    if missing:
        return "end-to-end tests need " + ", ".join(missing) + " (apt-get install lxc tmux ...)"
    return None


@pytest.fixture(autouse=True)
def _keep_developer_ssh_out(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ~/.ssh (keys, config, known_hosts) or agent of the developer leaks into a test."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
    for var in ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "LAUNCHER_INVENTORY", "LAUNCHER_SANDBOX_DIR"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def _private_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Persisted connections and their hints live per test (a short path: sockets need one),
    and none outlives it."""
    runtime = Path(tempfile.mkdtemp(prefix="lr", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield runtime
    persist.stop_all()
    shutil.rmtree(runtime, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Sandbox, SandboxInfo]]:
    """A sandbox with containers 200 and 201 for the whole session, removed at the end."""
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    sb = Sandbox(tmp_path_factory.mktemp("sandbox"), stock_home=True)
    try:
        info = sb.up(SANDBOX_VMIDS, gpus=SANDBOX_GPUS)
        separate_gpus(sb)
        warm_agent_cache(sb, SANDBOX_VMIDS)
        yield sb, info
    finally:
        sb.down()


def separate_gpus(sb: Sandbox) -> None:
    """Each container its own 8 GPUs: the suite runs 8-GPU runs in several containers at once,
    which one host's 8 shared GPUs would (rightly) refuse. tests/e2e/test_gpus.py shares them."""
    for vmid in SANDBOX_VMIDS:
        sb.set_gpu_pool(vmid, f"ct{vmid}")


def warm_agent_cache(sb: Sandbox, vmids: tuple[int, ...]) -> None:
    """Cache the agent in every container, as the first call to a container does: tests that
    count `pct` calls per command then see the steady state (one call, not a miss and a resend)."""
    from launcher.agent.protocol import BOOT
    from launcher.container.agentclient import payload

    request = {"op": "history", "workdir": "/root/warm-up", "limit": 1}
    for vmid in vmids:
        result = sb.ct_exec(vmid, ["python3", "-c", BOOT], input=payload(request, mode="store"))
        assert result.returncode == 0, result.stderr.decode()


def ssh_argv(info: SandboxInfo, remote_command: str) -> list[str]:
    """The system ssh client, strict about the host key, reading no user or system config."""
    return [
        "ssh",
        "-F",
        "none",
        "-i",
        str(info.identity_file),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f'UserKnownHostsFile="{info.known_hosts}"',  # ssh splits this option on spaces
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-p",
        str(info.port),
        f"{info.user}@{info.address}",
        remote_command,
    ]


@pytest.fixture
def ssh(sandbox: tuple[Sandbox, SandboxInfo]) -> SshRunner:
    """ssh("pct", "exec", "200", "--", ...): run argv on the sandbox host (quoted once)."""
    _, info = sandbox

    def run(
        *argv: str | int, input: bytes | None = None, timeout: float = 30
    ) -> subprocess.CompletedProcess[bytes]:
        command = shlex.join(str(a) for a in argv)
        return subprocess.run(
            ssh_argv(info, command),
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def project(sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path) -> Iterator[Project]:
    """An inventory + playbooks in a temp dir on the session's sandbox; faults reset after.
    Every CLI call is a fresh process, as a user's and CI's are."""
    sb, info = sandbox
    sb.set_faults()
    yield Project(tmp_path / "project", sb, info)
    sb.set_faults()
    end_leftover_runs(sb)


# Every run a test started, also one that failed half-way: tmux servers, trainers and whatever
# they spawned. deploy refuses GPUs held from outside the run it replaces, so a run left behind
# by one test would otherwise refuse the next test's deploy in that container.
LEFTOVERS = (
    "tmux kill-server 2>/dev/null; "
    "pkill -KILL -f '[t]rain_demo|[e]scaped-gpu-holder|[p]ython3 -m trainer'; true"
)


def end_leftover_runs(sb: Sandbox) -> None:
    for vmid in SANDBOX_VMIDS:
        sb.ct_exec(vmid, ["sh", "-c", LEFTOVERS])
    gpus_released(sb)


def gpus_released(sb: Sandbox, timeout: float = 10) -> None:
    """Until the GPUs of the runs just ended are free: the sandbox's driver, as a real one does,
    frees an exited trainer's memory a moment after it exits (its record's released_at), and a
    killed one's once the process is gone, reaped (launcher/sandbox/nvidia_smi.py, records).
    The next test's deploy refuses GPUs that something it cannot see holds, so it must not
    start before. A holder that stays (none should) only costs the timeout."""
    deadline = time.monotonic() + timeout
    while held_records(sb) and time.monotonic() < deadline:
        time.sleep(0.1)


def held_records(sb: Sandbox) -> list[Path]:
    """The GPU records of this sandbox's pools the driver still counts, as the stand-in
    nvidia-smi judges them (by the host's /proc: the sandbox host is this machine; a zombie
    not yet reaped still holds)."""
    held = []
    for path in (driver_dir(sb.state_dir) / "pools").glob("*/*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # written or removed meanwhile
        if still_held(record, "/proc"):
            held.append(path)
    return held

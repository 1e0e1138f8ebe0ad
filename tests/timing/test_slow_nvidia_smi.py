"""A slow or hung nvidia-smi in the container (the sandbox's driver faults) slows neither verify
nor status, and never two of launcher's run at once. The GPU checks: tests/e2e/test_gpus.py."""

from __future__ import annotations

import time

from tests.e2e import test_gpus
from tests.e2e.project import Project, verify_json
from tests.e2e.test_gpus import INTERVAL, SLACK, THRESHOLD, VMID, WAIT, deploy

faulty = test_gpus.faulty  # the fixture: the container's driver set to fail, healthy after


def nvidia_smi_count(project: Project, vmid: int) -> int:
    """nvidia-smi processes in the container now (launcher's, and any other)."""
    out = project.ct_text(vmid, "ps", "-eo", "comm=")
    return sum(1 for line in out.splitlines() if line.strip() == "nvidia-smi")


def test_a_20_s_nvidia_smi_does_not_slow_verify(faulty: Project) -> None:
    """Without the persistence daemon each call can take 20 s: verify decides in its usual
    time, its polls keep their interval, and never two of launcher's nvidia-smi run at once."""
    project = faulty
    deploy(project, "gpuslow")
    project.sandbox.set_gpu_fault(VMID, "delay 20")
    started = time.monotonic()
    code, report, elapsed = verify_json(project)
    assert code == 0, report
    assert elapsed <= WAIT + THRESHOLD * INTERVAL + SLACK, elapsed
    assert nvidia_smi_count(project, VMID) <= 1
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] in ("pass", "warn"), gpus
    # Within one query's time the facts arrive, marked with their age.
    project.wait_for(
        lambda: " s old" in project.launcher("status").stdout, timeout=40, what="aged facts"
    )
    assert time.monotonic() - started < 60
    assert nvidia_smi_count(project, VMID) <= 1


def test_a_hung_nvidia_smi_neither_stalls_status_nor_piles_up(faulty: Project) -> None:
    project = faulty
    deploy(project, "gpuhang", verify={"wait": 50, "window": 60})
    project.sandbox.set_gpu_fault(VMID, "hang")
    started = time.monotonic()
    status = project.launcher("status")
    assert time.monotonic() - started < 10, "status waited for the hung nvidia-smi"
    assert "gpus: GPUs 8/8 held" in status.stdout, status.stdout
    code, report, elapsed = verify_json(project)
    assert code == 0, report
    assert elapsed <= 50 + SLACK + THRESHOLD * INTERVAL, elapsed
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "warn" and "nvidia-smi" in gpus["observed"], gpus
    assert nvidia_smi_count(project, VMID) <= 1
    # The hung call was killed after 45 s and said so; the next one hangs in its place.
    started = time.monotonic()
    status = project.launcher("status")
    assert time.monotonic() - started < 10, "status waited for the hung nvidia-smi"
    assert "nvidia-smi" in status.stdout, status.stdout
    assert nvidia_smi_count(project, VMID) <= 1

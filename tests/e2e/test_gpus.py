"""GPUs as a real container sees them, on the sandbox in its default mode: nvidia-smi reports
host PIDs, and containers 200 and 201 share one host's 8 GPUs.

A redeploy of a running 8-GPU run works; a GPU used from another container refuses the deploy
(exit 4) before anything is stopped, with or without --kill-gpu-holders; a run that fell back to
the CPU, uses one GPU of eight, or idles on its GPUs is UNHEALTHY; stop frees every device; and
a host PID that names an unrelated process of the container is never signalled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from launcher.sandbox.manager import HERE
from tests.e2e.project import Project, json_out, verify_json

pytestmark = pytest.mark.e2e

VMID, OTHER = 200, 201
DEMO_TRAINER = HERE / "demo_trainer.py"
WAIT, INTERVAL, THRESHOLD = 3.0, 1.0, 3
PROBE = {"wait": WAIT, "interval": INTERVAL, "failure_threshold": THRESHOLD, "window": 20}
SLACK = 5.0  # poll round trips on a loaded machine
APPS = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"]


@pytest.fixture
def shared(project: Project) -> Iterator[Project]:
    """200 and 201 share the same 8 GPUs, as CTs of one Proxmox host given the same devices."""
    sb = project.sandbox
    for vmid in (VMID, OTHER):
        sb.set_gpu_pool(vmid, "shared")
    try:
        yield project
    finally:
        for vmid in (VMID, OTHER):
            project.ct(vmid, "sh", "-c", "tmux kill-server; pkill -KILL -f '[t]rain_demo|[g]pu3'")
            sb.set_gpu_pool(vmid, f"ct{vmid}")


def deploy(project: Project, name: str, *args: str, **overrides: Any) -> None:
    verify = {**PROBE, **overrides.pop("verify", {})}
    project.write({name: (VMID, project.playbook(name, verify=verify, **overrides))})
    result = project.launcher("deploy", "--restart", *args)
    assert result.returncode == 0, result.stdout + result.stderr


def pane_pid(project: Project, session: str) -> str:
    return project.ct_text(VMID, "tmux", "display", "-p", "-t", f"={session}:", "#{pane_pid}")


def holders(project: Project, vmid: int) -> dict[int, set[int]]:
    """{container pid: GPU indexes} from the fd links, as `fuser -v /dev/nvidia*` finds them."""
    out = project.ct_text(vmid, "sh", "-c", "ls -l /proc/[0-9]*/fd/ 2>/dev/null")
    found: dict[int, set[int]] = {}
    pid = 0
    for line in out.splitlines():
        head = re.match(r"^/proc/(\d+)/fd/?:", line)
        if head:
            pid = int(head.group(1))
        device = re.search(r"-> /dev/nvidia(\d+)$", line)
        if device:
            found.setdefault(pid, set()).add(int(device.group(1)))
    return found


def hold_gpu3(project: Project) -> int:
    """A trainer in the other container on GPU 3; its pid there."""
    (project.sandbox.container_root(OTHER) / "root" / "gpu3.py").write_bytes(
        DEMO_TRAINER.read_bytes()
    )
    command = "cd /root && DEMO_GPU_INDEXES=3 DEMO_INTERVAL=0.5 exec python3 gpu3.py"
    project.ct(OTHER, "tmux", "new-session", "-d", "-s", "gpu3", command)
    project.wait_for(lambda: holders(project, OTHER), what="the other container's GPU 3 holder")
    ((pid, gpus),) = holders(project, OTHER).items()
    assert gpus == {3}
    return pid


def test_redeploy_of_a_running_8_gpu_run_succeeds_and_holds_8(project: Project) -> None:
    deploy(project, "gpure")
    project.wait_for(lambda: holders(project, VMID), what="the first run's GPUs")
    # nvidia-smi in the container names the run by its host PID, which is none of the
    # container's: the deploy below used to take it for a stranger and refuse.
    apps = project.ct_text(VMID, *APPS).splitlines()
    assert len(apps) == 8 and all("[Not Found]" in line for line in apps), apps
    first = pane_pid(project, "gpure")
    again = project.launcher("deploy", "--restart", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    steps = {s["name"]: s for s in json_out(again)["steps"]}
    assert "held by the old run" in steps["gpus"]["detail"]
    assert pane_pid(project, "gpure") != first
    project.wait_for(
        lambda: list(holders(project, VMID).values()) == [set(range(8))], what="the new run's 8"
    )
    status = project.launcher("status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    gpus = json_out(status)["gpus"]
    assert gpus["want"] == 8 and gpus["held"] == list(range(8))
    text = project.launcher("status").stdout
    assert "gpus: GPUs 8/8 held · util %" in text and "mem GiB 22.0" in text


@pytest.mark.parametrize("kill", [False, True], ids=["plain", "kill-gpu-holders"])
def test_gpu_used_from_another_container_refuses_before_stopping(
    shared: Project, kill: bool
) -> None:
    project = shared
    deploy(project, "gpushare")
    project.wait_for(lambda: holders(project, VMID), what="the run's GPUs")
    other = hold_gpu3(project)
    before = pane_pid(project, "gpushare")
    args = ["--kill-gpu-holders"] if kill else []
    refused = project.launcher("deploy", "--restart", *args)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    out = refused.stdout + refused.stderr
    assert re.search(r"GPU 3 \(\d+ MiB in use", out), out
    assert "outside this container" in out
    assert "✗ gpus" in out and "✓ stop" not in out
    # Nothing stopped: the run, and the other container's process, untouched.
    assert pane_pid(project, "gpushare") == before
    assert list(holders(project, VMID).values()) == [set(range(8))]
    assert other in holders(project, OTHER)

    # With no run here at all: the same refusal, from the memory in use alone.
    project.kill_session(VMID, "gpushare")
    project.wait_for(lambda: not holders(project, VMID), what="the run gone")
    fresh = project.launcher("deploy", "--restart", *args)
    assert fresh.returncode == 4, fresh.stdout + fresh.stderr
    assert "GPU 3 (22512 MiB in use)" in fresh.stderr
    assert other in holders(project, OTHER)
    # doctor says the same.
    doctor = project.launcher("doctor")
    assert "GPU 3 (22512 MiB in use)" in doctor.stdout + doctor.stderr


@pytest.mark.parametrize(
    ("mode", "evidence"),
    [
        ("cpu-fallback", "the run holds no GPU"),
        ("one-gpu", "the run holds 1 of 8 GPUs"),
        ("idle-gpus", "8 of the run's 8 GPUs below 10 % busy"),
    ],
)
def test_a_run_not_using_its_gpus_is_unhealthy(project: Project, mode: str, evidence: str) -> None:
    deploy(project, f"gpu{mode.replace('-', '')}", env={"DEMO_MODE": mode})
    code, report, elapsed = verify_json(project)
    assert code == 1, report
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "fail" and evidence in gpus["observed"], gpus
    assert elapsed <= WAIT + THRESHOLD * INTERVAL + SLACK, elapsed
    # The status lines alone look healthy: only the GPUs tell.
    others = [c for c in report["checks"] if c["verdict"] == "fail" and c["name"] != "gpus"]
    assert others == [], others


def test_a_healthy_run_passes_the_gpus_check(project: Project) -> None:
    deploy(project, "gpuok")
    code, report, _ = verify_json(project)
    assert code == 0, report
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "pass" and "holds 8 GPUs (0-7)" in gpus["observed"]


def test_stop_frees_every_device(project: Project) -> None:
    deploy(project, "gpustop", env={"DEMO_SPAWN_CHILD": "1"})
    project.wait_for(lambda: len(holders(project, VMID)) == 2, what="trainer and worker")
    stopped = project.launcher("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "✓ gpus" in stopped.stdout + stopped.stderr
    assert holders(project, VMID) == {}
    used = project.ct_text(
        VMID, "nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"
    )
    assert used.split() == ["0"] * 8, used


def test_a_host_pid_naming_an_unrelated_container_process_is_never_signalled(
    project: Project,
) -> None:
    """nvidia-smi lists the run by its host PID H; a process of the container that happens to
    have PID H there is no GPU holder, and a deploy (even with --kill-gpu-holders) leaves it be."""
    deploy(project, "gpupid")
    project.wait_for(lambda: holders(project, VMID), what="the run's GPUs")
    apps = project.ct_text(VMID, *APPS).splitlines()
    host_pid = int(apps[0].split(",")[0])
    if project.ct(VMID, "test", "-e", f"/proc/{host_pid}").returncode == 0:
        pytest.skip(f"pid {host_pid} is taken in the container already")
    bystander = spawn_with_pid(project, host_pid)
    try:
        listed = project.ct_text(VMID, *APPS)
        assert f"{host_pid}, /usr/bin/sleep" in listed, listed  # the name nvidia-smi shows
        result = project.launcher("deploy", "--restart", "--kill-gpu-holders")
        assert result.returncode == 0, result.stdout + result.stderr
        assert bystander.poll() is None, "the unrelated process was killed"
        assert project.ct(VMID, "test", "-e", f"/proc/{host_pid}").returncode == 0
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)
        bystander.wait()


def spawn_with_pid(project: Project, pid: int) -> subprocess.Popen[bytes]:
    """`sleep` in the container's PID namespace with PID `pid` there (ns_last_pid, written from
    inside that namespace), its parent the host's nsenter, so the test can end it."""
    info = subprocess.run(
        ["lxc-info", "-n", str(VMID), "-P", str(project.sandbox.lxcpath), "-p", "-H"],
        capture_output=True,
        text=True,
        check=True,
    )
    init = info.stdout.strip()
    # nsenter forks into the namespace: the shell writes ns_last_pid for the namespace it runs
    # in (the kernel takes the writer's), and the `sleep` it forks next gets `pid`.
    script = f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid; sleep 600 & wait"
    proc = subprocess.Popen(
        ["nsenter", "-t", init, "-p", "--", "sh", "-c", script], start_new_session=True
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if project.ct(VMID, "test", "-e", f"/proc/{pid}").returncode == 0:
            return proc
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"could not start a process with pid {pid} in the container")


def test_a_gpu_shared_with_another_container_is_no_reason_to_refuse_a_run_not_using_it(
    shared: Project,
) -> None:
    """The old run held all 8 (GPU 3 shared with the other container); the new one is given
    GPUs 0-2 only: the deploy goes ahead, and doctor names GPU 3 as used from outside."""
    project = shared
    deploy(project, "gpufew")
    project.wait_for(lambda: holders(project, VMID), what="the old run's 8 GPUs")
    other = hold_gpu3(project)
    book = project.playbook(
        "gpufew", gpus=3, env={"CUDA_VISIBLE_DEVICES": "0,1,2", "DEMO_GPUS": "3"}, verify=PROBE
    )
    project.write({"gpufew": (VMID, book)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr
    project.wait_for(
        lambda: list(holders(project, VMID).values()) == [{0, 1, 2}], what="the new run's 3"
    )
    doctor = project.launcher("doctor")
    assert "used from outside, not by this run: GPU 3 (22512 MiB in use)" in doctor.stderr
    assert other in holders(project, OTHER)


# --------------------------------------------------------------------------- real GPU hosts


def ct_lines(project: Project, vmid: int, *argv: str) -> list[str]:
    return project.ct_text(vmid, *argv).splitlines()


@pytest.fixture
def staging(project: Project) -> Iterator[Project]:
    """201 as a CI staging CT given the host's GPUs 6 and 7 (it restarts, and back after)."""
    sb = project.sandbox
    sb.set_gpu_slice(OTHER, [6, 7])
    try:
        yield project
    finally:
        sb.set_gpu_slice(OTHER, 8)


def test_a_staging_ct_with_the_hosts_gpus_6_and_7_deploys_verifies_and_stops(
    staging: Project,
) -> None:
    """/dev/nvidia6 and /dev/nvidia7 are nvidia-smi's index 0 and 1 there: the run's GPUs are
    its own, not "used from outside", and its utilization is that of 6 and 7."""
    project = staging
    devices = sorted(project.ct_text(OTHER, "ls", "/dev").split())
    assert [d for d in devices if d.startswith("nvidia")] == [
        "nvidia-uvm", "nvidia6", "nvidia7", "nvidiactl",
    ]  # fmt: skip
    listed = ct_lines(project, OTHER, "nvidia-smi", "-L")
    assert [line.split(":")[0] for line in listed] == ["GPU 0", "GPU 1"]
    minors = re.findall(r"Minor Number\s*:\s*(\d+)", project.ct_text(OTHER, "nvidia-smi", "-q"))
    assert minors == ["6", "7"]
    book = project.playbook("staging", gpus=2, verify=PROBE)
    project.write({"staging": (OTHER, book)})
    first = project.launcher("deploy", "--restart")
    assert first.returncode == 0, first.stdout + first.stderr
    project.wait_for(
        lambda: list(holders(project, OTHER).values()) == [{6, 7}], what="the run on 6 and 7"
    )
    again = project.launcher("deploy", "--restart", "--json")
    assert again.returncode == 0, again.stdout + again.stderr
    steps = {s["name"]: s for s in json_out(again)["steps"]}
    assert "held by the old run" in steps["gpus"]["detail"], steps["gpus"]
    project.wait_for(
        lambda: list(holders(project, OTHER).values()) == [{6, 7}], what="the new run on 6, 7"
    )
    code, report, _ = verify_json(project)
    assert code == 0, report
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "pass" and "holds 2 GPUs (0, 1)" in gpus["observed"], gpus
    status = json_out(project.launcher("status", "--json"))["gpus"]
    assert status["want"] == 2 and status["held"] == [0, 1]
    assert [row[0] for row in status["devices"]] == [0, 1] and status["devices"][0][1] > 0
    stopped = project.launcher("stop")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "✓ gpus" in stopped.stdout + stopped.stderr
    assert holders(project, OTHER) == {}


def test_a_run_of_2_gpus_of_8_with_a_monitor_child_is_healthy(project: Project) -> None:
    """The run's GPU monitor (wandb's, pynvml's) opens all 8 device files and no nvidia-uvm: the
    run uses 2 GPUs, busy, and the monitor is named as a watcher, not counted."""
    deploy(project, "gpumon", gpus=2, env={"DEMO_GPUS": "2", "DEMO_GPU_MONITOR": "1"})
    project.wait_for(lambda: len(holders(project, VMID)) == 2, what="trainer and monitor")
    assert sorted(map(sorted, holders(project, VMID).values())) == [[0, 1], list(range(8))]
    code, report, _ = verify_json(project)
    assert code == 0, report
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "pass" and "holds 2 GPUs (0, 1)" in gpus["observed"], gpus
    status = json_out(project.launcher("status", "--json"))["gpus"]
    assert status["held"] == [0, 1]
    assert [w[2] for w in status["watchers"]] == [list(range(8))], status
    assert re.search(r"python3 \(pid \d+\) watches GPUs 0-7", project.launcher("status").stdout)


@pytest.mark.parametrize("kill", [False, True], ids=["plain", "kill-gpu-holders"])
def test_an_nvtop_in_another_session_neither_blocks_nor_dies(project: Project, kill: bool) -> None:
    deploy(project, "gpunvtop")
    project.ct(VMID, "tmux", "new-session", "-d", "-s", "watching", "nvtop")
    watcher = project.wait_for(
        lambda: next((p for p, g in holders(project, VMID).items() if len(g) == 8 and
                      "nvtop" in project.ct_text(VMID, "cat", f"/proc/{p}/comm")), None),
        what="nvtop with every device open",
    )  # fmt: skip
    args = ["--kill-gpu-holders"] if kill else []
    again = project.launcher("deploy", "--restart", "--json", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    steps = {s["name"]: s for s in json_out(again)["steps"]}
    assert f"nvtop (pid {watcher}) watches GPUs 0-7" in steps["gpus"]["detail"], steps["gpus"]
    assert project.ct(VMID, "test", "-e", f"/proc/{watcher}").returncode == 0, "nvtop was killed"
    doctor = project.launcher("doctor")
    assert f"nvtop (pid {watcher}) watches GPUs 0-7" in doctor.stdout + doctor.stderr
    assert f"nvtop (pid {watcher}) watches GPUs 0-7" in project.launcher("status").stdout


@pytest.fixture
def faulty(project: Project) -> Iterator[Project]:
    """The container's driver set to fail by the test; healthy again after, with no nvidia-smi
    of a hung call left holding launcher's nvidia-smi lock."""
    try:
        yield project
    finally:
        project.sandbox.set_gpu_fault(VMID)
        project.ct(VMID, "pkill", "-KILL", "-x", "nvidia-smi")


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("mismatch", "version mismatch: the container's NVIDIA user-space driver"),
        ("lost 1", "GPU lost: a GPU fell off the bus or became inaccessible: GPU at 0000:19:00.0"),
    ],
)
def test_a_broken_driver_refuses_the_deploy_before_the_stop(
    faulty: Project, fault: str, says: str
) -> None:
    project = faulty
    deploy(project, "gpufault")
    project.wait_for(lambda: holders(project, VMID), what="the run's GPUs")
    before = pane_pid(project, "gpufault")
    project.sandbox.set_gpu_fault(VMID, fault)
    refused = project.launcher("deploy", "--restart")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    out = refused.stdout + refused.stderr
    assert says in out, out
    assert "✓ stop" not in out
    assert pane_pid(project, "gpufault") == before, "the old run was stopped"
    assert list(holders(project, VMID).values()) == [set(range(8))]
    doctor = project.launcher("doctor")
    assert doctor.returncode != 0 and says in doctor.stdout + doctor.stderr
    if fault == "mismatch":
        assert "--no-kernel-module" in doctor.stdout + doctor.stderr
    status = project.launcher("status")
    assert says.split(":")[0] in status.stdout, status.stdout


def test_utilization_nvidia_smi_cannot_give_is_unknown_and_the_run_healthy(
    faulty: Project,
) -> None:
    """`[N/A]` (MIG, some boards): unknown, never 0 % busy."""
    project = faulty
    project.sandbox.set_gpu_fault(VMID, "na")
    deploy(project, "gpuna")
    code, report, _ = verify_json(project)
    assert code == 0, report
    gpus = {c["name"]: c for c in report["checks"]}["gpus"]
    assert gpus["verdict"] == "warn" and "utilization unknown" in gpus["observed"], gpus
    assert "util % ? ? ? ? ? ? ? ?" in project.launcher("status").stdout


def test_without_compute_apps_rows_a_shared_gpu_still_keeps_the_new_run_off(
    shared: Project,
) -> None:
    """A container whose nvidia-smi lists no compute-apps rows (it drops what it cannot
    resolve) cannot count a shared GPU's contexts before the stop: the memory that stays after
    the old run stopped still refuses to launch onto it (exit 4), naming the GPU."""
    project = shared
    deploy(project, "gpunoapps")
    project.wait_for(lambda: holders(project, VMID), what="the run's GPUs")
    other = hold_gpu3(project)
    project.sandbox.set_gpu_fault(VMID, "no-apps")
    try:
        assert project.ct_text(VMID, *APPS) == ""
        refused = project.launcher("deploy", "--restart")
    finally:
        project.sandbox.set_gpu_fault(VMID)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    out = refused.stdout + refused.stderr
    assert "GPU 3 (22512 MiB in use) after the old run stopped" in out, out
    assert other in holders(project, OTHER)

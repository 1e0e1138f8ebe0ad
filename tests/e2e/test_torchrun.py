"""A real DDP job under PyTorch's own torchrun (Debian's python3-torch: CPU, gloo, the elastic
agent), judged with the `torchtitan` preset: healthy, a worker that raises (torchrun restarts
the group), a rank hanging in all-reduce, NaN loss, a straggler rank; and that `deploy
--restart` and `stop` leave none of the old torchrun tree alive."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.hostpython import host_has_torch
from tests.e2e.project import Project, verify_json

pytestmark = pytest.mark.e2e

VMID = 203
DDP_TRAINER = Path(__file__).resolve().with_name("ddp_trainer.py")
TORCHRUN = "python3 ddp_trainer.py torchrun --standalone --nproc_per_node 2 --max_restarts 3"
# The first status line comes after torch's import in three processes and the rendezvous:
# several seconds on a loaded 2-core machine. Then a line every 0.5 s.
# Faults start DDP_AFTER = 1.5 s into training, before the probe's successes could end it.
VERIFY = {"wait": 6, "interval": 1, "window": 60, "successes": 5, "queues": {}}


@pytest.fixture
def ddp(project: Project) -> Iterator[Project]:
    if not host_has_torch():
        pytest.skip("python3-torch is not installed (./run setup installs it)")
    yield project
    project.ct(VMID, "sh", "-c", "tmux kill-server 2>/dev/null; pkill -KILL -f '[d]dp_trainer'")


def deploy(project: Project, name: str, mode: str = "healthy", **verify: Any) -> None:
    book = project.playbook(
        name,
        script={"source": str(DDP_TRAINER), "dest": "ddp_trainer.py"},
        command=TORCHRUN,
        env={"DDP_MODE": mode, "DDP_AFTER": "1.5"},
        gpus=0,
        status={"preset": "torchtitan"},
        verify={**VERIFY, **verify},
    )
    project.write({name: (VMID, book)})
    result = project.launcher("deploy", "--restart")
    assert result.returncode == 0, result.stdout + result.stderr


def tree(project: Project) -> dict[str, list[int]]:
    """Live processes of the job: torchrun's agent and its workers, by pid."""
    out = project.ct_text(VMID, "ps", "-eo", "pid=,stat=,args=")
    found: dict[str, list[int]] = {"agent": [], "workers": []}
    for line in out.splitlines():
        pid, stat, args = line.split(None, 2)
        if "python3" not in args.split()[0] or "ddp_trainer.py" not in args or "Z" in stat:
            continue
        found["agent" if "ddp_trainer.py torchrun" in args else "workers"].append(int(pid))
    return found


def failed(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["observed"] for c in report["checks"] if c["verdict"] == "fail"}


def test_healthy_run_then_redeploy_and_stop_leave_no_old_process(ddp: Project) -> None:
    project = ddp
    deploy(project, "ddpok")
    code, report, _ = verify_json(project)
    assert code == 0, report
    assert report["verdict"] == "healthy"
    latest = report["samples"][-1]
    assert latest["step"] > 0 and latest["throughput"] > 0
    old = tree(project)
    assert len(old["agent"]) == 1 and len(old["workers"]) == 2, old

    deploy(project, "ddpok")
    project.wait_for(lambda: len(tree(project)["workers"]) == 2, timeout=60, what="new workers")
    new = tree(project)
    assert len(new["agent"]) == 1 and len(new["workers"]) == 2, new
    assert not set(old["agent"] + old["workers"]) & set(new["agent"] + new["workers"])

    stopped = project.launcher("stop", "--grace", "10")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert tree(project) == {"agent": [], "workers": []}


def test_worker_that_raises_is_a_restart_loop(ddp: Project) -> None:
    deploy(ddp, "ddpraise", "raise")
    code, report, _ = verify_json(ddp)
    probe = report["timings"]["duration"]  # from its first poll: a slow CLI start not counted
    print(f"{report['target']}: {report['reason']!r} after {probe:.1f} s")
    assert code == 1, (report["reason"], failed(report), report["samples"][-3:])
    # the worker's traceback, then the group restarting with the step back at 0
    assert {"fatal", "restarts"} & failed(report).keys(), report["checks"]
    assert probe < 45


def test_rank_hanging_in_all_reduce_is_unhealthy(ddp: Project) -> None:
    """Nothing printed and nothing written once rank 1 stops: `hang_after` judges it. (With the
    defaults alone, a step unchanged for under `stall_after` = 120 s, the probe passes after its
    successes: the cadence of the status lines is not judged yet.)"""
    deploy(ddp, "ddphang", "hang", step={"hang_after": 3}, successes=10)
    code, report, _ = verify_json(ddp)
    probe = report["timings"]["duration"]  # from its first poll: a slow CLI start not counted
    print(f"{report['target']}: {report['reason']!r} after {probe:.1f} s")
    assert code == 1, (report["reason"], failed(report), report["samples"][-3:])
    assert report["verdict"] == "unhealthy", report["checks"]
    assert probe < 60


def test_nan_loss_is_unhealthy(ddp: Project) -> None:
    deploy(ddp, "ddpnan", "nan")
    code, report, _ = verify_json(ddp)
    probe = report["timings"]["duration"]  # from its first poll: a slow CLI start not counted
    print(f"{report['target']}: {report['reason']!r} after {probe:.1f} s")
    assert code == 1, (report["reason"], failed(report), report["samples"][-3:])
    assert "nan" in " ".join(failed(report).values()), report["checks"]
    assert probe < 45


def test_straggler_rank_slowing_every_rank_is_unhealthy(ddp: Project) -> None:
    deploy(ddp, "ddpslow", "straggler")
    code, report, _ = verify_json(ddp)
    probe = report["timings"]["duration"]  # from its first poll: a slow CLI start not counted
    print(f"{report['target']}: {report['reason']!r} after {probe:.1f} s")
    assert code == 1, (report["reason"], failed(report), report["samples"][-3:])
    assert "throughput" in failed(report), report["checks"]
    assert probe < 45

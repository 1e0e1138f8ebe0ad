"""Multi-node jobs without a host: the `jobs:` section's errors (file, line, key), the
rendezvous values each rank gets, the address chosen from `hostname -I`, and the verdict's
wording."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.config.models import load_inventory
from launcher.core.errors import ConfigError, ExitCode
from launcher.jobs.deploy import JobResult, NodeState
from launcher.jobs.job import NodeResult, Rendezvous, load_job, with_env
from launcher.jobs.verify import (
    NodeWatch,
    gpu_problem,
    has_finished,
    job_summary,
    liveness_problem,
    node_verdict,
    problem_state,
    run_id,
    status_job,
)
from launcher.targets.fleet import Outcome
from launcher.verify.gpus import GpuSample
from launcher.verify.lifecycle import State, status_exit
from launcher.verify.pane import PaneState
from tests.unit.projectfiles import write_project

JOB = """\
jobs:
  train:
    nodes: [prod, staging]
    playbook: playbooks/dflash.yaml
"""


def inventory_with(root: Path, jobs: str) -> Path:
    path = write_project(root)
    path.write_text(path.read_text() + jobs)
    return path


def problems(root: Path, jobs: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_inventory(inventory_with(root, jobs))
    return caught.value.problems


def test_a_valid_job_gives_every_rank_its_rendezvous_values(tmp_path: Path) -> None:
    inventory = load_inventory(inventory_with(tmp_path, JOB))
    job = load_job(inventory, "train")
    assert [n.name for n in job.nodes] == ["prod", "staging"]
    assert job.spec.master_port == 29500 and job.status_rank == 0
    rendezvous = Rendezvous("R1", "train-R1", "10.0.0.5", 29500, 2, ifnames=("eth1", "eth0"))
    targets = with_env(job.nodes, rendezvous)
    assert [t.playbook.spec.env for t in targets] == [
        {
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": "10.0.0.5",
            "MASTER_PORT": "29500",
            "JOB_ID": "train-R1",
            # torchrun's options: `torchrun --nproc_per_node N train.py` needs no other flag.
            "PET_NNODES": "2",
            "PET_NODE_RANK": str(rank),
            "PET_MAX_RESTARTS": "0",
            "PET_RDZV_ID": "train-R1",
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": "10.0.0.5:29500",
            "PET_RDZV_CONF": f"is_host={int(rank == 0)}",
            "GLOO_SOCKET_IFNAME": ifname,
            "NCCL_SOCKET_IFNAME": ifname,
        }
        for rank, ifname in ((0, "eth1"), (1, "eth0"))
    ]
    # The job's nodes keep their own host and VMID.
    assert [(t.host_name, t.vmid) for t in targets] == [("pve", 200), ("pve", 201)]


@pytest.mark.parametrize(
    ("jobs", "line", "key", "message"),
    [
        (JOB.replace("staging]", "nope]"), 7, "jobs.train.nodes.1", "unknown target 'nope'"),
        (JOB.replace("staging]", "prod]"), 7, "jobs.train.nodes.1", "same container as 'prod'"),
        (JOB + "    status_rank: 2\n", 9, "jobs.train.status_rank", "rank 2 does not exist"),
        (JOB + "    addresses: {other: 10.0.0.1}\n", 9, "jobs.train.addresses.other", "not one"),
        (JOB + "    addresses: {prod: 127.0.0.1}\n", 9, "jobs.train.addresses", "loopback"),
        (JOB + "    addresses: {prod: pve-1}\n", 9, "jobs.train.addresses", "not an IP address"),
        (JOB + "    master_port: 70000\n", 9, "jobs.train.master_port", "65535"),
        (JOB.replace("  train:", "  prod:"), 6, "jobs.prod", "differ from targets"),
        (JOB + "    extra: 1\n", 9, "jobs.train.extra", "unknown key"),
        (JOB.replace("[prod, staging]", "[]"), 7, "jobs.train.nodes", "at least 1"),
    ],
)
def test_job_errors_name_file_line_and_key(
    tmp_path: Path, jobs: str, line: int, key: str, message: str
) -> None:
    [problem] = problems(tmp_path, jobs)
    line += 7  # the lines of the inventory before `jobs:`
    assert problem.startswith(f"{tmp_path / 'inventory.yaml'}:{line}: {key}: "), problem
    assert message in problem


def test_the_static_rendezvous_names_every_address_and_no_endpoint() -> None:
    """torchrun's static backend: master_addr/port (run.py get_rdzv_endpoint builds the
    endpoint from them only when none is given), with --local_addr for newer torch on c10d."""
    static = Rendezvous("R1", "j-R1", "10.0.0.5", 29511, 2, backend="static", max_restarts=2)
    env = static.torchrun_env(1)
    assert env["PET_RDZV_BACKEND"] == "static" and env["PET_MAX_RESTARTS"] == "2"
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.0.0.5", "29511")
    assert "PET_RDZV_ENDPOINT" not in env and "PET_RDZV_CONF" not in env
    assert "GLOO_SOCKET_IFNAME" not in env  # no interface known: gloo's own choice
    local = Rendezvous("R1", "j-R1", "fd00::5", 29511, 2, local_addrs=("fd00::5", "fd00::6"))
    assert local.torchrun_env(1)["PET_LOCAL_ADDR"] == "fd00::6"
    assert local.torchrun_env(0)["PET_RDZV_ENDPOINT"] == "[fd00::5]:29511"


def test_the_playbooks_env_wins_over_torchruns_variables(tmp_path: Path) -> None:
    path = inventory_with(tmp_path, JOB)
    book = tmp_path / "playbooks" / "dflash.yaml"
    book.write_text(book.read_text().replace("env: {}", "env: {GLOO_SOCKET_IFNAME: ib0}"))
    job = load_job(load_inventory(path), "train")
    rendezvous = Rendezvous("R1", "train-R1", "10.0.0.5", 29500, 2, ifnames=("eth0", "eth0"))
    [env0, _] = [t.playbook.spec.env for t in with_env(job.nodes, rendezvous)]
    assert env0["GLOO_SOCKET_IFNAME"] == "ib0" and env0["NCCL_SOCKET_IFNAME"] == "eth0"


def test_a_playbook_that_sets_a_rendezvous_key_is_refused(tmp_path: Path) -> None:
    path = inventory_with(tmp_path, JOB)
    book = tmp_path / "playbooks" / "dflash.yaml"
    book.write_text(book.read_text().replace("env: {}", "env: {NODE_RANK: '3'}"))
    with pytest.raises(ConfigError) as caught:
        load_job(load_inventory(path), "train")
    assert "NODE_RANK set by the playbook" in caught.value.problems[0]


def state(**changes: object) -> PaneState:
    base: dict[str, object] = {
        "session_exists": True,
        "pane_dead": False,
        "dead_status": None,
        "exit_code": None,
        "capture": "",
        "run": "train:R1",
    }
    base.update(changes)
    return PaneState(**base)  # type: ignore[arg-type]


def test_liveness_of_a_node_without_status_lines() -> None:
    assert liveness_problem(state(), "train:R1") is None
    assert liveness_problem(state(session_exists=False), None) == "no session: the run is gone"
    assert "status 137" in str(liveness_problem(state(pane_dead=True, dead_status=137), None))
    assert "not the job's run train:R1" in str(liveness_problem(state(run="train:R0"), "train:R1"))
    assert run_id("train:R1") == "R1" and run_id(None) is None


def test_a_restart_or_a_failed_worker_on_a_node_is_the_jobs() -> None:
    patterns = ["Restarting worker group"]
    restarted = state(capture="step 1\n[default] Restarting worker group\n")
    assert liveness_problem(restarted, None, patterns) == (
        "restarted: [default] Restarting worker group"
    )
    failed = state(
        capture="ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) "
        "local_rank: 0 (pid: 41) of binary: /usr/bin/python3\n"
    )
    assert str(liveness_problem(failed, None, patterns)).startswith("a worker failed: ERROR:")
    fine = state(capture="worker exited (exitcode: 0)\nrendezvous NNODES=2\n")
    assert liveness_problem(fine, None, patterns) is None


def test_the_verdict_names_the_failing_node_not_the_cut_short_probe() -> None:
    result = JobResult("train", "verify", "", run_id="R1")
    result.nodes = [
        NodeState(0, "n0", "n0 (pve CT 300)", "cut short", "probe ended", ExitCode.UNHEALTHY),
        NodeState(1, "n1", "n1 (pve CT 301)", "dead", "no session", ExitCode.UNHEALTHY),
    ]
    assert job_summary(result) == "unhealthy: n1 (rank 1): no session"
    assert result.exit_code == ExitCode.UNHEALTHY
    result.nodes[0] = NodeState(0, "n0", "n0", "healthy", "step 9", ExitCode.OK)
    result.nodes[1] = NodeState(1, "n1", "n1", "alive", "alive", ExitCode.OK)
    assert job_summary(result) == "healthy: 2 node(s) in run R1"


class PolledNodes:
    """The job's nodes for `status_job`, each polled in this thread (a connection is never
    used: the status rank's poll and the others' are faked below)."""

    def __init__(self, targets: list[Any]) -> None:
        self.targets = targets

    def each(self, work: Any) -> list[NodeResult[Any]]:
        return [NodeResult(r, t, value=work(r, t, None)) for r, t in enumerate(self.targets)]


def polled_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank0: State, node1: PaneState
) -> tuple[Any, PolledNodes]:
    """A two-node job whose status rank is in state `rank0` and whose rank 1 shows `node1`."""
    job = load_job(load_inventory(inventory_with(tmp_path, JOB)), "train")
    code = status_exit(rank0)
    probe = SimpleNamespace(state=rank0, run="train:R1")

    def status_work(ctx: Any) -> Outcome:
        return Outcome(ctx.target.name, code, f"{rank0.value}: step 9", {"probe": probe})

    monkeypatch.setattr("launcher.jobs.verify.status_work", status_work)
    monkeypatch.setattr("launcher.jobs.verify.container_for", lambda target, conn: None)
    monkeypatch.setattr("launcher.jobs.verify.poll_once", lambda *args: (node1, None))
    return job, PolledNodes(list(job.nodes))


FINISHED_NODE = state(pane_dead=True, dead_status=0)


def test_a_finished_job_is_finished_not_a_dead_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, nodes = polled_job(tmp_path, monkeypatch, State.FINISHED, FINISHED_NODE)
    result = status_job(job, nodes)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.OK
    assert result.summary == "finished: 2 node(s) in run R1"
    assert [n.state for n in result.nodes] == ["finished", "finished"]
    # With its session gone too (remain-on-exit off), the exit file still says 0.
    assert has_finished(state(session_exists=False, exit_code=0))
    assert not has_finished(state(pane_dead=True, dead_status=1))
    assert not has_finished(state())


def test_a_node_that_finished_while_the_status_rank_runs_is_judged_by_the_status_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job, nodes = polled_job(tmp_path, monkeypatch, State.HEALTHY, FINISHED_NODE)
    result = status_job(job, nodes)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.OK and result.summary.startswith("healthy")
    assert result.nodes[1].state == "finished"

    job, nodes = polled_job(tmp_path, monkeypatch, State.UNHEALTHY, FINISHED_NODE)
    assert status_job(job, nodes).exit_code == ExitCode.UNHEALTHY  # type: ignore[arg-type]

    # A node that finished another run than the status rank's has not finished this one.
    other = state(pane_dead=True, dead_status=0, run="train:R0")
    job, nodes = polled_job(tmp_path, monkeypatch, State.HEALTHY, other)
    result = status_job(job, nodes)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.UNHEALTHY and result.nodes[1].state != "finished"

    failed = state(pane_dead=True, dead_status=1)
    job, nodes = polled_job(tmp_path, monkeypatch, State.HEALTHY, failed)
    result = status_job(job, nodes)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.UNHEALTHY and result.nodes[1].state == "dead"


def watched(**fields: Any) -> Any:
    target = SimpleNamespace(name="n1", label="n1 (pve CT 301)")
    return NodeWatch(target, 1, **{"run": "train:R1", "polls": 3, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("watch", "probe_state", "probe_code", "state", "code"),
    [
        (watched(), State.HEALTHY, ExitCode.OK, "alive", ExitCode.OK),
        (watched(finished=True), State.FINISHED, ExitCode.OK, "finished", ExitCode.OK),
        # Finished while the status rank's run goes on and is judged healthy: rank 0's next
        # collective cannot complete, so the startup probe does not call the job healthy.
        (watched(finished=True), State.HEALTHY, ExitCode.OK, "finished", ExitCode.UNHEALTHY),
        # The status rank is unhealthy anyway: it is the cause, this node only finished.
        (watched(finished=True), State.UNHEALTHY, ExitCode.UNHEALTHY, "finished", ExitCode.OK),
        # Its session gone, no marker left: judged by its exit, not called another run.
        (watched(finished=True, run=None), State.FINISHED, ExitCode.OK, "finished", ExitCode.OK),
        (watched(run=None), State.HEALTHY, ExitCode.OK, "other run", ExitCode.UNHEALTHY),
        (watched(run="train:R0"), State.HEALTHY, ExitCode.OK, "other run", ExitCode.UNHEALTHY),
        (
            watched(problem="the run exited (status 1)"),
            State.HEALTHY,
            ExitCode.OK,
            "dead",
            ExitCode.UNHEALTHY,
        ),
    ],
)
def test_where_the_startup_probe_leaves_a_node(
    watch: Any, probe_state: State, probe_code: ExitCode, state: str, code: ExitCode
) -> None:
    probe = SimpleNamespace(state=probe_state, exit_code=probe_code, run="train:R1")
    node = node_verdict(watch, "train:R1", probe, 0)  # type: ignore[arg-type]
    assert (node.state, node.exit_code) == (state, code), node


def test_every_node_is_judged_on_its_gpus_while_the_job_trains(tmp_path: Path) -> None:
    """A node that prints no status lines still shows its GPUs: held and busy while the status
    rank trains; before that (CUDA starting) nothing is concluded."""
    job = load_job(load_inventory(inventory_with(tmp_path, JOB)), "train")
    node = job.nodes[1]
    on_cpu = state(gpus=GpuSample(2, ()))
    assert gpu_problem(on_cpu, node, training=False) is None
    problem = gpu_problem(on_cpu, node, training=True)
    assert problem == "gpus: the run holds no GPU (running on the CPU?)"
    assert problem_state(problem) == "gpus"
    idle = state(gpus=GpuSample(2, (0, 1), {0: 95, 1: 0}, {0: 900, 1: 900}))
    assert "1 of the run's 2 GPUs below 10 % busy" in str(gpu_problem(idle, node, training=True))
    busy = state(gpus=GpuSample(2, (0, 1), {0: 95, 1: 91}, {0: 900, 1: 900}))
    assert gpu_problem(busy, node, training=True) is None
    assert gpu_problem(state(), node, training=True) is None  # no GPUs asked for


def job_result(summary: str, *states: tuple[str, ExitCode], run: str = "R1") -> JobResult:
    result = JobResult("train", "status", summary, run_id=run)
    result.nodes = [
        NodeState(rank, name, name, word, word, code)
        for rank, (name, (word, code)) in enumerate(zip(("prod", "staging"), states, strict=True))
    ]
    return result


@pytest.mark.parametrize("action", ["deploy", "verify", "status", "stop", "rollback"])
def test_a_job_document_is_what_its_schema_says(action: str) -> None:
    """`launcher job ACTION --json` prints the envelope every command prints, its one job's
    fields at the top level, valid against launcher/schemas/job-ACTION.schema.json."""
    import jsonschema

    from launcher.output.jsonout import envelope
    from launcher.schemas import shipped

    result = job_result("healthy: 2 node(s) in run R1", ("healthy", ExitCode.OK), ("alive", 0))
    result.action, result.rendezvous, result.master = action, "static", "10.0.0.5"
    document = envelope(f"job-{action}", [result.to_json()], exit_code=int(result.exit_code))
    jsonschema.Draft202012Validator(shipped(f"job-{action}")).validate(document)
    assert document["schema"] == f"launcher.job-{action}/1"
    assert document["summary"] == result.summary and len(document["targets"]) == 1
    document["nodes"][0]["state"] = 3  # a wrong type is caught
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(shipped(f"job-{action}")).validate(document)

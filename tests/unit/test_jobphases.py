"""A job's phases (launcher.jobs.deploy.run_phases) and `job logs`' choice of nodes, on fakes
that fail loudly on anything unexpected: what runs on which node, in which order, and what
stops the phases before any change."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from launcher.config.models import Target, load_inventory
from launcher.core.errors import ExitCode, LauncherError, RefusedError, RemoteError, UsageError
from launcher.jobs import deploy as jobdeploy
from launcher.jobs.deploy import Phases, run_phases
from launcher.jobs.job import Job, NodeResult, load_job
from launcher.jobs.logs import chosen_nodes
from launcher.jobs.network import NetworkPlan
from launcher.operate.stop import StopResult
from launcher.targets.workflow import Step
from tests.unit.test_job import JOB, inventory_with

ADDRESSED = JOB + "    addresses: {prod: 10.0.0.5}\n"  # rank 0's address: no remote call


class FakeNodes:
    """JobNodes without connections: each phase runs in rank order, one at a time."""

    def __init__(self, targets: Sequence[Target]) -> None:
        self.targets = list(targets)

    def conn(self, target: Target) -> Any:
        return object()  # never used by the fake node runs below

    def each(
        self, work: Callable[[int, Target, Any], Any], targets: Sequence[Target] = ()
    ) -> list[NodeResult[Any]]:
        results: list[NodeResult[Any]] = []
        for rank, target in enumerate(targets or self.targets):
            try:
                results.append(NodeResult(rank, target, value=work(rank, target, object())))
            except LauncherError as error:
                results.append(NodeResult(rank, target, error=error))
        return results


def planned(job: Job, nodes: Any, say: Any) -> NetworkPlan:
    """The network as the nodes would report it: rank 0 at its configured address."""
    return NetworkPlan("10.0.0.5", ("10.0.0.5", "10.0.0.6"), ("eth0", "eth0"))


def phases(action: str, run: Any, **options: Any) -> Phases:
    return Phases(action, run, network=planned, **options)


@dataclasses.dataclass
class Ran:
    sha256: str


def job(tmp_path: Path) -> Job:
    return load_job(load_inventory(inventory_with(tmp_path, ADDRESSED)), "train")


def recorder(
    calls: list[tuple[str, ...]], versions: dict[str, str], refuse: str = ""
) -> Callable[..., Ran]:
    lock = threading.Lock()

    def run(
        target: Target, conn: Any, run_id: str, plan: bool, show: Callable[[Step], None]
    ) -> Ran:
        env = target.playbook.spec.env
        with lock:
            calls.append(("plan" if plan else "run", target.name, run_id, env["NODE_RANK"]))
        if plan and target.name == refuse:
            raise RefusedError("no previous version to roll back to")
        return Ran(versions[target.name])

    return run


def test_every_node_checked_then_stopped_then_run_with_one_run_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, ...]] = []
    stops: list[str] = []

    def stop(target: Target, conn: Any, *, grace: float | None = None) -> StopResult:
        stops.append(target.name)
        calls.append(("stop", target.name))
        return StopResult(ExitCode.OK, "stopped", "dflash")

    monkeypatch.setattr(jobdeploy, "stop", stop)
    loaded = job(tmp_path)
    run = recorder(calls, {"prod": "a" * 64, "staging": "a" * 64})
    result = run_phases(
        loaded, FakeNodes(loaded.nodes), phases("rollback", run, restart=True), lambda n, line: None
    )  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.OK
    assert [c[0] for c in calls] == ["plan", "plan", "stop", "stop", "run", "run"]
    assert {c[2] for c in calls if c[0] != "stop"} == {result.run_id}
    assert [c[3] for c in calls if c[0] == "run"] == ["0", "1"]
    assert result.summary.startswith(f"rolled back to run {result.run_id} (sha256 {'a' * 12})")
    assert result.master == "10.0.0.5"


def test_a_failed_check_on_node1_changes_nothing(tmp_path: Path) -> None:
    calls: list[tuple[str, ...]] = []
    loaded = job(tmp_path)
    run = recorder(calls, {"prod": "a" * 64, "staging": "a" * 64}, refuse="staging")
    # No stop is patched in: a stop here would reach the fake connection and fail.
    result = run_phases(
        loaded, FakeNodes(loaded.nodes), phases("rollback", run, restart=True), lambda n, line: None
    )  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.REFUSED
    assert [c[0] for c in calls] == ["plan", "plan"]
    assert [n.state for n in result.nodes] == ["unchanged", "failed"]
    assert result.summary == "nothing changed on any node: checks failed on staging (rank 1)"


def test_nodes_that_would_run_different_versions_change_nothing(tmp_path: Path) -> None:
    calls: list[tuple[str, ...]] = []
    loaded = job(tmp_path)
    run = recorder(calls, {"prod": "a" * 64, "staging": "b" * 64})
    result = run_phases(
        loaded, FakeNodes(loaded.nodes), phases("rollback", run, restart=True), lambda n, line: None
    )  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.REFUSED
    assert [c[0] for c in calls] == ["plan", "plan"]
    assert [n.state for n in result.nodes] == ["unchanged", "unchanged"]
    assert result.summary == (
        "nothing changed on any node: the nodes would run different versions "
        f"(prod {'a' * 12}, staging {'b' * 12})"
    )


def test_job_logs_picks_a_node_by_name(tmp_path: Path) -> None:
    loaded = job(tmp_path)
    nodes = FakeNodes(loaded.nodes)
    assert [t.name for t in chosen_nodes(loaded, nodes, None)] == ["prod", "staging"]  # type: ignore[arg-type]
    assert [t.name for t in chosen_nodes(loaded, nodes, "staging")] == ["staging"]  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"no node 'other' \(nodes: prod, staging\)"):
        chosen_nodes(loaded, nodes, "other")  # type: ignore[arg-type]


def failing_launch(calls: list[tuple[str, ...]], node: str) -> Callable[..., Ran]:
    """Every check passes; the launch fails on `node` (as after a cut push)."""

    def run(
        target: Target, conn: Any, run_id: str, plan: bool, show: Callable[[Step], None]
    ) -> Ran:
        calls.append(("plan" if plan else "run", target.name))
        if not plan and target.name == node:
            raise RemoteError("sha256 mismatch after the push")
        return Ran("a" * 64)

    return run


@pytest.mark.parametrize("keep_partial", [False, True])
def test_a_launch_that_fails_on_one_node_is_stopped_again_on_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_partial: bool
) -> None:
    calls: list[tuple[str, ...]] = []

    def stop(target: Target, conn: Any, *, grace: float | None = None) -> StopResult:
        calls.append(("stop", target.name))
        return StopResult(ExitCode.OK, "stopped", "dflash")

    monkeypatch.setattr(jobdeploy, "stop", stop)
    loaded = job(tmp_path)
    options = {"restart": False, "keep_partial": keep_partial}
    result = run_phases(
        loaded,
        FakeNodes(loaded.nodes),  # type: ignore[arg-type]
        phases("deploy", failing_launch(calls, "staging"), **options),
        lambda n, line: None,
    )
    assert result.exit_code == ExitCode.UNREACHABLE
    if keep_partial:
        assert ("stop", "prod") not in calls
        assert [n.state for n in result.nodes] == ["launched", "failed"]
        assert "--keep-partial" in result.summary
        return
    assert calls[-1] == ("stop", "prod")  # never the node that did not launch
    assert [n.state for n in result.nodes] == ["stopped", "failed"]
    assert (
        result.nodes[0].detail == "launched, then stopped again: launch failed on staging (rank 1)"
    )
    assert result.summary == (
        "failed: launch failed on staging (rank 1); stopped again on prod: nothing runs"
    )


@pytest.mark.parametrize("fails", [False, True])
def test_the_hosts_blocks_are_written_after_the_checks_and_before_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: bool
) -> None:
    """manage_hosts: the one change the network phase asks for comes after every check (and
    stop), before any launch; a node where it fails launches nothing anywhere."""
    calls: list[tuple[str, ...]] = []

    def with_hosts(job: Job, nodes: Any, say: Any) -> NetworkPlan:
        plan = planned(job, nodes, say)
        plan.hosts = (("10.0.0.6 staging",), ("10.0.0.5 prod",))
        return plan

    def write_hosts(job: Job, nodes: Any, plan: NetworkPlan, say: Any) -> list[str]:
        calls.append(("hosts",))
        return ["staging: cannot write /etc/hosts: Read-only file system"] if fails else []

    monkeypatch.setattr(jobdeploy, "write_hosts", write_hosts)
    loaded = job(tmp_path)
    run = recorder(calls, {"prod": "a" * 64, "staging": "a" * 64})
    result = run_phases(
        loaded,
        FakeNodes(loaded.nodes),  # type: ignore[arg-type]
        Phases("deploy", run, network=with_hosts),
        lambda n, line: None,
    )
    steps = [c[0] for c in calls]
    if fails:
        assert steps == ["plan", "plan", "hosts"] and result.exit_code == ExitCode.UNREACHABLE
        assert result.summary == (
            "/etc/hosts not written on staging: cannot write /etc/hosts: Read-only file "
            "system: nothing launched"
        )
    else:
        assert steps == ["plan", "plan", "hosts", "run", "run"]
        assert result.exit_code == ExitCode.OK

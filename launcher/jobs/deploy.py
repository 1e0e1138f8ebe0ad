"""Deploy and stop a multi-node job, all or nothing.

Phases, each on every node at once, each only after the one before passed on every node:
0. network: every node's names, interfaces and torch, rank 0's master port probed from every
   other node, torchrun's rendezvous chosen (launcher.jobs.network);
1. check: the deploy transaction in plan mode (script, GPUs, disk, tmux, lock, active session);
2. stop (with --restart): the old runs, with the same stop as `launcher stop`;
3. launch: the deploy transaction, with one run id for every node. When it fails on some
   nodes, the nodes that launched are stopped again (unless `keep_partial`): a rank left alone
   would wait at the rendezvous for ranks that never come.
The lock is not held from one phase to the next (each transaction takes it), so a change in a
container between the phases (another operator's deploy) is caught by the launch's own checks,
which run again before its first change; a node that fails there is reported with the state it
and every other node were left in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from launcher.config.models import Target
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, LauncherError
from launcher.core.requests import DeployOptions
from launcher.core.runid import new_run_id
from launcher.deploy.deploy import DeployReport, deploy
from launcher.jobs.job import (
    Job,
    JobNodes,
    NodeResult,
    Rendezvous,
    with_env,
)
from launcher.jobs.network import NetworkPlan, plan_network, write_hosts
from launcher.operate.stop import StopResult, stop
from launcher.output.ui import step_line
from launcher.targets.fleet import worst
from launcher.targets.workflow import Step

if TYPE_CHECKING:
    from launcher.verify.gpus import GpuSample
    from launcher.verify.samples import Sample

Say = Callable[[str, str], None]  # (node, line)


@dataclass
class NodeState:
    """Where one node was left: `state` is a word, `detail` says what happened."""

    rank: int
    node: str
    label: str
    state: str  # planned | unchanged | stopped | launched | failed
    detail: str
    exit_code: ExitCode = ExitCode.OK

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "exit_code": int(self.exit_code)}


@dataclass
class JobResult:
    """A job command's outcome: the job's line and one state per node."""

    job: str
    action: str
    summary: str
    nodes: list[NodeState] = field(default_factory=list)
    run_id: str | None = None
    job_id: str | None = None
    master: str | None = None
    rendezvous: str | None = None  # torchrun's backend the run was given (c10d | static)
    # What a poll saw, for a watch's metrics and events (not in the JSON): each node's GPUs,
    # the status rank's newest status line and its pane's last lines.
    gpus: dict[str, GpuSample] = field(default_factory=dict, repr=False)
    latest: Sample | None = field(default=None, repr=False)
    last_lines: list[str] = field(default_factory=list, repr=False)

    @property
    def exit_code(self) -> ExitCode:
        return worst([n.exit_code for n in self.nodes])

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "action": self.action,
            "ok": self.exit_code == ExitCode.OK,
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "run_id": self.run_id,
            "job_id": self.job_id,
            "master": self.master,
            "rendezvous": self.rendezvous,
            "nodes": [n.to_json() for n in self.nodes],
        }


def _state(result: NodeResult[Any], state: str, detail: str) -> NodeState:
    target = result.target
    return NodeState(result.rank, target.name, target.label, state, detail)


def _failed(result: NodeResult[Any], what: str) -> NodeState:
    assert result.error is not None
    node = _state(result, "failed", f"{what}: {result.error.message}")
    node.exit_code = result.error.exit_code
    return node


class Launched(Protocol):
    """What a node's transaction answers: the script version it runs."""

    sha256: str


# One node's transaction: (node with its rendezvous env, connection, the job's run id, plan mode,
# where its steps go). Deploy and rollback differ only here.
NodeRun = Callable[[Target, HostConnection, str, bool, Callable[[Step], None]], Launched]


@dataclass(frozen=True)
class Phases:
    """A job-wide transaction: what each node runs, and the options every phase shares."""

    action: str  # deploy | rollback (the result's word, and the summary's)
    run: NodeRun
    restart: bool = False
    dry_run: bool = False
    grace: float | None = None
    kill_gpu_holders: bool = False
    keep_partial: bool = False  # a launch that failed on some nodes: leave the others running
    # The network checked and torchrun's rendezvous chosen, before any node is touched.
    network: Callable[[Job, JobNodes, Say], NetworkPlan] = field(default=plan_network)
    run_id: str | None = None  # named beforehand (a watch's restart); None: a new one


def deploy_job(
    job: Job, nodes: JobNodes, options: DeployOptions, say: Say, *, keep_partial: bool = False
) -> JobResult:
    """Check every node, then stop every old run, then launch every node (see the module)."""

    def run(
        target: Target, conn: HostConnection, run_id: str, plan: bool, show: Callable[[Step], None]
    ) -> DeployReport:
        opts = dataclasses.replace(options, dry_run=plan, run_id=run_id, job=job.name)
        return deploy(target, conn, opts, on_step=show)

    phases = Phases(
        "deploy",
        run,
        restart=options.restart,
        dry_run=options.dry_run,
        grace=options.grace,
        kill_gpu_holders=options.kill_gpu_holders,
        keep_partial=keep_partial,
        run_id=options.run_id,
    )
    return run_phases(job, nodes, phases, say)


def run_phases(job: Job, nodes: JobNodes, phases: Phases, say: Say) -> JobResult:
    """Check every node (the transaction in plan mode), then stop every old run (restart), then
    run the transaction on every node with one run id; each phase only after the one before
    passed on every node."""
    run_id = phases.run_id or new_run_id()
    action = phases.action
    result = JobResult(job.name, action, "", run_id=run_id, job_id=f"{job.name}-{run_id}")
    try:
        plan = phases.network(job, nodes, say)
    except LauncherError as error:
        hint = f" ({error.hint})" if error.hint else ""
        result.summary = f"nothing changed on any node: {error.message}{hint}"
        culprit = getattr(error, "node", None)
        result.nodes = [
            NodeState(rank, t.name, t.label, "failed", f"network: {error.message}", error.exit_code)
            if t.name == culprit
            else NodeState(rank, t.name, t.label, "unchanged", "not checked", error.exit_code)
            for rank, t in enumerate(nodes.targets)
        ]
        return result
    result.master = plan.master_addr
    result.rendezvous = plan.backend
    rendezvous = Rendezvous(
        run_id,
        str(result.job_id),
        plan.master_addr,
        job.spec.master_port,
        len(job.nodes),
        backend=plan.backend,
        max_restarts=job.spec.max_restarts,
        local_addrs=plan.local_addrs,
        ifnames=plan.ifnames,
    )
    targets = with_env(nodes.targets, rendezvous)

    def node_work(
        plan: bool, *, quiet_checks: bool = False
    ) -> Callable[[int, Target, HostConnection], Launched]:
        def work(rank: int, target: Target, conn: HostConnection) -> Launched:
            def show(step: Step) -> None:
                # Before a real run the plan's lines would repeat the launch's: only what
                # stops it or warns is shown.
                if not quiet_checks or step.status in ("failed", "warning"):
                    say(target.name, step_line(step.name, step.status, step.detail))

            return phases.run(target, conn, run_id, plan, show)

        return work

    count = len(targets)
    say(job.name, f"checks on {count} node(s) (the {action} in plan mode), nothing changed yet")
    checked = nodes.each(node_work(True, quiet_checks=not phases.dry_run), targets)
    versions = {r.value.sha256 for r in checked if r.value is not None and r.value.sha256}
    if len(versions) > 1:
        # Ranks of one job running different code fail in ways no check sees: refuse.
        result.nodes = [
            _state(r, "unchanged", f"would run sha256 {r.value.sha256[:12]}")
            if r.value is not None
            else _failed(r, "check failed")
            for r in checked
        ]
        for node in result.nodes:
            node.exit_code = node.exit_code or ExitCode.REFUSED
        each = ", ".join(
            f"{r.target.name} {r.value.sha256[:12]}" for r in checked if r.value is not None
        )
        result.summary = (
            f"nothing changed on any node: the nodes would run different versions ({each})"
        )
        return result
    if phases.dry_run or not all(r.ok for r in checked):
        failed = [r for r in checked if not r.ok]
        result.nodes = [
            _failed(r, "check failed")
            if not r.ok
            else _state(r, "planned" if phases.dry_run else "unchanged", "checks passed")
            for r in checked
        ]
        names = ", ".join(f"{r.target.name} (rank {r.rank})" for r in failed)
        if failed:
            result.summary = f"nothing changed on any node: checks failed on {names}"
        else:
            result.summary = "dry run: every node's checks passed; nothing was changed"
        return result

    if phases.restart:
        say(job.name, f"checks passed on every node; stopping the old runs on {count} node(s)")
        stopped = nodes.each(lambda rank, target, conn: _stop(target, conn, phases, say), targets)
        if not all(r.ok for r in stopped):
            result.nodes = [
                _failed(r, "stop failed")
                if not r.ok
                else _state(r, "stopped", "old run stopped; not launched")
                for r in stopped
            ]
            result.summary = "stop failed on a node: nothing was launched on any node"
            return result

    if plan.hosts:
        failed_hosts = write_hosts(job, nodes, plan, say)
        if failed_hosts:
            result.nodes = [
                _state(r, "stopped" if phases.restart else "unchanged", "not launched")
                for r in checked
            ]
            for node in result.nodes:
                node.exit_code = ExitCode.UNREACHABLE
            where = "; ".join(failed_hosts)
            result.summary = f"/etc/hosts not written on {where}: nothing launched"
            return result
    say(job.name, f"launching run {run_id} on {count} node(s)")
    launched = nodes.each(node_work(False), targets)
    result.nodes = [
        _state(r, "launched", f"run {run_id}, sha256 {r.value.sha256[:12]}")
        if r.ok and r.value is not None
        else _failed(r, "not launched" + ("; old run stopped" if phases.restart else ""))
        for r in launched
    ]
    what = "rolled back to" if action == "rollback" else "launched"
    if all(r.ok for r in launched):
        sha = {r.value.sha256[:12] for r in launched if r.value is not None}
        version = f" (sha256 {', '.join(sorted(sha))})" if action == "rollback" else ""
        result.summary = (
            f"{what} run {run_id}{version} on {len(launched)} node(s), master {result.master}"
        )
    else:
        bad = ", ".join(f"{r.target.name} (rank {r.rank})" for r in launched if not r.ok)
        stopped_note = "; their old runs were stopped" if phases.restart else ""
        if not any(r.ok for r in launched):
            result.summary = f"launch failed on every node{stopped_note}: nothing runs"
        elif phases.keep_partial:
            result.summary = (
                f"launch failed on {bad}{stopped_note}; the other nodes run {run_id} without "
                f"them (--keep-partial; `launcher job stop {job.name}` stops them)"
            )
        else:
            _undo_partial(job, nodes, phases, launched, result, say, f"launch failed on {bad}")
    return result


def _undo_partial(
    job: Job,
    nodes: JobNodes,
    phases: Phases,
    launched: list[NodeResult[Launched]],
    result: JobResult,
    say: Say,
    why: str,
) -> None:
    """A launch is all or nothing too: the nodes that launched are stopped again, so that none
    is left waiting at the rendezvous for ranks that will never come."""
    started = [r for r in launched if r.ok]
    names = ", ".join(r.target.name for r in started)
    say(job.name, f"{why}: stopping the run again on {names}")
    undone = nodes.each(
        lambda rank, target, conn: _stop(target, conn, phases, say), [r.target for r in started]
    )
    by_name = {u.target.name: u for u in undone}
    kept = []
    for node in result.nodes:
        outcome = by_name.get(node.node)
        if outcome is None:
            continue
        if outcome.ok:
            node.state, node.detail = "stopped", f"launched, then stopped again: {why}"
        else:
            assert outcome.error is not None
            node.state = "failed"
            node.detail = f"launched, then not stopped again: {outcome.error.message}"
            node.exit_code = outcome.error.exit_code
            kept.append(node.node)
    if kept:
        result.summary = (
            f"failed: {why}; the run still runs on {', '.join(kept)} "
            f"(`launcher job stop {job.name}` stops it)"
        )
    else:
        result.summary = f"failed: {why}; stopped again on {names}: nothing runs"


def _stop(target: Target, conn: HostConnection, phases: Phases, say: Say) -> StopResult:
    outcome = stop(target, conn, grace=phases.grace)
    for step in outcome.steps:
        say(target.name, step_line(step.name, step.status, step.detail))
    stopped = outcome.stopped
    # GPUs held from outside the run are the launch's to kill with --kill-gpu-holders (the
    # checks let them pass); the run itself must be gone all the same.
    foreign_only = not stopped.get("leftover") and not stopped.get("gpu_holders")
    if outcome.exit_code and not (phases.kill_gpu_holders and foreign_only):
        raise _StopFailed(outcome.summary, outcome.exit_code)
    return outcome


class _StopFailed(LauncherError):
    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = code


def stop_job(job: Job, nodes: JobNodes, grace: float | None, say: Say) -> JobResult:
    """Stop every node's run at once; each node's outcome is reported."""
    phases = Phases("stop", _no_run, grace=grace)
    stopped = nodes.each(lambda rank, target, conn: _stop(target, conn, phases, say))
    result = JobResult(job.name, "stop", "")
    result.nodes = [
        _failed(r, "stop failed")
        if not r.ok or r.value is None
        else _state(r, "stopped", r.value.summary)
        for r in stopped
    ]
    bad = [n.node for n in result.nodes if n.exit_code]
    result.summary = (
        f"stop failed on {', '.join(bad)}" if bad else f"stopped on {len(result.nodes)} node(s)"
    )
    return result


def _no_run(
    target: Target, conn: HostConnection, run_id: str, plan: bool, show: Callable[[Step], None]
) -> Launched:
    raise AssertionError("a job's stop runs no transaction")

"""One verdict for a multi-node job: the status rank's startup probe, every node alive.

The status rank (rank 0 unless the job says otherwise) is probed as `launcher verify` probes a
target: its status lines judged. Every other node prints no status lines of its own (torchrun's
workers log on rank 0), so it is polled for what it can show: its session is there, its pane's
process alive, it runs the same run as the status rank (one deploy of the job), and, while the
status rank shows the job training, its GPUs held and busy (the status rank's `gpus` check:
contexts, utilization, nvidia-smi's faults). A node that
fails ends the probe at once: one dead rank stalls every other, so the job is unhealthy, and the
report names the node.

A node whose run exited 0 has finished, which is how every node of a job ends: it is never a
failure by itself, and a finished job is not restarted. The status rank's verdict judges the
job then (one that hangs in its next collective shows as a stall there). Only the startup
probe asks more: a node that finished while the status rank's run goes on and is judged
healthy makes the job unhealthy, since the other ranks cannot complete a collective without it.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, LauncherError
from launcher.core.requests import ProbeOverrides
from launcher.jobs.deploy import JobResult, NodeState, Say
from launcher.jobs.job import Job, JobNodes
from launcher.probe.poll import poll_once
from launcher.probe.workflows import (
    probe_summary,
    run_probe,
    settings_for,
    status_work,
)
from launcher.targets.fleet import FleetContext, Outcome
from launcher.targets.workflow import Cancelled
from launcher.verify.gpus import judge as judge_gpus
from launcher.verify.gpus import status_text
from launcher.verify.lifecycle import State, ended
from launcher.verify.pane import PaneState
from launcher.verify.prober import ProbeResult

# torchrun's elastic agent on a worker's end: "failed (exitcode: 1) local_rank: 0 (pid: N)".
WORKER_EXIT_RE = re.compile(r"\bexitcode\s*:\s*(-?\d+)")


def liveness_problem(
    state: PaneState, expected_run: str | None, restart_patterns: Sequence[str] = ()
) -> str | None:
    """Why this poll shows a node that is not taking part in the run (None: it is).

    Besides a gone or exited run: a supervisor's restart line (`restart_patterns`, torchrun's
    "Restarting worker group") or a worker's non-zero exit as torchrun's elastic agent reports
    it (`... failed (exitcode: 1) local_rank: 0 ...`) in this run's pane: the rank restarted or
    lost a worker, which the whole job feels."""
    if not state.session_exists:
        return "no session: the run is gone"
    if state.pane_dead or state.exit_code is not None:
        status = state.dead_status if state.dead_status is not None else state.exit_code
        return f"the run exited (status {status})"
    if expected_run is not None and state.run != expected_run:
        return f"runs {state.run or '(unmarked)'}, not the job's run {expected_run}"
    for line in state.capture.splitlines():
        text = line.strip()
        if any(pattern in text for pattern in restart_patterns):
            return f"restarted: {text[:120]}"
        exited = WORKER_EXIT_RE.search(text)
        if exited and exited[1] != "0":
            return f"a worker failed: {text[:120]}"
    return None


def gpu_problem(state: PaneState, target: Target, *, training: bool) -> str | None:
    """Why this node's GPUs show it not taking part (None: they do, or cannot tell yet): the
    `gpus` check of the status rank (launcher.verify.gpus) on a node that prints no status
    lines. `training`: the status rank shows the job training, so every rank's GPUs should
    be held and busy (a node whose CUDA fell back to the CPU, or whose GPU fell off)."""
    sample = state.gpus
    if sample is None or sample.want <= 0:
        return None
    found = judge_gpus(sample, target.playbook.spec.verify.gpus, printing=training)
    return f"gpus: {found.observed}" if found.ok is False else None


def gpu_note(state: PaneState) -> str:
    """`; GPUs 2/2 held · util % 97 97 · …` for a node's detail, or nothing."""
    sample = state.gpus
    return f"; {status_text(sample)}" if sample is not None and sample.want > 0 else ""


def has_finished(state: PaneState) -> bool:
    """The node's run exited 0 (tmux's dead status or the runner's exit file)."""
    return ended(state) is State.FINISHED


def finished_in(state: PaneState, expected: str | None) -> bool:
    """The node's run exited 0 and was the job's run `expected` (or left no marker to say
    otherwise): a node that finished another run has not finished this one."""
    return has_finished(state) and (None in (state.run, expected) or state.run == expected)


FINISHED_DETAIL = "finished (exit 0)"


@dataclass
class NodeWatch:
    """One non-status node's watch: its first run marker and the first problem seen."""

    target: Target
    rank: int
    run: str | None = None
    problem: str | None = None
    error: LauncherError | None = None
    polls: int = 0
    finished: bool = False  # its run exited 0 (no problem in itself; see the module)
    gpus: str = ""  # its GPUs at the last poll (gpu_note)


def poll_node(
    target: Target, conn: HostConnection, expected: str | None
) -> tuple[PaneState, str | None]:
    """One poll of a node that prints no status lines, and what is wrong with it (None: alive)."""
    spec = target.playbook.spec.verify
    state, _ = poll_once(container_for(target, conn), target, spec.lines)
    return state, liveness_problem(state, expected or state.run, spec.restart_patterns)


def _poll_node(
    watch: NodeWatch, conn: HostConnection, expected: str | None, *, training: bool = False
) -> None:
    try:
        state, problem = poll_node(watch.target, conn, expected or watch.run)
    except LauncherError as error:
        watch.error = error
        return
    watch.polls += 1
    if watch.run is None:
        watch.run = state.run
    watch.finished = has_finished(state)
    problem = problem or gpu_problem(state, watch.target, training=training)
    watch.problem = None if watch.finished else problem
    watch.gpus = gpu_note(state)


def verify_job(job: Job, nodes: JobNodes, overrides: ProbeOverrides, say: Say) -> JobResult:
    """The job's startup probe (see the module): HEALTHY only if the status rank is healthy
    and every node was alive, in the same run, at every poll through the end."""
    rank0 = job.status_rank
    status_target = nodes.targets[rank0]
    interval = settings_for(status_target, overrides).interval
    cancel = threading.Event()
    done = threading.Event()
    watches = [
        NodeWatch(target, rank) for rank, target in enumerate(nodes.targets) if rank != rank0
    ]
    probe_run: list[str | None] = [None]
    healthy = [False]

    def watch_node(watch: NodeWatch) -> None:
        conn = nodes.conn(watch.target)
        while True:
            _poll_node(watch, conn, probe_run[0])
            if watch.problem or watch.error:
                say(watch.target.name, f"rank {watch.rank}: {watch.problem or watch.error}")
                cancel.set()  # one dead rank stalls the others: the job's verdict is known
                return
            if watch.finished:  # the status rank's verdict says whether the job finished
                say(watch.target.name, f"rank {watch.rank}: {FINISHED_DETAIL}")
                return
            if done.wait(interval):
                # The verdict covers the end; a healthy status rank means the job trains, so
                # this node's GPUs must be held and busy too.
                _poll_node(watch, conn, probe_run[0], training=healthy[0])
                return

    threads = [threading.Thread(target=watch_node, args=(w,), daemon=True) for w in watches]
    for thread in threads:
        thread.start()
    ctx = FleetContext(
        status_target,
        nodes.conn(status_target),
        cancel,
        lambda line: say(status_target.name, line),
    )
    probe = None
    probe_error: LauncherError | None = None
    try:
        probe = run_probe(ctx, overrides)
        probe_run[0] = probe.run
        healthy[0] = not probe.exit_code and probe.state is not State.FINISHED
    except Cancelled:
        pass
    except LauncherError as error:
        probe_error = error
    done.set()
    for thread in threads:
        thread.join()

    result = JobResult(job.name, "verify", "", run_id=run_id(probe.run if probe else None))
    status = NodeState(rank0, status_target.name, status_target.label, "", "")
    if probe is not None:
        status.state = "finished" if probe.state is State.FINISHED else probe.verdict
        status.detail = probe_summary(probe)
        status.exit_code = probe.exit_code
    elif probe_error is not None:
        status.state, status.detail = "failed", probe_error.message
        status.exit_code = probe_error.exit_code
    else:
        # Not judged to the end: never healthy, whatever it showed so far.
        status.state, status.detail = "cut short", "probe ended: another node failed"
        status.exit_code = ExitCode.UNHEALTHY
    expected = probe.run if probe else None
    states = [status, *(node_verdict(w, expected, probe, rank0) for w in watches)]
    result.nodes = sorted(states, key=lambda n: n.rank)
    result.summary = job_summary(result)
    return result


def node_verdict(
    watch: NodeWatch, expected: str | None, probe: ProbeResult | None, rank0: int
) -> NodeState:
    """Where the startup probe leaves a node without status lines (see the module): alive
    through the end in the status rank's run, finished, or why not."""
    node = NodeState(watch.rank, watch.target.name, watch.target.label, "alive", "")
    if watch.error is not None:
        node.state, node.detail = "unreachable", watch.error.message
        node.exit_code = watch.error.exit_code
        return node
    problem = watch.problem
    # A run whose session is gone may show no marker: a finished node is judged by its exit.
    marked = watch.run is not None or not watch.finished
    if problem is None and expected and marked and watch.run != expected:
        problem = liveness_problem_run(watch.run, expected)
    if problem is not None:
        node.state, node.detail = problem_state(problem), problem
        node.exit_code = ExitCode.UNHEALTHY
    elif watch.finished:
        node.state, node.detail = "finished", FINISHED_DETAIL
        if probe is not None and probe.state is not State.FINISHED and not probe.exit_code:
            node.detail += f" while rank {rank0}'s run goes on"
            node.exit_code = ExitCode.UNHEALTHY
    else:
        node.detail = f"alive through {watch.polls} poll(s), run {run_id(watch.run)}{watch.gpus}"
    return node


def problem_state(problem: str) -> str:
    """The node's state word for a liveness problem: dead, restarted, other run or gpus."""
    if problem.startswith(("restarted", "a worker failed")):
        return "restarted"
    if problem.startswith("gpus: "):
        return "gpus"
    return "other run" if problem.startswith("runs ") else "dead"


def run_id(marker: str | None) -> str | None:
    """The run id in a run marker (`session:run id`), as deploy reports it."""
    return marker.partition(":")[2] or None if marker else None


def liveness_problem_run(run: str | None, expected: str) -> str:
    return f"runs {run or '(unmarked)'}, not the job's run {expected}"


def job_summary(result: JobResult) -> str:
    """`healthy`, or `unhealthy: <node> (rank N): <why>` for the first failing node."""
    bad = [n for n in result.nodes if n.exit_code]
    if not bad and result.nodes and all(n.state == "finished" for n in result.nodes):
        return f"finished: {len(result.nodes)} node(s) in run {result.run_id}"
    if not bad:
        return f"healthy: {len(result.nodes)} node(s) in run {result.run_id}"
    # A dead or unreachable node is the cause; the status rank's cut-short probe is its effect.
    first = sorted(bad, key=lambda n: (n.state == "cut short", n.rank))[0]
    word = "unreachable" if first.exit_code == ExitCode.UNREACHABLE else "unhealthy"
    return f"{word}: {first.node} (rank {first.rank}): {first.detail}"


def judge_node(
    node: NodeState, state: PaneState, target: Target, expected: str | None, *, training: bool
) -> None:
    """A node without status lines, from one poll: finished, alive, or why not."""
    if finished_in(state, expected):
        node.state = "finished"
        node.detail = f"{FINISHED_DETAIL}, run {run_id(state.run)}"
        return
    patterns = target.playbook.spec.verify.restart_patterns
    problem = liveness_problem(state, expected, patterns) or gpu_problem(
        state, target, training=training
    )
    node.state = problem_state(problem) if problem else "alive"
    node.detail = problem or f"alive, run {run_id(state.run)}{gpu_note(state)}"
    node.exit_code = ExitCode.UNHEALTHY if problem else ExitCode.OK


def seen(result: JobResult, name: str, probe: object) -> None:
    """What the status rank's poll saw, kept for a watch: its GPUs, newest status line and
    last pane lines."""
    latest = getattr(probe, "latest", None)
    gpus = getattr(getattr(latest, "state", None), "gpus", None)
    if gpus is not None:
        result.gpus[name] = gpus
    samples = getattr(latest, "samples", None)
    if samples:
        result.latest = samples[-1]
    if hasattr(probe, "last_lines"):
        result.last_lines = probe.last_lines()


def status_job(job: Job, nodes: JobNodes) -> JobResult:
    """One poll of every node at once: the status rank judged as `status` judges, the others
    alive and in the same run."""
    rank0 = job.status_rank

    def one(rank: int, target: Target, conn: HostConnection) -> Any:
        if rank == rank0:
            return status_work(FleetContext(target, conn, threading.Event(), lambda _: None))
        lines = target.playbook.spec.verify.lines
        return poll_once(container_for(target, conn), target, lines)[0]

    polled = nodes.each(one)
    status_outcome = polled[rank0].value if polled[rank0].ok else None
    expected = None
    if isinstance(status_outcome, Outcome):
        probe = status_outcome.data.get("probe")
        expected = getattr(probe, "run", None)
    result = JobResult(job.name, "status", "", run_id=run_id(expected))
    # Training: the status rank is healthy past its warmup (not starting: every rank's GPUs
    # are still warming up then; not finished: its ranks are letting go of them).
    training = (
        isinstance(status_outcome, Outcome)
        and not status_outcome.exit_code
        and getattr(status_outcome.data.get("probe"), "state", None) is State.HEALTHY
    )
    for entry in polled:
        target = entry.target
        node = NodeState(entry.rank, target.name, target.label, "", "")
        if entry.error is not None:
            node.state, node.detail = "unreachable", entry.error.message
            node.exit_code = entry.error.exit_code
        elif isinstance(entry.value, Outcome):
            node.exit_code = entry.value.exit_code
            node.state = "healthy" if not node.exit_code else "unhealthy"
            probe = entry.value.data.get("probe")
            seen(result, target.name, probe)
            if getattr(probe, "state", None) is State.FINISHED:
                node.state = "finished"
            node.detail = entry.value.summary
        elif isinstance(entry.value, PaneState):
            judge_node(node, entry.value, target, expected, training=training)
            if entry.value.gpus is not None:
                result.gpus[target.name] = entry.value.gpus
        result.nodes.append(node)
    result.summary = job_summary(result)
    return result

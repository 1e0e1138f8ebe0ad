"""A job's logs: every node's lines (or one node's), each prefixed with its node's name.

The single-target logs workflow (launcher.operate.logs.logs) runs on every chosen node at
once, one thread each; with `follow` each node's stream ends when its run ends, and Ctrl-C ends
them all (never the runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from launcher.config.models import Target
from launcher.core.errors import ExitCode, LauncherError, UsageError
from launcher.core.jobrequests import JobLogsRequest
from launcher.jobs.job import Job, JobNodes
from launcher.operate.logs import LogsResult, logs
from launcher.targets.fleet import worst

NodeLine = Callable[[str, str], None]  # (node, line)


@dataclass
class NodeLogs:
    node: str
    exit_code: ExitCode
    summary: str


@dataclass
class JobLogs:
    job: str
    nodes: list[NodeLogs] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C ended the following (the runs go on)

    @property
    def exit_code(self) -> ExitCode:
        return worst([n.exit_code for n in self.nodes])

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "exit_code": int(self.exit_code),
            "interrupted": self.interrupted,
            "nodes": [{**vars(n), "exit_code": int(n.exit_code)} for n in self.nodes],
        }


def chosen_nodes(job: Job, nodes: JobNodes, node: str | None) -> list[Target]:
    """Every node in rank order, or the one named."""
    if node is None:
        return list(nodes.targets)
    for target in nodes.targets:
        if target.name == node:
            return [target]
    names = ", ".join(t.name for t in nodes.targets)
    raise UsageError(f"job {job.name!r} has no node {node!r} (nodes: {names})")


def job_logs(job: Job, nodes: JobNodes, on_line: NodeLine, options: JobLogsRequest) -> JobLogs:
    """The chosen nodes' last `tail` lines, then with `follow` their new lines as they come.

    Without `follow` the tails are read at once and shown node by node in rank order (the
    lines carry no time to interleave them by); with it, lines are shown as they arrive.
    """
    node, tail, raw, follow = options.node, options.tail, options.raw, options.follow
    targets = chosen_nodes(job, nodes, node)
    lock = threading.Lock()  # one line at a time on the terminal, whichever thread has it

    def one(target: Target) -> tuple[LogsResult | None, list[str], LauncherError | None]:
        held: list[str] = []

        def line(text: str) -> None:
            if follow:
                with lock:
                    on_line(target.name, text)
            else:
                held.append(text)

        try:
            got = logs(target, nodes.conn(target), tail=tail, raw=raw, follow=follow, on_line=line)
        except LauncherError as error:
            return None, held, error
        return got, held, None

    result = JobLogs(job.name)
    executor = ThreadPoolExecutor(max_workers=len(targets))
    futures = [executor.submit(one, t) for t in targets]
    try:
        # Waiting in short slices keeps the main thread responsive to Ctrl-C.
        while not all(f.done() for f in futures):
            wait(futures, timeout=0.2)
    except KeyboardInterrupt:
        result.interrupted = True
        nodes.pool.close()  # every follow's channel closes: the agents see it and end
        executor.shutdown(wait=True, cancel_futures=True)
        result.nodes = [
            NodeLogs(t.name, ExitCode.OK, "stopped following; the run goes on") for t in targets
        ]
        return result
    executor.shutdown(wait=True)
    for target, future in zip(targets, futures, strict=True):
        got, held, error = future.result()
        for text in held:
            on_line(target.name, text)
        if error is not None:
            result.nodes.append(NodeLogs(target.name, error.exit_code, error.message))
        elif got is not None:
            result.nodes.append(NodeLogs(target.name, got.exit_code, got.summary))
    return result

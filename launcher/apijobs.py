"""The Python API's multi-node jobs: `Launcher(...).jobs`, one method per `launcher job`
command, calling the same functions as the CLI (`launcher.commands.jobs`) with values checked by
the CLI's own types (a bad one is a UsageError, exit code 2, before anything is opened).

Each call opens its nodes' connections and closes them when it returns. Results are the CLI's:
`JobResult` (`exit_code`, `summary`, `nodes`, `to_json()`), `JobHistory`, `JobLogs`,
`JobWatchResult`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.commands import args, params
from launcher.commands import jobs as jobcommands
from launcher.core.errors import UsageError
from launcher.core.requests import ProbeOverrides
from launcher.deploy.deploy import DeployOptions

if TYPE_CHECKING:
    from launcher.config.models import Inventory
    from launcher.jobs.deploy import JobResult
    from launcher.jobs.history import JobHistory
    from launcher.jobs.logs import JobLogs
    from launcher.watch.job import JobWatchResult

CHECKPOINTS = ("archive", "purge", "keep")
NodeLineSink = Callable[[str, str], None]  # (node, line)


def _name(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"name={value!r}: must be a job's name (a string)")
    return value


class Jobs:
    """The inventory's `jobs:`; `on_line(node, line)` gets the progress lines the CLI prints."""

    def __init__(self, inventory: Inventory, on_line: NodeLineSink) -> None:
        self._inventory = inventory
        self._say = on_line

    def names(self) -> list[str]:
        """The inventory's jobs, in its order."""
        return list(self._inventory.spec.jobs)

    def deploy(
        self,
        name: str,
        *,
        restart: bool = False,
        dry_run: bool = False,
        grace: float | None = None,
        checkpoints: str = "archive",
        kill_gpu_holders: bool = False,
        keep_partial: bool = False,
    ) -> JobResult:
        """`launcher job deploy`: every node's checks, then every old run stopped, then every
        node launched, all with one run id (or, when some fail, none: unless `keep_partial`);
        `checkpoints` is archive, purge or keep."""
        options = DeployOptions(
            restart=args.flag("restart", restart),
            dry_run=args.flag("dry_run", dry_run),
            checkpoint_mode=args.choice("checkpoints", checkpoints, CHECKPOINTS),
            grace=args.duration("grace", grace, params.GRACE),
            kill_gpu_holders=args.flag("kill_gpu_holders", kill_gpu_holders),
        )
        return jobcommands.deploy(
            self._inventory,
            _name(name),
            options,
            self._say,
            keep_partial=args.flag("keep_partial", keep_partial),
        )

    def verify(
        self,
        name: str,
        *,
        wait: float | None = None,
        interval: float | None = None,
        successes: int | None = None,
    ) -> JobResult:
        """`launcher job verify`: the status rank's startup probe, every other node alive."""
        overrides = ProbeOverrides(
            wait=args.duration("wait", wait, params.WAIT),
            interval=args.duration("interval", interval, params.INTERVAL),
            successes=None
            if successes is None
            else args.count("successes", successes, params.SUCCESSES),
        )
        return jobcommands.verify(self._inventory, _name(name), overrides, self._say)

    def status(self, *names: str) -> list[JobResult]:
        """`launcher job status`: one poll of each named job (none: every job)."""
        return jobcommands.status(self._inventory, tuple(_name(n) for n in names))

    def stop(self, name: str, *, grace: float | None = None) -> JobResult:
        """`launcher job stop`: every node's run stopped at once."""
        grace = args.duration("grace", grace, params.GRACE)
        return jobcommands.stop(self._inventory, _name(name), grace, self._say)

    def history(self, name: str, *, limit: int = 0) -> JobHistory:
        """`launcher job history`: the job's deploys, newest first (`limit` 0: all)."""
        limit = args.count("limit", limit, params.LINES)
        return jobcommands.history(self._inventory, _name(name), limit)

    def rollback(
        self,
        name: str,
        *,
        restart: bool = False,
        dry_run: bool = False,
        grace: float | None = None,
        keep_checkpoints: bool = False,
    ) -> JobResult:
        """`launcher job rollback`: every node back to its previous version, all or none."""
        from launcher.jobs.rollback import JobRollbackOptions

        options = JobRollbackOptions(
            restart=args.flag("restart", restart),
            dry_run=args.flag("dry_run", dry_run),
            keep_checkpoints=args.flag("keep_checkpoints", keep_checkpoints),
            grace=args.duration("grace", grace, params.GRACE),
        )
        return jobcommands.rollback(self._inventory, _name(name), options, self._say)

    def logs(
        self,
        name: str,
        *,
        node: str | None = None,
        tail: int = 50,
        raw: bool = False,
        on_line: NodeLineSink | None = None,
    ) -> JobLogs:
        """`launcher job logs` without -f: each chosen node's last `tail` lines to
        `on_line(node, line)` (default: kept in the result's nodes only)."""
        if node is not None and not isinstance(node, str):
            raise UsageError(f"node={node!r}: must be a node's target name or None")
        from launcher.jobs.logs import JobLogsOptions

        sink = args.callback("on_line", on_line) or (lambda node_name, line: None)
        options = JobLogsOptions(
            node=node, tail=args.count("tail", tail, params.LINES), raw=args.flag("raw", raw)
        )
        return jobcommands.logs(self._inventory, _name(name), options, sink)

    def watch(
        self,
        name: str,
        *,
        interval: float = 10.0,
        duration: float | None = None,
        restart_on_failure: bool = False,
        max_restarts: int = 3,
        restart_window: float = 3600.0,
        restart_backoff: float = 10.0,
        webhooks: Sequence[str] = (),
        commands: Sequence[str] = (),
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
        state: str | os.PathLike[str] | None = None,
        on_event: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
    ) -> JobWatchResult:
        """`launcher job watch`: the job's verdict polled every `interval` until `duration`
        passes (None: until `stop` is set), each change to `on_event` and, as events, to the
        state file, `webhooks` and `commands` (as `Launcher.watch`); with
        `restart_on_failure` the whole job is redeployed on a failure, within the budget."""
        from launcher.watch.job import JobWatchOptions

        if stop is not None and not isinstance(stop, threading.Event):
            raise UsageError(f"stop={stop!r}: must be a threading.Event or None")
        options = JobWatchOptions(
            interval=args.seconds("interval", interval, params.INTERVAL),
            duration=args.duration("duration", duration, params.WATCH_FOR),
            restart_on_failure=args.flag("restart_on_failure", restart_on_failure),
            max_restarts=args.count("max_restarts", max_restarts, params.MAX_RESTARTS),
            restart_window=args.seconds("restart_window", restart_window, params.RESTART_WINDOW),
            restart_backoff=args.seconds(
                "restart_backoff", restart_backoff, params.RESTART_BACKOFF
            ),
            state_path=Path(where) if (where := args.path("state", state)) else None,
            webhooks=args.strings("webhooks", webhooks),
            commands=args.strings("commands", commands),
            metrics_port=None
            if metrics_port is None
            else args.count("metrics_port", metrics_port, params.PORT),
            metrics_address=metrics_address,
        )
        event = args.callback("on_event", on_event) or (lambda line: None)
        return jobcommands.watch(
            self._inventory, _name(name), options, say=self._say, event=event, stop=stop
        )

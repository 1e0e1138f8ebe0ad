"""The Python API's multi-node jobs: `Launcher(...).jobs`, one method per `launcher job`
command, building the same request as the CLI (`launcher.core.jobrequests`, checked as declared:
a bad value is a UsageError, exit code 2, before anything is opened) and running it through the
same function (`launcher.commands.jobs`).

Each call opens its nodes' connections and closes them when it returns. Results are the CLI's:
`JobResult` (`exit_code`, `summary`, `nodes`, `to_json()`), `JobHistory`, `JobLogs`,
`JobWatchResult`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from launcher.commands import args
from launcher.commands.jobs import JobSinks
from launcher.commands.keywords import WatchKeywords, known_keywords
from launcher.commands.table import COMMANDS, wiring
from launcher.core.errors import UsageError

if TYPE_CHECKING:
    from launcher.config.models import Inventory
    from launcher.jobs.deploy import JobResult
    from launcher.jobs.history import JobHistory
    from launcher.jobs.logs import JobLogs
    from launcher.watch.job import JobWatchResult

NodeLineSink = Callable[[str, str], None]  # (node, line)
# A method's keywords that are not its request's: where lines go, what ends a watch.
NOT_REQUEST = frozenset(("self", "on_line", "on_event", "stop"))


class Jobs:
    """The inventory's `jobs:`; `on_line(node, line)` gets the progress lines the CLI prints."""

    def __init__(self, inventory: Inventory, on_line: NodeLineSink) -> None:
        self._inventory = inventory
        self._say = on_line

    def names(self) -> list[str]:
        """The inventory's jobs, in its order."""
        return list(self._inventory.spec.jobs)

    def _run(self, command: str, given: dict[str, Any], sinks: JobSinks | None = None) -> Any:
        values = {k: v for k, v in given.items() if k not in NOT_REQUEST}
        request = COMMANDS[f"job {command}"].request(values)
        run = wiring(COMMANDS[f"job {command}"]).run
        return run(self._inventory, request, sinks or JobSinks(say=self._say))

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
        return self._run("deploy", locals())  # type: ignore[no-any-return]

    def verify(
        self,
        name: str,
        *,
        wait: float | None = None,
        interval: float | None = None,
        successes: int | None = None,
    ) -> JobResult:
        """`launcher job verify`: the status rank's startup probe, every other node alive."""
        return self._run("verify", locals())  # type: ignore[no-any-return]

    def status(self, *names: str) -> list[JobResult]:
        """`launcher job status`: one poll of each named job (none: every job)."""
        return self._run("status", {"names": names})  # type: ignore[no-any-return]

    def stop(self, name: str, *, grace: float | None = None) -> JobResult:
        """`launcher job stop`: every node's run stopped at once."""
        return self._run("stop", locals())  # type: ignore[no-any-return]

    def history(self, name: str, *, limit: int = 0) -> JobHistory:
        """`launcher job history`: the job's deploys, newest first (`limit` 0: all)."""
        return self._run("history", locals())  # type: ignore[no-any-return]

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
        return self._run("rollback", locals())  # type: ignore[no-any-return]

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
        given = dict(locals())
        sink = args.callback("on_line", on_line)
        sinks = JobSinks(say=self._say, line=sink) if sink else None
        return self._run("logs", given, sinks)  # type: ignore[no-any-return]

    def watch(
        self,
        name: str,
        *,
        on_event: Callable[[str], None] | None = None,
        stop: threading.Event | None = None,
        **settings: Unpack[WatchKeywords],
    ) -> JobWatchResult:
        """`launcher job watch`: the job's verdict polled every `interval` (default 10 s) until
        `duration` passes (None: until `stop` is set), each change to `on_event` and, as
        events, to the state file, `webhooks` and `commands` (the settings are
        `Launcher.watch`'s); with `restart_on_failure` the whole job is redeployed on a
        failure, within the budget."""
        given = {"name": name, **known_keywords("watch", dict(settings), WatchKeywords)}
        if stop is not None and not isinstance(stop, threading.Event):
            raise UsageError(f"stop={stop!r}: must be a threading.Event or None")
        event = args.callback("on_event", on_event)
        sinks = JobSinks(say=self._say, event=event or (lambda line: None), stop=stop)
        return self._run("watch", given, sinks)  # type: ignore[no-any-return]

"""Run one workflow on many targets at once and end with one table.

One connection per host (shared by that host's containers), at most `parallel` hosts at a time,
every container of an admitted host in parallel. One target's failure never stops the others;
Ctrl-C cancels all of them and closes their connections.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, TypeVar

from launcher.config.models import Target
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, LauncherError
from launcher.targets.cluster import place, place_all
from launcher.targets.workflow import Cancelled, Context
from launcher.transport.pool import ConnectionPool


@dataclass
class Outcome:
    """What one target's run of a workflow came to: a row of the final table."""

    target: str
    exit_code: ExitCode
    summary: str
    data: dict[str, Any] = field(default_factory=dict)
    # The error that stopped this target, already printed on stderr (never again on stdout).
    error: str | None = None
    # The run function's typed result (launcher.targets.workflow.Result), when it returned one.
    value: Any = None

    @property
    def result(self) -> str:
        return {
            ExitCode.OK: "ok",
            ExitCode.UNHEALTHY: "unhealthy",
            ExitCode.USAGE: "invalid",
            ExitCode.UNREACHABLE: "unreachable",
            ExitCode.REFUSED: "refused",
            ExitCode.INTERRUPTED: "interrupted",
        }[self.exit_code]


# A run function's context; the names fleet's callers have always used.
FleetContext = Context


Work = Callable[[FleetContext], Outcome]
T = TypeVar("T")


def on_target(target: Target, action: Callable[[Target, HostConnection], T]) -> T:
    """`action` on one target, in this thread: a cluster target placed on the node that runs
    its VMID now, its host's connection opened for it and closed after (the one place a
    single-target command's connection is handled; errors propagate)."""
    with ConnectionPool() as pool:
        placed = place(target, pool)
        return action(placed, pool.get(placed.host_name, placed.host))


@contextlib.contextmanager
def connections_for(targets: Sequence[Target]) -> Iterator[Callable[[Target], HostConnection]]:
    """A long-running command's connections (watch): each target's host connection, opened on
    first use, shared by the targets on that host (several: their commands on one relay
    channel), all closed at the end."""
    per_host = Counter(t.host_name for t in targets)
    with ConnectionPool() as pool:
        yield lambda t: pool.get(t.host_name, t.host, targets=per_host[t.host_name])


def run_one(
    target: Target,
    work: Callable[[Context], T],
    *,
    say: Callable[[str], None],
    output: Callable[[str], None] = lambda line: None,
    raw_output: Callable[[bytes], None] | None = None,
) -> T:
    """`work` for one target, in this thread (errors propagate: the caller shows them once);
    `output` takes what the command prints as its result (logs' lines)."""
    return on_target(
        target,
        lambda placed, conn: work(
            Context(placed, conn, threading.Event(), say, output=output, raw_output=raw_output)
        ),
    )


def worst(codes: Sequence[ExitCode]) -> ExitCode:
    """The overall exit code: the most severe of the targets' codes (0 when there are none)."""
    return max(codes, default=ExitCode.OK)


def run_fleet(
    targets: Sequence[Target],
    work: Work,
    *,
    parallel: int = 8,
    say: Callable[[str, str], None] = lambda target, line: None,
) -> list[Outcome]:
    """Run `work` for every target; outcomes come back in the order of `targets`."""
    cancel = threading.Event()
    hosts_at_once = threading.BoundedSemaphore(max(1, parallel))
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()

    with ConnectionPool() as pool:
        # Cluster targets go to the node that runs their VMID now (one pvesh call each).
        placed, unplaced = place_all(targets, pool)
        outcomes.update({name: error_outcome(name, e) for name, e in unplaced.items()})
        by_host: dict[str, list[Target]] = defaultdict(list)
        for target in placed:
            by_host[target.host_name].append(target)

        def one_host(host_targets: list[Target]) -> None:
            with hosts_at_once:
                if cancel.is_set():
                    return
                first = host_targets[0]
                conn = pool.get(first.host_name, first.host, targets=len(host_targets))
                with ThreadPoolExecutor(max_workers=len(host_targets)) as inner:
                    for target, outcome in zip(
                        host_targets,
                        inner.map(lambda t: _one_target(t, conn, work, cancel, say), host_targets),
                        strict=True,
                    ):
                        with lock:
                            outcomes[target.name] = outcome

        executor = ThreadPoolExecutor(max_workers=len(by_host) or 1)
        futures = [executor.submit(one_host, group) for group in by_host.values()]
        try:
            # Waiting in short slices keeps the main thread responsive to Ctrl-C.
            while not all(f.done() for f in futures):
                wait(futures, timeout=0.2)
        except KeyboardInterrupt:
            cancel.set()
            pool.close()  # in-flight commands fail fast instead of running to their deadline
            executor.shutdown(wait=True, cancel_futures=True)
            raise
        executor.shutdown(wait=True)
        for future in futures:
            future.result()
    return [
        outcomes.get(t.name) or Outcome(t.name, ExitCode.INTERRUPTED, "not started")
        for t in targets
    ]


def _one_target(
    target: Target,
    conn: HostConnection,
    work: Work,
    cancel: threading.Event,
    say: Callable[[str, str], None],
) -> Outcome:
    context = FleetContext(target, conn, cancel, lambda line: say(target.name, line))
    try:
        return work(context)
    except Cancelled:
        return Outcome(target.name, ExitCode.INTERRUPTED, "interrupted")
    except LauncherError as error:
        if cancel.is_set():
            return Outcome(target.name, ExitCode.INTERRUPTED, "interrupted")
        return error_outcome(target.name, error)


def error_outcome(target: str, error: LauncherError) -> Outcome:
    data = {
        "target": target,
        "ok": False,
        "exit_code": int(error.exit_code),
        "error": error.message,
    }
    return Outcome(target, error.exit_code, error.message, data, error=error.message)


def _state(outcome: Outcome) -> str:
    verdict = getattr(outcome.data.get("probe"), "verdict", None)
    return verdict if isinstance(verdict, str) else outcome.result


@dataclass
class FleetResult:
    """A command's result on all its targets (one or several, `-t a,b`, `--all`): a row each,
    in the order of the targets; the exit code is the worst, the summary the closing table,
    the JSON form the command's envelope (launcher/output/jsonout.py)."""

    command: str
    outcomes: list[Outcome]

    @property
    def exit_code(self) -> ExitCode:
        return worst([o.exit_code for o in self.outcomes])

    @property
    def summary(self) -> str:
        return render_table(self.outcomes, title=self.command)

    def items(self) -> list[dict[str, Any]]:
        """Each target's JSON item: its result's, else (it failed before one) its error's."""
        return [o.data if o.value is None else o.value.to_json() for o in self.outcomes]

    def to_json(self, items: Sequence[dict[str, Any]] | None = None) -> dict[str, Any]:
        from launcher.output.jsonout import envelope

        chosen = self.items() if items is None else items
        return envelope(self.command, chosen, exit_code=int(self.exit_code))


def render_table(outcomes: Sequence[Outcome], *, title: str) -> str:
    """The closing table: target, state (a probe's verdict, else the result), exit code and the
    reason or key figures; then the overall code."""
    rows = [
        (o.target, _state(o), " ".join(o.summary.split()), str(int(o.exit_code))) for o in outcomes
    ]
    headers = ("target", "state", "reason", "exit")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:2])]
    lines = [f"{title}:"]
    lines.append(f"  {headers[0]:<{widths[0]}}  {headers[1]:<{widths[1]}}  exit  {headers[2]}")
    for name, result, summary, code in rows:
        lines.append(f"  {name:<{widths[0]}}  {result:<{widths[1]}}  {code:>4}  {summary}")
    overall = worst([o.exit_code for o in outcomes])
    lines.append(f"  overall exit {int(overall)}")
    return "\n".join(lines)

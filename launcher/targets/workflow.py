"""The shape every command has: a `Request` (a frozen dataclass), a `Result` (exit code, summary,
JSON form) and one `run(ctx, request) -> Result` per command, the `Workflow`.

The CLI, `api.Launcher` and the Fabric tasks build a request and call the same run function
(looked up by the request's type in `commands.WORKFLOWS`); the CLI only renders the result.
A run function acts on one target over the `Context` it is handed; `fleet.run_fleet` hands one
to each target of a fleet, `fleet.run_one` to a single target, `api.Launcher` to the target it
was asked about. This module is a leaf: what it needs of the rest is imported for types only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from launcher.config.models import Target
    from launcher.container.pct import HostConnection
    from launcher.core.errors import ExitCode


@dataclass(frozen=True)
class Step:
    """One step of a workflow as it happens (deploy, stop, rollback, doctor's checks)."""

    name: str
    status: str  # ok | unchanged | skipped | failed | planned | warning
    detail: str


StepSink = Callable[[Step], None]


class Cancelled(Exception):
    """Raised inside a workflow when its command was interrupted (Ctrl-C on a fleet)."""


@dataclass
class Context:
    """What a run function gets: where (the target, placed, and its host's connection), the
    output (progress lines; steps, which become lines unless the caller takes them typed) and
    the command's cancellation."""

    target: Target
    conn: HostConnection
    cancel: threading.Event
    say: Callable[[str], None]
    # The API's `on_step`: steps as values. None: each step is a progress line.
    on_step: StepSink | None = None
    # What the command prints as its output (logs' lines); with `raw_output`, bytes unfiltered.
    output: Callable[[str], None] = lambda line: None
    raw_output: Callable[[bytes], None] | None = None

    def sleep(self, seconds: float) -> None:
        if self.cancel.wait(seconds):
            raise Cancelled()

    def step(self, step: Step) -> None:
        if self.on_step is not None:
            self.on_step(step)
            return
        from launcher.output.ui import step_line

        self.say(step_line(step.name, step.status, step.detail))


class Result(Protocol):
    """What every run function returns: the exit code the CLI would end with, a one-line
    summary (a fleet table's row), and the JSON form the CLI prints for this target."""

    @property
    def exit_code(self) -> ExitCode: ...

    @property
    def summary(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


Req = TypeVar("Req", contravariant=True)
Res = TypeVar("Res", covariant=True)


class Workflow(Protocol[Req, Res]):
    """A command's one run function: `run(ctx, request) -> Result` on one target."""

    def __call__(self, ctx: Context, request: Req, /) -> Res: ...

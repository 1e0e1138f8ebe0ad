"""One poll of a run's pane, as the checks take it: a leaf the poll, the checks and the
lifecycle share."""

from __future__ import annotations

from dataclasses import dataclass

from launcher.verify.gpus import GpuSample
from launcher.verify.samples import Sample

__all__ = ["PaneState", "Poll"]


@dataclass(frozen=True)
class PaneState:
    """What one poll of the trainer's tmux pane returns."""

    session_exists: bool
    pane_dead: bool
    dead_status: int | None
    exit_code: int | None
    capture: str
    pane_pid: int | None = None  # the process tmux started in the pane
    run: str | None = None  # the run marker each deploy sets (tmux option @launcher_run)
    deploy_lock: str | None = None  # who holds the container's deploy lock, when someone does
    # The pane's width: rows of a capture are re-joined only where they were wrapped at it.
    pane_width: int | None = None
    # Seconds the run has printed nothing (its log unwritten) and written nothing below its
    # checkpoints directory, as the container's clock has it; None: not known (no log).
    quiet_for: float | None = None
    # Seconds since the session was created (the container's clock); None: not known.
    age: float | None = None
    # The run was stopped by `launcher stop` (or a watcher that gave up), not ended by itself.
    stopped: bool = False
    gpus: GpuSample | None = None  # the run's GPUs, when the playbook gives it some


@dataclass(frozen=True)
class Poll:
    at: float  # monotonic seconds
    state: PaneState
    samples: tuple[Sample, ...]

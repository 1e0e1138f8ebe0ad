"""The cyclic garbage collector while a command starts (the console script's process only).

A command's start (click, pydantic and the configuration models imported, the inventory and
playbook validated) makes objects that live as long as the process: the collector's passes
over them on the way find nothing to free, about 80 of them and 15 ms of `launcher status`'s
start. The console script defers those passes (`defer`: the young generation's threshold
raised above what a start allocates); the command's first remote command ends that (`resume`):
what the start made is frozen (gc.freeze: never scanned again) and the thresholds come back.
A command that sends no remote command keeps the raised threshold, so cycles it drops are still
collected, in larger batches. The thresholds are all that changes: gc.isenabled() is not
touched, so the modules that pause the collector around their own work (sshlibs.py, the pane
parser) put it back as they found it.
"""

from __future__ import annotations

import gc

START_THRESHOLD = 200_000  # `status` allocates ~60,000 tracked objects before its first command
_saved: tuple[int, int, int] | None = None


def defer() -> None:
    """Raise the young generation's threshold until `resume`."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(START_THRESHOLD, _saved[1], _saved[2])


def resume() -> None:
    """After `defer`: freeze what exists and restore the thresholds; otherwise nothing."""
    global _saved
    saved, _saved = _saved, None
    if saved is not None:
        gc.freeze()
        gc.set_threshold(*saved)

from __future__ import annotations

import os
import sys


def _interrupted() -> None:
    """Ctrl-C while the console module itself loads (console.interrupted, not loaded yet)."""
    sys.stderr.write("interrupted\n")
    os._exit(130)


def _interrupt_or_report(unraisable: sys.UnraisableHookArgs) -> None:
    # a Ctrl-C in an import lock's weakref callback (see console.interrupt_or_report)
    if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
        _interrupted()
    sys.__unraisablehook__(unraisable)


sys.unraisablehook = _interrupt_or_report
try:
    from launcher.entry.console import main
except KeyboardInterrupt:
    _interrupted()

main()

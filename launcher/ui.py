"""Terminal output: rich colour on a TTY, plain lines otherwise (CI logs stay readable)."""

from __future__ import annotations

import os
import sys
from typing import TextIO

MARKS = {
    "ok": "✓",
    "pass": "✓",
    "unchanged": "=",
    "skipped": "-",
    "planned": "·",
    "warning": "!",
    "warn": "!",
    "failed": "✗",
    "fail": "✗",
}
STYLES = {
    "ok": "green",
    "pass": "green",
    "warn": "yellow",
    "warning": "yellow",
    "failed": "red",
    "fail": "red",
}


def is_tty(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ


def step_line(name: str, status: str, detail: str, *, prefix: str = "") -> str:
    mark = MARKS.get(status, "·")
    return f"{prefix}{mark} {name:<12} {detail}"


def echo_step(name: str, status: str, detail: str, *, prefix: str = "") -> None:
    line = step_line(name, status, detail, prefix=prefix)
    if is_tty():
        from rich.console import Console
        from rich.markup import escape

        style = STYLES.get(status)
        text = escape(line)
        Console(highlight=False).print(f"[{style}]{text}[/{style}]" if style else text)
    else:
        print(line, flush=True)


class ProbeDisplay:
    """Progress of a probe: a live line on a TTY, one plain line per poll otherwise."""

    def __init__(self, target: str, *, enabled: bool) -> None:
        self.target = target
        self.enabled = enabled
        self.tty = enabled and is_tty(sys.stderr)
        self._live: object | None = None

    def __enter__(self) -> ProbeDisplay:
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            live = Live("", console=Console(stderr=True), refresh_per_second=4, transient=True)
            live.__enter__()
            self._live = live
        return self

    def update(self, event: object, latest: str) -> None:
        if not self.enabled:
            return
        phase = getattr(event, "phase", "")
        elapsed = getattr(event, "elapsed", 0.0)
        if getattr(event, "error", None):
            text = f"[{self.target} {elapsed:5.0f}s] unreachable: {event.error}"  # type: ignore[attr-defined]
        elif phase == "warmup":
            left = getattr(event, "remaining_warmup", 0.0)
            text = f"[{self.target} {elapsed:5.0f}s] warmup, {left:.0f}s left · {latest}"
        else:
            ok = getattr(event, "consecutive", 0)
            text = f"[{self.target} {elapsed:5.0f}s] judging ({ok} passing in a row) · {latest}"
        if self._live is not None:
            self._live.update(text)  # type: ignore[attr-defined]
        else:
            print(text, file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)  # type: ignore[attr-defined]

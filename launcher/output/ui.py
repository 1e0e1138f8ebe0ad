"""Terminal output: rich colour on a TTY, plain lines otherwise (CI logs stay readable)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from launcher.output.termsafe import sanitize

if TYPE_CHECKING:
    from rich.table import Table

MARKS = {
    "ok": "✓",
    "pass": "✓",
    "unchanged": "=",
    "skipped": "-",
    "planned": "·",
    "progress": "…",
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


# A verdict word's colour (SGR): well, badly, anything else (starting, stopped, absent).
VERDICT_COLOURS = {"HEALTHY": "1;32", "FINISHED": "1;32", "UNHEALTHY": "1;31", "FAILED": "1;31"}
CHECK_COLOURS = {"PASS": "32", "WARN": "33", "FAIL": "31", "SKIP": "2"}
# `target: HEALTHY (exit 0) — …` (verify/report.py render_text) and its checks' `  FAIL  name`.
_VERDICT_RE = re.compile(r"^([\w.-]+: )([A-Z]+)( \(exit \d+\))", re.MULTILINE)
_CHECK_RE = re.compile(r"^(  )(PASS|WARN|FAIL|SKIP)(  )", re.MULTILINE)


def coloured_verdicts(text: str, stream: TextIO | None = None) -> str:
    """A report with its verdict and check words coloured, for a terminal that shows colour
    (none with NO_COLOR, TERM=dumb or no TTY: the text as it is)."""
    if not is_tty(stream):
        return text

    def paint(colours: dict[str, str], default: str) -> Callable[[re.Match[str]], str]:
        def sub(m: re.Match[str]) -> str:
            return f"{m[1]}\x1b[{colours.get(m[2], default)}m{m[2]}\x1b[0m{m[3]}"

        return sub

    text = _VERDICT_RE.sub(paint(VERDICT_COLOURS, "1;33"), text)
    return _CHECK_RE.sub(paint(CHECK_COLOURS, "0"), text)


def is_tty(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and os.environ.get("TERM") != "dumb" and "NO_COLOR" not in os.environ


# What a person reads for the transaction's step names; JSON keeps the names themselves (a
# script matches on them, and they are part of the /1 documents).
STEP_LABELS = {
    "active_check": "active run",
    "verify": "sha256",
    "checkpoint_guard": "checkpoint dir",
    "launch_check": "run file",
}


def step_line(name: str, status: str, detail: str, *, prefix: str = "") -> str:
    mark = MARKS.get(status, "·")
    label = STEP_LABELS.get(name, name)
    # Details can quote the container (a compile error, a holder's command line).
    return f"{prefix}{mark} {label:<12} {sanitize(detail, keep_sgr=False)}"


def progress_text(event: object, latest: str) -> str:
    """One line about a probe poll: phase, elapsed time and the newest sample."""
    elapsed = getattr(event, "elapsed", 0.0)
    error = getattr(event, "error", None)
    if error:
        return f"{elapsed:5.0f}s unreachable: {sanitize(error, keep_sgr=False)}"
    if getattr(event, "phase", "") == "warmup":
        left = getattr(event, "remaining_warmup", 0.0)
        return f"{elapsed:5.0f}s warmup, {left:.0f}s left · {latest}"
    ok = getattr(event, "consecutive", 0)
    return f"{elapsed:5.0f}s judging, {ok} passing in a row · {latest}"


class LiveLine:
    """One transient, updating line on a TTY (stderr); plain lines on stderr otherwise."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._live: object | None = None

    def __enter__(self) -> LiveLine:
        if self.enabled and is_tty(sys.stderr):
            from rich.console import Console
            from rich.live import Live

            live = Live("", console=Console(stderr=True), refresh_per_second=4, transient=True)
            live.__enter__()
            self._live = live
        return self

    def say(self, line: str) -> None:
        if not self.enabled:
            return
        if self._live is not None:
            self._live.update(line)  # type: ignore[attr-defined]
        else:
            print(line, file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)  # type: ignore[attr-defined]


def echo_line(line: str, *, err: bool = False) -> None:
    """A step line as built by step_line, coloured by its mark on a TTY."""
    stream = sys.stderr if err else sys.stdout
    if is_tty(stream):
        from rich.console import Console
        from rich.markup import escape

        status = next((s for s, mark in MARKS.items() if line.lstrip().startswith(mark)), "")
        style = STYLES.get(status)
        text = escape(line)
        Console(highlight=False, stderr=err).print(f"[{style}]{text}[/{style}]" if style else text)
    else:
        print(line, file=stream, flush=True)


def progress_line(line: str) -> None:
    """Progress (a step, a check) goes to stderr, so that stdout holds only the result."""
    echo_line(line, err=True)


class FleetDisplay:
    """Many targets at once: a live table on a TTY, `[target] line` prefixes otherwise."""

    def __init__(self, targets: list[str], *, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = enabled and is_tty(sys.stderr)
        self.latest = dict.fromkeys(targets, "waiting")
        self._live: object | None = None
        self._width = max((len(t) for t in targets), default=0)
        import threading

        self._lock = threading.Lock()

    def __enter__(self) -> FleetDisplay:
        if self.tty:
            from rich.console import Console
            from rich.live import Live

            live = Live(self._table(), console=Console(stderr=True), refresh_per_second=4)
            live.__enter__()
            self._live = live
        return self

    def _table(self) -> Table:
        from rich.table import Table

        table = Table(box=None, show_header=True, header_style="bold")
        table.add_column("target")
        table.add_column("latest")
        for target, line in self.latest.items():
            table.add_row(target, line)
        return table

    def say(self, target: str, line: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self.latest[target] = line
            if self._live is not None:
                self._live.update(self._table())  # type: ignore[attr-defined]
            else:
                print(f"[{target:<{self._width}}] {line}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)  # type: ignore[attr-defined]

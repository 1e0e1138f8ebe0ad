"""Bounded click parameter types: every duration and count on the command line is finite and
in a documented range, or the command exits 2 before it reads the inventory or connects.

Only click is imported here, so that `launcher --help` stays fast.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # click 8.4+ makes ParamType generic; older versions cannot subscript it
    _DurationBase = click.ParamType[float]
    _NumberBase = click.ParamType[float]
else:
    _DurationBase = _NumberBase = click.ParamType

MINUTE = 60.0
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY

_UNITS = {"": 1.0, "s": 1.0, "m": MINUTE, "h": HOUR, "d": DAY}
# A plain decimal number and an optional unit: no exponent, no nan/inf, no "1h30m".
_DURATION_RE = re.compile(
    r"\s*(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>[smhd]?)\s*", re.ASCII
)


def parse_duration(text: str) -> float | None:
    """`90`, `90s`, `1.5`, `3m`, `1h`, `2d` -> seconds; None for anything else."""
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        return None
    seconds = float(match["number"]) * _UNITS[match["unit"]]
    return seconds if math.isfinite(seconds) else None


def human(seconds: float) -> str:
    """A bound as people read it: 0.2 s, 90 s, 1 h, 7 days."""
    for size, unit in ((DAY, "days"), (HOUR, "h"), (MINUTE, "min")):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {'day' if unit == 'days' and count == 1 else unit}"
    return f"{seconds:g} s"


class Duration(_DurationBase):
    """Seconds as a number or with a unit (s, m, h, d), finite, within [low, high]."""

    name = "duration"

    def __init__(self, low: float, high: float) -> None:
        self.low = low
        self.high = high

    @property
    def range_text(self) -> str:
        return f"{human(self.low)} to {human(self.high)}"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds: float | None = float(value) if math.isfinite(value) else None
        else:
            seconds = parse_duration(str(value))
        if seconds is None:
            self.fail(
                f"{value!r} is not a duration: use seconds (90, 1.5) or a unit (90s, 3m, 1h, 2d); "
                f"range {self.range_text}",
                param,
                ctx,
            )
        if not self.low <= seconds <= self.high:
            self.fail(f"{value} is out of range: {self.range_text}", param, ctx)
        return seconds

    def __repr__(self) -> str:
        return f"Duration({self.low:g}, {self.high:g})"


class Number(_NumberBase):
    """A finite decimal number within [low, high] (or (low, high] with low_open)."""

    name = "number"

    def __init__(self, low: float, high: float, *, low_open: bool = False) -> None:
        self.low = low
        self.high = high
        self.low_open = low_open

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number; range {self._range()}", param, ctx)
        above_low = number > self.low if self.low_open else number >= self.low
        if not (math.isfinite(number) and above_low and number <= self.high):
            self.fail(f"{value} is out of range: {self._range()}", param, ctx)
        return number

    def _range(self) -> str:
        return f"{'more than ' if self.low_open else ''}{self.low:g} up to {self.high:g}"

    def __repr__(self) -> str:
        return f"Number({self.low:g}, {self.high:g})"


class Count(click.IntRange):
    """A whole number in a closed range; the bound may be left to the command (low=None), which
    then says itself what is wrong with, e.g., `--buckets 0`."""

    def __init__(self, low: int | None, high: int) -> None:
        super().__init__(min=low, max=high)


# The ranges, in one place.
GRACE = Duration(0, HOUR)  # the deploy lock is held while the old run gets its grace
WAIT = Duration(0, WEEK)
WAIT_LOCK = Duration(0, DAY)  # --wait-lock: how long a deploy waits for another's lock
INTERVAL = Duration(0.2, HOUR)
TRIAL = Duration(2, 10 * 60)  # launcher init's trial run of the trainer
# launcher watch (and launcher job watch)
WATCH_FOR = Duration(0, 365 * DAY)
RESTART_WINDOW = Duration(1, 30 * DAY)
RESTART_BACKOFF = Duration(0, HOUR)
MAX_RESTARTS = Count(0, 1000)
PORT = Count(1, 65535)
WINDOW = Duration(0, WEEK)
SUCCESSES = Count(1, 1000)
PARALLEL = Count(1, 256)
LINES = Count(0, 1_000_000)  # logs --tail, history --limit


class GpuSlice(click.ParamType):  # type: ignore[type-arg]
    """`8`: that many GPUs (the host's 0..7); `6,7` or `6-7`: those of the host's GPUs, by minor
    number, as a CI staging CT is given a slice of the host."""

    name = "gpus"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | list[int]:
        if isinstance(value, int | list):
            return value
        text = str(value).strip()
        if text.isdigit() and int(text) <= 64:
            return int(text)
        minors: list[int] = []
        for part in text.split(","):
            low, dash, high = part.strip().partition("-")
            if not low.isdigit() or (dash and not high.isdigit()):
                self.fail(f"{value!r} is neither a count (8) nor minor numbers (6,7 or 6-7)")
            minors += range(int(low), int(high if dash else low) + 1)
        if not minors or max(minors) > 255:
            self.fail(f"{value!r}: minor numbers are 0..255")
        return sorted(set(minors))


SANDBOX_GPUS = GpuSlice()
SANDBOX_STALL = Duration(0, DAY)  # `sandbox stall`: how long a pct call waits on the host
PCT_CALLS = Count(0, 1_000_000)
STALL_CALLS = Count(1, 1_000_000)
# buckets plan: the lower bounds of --budget, --buckets, --max-len and --epochs are checked by
# the command itself, with messages that say why.
TOKENS = Count(None, 2**40)
BUCKET_COUNT = Count(None, 1000)
EPOCHS = Count(None, 1000)
SEED = Count(0, 2**63 - 1)  # numpy's generator takes non-negative seeds
KTOK_PER_S = Number(0, 1e6, low_open=True)

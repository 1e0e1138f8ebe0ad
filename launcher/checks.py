"""Health checks: pane state and parsed status lines in, verdicts out. Pure; no I/O.

Polls overlap: each capture repeats part of the previous one. `history()` merges them into one
sequence in which every status line appears once, stamped with the time of the poll that first
showed it; the throughput, step, queue and loss checks read that sequence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel, Field, field_validator

from launcher.status import Sample, clean_text, logical_lines, parse_rate

__all__ = [
    "CheckResult",
    "ChecksSpec",
    "LossSpec",
    "PaneState",
    "Poll",
    "Seen",
    "StepSpec",
    "ThroughputSpec",
    "Verdict",
    "evaluate",
    "fatal_signs",
    "history",
    "worst",
]


class Verdict(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"


_RANK = {Verdict.PASS: 0, Verdict.WARN: 1, Verdict.FAIL: 2}


@dataclass(frozen=True)
class CheckResult:
    name: str
    verdict: Verdict
    observed: str
    expected: str


@dataclass(frozen=True)
class PaneState:
    """What one poll of the trainer's tmux pane returns."""

    session_exists: bool
    pane_dead: bool
    dead_status: int | None
    exit_code: int | None
    capture: str


@dataclass(frozen=True)
class Poll:
    at: float  # monotonic seconds
    state: PaneState
    samples: tuple[Sample, ...]


class ThroughputSpec(BaseModel, extra="forbid"):
    min: float = Field(default=1000.0, ge=0)  # tok/s; "5Ktok/s" is accepted too
    target: float | None = Field(default=None, ge=0)
    rise_margin: float = Field(default=0.05, ge=0)  # later must beat earlier by this fraction

    @field_validator("min", "target", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, str) else value


class StepSpec(BaseModel, extra="forbid"):
    stall_after: float = Field(default=120.0, gt=0)  # seconds


class LossSpec(BaseModel, extra="forbid"):
    warn_rise: float = Field(default=0.5, ge=0)  # fraction above the lowest loss seen


class ChecksSpec(BaseModel, extra="forbid"):
    fail_patterns: list[str] = Field(
        default_factory=lambda: [
            "Traceback (most recent call last)",
            "CUDA out of memory",
            "OutOfMemoryError",
            "NCCL error",
            "Killed",
        ]
    )
    queues: dict[str, int] = Field(default_factory=lambda: {"q_pre": 6, "q_hs": 1})
    throughput: ThroughputSpec = Field(default_factory=ThroughputSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    loss: LossSpec = Field(default_factory=LossSpec)


def worst(results: Iterable[CheckResult]) -> Verdict:
    """The most severe verdict; PASS for no results."""
    return max((r.verdict for r in results), key=_RANK.__getitem__, default=Verdict.PASS)


# --- history --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """A status line and the time of the poll that first showed it."""

    sample: Sample
    at: float


def history(polls: Sequence[Poll]) -> list[Seen]:
    """Every status line across polls once, in pane order, with the time it was first seen.

    Each poll resumes after the previous poll's last lines, found in the later capture (only
    the previous poll's newest few samples are needed, so callers may drop older ones). A
    previous last line that was cut off and now appears complete replaces its cut form. No match
    (the pane scrolled past, or was cleared) means every sample of the later poll is new.
    """
    merged: list[Seen] = []
    previous: tuple[Sample, ...] = ()
    for poll in polls:
        start, completed = _resume_point(previous, poll.samples)
        if completed and merged:
            merged[-1] = Seen(poll.samples[start - 1], merged[-1].at)
        merged.extend(Seen(sample, poll.at) for sample in poll.samples[start:])
        previous = poll.samples
    return merged


RESUME_CONTEXT = 3


def _resume_point(before: Sequence[Sample], after: Sequence[Sample]) -> tuple[int, bool]:
    """Where unseen samples start in `after`, and whether the match completed a cut-off line.

    Searches from the end, so identical repeated lines (a stalled trainer) count as seen.
    """
    if not before or not after:
        return 0, False
    tail = [sample.raw for sample in before[-RESUME_CONTEXT:]]
    for j in range(len(after) - 1, -1, -1):
        raw = after[j].raw
        exact = raw == tail[-1]
        if not exact and not raw.startswith(tail[-1]):
            continue
        if all(after[j - i].raw == tail[-1 - i] for i in range(1, len(tail)) if j - i >= 0):
            return j + 1, not exact
    return 0, False


# --- checks ---------------------------------------------------------------------------------


def fatal_signs(state: PaneState, spec: ChecksSpec) -> list[CheckResult]:
    """`alive` and `fatal` on one poll: enough to fail fast during warmup."""
    return [_alive(state), _fatal([state.capture], spec.fail_patterns)]


def evaluate(polls: Sequence[Poll], spec: ChecksSpec) -> list[CheckResult]:
    """All checks on the history so far (latest poll last)."""
    if not polls:
        return [CheckResult("alive", Verdict.FAIL, "no poll taken", "at least one poll")]
    latest = polls[-1]
    seen = history(polls)
    results = [
        _alive(latest.state),
        # Every capture is scanned: a fatal line that has since scrolled away still counts.
        _fatal([p.state.capture for p in polls], spec.fail_patterns),
        _samples(latest),
    ]
    results.extend(_queue(name, size, seen) for name, size in spec.queues.items())
    results.append(_throughput(seen, spec.throughput))
    results.append(_step(seen, latest.at, spec.step))
    results.append(_loss(seen, spec.loss))
    return results


def _alive(state: PaneState) -> CheckResult:
    expected = "session running, pane alive"
    if not state.session_exists:
        return CheckResult("alive", Verdict.FAIL, "tmux session not found", expected)
    if not state.pane_dead:
        return CheckResult("alive", Verdict.PASS, "session running", expected)
    status = state.dead_status if state.dead_status is not None else state.exit_code
    tail = [line for line in clean_text(state.capture).splitlines() if line.strip()][-5:]
    observed = "pane dead" + (f", exit status {status}" if status is not None else "")
    if tail:
        observed += "\n" + "\n".join(tail)  # the first line stays a one-line summary
    return CheckResult("alive", Verdict.FAIL, observed, expected)


def _fatal(captures: Iterable[str], patterns: Sequence[str]) -> CheckResult:
    expected = "none of: " + ", ".join(patterns) if patterns else "no fail patterns configured"
    for capture in captures:
        text = clean_text(capture)
        flat = text.replace("\n", "")  # cheap test first: matches a superset of the lines below
        if not any(p in flat for p in patterns):
            continue
        # Joined lines, so a pattern split by the pane's wrapping is still found.
        for line in logical_lines(text):
            for pattern in patterns:
                if pattern in line:
                    return CheckResult("fatal", Verdict.FAIL, line.strip(), expected)
    return CheckResult("fatal", Verdict.PASS, "no fail pattern", expected)


def _samples(latest: Poll) -> CheckResult:
    count = len(latest.samples)
    expected = "at least 1 status line in the latest capture"
    if count:
        return CheckResult("samples", Verdict.PASS, f"{count} status lines", expected)
    lines = sum(1 for line in latest.state.capture.splitlines() if line.strip())
    observed = f"no status line in {lines} captured lines"
    return CheckResult("samples", Verdict.FAIL, observed, expected)


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _queue(name: str, size: int, seen: Sequence[Seen]) -> CheckResult:
    check = f"queues.{name}"
    expected = f"{size} {'entry' if size == 1 else 'entries'}, all > 0"
    for item in reversed(seen):
        values = item.sample.numbers(name)
        if values is None:
            continue
        shown = f"{name}=[{', '.join(_fmt(v) for v in values)}]"
        if len(values) != size:
            observed = f"{shown} ({len(values)} entries)"
            return CheckResult(check, Verdict.FAIL, observed, expected)
        empty = [str(i + 1) for i, v in enumerate(values) if not v > 0]
        if empty:
            which = f"bucket {empty[0]}" if len(empty) == 1 else f"buckets {', '.join(empty)}"
            observed = f"{shown} ({which} empty)"
            return CheckResult(check, Verdict.FAIL, observed, expected)
        return CheckResult(check, Verdict.PASS, shown, expected)
    return CheckResult(check, Verdict.FAIL, f"{name} never reported", expected)


def _rate(value: float) -> str:
    return f"{value / 1000:.1f}Ktok/s" if value >= 1000 else f"{value:.0f}tok/s"


def _throughput(seen: Sequence[Seen], spec: ThroughputSpec) -> CheckResult:
    series = [t for item in seen if (t := item.sample.throughput) is not None and math.isfinite(t)]
    expected = f">= {_rate(spec.min)}" + (
        f", reaching {_rate(spec.target)} or rising" if spec.target is not None else ", rising"
    )
    if not series:
        return CheckResult("throughput", Verdict.FAIL, "no throughput reported", expected)
    latest = series[-1]
    trend = " -> ".join(_rate(v) for v in _sketch(series))
    if latest < spec.min:
        return CheckResult("throughput", Verdict.FAIL, f"{trend} (below minimum)", expected)
    if spec.target is not None and latest >= spec.target:
        return CheckResult("throughput", Verdict.PASS, f"{trend} (at target)", expected)
    half = len(series) // 2
    rising = half > 0 and (
        _mean(series[-half:]) > _mean(series[:half]) * (1 + spec.rise_margin)
        or latest > series[0] * (1 + spec.rise_margin)
    )
    if rising:
        return CheckResult("throughput", Verdict.PASS, f"{trend} (rising)", expected)
    why = "one reading" if len(series) == 1 else "flat"
    if spec.target is not None:
        why += f", below target {_rate(spec.target)}"
    return CheckResult("throughput", Verdict.WARN, f"{trend} ({why})", expected)


def _sketch(series: Sequence[float]) -> list[float]:
    # First, middle and last readings are enough to show a trend in one line.
    if len(series) <= 3:
        return list(series)
    return [series[0], series[len(series) // 2], series[-1]]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _step(seen: Sequence[Seen], now: float, spec: StepSpec) -> CheckResult:
    expected = f"step advancing (changes within {_fmt(spec.stall_after)} s)"
    steps = [(item, s) for item in seen if (s := item.sample.step) is not None]
    if not steps:
        return CheckResult("step", Verdict.FAIL, "no step reported", expected)
    last_item, step = steps[-1]
    first_item = last_item
    for item, value in reversed(steps):
        if value != step:
            break
        first_item = item
    unchanged = now - first_item.at
    # The `[Nm]` stamps also bound it: [3m] after [0m] means at least 2 minutes apart.
    start, end = first_item.sample.elapsed_min, last_item.sample.elapsed_min
    if start is not None and end is not None:
        unchanged = max(unchanged, (end - start - 1) * 60)
    if unchanged >= spec.stall_after:
        observed = f"step {step} unchanged for {unchanged:.0f} s"
        return CheckResult("step", Verdict.FAIL, observed, expected)
    return CheckResult(
        "step", Verdict.PASS, f"step {step}, last changed {unchanged:.0f} s ago", expected
    )


def _loss(seen: Sequence[Seen], spec: LossSpec) -> CheckResult:
    expected = f"finite, at most {1 + spec.warn_rise:g}x the lowest seen"
    losses = [v for item in seen if (v := item.sample.loss) is not None]
    if not losses:
        return CheckResult("loss", Verdict.PASS, "not reported yet", expected)
    latest = losses[-1]
    if not math.isfinite(latest):
        return CheckResult("loss", Verdict.FAIL, f"loss={latest}", expected)
    finite = [v for v in losses if math.isfinite(v)]
    lowest = min(finite)
    if len(finite) < len(losses):
        observed = f"loss={latest:.4g}, but it was non-finite earlier"
        return CheckResult("loss", Verdict.WARN, observed, expected)
    if latest > lowest + abs(lowest) * spec.warn_rise:
        observed = f"loss={latest:.4g}, lowest {lowest:.4g}"
        return CheckResult("loss", Verdict.WARN, observed, expected)
    return CheckResult("loss", Verdict.PASS, f"loss={latest:.4g} (lowest {lowest:.4g})", expected)

"""Checks of the numbers a run prints: its queues, throughput, loss and every other number."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.verify.rules.base import check
from launcher.verify.rules.text import fmt, rate, rising, sketch, spaced_rate
from launcher.verify.spec import QueueSpec, queue_spec

if TYPE_CHECKING:
    from launcher.verify.history import RunHistory

__all__ = ["finite", "loss", "queues", "throughput"]

_CEILING_NEAR = 0.9  # "near the ceiling": at or above this fraction of it
# A training loss that reads exactly 0 this many times in a row is not learning but broken: Hugging
# Face's Trainer (logging_nan_inf_filter=True, its default) drops NaN steps from the logged sum,
# so a run whose every step is NaN logs 'loss': 0.0 (transformers' Trainer._inner_training_loop).
_ZERO_LOSS_READINGS = 3
_FLOOR_RISE = 0.2  # below the floor, "still rising" needs this much over the earlier half


@check("queues")
def queues(run: RunHistory) -> list[CheckResult]:
    """Each queue the playbook names: every bucket (or the queue) filled within the threshold."""
    return [_queue(run, name, queue_spec(setting)) for name, setting in run.spec.queues.items()]


def _queue(run: RunHistory, name: str, spec: QueueSpec) -> CheckResult:
    check = f"queues.{name}"
    polls = run.queues[name]
    threshold = run.spec.failure_threshold
    latest = run.queue_latest[name]
    kind = run.queue_kind[name]
    if latest is None or kind is None:
        expected = _queue_expected(spec, None, threshold)
        skipped = _not_reported(run, check)
        if skipped is not None:
            return skipped
        return CheckResult(check, Verdict.FAIL, f"{name} never reported", expected, Failure.PENDING)
    expected = _queue_expected(spec, kind, threshold)
    if kind == "buckets":
        shown = f"{name}=[{', '.join(fmt(v) for v in latest)}]"
    elif kind == "fill":
        shown = f"{name} {latest[0]:.0%} full"
    else:
        shown = f"{name}={fmt(latest[0])}"
    size = spec.buckets if kind == "buckets" and spec.buckets is not None else len(latest)
    if len(latest) != size:
        observed = f"{shown} ({len(latest)} entries)"
        return CheckResult(check, Verdict.FAIL, observed, expected, Failure.DEFINITE)
    # A fill must reach min_fill (above empty when 0); a depth or a bucket must be above 0.
    floor = spec.min_fill if kind == "fill" else 0.0

    def filled(value: float) -> bool:
        return value >= floor if floor > 0 else value > 0

    readings = [r for poll in polls for r in poll if len(r) == size]
    empty = [i for i in range(size) if not any(filled(r[i]) for r in readings)]
    if empty:
        if kind == "buckets":
            which = ", ".join(str(i + 1) for i in empty)
            which = f"bucket {which} empty" if len(empty) == 1 else f"buckets {which} empty"
        elif floor > 0:
            which = f"below {floor:.0%} full"
        else:
            which = "empty"
        span = f" in {len(polls)} polls" if len(polls) > 1 else ""
        if len(readings) > 1 and not span:
            span = f" in {len(readings)} readings"
        observed = f"{shown} ({which}{span})"
        # Judged over failure_threshold polls already: waiting longer adds nothing.
        full = len(polls) >= threshold
        failure = Failure.IMMEDIATE if full else Failure.DEFINITE
        return CheckResult(check, Verdict.FAIL, observed, expected, failure)
    if any(not filled(v) for v in latest):
        recently = "every bucket filled recently" if kind == "buckets" else "filled recently"
        return CheckResult(check, Verdict.PASS, f"{shown} (bursty: {recently})", expected)
    return CheckResult(check, Verdict.PASS, shown, expected)


def _queue_expected(spec: QueueSpec, kind: str | None, threshold: int) -> str:
    within = f"at least once in {threshold} polls"
    if kind == "fill" or (kind is None and spec.min_fill > 0):
        fill = f"at least {spec.min_fill:.0%} full" if spec.min_fill > 0 else "above empty"
        return f"{fill} {within}"
    if kind == "depth":
        return f"> 0 {within}"
    if spec.buckets is None:
        return f"each entry > 0 {within}"
    size = spec.buckets
    return f"{size} {'entry' if size == 1 else 'entries'}, each > 0 {within}"


@check("throughput")
def throughput(run: RunHistory) -> CheckResult:
    """At least the minimum (or rising towards it), not sagged below a share of its peak."""
    spec = run.spec.throughput
    series = run.throughput
    unit = run.unit
    floor = _floor(run)
    expected = (
        ", ".join(
            part
            for part in (
                f">= {rate(floor, unit)}" if floor is not None else "",
                f"reaching {rate(spec.target, unit)} or rising" if spec.target is not None else "",
                f"not below {spec.drop:.0%} of this run's peak" if spec.drop is not None else "",
            )
            if part
        )
        or "reported"
    )
    current = series.current()
    if current is None:
        skipped = _not_reported(run, "throughput")
        if skipped is not None:
            return skipped
        return CheckResult(
            "throughput", Verdict.FAIL, "no throughput reported", expected, Failure.PENDING
        )
    values = list(series.values)
    trend = " -> ".join(rate(v, unit) for v in sketch(values))
    peak = series.smooth_max
    sagged = spec.drop is not None and peak is not None and current < spec.drop * peak
    if floor is not None and current < floor:
        observed = f"{trend} (below minimum"
        if sagged and peak is not None and peak >= floor:
            observed += f"; {current / peak:.0%} of this run's peak {rate(peak, unit)}"
        if rising(values, _FLOOR_RISE) and not sagged:
            observed += ", rising)"
            return CheckResult("throughput", Verdict.FAIL, observed, expected, Failure.PENDING)
        return CheckResult("throughput", Verdict.FAIL, observed + ")", expected, Failure.DEFINITE)
    if sagged and peak is not None:
        share = current / peak * 100
        observed = (
            f"throughput {spaced_rate(current, unit)}, {share:.0f} % of this run's "
            f"peak {spaced_rate(peak, unit)}"
        )
        return CheckResult("throughput", Verdict.FAIL, observed, expected, Failure.DEFINITE)
    if spec.target is not None and current >= spec.target:
        return CheckResult("throughput", Verdict.PASS, f"{trend} (at target)", expected)
    if rising(values, spec.rise_margin):
        return CheckResult("throughput", Verdict.PASS, f"{trend} (rising)", expected)
    if len(values) == 1:
        return CheckResult("throughput", Verdict.WARN, f"{trend} (one reading)", expected)
    if spec.target is not None:
        observed = f"{trend} (steady, below target {rate(spec.target, unit)})"
        return CheckResult("throughput", Verdict.WARN, observed, expected)
    return CheckResult("throughput", Verdict.PASS, f"{trend} (steady)", expected)


def _floor(run: RunHistory) -> float | None:
    """The absolute throughput floor: the playbook's `throughput.min`, or DFlash's own default
    (its lines count tok/s); another format's unit says nothing of a healthy rate (nanoGPT
    runs at 1 it/s, Megatron at 0.03), so its run is judged against itself only."""
    spec = run.spec.throughput
    if "min" in spec.model_fields_set:
        return spec.min
    dflash = "dflash" in run.formats and run.unit == "tok/s"
    return spec.min if dflash else None


def _not_reported(run: RunHistory, name: str) -> CheckResult | None:
    """SKIP for a quantity no status line of the run has carried, when its format may
    leave it out and the playbook did not ask for it; None when it must be judged."""
    if not run.formats or "dflash" in run.formats or name in run.reported:
        return None  # nothing read yet, or a format whose every line carries it
    spec = run.spec
    if name == "throughput":
        asked = bool({"min", "target"} & spec.throughput.model_fields_set)
    else:
        asked = "queues" in spec.model_fields_set
    if asked:
        return None
    what = name.split(".")[-1]
    return CheckResult(
        name,
        Verdict.SKIP,
        f"{what} not reported (the run's status lines carry none)",
        f"judged when the status lines carry {what}, or when the playbook asks for it",
    )


@check("loss", reason=6)
def loss(run: RunHistory) -> CheckResult:
    """Finite, not risen far above this run's lowest, not back near the ceiling."""
    spec = run.spec.loss
    expected = f"finite, at most {1 + spec.warn_rise:g}x the lowest seen"
    if spec.max_rise is not None:
        expected += f" (failing above {1 + spec.max_rise:g}x)"
    if spec.ceiling is not None:
        expected += f", not back near the ceiling {spec.ceiling:g}"
    latest = run.loss_latest
    if latest is None:
        return CheckResult("loss", Verdict.PASS, "not reported yet", expected)
    if not math.isfinite(latest):
        return CheckResult("loss", Verdict.FAIL, f"loss={latest}", expected, Failure.DEFINITE)
    series = run.loss
    current = series.current()
    lowest = min(series.values)
    low = series.smooth_min  # one lucky reading does not make the lowest
    if current is not None and spec.ceiling is not None:
        ceiling = _ceiling(current, low, spec.ceiling, expected)
        if ceiling is not None:
            return ceiling
    if current is not None and low is not None and spec.max_rise is not None:
        limit = low + abs(low) * spec.max_rise
        if current > limit:
            rise = (current - low) / abs(low)
            observed = f"loss {current:.4g}, up {rise:.0%} from this run's lowest {low:.4g}"
            return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
    zeros = _trailing_zeros(series.values)
    if zeros >= _ZERO_LOSS_READINGS:
        before = next((v for v in reversed(series.values) if v != 0.0), None)
        was = f" (it was {before:.4g})" if before is not None else ""
        observed = (
            f"loss exactly 0 in the last {zeros} readings{was}: a NaN the trainer's filter "
            "logs as 0.0, or a loss that is not computed"
        )
        return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
    if run.loss_nonfinite:
        observed = f"loss={latest:.4g}, but it was non-finite earlier"
        return CheckResult("loss", Verdict.WARN, observed, expected)
    if latest > lowest + abs(lowest) * spec.warn_rise:
        observed = f"loss={latest:.4g}, lowest {lowest:.4g}"
        return CheckResult("loss", Verdict.WARN, observed, expected)
    return CheckResult("loss", Verdict.PASS, f"loss={latest:.4g} (lowest {lowest:.4g})", expected)


def _ceiling(
    current: float, low: float | None, ceiling: float, expected: str
) -> CheckResult | None:
    """Near the loss of a model that predicts nothing: failing if it had been lower."""
    if current < _CEILING_NEAR * ceiling:
        return None
    if low is not None and low < _CEILING_NEAR * ceiling:
        observed = f"loss {current:.4g} near the ceiling {ceiling:g} (it was {low:.4g})"
        return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.DEFINITE)
    observed = f"loss {current:.4g} still near the ceiling {ceiling:g} (not learning yet)"
    return CheckResult("loss", Verdict.FAIL, observed, expected, Failure.PENDING)


@check("finite", reason=7)
def finite(run: RunHistory) -> CheckResult:
    """Every other number of the latest status line finite (grad_norm, ...)."""
    expected = "every other number in the latest status line finite"
    if not run.nonfinite:
        return CheckResult("finite", Verdict.PASS, "all finite", expected)
    shown = " ".join(f"{k}={v}" for k, v in run.nonfinite.items())
    loss = run.loss_latest
    if loss is not None and math.isfinite(loss):
        shown += f" (while loss={loss:.4g} looks plausible)"
    return CheckResult("finite", Verdict.FAIL, shown, expected, Failure.DEFINITE)


def _trailing_zeros(values: deque[float]) -> int:
    """How many of the latest readings are exactly 0."""
    count = 0
    for value in reversed(values):
        if value != 0.0:
            break
        count += 1
    return count

"""How the checks write numbers in what they observed and expected."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import median

__all__ = ["fmt", "rate", "rising", "sketch", "spaced_rate"]


def fmt(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    return str(int(value)) if value.is_integer() else f"{value:g}"


def rate(value: float, unit: str = "tok/s") -> str:
    if unit != "tok/s":
        return f"{value:.3g}{unit}"
    return f"{value / 1000:.1f}Ktok/s" if value >= 1000 else f"{value:.0f}tok/s"


def spaced_rate(value: float, unit: str = "tok/s") -> str:
    if unit != "tok/s":
        return f"{value:.3g} {unit}"
    return f"{value / 1000:.1f} Ktok/s" if value >= 1000 else f"{value:.0f} tok/s"


def rising(series: Sequence[float], margin: float) -> bool:
    """The later half's median beats the earlier half's by `margin` (medians: noise-proof)."""
    half = len(series) // 2
    if half == 0:
        return False
    earlier, later = median(series[:half]), median(series[-half:])
    return later > earlier * (1 + margin) and later > earlier


def sketch(series: Sequence[float]) -> list[float]:
    # First, middle and last readings are enough to show a trend in one line.
    if len(series) <= 3:
        return list(series)
    return [series[0], series[len(series) // 2], series[-1]]

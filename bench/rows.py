"""The result table: one Row per figure, rendered as plain text, Markdown or JSON."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

Value = float | str | None


@dataclass
class Row:
    figure: str
    unit: str  # s | calls | conns | lines/s | MiB | bytes | x
    launcher: Value
    a: Value = None
    b: Value = None
    ratio: float | None = None
    target: str = ""
    met: bool | None = None  # None: no target, or not enforced (--quick)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt(value: Value, unit: str) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if unit == "s":
        return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"
    if unit == "lines/s":
        return f"{value:,.0f}/s"
    if unit == "bytes":
        return f"{value:,.0f} B"
    if unit == "ms":
        return f"{value:.0f} ms"
    if unit == "MiB":
        return f"{value:.0f} MiB"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:g}"


def cells(row: Row, enforce: bool) -> list[str]:
    ratio = "—" if row.ratio is None else f"{row.ratio:.2f}x"
    if not row.target:
        met = ""
    elif not enforce:
        met = "(not enforced)"
    else:
        met = "met" if row.met else "NOT met"
    return [
        row.figure,
        fmt(row.launcher, row.unit),
        fmt(row.a, row.unit),
        fmt(row.b, row.unit),
        ratio,
        row.target or "—",
        met,
        row.note,
    ]


HEADER = [
    "figure",
    "launcher",
    "A: ssh per step",
    "B: one ssh (mux)",
    "ratio",
    "target",
    "met",
    "notes",
]


def render_text(rows: Sequence[Row], enforce: bool) -> str:
    table = [HEADER, *(cells(r, enforce) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    out = []
    for n, line in enumerate(table):
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def render_markdown(rows: Sequence[Row], enforce: bool) -> str:
    def esc(text: str) -> str:
        return text.replace("|", "\\|")

    out = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        out.append("| " + " | ".join(esc(c) for c in cells(r, enforce)) + " |")
    return "\n".join(out)

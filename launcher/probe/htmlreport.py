"""`verify --report FILE.html`: one self-contained page to open from a CI artifact.

Charts of throughput, loss, step rate and each queue's depth over the probe, the warmup
boundary, the check table and the run's last lines. Inline SVG and CSS only: no script, no
font, no image and no link leaves the file, and a Content-Security-Policy says so to the browser
too. Everything that came from the container is hostile (see `launcher.output.termsafe`): it is
sanitised and then HTML-escaped, never inserted as markup.

Time is seconds since the probe's first poll. The lines a poll shows for the first time were
printed since the previous poll, so they are spread evenly over that interval; the lines already
in the pane at the first poll predate the probe and are drawn left of 0 at the average spacing of
later lines (an estimate, shaded as such). Step rate is measured per poll, between real times.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.core.errors import UsageError
from launcher.core.version import __version__
from launcher.deploy.provenance import describe as describe_source
from launcher.deploy.provenance import describe_overrides
from launcher.output.termsafe import sanitize
from launcher.verify.history import history
from launcher.verify.prober import ProbeResult
from launcher.verify.results import Verdict
from launcher.verify.samples import Sample

if TYPE_CHECKING:
    from launcher.targets.fleet import Outcome

# Lines from before the probe that are drawn at most (a long-running pane has thousands).
MAX_BEFORE = 200
WIDTH, HEIGHT = 560, 220
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 34
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:24px 0 8px}
.verdict{font-weight:600;padding:1px 8px;border-radius:4px;color:#fff}
.healthy,.pass{background:#2e7d32}.unhealthy,.fail{background:#c62828}
.unreachable,.warn{background:#ef6c00}.none{background:#757575}
.charts{display:flex;flex-wrap:wrap;gap:12px}
svg.chart{border:1px solid #ddd;background:#fcfcfc}
svg text{font:11px system-ui,sans-serif;fill:#444}
table{border-collapse:collapse;margin-top:8px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
td.observed{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
pre{background:#f4f4f4;border:1px solid #ddd;padding:8px;overflow-x:auto;font-size:12px}
.meta{color:#555}
table.header{margin:4px 0 8px}table.header th{font-weight:500;color:#555;background:#fafafa}
ul.failing{background:#fff4f4;border:1px solid #f0c0c0;padding:8px 8px 8px 28px}
ul.failing .observed{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:12px}
"""


def text(value: object) -> str:
    """Container text made inert twice: terminal controls dropped, then HTML-escaped."""
    return html.escape(sanitize(str(value), keep_sgr=False), quote=True)


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Run:
    """One target's part of the report."""

    target: str
    probe: ProbeResult | None
    deploy: dict[str, Any] | None
    queue_names: Sequence[str]
    summary: str = ""
    host: str = ""
    vmid: int | None = None


def timeline(probe: ProbeResult) -> list[tuple[float, Sample]]:
    """Every status line of the probe once, at its (estimated) time since the first poll."""
    seen = history(probe.polls)
    if not seen:
        return []
    start = probe.polls[0].at
    poll_times = sorted({p.at for p in probe.polls})
    groups: dict[float, list[Sample]] = {}
    for item in seen:
        groups.setdefault(item.at, []).append(item.sample)
    placed: list[tuple[float, Sample]] = []
    previous: float | None = None
    for at in poll_times:
        samples = groups.get(at, [])
        if previous is not None and samples:
            step = (at - previous) / len(samples)
            placed.extend(
                (at - start - step * (len(samples) - 1 - i), s) for i, s in enumerate(samples)
            )
        previous = at
    spacing = _spacing(placed, probe)
    before = groups.get(poll_times[0], [])[-MAX_BEFORE:]
    earlier = [(-spacing * (len(before) - 1 - i), s) for i, s in enumerate(before)]
    return earlier + placed


def _spacing(placed: list[tuple[float, Sample]], probe: ProbeResult) -> float:
    if len(placed) >= 2 and placed[-1][0] > placed[0][0]:
        return (placed[-1][0] - placed[0][0]) / (len(placed) - 1)
    return probe.settings.interval if probe.settings else 1.0


def step_rate(probe: ProbeResult) -> list[tuple[float, float]]:
    """Steps per second between consecutive polls that both showed a step counter."""
    start = probe.polls[0].at if probe.polls else 0.0
    points: list[tuple[float, float]] = []
    last: tuple[float, int] | None = None
    for poll in probe.polls:
        steps = [s.step for s in poll.samples if s.step is not None]
        if not steps:
            continue
        if last is not None and poll.at > last[0]:
            points.append((poll.at - start, max(0.0, (steps[-1] - last[1]) / (poll.at - last[0]))))
        last = (poll.at, steps[-1])
    return points


def chart_series(probe: ProbeResult, queue_names: Sequence[str]) -> list[tuple[str, list[Series]]]:
    """(title, series) for each chart: throughput, loss, step rate, one per queue."""
    placed = timeline(probe)
    unit, scale = throughput_unit(placed)
    throughput = Series(unit)
    loss = Series("loss")
    queues: dict[str, list[Series]] = {name: [] for name in queue_names}
    for x, sample in placed:
        if sample.throughput is not None:
            throughput.points.append((x, sample.throughput / scale))
        if sample.loss is not None:
            loss.points.append((x, sample.loss))  # NaN kept: drawn as a marker
        for name in queue_names:
            # A list per bucket; a depth (`12`) or a fill (`12/16`: 0.75) as one line.
            read = sample.queue(name)
            values = read[1] if read is not None else []
            lines = queues[name]
            while len(lines) < len(values):
                label = f"{name}[{len(lines)}]" if read and read[0] == "buckets" else name
                lines.append(Series(label))
            for line, value in zip(lines, values, strict=False):
                line.points.append((x, value))
    charts = [
        (f"throughput ({unit})", [throughput]),
        ("loss", [loss]),
        ("step rate (steps/s)", [Series("steps/s", step_rate(probe))]),
    ]
    charts.extend((f"queue {name} depth", queues[name]) for name in queue_names)
    gpus = gpu_util_series(probe)
    if gpus:
        charts.append(("GPU utilization (%)", gpus))
    return charts


def throughput_unit(placed: Sequence[tuple[float, Sample]]) -> tuple[str, float]:
    """The throughput chart's unit and the divisor into it: tokens in thousands (Ktok/s),
    every other unit as the trainer reports it (it/s, samples/s)."""
    unit = next((s.throughput_unit for _, s in placed if s.throughput is not None), "tok/s")
    return ("Ktok/s", 1000.0) if unit == "tok/s" else (unit, 1.0)


def gpu_util_series(probe: ProbeResult) -> list[Series]:
    """One line per GPU: its utilization at each poll that read it (none without GPUs)."""
    start = probe.polls[0].at if probe.polls else 0.0
    lines: dict[int, Series] = {}
    for poll in probe.polls:
        sample = poll.state.gpus
        if sample is None:
            continue
        for index, util in sorted(sample.util.items()):
            if util is not None:
                held = "" if index in sample.held else " (not the run's)"
                line = lines.setdefault(index, Series(f"GPU {index}{held}"))
                line.points.append((poll.at - start, float(util)))
    return [lines[i] for i in sorted(lines)]


def _nice(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above value."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value * (1 - 1e-9))


def _label(value: float) -> str:
    return f"{value:.4g}"


def svg_chart(
    title: str, series: Sequence[Series], x_range: tuple[float, float], warmup: float | None
) -> str:
    """One line chart, y from zero (so a flat line looks flat), as an inline <svg>."""
    x0, x1 = x_range
    finite = [y for s in series for _, y in s.points if _drawable(y)]
    top = _nice(max([*finite, 0.0]) * 1.05) if finite else 1.0
    bottom = min(0.0, *finite) if finite else 0.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / ((x1 - x0) or 1.0) * plot_w

    def py(y: float) -> float:
        return TOP + (top - y) / ((top - bottom) or 1.0) * plot_h

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{text(title)}">',
        f'<text x="{LEFT}" y="16" font-weight="600">{text(title)}</text>',
    ]
    if x0 < 0:  # lines from before the probe: their times are estimated
        parts.append(
            f'<rect class="before" x="{LEFT}" y="{TOP}" width="{px(min(0.0, x1)) - LEFT:.1f}" '
            f'height="{plot_h}" fill="#eee">'
            "<title>before the probe (times estimated)</title></rect>"
        )
    for tick in (bottom, (bottom + top) / 2, top):
        y = py(tick)
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e0e0e0"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_label(tick)}</text>'
        )
    for tick in _x_ticks(x0, x1):
        x = px(tick)
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{tick:g}s</text>'
        )
    parts.append(
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + plot_h}" stroke="#999"/>'
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" y2="{TOP + plot_h}" '
        'stroke="#999"/>'
    )
    parts.extend(_warmup_mark(warmup, x0, x1, px, plot_h))
    for index, line in enumerate(series):
        colour = COLOURS[index % len(COLOURS)]
        parts.extend(_polyline(line, colour, px, py, TOP))
    if not any(s.points for s in series):
        parts.append(f'<text x="{LEFT + 12}" y="{TOP + plot_h / 2:.1f}">no readings</text>')
    if len(series) > 1:
        parts.extend(_legend(series))
    parts.append("</svg>")
    return "".join(parts)


def _warmup_mark(warmup: float | None, x0: float, x1: float, px: Any, plot_h: float) -> list[str]:
    """The end of the warmup: a dashed line where it falls, or (when the data ends before it,
    as with a crash during the warmup) a note at the right edge; the chart is never stretched
    to reach it. The label sits left of the line near the right edge, so it is never clipped."""
    if warmup is None or warmup < x0:
        return []
    colour = 'fill="#ef6c00"'
    if warmup > x1:
        return [
            f'<text class="warmup" x="{WIDTH - RIGHT:.1f}" y="{TOP + 12}" {colour} '
            f'text-anchor="end">warmup ends at {warmup:g}s →</text>'
        ]
    x = px(warmup)
    near_right = x > WIDTH - RIGHT - 90
    label_x, anchor = (x - 4, "end") if near_right else (x + 4, "start")
    return [
        f'<line class="warmup" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{TOP + plot_h}" '
        'stroke="#ef6c00" stroke-dasharray="5,4"/>'
        f'<text x="{label_x:.1f}" y="{TOP + 12}" {colour} text-anchor="{anchor}">'
        "warmup ends</text>"
    ]


# A value this large is drawn as non-finite: scaling the axis to it would overflow to inf and
# every coordinate on the chart to NaN.
LARGEST = 1e300


def _drawable(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= LARGEST


def _polyline(line: Series, colour: str, px: Any, py: Any, top: float) -> list[str]:
    placed = [(px(x), py(y), y) for x, y in line.points if math.isfinite(x)]
    drawn = [(x, y) for x, y, value in placed if _drawable(value) and math.isfinite(y)]
    out = []
    if drawn:
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in drawn)
        out.append(
            f'<polyline class="series" data-label="{text(line.label)}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5" points="{points}"/>'
        )
    for x, _, y in placed:
        if not _drawable(y) and math.isfinite(x):  # a NaN or inf reading: marked on the top edge
            out.append(
                f'<text class="nonfinite" x="{x:.1f}" y="{top + 10}" fill="#c62828" '
                f'text-anchor="middle">×<title>{text(y)}</title></text>'
            )
    return out


def _legend(series: Sequence[Series]) -> list[str]:
    out = []
    for index, line in enumerate(series):
        x = WIDTH - RIGHT - 62 * (len(series) - index)
        colour = COLOURS[index % len(COLOURS)]
        out.append(
            f'<rect x="{x}" y="8" width="10" height="3" fill="{colour}"/>'
            f'<text x="{x + 13}" y="13">{text(line.label)}</text>'
        )
    return out


def _x_ticks(x0: float, x1: float) -> list[float]:
    step = _nice((x1 - x0) / 6) if x1 > x0 else 1.0
    first = math.ceil(x0 / step) * step
    count = int((x1 - first) / step + 1e-9) + 1
    return [round(first + i * step, 6) for i in range(max(0, count))]


def header_fields(run: Run, generated: str) -> list[tuple[str, str]]:
    """What was judged, where and when: the header's rows, in order."""
    probe = run.probe
    record = _record_of(run)
    sha = record.get("sha256") if record else None
    deployed = record.get("time") if record else None
    source = describe_source(record.get("source") if record else None)
    rows = [
        ("target", run.target),
        ("host", run.host or "?"),
        ("CT", str(run.vmid) if run.vmid is not None else "?"),
        ("run", (probe.run if probe else None) or "unknown (not started by launcher)"),
        ("script sha256", sha if isinstance(sha, str) else "unknown (no deploy record)"),
        ("deployed", deployed if isinstance(deployed, str) else "unknown"),
        ("launcher", __version__),
        ("report written", generated),
    ]
    if source is not None:  # the code's git commit, when the deploy was made from a work tree
        rows.insert(5, ("source", source))
    overrides = describe_overrides(record) if record else ""
    if overrides:  # what the deploy changed beyond the playbook (env names only)
        rows.insert(rows.index(("launcher", __version__)), ("overrides", overrides))
    if record and record.get("user") and record.get("client_host"):
        who = f"{record['user']} from {record['client_host']}"
        rows.insert(rows.index(("launcher", __version__)), ("deployed by", who))
    return rows


def _record_of(run: Run) -> dict[str, Any] | None:
    """The deploy record of the run judged: the container's latest record when it names the
    run the probe pinned (an older record describes another run), else smoke's own deploy."""
    probe = run.probe
    if probe is not None and probe.record and probe.record.get("run") == probe.run:
        return probe.record
    if run.deploy is not None and isinstance(run.deploy.get("sha256"), str):
        return {"sha256": run.deploy["sha256"]}
    return None


def render_header(run: Run, generated: str) -> str:
    rows = "".join(
        f"<tr><th>{text(name)}</th><td>{text(value)}</td></tr>"
        for name, value in header_fields(run, generated)
    )
    return f'<table class="header">{rows}</table>'


def render_run(run: Run, generated: str = "") -> str:
    probe = run.probe
    verdict = probe.verdict if probe else ("deploy failed" if run.deploy else "not probed")
    css = verdict if verdict in ("healthy", "unhealthy", "unreachable") else "none"
    # The run's lifecycle state names it (FINISHED, FAILED, ...); the colour is the exit code's.
    shown = str(probe.state) if probe is not None and probe.state is not None else verdict
    reason = probe.reason if probe else run.summary
    parts = [
        f'<section class="run"><h1>{text(run.target)} '
        f'<span class="verdict {css}">{text(shown.upper())}</span></h1>',
        f'<p class="reason">{text(reason)}</p>',
        render_header(run, generated),
    ]
    if run.deploy is not None:
        ok = run.deploy.get("ok", True)
        what = "deployed" if ok else f"deploy failed: {run.deploy.get('error')}"
        parts.append(f'<p class="deploy">{text(what)}</p>')
    if probe is not None:
        parts.append(_probe_sections(probe, run.queue_names))
    parts.append("</section>")
    return "".join(parts)


def x_range_of(probe: ProbeResult, charts: list[tuple[str, list[Series]]]) -> tuple[float, float]:
    """Where the data is: the first reading (or the first poll) to the last poll. The warmup
    does not stretch it: a crash at 6 s of a 180 s warmup fills the chart, not a sliver."""
    xs = [x for _, series in charts for s in series for x, _ in s.points]
    start = probe.polls[0].at if probe.polls else 0.0
    last_poll = probe.polls[-1].at - start if probe.polls else 0.0
    return min([0.0, *xs]), max([*xs, last_poll, 1.0])


def _probe_sections(probe: ProbeResult, queue_names: Sequence[str]) -> str:
    settings = probe.settings
    timings = ", ".join(f"{k} {v}" for k, v in probe.timings().items())
    charts = chart_series(probe, queue_names)
    x_range = x_range_of(probe, charts)
    warmup = settings.wait if settings else None
    svgs = "".join(svg_chart(title, series, x_range, warmup) for title, series in charts)
    # Failing checks first: the reader opened the page to see why.
    ordered = sorted(probe.checks, key=lambda r: r.verdict is not Verdict.FAIL)
    rows = "".join(
        f'<tr><td><span class="verdict {text(r.verdict)}">{text(str(r.verdict).upper())}</span>'
        f'</td><td>{text(r.name)}</td><td class="observed">{text(r.observed)}</td>'
        f"<td>{text(r.expected)}</td></tr>"
        for r in ordered
    )
    failing = [r for r in probe.checks if r.verdict is Verdict.FAIL]
    lines = "\n".join(text(line) for line in probe.last_lines(40))
    return (
        _failing_section(failing)
        + f'<p class="meta">{text(timings)}; {len(failing)} failing check(s)</p>'
        f'<h2>Over time</h2><div class="charts">{svgs}</div>'
        '<h2>Checks</h2><table class="checks"><thead><tr><th>verdict</th><th>check</th>'
        f"<th>observed</th><th>expected</th></tr></thead><tbody>{rows}</tbody></table>"
        f'<h2>Last lines</h2><pre class="last-lines">{lines}</pre>'
    )


def _failing_section(failing: Sequence[Any]) -> str:
    """The failing checks with their evidence, above everything else."""
    if not failing:
        return ""
    items = "".join(
        f'<li><b>{text(r.name)}</b>: <span class="observed">{text(r.observed)}</span>'
        f'<br><span class="meta">expected {text(r.expected)}</span></li>'
        for r in failing
    )
    return f'<h2>Why it failed</h2><ul class="failing">{items}</ul>'


def render_html(runs: Sequence[Run], title: str = "launcher verify", generated: str = "") -> str:
    generated = generated or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    body = "".join(render_run(run, generated) for run in runs)
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{text(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )


def runs_from(
    outcomes: Sequence[Outcome],
    queue_names: dict[str, list[str]],
    places: dict[str, tuple[str, int]] | None = None,
) -> list[Run]:
    """The report's runs from what verify or smoke gave for each target; `places` gives each
    target's (host, vmid)."""
    runs = []
    for outcome in outcomes:
        host, vmid = (places or {}).get(outcome.target, ("", None))
        probe = outcome.data.get("probe")
        deploy = outcome.data.get("deploy")
        runs.append(
            Run(
                target=outcome.target,
                probe=probe if isinstance(probe, ProbeResult) else None,
                deploy=deploy if isinstance(deploy, dict) else None,
                queue_names=queue_names.get(outcome.target, []),
                summary=outcome.summary,
                host=host,
                vmid=vmid,
            )
        )
    return runs


def destination_problem(path: Path) -> str | None:
    """Why the page could not be written there, found before the probe starts (or None)."""
    folder = path.parent
    if path.is_dir():
        return f"{path} is a directory"
    if not folder.is_dir():
        return f"folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is not writable"
    return None


def write_report(path: Path, runs: Sequence[Run], title: str) -> None:
    """Write the page next to its destination first, so a reader never sees half of it."""
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(render_html(runs, title), encoding="utf-8")
        temp.replace(path)
    except OSError as exc:
        temp.unlink(missing_ok=True)
        raise UsageError(f"cannot write the report {path}: {exc.strerror or exc}") from None

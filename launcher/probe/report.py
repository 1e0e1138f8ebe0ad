"""Rendering of verify results: terminal text, JSON (schema launcher.verify/2) and JUnit XML."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from launcher.deploy.provenance import describe as describe_source
from launcher.deploy.provenance import describe_overrides
from launcher.output.termsafe import sanitize
from launcher.verify.gpus import status_text as gpus_status_text
from launcher.verify.history import history
from launcher.verify.lifecycle import State
from launcher.verify.prober import ProbeResult
from launcher.verify.results import CheckResult, Verdict
from launcher.verify.rules.text import spaced_rate
from launcher.verify.samples import Sample

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

SCHEMA_ID = "launcher.verify/2"
SPARKS = "▁▂▃▄▅▆▇█"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def sample_summary(sample: Sample, queue_names: Sequence[str]) -> dict[str, Any]:
    loss = sample.loss
    nonfinite: list[str] = []

    def finite(name: str, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            nonfinite.append(name)
            return None
        return value

    queues: dict[str, list[float | None] | None] = {}
    for name in queue_names:
        values = sample.numbers(name)
        queues[name] = None if values is None else [_finite(v) for v in values]
        if values and not all(math.isfinite(v) for v in values):
            nonfinite.append(f"queues.{name}")
    document: dict[str, Any] = {
        "index": sample.index,
        "elapsed_min": finite("elapsed_min", sample.elapsed_min),
        "step": sample.step,
        # JSON has no NaN: a non-finite loss is reported as a string so it stays visible.
        "loss": loss if loss is None or math.isfinite(loss) else str(loss),
        "throughput": finite("throughput", sample.throughput),
        "eta_seconds": _finite(sample.eta_seconds),
        "queues": queues,
    }
    if nonfinite:
        document["nonfinite"] = nonfinite
    return document


def check_json(result: CheckResult) -> dict[str, str]:
    document = {
        "name": result.name,
        "verdict": str(result.verdict),
        "observed": result.observed,
        "expected": result.expected,
    }
    if result.kind is not None:
        document["failure"] = str(result.kind)  # immediate | definite | pending
    return document


def to_json(target: str, probe: ProbeResult, queue_names: Sequence[str]) -> dict[str, Any]:
    """The documented machine-readable report (see README, "verify --json")."""
    return {
        "schema": SCHEMA_ID,
        "target": target,
        "verdict": probe.verdict,
        "state": None if probe.state is None else str(probe.state),
        "exit_code": int(probe.exit_code),
        "reason": probe.reason,
        "run": probe.run,
        "checks": [check_json(r) for r in probe.checks],
        "samples": [sample_summary(s, queue_names) for s in probe.samples],
        "timings": probe.timings(),
        "last_lines": probe.last_lines(),
    }


def to_junit(runs: Sequence[tuple[str, ProbeResult | None, dict[str, Any] | None]]) -> str:
    """JUnit XML: a test suite per target, a test case per check (and per deploy, for smoke).

    Each run is (target, probe or None, deploy report or None).
    """
    # Imported here: a status, or a verify without --junit, loads no XML library (~3 ms).
    import xml.etree.ElementTree as ET

    suites = ET.Element("testsuites")
    for target, probe, deploy in runs:
        suites.append(_junit_suite(target, probe, deploy))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _junit_suite(
    target: str, probe: ProbeResult | None, deploy: dict[str, Any] | None
) -> ET.Element:
    import xml.etree.ElementTree as ET

    classname = f"launcher.{target}"
    checks = probe.checks if probe else []
    failures = sum(r.verdict is Verdict.FAIL for r in checks)
    errors = 0
    suite = ET.Element("testsuite", name=classname)
    if deploy is not None:
        case = ET.SubElement(suite, "testcase", classname=classname, name="deploy")
        if not deploy.get("ok", True):
            errors += 1
            ET.SubElement(case, "error", message=str(deploy.get("error")), type="deploy")
    for result in checks:
        case = ET.SubElement(suite, "testcase", classname=classname, name=result.name)
        if result.verdict is Verdict.FAIL:
            failure = ET.SubElement(
                case, "failure", message=_junit_message(result), type="unhealthy"
            )
            failure.text = _junit_body(result, probe)
        elif result.verdict is Verdict.SKIP:
            ET.SubElement(case, "skipped", message=_xml_safe(result.observed))
        elif result.verdict is Verdict.WARN:
            ET.SubElement(case, "system-out").text = _xml_safe(
                f"warning: observed {result.observed}; expected {result.expected}"
            )
    if probe is not None and probe.verdict == "unreachable":
        errors += 1
        case = ET.SubElement(suite, "testcase", classname=classname, name="reachable")
        ET.SubElement(case, "error", message=probe.reason, type="unreachable")
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("errors", str(errors))
    suite.set("time", f"{probe.duration:.3f}" if probe else "0")
    return suite


# Lines a traceback may add above the tail so that it is shown whole, from its header.
TRACEBACK_REACH = 200
HEADER = "Traceback (most recent call last)"


def _xml_safe(text: str) -> str:
    """Container text for XML: terminal controls dropped (XML 1.0 cannot hold most of them)."""
    return sanitize(text, keep_sgr=False)


def _junit_message(result: CheckResult) -> str:
    """One whole line for the dashboard's summary; the full text is in the element's body."""
    first = result.observed.splitlines()[0] if result.observed else ""
    return _xml_safe(f"observed {first}; expected {result.expected}")


def _junit_body(result: CheckResult, probe: ProbeResult | None) -> str:
    parts = [f"observed: {result.observed}", f"expected: {result.expected}"]
    lines = whole_tail(probe) if probe else []
    if lines:
        parts.append("last lines:\n" + "\n".join(lines))
    return _xml_safe("\n".join(parts))


def whole_tail(probe: ProbeResult, count: int = 15) -> list[str]:
    """The last `count` lines, reaching back to the header of a traceback they start inside.

    A tail that begins in the middle of a traceback hides where it came from; whole lines of
    the capture are kept, at most TRACEBACK_REACH more.
    """
    lines = probe.last_lines(count + TRACEBACK_REACH)
    start = max(0, len(lines) - count)
    back = start
    while back > 0 and _in_traceback(lines[back]) and not lines[back].startswith(HEADER):
        back -= 1
    if back < start and lines[back].startswith(HEADER):
        return lines[back:]
    return lines[start:]


def _in_traceback(line: str) -> bool:
    return line[:1].isspace() or line.startswith(HEADER) or _chained(line)


def _chained(line: str) -> bool:
    """A line a traceback holds that is not indented: its exception, or the chaining note."""
    return line.startswith(("During handling", "The above exception")) or (
        ":" in line and line.split(":", 1)[0].replace(".", "").isidentifier()
    )


def sparkline(values: Sequence[float]) -> str:
    """Bars scaled from zero to the highest value: a plateau with a little noise looks flat.

    A min-max scale would draw +-2 % noise as the full range of bars; from zero it stays at
    the top. Negative values are drawn as zero, non-finite ones as "?".
    """
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    high = max(max(finite), 0.0) or 1.0
    top = len(SPARKS) - 1
    return "".join(
        SPARKS[min(top, max(0, round(v / high * top)))] if math.isfinite(v) else "?" for v in values
    )


def throughput_trend(probe: ProbeResult) -> list[float]:
    """Throughput over the whole probe, each status line counted once (see checks.history)."""
    values = [seen.sample.throughput for seen in history(probe.polls)]
    return [v for v in values if v is not None][-40:]


def format_rate(value: float | None, unit: str = "tok/s") -> str:
    """`27.9 Ktok/s`; a rate of another unit as it is counted (`1.12 it/s`)."""
    if value is None:
        return "?"
    if unit != "tok/s":
        return spaced_rate(value, unit)
    return f"{value / 1000:.1f} Ktok/s"


def latest_line(samples: Sequence[Sample], queue_names: Sequence[str]) -> str:
    """`step 12 · loss 2.31 · 27.9 Ktok/s · q_pre [8, 6, ...]` for the newest sample."""
    if not samples:
        return "no status lines yet"
    sample = samples[-1]
    parts = [f"step {sample.step if sample.step is not None else '?'}"]
    loss = sample.loss
    parts.append(f"loss {loss:.4g}" if loss is not None else "loss ?")
    parts.append(format_rate(sample.throughput, sample.throughput_unit))
    for name in queue_names:
        queue = sample.queue(name)
        if queue is None:
            continue
        kind, values = queue
        if kind == "buckets":
            parts.append(f"{name} [{', '.join(f'{v:g}' for v in values)}]")
        else:
            parts.append(f"{name} {values[0]:.0%}" if kind == "fill" else f"{name} {values[0]:g}")
    return " · ".join(parts)


def render_text(
    target: str, probe: ProbeResult, queue_names: Sequence[str], *, verbose: bool = False
) -> str:
    """The human report: verdict, throughput trend, the checks that did not pass (`verbose`:
    every check with its expectation) and, on failure, the last lines."""
    word = str(probe.state) if probe.state is not None else probe.verdict
    lines = [f"{target}: {word.upper()} (exit {int(probe.exit_code)}) — {probe.reason}"]
    if probe.samples:
        lines.append(f"  latest: {latest_line(probe.samples, queue_names)}")
    trend = throughput_trend(probe)
    if trend:
        unit = probe.samples[-1].throughput_unit if probe.samples else "tok/s"
        first, last = format_rate(trend[0], unit), format_rate(trend[-1], unit)
        lines.append(f"  throughput: {sparkline(trend)}  {first} → {last}")
    shown = [r for r in probe.checks if verbose or r.verdict is not Verdict.PASS]
    passed = [r.name for r in probe.checks if r.verdict is Verdict.PASS]
    if passed and len(shown) < len(probe.checks):
        which = f"all {len(passed)}" if len(passed) == len(probe.checks) else f"{len(passed)} more"
        lines.append(f"  checks: {which} passed (-v: each with its expectation)")
    width = max((len(r.name) for r in shown), default=4)
    for r in shown:
        # Multi-line observations (a dead pane's last lines) are shown in full below the table.
        observed = r.observed.splitlines()[0] if r.observed else ""
        lines.append(
            f"  {str(r.verdict).upper():<4}  {r.name:<{width}}  {observed}  (expected {r.expected})"
        )
    if probe.state is not State.HEALTHY and probe.last_lines():
        lines.append("  last lines:")
        lines.extend(f"    | {line}" for line in probe.last_lines())
    # The observations and last lines are the run's own output: safe for a terminal only so.
    return sanitize("\n".join(lines), keep_sgr=False)


def render_status(
    target: str,
    probe: ProbeResult,
    queue_names: Sequence[str],
    extra: dict[str, Any],
    *,
    verbose: bool = False,
) -> str:
    """`launcher status`: the probe text plus what deploy recorded and how fresh the log is."""
    lines = [render_text(target, probe, queue_names, verbose=verbose)]
    state = probe.latest.state if probe.latest else None
    if state is not None:
        pane = "no session" if not state.session_exists else "dead" if state.pane_dead else "alive"
        if state.pane_dead and state.exit_code is not None:
            pane += f" (exit {state.exit_code})"
        lines.append(f"  pane: {pane}")
        if state.gpus is not None:
            lines.append(f"  gpus: {gpus_status_text(state.gpus)}")
    age = extra.get("log_age")
    if isinstance(age, int | float):
        lines.append(f"  last output: {age:.0f} s ago")
    record = extra.get("record")
    if isinstance(record, dict):
        sha = str(record.get("sha256") or "?")[:12]
        lines.append(
            f"  deployed: sha256 {sha} at {record.get('time')} by {record.get('operator')}"
        )
        source = describe_source(record.get("source"))
        if source:
            lines.append(f"  source: {source}")
        overrides = describe_overrides(record)
        if overrides:
            lines.append(f"  overrides: {overrides}")
    return sanitize("\n".join(lines), keep_sgr=False)

"""Rendering of verify results: terminal text, JSON (schema launcher.verify/1) and JUnit XML."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from launcher.checks import CheckResult, Verdict
from launcher.status import Sample
from launcher.verify import ProbeResult

SCHEMA_ID = "launcher.verify/1"
SPARKS = "▁▂▃▄▅▆▇█"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def sample_summary(sample: Sample, queue_names: Sequence[str]) -> dict[str, Any]:
    loss = sample.loss
    return {
        "index": sample.index,
        "elapsed_min": sample.elapsed_min,
        "step": sample.step,
        # JSON has no NaN: a non-finite loss is reported as a string so it stays visible.
        "loss": loss if loss is None or math.isfinite(loss) else str(loss),
        "throughput": sample.throughput,
        "eta_seconds": _finite(sample.eta_seconds),
        "queues": {name: sample.numbers(name) for name in queue_names},
    }


def check_json(result: CheckResult) -> dict[str, str]:
    return {
        "name": result.name,
        "verdict": str(result.verdict),
        "observed": result.observed,
        "expected": result.expected,
    }


def to_json(target: str, probe: ProbeResult, queue_names: Sequence[str]) -> dict[str, Any]:
    """The documented machine-readable report (see README, "verify --json")."""
    return {
        "schema": SCHEMA_ID,
        "target": target,
        "verdict": probe.verdict,
        "exit_code": int(probe.exit_code),
        "reason": probe.reason,
        "checks": [check_json(r) for r in probe.checks],
        "samples": [sample_summary(s, queue_names) for s in probe.samples],
        "timings": probe.timings(),
        "last_lines": probe.last_lines(),
    }


def to_junit(target: str, probe: ProbeResult) -> str:
    """One test case per check; failures and warnings carry the observed/expected message."""
    suite = ET.Element(
        "testsuite",
        name=f"launcher.verify.{target}",
        tests=str(len(probe.checks)),
        failures=str(sum(r.verdict is Verdict.FAIL for r in probe.checks)),
        errors="1" if probe.verdict == "unreachable" else "0",
        time=f"{probe.duration:.3f}",
    )
    for result in probe.checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"launcher.verify.{target}", name=result.name
        )
        message = f"observed {result.observed}; expected {result.expected}"
        if result.verdict is Verdict.FAIL:
            failure = ET.SubElement(case, "failure", message=message, type="unhealthy")
            failure.text = "\n".join(probe.last_lines())
        elif result.verdict is Verdict.WARN:
            ET.SubElement(case, "system-out").text = f"warning: {message}"
    if probe.verdict == "unreachable":
        case = ET.SubElement(
            suite, "testcase", classname=f"launcher.verify.{target}", name="reachable"
        )
        ET.SubElement(case, "error", message=probe.reason, type="unreachable")
    suites = ET.Element("testsuites")
    suites.append(suite)
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def sparkline(values: Sequence[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    return "".join(
        SPARKS[min(len(SPARKS) - 1, int((v - low) / span * (len(SPARKS) - 1)))]
        if math.isfinite(v)
        else "?"
        for v in values
    )


def throughput_trend(probe: ProbeResult) -> list[float]:
    """Throughput over the probe: each earlier poll's newest value, then the latest capture."""
    values: list[float] = []
    for poll in probe.polls[:-1]:
        known = [s.throughput for s in poll.samples if s.throughput is not None]
        if known:
            values.append(known[-1])
    values.extend(s.throughput for s in probe.samples if s.throughput is not None)
    return values[-40:]


def format_rate(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value / 1000:.1f} Ktok/s"


def latest_line(samples: Sequence[Sample], queue_names: Sequence[str]) -> str:
    """`step 12 · loss 2.31 · 27.9 Ktok/s · q_pre [8, 6, ...]` for the newest sample."""
    if not samples:
        return "no status lines yet"
    sample = samples[-1]
    parts = [f"step {sample.step if sample.step is not None else '?'}"]
    loss = sample.loss
    parts.append(f"loss {loss:.4g}" if loss is not None else "loss ?")
    parts.append(format_rate(sample.throughput))
    for name in queue_names:
        values = sample.numbers(name)
        if values is not None:
            parts.append(f"{name} [{', '.join(f'{v:g}' for v in values)}]")
    return " · ".join(parts)


def render_text(target: str, probe: ProbeResult, queue_names: Sequence[str]) -> str:
    """The human report: verdict, checks, throughput trend and, on failure, the last lines."""
    lines = [f"{target}: {probe.verdict.upper()} (exit {int(probe.exit_code)}) — {probe.reason}"]
    if probe.samples:
        lines.append(f"  latest: {latest_line(probe.samples, queue_names)}")
    trend = throughput_trend(probe)
    if trend:
        lines.append(
            f"  throughput: {sparkline(trend)}  {format_rate(trend[0])} → {format_rate(trend[-1])}"
        )
    width = max((len(r.name) for r in probe.checks), default=4)
    for r in probe.checks:
        lines.append(
            f"  {str(r.verdict).upper():<4}  {r.name:<{width}}  {r.observed}"
            f"  (expected {r.expected})"
        )
    if probe.verdict != "healthy" and probe.last_lines():
        lines.append("  last lines:")
        lines.extend(f"    | {line}" for line in probe.last_lines())
    return "\n".join(lines)

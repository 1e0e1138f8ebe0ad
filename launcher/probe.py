"""Glue between a target and the probe loop: settings from the playbook, polls over SSH."""

from __future__ import annotations

import time
from dataclasses import dataclass

from launcher.checks import Poll, Verdict, evaluate, worst
from launcher.config import Target
from launcher.errors import ExitCode
from launcher.remote import ConnectionPool
from launcher.report import latest_line
from launcher.runops import container_for, poll_once
from launcher.status import parse_pane
from launcher.verify import PollEvent, Prober, ProbeResult, ProbeSettings


@dataclass(frozen=True)
class ProbeOverrides:
    wait: float | None = None
    interval: float | None = None
    window: float | None = None
    successes: int | None = None


def settings_for(target: Target, overrides: ProbeOverrides) -> ProbeSettings:
    v = target.playbook.spec.verify
    return ProbeSettings(
        wait=v.wait if overrides.wait is None else overrides.wait,
        interval=v.interval if overrides.interval is None else overrides.interval,
        window=v.window if overrides.window is None else overrides.window,
        successes=v.successes if overrides.successes is None else overrides.successes,
    )


def probe_target(target: Target, overrides: ProbeOverrides, *, live: bool) -> ProbeResult:
    """Run the startup probe against one target over one SSH connection."""
    from launcher.ui import ProbeDisplay

    spec = target.playbook.spec.verify
    settings = settings_for(target, overrides)
    queues = list(spec.queues)
    with ConnectionPool() as pool, ProbeDisplay(target.name, enabled=live) as display:
        container = container_for(target, pool.get(target.host_name, target.host))

        def poll():  # type: ignore[no-untyped-def]
            return poll_once(container, target, spec.lines)[0]

        def show(event: PollEvent) -> None:
            display.update(event, latest_line(event.poll.samples if event.poll else (), queues))

        return Prober(poll, spec, settings, on_event=show).run()


def status_once(target: Target) -> ProbeResult:
    """One poll judged at once (no warmup, no waiting)."""
    spec = target.playbook.spec.verify
    with ConnectionPool() as pool:
        container = container_for(target, pool.get(target.host_name, target.host))
        state, _answer = poll_once(container, target, spec.lines)
    poll = Poll(at=time.monotonic(), state=state, samples=tuple(parse_pane(state.capture)))
    checks = evaluate([poll], spec)
    verdict = worst(checks)
    code = ExitCode.UNHEALTHY if verdict is Verdict.FAIL else ExitCode.OK
    return ProbeResult(
        verdict="unhealthy" if code else "healthy",
        exit_code=code,
        reason="one poll (status)",
        checks=checks,
        polls=[poll],
        settings=settings_for(target, ProbeOverrides(wait=0, window=0, successes=1)),
    )

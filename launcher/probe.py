"""Verify, status and smoke as per-target workflows: settings from the playbook, polls over SSH."""

from __future__ import annotations

import time
from dataclasses import dataclass

from launcher.checks import Poll, Verdict, evaluate, worst
from launcher.config import Target
from launcher.deploy import DeployOptions, deploy_work
from launcher.errors import ExitCode, LauncherError
from launcher.fleet import FleetContext, Outcome, Work
from launcher.report import format_rate, latest_line
from launcher.runops import container_for, poll_once
from launcher.status import parse_pane
from launcher.ui import progress_text
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


def probe_summary(probe: ProbeResult) -> str:
    samples = probe.samples
    if probe.verdict == "healthy" and samples:
        latest = samples[-1]
        return f"healthy: step {latest.step}, {format_rate(latest.throughput)}"
    return f"{probe.verdict}: {probe.reason}"


def run_probe(ctx: FleetContext, overrides: ProbeOverrides) -> ProbeResult:
    """The startup probe on one target over the context's connection."""
    target = ctx.target
    spec = target.playbook.spec.verify
    queues = list(spec.queues)
    container = container_for(target, ctx.conn)

    def poll():  # type: ignore[no-untyped-def]
        return poll_once(container, target, spec.lines)[0]

    def show(event: PollEvent) -> None:
        ctx.say(progress_text(event, latest_line(event.poll.samples if event.poll else (), queues)))

    settings = settings_for(target, overrides)
    return Prober(poll, spec, settings, on_event=show, sleep=ctx.sleep).run()


def verify_work(overrides: ProbeOverrides) -> Work:
    def work(ctx: FleetContext) -> Outcome:
        probe = run_probe(ctx, overrides)
        return Outcome(ctx.target.name, probe.exit_code, probe_summary(probe), {"probe": probe})

    return work


def status_work(ctx: FleetContext) -> Outcome:
    """One poll judged at once (no warmup, no waiting), plus what deploy recorded."""
    target = ctx.target
    spec = target.playbook.spec.verify
    state, answer = poll_once(container_for(target, ctx.conn), target, spec.lines)
    poll = Poll(at=time.monotonic(), state=state, samples=tuple(parse_pane(state.capture)))
    checks = evaluate([poll], spec)
    code = ExitCode.UNHEALTHY if worst(checks) is Verdict.FAIL else ExitCode.OK
    probe = ProbeResult(
        verdict="unhealthy" if code else "healthy",
        exit_code=code,
        reason="one poll (status)",
        checks=checks,
        polls=[poll],
        settings=settings_for(target, ProbeOverrides(wait=0, window=0, successes=1)),
    )
    extra = {"record": answer.get("record"), "log_age": answer.get("log_age")}
    summary = latest_line(poll.samples, list(spec.queues)) if poll.samples else probe.reason
    if not state.session_exists:
        summary = f"no session '{target.playbook.spec.session}'"
    return Outcome(target.name, code, summary, {"probe": probe, **extra})


def smoke_work(overrides: ProbeOverrides) -> Work:
    """`deploy --restart` then `verify` on one target, for CI."""
    deploy = deploy_work(DeployOptions(restart=True))
    verify = verify_work(overrides)

    def work(ctx: FleetContext) -> Outcome:
        try:
            deployed = deploy(ctx)
        except LauncherError as error:
            return Outcome(
                ctx.target.name,
                error.exit_code,
                f"deploy failed: {error.message}",
                {
                    "deploy": {
                        "ok": False,
                        "exit_code": int(error.exit_code),
                        "error": error.message,
                    }
                },
            )
        verified = verify(ctx)
        return Outcome(
            ctx.target.name,
            verified.exit_code,
            verified.summary,
            {"deploy": deployed.data, "probe": verified.data["probe"]},
        )

    return work

"""Verify, status and smoke as per-target workflows: settings from the playbook, polls over SSH."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from launcher.agentclient import container_for
from launcher.config import Target
from launcher.deploy import DeployOptions, deploy_work
from launcher.errors import LauncherError
from launcher.fleet import FleetContext, Outcome, Work
from launcher.ui import progress_text
from launcher.verify.checks import (
    CheckResult,
    Failure,
    Judge,
    PaneState,
    Poll,
)
from launcher.verify.gpus import status_text as gpus_status_text
from launcher.verify.lifecycle import State, ended, status_exit, verdict_word
from launcher.verify.parse import parse_pane
from launcher.verify.policy import counted
from launcher.verify.poll import poll_once
from launcher.verify.prober import (
    ParseFn,
    PollEvent,
    Prober,
    ProbeResult,
    ProbeSettings,
)
from launcher.verify.report import format_rate, latest_line
from launcher.verify.samples import RowMemo, Sample


@dataclass(frozen=True)
class ProbeOverrides:
    wait: float | None = None
    interval: float | None = None
    window: float | None = None
    successes: int | None = None
    failure_threshold: int | None = None


def settings_for(target: Target, overrides: ProbeOverrides) -> ProbeSettings:
    v = target.playbook.spec.verify
    return ProbeSettings(
        wait=v.wait if overrides.wait is None else overrides.wait,
        interval=v.interval if overrides.interval is None else overrides.interval,
        window=v.window if overrides.window is None else overrides.window,
        successes=v.successes if overrides.successes is None else overrides.successes,
        failure_threshold=(
            v.failure_threshold
            if overrides.failure_threshold is None
            else overrides.failure_threshold
        ),
        poll_timeout=target.host.command_timeout,
    )


def parser_for(target: Target) -> ParseFn:
    """How this target's status lines are read: the playbook's `status:` section, if any.

    Each parser remembers what the previous capture's lines read to, so a poll parses only
    the rows that are new since (a capture repeats most of the one before it).
    """
    status = getattr(target.playbook.spec, "status", None)
    memo = RowMemo()

    def parse(text: str, width: int | None) -> list[Sample]:
        # Rows are re-joined only where the pane's own width says they were wrapped.
        return parse_pane(text, status, width=width, memo=memo)

    return parse


def probe_summary(probe: ProbeResult) -> str:
    samples = probe.samples
    if probe.state is State.HEALTHY and samples:
        latest = samples[-1]
        return f"healthy: step {latest.step}, {format_rate(latest.throughput)}"
    word = probe.verdict if probe.state is None else str(probe.state)
    return f"{word}: {probe.reason}"


def progress_line(event: PollEvent, queues: list[str], threshold: int) -> str:
    """The live line after a poll: phase, newest sample and, when failing, how far along."""
    if event.phase == "replacing":
        return f"{event.elapsed:5.0f}s waiting: {event.error}"
    line = progress_text(event, latest_line(event.poll.samples if event.poll else (), queues))
    if event.failing:
        names = sorted(r.name for r in event.results if r.kind is Failure.DEFINITE)
        line += f" · failing {event.failing}/{threshold}: {', '.join(names)}"
    return line


def run_probe(
    ctx: FleetContext, overrides: ProbeOverrides, *, expected_run: str | None = None
) -> ProbeResult:
    """The startup probe on one target over the context's connection.

    `expected_run` pins the run to judge (smoke knows it from its deploy); without it the probe
    pins the first run it sees.
    """
    target = ctx.target
    settings = settings_for(target, overrides)
    # --failure-threshold also sets how many polls a queue may stay empty.
    spec = target.playbook.spec.verify.model_copy(
        update={"failure_threshold": settings.failure_threshold}
    )
    queues = list(spec.queues)
    container = container_for(target, ctx.conn)
    records: list[dict[str, Any] | None] = [None]

    def poll(timeout: float) -> PaneState:
        state, answer = poll_once(container, target, spec.lines, timeout=timeout)
        records[0] = answer.get("record")
        return state

    def show(event: PollEvent) -> None:
        ctx.say(progress_line(event, queues, settings.failure_threshold))

    result = Prober(
        poll,
        spec,
        settings,
        on_event=show,
        sleep=ctx.sleep,
        parse=parser_for(target),
        expected_run=expected_run,
        history_lines=spec.lines,
    ).run()
    result.record = records[0]
    return result


def verify_work(overrides: ProbeOverrides) -> Work:
    def work(ctx: FleetContext) -> Outcome:
        probe = run_probe(ctx, overrides)
        return Outcome(ctx.target.name, probe.exit_code, probe_summary(probe), {"probe": probe})

    return work


def status_state(
    state: PaneState, checks: list[CheckResult], wait: float, window: float
) -> tuple[State, str]:
    """One poll's lifecycle state and why (see launcher.verify.lifecycle).

    A running session is judged at once, except that a run within its warmup (`wait` seconds
    since tmux created its session), or still without a status line while its window lasts, is
    `starting` unless a crash, a fatal sign or a restart already shows. Any other failing check,
    of any kind, is unhealthy.
    """
    failing = [f"{r.name}: {r.observed.splitlines()[0]}" for r in checks if r.kind is not None]
    if state.deploy_lock:
        return State.DEPLOYING, f"a deploy is in progress (lock held by {state.deploy_lock})"
    over = ended(state)
    if over is State.FINISHED:
        return over, "the run finished (exit 0)"
    if over is not None:
        return over, "; ".join(failing) or str(over)
    if not failing:
        return State.HEALTHY, "one poll (status)"
    early = any(r.kind is not None for r in counted(checks, judging=False))
    age = state.age
    if not early and age is not None:
        silent = not any(r.name == "samples" and r.kind is None for r in checks)
        if age < wait:
            return State.STARTING, f"within its warmup ({age:.0f} s of {wait:g} s)"
        if silent and age < wait + window:
            return State.STARTING, f"no status line yet ({age:.0f} s since it started)"
    return State.UNHEALTHY, "; ".join(failing)


def status_work(ctx: FleetContext) -> Outcome:
    """One poll judged at once (no waiting), plus what deploy recorded; see `status_state`.

    Its deadline is the host's `command_timeout`.
    """
    target = ctx.target
    spec = target.playbook.spec.verify
    state, answer = poll_once(container_for(target, ctx.conn), target, spec.lines)
    samples = tuple(parser_for(target)(state.capture, state.pane_width))
    poll = Poll(at=time.monotonic(), state=state, samples=samples)
    checks = Judge(spec, history_lines=spec.lines).add(poll)
    lifecycle, reason = status_state(state, checks, spec.wait, spec.window)
    code = status_exit(lifecycle)
    probe = ProbeResult(
        verdict=verdict_word(code),
        exit_code=code,
        reason=reason,
        checks=checks,
        polls=[poll],
        settings=settings_for(target, ProbeOverrides(wait=0, window=0, successes=1)),
        run=state.run,
        state=lifecycle,
        record=answer.get("record"),
    )
    extra: dict[str, Any] = {"record": answer.get("record"), "log_age": answer.get("log_age")}
    # The table of several targets shows this: the reason when unhealthy, else the figures.
    summary = probe.reason
    if not code and poll.samples:
        summary = latest_line(poll.samples, list(spec.queues))
    if not state.session_exists:
        summary = f"no session '{target.playbook.spec.session}'"
    elif state.gpus is not None:
        summary += " | " + gpus_status_text(state.gpus)
        extra["gpus"] = answer.get("gpus")
    return Outcome(target.name, code, summary, {"probe": probe, **extra})


def deployed_run(data: dict[str, Any]) -> str | None:
    """The run marker a deploy report says it launched."""
    launched = (data.get("result") or {}).get("launched") or {}
    run = launched.get("run") if isinstance(launched, dict) else None
    return run if isinstance(run, str) else None


def smoke_work(overrides: ProbeOverrides, *, wait_lock: float = 0.0) -> Work:
    """`deploy --restart` then `verify` of the run that deploy started, on one target, for CI."""
    deploy = deploy_work(DeployOptions(restart=True, wait_lock=wait_lock))

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
        probe = run_probe(ctx, overrides, expected_run=deployed_run(deployed.data))
        return Outcome(
            ctx.target.name,
            probe.exit_code,
            probe_summary(probe),
            {"deploy": deployed.data, "probe": probe},
        )

    return work

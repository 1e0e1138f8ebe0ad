"""Verify, status and smoke as per-target workflows: settings from the playbook, polls over SSH."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.core.errors import ExitCode, LauncherError
from launcher.core.requests import (
    DeployOptions,
    ProbeOverrides,
    SmokeRequest,
    StatusRequest,
    VerifyRequest,
)
from launcher.output.ui import progress_text
from launcher.probe.poll import poll_once
from launcher.probe.report import format_rate, latest_line, to_json
from launcher.targets.fleet import FleetContext, Outcome
from launcher.verify.checks import Judge
from launcher.verify.gpus import status_text as gpus_status_text
from launcher.verify.lifecycle import State, ended, status_exit, verdict_word
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.policy import counted
from launcher.verify.prober import (
    ParseFn,
    PollEvent,
    Prober,
    ProbeResult,
    ProbeSettings,
)
from launcher.verify.results import CheckResult, Failure
from launcher.verify.samples import RowMemo, Sample

if TYPE_CHECKING:
    from launcher.deploy.deploy import DeployReport


@dataclass
class VerifyResult(ProbeResult):
    """A probe of one target, with what its JSON form and summary need."""

    target: str = ""
    queues: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, probe: ProbeResult, target: Target) -> VerifyResult:
        values = {f.name: getattr(probe, f.name) for f in fields(ProbeResult)}
        return cls(**values, target=target.name, queues=list(target.playbook.spec.verify.queues))

    @property
    def summary(self) -> str:
        return probe_summary(self)

    def to_json(self) -> dict[str, Any]:
        return to_json(self.target, self, self.queues)


@dataclass
class StatusResult:
    """One poll of the run, judged at once, plus what the last deploy recorded."""

    exit_code: ExitCode
    summary: str
    probe: ProbeResult
    record: dict[str, Any] | None = None  # the newest deploy record in the container
    log_age: float | None = None  # seconds since the run's log was last written
    target: str = ""
    queues: list[str] = field(default_factory=list)
    gpus: Any = None  # the poll's GPU facts (protocol.PollGpus), when it has them
    has_gpus: bool = False

    @property
    def healthy(self) -> bool:
        """Nothing wrong: healthy, starting, deploying or finished (see `state`)."""
        return self.exit_code == ExitCode.OK

    @property
    def state(self) -> State | None:
        """Where the run is in its life (launcher.verify.lifecycle)."""
        return self.probe.state

    def details(self) -> dict[str, Any]:
        """What `render_status` shows besides the probe."""
        extra: dict[str, Any] = {"record": self.record, "log_age": self.log_age}
        if self.has_gpus:
            extra["gpus"] = self.gpus
        return extra

    def to_json(self) -> dict[str, Any]:
        document = to_json(self.target, self.probe, self.queues)
        document["deployed"] = self.record
        document["log_age"] = self.log_age
        if self.has_gpus:
            document["gpus"] = self.gpus
        return document


@dataclass
class SmokeResult:
    """A smoke check: the deploy's report and the probe of the run it started; or the error
    that stopped the deploy (no probe then)."""

    exit_code: ExitCode
    deploy: DeployReport | None
    probe: VerifyResult | None
    target: str = ""
    deploy_error: LauncherError | None = None
    # With --rollback-on-failure (launcher.operate.redeploy): what happened, the rollback's story.
    rolled: RollbackStory | None = None

    @property
    def healthy(self) -> bool:
        return self.exit_code == ExitCode.OK

    @property
    def summary(self) -> str:
        if self.deploy_error is not None or self.probe is None:
            message = self.deploy_error.message if self.deploy_error else "not deployed"
            return f"deploy failed: {message}"
        if self.rolled is not None and self.rolled.outcome != "deployed":
            return self.rolled.summary
        return self.probe.summary

    def deploy_json(self) -> dict[str, Any]:
        if self.deploy is not None:
            return self.deploy.to_json()
        error = self.deploy_error
        return {
            "ok": False,
            "exit_code": int(error.exit_code if error else self.exit_code),
            "error": error.message if error else self.summary,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "exit_code": int(self.exit_code),
            "deploy": self.deploy_json(),
            "verify": None if self.probe is None else self.probe.to_json(),
            **(self.rolled.to_json() if self.rolled is not None else {}),
        }


@dataclass
class RollbackStory:
    """After a probe of a new run: `outcome` (deployed | unhealthy | rolled_back |
    rolled_back_unhealthy | rollback_failed), the rollback's JSON (or its error) and the probe
    of the run it put back."""

    outcome: str
    summary: str
    rollback: dict[str, Any] | None = None
    rollback_error: str | None = None
    rollback_probe: VerifyResult | None = None

    def to_json(self) -> dict[str, Any]:
        probe = self.rollback_probe
        return {
            "outcome": self.outcome,
            "rollback": self.rollback,
            "rollback_error": self.rollback_error,
            "rollback_verify": None if probe is None else probe.to_json(),
        }


def settings_for(target: Target, overrides: ProbeOverrides) -> ProbeSettings:
    v = target.playbook.spec.verify
    names = ("wait", "interval", "window", "successes", "failure_threshold")
    chosen = {
        n: getattr(v, n) if getattr(overrides, n) is None else getattr(overrides, n) for n in names
    }
    return ProbeSettings(**chosen, poll_timeout=target.host.command_timeout, finish_ok=v.finish_ok)


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
        return (
            f"healthy: step {latest.step}, {format_rate(latest.throughput, latest.throughput_unit)}"
        )
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


def unread_note(event: PollEvent) -> str | None:
    """The `samples` check's note when the pane's lines read as status lines of another
    shape than the playbook's (its observation quotes two and carries the block)."""
    for result in event.checks:
        if result.name == "samples" and result.kind is Failure.IMMEDIATE:
            return f"the trainer's lines are not read: {result.observed}"
    return None


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

    noted: set[str] = set()

    def show(event: PollEvent) -> None:
        ctx.say(progress_line(event, queues, settings.failure_threshold))
        note = unread_note(event)
        block = note.partition("\n")[2] if note is not None else ""
        if note is not None and block not in noted:
            noted.add(block)  # said once (per block), in the warmup: the verdict follows it
            ctx.say(note)

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


def run_verify(ctx: FleetContext, request: VerifyRequest) -> VerifyResult:
    """`launcher verify` on the context's target: the startup probe."""
    return VerifyResult.of(run_probe(ctx, request), ctx.target)


def verify_row(ctx: FleetContext, result: VerifyResult) -> Outcome:
    return Outcome(
        ctx.target.name, result.exit_code, result.summary, {"probe": result}, value=result
    )


def status_state(
    state: PaneState, checks: list[CheckResult], wait: float, window: float
) -> tuple[State, str]:
    """One poll's lifecycle state and why (see launcher.verify.lifecycle).

    A running session is judged at once, except that a run within its warmup (`wait` seconds
    since tmux created its session), or still without a status line while its window lasts, is
    `starting` unless a crash, a fatal sign or a restart already shows, or its lines read as
    another format's. Any other failing check, of any kind, is unhealthy.
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
        # No status line yet, and no other format reads the lines either (those fail).
        silent = any(r.name == "samples" and r.kind is Failure.PENDING for r in checks)
        if age < wait:
            return State.STARTING, f"within its warmup ({age:.0f} s of {wait:g} s)"
        if silent and age < wait + window:
            return State.STARTING, f"no status line yet ({age:.0f} s since it started)"
    return State.UNHEALTHY, "; ".join(failing)


def run_status(ctx: FleetContext, request: StatusRequest | None = None) -> StatusResult:
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
    result = StatusResult(
        code,
        probe.reason,
        probe,
        answer.get("record"),
        answer.get("log_age"),
        target=target.name,
        queues=list(spec.queues),
    )
    # The table of several targets shows this: the reason when unhealthy, else the figures.
    if not code and poll.samples:
        result.summary = latest_line(poll.samples, list(spec.queues))
    if not state.session_exists:
        result.summary = f"no session '{target.playbook.spec.session}'"
    elif state.gpus is not None:
        result.summary += " | " + gpus_status_text(state.gpus)
        result.gpus, result.has_gpus = answer.get("gpus"), True
    return result


def status_row(ctx: FleetContext, result: StatusResult) -> Outcome:
    data = {"probe": result.probe, **result.details()}
    return Outcome(ctx.target.name, result.exit_code, result.summary, data, value=result)


def status_work(ctx: FleetContext) -> Outcome:
    """`launcher status` as a fleet's work: one poll, one row."""
    return status_row(ctx, run_status(ctx, StatusRequest()))


def deployed_run(data: dict[str, Any]) -> str | None:
    """The run marker a deploy report says it launched."""
    launched = (data.get("result") or {}).get("launched") or {}
    run = launched.get("run") if isinstance(launched, dict) else None
    return run if isinstance(run, str) else None


def run_smoke(ctx: FleetContext, request: SmokeRequest) -> SmokeResult:
    """`launcher smoke` on the context's target, for CI: `deploy --restart`, then the probe of
    the run that deploy started. A deploy that fails is the result (its error kept), not an
    exception: the report still has the target's item."""
    from launcher.deploy.deploy import run_deploy  # smoke's own: not loaded by verify/status

    try:
        report = run_deploy(ctx, DeployOptions(restart=True, wait_lock=request.wait_lock))
    except LauncherError as error:
        return SmokeResult(error.exit_code, None, None, ctx.target.name, error)
    probe = run_probe(ctx, request, expected_run=deployed_run(report.to_json()))
    verified = VerifyResult.of(probe, ctx.target)
    return SmokeResult(verified.exit_code, report, verified, ctx.target.name)


def smoke_row(ctx: FleetContext, result: SmokeResult) -> Outcome:
    data: dict[str, Any] = {"deploy": result.deploy_json()}
    if result.probe is not None:
        data["probe"] = result.probe
    return Outcome(ctx.target.name, result.exit_code, result.summary, data, value=result)

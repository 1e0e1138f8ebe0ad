"""`launcher stop`: the deploy's graceful stop on its own (C-c, wait, kill what is left), the
run's processes and GPUs confirmed free; checkpoints are not touched."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient, container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode
from launcher.core.requests import StopRequest
from launcher.deploy.deploy import operator_info
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context, Step


@dataclass
class StopResult:
    exit_code: ExitCode
    summary: str
    session: str
    stopped: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def line(self) -> str:
        """The summary as `launcher stop` prints it (and a fleet's row)."""
        stopped_something = bool(self.steps) and not self.exit_code
        return self.summary + ("; checkpoints untouched" if stopped_something else "")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exit_code": int(self.exit_code)}


def run_stop(ctx: Context, request: StopRequest) -> StopResult:
    """`launcher stop` on the context's target: its steps and warnings to the context."""
    result = stop(ctx.target, ctx.conn, grace=request.grace)
    for step in result.steps:
        ctx.step(step)
    for warning in result.warnings:
        ctx.step(Step("warning", "warning", warning))
    return result


def stop_row(ctx: Context, result: StopResult) -> Outcome:
    return Outcome(ctx.target.name, result.exit_code, result.line, value=result)


def stop(
    target: Target,
    conn: HostConnection,
    *,
    grace: float | None = None,
    expect_run: str | None = None,
) -> StopResult:
    """The deploy's graceful stop on its own: C-c, wait, kill the session and what is left of
    the run's processes, confirm they (and their GPUs) are gone. Checkpoints are not touched.
    Only the run `expect_run` names is stopped (None: the one live now, as a poll sees it)."""
    spec = target.playbook.spec
    wait = spec.stop_grace if grace is None else grace
    agent = AgentClient(container_for(target, conn))
    request: p.StopRequest = {
        "op": "stop",
        "workdir": spec.workdir,
        "session": spec.session,
        "grace": wait,
        "gpus": spec.gpus,
        "cuda_visible_devices": spec.env.get("CUDA_VISIBLE_DEVICES", ""),
        "lock_path": p.LOCK_PATH,
        "operator": operator_info(),
        # The run live now is the one this stop is for: one that replaced it meanwhile (a
        # deploy while this request was held up on the way) is not touched.
        "expect_run": expect_run or live_run(agent, target, conn.endpoint.command_timeout),
    }
    answer = agent.stop(request, timeout=wait + 30 + conn.endpoint.command_timeout)
    report: dict[str, Any] = dict(answer["stopped"])
    result = StopResult(ExitCode.OK, "", spec.session, report)
    result.warnings = [str(w) for w in answer.get("warnings") or []]
    pids = ", ".join(str(p) for p in report.get("pids") or []) or "none"
    if not report.get("session_existed") and not report.get("pids"):
        result.summary = f"no session '{spec.session}' on {target.label}: nothing to stop"
        return result
    how = "forced (C-c was not enough)" if report.get("forced") else "exited after C-c"
    result.steps.append(Step("stop", "ok", f"session {spec.session}: {how}; pids {pids}"))
    leftover = [int(p) for p in report.get("leftover") or []]
    holders = report.get("gpu_holders") or []
    # Not the run's, so not stopped; the GPUs are not free all the same.
    others = report.get("gpu_others") or []
    # Memory still in use on the run's GPUs with no holder here: another CT or the host.
    outside = report.get("gpu_outside") or []
    if leftover:
        result.steps.append(
            Step("processes", "failed", "still alive: " + ", ".join(map(str, leftover)))
        )
    else:
        result.steps.append(Step("processes", "ok", "none left"))
    if spec.gpus <= 0:
        gpus = Step("gpus", "skipped", "not checked (playbook gpus: 0)")
    elif holders:
        held = ", ".join(f"{h.get('pid')} {h.get('name')}" for h in holders)
        gpus = Step("gpus", "failed", f"still held by {held}")
    elif others:
        held = ", ".join(f"{h.get('pid')} ({h.get('command') or h.get('name')})" for h in others)
        gpus = Step("gpus", "failed", f"in use by processes outside the run: {held}")
    elif outside:
        used = ", ".join(f"GPU {d.get('index')} ({d.get('used_mib')} MiB)" for d in outside)
        gpus = Step("gpus", "failed", f"still in use from outside this container: {used}")
    else:
        gpus = Step("gpus", "ok", "free")
    result.steps.append(gpus)
    if leftover or holders:
        result.exit_code = ExitCode.UNREACHABLE
        result.summary = f"session '{spec.session}' did not stop completely on {target.label}"
    elif others or outside:
        result.exit_code = ExitCode.UNREACHABLE
        result.summary = (
            f"stopped session '{spec.session}' on {target.label} (pids {pids}), but its GPUs "
            "are still in use by processes outside the run"
            + (" (outside this container)" if outside and not others else "")
        )
    else:
        result.summary = f"stopped session '{spec.session}' on {target.label} (pids {pids})"
    return result


def live_run(agent: AgentClient, target: Target, timeout: float) -> str | None:
    """The run the target's session runs now (its marker; None: a session launcher did not
    start, or none), as one poll sees it."""
    spec = target.playbook.spec
    request: p.PollRequest = {
        "op": "poll",
        "workdir": spec.workdir,
        "session": spec.session,
        "lines": 1,
    }
    return agent.poll(request, timeout=timeout)["session"]["run"]

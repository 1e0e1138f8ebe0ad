"""Redeploy without fear: `deploy --verify [--rollback-on-failure]` and `smoke
--rollback-on-failure`.

Deploy; probe the new run; if the probe fails and rollback was asked, put the previous run back
(its script or release, command, environment and overrides, its archived checkpoints moved back
in place) and probe it again. Each step goes to the context as it happens and into the result;
the container's history has the deploy and the rollback (with why). A rollback that would be
impossible is refused by the deploy transaction itself, before anything is stopped
(`rollback_guard`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from launcher.core.errors import ExitCode, LauncherError
from launcher.core.requests import DeployOptions, ProbeOverrides, SmokeRequest
from launcher.deploy.deploy import DeployReport
from launcher.deploy.deploy import run_deploy as plain_run_deploy
from launcher.operate.rollback import RunBack, rollback
from launcher.probe import workflows
from launcher.probe.workflows import (
    RollbackStory,
    SmokeResult,
    VerifyResult,
    deployed_run,
    run_probe,
)
from launcher.targets.fleet import FleetContext
from launcher.targets.workflow import Context, Step


@dataclass
class VerifiedDeploy(DeployReport):
    """`deploy --verify`: the deploy's report, the probe of its run, and what followed (its
    steps are the deploy's and then the rollback's)."""

    code: ExitCode = ExitCode.OK
    probe: VerifyResult | None = None
    story: RollbackStory | None = None

    @property
    def exit_code(self) -> ExitCode:
        return self.code

    def to_json(self) -> dict[str, Any]:
        healthy = self.code == ExitCode.OK
        return {
            **DeployReport.to_json(self),
            "ok": healthy,
            "exit_code": int(self.code),
            "error": None if healthy else self.summary,
            "verify": None if self.probe is None else self.probe.to_json(),
            **(self.story.to_json() if self.story is not None else {}),
        }


def run_deploy(ctx: Context, request: DeployOptions) -> DeployReport:
    """`launcher deploy`: the plain deploy, or with `verify` (or `rollback_on_failure`) the
    deploy, the probe of its run and, with `rollback_on_failure`, the rollback on failure."""
    if not (request.verify or request.rollback_on_failure) or request.dry_run:
        return plain_run_deploy(ctx, request)
    steps: list[Step] = []

    def step(item: Step) -> None:
        if item.status != "progress":
            steps.append(item)
        ctx.step(item)

    recording = dataclasses.replace(ctx, on_step=step)  # every step kept for the result
    report = plain_run_deploy(recording, request)
    probe, story = probe_then_roll_back(
        recording, report, ProbeOverrides(), rollback_on_failure=request.rollback_on_failure
    )
    return VerifiedDeploy(
        target=report.target,
        steps=steps,
        sha256=report.sha256,
        result=report.result,
        summary=story.summary,
        code=EXIT_CODES.get(story.outcome, probe.exit_code),
        probe=probe,
        story=story,
    )


def run_smoke(ctx: FleetContext, request: SmokeRequest) -> SmokeResult:
    """`launcher smoke`: deploy --restart and the probe; with `rollback_on_failure`, the
    previous run put back when the probe fails (and refused before any change when it could
    not be)."""
    if not request.rollback_on_failure:
        return workflows.run_smoke(ctx, request)
    options = DeployOptions(restart=True, wait_lock=request.wait_lock, rollback_on_failure=True)
    try:
        report = plain_run_deploy(ctx, options)
    except LauncherError as error:
        return SmokeResult(error.exit_code, None, None, ctx.target.name, error)
    probe, story = probe_then_roll_back(ctx, report, request, rollback_on_failure=True)
    code = EXIT_CODES.get(story.outcome, probe.exit_code)
    return SmokeResult(code, report, probe, ctx.target.name, rolled=story)


# The outcome of a deploy whose new run failed its probe and was rolled back, as an exit code.
EXIT_CODES = {
    "deployed": ExitCode.OK,
    "rolled_back": ExitCode.ROLLED_BACK,
    "rolled_back_unhealthy": ExitCode.ROLLED_BACK_UNHEALTHY,
    "rollback_failed": ExitCode.ROLLBACK_FAILED,
}


def probe_then_roll_back(
    ctx: FleetContext,
    report: DeployReport,
    overrides: ProbeOverrides,
    *,
    rollback_on_failure: bool,
) -> tuple[VerifyResult, RollbackStory]:
    """The probe of the run `report` launched; if it fails and rollback was asked: the run it
    replaced put back (only while the new one is still the session's run) and probed."""
    target = ctx.target
    new_run = deployed_run(report.to_json())
    probe = VerifyResult.of(run_probe(ctx, overrides, expected_run=new_run), target)
    if probe.exit_code == ExitCode.OK:
        return probe, RollbackStory("deployed", report.summary + f"; run {new_run} healthy")
    if not rollback_on_failure:
        return probe, RollbackStory("unhealthy", probe.summary)
    old_run = report.result.get("replaced")
    why = f"run {new_run} failed its startup probe: {probe.reason}"
    ctx.step(Step("rollback", "warning", f"{why}; putting {old_run} back"))
    back = RunBack(
        to_run=old_run,
        need_spec=True,
        expect_run=new_run,
        record={"rollback_reason": why, "rolled_back_run": new_run},
    )
    try:
        done = rollback(
            target, ctx.conn, restart=True, restore_checkpoints=True, back=back, on_step=ctx.step
        )
    except LauncherError as error:
        summary = f"{target.label}: {why}; the rollback failed: {error.message}"
        return probe, RollbackStory("rollback_failed", summary, rollback_error=error.message)
    put_back = deployed_run(done.to_json())
    again = VerifyResult.of(run_probe(ctx, overrides, expected_run=put_back), target)
    healthy = again.exit_code == ExitCode.OK
    state = "healthy again" if healthy else f"not healthy either: {again.reason}"
    summary = f"{target.label}: {why}; rolled back to {old_run} (now {put_back}), {state}"
    outcome = "rolled_back" if healthy else "rolled_back_unhealthy"
    return probe, RollbackStory(outcome, summary, done.to_json(), None, again)

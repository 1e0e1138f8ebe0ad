"""The command table: each command's name, its request type (its parameters and help:
`launcher.core.requests`) and a loader of its run function.

The CLI's commands (`launcher.cli.declared`), `api.Launcher`'s checks and the Fabric tasks
(`launcher.tasks`) are made from this table and the requests' declarations. A command's run
function is imported when the command runs (its loader), so that `launcher status` loads its own
workflow module, not every command's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

from launcher.commands import args
from launcher.core import jobrequests as jobs
from launcher.core.requests import (
    DeployOptions,
    DoctorRequest,
    HistoryRequest,
    LogsRequest,
    LsRequest,
    RollbackRequest,
    SmokeRequest,
    StatusRequest,
    StopRequest,
    VerifyRequest,
)

if TYPE_CHECKING:
    from launcher.deploy.deploy import DeployReport
    from launcher.deploy.doctor import DoctorResult
    from launcher.operate.history import HistoryResult
    from launcher.operate.logs import LogsResult
    from launcher.operate.rollback import RollbackResult
    from launcher.operate.stop import StopResult
    from launcher.probe.workflows import SmokeResult, StatusResult, VerifyResult
    from launcher.targets.fleet import Outcome, Work
    from launcher.targets.workflow import Context, Workflow

# Every single-target command's request type (each has one Command in COMMANDS).
Request = (
    DeployOptions
    | VerifyRequest
    | SmokeRequest
    | StatusRequest
    | StopRequest
    | LogsRequest
    | HistoryRequest
    | RollbackRequest
    | DoctorRequest
)


@dataclass(frozen=True)
class Wiring:
    """A command's functions: its run, and (a fleet command) its result as a row of the table."""

    run: Callable[..., Any]  # (ctx, request) on a target; (inventory, request, ...) otherwise
    row: Callable[[Context, Any], Outcome] | None = None


@dataclass(frozen=True)
class Command:
    """A command: its name as typed (`deploy`, `job deploy`), its request, its run's loader."""

    name: str
    request_type: type
    load: Callable[[], Wiring]
    # targets: one run per target, several at once (-t a,b, --all, --parallel); target: one;
    # inventory: one run over the inventory (a job, the list of targets), no context of a target.
    on: Literal["targets", "target", "inventory"] = "targets"

    @property
    def fleet(self) -> bool:
        return self.on == "targets"

    @property
    def help(self) -> str:
        return self.request_type.__doc__ or ""

    @property
    def workflow(self) -> Workflow[Any, Any]:
        """The command's one run function (the CLI, the API and the tasks all call it)."""
        return wiring(self).run

    def request(self, values: Mapping[str, Any], *, api: bool = True, text: bool = False) -> Any:
        """Check every value and build the request (`api`: the API's keywords only)."""
        return args.build(self.name, self.request_type, values, api=api, text=text)


def wiring(command: Command) -> Wiring:
    """The command's functions, its module imported on first use."""
    return command.load()


def _deploy() -> Wiring:
    from launcher.deploy.deploy import deploy_row
    from launcher.operate.redeploy import run_deploy

    return Wiring(run_deploy, deploy_row)


def _verify() -> Wiring:
    from launcher.probe.workflows import run_verify, verify_row

    return Wiring(run_verify, verify_row)


def _smoke() -> Wiring:
    from launcher.operate.redeploy import run_smoke
    from launcher.probe.workflows import smoke_row

    return Wiring(run_smoke, smoke_row)


def _status() -> Wiring:
    from launcher.probe.workflows import run_status, status_row

    return Wiring(run_status, status_row)


def _stop() -> Wiring:
    from launcher.operate.stop import run_stop, stop_row

    return Wiring(run_stop, stop_row)


def _logs() -> Wiring:
    from launcher.operate.logs import run_logs

    return Wiring(run_logs)


def _history() -> Wiring:
    from launcher.operate.history import history_row, run_history

    return Wiring(run_history, history_row)


def _rollback() -> Wiring:
    from launcher.operate.rollback import rollback_row, run_rollback

    return Wiring(run_rollback, rollback_row)


def _doctor() -> Wiring:
    from launcher.deploy.doctor import doctor_row, run_doctor

    return Wiring(run_doctor, doctor_row)


def _ls() -> Wiring:
    from launcher.targets.listing import run_ls

    return Wiring(run_ls)


def _job(name: str) -> Callable[[], Wiring]:
    def load() -> Wiring:
        from launcher.commands import jobs as runs

        return Wiring(getattr(runs, name))

    return load


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("deploy", DeployOptions, _deploy),
        Command("verify", VerifyRequest, _verify),
        Command("smoke", SmokeRequest, _smoke),
        Command("status", StatusRequest, _status),
        Command("stop", StopRequest, _stop),
        Command("logs", LogsRequest, _logs, on="target"),
        Command("history", HistoryRequest, _history),
        Command("rollback", RollbackRequest, _rollback),
        Command("doctor", DoctorRequest, _doctor),
        Command("ls", LsRequest, _ls, on="inventory"),
        Command("job deploy", jobs.JobDeployRequest, _job("deploy"), on="inventory"),
        Command("job verify", jobs.JobVerifyRequest, _job("verify"), on="inventory"),
        Command("job status", jobs.JobStatusRequest, _job("status"), on="inventory"),
        Command("job stop", jobs.JobStopRequest, _job("stop"), on="inventory"),
        Command("job history", jobs.JobHistoryRequest, _job("history"), on="inventory"),
        Command("job rollback", jobs.JobRollbackRequest, _job("rollback"), on="inventory"),
        Command("job logs", jobs.JobLogsRequest, _job("logs"), on="inventory"),
        Command("job watch", jobs.JobWatchRequest, _job("watch"), on="inventory"),
    )
}
BY_REQUEST: dict[type, Command] = {c.request_type: c for c in COMMANDS.values()}


def workflow_for(request_type: type) -> Workflow[Any, Any]:
    """The run function of a request type (KeyError: not a command's request)."""
    return BY_REQUEST[request_type].workflow


# `run`'s result type follows its request's: what each command's workflow returns.
@overload
def run(ctx: Context, request: DeployOptions) -> DeployReport: ...
@overload
def run(ctx: Context, request: VerifyRequest) -> VerifyResult: ...
@overload
def run(ctx: Context, request: SmokeRequest) -> SmokeResult: ...
@overload
def run(ctx: Context, request: StatusRequest) -> StatusResult: ...
@overload
def run(ctx: Context, request: StopRequest) -> StopResult: ...
@overload
def run(ctx: Context, request: LogsRequest) -> LogsResult: ...
@overload
def run(ctx: Context, request: HistoryRequest) -> HistoryResult: ...
@overload
def run(ctx: Context, request: RollbackRequest) -> RollbackResult: ...
@overload
def run(ctx: Context, request: DoctorRequest) -> DoctorResult: ...
def run(ctx: Context, request: Request) -> Any:
    """The request's workflow on the context's target: the one call the CLI, `api.Launcher`
    and the Fabric tasks make."""
    return workflow_for(type(request))(ctx, request)


def work(request: Request) -> Work:
    """The request as a fleet's work (`fleet.run_fleet`, `fleet.run_one`): run, then its row."""
    row = wiring(BY_REQUEST[type(request)]).row
    if row is None:
        raise KeyError(f"{type(request).__name__} has no fleet row")
    return lambda ctx: row(ctx, run(ctx, request))

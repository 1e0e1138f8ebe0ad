"""One declaration per command: its parameters, how they build the workflow's request, and the
function that runs it and shows the result as the CLI does.

The CLI's options, `api.Launcher`'s keywords and the Fabric tasks (`launcher.tasks`, generated
from this table) all meet here, and `tests/unit/test_commands.py` fails when a CLI option has
no counterpart in the API and the tasks, so the three cannot drift. Every value is checked with
the CLI's own parameter types (`launcher.commands.args`): a bad one is a UsageError (exit code 2).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast, overload

from launcher.commands import args, params
from launcher.core.errors import UsageError
from launcher.core.requests import (
    DoctorRequest,
    HistoryRequest,
    LogsRequest,
    RollbackRequest,
    SmokeRequest,
    StatusRequest,
    StopRequest,
    VerifyRequest,
)
from launcher.deploy.deploy import DeployOptions

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

# Every command's request type (WORKFLOWS has one entry per member).
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

CHECKPOINT_MODES = ("archive", "purge", "keep")

Kind = Literal["flag", "duration", "count", "choice", "text", "pairs", "path"]


@dataclass(frozen=True)
class Param:
    """One parameter of a command, under its Python name (API keyword and task option)."""

    name: str
    kind: Kind
    help: str
    default: Any = None
    type: Any = None  # the CLI's parameter type (a duration's or a count's range)
    choices: tuple[str, ...] = ()
    # The click parameters it stands for, when not just `name` (deploy's --purge-checkpoints
    # and --keep-checkpoints are the one `checkpoints` choice).
    cli: tuple[str, ...] = ()
    # False: how the result is shown (--json, --junit...): the CLI and the tasks, not the API,
    # whose results are objects.
    request: bool = True
    option: str = ""  # the task's option name, when not `name` (`set` is a builtin's name)
    # A choice the CLI spells as flags, one per value: the tasks spell it the same way.
    flags: tuple[tuple[str, str, str], ...] = ()  # (task option, value, help)

    @property
    def task_name(self) -> str:
        return self.option or self.name

    @property
    def cli_names(self) -> tuple[str, ...]:
        return self.cli or (self.name,)

    def check(self, value: Any) -> Any:
        """The value checked as the API checks it; text (from a task's command line) is
        converted with the CLI's own type first."""
        if self.kind == "flag":
            return args.flag(self.name, value)
        if self.kind == "duration":
            return args.duration(self.name, value, self.type)
        if self.kind == "count":
            if isinstance(value, str):
                value = args.converted(self.name, value, self.type)
            if value is None and self.default is None:
                return None
            return args.count(self.name, value, self.type)
        if self.kind == "choice":
            return args.choice(self.name, value, self.choices)
        if self.kind == "pairs":
            return pairs(self.name, value)
        if self.kind == "path":
            return args.path(self.name, value)
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{self.name}={value!r}: must be a string or None")
        return value


def pairs(name: str, value: Any) -> tuple[str, ...]:
    """KEY=VALUE items (--env, --set): a sequence of strings (the builder reads them)."""
    return args.strings(name, value, "KEY=VALUE string")


@dataclass(frozen=True)
class Command:
    """A command: its parameters, the request they build, and the CLI's way to run and show it
    (`module:function`, taking the app context, the request and the presentation values)."""

    name: str
    doc: str
    params: tuple[Param, ...]
    build: Callable[[dict[str, Any]], Any]
    runner: str
    fleet: bool = True  # accepts several targets (-t a,b, --all, --parallel)
    request_type: type = object  # what `build` returns: its key in WORKFLOWS

    @property
    def workflow(self) -> Workflow[Any, Any]:
        """The command's one run function (the CLI, the API and the tasks all call it)."""
        return workflow_for(self.request_type)

    def request(self, values: Mapping[str, Any]) -> Any:
        """Check every request value and build the workflow's request."""
        known = {p.name: p for p in self.params if p.request}
        unknown = set(values) - set(known)
        if unknown:
            raise UsageError(f"{self.name}: unknown argument(s) {', '.join(sorted(unknown))}")
        checked = {name: p.check(values.get(name, p.default)) for name, p in known.items()}
        return self.build(checked)

    def presentation(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return {
            p.name: p.check(values.get(p.name, p.default)) for p in self.params if not p.request
        }

    def run(self, app: Any, values: Mapping[str, Any]) -> None:
        """Build the request and run it as the CLI does (its output; ends in SystemExit)."""
        shown = self.presentation(values)
        request = self.request({k: v for k, v in values.items() if k not in shown})
        module, _, function = self.runner.partition(":")
        getattr(importlib.import_module(module), function)(app, request, **shown)


def _deploy(v: dict[str, Any]) -> DeployOptions:
    env: dict[str, str] = {}
    for item in v["env"]:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: write KEY=VALUE")
        env[key] = value
    return DeployOptions(
        restart=v["restart"],
        dry_run=v["dry_run"],
        checkpoint_mode=v["checkpoints"],
        grace=v["grace"],
        kill_gpu_holders=v["kill_gpu_holders"],
        prune_archives=v["prune_archives"],
        wait_lock=v["wait_lock"] or 0.0,
        env=env,
        sets=v["sets"],
        command=v["command"],
        message=v["message"],
        diff=v["diff"],
        verify=v["verify"],
        rollback_on_failure=v["rollback_on_failure"],
    )


def probe_values(
    wait: float | None,
    interval: float | None,
    window: float | None,
    successes: int | None,
    failure_threshold: int | None,
) -> dict[str, Any]:
    """The probe's five settings by name, as the CLI, the API and the tasks pass them."""
    return {
        "wait": wait,
        "interval": interval,
        "window": window,
        "successes": successes,
        "failure_threshold": failure_threshold,
    }


def _probe(v: dict[str, Any]) -> VerifyRequest:
    return VerifyRequest(
        v["wait"], v["interval"], v["window"], v["successes"], v["failure_threshold"]
    )


def _flag(name: str, text: str, *, cli: tuple[str, ...] = (), request: bool = True) -> Param:
    return Param(name, "flag", text, False, cli=cli, request=request)


GRACE_HELP = "Wait this long after C-c: 90, 2m; 0 s to 1 h (default: playbook stop_grace)."
WAIT_LOCK = Param(
    "wait_lock",
    "duration",
    "Wait up to this long for another deploy's lock: 90s, 10m (default 0: refuse, exit 4).",
    type=params.WAIT_LOCK,
)
PRUNE_HELP = (
    "Beyond keep_archives, prune also archives of runs that lived longer or hold more "
    "checkpoints than the runs kept."
)
JSON = _flag("json", "Print the report as JSON.", cli=("as_json",), request=False)
ROLLBACK_ON_FAILURE = _flag(
    "rollback_on_failure",
    "If the new run fails its probe, put the previous run back (code, env, checkpoints).",
)
PROBE = (
    Param("wait", "duration", "Warmup: only fatal signs are judged: 90, 3m.", type=params.WAIT),
    Param("interval", "duration", "Time between polls: 2, 2s, 1m.", type=params.INTERVAL),
    Param("window", "duration", "How long after the warmup it may poll.", type=params.WINDOW),
    Param("successes", "count", "Consecutive passing polls needed.", type=params.SUCCESSES),
    Param(
        "failure_threshold",
        "count",
        "Failing polls in a row that end the probe.",
        type=params.SUCCESSES,
    ),
    JSON,
    Param("junit", "path", "Write a JUnit XML report to this file.", request=False),
    Param("report", "path", "Write a self-contained HTML report here.", request=False),
    _flag("verbose", "Show every check with its expectation.", request=False),
)

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command(
            "deploy",
            "Upload the script (verified), stop the old run, set checkpoints aside, launch.",
            (
                _flag("restart", "Stop the running session first (C-c, wait, kill)."),
                _flag("dry_run", "Show every step it would take; change nothing."),
                Param(
                    "checkpoints",
                    "choice",
                    "Old checkpoints: archive, purge or keep (default archive).",
                    "archive",
                    choices=CHECKPOINT_MODES,
                    cli=("purge", "keep"),
                    flags=(
                        ("purge_checkpoints", "purge", "Delete old checkpoints, not archive them."),
                        ("keep_checkpoints", "keep", "Leave checkpoints in place (for a resume)."),
                    ),
                ),
                Param("grace", "duration", GRACE_HELP, type=params.GRACE),
                _flag("kill_gpu_holders", "Kill processes outside the run that hold the GPUs."),
                _flag("prune_archives", PRUNE_HELP),
                WAIT_LOCK,
                Param("env", "pairs", "KEY=VALUE for this deploy's environment (repeatable)."),
                Param(
                    "sets",
                    "pairs",
                    "Override a playbook key: verify.wait=60 (repeatable).",
                    (),
                    option="set",
                ),
                Param("command", "text", "Run this command instead of the playbook's."),
                Param("message", "text", "Why: recorded in history with the deploy."),
                _flag("diff", "With a project: show text diffs of changed files."),
                _flag("verify", "Then run the startup probe on the new run (exit 1 unhealthy)."),
                ROLLBACK_ON_FAILURE,
                JSON,
            ),
            _deploy,
            "launcher.cli.deploy:run_deploy",
            request_type=DeployOptions,
        ),
        Command(
            "verify",
            "Startup probe: exit 0 healthy, 1 unhealthy (crash, stall, drained queues...).",
            PROBE,
            _probe,
            "launcher.cli.verify:run_verify",
            request_type=VerifyRequest,
        ),
        Command(
            "smoke",
            "CI smoke check: deploy --restart, then verify.",
            (*PROBE, WAIT_LOCK, ROLLBACK_ON_FAILURE),
            lambda v: SmokeRequest(_probe(v), v["wait_lock"] or 0.0, v["rollback_on_failure"]),
            "launcher.cli.verify:run_smoke",
            request_type=SmokeRequest,
        ),
        Command(
            "status",
            "One poll of the run, judged at once: exit 0 healthy, 1 not.",
            (JSON, _flag("verbose", "Show every check with its expectation.", request=False)),
            lambda v: StatusRequest(),
            "launcher.cli.verify:run_status",
            request_type=StatusRequest,
        ),
        Command(
            "stop",
            "Stop the run gracefully: C-c, wait, kill the session and what is left of it.",
            (Param("grace", "duration", GRACE_HELP, type=params.GRACE),),
            lambda v: StopRequest(v["grace"]),
            "launcher.cli.operate:run_stop",
            request_type=StopRequest,
        ),
        Command(
            "logs",
            "Show the run's log file, or follow it.",
            (
                Param(
                    "tail", "count", "How many of the last lines (default 50).", 50, params.LINES
                ),
                _flag("follow", "Keep printing new lines until the run ends or Ctrl-C."),
                _flag("raw", "Show the tmux pane instead of the log."),
                _flag("raw_bytes", "Write the log unfiltered (not to a terminal).", request=False),
            ),
            lambda v: LogsRequest(v["tail"], v["follow"], v["raw"]),
            "launcher.cli.operate:run_logs",
            fleet=False,
            request_type=LogsRequest,
        ),
        Command(
            "history",
            "The deploys recorded in the container, newest first.",
            (
                Param("limit", "count", "Only the newest N records (0: all).", 0, params.LINES),
                Param(
                    "diff",
                    "pairs",
                    "Two runs: what changed from A to B (code, env, overrides).",
                    (),
                ),
                JSON,
            ),
            lambda v: HistoryRequest(v["limit"], tuple(v["diff"])),
            "launcher.cli.operate:run_history",
            request_type=HistoryRequest,
        ),
        Command(
            "rollback",
            "Put the previous script version back (verified) and relaunch.",
            (
                _flag("restart", "Stop the running session first (C-c, wait, kill)."),
                Param("grace", "duration", GRACE_HELP, type=params.GRACE),
                _flag("keep_checkpoints", "Leave checkpoints in place.", cli=("keep",)),
                WAIT_LOCK,
                _flag(
                    "no_checkpoints",
                    "Start fresh: leave the put-back run's archived checkpoints archived.",
                    cli=("fresh",),
                ),
            ),
            lambda v: RollbackRequest(
                v["restart"],
                v["grace"],
                v["keep_checkpoints"],
                v["wait_lock"] or 0.0,
                v["no_checkpoints"],
            ),
            "launcher.cli.operate:run_rollback",
            request_type=RollbackRequest,
        ),
        Command(
            "doctor",
            "Check everything a deploy needs, and say how to fix what is wrong.",
            (_flag("json", "Print the checks as JSON.", cli=("as_json",), request=False),),
            lambda v: DoctorRequest(),
            "launcher.cli.operate:run_doctor",
            request_type=DoctorRequest,
        ),
    )
}


class Wiring(NamedTuple):
    """Where a request type's functions live, as `module:function`: a command loads its own
    workflow module, not every command's."""

    run: str  # runs the request on one target (`launcher.targets.workflow`)
    row: str | None  # the result as a row of a fleet's table; None: not a fleet command


# Each request type, the one function that runs it, and how a fleet shows its result.
WORKFLOWS: dict[type, Wiring] = {
    DeployOptions: Wiring(
        "launcher.operate.redeploy:run_deploy", "launcher.deploy.deploy:deploy_row"
    ),
    VerifyRequest: Wiring(
        "launcher.probe.workflows:run_verify", "launcher.probe.workflows:verify_row"
    ),
    SmokeRequest: Wiring(
        "launcher.operate.redeploy:run_smoke", "launcher.probe.workflows:smoke_row"
    ),
    StatusRequest: Wiring(
        "launcher.probe.workflows:run_status", "launcher.probe.workflows:status_row"
    ),
    StopRequest: Wiring("launcher.operate.stop:run_stop", "launcher.operate.stop:stop_row"),
    LogsRequest: Wiring("launcher.operate.logs:run_logs", None),
    HistoryRequest: Wiring(
        "launcher.operate.history:run_history", "launcher.operate.history:history_row"
    ),
    RollbackRequest: Wiring(
        "launcher.operate.rollback:run_rollback", "launcher.operate.rollback:rollback_row"
    ),
    DoctorRequest: Wiring("launcher.deploy.doctor:run_doctor", "launcher.deploy.doctor:doctor_row"),
}


def _resolve(where: str) -> Any:
    module, _, function = where.partition(":")
    return getattr(importlib.import_module(module), function)


def workflow_for(request_type: type) -> Workflow[Any, Any]:
    """The run function of a request type (KeyError: not a command's request)."""
    return cast("Workflow[Any, Any]", _resolve(WORKFLOWS[request_type].run))


# `run`'s result type follows its request's: what each workflow in WORKFLOWS returns.
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
    where = WORKFLOWS[type(request)].row
    if where is None:
        raise KeyError(f"{type(request).__name__} has no fleet row")
    row: Callable[[Context, Any], Outcome] = _resolve(where)
    return lambda ctx: row(ctx, run(ctx, request))

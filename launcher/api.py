"""The Python API: launcher as a library. The CLI and the Fabric tasks are thin layers on top.

    from launcher import Launcher

    with Launcher("inventory.yaml") as l:
        report = l.deploy("prod", restart=True)    # DeployReport
        result = l.verify("prod", wait=180)        # ProbeResult; result.exit_code 0 or 1
        result.state                               # State.HEALTHY, State.FINISHED, ...

A run that is judged (verify, status) comes back as a result with its exit code, healthy or
not. Everything that stops an operation raises a LauncherError whose `exit_code` is the one
the CLI would exit with: 2 bad input, 3 unreachable, 4 refused. One SSH connection per host
is opened on first use and kept until close() (or the end of the `with` block).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from launcher.commands import args
from launcher.commands.keywords import ProbeKeywords, WatchKeywords, known_keywords
from launcher.commands.table import BY_REQUEST, COMMANDS, run, wiring
from launcher.config.models import Inventory, Target, inventory_path, load_inventory
from launcher.core.errors import ExitCode, UnhealthyError, UsageError
from launcher.core.requests import CHECKPOINT_MODES, CheckpointMode
from launcher.deploy.deploy import DeployReport
from launcher.deploy.doctor import DoctorResult
from launcher.operate.history import HistoryResult
from launcher.operate.logs import LogsResult
from launcher.operate.rollback import RollbackResult
from launcher.operate.stop import StopResult
from launcher.probe.workflows import SmokeResult, StatusResult, VerifyResult
from launcher.targets.cluster import place
from launcher.targets.workflow import Context, Step, StepSink
from launcher.transport.connection import Connection
from launcher.transport.pool import ConnectionPool

if TYPE_CHECKING:
    from launcher.apijobs import Jobs
    from launcher.watch.events import Event
    from launcher.watch.session import WatchResult, WatchSession

LineSink = Callable[[str], None]

# A method's keywords that are not its request's: the target and where progress goes.
NOT_REQUEST = frozenset(("self", "target", "on_step", "on_line", "check"))


def _request(command: str, given: dict[str, Any]) -> Any:
    """The command's request from a method's keywords (`locals()`), checked as declared."""
    return COMMANDS[command].request({k: v for k, v in given.items() if k not in NOT_REQUEST})


__all__ = ["CHECKPOINT_MODES", "Launcher", "SmokeResult", "StatusResult"]


class Launcher:
    """One inventory and the SSH connections to its hosts; see the module docstring."""

    def __init__(
        self,
        inventory: str | os.PathLike[str] | None = None,
        *,
        on_line: LineSink | None = None,
    ) -> None:
        """Load and validate the inventory (a ConfigError, exit code 2, names file and line).

        Without a path: $LAUNCHER_INVENTORY, else ./inventory.yaml, as for the CLI.
        `on_line` receives the progress lines the CLI would print (steps, polls).
        """
        where = args.path("inventory", inventory)
        self._say: LineSink = args.callback("on_line", on_line) or (lambda line: None)
        self._inventory_path = inventory_path(where)
        self.inventory: Inventory = load_inventory(self._inventory_path)
        self._pool = ConnectionPool()

    # -- targets and connections ------------------------------------------------------------

    def targets(self, *names: str) -> list[str]:
        """Target names for names, `a,b` lists and groups (none: default_target; no: all)."""
        return self.inventory.resolve_names(list(names))

    def target(self, name: str | None = None) -> Target:
        """The target's settings (host, VMID, playbook); an unknown name is a UsageError."""
        name = args.target_name(name)
        resolved = self.inventory.resolve_names([name] if name else [])
        if len(resolved) != 1:
            raise UsageError(f"{name!r} names {len(resolved)} targets; pass a single target")
        return self.inventory.target(resolved[0])

    def _connect(self, name: str | None) -> tuple[Target, Connection]:
        """The target (a cluster target on the node running its VMID now) and its connection."""
        target = place(self.target(name), self._pool)
        return target, self._pool.get(target.host_name, target.host)

    def _context(
        self, name: str | None, on_step: StepSink | None = None, on_line: LineSink | None = None
    ) -> Context:
        """The workflow's context: the target placed, its connection, progress lines to the
        Launcher's `on_line`, steps to `on_step` (or nowhere), output lines to `on_line`."""
        target, conn = self._connect(name)
        return Context(
            target,
            conn,
            threading.Event(),
            self._say,
            on_step=on_step or (lambda step: None),
            output=on_line or (lambda line: None),
        )

    # -- workflows ----------------------------------------------------------------------

    def deploy(
        self,
        target: str | None = None,
        *,
        restart: bool = False,
        dry_run: bool = False,
        checkpoints: CheckpointMode = "archive",
        grace: float | None = None,
        kill_gpu_holders: bool = False,
        prune_archives: bool = False,
        wait_lock: float | None = None,
        env: Sequence[str] = (),
        sets: Sequence[str] = (),
        command: str | None = None,
        message: str | None = None,
        diff: bool = False,
        verify: bool = False,
        rollback_on_failure: bool = False,
        on_step: Callable[[Step], None] | None = None,
    ) -> DeployReport:
        """Upload the script (verified), stop the old run (with `restart`), launch it.

        `env` and `sets` are KEY=VALUE strings, as for `--env` and `--set`. An active run
        without `restart` raises RefusedError (exit code 4). With `verify` (or
        `rollback_on_failure`) the new run is probed and the result is a
        `launcher.operate.redeploy.VerifiedDeploy` (a DeployReport with `probe` and `story`): its
        `exit_code` is 0 healthy, 1 unhealthy, 5 rolled back (the previous run healthy again),
        6 rolled back but not healthy, 7 the rollback failed.
        """
        options = _request("deploy", locals())
        on_step = args.callback("on_step", on_step)
        report: DeployReport = run(self._context(target, on_step), options)
        return report

    def verify(
        self, target: str | None = None, *, check: bool = False, **probe: Unpack[ProbeKeywords]
    ) -> VerifyResult:
        """The startup probe. Unset settings come from the playbook's `verify:` section.

        The verdict is in the result (`verdict`, `exit_code` 0 healthy, 1 unhealthy); with
        `check=True` an unhealthy run raises UnhealthyError (exit code 1) instead.
        """
        request = _request("verify", known_keywords("verify", dict(probe), ProbeKeywords))
        check = args.flag("check", check)
        result: VerifyResult = run(self._context(target), request)
        if check and result.exit_code != ExitCode.OK:
            raise UnhealthyError(f"{result.verdict}: {result.reason}")
        return result

    def smoke(
        self,
        target: str | None = None,
        *,
        wait_lock: float | None = None,
        rollback_on_failure: bool = False,
        on_step: Callable[[Step], None] | None = None,
        **probe: Unpack[ProbeKeywords],
    ) -> SmokeResult:
        """`deploy --restart`, then the probe of the run that deploy started (as `launcher
        smoke`). A deploy that fails raises its LauncherError; the verdict is in the result.
        With `rollback_on_failure`, a failed probe puts the previous run back (`exit_code` 5,
        6 or 7 as for `deploy`)."""
        given = known_keywords("smoke", dict(probe), ProbeKeywords)
        given.update(wait_lock=wait_lock, rollback_on_failure=rollback_on_failure)
        request = _request("smoke", given)
        on_step = args.callback("on_step", on_step)
        result: SmokeResult = run(self._context(target, on_step), request)
        if result.deploy_error is not None:
            raise result.deploy_error
        return result

    def status(self, target: str | None = None) -> StatusResult:
        """One poll judged at once, in a lifecycle `state`: exit_code 0 for healthy, starting,
        deploying and finished; 1 for unhealthy, failed, stopped and absent."""
        result: StatusResult = run(self._context(target), _request("status", {}))
        return result

    def stop(self, target: str | None = None, *, grace: float | None = None) -> StopResult:
        """Stop the run: C-c, wait `grace` (default: playbook stop_grace), kill what is left."""
        request = _request("stop", locals())
        result: StopResult = run(self._context(target), request)
        return result

    def logs(
        self,
        target: str | None = None,
        *,
        tail: int = 50,
        raw: bool = False,
        follow: bool = False,
        on_line: LineSink | None = None,
    ) -> LogsResult:
        """The last `tail` lines of the run's log (result.lines); `follow` streams new lines to
        `on_line` until the run ends."""
        request = _request("logs", locals())
        on_line = args.callback("on_line", on_line)
        result: LogsResult = run(self._context(target, on_line=on_line), request)
        return result

    def history(
        self, target: str | None = None, *, limit: int = 0, diff: Sequence[str] = ()
    ) -> HistoryResult:
        """The deploy records kept in the container, newest first; with `diff` (two run ids,
        or the start of them) `result.diff` says what changed from the first to the second."""
        request = _request("history", locals())
        result: HistoryResult = run(self._context(target), request)
        return result

    def rollback(
        self,
        target: str | None = None,
        *,
        restart: bool = False,
        grace: float | None = None,
        keep_checkpoints: bool = False,
        wait_lock: float | None = None,
        no_checkpoints: bool = False,
        on_step: Callable[[Step], None] | None = None,
    ) -> RollbackResult:
        """Put the previous script version back and relaunch; refuses (exit code 4) without
        one, or with an active run and no `restart`."""
        request = _request("rollback", locals())
        on_step = args.callback("on_step", on_step)
        result: RollbackResult = run(self._context(target, on_step), request)
        return result

    def doctor(self, target: str | None = None) -> DoctorResult:
        """Every check a deploy needs, with fixes; result.exit_code is the first failure's."""
        result: DoctorResult = run(self._context(target), _request("doctor", {}))
        return result

    def run(self, request: Any, target: str | None = None) -> Any:
        """Any command of the table by its request (`launcher.core.requests`, built by you):
        on the target, or over the inventory for a command that acts on no target (`LsRequest`,
        a job's). The result is the command's own; the typed methods above are the same call."""
        command = BY_REQUEST.get(type(request))
        if command is None:
            raise UsageError(f"{type(request).__name__}: not a command's request")
        if command.on == "inventory":
            return wiring(command).run(self.inventory, request)
        return run(self._context(target), request)

    def watch(
        self,
        *targets: str,
        wait: float | None = None,
        on_event: Callable[[Event], None] | None = None,
        started: Callable[[WatchSession], None] | None = None,
        **settings: Unpack[WatchKeywords],
    ) -> WatchResult:
        """`launcher watch` (names, `a,b` lists and groups as `targets()` takes them): judge
        the runs until `duration` passes (None: until stopped), each transition to `on_event`,
        the webhooks and the commands (what `on_event` raises goes to `on_line`; the watch and
        its webhooks go on). `started` receives the session once it watches:
        `session.stop()` ends it from another thread (the result's exit code is then 0).
        The watch opens its own connections and closes them when it ends. The settings
        (`WatchKeywords`) are `launcher watch`'s options; unset, their defaults there.
        """
        from launcher.core.requests import WatchOptions
        from launcher.watch.session import WatchSession, guarded, watch_request
        from launcher.watch.state import default_state_path

        given = {**known_keywords("watch", dict(settings), WatchKeywords), "wait": wait}
        options = args.build("watch", WatchOptions, given, api=True)
        request = watch_request(options, default_state_path(self._inventory_path))
        sink = guarded(args.callback("on_event", on_event) or (lambda event: None), self._say)
        started = args.callback("started", started)
        names = self.targets(*targets)
        session = WatchSession([self.inventory.target(n) for n in names], request, sink)
        return session.run(lambda: started(session) if started else None)

    @property
    def jobs(self) -> Jobs:
        """The inventory's multi-node jobs (`launcher job`): `l.jobs.deploy("train",
        restart=True)`, `verify`, `status`, `stop`, `history`, `rollback`, `logs`, `watch`
        (launcher.apijobs). Progress lines go to `on_line` as `[node] line`."""
        from launcher.apijobs import Jobs

        return Jobs(self.inventory, lambda node, line: self._say(f"[{node}] {line}"))

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Close every SSH connection (the Launcher can be used again: they reopen)."""
        self._pool.close()

    def __enter__(self) -> Launcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

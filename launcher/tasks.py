"""Fabric tasks: launcher's commands for a fabfile, with the CLI's output and exit codes.

    # fabfile.py
    from launcher.tasks import deploy, logs, status, stop, verify

    $ fab deploy --target prod --restart --env LR=3e-4 --env SEED=1 -m "new lr"
    $ fab verify --target prod --wait 180      # exit 0 healthy, 1 unhealthy, 3 unreachable

Each task is generated from the command's declaration (launcher.commands.table): the same
parameters as the CLI's options, the same request, and the same function the CLI runs, in
this process (no subprocess, no click). So what it prints and the code `fab` exits with are
the CLI's. The inventory is --inventory, else $LAUNCHER_INVENTORY, else ./inventory.yaml.
Durations take the CLI's forms (90, 90s, 3m). For Python code that wants results rather
than output, see launcher.api.Launcher.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import Task

from launcher.commands import args
from launcher.commands.table import COMMANDS, Command, Param
from launcher.core.errors import UsageError

# Short flags are given out in signature order: `target` then `inventory` come first in every
# task, so -t and -i mean what they mean for the CLI.
TARGET_HELP = "Target or group (a,b for several; default: the inventory's default_target)."
COMMON: dict[str, str] = {
    "target": TARGET_HELP,
    "inventory": "Inventory file (default: $LAUNCHER_INVENTORY, else ./inventory.yaml).",
    "known_hosts": "known_hosts file for every host (default: $LAUNCHER_KNOWN_HOSTS).",
    "identity": "Private key for every host (default: $LAUNCHER_IDENTITY, else the inventory's).",
    "quiet": "No progress lines on stderr (errors and the result still print).",
    "debug": "Show tracebacks for errors.",
}
FLEET: dict[str, str] = {
    "all": "Every target in the inventory.",
    "parallel": "At most N hosts at a time (default: 8).",
}
COMMON_DEFAULTS: dict[str, Any] = {
    "target": None,
    "inventory": None,
    "known_hosts": None,
    "identity": None,
    "quiet": False,
    "debug": False,
    "all": False,
    "parallel": None,
}


def _default(param: Param) -> Any:
    """What invoke parses the option as: a flag for False, text for anything else. A count
    stays text (`--tail abc` is the CLI's exit 2, not invoke's ValueError traceback)."""
    if param.kind == "flag" or param.flags:
        return False
    if param.kind == "pairs":
        return []
    return None if param.default is None else str(param.default)


def _fill(app: Any, command: Command, given: dict[str, Any]) -> None:
    """The app context as the CLI's global options fill it."""
    from launcher.cli.context import IDENTITY_ENV, KNOWN_HOSTS_ENV
    from launcher.commands.params import PARALLEL

    # As the CLI's --known-hosts and --identity: through the environment.
    for option, variable in (("known_hosts", KNOWN_HOSTS_ENV), ("identity", IDENTITY_ENV)):
        path = given.pop(option)
        if path:
            os.environ[variable] = os.path.abspath(os.path.expanduser(path))
    target = given.pop("target")
    app.inventory_option = given.pop("inventory")
    app.target_names = [target] if target else []
    app.quiet = given.pop("quiet")
    if command.fleet:
        app.all_targets = given.pop("all")
        parallel = given.pop("parallel")
        if parallel is not None:
            app.parallel = args.converted("parallel", parallel, PARALLEL)


def _execute(command: Command, given: dict[str, Any]) -> None:
    """Run the command as the CLI does, its errors and Ctrl-C turned into exit codes by the
    CLI's own guard; a code other than 0 becomes invoke's Exit."""
    from launcher.cli.context import AppContext
    from launcher.cli.main import run_guarded

    debug = bool(given.pop("debug"))
    app = AppContext(debug=debug, command=command.name)

    def body() -> None:
        conflict = given.pop("_conflict", None)
        if conflict:
            raise UsageError(f"{conflict} exclude each other")
        _fill(app, command, given)
        command.run(app, given)

    try:
        run_guarded(app, body, debug=debug, dry_run=bool(given.get("dry_run")))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if code:
            raise Exit(code=code) from None


def _chosen(command: Command, given: dict[str, Any]) -> dict[str, Any]:
    """Flags that spell a choice (--purge-checkpoints, --keep-checkpoints) back into it; two
    of them exclude each other, as for the CLI (checked when the task runs: exit 2)."""
    for param in command.params:
        if param.flags:
            chosen = [value for flag, value, _ in param.flags if given.pop(flag, False)]
            given[param.name] = chosen[0] if len(chosen) == 1 else param.default
            if len(chosen) > 1:
                spelled = [f"--{flag.replace('_', '-')}" for flag, _, _ in param.flags]
                given["_conflict"] = " and ".join(spelled)
    return given


def make_task(command: Command) -> Task[Any]:
    """An invoke Task whose options are the command's parameters (plus target, inventory...)."""
    helps = {**COMMON, **(FLEET if command.fleet else {})}
    names = [n for p in command.params for n in ([f for f, _, _ in p.flags] or [p.task_name])]
    for param in command.params:
        helps.update({param.task_name: param.help} if not param.flags else {})
        helps.update({flag: text for flag, _, text in param.flags})
    defaults = {name: COMMON_DEFAULTS[name] for name in helps if name in COMMON_DEFAULTS}
    defaults.update({name: False for name in names})
    defaults.update({p.task_name: _default(p) for p in command.params if not p.flags})
    order = ["target", "inventory", *names]
    order += [name for name in helps if name not in order]

    renamed = {p.task_name: p.name for p in command.params}

    def body(c: Context, **given: Any) -> None:
        _execute(command, _chosen(command, {renamed.get(k, k): v for k, v in given.items()}))

    body.__name__ = command.name
    body.__qualname__ = command.name
    body.__doc__ = command.doc
    kind = inspect.Parameter.KEYWORD_ONLY
    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(name, kind, default=defaults[name]) for name in order]
    )
    iterable = [p.task_name for p in command.params if p.kind == "pairs"]
    return Task(body, name=command.name, help=helps, iterable=iterable)


deploy = make_task(COMMANDS["deploy"])
verify = make_task(COMMANDS["verify"])
smoke = make_task(COMMANDS["smoke"])
status = make_task(COMMANDS["status"])
stop = make_task(COMMANDS["stop"])
logs = make_task(COMMANDS["logs"])
history = make_task(COMMANDS["history"])
rollback = make_task(COMMANDS["rollback"])
doctor = make_task(COMMANDS["doctor"])

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
from launcher.commands.args import dest
from launcher.commands.table import COMMANDS, Command
from launcher.core.declare import Parameter, parameters

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


def _default(param: Parameter) -> Any:
    """What invoke parses the option as: a flag for False, text for anything else. A count
    stays text (`--tail abc` is the CLI's exit 2, not invoke's ValueError traceback)."""
    if param.option.repeat or param.option.nargs > 1:
        return []
    if isinstance(param.default, bool):
        return False
    if param.default is None or param.option.none_is_default:
        return None
    return str(param.default)


def _fill(app: Any, command: Command, given: dict[str, Any]) -> None:
    """The app context as the CLI's global options fill it."""
    from launcher.cli.context import IDENTITY_ENV, KNOWN_HOSTS_ENV
    from launcher.core.params import PARALLEL

    # As the CLI's --known-hosts and --identity: through the environment.
    for option, variable in (("known_hosts", KNOWN_HOSTS_ENV), ("identity", IDENTITY_ENV)):
        path = given.pop(option)
        if path:
            os.environ[variable] = os.path.abspath(os.path.expanduser(path))
    target = given.pop("target", None)
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
    from launcher.cli.main import cli, run_guarded

    debug = bool(given.pop("debug"))
    app = AppContext(debug=debug, command=command.name)

    def body() -> None:
        _fill(app, command, given)
        cli.commands[command.name].run(app, given, text=True)  # type: ignore[attr-defined]

    try:
        run_guarded(app, body, debug=debug, dry_run=bool(given.get("dry_run")))
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if code:
            raise Exit(code=code) from None


def _options(command: Command) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """Each option's help and default, by its name; and the request's keyword of each."""
    helps: dict[str, str] = {}
    defaults: dict[str, Any] = {}
    keywords: dict[str, str] = {}
    for p in parameters(command.request_type):
        for _, spelling, text in p.option.spelled:
            helps[dest(spelling)], defaults[dest(spelling)] = text, False
            keywords[dest(spelling)] = dest(spelling)  # read back by the command's run
        if not p.option.spelled:
            helps[p.task_option], defaults[p.task_option] = p.option.help, _default(p)
            keywords[p.task_option] = p.keyword
    return helps, defaults, keywords


def make_task(command: Command) -> Task[Any]:
    """An invoke Task whose options are the command's parameters (plus target, inventory...)."""
    own, defaults, keywords = _options(command)
    helps = {**COMMON, **(FLEET if command.fleet else {}), **own}
    if command.on == "inventory":  # acts on no target (`ls`)
        del helps["target"]
    defaults.update({name: COMMON_DEFAULTS[name] for name in helps if name in COMMON_DEFAULTS})
    order = [*(["target"] if "target" in helps else []), "inventory", *own]
    order += [name for name in helps if name not in order]

    def body(c: Context, **given: Any) -> None:
        _execute(command, {keywords.get(k, k): v for k, v in given.items()})

    body.__name__ = body.__qualname__ = command.name
    body.__doc__ = "\n".join(
        line for line in inspect.cleandoc(command.help).splitlines() if line != "\b"
    )
    kind = inspect.Parameter.KEYWORD_ONLY
    body.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(name, kind, default=defaults[name]) for name in order]
    )
    iterable = [n for n, d in defaults.items() if isinstance(d, list)]
    return Task(body, name=command.name, help=helps, iterable=iterable)


# A task for every command of the table that is not a job's: deploy, verify, smoke, status...
TASKS = {name: make_task(c) for name, c in COMMANDS.items() if " " not in name}
globals().update(TASKS)
__all__ = sorted(TASKS)

"""The click group, the global options, and the one place where errors become exit codes.

Workflow modules (and so pydantic, paramiko) are imported inside commands, so that
`launcher --help` and `launcher --version` stay fast.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, NoReturn

import click

from launcher.cli.context import (
    TARGET_HELP,
    AppContext,
    complete_targets,
    identity_option,
    known_hosts_option,
    print_error,
)
from launcher.core.errors import ExitCode, LauncherError
from launcher.core.version import __version__


class OutputClosed(Exception):
    """stdout's reader went away. Not an OSError, so that click does not turn it into exit 1."""


@contextmanager
def _output_closed_as_its_own_error() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError as error:
        raise OutputClosed() from error


class LauncherGroup(click.Group):
    """The command group; a closed stdout leaves it as OutputClosed (exit 141 in main())."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _output_closed_as_its_own_error():  # --help into `| head`
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _output_closed_as_its_own_error():
            return super().invoke(ctx)


@click.group(
    cls=LauncherGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "-V", "--version", prog_name="launcher")
@click.option(
    "-i",
    "--inventory",
    "inventory_option",
    envvar="LAUNCHER_INVENTORY",
    metavar="PATH",
    help="Inventory file (default: env LAUNCHER_INVENTORY, else ./inventory.yaml).",
)
@click.option(
    "-t",
    "--target",
    "target_names",
    multiple=True,
    metavar="NAME",
    shell_complete=complete_targets,
    help=TARGET_HELP,
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No progress lines on stderr (errors and results still print).",
)
@known_hosts_option
@identity_option
@click.pass_context
def cli(
    ctx: click.Context,
    inventory_option: str | None,
    target_names: tuple[str, ...],
    debug: bool,
    quiet: bool,
) -> None:
    """Deploy and verify training runs in Proxmox LXC containers over SSH.

    \b
    Typical use:
      launcher deploy --restart -t prod     # upload, stop the old run, launch
      launcher verify --wait 180 -t prod    # startup probe: exit 0 healthy, 1 not

    \b
    Exit codes: 0 ok, 1 run unhealthy, 2 usage/config error, 3 unreachable,
    4 refused (lock held, run active), 130 interrupted, 141 output reader gone.

    Progress goes to stderr (-q silences it); results and --json documents to stdout.
    -i, -t, --debug and -q work before or after the command name. Shell completion:
    `launcher completion bash|zsh|fish`.
    """
    # main() passes an AppContext in, so that it can still see the command after a Ctrl-C.
    app = ctx.obj if isinstance(ctx.obj, AppContext) else AppContext(inventory_option)
    app.inventory_option = inventory_option
    source = ctx.get_parameter_source("inventory_option")
    app.inventory_from_env = source == click.core.ParameterSource.ENVIRONMENT
    app.target_names[:0] = target_names
    app.debug = app.debug or debug
    app.quiet = app.quiet or quiet
    app.command = ctx.invoked_subcommand
    ctx.obj = app


# Every subcommand that is not a declared command of the table (or shows its result its own
# way), by the function that loads it: a command's module (its options and imports) loads when
# the command is named, so `launcher status` loads cli/verify.py alone, not the other modules
# (~15 ms); --help, completion and the docs load them all.
def _inventory() -> click.Command:
    from launcher.cli.inventory import inventory

    return inventory


def _sandbox() -> click.Command:
    from launcher.cli.sandbox import sandbox

    return sandbox


def _deploy() -> click.Command:
    from launcher.cli.deploy import deploy_command

    return deploy_command


def _probe(name: str) -> Callable[[], click.Command]:
    def load() -> click.Command:
        from launcher.cli import verify

        command: click.Command = getattr(verify, f"{name}_command")
        return command

    return load


def _operate(name: str) -> Callable[[], click.Command]:
    def load() -> click.Command:
        from launcher.cli import operate

        command: click.Command = getattr(operate, f"{name}_command")
        return command

    return load


def _buckets() -> click.Command:
    from launcher.cli.buckets import buckets

    return buckets


def _status_format() -> click.Command:
    from launcher.cli.statusformat import status_format

    return status_format


def _init() -> click.Command:
    from launcher.cli.init import init_command

    return init_command


def _completion() -> click.Command:
    from launcher.cli.completion import completion_command

    return completion_command


def _watch() -> click.Command:
    from launcher.cli.watch import watch_command

    return watch_command


def _job() -> click.Command:
    from launcher.cli.job import job

    return job


def _declared(name: str) -> Callable[[], click.Command]:
    """A command of the table shown the default way (`launcher.cli.declared`)."""

    def load() -> click.Command:
        from launcher.cli.declared import declared
        from launcher.commands.table import COMMANDS

        return declared(COMMANDS[name])

    return load


SUBCOMMANDS: dict[str, Callable[[], click.Command]] = {
    "inventory": _inventory,
    "sandbox": _sandbox,
    "deploy": _deploy,
    **{n: _probe(n) for n in ("verify", "status", "smoke")},
    **{n: _operate(n) for n in ("logs", "stop", "attach", "history", "rollback", "doctor")},
    "disconnect": _operate("disconnect"),
    "buckets": _buckets,
    "status-format": _status_format,
    "init": _init,
    "completion": _completion,
    "watch": _watch,
    "job": _job,
}


def _table_commands() -> list[str]:
    """The table's other top-level commands (loaded only when every name is wanted, or one
    not listed above)."""
    from launcher.commands.table import COMMANDS

    return [n for n in COMMANDS if " " not in n and n not in SUBCOMMANDS]


class LazyCommands(MutableMapping[str, click.Command]):
    """The group's `commands`: each name's command loaded on its first lookup."""

    def __init__(self, where: Mapping[str, Callable[[], click.Command]]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            if name not in self._where and name in _table_commands():
                self._where[name] = _declared(name)
            command = self._where[name]()  # KeyError: no such command
            if not isinstance(command, click.Command) or command.name != name:
                raise TypeError(f"{self._where[name]} is not the command {name!r}")
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command
        self._where.setdefault(name, lambda: command)

    def __delitem__(self, name: str) -> None:
        del self._where[name]
        self._loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        self._where.update((n, _declared(n)) for n in _table_commands() if n not in self._where)
        return iter(list(self._where))

    def __len__(self) -> int:
        return len(list(iter(self)))


cli.commands = LazyCommands(SUBCOMMANDS)


# Commands whose work, once sent, runs to its end in the container whatever the client does.
TRANSACTION_COMMANDS = ("deploy", "rollback", "smoke")


def _interrupted(app: AppContext, dry_run: bool) -> NoReturn:
    """Exit 130; after a deploy or rollback, say that the container finishes it anyway."""
    click.echo("interrupted", err=True)
    note = _transaction_note(app, dry_run)
    if note:
        click.echo(note, err=True)
    sys.exit(int(ExitCode.INTERRUPTED))


def _transaction_note(app: AppContext, dry_run: bool) -> str | None:
    if app.command not in TRANSACTION_COMMANDS or dry_run:
        return None
    if app._inventory is None:
        return None  # interrupted before the inventory was read: nothing was sent
    try:
        names = [t.name for t in app.targets()]
    except (LauncherError, click.ClickException):
        names = list(app.target_names)
    if not names:
        return None
    base = ["launcher"] + (["-i", app.inventory_option] if app.inventory_option else [])
    history = [shlex.join([*base, "history", "-t", name]) for name in names]
    status = shlex.join([*base, "status", "-t", ",".join(names)])
    what = "rollback" if app.command == "rollback" else "deploy"
    return (
        f"note: Ctrl-C stopped only this client. A {what} transaction that had started goes on "
        "in the container to its end (stop, checkpoints, launch, record), holding the deploy "
        "lock until then.\n"
        f"see how it ended: {'; '.join(history)}\n"
        f"and the run:      {status}"
    )


def _paramiko_log(debug: bool) -> None:
    """paramiko's own log (handshake tracebacks) reaches stderr only with --debug; without it,
    remote.py gives it a NullHandler."""
    if debug:
        import logging

        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("paramiko %(levelname)s: %(message)s"))
        log = logging.getLogger("paramiko")
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _fail(error: LauncherError, debug: bool) -> NoReturn:
    print_error(error, debug=debug)
    sys.exit(int(error.exit_code))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the group and map every outcome onto ExitCode."""
    args = list(argv if argv is not None else sys.argv[1:])
    app = AppContext(None)
    run_guarded(
        app,
        lambda: cli.main(args=args, prog_name="launcher", standalone_mode=False, obj=app),
        debug="--debug" in args,
        dry_run="--dry-run" in args,
    )


def run_guarded(
    app: AppContext, body: Callable[[], Any], *, debug: bool, dry_run: bool = False
) -> NoReturn:
    """Run a command's body and end with its exit code (SystemExit): errors, Ctrl-C and a
    closed stdout become codes here, for the CLI and the Fabric tasks alike."""
    _paramiko_log(debug)
    try:
        code = body()
    except LauncherError as error:
        _fail(error, debug)
    except (click.exceptions.Abort, KeyboardInterrupt):
        _interrupted(app, dry_run)
    except click.ClickException as error:
        error.show()
        sys.exit(int(ExitCode.USAGE))
    except (BrokenPipeError, OutputClosed):
        _pipe_closed()
    except SystemExit:
        flush_stdout()
        raise
    flush_stdout()
    sys.exit(int(code or 0))


def flush_stdout() -> None:
    """Output still buffered for a reader that has gone fails here, not in the interpreter's
    shutdown (which would print "Exception ignored" and exit 120)."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _pipe_closed()


def _pipe_closed() -> NoReturn:
    """The reader went away (`launcher logs -f | head`): no traceback, the shell's SIGPIPE code."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(int(ExitCode.PIPE_CLOSED))

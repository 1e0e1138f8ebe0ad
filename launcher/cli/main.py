"""The click group, the global options, and the one place where errors become exit codes.

Workflow modules (and so pydantic, paramiko) are imported inside commands, so that
`launcher --help` and `launcher --version` stay fast.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import click

from launcher import __version__
from launcher.cli.params import PARALLEL
from launcher.errors import ExitCode, LauncherError

if TYPE_CHECKING:
    from launcher.config import Inventory, Target


@dataclass
class AppContext:
    """What the global options select; commands ask it for the inventory and targets."""

    inventory_option: str | None = None
    target_names: list[str] = field(default_factory=list)
    debug: bool = False
    quiet: bool = False  # no progress lines on stderr
    all_targets: bool = False
    parallel: int = 8
    command: str | None = None  # the subcommand being run (for the Ctrl-C note)
    _inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        from launcher.config import inventory_path, load_inventory

        if self._inventory is None:
            self._inventory = load_inventory(inventory_path(self.inventory_option))
        return self._inventory

    def names(self) -> list[str]:
        """-t as given, else LAUNCHER_TARGET (comma-separated), else (later) default_target."""
        if self.target_names or self.all_targets:
            return list(self.target_names)
        return [part for part in os.environ.get(TARGET_ENV, "").split(",") if part.strip()]

    def targets(self) -> list[Target]:
        inventory = self.inventory()
        names = inventory.resolve_names(self.names(), all_targets=self.all_targets)
        return [inventory.target(name) for name in names]

    def target(self) -> Target:
        targets = self.targets()
        if len(targets) != 1:
            chosen = ", ".join(t.name for t in targets)
            raise click.UsageError(
                f"this command acts on one target, not several ({chosen}); pass a single -t NAME"
            )
        return targets[0]


TARGET_ENV = "LAUNCHER_TARGET"

pass_app = click.make_pass_decorator(AppContext)


def _app(ctx: click.Context) -> AppContext:
    app = ctx.find_object(AppContext)
    if app is None:  # a command invoked on its own (tests): give it a context to fill
        app = ctx.ensure_object(AppContext)
    return app


def _add_targets(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    _app(ctx).target_names.extend(value)


def _set_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        _app(ctx).all_targets = True


def _set_parallel(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is not None:
        _app(ctx).parallel = value


def _set_inventory(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _app(ctx).inventory_option = value


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        _app(ctx).debug = True


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        _app(ctx).quiet = True


def complete_targets(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Target and group names from the inventory (-i, LAUNCHER_INVENTORY or ./inventory.yaml);
    nothing when it cannot be read: completion never prints an error."""
    from click.shell_completion import CompletionItem

    from launcher.config import inventory_path, load_inventory

    option = None
    for context in (ctx, *_parents(ctx)):
        option = option or context.params.get("inventory_option")
        app = context.obj if isinstance(context.obj, AppContext) else None
        option = option or (app.inventory_option if app else None)
    try:
        spec = load_inventory(inventory_path(option)).spec
    except Exception:  # any unreadable inventory: no candidates
        return []
    head, _, last = incomplete.rpartition(",")
    prefix = f"{head}," if head else ""
    names = [*spec.targets, *spec.groups]
    return [
        CompletionItem(prefix + name, help="group" if name in spec.groups else None)
        for name in names
        if name.startswith(last)
    ]


def _parents(ctx: click.Context) -> list[click.Context]:
    parents = []
    while ctx.parent is not None:
        ctx = ctx.parent
        parents.append(ctx)
    return parents


TARGET_HELP = (
    "Target or group (repeat or comma-separate; default: env LAUNCHER_TARGET, else the "
    "inventory's default_target)."
)

# `-t` is accepted before and after the command name (`launcher -t a deploy -t b`).
target_option = click.option(
    "-t",
    "--target",
    multiple=True,
    metavar="NAME",
    expose_value=False,
    callback=_add_targets,
    shell_complete=complete_targets,
    help=TARGET_HELP,
)

# Commands that act on exactly one target say so (a group or two names: exit 2).
single_target_option = click.option(
    "-t",
    "--target",
    multiple=True,
    metavar="NAME",
    expose_value=False,
    callback=_add_targets,
    shell_complete=complete_targets,
    help="The one target to act on (not a group; default: env LAUNCHER_TARGET, else the "
    "inventory's default_target).",
)


def global_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """-i, --debug and -q, accepted after the command name too (`launcher deploy --debug`)."""
    for option in (
        click.option(
            "-q",
            "--quiet",
            is_flag=True,
            expose_value=False,
            callback=_set_quiet,
            help="No progress lines on stderr (errors and the result still print).",
        ),
        click.option(
            "--debug",
            is_flag=True,
            expose_value=False,
            callback=_set_debug,
            help="Show tracebacks for errors.",
        ),
        click.option(
            "-i",
            "--inventory",
            metavar="PATH",
            expose_value=False,
            callback=_set_inventory,
            help="Inventory file (default: env LAUNCHER_INVENTORY, else ./inventory.yaml).",
        ),
    ):
        command = option(command)
    return command


def fleet_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """-t (several), --all and --parallel, for commands that can act on many targets at once."""
    command = click.option(
        "--parallel",
        type=PARALLEL,
        metavar="N",
        expose_value=False,
        callback=_set_parallel,
        help="At most N hosts at a time (default: 8); a host's containers run together.",
    )(command)
    command = click.option(
        "--all",
        is_flag=True,
        expose_value=False,
        callback=_set_all,
        help="Every target in the inventory.",
    )(command)
    return global_options(target_option(command))


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
    app.target_names[:0] = target_names
    app.debug = app.debug or debug
    app.quiet = app.quiet or quiet
    app.command = ctx.invoked_subcommand
    ctx.obj = app


def _register() -> None:
    from launcher.cli.buckets import buckets
    from launcher.cli.completion import completion_command
    from launcher.cli.deploy import deploy_command
    from launcher.cli.inventory import inventory
    from launcher.cli.operate import (
        attach_command,
        doctor_command,
        history_command,
        logs_command,
        rollback_command,
        stop_command,
    )
    from launcher.cli.sandbox import sandbox
    from launcher.cli.verify import smoke_command, status_command, verify_command
    from launcher.cli.watch import watch_command

    for command in (
        inventory,
        sandbox,
        deploy_command,
        verify_command,
        status_command,
        smoke_command,
        logs_command,
        stop_command,
        attach_command,
        history_command,
        rollback_command,
        doctor_command,
        buckets,
        completion_command,
        watch_command,
    ):
        cli.add_command(command)


_register()


def print_error(error: LauncherError, *, debug: bool = False) -> None:
    from launcher.termsafe import sanitize

    if debug:
        import traceback

        traceback.print_exception(error)
    # Messages can quote what a container printed (a compile error, a command's stderr).
    click.echo(f"error: {sanitize(error.message, keep_sgr=False)}", err=True)
    if error.hint:
        click.echo(f"hint: {sanitize(error.hint, keep_sgr=False)}", err=True)


# Commands whose work, once sent, runs to its end in the container whatever the client does.
TRANSACTION_COMMANDS = ("deploy", "rollback", "smoke")


def _interrupted(app: AppContext, argv: list[str]) -> NoReturn:
    """Exit 130; after a deploy or rollback, say that the container finishes it anyway."""
    click.echo("interrupted", err=True)
    note = _transaction_note(app, argv)
    if note:
        click.echo(note, err=True)
    sys.exit(int(ExitCode.INTERRUPTED))


def _transaction_note(app: AppContext, argv: list[str]) -> str | None:
    if app.command not in TRANSACTION_COMMANDS or "--dry-run" in argv:
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
    debug = "--debug" in args
    _paramiko_log(debug)
    app = AppContext(None)
    try:
        code = cli.main(args=args, prog_name="launcher", standalone_mode=False, obj=app)
    except LauncherError as error:
        _fail(error, debug)
    except click.exceptions.Abort:
        _interrupted(app, args)
    except click.ClickException as error:
        error.show()
        sys.exit(int(ExitCode.USAGE))
    except KeyboardInterrupt:
        _interrupted(app, args)
    except (BrokenPipeError, OutputClosed):
        _pipe_closed()
    except SystemExit:
        _flush_stdout()
        raise
    _flush_stdout()
    sys.exit(int(code or 0))


def _flush_stdout() -> None:
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

"""The click group, the global options, and the one place where errors become exit codes.

Workflow modules (and so pydantic, paramiko) are imported inside commands, so that
`launcher --help` and `launcher --version` stay fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

import click

from launcher import __version__
from launcher.errors import ExitCode, LauncherError

if TYPE_CHECKING:
    from launcher.config import Inventory, Target


@dataclass
class AppContext:
    """What the global options select; commands ask it for the inventory and targets."""

    inventory_option: str | None
    target_names: list[str] = field(default_factory=list)
    debug: bool = False
    all_targets: bool = False
    parallel: int = 8
    _inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        from launcher.config import inventory_path, load_inventory

        if self._inventory is None:
            self._inventory = load_inventory(inventory_path(self.inventory_option))
        return self._inventory

    def targets(self) -> list[Target]:
        inventory = self.inventory()
        names = inventory.resolve_names(self.target_names, all_targets=self.all_targets)
        return [inventory.target(name) for name in names]

    def target(self) -> Target:
        targets = self.targets()
        if len(targets) != 1:
            raise click.UsageError("this command acts on one target; pass a single -t NAME")
        return targets[0]


pass_app = click.make_pass_decorator(AppContext)


def _add_targets(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    ctx.find_object(AppContext).target_names.extend(value)  # type: ignore[union-attr]


def _set_all(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(AppContext).all_targets = True  # type: ignore[union-attr]


def _set_parallel(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is not None:
        ctx.find_object(AppContext).parallel = value  # type: ignore[union-attr]


# `-t` is accepted before and after the command name (`launcher -t a deploy -t b`).
target_option = click.option(
    "-t",
    "--target",
    multiple=True,
    metavar="NAME",
    expose_value=False,
    callback=_add_targets,
    help="Target or group (repeat or comma-separate; default: default_target).",
)


def fleet_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """-t (several), --all and --parallel, for commands that can act on many targets at once."""
    command = click.option(
        "--parallel",
        type=click.IntRange(min=1),
        metavar="N",
        expose_value=False,
        callback=_set_parallel,
        help="At most N hosts at a time (default 8); a host's containers run together.",
    )(command)
    command = click.option(
        "--all",
        is_flag=True,
        expose_value=False,
        callback=_set_all,
        help="Every target in the inventory.",
    )(command)
    return target_option(command)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "-V", "--version", prog_name="launcher")
@click.option(
    "-i",
    "--inventory",
    "inventory_option",
    envvar="LAUNCHER_INVENTORY",
    metavar="PATH",
    help="Inventory file (default ./inventory.yaml; env LAUNCHER_INVENTORY).",
)
@click.option(
    "-t",
    "--target",
    "target_names",
    multiple=True,
    metavar="NAME",
    help="Target or group to act on (repeat or comma-separate; default: default_target).",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(
    ctx: click.Context, inventory_option: str | None, target_names: tuple[str, ...], debug: bool
) -> None:
    """Deploy and verify training runs in Proxmox LXC containers over SSH.

    \b
    Typical use:
      launcher deploy --restart -t prod     # upload, stop the old run, launch
      launcher verify --wait 180 -t prod    # startup probe: exit 0 healthy, 1 not

    \b
    Exit codes: 0 ok, 1 run unhealthy, 2 usage/config error, 3 unreachable,
    4 refused (lock held, run active), 130 interrupted.
    """
    ctx.obj = AppContext(inventory_option, list(target_names), debug)


def _register() -> None:
    from launcher.cli.buckets import buckets
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
    ):
        cli.add_command(command)


_register()


def print_error(error: LauncherError, *, debug: bool = False) -> None:
    if debug:
        import traceback

        traceback.print_exception(error)
    click.echo(f"error: {error.message}", err=True)
    if error.hint:
        click.echo(f"hint: {error.hint}", err=True)


def _fail(error: LauncherError, debug: bool) -> NoReturn:
    print_error(error, debug=debug)
    sys.exit(int(error.exit_code))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the group and map every outcome onto ExitCode."""
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        code = cli.main(args=argv, prog_name="launcher", standalone_mode=False)
    except LauncherError as error:
        _fail(error, debug)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as error:
        error.show()
        sys.exit(int(ExitCode.USAGE))
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except BrokenPipeError:
        # The reader went away (`launcher logs -f | head`): no traceback, the shell's SIGPIPE code.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(ExitCode.PIPE_CLOSED))
    sys.exit(int(code or 0))

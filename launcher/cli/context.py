"""What every command shares: the app context (inventory, targets, global options), the option
decorators for targets and fleets, and how an error is printed.

Commands import these from here; `cli/main.py` imports the commands. So no command module
imports main, and main's group is the only place that registers them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from launcher.core.errors import LauncherError
from launcher.core.params import PARALLEL

if TYPE_CHECKING:
    from launcher.config.models import Inventory, Target


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
    inventory_from_env: bool = False  # inventory_option is LAUNCHER_INVENTORY's, not -i's
    _inventory: Inventory | None = None

    def inventory(self) -> Inventory:
        from launcher.config.models import inventory_path, load_inventory

        if self._inventory is None:
            self._inventory = load_inventory(inventory_path(self.inventory_option))
        return self._inventory

    def say_inventory_from_env(self) -> None:
        """One line on stderr when the inventory is LAUNCHER_INVENTORY's: a shell that once ran
        `eval "$(launcher sandbox env)"` acts on the sandbox in any directory, its own
        ./inventory.yaml aside (-q silences it)."""
        from launcher.config.models import DEFAULT_INVENTORY

        chosen = self.inventory_option
        if not (self.inventory_from_env and chosen) or self.quiet:
            return
        here = Path(DEFAULT_INVENTORY)
        unused = here.is_file() and here.resolve() != Path(chosen).resolve()
        aside = f"; ./{DEFAULT_INVENTORY} here is not used" if unused else ""
        click.echo(f"inventory: {chosen} (from {INVENTORY_ENV}{aside})", err=True)

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
INVENTORY_ENV = "LAUNCHER_INVENTORY"  # as config.inventory_path reads it

pass_app = click.make_pass_decorator(AppContext)


def _app(ctx: click.Context) -> AppContext:
    app = ctx.find_object(AppContext)
    if app is None:  # a command invoked on its own (tests): give it a context to fill
        app = ctx.ensure_object(AppContext)
    return app


def _add_targets(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    _app(ctx).target_names.extend(value)


def _app_flag(
    *names: str, sets: str, help: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A flag that sets the app's attribute `sets` (given after the command name too, it never
    unsets what was given before it)."""

    def set_true(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            setattr(_app(ctx), sets, True)

    return click.option(*names, is_flag=True, expose_value=False, callback=set_true, help=help)


def _set_parallel(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is not None:
        _app(ctx).parallel = value


def _set_inventory(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        _app(ctx).inventory_option = value
        _app(ctx).inventory_from_env = False


def complete_targets(
    ctx: click.Context, _param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Target and group names from the inventory (-i, LAUNCHER_INVENTORY or ./inventory.yaml);
    nothing when it cannot be read: completion never prints an error."""
    from click.shell_completion import CompletionItem

    from launcher.config.models import inventory_path, load_inventory

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


def _target_option(help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "-t",
        "--target",
        multiple=True,
        metavar="NAME",
        expose_value=False,
        callback=_add_targets,
        shell_complete=complete_targets,
        help=help,
    )


# `-t` is accepted before and after the command name (`launcher -t a deploy -t b`).
target_option = _target_option(TARGET_HELP)
# Commands that act on exactly one target say so (a group or two names: exit 2).
single_target_option = _target_option(
    "The one target to act on (not a group; default: env LAUNCHER_TARGET, else the "
    "inventory's default_target)."
)


KNOWN_HOSTS_ENV = "LAUNCHER_KNOWN_HOSTS"
IDENTITY_ENV = "LAUNCHER_IDENTITY"


def _exported_path(env: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    """A callback that puts the option's file, made absolute, into the environment variable
    `env`: endpoints are resolved in several places (persist's background process, attach's
    ssh), and each reads it there."""

    def export(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value:
            os.environ[env] = os.path.abspath(os.path.expanduser(value))

    return export


known_hosts_option = click.option(
    "--known-hosts",
    metavar="FILE",
    envvar=KNOWN_HOSTS_ENV,
    expose_value=False,
    callback=_exported_path(KNOWN_HOSTS_ENV),
    help="known_hosts file for every host and jump host, instead of the inventory's and "
    "ssh_config's (env LAUNCHER_KNOWN_HOSTS; for CI: a file written from a secret).",
)

identity_option = click.option(
    "--identity",
    metavar="FILE",
    envvar=IDENTITY_ENV,
    expose_value=False,
    callback=_exported_path(IDENTITY_ENV),
    help="Private key for every host and jump host, instead of the inventory's identity_file "
    "and ssh_config's (env LAUNCHER_IDENTITY). Without it, a missing identity_file falls back "
    "to the keys ssh-agent holds.",
)


def global_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """-i, --debug and -q, accepted after the command name too (`launcher deploy --debug`)."""
    for option in (
        known_hosts_option,
        identity_option,
        _app_flag(
            "-q",
            "--quiet",
            sets="quiet",
            help="No progress lines on stderr (errors and the result still print).",
        ),
        _app_flag("--debug", sets="debug", help="Show tracebacks for errors."),
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
    command = _app_flag("--all", sets="all_targets", help="Every target in the inventory.")(command)
    return global_options(target_option(command))


def print_error(error: LauncherError, *, debug: bool = False) -> None:
    from launcher.output.termsafe import sanitize

    if debug:
        import traceback

        traceback.print_exception(error)
    # Messages can quote what a container printed (a compile error, a command's stderr).
    click.echo(f"error: {sanitize(error.message, keep_sgr=False)}", err=True)
    if error.hint:
        click.echo(f"hint: {sanitize(error.hint, keep_sgr=False)}", err=True)

"""A declared command (`launcher.commands.table`) as a click command: its options made from its
request's fields (`launcher.core.declare`), its help the request's docstring, and a show
function that runs the request and renders its result (ending in SystemExit). The Fabric tasks
run the same command's `run` with their own values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from launcher.cli.context import (
    AppContext,
    fleet_options,
    global_options,
    single_target_option,
)
from launcher.commands.args import spelled_choice
from launcher.commands.table import Command, wiring, work
from launcher.core.declare import Parameter, parameters

F = TypeVar("F", bound=Callable[..., Any])
# Runs the request and shows its result as the CLI does: (app, request, command).
Show = Callable[[AppContext, Any, Command], None]


def show_on_targets(app: AppContext, request: Any, command: Command) -> None:
    """The request on the app's targets: one target's summary (or the JSON envelope, with a
    `json` field set), a fleet's table, the worst exit code."""
    from launcher.cli.targets import emit_json, exit_with, run_on_targets, say_result

    outcomes = run_on_targets(app, work(request))
    as_json = bool(getattr(request, "json", False))
    if as_json:
        emit_json(command.name, outcomes)
    else:
        say_result(outcomes)
    exit_with(outcomes, title=command.name, table=not as_json)


def show_on_inventory(app: AppContext, request: Any, command: Command) -> None:
    """The request over the app's inventory: its result's text, or its JSON document."""
    from launcher.cli.targets import result_output
    from launcher.output.jsonout import emit
    from launcher.output.termsafe import sanitize

    result = wiring(command).run(app.inventory(), request)
    with result_output():
        if getattr(request, "json", False):
            emit(result.to_json())
        else:
            click.echo(sanitize(result.summary, keep_sgr=False))
    raise SystemExit(int(result.exit_code))


class DeclaredCommand(click.Command):
    """A click command made from a declared command; `run` is what its callback calls."""

    def __init__(self, command: Command, show: Show, name: str) -> None:
        self.declared = command
        self.show = show
        self.parameters = parameters(command.request_type)
        arguments = [_argument(p) for p in self.parameters if p.option.argument]
        options = [o for p in self.parameters if not p.option.argument for o in _options(p)]
        super().__init__(
            name,
            callback=self._callback,
            params=[*arguments, *_shared(command), *options],
            help=command.help,
        )

    def _callback(self, **values: Any) -> None:
        self.run(click.get_current_context().ensure_object(AppContext), values)

    def run(self, app: AppContext, values: Mapping[str, Any], *, text: bool = False) -> None:
        """Build the request from the options' values (by their Python names) and show it;
        `text`: a task's values, the command line's text."""
        given = dict(values)
        for p in self.parameters:
            if p.option.spelled:
                given[p.keyword] = spelled_choice(p, given)
        self.show(app, self.declared.request(given, api=False, text=text), self.declared)


def declared(command: Command, show: Show | None = None) -> DeclaredCommand:
    """The click command of `command` (default show: per target, or over the inventory)."""
    default = show_on_inventory if command.on == "inventory" else show_on_targets
    return DeclaredCommand(command, show or default, command.name.rpartition(" ")[2])


def declared_options(request_type: type) -> Callable[[F], F]:
    """The request type's fields as click options on a hand-written command, in field order
    (after the options of the decorators above it)."""

    def add(command: F) -> F:
        made = [o for p in parameters(request_type) for o in _options(p)]
        params = command.__dict__.setdefault("__click_params__", [])
        params.extend(reversed(made))  # click lists a command's decorators' params reversed
        return command

    return add


def _shared(command: Command) -> list[click.Parameter]:
    """The options every command of its kind takes: targets (-t, --all, --parallel) and the
    global ones (-i, -q, --debug, --known-hosts, --identity)."""

    def stub() -> None:
        return None

    if command.on == "targets":
        fleet_options(stub)
    elif command.on == "target":
        single_target_option(global_options(stub))
    else:
        global_options(stub)
    return list(reversed(stub.__click_params__))  # type: ignore[attr-defined]


def _argument(p: Parameter) -> click.Argument:
    return click.Argument([p.keyword], nargs=-1 if p.option.repeat else 1)


def _options(p: Parameter) -> list[click.Option]:
    how = p.option
    if how.spelled:
        return [
            click.Option([spelling, spelling[2:].replace("-", "_")], is_flag=True, help=text)
            for _, spelling, text in how.spelled
        ]
    declared = [*p.spellings, p.keyword]
    if how.is_flag and isinstance(p.default, bool):
        return [click.Option(declared, is_flag=True, help=how.help)]
    extra: dict[str, Any] = {"metavar": how.metavar} if how.metavar else {}
    if how.repeat:
        extra["multiple"] = True
    elif how.nargs > 1:
        extra["nargs"] = how.nargs
    else:
        extra["default"] = p.default
    if how.type is not None:
        extra["type"] = how.type
    return [click.Option(declared, help=how.help, show_default=how.show_default, **extra)]

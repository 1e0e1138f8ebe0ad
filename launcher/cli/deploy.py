"""`launcher deploy`: verified upload, real stop of the old run, checkpoints set aside, launch."""

from __future__ import annotations

from launcher.cli.context import AppContext
from launcher.cli.declared import declared, show_on_targets
from launcher.commands.table import COMMANDS, Command
from launcher.core.requests import DeployOptions


def show_deploy(app: AppContext, options: DeployOptions, command: Command) -> None:
    """Deploy on the app's targets and show the result."""
    app.say_inventory_from_env()
    show_on_targets(app, options, command)


deploy_command = declared(COMMANDS["deploy"], show_deploy)

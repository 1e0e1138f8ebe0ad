"""Fabric tasks: launcher's commands for a fabfile, with the CLI's output and exit codes.

    # fabfile.py
    from launcher.tasks import deploy, logs, status, stop, verify

    $ fab deploy --target prod --restart
    $ fab verify --target prod --wait 180      # exit 0 healthy, 1 unhealthy, 3 unreachable

Each task runs the `launcher` command of the same name in this process, so what it prints and
the code `fab` exits with are the CLI's. The inventory is --inventory, else
$LAUNCHER_INVENTORY, else ./inventory.yaml. Durations take the CLI's forms (90, 90s, 3m).
For Python code that wants results rather than output, see launcher.api.Launcher.
"""

from __future__ import annotations

from invoke.context import Context
from invoke.exceptions import Exit
from invoke.tasks import task

# Short flags are given out in signature order: `inventory` comes right after `target` in every
# task, so -t and -i mean what they mean for the CLI.

TARGET_HELP = "Target or group (a,b for several; default: the inventory's default_target)."
INVENTORY_HELP = "Inventory file (default: $LAUNCHER_INVENTORY, else ./inventory.yaml)."


def _run(inventory: str | None, target: str | None, command: list[str]) -> None:
    """Run one launcher command; a non-zero exit becomes invoke's Exit with that code."""
    from launcher.cli.main import main

    argv = (["-i", inventory] if inventory else []) + command + (["-t", target] if target else [])
    try:
        main(argv)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 0 if done.code is None else 1
        if code:
            raise Exit(code=code) from None


def _option(name: str, value: object) -> list[str]:
    return [] if value is None else [name, str(value)]


@task(
    help={
        "target": TARGET_HELP,
        "inventory": INVENTORY_HELP,
        "restart": "Stop the running session first (C-c, wait, kill).",
        "dry_run": "Show every step it would take; change nothing.",
        "grace": "Wait this long after C-c: 90, 2m (default: playbook stop_grace).",
        "json": "Print the report as JSON.",
    }
)
def deploy(
    c: Context,
    target: str | None = None,
    inventory: str | None = None,
    restart: bool = False,
    dry_run: bool = False,
    grace: str | None = None,
    json: bool = False,
) -> None:
    """Upload the script (verified), stop the old run, set checkpoints aside, launch in tmux."""
    flags = [
        *(["--restart"] if restart else []),
        *(["--dry-run"] if dry_run else []),
        *_option("--grace", grace),
        *(["--json"] if json else []),
    ]
    _run(inventory, target, ["deploy", *flags])


@task(
    help={
        "target": TARGET_HELP,
        "inventory": INVENTORY_HELP,
        "wait": "Warmup: only fatal signs are judged: 90, 3m (default: playbook verify.wait).",
        "interval": "Time between polls: 2, 2s, 1m.",
        "window": "How long after the warmup it may poll: 300, 5m.",
        "successes": "Consecutive passing polls needed.",
        "json": "Print the report as JSON.",
        "junit": "Write a JUnit XML report to this file.",
    }
)
def verify(
    c: Context,
    target: str | None = None,
    inventory: str | None = None,
    wait: str | None = None,
    interval: str | None = None,
    window: str | None = None,
    successes: str | None = None,
    json: bool = False,
    junit: str | None = None,
) -> None:
    """Startup probe: exit 0 healthy, 1 unhealthy (crash, stall, drained queues...)."""
    flags = [
        *_option("--wait", wait),
        *_option("--interval", interval),
        *_option("--window", window),
        *_option("--successes", successes),
        *(["--json"] if json else []),
        *_option("--junit", junit),
    ]
    _run(inventory, target, ["verify", *flags])


@task(help={"target": TARGET_HELP, "inventory": INVENTORY_HELP, "json": "Print JSON."})
def status(
    c: Context, target: str | None = None, inventory: str | None = None, json: bool = False
) -> None:
    """One poll of the run, judged at once: exit 0 healthy, 1 not."""
    _run(inventory, target, ["status", *(["--json"] if json else [])])


@task(
    help={
        "target": TARGET_HELP,
        "inventory": INVENTORY_HELP,
        "grace": "Wait this long after C-c before killing: 90, 2m (default: stop_grace).",
    }
)
def stop(
    c: Context, target: str | None = None, inventory: str | None = None, grace: str | None = None
) -> None:
    """Stop the run gracefully: C-c, wait, kill the session and what is left of it."""
    _run(inventory, target, ["stop", *_option("--grace", grace)])


@task(
    help={
        "target": TARGET_HELP,
        "inventory": INVENTORY_HELP,
        "tail": "How many of the last lines to show (default 50).",
        "follow": "Keep printing new lines until the run ends or Ctrl-C.",
    }
)
def logs(
    c: Context,
    target: str | None = None,
    inventory: str | None = None,
    # A string, checked by the CLI's own option (exit 2 for `--tail abc`): with an int default,
    # invoke would convert it itself and fail with a ValueError traceback.
    tail: str = "50",
    follow: bool = False,
) -> None:
    """Show the run's log file, or follow it (-f)."""
    _run(inventory, target, ["logs", "--tail", str(tail), *(["--follow"] if follow else [])])

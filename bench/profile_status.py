"""Where one `launcher status` spends its time: imports, configuration, the poll, the rest.

Runs the real CLI in this process with timers wrapped around launcher's functions (in memory
only; nothing in launcher/ changes), then, on a connection of the same kind (persisted or a new
SSH connection, as the inventory says), the parts of the poll's round trip for reference: an
empty command (the host's sshd session and login shell), `pct exec CT -- true` (pct and the
container), the bare `tmux capture-pane` a person would type, and the agent's poll again.
Prints JSON: {"phases": [[name, seconds], ...], "total": s, "references": [[name, seconds],
...], "reference_seconds": s} (the last: time spent on the references after the command).

Usage: python bench/profile_status.py -i INVENTORY -t TARGET [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import launcher.cli.main  # noqa: E402

CLI_IMPORTED = time.perf_counter()
import launcher.commands  # noqa: E402  (what `status` imports: config, pydantic, verify)

IMPORTED = time.perf_counter()
import launcher.config  # noqa: E402
import launcher.transport.connection  # noqa: E402
import launcher.transport.pool  # noqa: E402
import launcher.transport.ssh  # noqa: E402

NESTED = "(in the next) "  # timed inside the phase listed after it (not added to the sum)
phases: list[tuple[str, float]] = [
    ("imports: the CLI (click)", CLI_IMPORTED - T0),
    ("imports: status's modules (pydantic, the configuration models, verify)", 0.0),
]


def timed(owner: Any, attr: str, label: str) -> None:
    original = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            phases.append((label, time.perf_counter() - start))

    setattr(owner, attr, wrapper)


def median_of(runs: int, action: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("-t", "--target", required=True)
    parser.add_argument("--runs", type=int, default=5, help="runs of each reference (median)")
    args = parser.parse_args()
    phases[1] = (phases[1][0], IMPORTED - CLI_IMPORTED)

    timed(launcher.config, "load_inventory", "configuration: the inventory")
    timed(launcher.config, "load_playbook", "configuration: the playbook")
    timed(
        launcher.transport.pool,
        "resolve_endpoint",
        "where to connect (ssh -G; without a persisted connection, paramiko loads meanwhile)",
    )
    timed(launcher.transport.ssh.SSHConnection, "_connect", NESTED + "connect (SSH)")
    timed(
        launcher.transport.connection.Connection,
        "run",
        "the poll: one round trip (pct exec, the agent)",
    )
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # launcher's own report; JSON is ours
            launcher.cli.main.main(["-i", args.inventory, "-t", args.target, "status"])
    except SystemExit as exit_:
        if exit_.code not in (0, 1, None):
            raise
    total = time.perf_counter() - start
    accounted = sum(s for name, s in phases[2:] if not name.startswith(NESTED))
    phases.append(("the rest (click, judging the poll, the report)", total - accounted))
    status_phases = list(phases)
    after = time.perf_counter()
    references = measure_references(args.inventory, args.target, args.runs)
    json.dump(
        {
            "phases": [[name, round(s, 4)] for name, s in status_phases],
            "total": round(total + IMPORTED - T0, 4),
            "references": [[name, round(s, 4)] for name, s in references],
            "reference_seconds": round(time.perf_counter() - after, 4),
        },
        sys.stdout,
    )
    print(flush=True)
    # As the console script ends (launcher/console.py): without the interpreter's teardown, so
    # that the wall time less `total` is the interpreter's start-up alone.
    os._exit(0)


def measure_references(inventory: str, name: str, runs: int) -> list[tuple[str, float]]:
    """The poll's round trip in parts, on a connection of the kind the command used."""
    from launcher.agentclient import container_for
    from launcher.config import inventory_path, load_inventory
    from launcher.container import exec_command
    from launcher.verify.poll import poll_once

    target = load_inventory(inventory_path(inventory)).target(name)
    spec = target.playbook.spec
    capture = ["tmux", "capture-pane", "-p", "-J", "-S", f"-{spec.verify.lines}"]
    capture += ["-t", spec.session]
    with launcher.transport.pool.ConnectionPool() as pool:
        conn = pool.get(target.host_name, target.host)
        container = container_for(target, conn)
        conn.run("true", timeout=30)  # connects, when it is not persisted

        def run(command: str) -> Callable[[], object]:
            return lambda: conn.run(command, timeout=30)

        return [
            ("an empty command (sshd's session, the login shell)", median_of(runs, run("true"))),
            (
                f"pct exec {target.vmid} -- true (+ pct, the container)",
                median_of(runs, run(exec_command(target.vmid, ["true"]))),
            ),
            (
                "pct exec ... tmux capture-pane (+ the capture: what A runs)",
                median_of(runs, run(exec_command(target.vmid, capture))),
            ),
            (
                "the agent's poll (+ python3 and the agent, the GPUs' query)",
                median_of(runs, lambda: poll_once(container, target, spec.verify.lines)),
            ),
        ]


if __name__ == "__main__":
    main()

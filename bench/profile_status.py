"""Where one `launcher status` spends its time: imports, configuration, the poll, the rest.

Runs the real CLI in this process with timers wrapped around launcher's functions (in memory
only; nothing in launcher/ changes): with a new SSH connection (the target's host sets no
control_persist), or through its persisted connection (one `launcher status` run first, in a
process of its own, so that the background process is up and the agent cached). Then, on a
connection of the same kind, the parts of the poll's round trip for reference: an empty
command (the host's sshd session and login shell), `pct exec CT -- true` (pct and the
container), the bare `tmux capture-pane` a person would type, and the agent's poll again.
Prints JSON: {"phases": [[name, seconds], ...], "total": s, "references": [[name, seconds],
...], "reference_seconds": s} (the last: time spent on the references after the command, and
on the warm-up before it).

Usage: python bench/profile_status.py -i INVENTORY -t TARGET [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from phase_timer import NESTED, Phases, timed  # noqa: E402

phases: Phases = []


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
    start = time.perf_counter()
    if persisted(args.inventory, args.target):
        warm_up(args.inventory, args.target)
    prepared = time.perf_counter() - start
    profile_in_process(args.inventory, args.target)
    total = time.perf_counter() - T0 - prepared  # as the command: since this script's start
    status_phases = list(phases)
    after = time.perf_counter()
    references = measure_references(args.inventory, args.target, args.runs)
    json.dump(
        {
            "phases": [[name, round(s, 4)] for name, s in status_phases],
            "total": round(total, 4),
            "references": [[name, round(s, 4)] for name, s in references],
            # the profiler's own work: not the command's (its mode, the warm-up)
            "reference_seconds": round(time.perf_counter() - after + prepared, 4),
        },
        sys.stdout,
    )
    print(flush=True)
    # As the console script ends (launcher/entry/console.py): without the interpreter's teardown, so
    # that the wall time less `total` is the interpreter's start-up alone.
    os._exit(0)


def persisted(inventory: str, target: str) -> bool:
    """Whether the target's host keeps its connection (control_persist), read with YAML alone
    (nothing of launcher's is imported before the profiled command)."""
    import yaml

    doc = yaml.safe_load(Path(inventory).read_text())
    host = doc["hosts"][doc["targets"][target]["host"]]
    return bool(host.get("control_persist"))


def warm_up(inventory: str, target: str) -> None:
    """One `launcher status` in a process of its own: the persisted connection's background
    process started (if none runs), the agent cached in the container."""
    argv = [sys.executable, "-m", "launcher", "-i", inventory, "-t", target, "status"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode not in (0, 1):
        raise SystemExit(f"warm-up status exited {done.returncode}: {done.stderr[-2000:]}")


def profile_in_process(inventory: str, target: str) -> None:
    """The CLI in this process, its imports and calls timed."""
    began = time.perf_counter()
    import launcher.cli.main

    cli_imported = time.perf_counter()
    # What `status` imports: its command module (the table, the fleet, the configuration models
    # and pydantic) and its workflow (verify's judging).
    import launcher.cli.verify
    import launcher.probe.workflows

    imported = time.perf_counter()
    import launcher.config.models
    import launcher.transport.connection
    import launcher.transport.pool
    import launcher.transport.ssh

    phases.append(("imports: the CLI (click)", cli_imported - began))
    phases.append(
        (
            "imports: status's modules (pydantic, the configuration models, verify)",
            imported - cli_imported,
        )
    )
    timed(phases, launcher.config.models, "load_inventory", "configuration: the inventory")
    timed(phases, launcher.config.models, "load_playbook", "configuration: the playbook")
    timed(
        phases,
        launcher.transport.pool,
        "resolve_endpoint",
        "where to connect (ssh -G; without a persisted connection, paramiko loads meanwhile)",
    )
    timed(phases, launcher.transport.ssh.SSHConnection, "_connect", NESTED + "connect (SSH)")
    timed(
        phases,
        launcher.transport.connection.Connection,
        "run",
        "the poll: one round trip (pct exec, the agent)",
    )
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # launcher's own report; JSON is ours
            launcher.cli.main.main(["-i", inventory, "-t", target, "status"])
    except SystemExit as exit_:
        if exit_.code not in (0, 1, None):
            raise
    accounted = sum(s for name, s in phases[2:] if not name.startswith(NESTED))
    phases.append(
        ("the rest (click, judging the poll, the report)", time.perf_counter() - start - accounted)
    )


def measure_references(inventory: str, name: str, runs: int) -> list[tuple[str, float]]:
    """The poll's round trip in parts, on a connection of the kind the command used."""
    import launcher.transport.pool
    from launcher.config.models import inventory_path, load_inventory
    from launcher.container.agentclient import container_for
    from launcher.container.pct import exec_command
    from launcher.probe.poll import poll_once

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

"""Where one `launcher status` spends its time: imports, configuration, the poll, the rest.

With a new SSH connection (the target's host sets no control_persist): runs the real CLI in
this process with timers wrapped around launcher's functions (in memory only; nothing in
launcher/ changes). With its connection persisted: as a terminal's user gets it, through the
command server (launcher/entry/cmdserver/, started first if none runs for this code): the client's
parts timed here (the code's fingerprint, the connection, the hand-over, the server's child
running the command). Then, on a connection of the same kind, the parts of the poll's round
trip for reference: an
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

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from phase_timer import NESTED, Phases, timed  # noqa: E402

phases: Phases = []
SERVED_ENV = ("LAUNCHER_CONTROL_PERSIST", "600")  # what figures.SERVED_ENV sets


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
    served = persisted(args.inventory, args.target)
    if served:
        os.environ.setdefault(*SERVED_ENV)
        began = time.perf_counter()
        from launcher.entry.cmdserver import client  # noqa: F401 - what the console script imports

        imports = time.perf_counter() - began
        prepared = time.perf_counter() - start - imports
        prepared += serve_ready(args.inventory, args.target)
        phases.append(
            ("the client's imports (socket, json, hashlib: the standard library)", imports)
        )
        hand_over(args.inventory, args.target)
    else:
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
            # the profiler's own work: not the command's (its mode, a server started first)
            "reference_seconds": round(time.perf_counter() - after + prepared, 4),
            "served": served,
        },
        sys.stdout,
    )
    print(flush=True)
    # As the console script ends (launcher/entry/console.py): without the interpreter's teardown, so
    # that the wall time less `total` is the interpreter's start-up alone.
    os._exit(0)


def persisted(inventory: str, target: str) -> bool:
    """Whether the target's host keeps its connection (control_persist), read with YAML alone
    (pydantic and the CLI stay unimported for the served profile)."""
    import yaml

    doc = yaml.safe_load(Path(inventory).read_text())
    host = doc["hosts"][doc["targets"][target]["host"]]
    return bool(host.get("control_persist"))


def profile_in_process(inventory: str, target: str) -> None:
    """The CLI in this process, its imports and calls timed."""
    began = time.perf_counter()
    import launcher.cli.main

    cli_imported = time.perf_counter()
    import launcher.commands.table  # (what `status` imports: config, pydantic, verify)

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


def serve_ready(inventory: str, target: str) -> float:
    """A command server for this process's code, started if none answers, and one command
    through it (its persisted connection, the agent cache): seconds it took."""
    from launcher.entry.cmdserver import client, wire

    start = time.perf_counter()
    print_ = wire.fingerprint()
    path = wire.socket_path(print_)
    if path is None:
        raise SystemExit("no private runtime directory: nothing can be served")
    if client._connect(path) is None:
        client.start(client.NoServer(start=True, path=path, fingerprint=print_))
        deadline = time.monotonic() + 60
        while client._connect(path) is None:
            if time.monotonic() > deadline:
                raise SystemExit("the command server did not start")
            time.sleep(0.05)
    phases.clear()
    hand_over(inventory, target)
    phases.clear()
    return time.perf_counter() - start


def hand_over(inventory: str, target: str) -> None:
    """client.hand_over's steps, each timed; the command's report to stderr (fd 1 is ours)."""
    import socket

    from launcher.entry.cmdserver import client, wire

    argv = ["launcher", "-i", inventory, "-t", target, "status"]  # sys.argv: its [1:] are read
    start = time.perf_counter()
    path = wire.socket_path(wire.fingerprint())
    assert path is not None
    phases.append(
        (
            "the client: the code's fingerprint (launcher's files' sizes and mtimes)",
            time.perf_counter() - start,
        )
    )
    start = time.perf_counter()
    sock = client._connect(path)
    if sock is None:
        raise SystemExit("no command server answered")
    phases.append(
        ("the client: connect to the server (peer uid checked)", time.perf_counter() - start)
    )
    start = time.perf_counter()
    streams = [client._stream(s) for s in (sys.stdin, sys.stderr, sys.stderr)]
    request = wire.Request(argv, os.getcwd(), dict(os.environ), client._umask(), streams)
    with sock:
        socket.send_fds(sock, [wire.encode(request)], [0, 2, 2])
        started = wire.decode(sock.recv(wire.MAX_PACKET))
        assert isinstance(started, wire.Started), started
        phases.append(
            (
                "the hand-over: argv, environment, fds; the fork; the child's inventory look",
                time.perf_counter() - start,
            )
        )
        start = time.perf_counter()
        sock.send(wire.encode(wire.Go()))
        while True:
            message = wire.decode(sock.recv(wire.MAX_PACKET))
            if isinstance(message, wire.Exited):
                break
        phases.append(
            (
                "the server's child: the command (configuration, the poll, judging, the report)",
                time.perf_counter() - start,
            )
        )
        if message.code not in (0, 1):
            raise SystemExit(f"status exited {message.code}")


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

"""Where one `launcher deploy --restart` spends its time: imports, connect, each remote call.

Runs the real CLI in this process with timers wrapped around launcher's functions (in memory
only; nothing in launcher/ changes), then one bare agent round trip (a poll) for reference.
Prints JSON: {"phases": [[name, seconds], ...], "total": s, "poll_round_trip": s,
"reference_seconds": s} (the last: time spent on the reference poll after the deploy).

Usage: python bench/profile_deploy.py -i INVENTORY -t TARGET
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

from phase_timer import NESTED, Phases, timed  # noqa: E402

import launcher.cli.main  # noqa: E402
import launcher.container.agentclient  # noqa: E402
import launcher.container.pct  # noqa: E402
import launcher.deploy.deploy  # noqa: E402
import launcher.transport.pool  # noqa: E402
import launcher.transport.ssh  # noqa: E402

IMPORTED = time.perf_counter()
phases: Phases = [("imports (cli, deploy, remote: paramiko, pydantic)", 0.0)]


def time_transaction() -> None:
    """The transaction's round trip, and before it (nested) each of its steps as the agent
    timed it in the container."""
    owner = launcher.container.agentclient.AgentClient
    original = owner.transaction

    def transaction(client: Any, request: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        answer = original(client, request, **kwargs)
        elapsed = time.perf_counter() - start
        for step in answer.get("steps") or []:
            if step.get("seconds") is not None:
                phases.append((f"{NESTED}agent step {step['name']}", float(step["seconds"])))
        phases.append((f"agent {request.get('op')} transaction (one pct exec, streamed)", elapsed))
        return answer

    owner.transaction = transaction  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("-t", "--target", required=True)
    args = parser.parse_args()
    phases[0] = (phases[0][0], IMPORTED - T0)

    timed(
        phases,
        launcher.transport.ssh.SSHConnection,
        "_connect",
        lambda *a, **k: NESTED + "connect (SSH)",
    )
    timed(
        phases,
        launcher.container.pct.Container,
        "push",
        lambda *a, **k: "push: stdin to a host temp file + pct push (one ssh exec)",
    )
    timed(
        phases,
        launcher.container.agentclient.AgentClient,
        "call",
        lambda client, request, **k: f"agent {request.get('op')} (one pct exec)",
    )
    time_transaction()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # launcher's own report; JSON is ours
            launcher.cli.main.main(["-i", args.inventory, "-t", args.target, "deploy", "--restart"])
    except SystemExit as exit_:
        if exit_.code:
            raise
    total = time.perf_counter() - start

    accounted = sum(s for name, s in phases[1:] if not name.startswith(NESTED))
    phases.append(("other (config, rendering, local work)", total - accounted))
    deploy_phases = list(phases)
    after = time.perf_counter()

    # One bare agent round trip on a connection that is already open, for reference.
    from launcher.config.models import inventory_path, load_inventory
    from launcher.container.agentclient import container_for
    from launcher.probe.poll import poll_once

    target = load_inventory(inventory_path(args.inventory)).target(args.target)
    with launcher.transport.pool.ConnectionPool() as pool:
        container = container_for(target, pool.get(target.host_name, target.host))
        poll_once(container, target, 10)  # connects
        poll_start = time.perf_counter()
        poll_once(container, target, 10)
        poll = time.perf_counter() - poll_start
    json.dump(
        {
            "phases": [[name, round(s, 4)] for name, s in deploy_phases],
            "total": round(total + phases[0][1], 4),
            "poll_round_trip": round(poll, 4),
            "reference_seconds": round(time.perf_counter() - after, 4),
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()

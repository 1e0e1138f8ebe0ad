"""What each verify poll sends to the container, and what one poll round trip costs with the agent
cached next to sending its source with every call (as launcher did before the cache).

Runs verify's own poll (runops.poll_once) in this process over a connection that records the
bytes of each command (command line + stdin). The caller clears the container's agent cache
first, so the first poll is the one that sends the agent.
Prints JSON: {"first": [bytes per command of the first poll], "after": [bytes per later poll],
"cached": [seconds per poll], "source": [seconds per poll sending the source]}.

Usage: python bench/agent_bytes.py -i INVENTORY -t TARGET [--polls N]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Recording  # also puts the checkout on sys.path

from launcher.agent.protocol import BOOT
from launcher.config.models import inventory_path, load_inventory
from launcher.container.agentclient import container_for, payload
from launcher.probe.poll import poll_once, poll_request
from launcher.transport.pool import ConnectionPool

LINES = 500  # what the benchmark playbooks' verify reads per poll


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("-t", "--target", required=True)
    parser.add_argument("--polls", type=int, default=10)
    args = parser.parse_args()

    target = load_inventory(inventory_path(args.inventory)).target(args.target)
    with ConnectionPool() as pool:
        recording = Recording(pool.get(target.host_name, target.host))
        container = container_for(target, recording)
        poll_once(container, target, LINES)  # connects; the agent is not cached yet
        first = recording.take()
        after: list[int] = []
        cached: list[float] = []
        source: list[float] = []
        line = payload(poll_request(target, LINES))  # the source with every call, as before
        for _ in range(args.polls):  # interleaved, so load on the machine hits both alike
            start = time.perf_counter()
            poll_once(container, target, LINES)
            cached.append(time.perf_counter() - start)
            after += recording.take()
            start = time.perf_counter()
            result = container.exec(["python3", "-c", BOOT], stdin=line)
            source.append(time.perf_counter() - start)
            recording.take()
            if not result.ok or not result.out.strip():
                sys.exit(
                    f"a poll sending the source failed (exit {result.exit_code}): {result.tail()}"
                )
    json.dump({"first": first, "after": after, "cached": cached, "source": source}, sys.stdout)
    print()


if __name__ == "__main__":
    main()

"""A two-node job against one node, in one run on a sandbox of its own: `job deploy --restart`
+ `job verify` over two networked containers, against `deploy --restart` + `verify` of the
same playbook on one of them. Measured interleaved, a new script version each round (so every
deploy uploads). The verify settings are the same for both, so the probe's own waiting is too:
the deploy rows show the job's overhead (checks, stops and launches on two nodes), the
deploy + verify rows what a user waits for.

Usage: bench/bench_job.py [--runs N] [--markdown] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BenchEnv, BenchError, check
from rows import Row, median, render_markdown, render_text

NODES = (300, 301)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = BenchEnv(NODES)
    try:
        env.up()
        env.sandbox.connect(NODES)
        book = env.playbook("demo")
        inventory = env.inventory("job", {"n0": (NODES[0], book), "n1": (NODES[1], book)})
        data = yaml.safe_load(inventory.read_text())
        data["jobs"] = {"train": {"nodes": ["n0", "n1"], "playbook": book}}
        inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        single: dict[str, list[float]] = {"deploy": [], "verify": []}
        job: dict[str, list[float]] = {"deploy": [], "verify": []}
        # The first round warms the agent caches and connections; it is not counted.
        for n in range(args.runs + 1):
            env.new_script()
            one = check(env.launcher(inventory, "deploy", "--restart", "-t", "n0"), "deploy")
            one_v = check(env.launcher(inventory, "verify", "-t", "n0"), "verify")
            env.new_script()
            two = check(env.launcher(inventory, "job", "deploy", "--restart", "train"), "job")
            two_v = check(env.launcher(inventory, "job", "verify", "train"), "job verify")
            if n:
                single["deploy"].append(one.seconds)
                single["verify"].append(one_v.seconds)
                job["deploy"].append(two.seconds)
                job["verify"].append(two_v.seconds)
            print(
                f"round {n}: one {one.seconds:.2f}+{one_v.seconds:.2f} s, "
                f"job {two.seconds:.2f}+{two_v.seconds:.2f} s",
                file=sys.stderr,
            )
        check(env.launcher(inventory, "job", "stop", "train"), "job stop")
    except BenchError as error:
        print(f"bench: {error}", file=sys.stderr)
        return 1
    finally:
        env.close()
    rows = []
    for what, label in (("deploy", "deploy --restart"), ("both", "deploy --restart + verify")):
        if what == "both":
            a = median([d + v for d, v in zip(single["deploy"], single["verify"], strict=True)])
            b = median([d + v for d, v in zip(job["deploy"], job["verify"], strict=True)])
        else:
            a, b = median(single[what]), median(job[what])
        rows.append(
            Row(
                f"2-node job vs 1 node: {label}",
                "s",
                b,
                a=a,
                ratio=b / a,
                target="< 2x",
                met=b / a < 2,
                note=f"median of {args.runs}; A column: the single node",
            )
        )
    print(render_markdown(rows, True) if args.markdown else render_text(rows, True))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in rows], indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

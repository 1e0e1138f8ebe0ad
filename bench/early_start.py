"""launcher with and without the early-start chain, interleaved in one run on one sandbox.

The chain (hint files, the early connection thread, the prestarted agent, the forked polling
child, the TCP connect before imports, the `sys.modules` stand-ins, switch-interval tuning) was
removed; this measures what it bought. BASELINE is a source tree that still has it (its
`launcher/` package, e.g. `git archive <commit> launcher | tar -x -C DIR`): its commands run
with PYTHONPATH=BASELINE, the checkout's without, alternately, the same command lines (so the
baseline's hints are there from its warm-up on, as for a user who repeats a command).

Usage: bench/early_start.py --baseline DIR [--runs N]   (needs root: LXC, sshd)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import DEPLOY_VMID, BenchEnv, Timed, check
from rows import median

WAYS = ("without", "with")  # this checkout; the baseline tree


def timed(env: BenchEnv, argv: Sequence[str], baseline: Path | None) -> Timed:
    extra = {} if baseline is None else {"PYTHONPATH": str(baseline)}
    start = time.perf_counter()
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        env={**env.env, **extra},
        cwd=env.project,
        stdin=subprocess.DEVNULL,
        timeout=180,
        check=False,
    )
    seconds = time.perf_counter() - start
    return Timed(seconds, proc.returncode, proc.stdout, proc.stderr, time.time())


def which_tree(env: BenchEnv, baseline: Path | None) -> str:
    code = "import launcher, os; print(os.path.dirname(launcher.__file__))"
    return timed(env, [str(env.python), "-c", code], baseline).out.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline", type=Path, required=True, metavar="DIR")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    baseline: Path = args.baseline.resolve()
    if not (baseline / "launcher" / "prefetch.py").is_file():
        parser.error(f"{baseline} has no launcher/prefetch.py: not a tree with the chain")
    env = BenchEnv([DEPLOY_VMID])
    trees = {"without": None, "with": baseline}
    try:
        env.up()
        for way, tree in trees.items():
            print(f"{way}: {which_tree(env, tree)}", file=sys.stderr)
        book = env.playbook("demo")
        direct = env.inventory("inventory", {"demo": (DEPLOY_VMID, book)})
        persisted = env.inventory(
            "inventory-persisted", {"demo": (DEPLOY_VMID, book)}, control_persist=600
        )
        py = [str(env.python), "-m", "launcher"]
        figures: dict[str, tuple[list[str], bool]] = {
            "status (a new SSH connection)": ([*py, "-i", str(direct), "status"], False),
            "status (control_persist)": ([*py, "-i", str(persisted), "status"], False),
            "deploy --restart": ([*py, "-i", str(direct), "deploy", "--restart"], True),
            "--version": ([*py, "--version"], False),
            "--help": ([*py, "--help"], False),
        }
        times: dict[tuple[str, str], list[float]] = {(f, w): [] for f in figures for w in WAYS}
        check(timed(env, figures["deploy --restart"][0], None), "first deploy")
        for _ in range(2):  # warm-up: caches, the background process, the baseline's hints
            for argv, _deploy in figures.values():
                for way in WAYS:
                    check(timed(env, argv, trees[way]), f"warm-up {way}", codes=(0, 1))
        for i in range(args.runs):
            for figure, (argv, deploy) in figures.items():
                for way in WAYS:
                    if deploy:
                        env.new_script()  # something to upload, as for a real redeploy
                    result = check(timed(env, argv, trees[way]), f"{figure} {way}", (0, 1))
                    times[(figure, way)].append(result.seconds)
            print(f"  run {i + 1}/{args.runs} done", file=sys.stderr)
    finally:
        env.close()
    print(f"{'figure':34} {'with the chain':>15} {'without':>9} {'difference':>11}")
    for figure in figures:
        with_, without = median(times[(figure, "with")]), median(times[(figure, "without")])
        print(f"{figure:34} {with_:13.3f} s {without:7.3f} s {without - with_:+9.3f} s")
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(median of {args.runs}, interleaved; load {load})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Status-line parser speed: lines per second on a 200k-line synthetic pane.

Usage: python bench/bench_parser.py [--lines N] [--width 80]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from launcher.verify.parse import parse_pane


def synthetic_pane(lines: int, seed: int = 0) -> str:
    """DFlash-style status lines with varying values, some other output mixed in."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        if i % 50 == 49:
            out.append(f"Saved checkpoint step_{i}.pt")
            continue
        q_pre = ", ".join(str(rng.randint(0, 12)) for _ in range(6))
        out.append(
            f"[{i // 60}m] step={i} loss={rng.uniform(0.5, 8):.4f} acc={rng.random():.3f} "
            f"streak={rng.uniform(0, 9):.1f} lr={rng.uniform(1e-7, 6e-4):.2e} noise=0.1000 | "
            f"tgt={rng.uniform(0, 2):.2f}b/s dft={rng.uniform(0, 2):.2f}b/s "
            f"({rng.uniform(0, 40):.1f}Ktok/s) | q_pre=[{q_pre}] q_hs=[{rng.randint(0, 8)}] | "
            f"epoch~{i / lines * 6:.2f} ETA={rng.uniform(0.1, 20):.1f}d"
        )
    return "\n".join(out) + "\n"


def wrap(text: str, width: int) -> str:
    """What `tmux capture-pane` without -J returns for a pane `width` columns wide."""
    rows: list[str] = []
    for line in text.split("\n"):
        while len(line) > width:
            rows.append(line[:width])
            line = line[width:]
        rows.append(line)
    return "\n".join(rows)


MODES = (("parse only", False), ("parse + read step/loss/tput/q_pre", True))


def measure(pane: str, runs: int = 3) -> list[tuple[str, int, float]]:
    """(label, status lines, best seconds) for parsing alone and parsing plus reading what the
    checks read (step, loss, throughput, q_pre): the second is the figure that counts."""
    results = []
    for label, read in MODES:
        best = float("inf")
        count = 0
        for _ in range(runs):
            start = time.perf_counter()
            samples = parse_pane(pane)
            if read:
                for s in samples:
                    _ = (s.step, s.loss, s.throughput, s.numbers("q_pre"))
            best = min(best, time.perf_counter() - start)
            count = len(samples)
        results.append((label, count, best))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--width", type=int, default=0, help="wrap rows at this width first")
    args = parser.parse_args()
    pane = synthetic_pane(args.lines)
    if args.width:
        pane = wrap(pane, args.width)
    layout = f"wrapped at {args.width} columns" if args.width else "joined, -J"
    for label, count, best in measure(pane):
        print(f"{label} ({layout}): {count} status lines in {best:.3f} s, {count / best:,.0f}/s")


if __name__ == "__main__":
    main()

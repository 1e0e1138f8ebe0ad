"""`launcher buckets plan` speed: seconds for 1,000,000 synthetic lengths, simulation included.

Runs the command in-process (load, optimise, simulate 3 epochs, report) on a text file and on a
.npy array of the same lengths, and prints wall and CPU seconds of each run (CPU seconds are
what one core spends; wall seconds also count time lost to other processes).

Usage: python bench/bench_buckets.py [--samples N] [--buckets K] [--epochs E] [--repeat R]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

import numpy as np

from launcher.cli.main import cli

BUDGET = 49_152
MAX_LEN = 8_192


def synthetic_lengths(samples: int, seed: int = 0) -> np.ndarray:
    """A long-tailed mix up to 8,192 tokens: most samples short, a thin tail of long ones."""
    rng = np.random.default_rng(seed)
    short = rng.lognormal(np.log(1000), 0.55, int(samples * 0.8))
    medium = rng.lognormal(np.log(2600), 0.45, int(samples * 0.17))
    long = rng.uniform(3000, MAX_LEN, samples - len(short) - len(medium))
    lengths = np.concatenate([short, medium, long]).astype(np.int64)
    return rng.permutation(np.clip(lengths, 16, MAX_LEN))


def time_plan(path: Path, buckets: int, epochs: int) -> tuple[float, float, dict[str, object]]:
    args = ["buckets", "plan", str(path), "--budget", str(BUDGET), "--max-len", str(MAX_LEN)]
    args += ["--buckets", str(buckets), "--epochs", str(epochs), "--json"]
    out = io.StringIO()
    wall, cpu = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        cli.main(args=args, prog_name="launcher", standalone_mode=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return wall, cpu, json.loads(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--buckets", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()

    lengths = synthetic_lengths(options.samples)
    with tempfile.TemporaryDirectory() as tmp:
        text = Path(tmp) / "lengths.txt"
        text.write_text("\n".join(map(str, lengths.tolist())) + "\n")
        npy = Path(tmp) / "lengths.npy"
        np.save(npy, lengths)
        print(
            f"{options.samples:,} lengths, {options.buckets} buckets, budget {BUDGET:,}, "
            f"{options.epochs} simulated epochs"
        )
        for path in (text, npy):
            for run in range(options.repeat):
                wall, cpu, report = time_plan(path, options.buckets, options.epochs)
                timings = report["timings"]
                assert isinstance(timings, dict)
                print(
                    f"{path.suffix:<5} run {run + 1}: {wall:.2f} s wall, {cpu:.2f} s cpu "
                    f"(load {timings['load']:.2f}, optimise {timings['optimize']:.2f}, "
                    f"simulate {timings['simulate']:.2f})"
                )
        print(f"boundaries {report['boundaries']}")


if __name__ == "__main__":
    main()

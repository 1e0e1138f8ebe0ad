"""The import budget of each command: `python -X importtime -m launcher ...` on the sandbox.

Per command: the total import time (the top-level entries' cumulative times, which add up to
every import the process made) and the packages that cost the most. launcher's own modules
import nearly everything else, so grouping the top-level entries alone would name launcher and
little more; a package's cost is instead the cumulative time of each import of it made by
launcher's code or by the interpreter itself (pydantic imported inside `launcher.config.models`
counts as pydantic; cryptography, which paramiko imports, counts as paramiko). Those costs and
the self time of launcher's own modules add up to the total.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness import BenchEnv, check
from rows import Row

Log = Callable[[str], None]
OWN = "launcher"
PREFIX = "import time:"


@dataclass(frozen=True)
class Entry:
    """One `-X importtime` line: a module, how deep it was imported, its times (µs)."""

    name: str
    depth: int
    self_us: int
    cumulative_us: int

    @property
    def package(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass(frozen=True)
class Budget:
    """One process's imports: total (ms), launcher's own (self, ms), package -> ms."""

    total: float
    own: float
    packages: dict[str, float]


def parse(stderr: str) -> list[Entry]:
    """`import time: <self> | <cumulative> | <2 spaces per nesting level><module>` lines."""
    entries = []
    for line in stderr.splitlines():
        if not line.startswith(PREFIX):
            continue
        fields = line[len(PREFIX) :].split("|", 2)
        if len(fields) != 3 or not fields[0].strip().isdigit():
            continue  # the header line
        module = fields[2][1:]  # one space follows the bar
        name = module.lstrip(" ")
        depth = (len(module) - len(name)) // 2
        entries.append(Entry(name, depth, int(fields[0]), int(fields[1])))
    return entries


def budget(entries: Sequence[Entry]) -> Budget:
    """Totals of one run. Lines come children first, so walk them backwards, parents first."""
    total = sum(e.cumulative_us for e in entries if e.depth == 0)
    own = sum(e.self_us for e in entries if e.package == OWN)
    packages: dict[str, int] = defaultdict(int)
    ancestors: list[Entry] = []
    for entry in reversed(entries):
        del ancestors[entry.depth :]
        if entry.package != OWN and all(a.package == OWN for a in ancestors):
            packages[entry.package] += entry.cumulative_us
        ancestors.append(entry)
    return Budget(total / 1000, own / 1000, {p: us / 1000 for p, us in packages.items()})


def median_budget(runs: Sequence[Budget]) -> Budget:
    names = {p for r in runs for p in r.packages}
    return Budget(
        statistics.median(r.total for r in runs),
        statistics.median(r.own for r in runs),
        {p: statistics.median(r.packages.get(p, 0.0) for r in runs) for p in names},
    )


def commands(target: str) -> list[tuple[str, ...]]:
    """The commands measured; deploy needs --restart, as the target has a run."""
    t = ("-t", target)
    return [
        ("--version",),
        ("--help",),
        ("status", *t),
        ("verify", *t, "--wait", "3"),
        ("deploy", *t, "--restart", "--dry-run"),
        ("logs", *t),
        ("watch", *t, "--for", "3"),
    ]


def measure(env: BenchEnv, inventory: Path, argv: Sequence[str]) -> Budget:
    command = [str(env.python), "-X", "importtime", *env.launcher_argv(inventory, *argv)[1:]]
    # Their verdict does not matter here (a run in its warmup may be "unhealthy"), only that
    # the command ran to its end: 2 (bad input) or 3 (unreachable) would cut its imports short.
    result = check(env.run(command, timeout=120), f"launcher {' '.join(argv)}", codes=(0, 1))
    entries = parse(result.err)
    if not entries:
        raise ValueError(f"launcher {' '.join(argv)}: no -X importtime lines on stderr")
    return budget(entries)


def describe(b: Budget) -> str:
    biggest = sorted(b.packages.items(), key=lambda item: -item[1])[:3]
    packages = ", ".join(f"{name} {ms:.0f} ms" for name, ms in biggest)
    return f"{packages}; launcher's own modules {b.own:.0f} ms (self)"


def import_rows(env: BenchEnv, inventory: Path, target: str, runs: int, log: Log) -> list[Row]:
    """One row per command: median total import time of `runs` runs after a warm-up run (which
    writes the .pyc files a user's second run finds)."""
    rows = []
    for argv in commands(target):
        label = " ".join(a if a != target else "T" for a in argv)
        measure(env, inventory, argv)  # warm-up
        b = median_budget([measure(env, inventory, argv) for _ in range(runs)])
        log(f"  launcher {label}: {b.total:.0f} ms of imports ({describe(b)})")
        rows.append(
            Row(
                f"import time: launcher {label}",
                "ms",
                round(b.total),
                note=f"median of {runs}; biggest: {describe(b)}",
            )
        )
    return rows

"""Many containers on one host: how `status --all` and `deploy --restart --all` + `verify --all`
grow from 1 to N targets, and what bounds them (the machine's CPU, pct calls, connections).

Every target is a running demo trainer in a container of its own. All the trainers keep running
throughout, so the sizes differ only in how many targets launcher handles; they are measured
interleaved in each round (a new script version per round, so every deploy uploads).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from figures import FleetRun, fleet_once, printed_json, stop_all, supports_all
from harness import BenchEnv, BenchError
from rows import Row, median

Log = Callable[[str], None]
VMIDS = tuple(range(400, 464))
SIZES = (1, 16, 64)
QUICK_SIZES = (1, 2, 4)
# status: 1 unhealthy still measures a poll, 3 (unreachable) is counted in the note
STATUS_CODES = (0, 1, 3)


@dataclass(frozen=True)
class StatusRun:
    seconds: float
    pct: int
    ssh: int
    busy: float
    cpu: float
    not_healthy: int


def _busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / max(after[1] - before[1], 1)


def status_once(env: BenchEnv, inventory: Path, size: int) -> StatusRun:
    """`status --all --json` on every target of `inventory`: wall, pct calls, connections."""
    pct0, ssh0 = env.pct_calls(), env.ssh_accepts()
    ticks0, cpu0 = env.cpu_ticks(), env.children_cpu()
    start = time.perf_counter()
    result = env.launcher(inventory, "status", "--all", "--json", timeout=300)
    seconds = time.perf_counter() - start
    busy, cpu = _busy(ticks0, env.cpu_ticks()), env.children_cpu() - cpu0
    if result.code not in STATUS_CODES:
        raise BenchError(f"status --all exited {result.code}: {result.err.strip()[-2000:]}")
    targets = printed_json(result, "status --all --json").get("targets", [])
    if len(targets) != size:
        raise BenchError(f"status --all reported {len(targets)} targets, wanted {size}")
    not_healthy = sum(1 for t in targets if t.get("exit_code") != 0)
    pct, ssh = env.pct_calls() - pct0, env.ssh_accepts() - ssh0
    return StatusRun(seconds, pct, ssh, busy, cpu, not_healthy)


def _per_extra(walls: dict[int, float], size: int) -> str:
    """What each target beyond the first added to the wall time (the ratio column has N/1)."""
    return f"{(walls[size] - walls[1]) / (size - 1) * 1000:+.0f} ms per CT beyond 1"


def _cts(n: int) -> str:
    return f"{n} CT" if n == 1 else f"{n} CTs"


def _bounds(busy: float, cpu: float, wall: float) -> str:
    """The machine's busy share next to launcher's own CPU: near 100% busy with launcher's
    share small means the containers, sshd and pct bound the wall time, not launcher."""
    return (
        f"machine CPU busy {busy:.0%} of {os.cpu_count()} cores, launcher's own CPU "
        f"{cpu:.2f} s ({cpu / wall:.0%} of one core)"
    )


def background_busy(env: BenchEnv, seconds: float) -> float:
    """The machine's busy share with the trainers running and launcher idle."""
    ticks0 = env.cpu_ticks()
    time.sleep(seconds)
    return _busy(ticks0, env.cpu_ticks())


def status_rows(
    sizes: Sequence[int], runs: dict[int, list[StatusRun]], background: float
) -> list[Row]:
    walls = {n: median([r.seconds for r in runs[n]]) for n in sizes}
    rows = []
    for n in sizes:
        rs = runs[n]
        unhealthy = sum(r.not_healthy for r in rs)
        note = [
            f"median of {len(rs)}",
            f"pct calls {max(r.pct for r in rs)}, ssh conns {max(r.ssh for r in rs)}",
            _bounds(median([r.busy for r in rs]), median([r.cpu for r in rs]), walls[n]),
        ]
        if n > 1:
            note.insert(1, _per_extra(walls, n))
        if unhealthy:
            note.append(f"{unhealthy} target polls not healthy")
        if n == 1:
            note.append(f"launcher idle, {max(sizes)} trainers running: CPU busy {background:.0%}")
        rows.append(
            Row(
                f"scale: status --all wall, {_cts(n)}",
                "s",
                walls[n],
                ratio=walls[n] / walls[1] if n > 1 else None,
                note="; ".join(note),
            )
        )
    return rows


def fleet_rows(sizes: Sequence[int], runs: dict[int, list[FleetRun]]) -> list[Row]:
    walls = {n: median([r.seconds for r in runs[n]]) for n in sizes}
    second = sizes[1] if len(sizes) > 1 else None  # held to today's fleet target
    rows = []
    for n in sizes:
        rs = runs[n]
        unhealthy = sum(1 for r in rs for c in r.verify_codes if c != 0)
        note = [
            f"median of {len(rs)}; deploy {median([r.deploy for r in rs]):.2f} + "
            f"verify {median([r.verify for r in rs]):.2f} s",
            f"ssh conns per deploy {max(r.deploy_ssh for r in rs)}",
            _bounds(median([r.busy for r in rs]), median([r.cpu for r in rs]), walls[n]),
            f"verify peak RSS {median([r.rss_mib for r in rs]):.0f} MiB",
        ]
        if n > 1:
            note.insert(1, _per_extra(walls, n))
        if unhealthy:
            note.append(f"{unhealthy} verify runs not healthy")
        ratio = walls[n] / walls[1] if n > 1 else None
        rows.append(
            Row(
                f"scale: deploy --restart --all + verify --all, {_cts(n)}",
                "s",
                walls[n],
                ratio=ratio,
                target="<= 2x one" if n == second else "",
                met=ratio <= 2 if n == second and ratio is not None else None,
                note="; ".join(note),
            )
        )
    return rows


def scale_rows(
    env: BenchEnv, vmids: Sequence[int], sizes: Sequence[int], runs: int, log: Log
) -> list[Row]:
    """Rows for `status --all` and deploy + verify at each size (sizes[-1] <= len(vmids))."""
    book = env.playbook("scale")
    vmids = vmids[: max(sizes)]
    names = [f"scale-{v}" for v in vmids]
    inventories = {
        n: env.inventory(
            f"scale-{n}", {name: (v, book) for name, v in zip(names[:n], vmids[:n], strict=True)}
        )
        for n in sizes
    }
    multi = supports_all(env, inventories[max(sizes)])
    if not multi[0]:
        raise BenchError("deploy/verify take no --all: the scale figures need it")
    log(f"  warm-up: first launch on {len(names)} containers")
    fleet_once(env, inventories[max(sizes)], names, multi)
    background = background_busy(env, 5.0)
    fleet: dict[int, list[FleetRun]] = {n: [] for n in sizes}
    status: dict[int, list[StatusRun]] = {n: [] for n in sizes}
    for i in range(runs):
        env.new_script()
        for n in sizes:
            fleet[n].append(fleet_once(env, inventories[n], names[:n], multi))
            status[n].append(status_once(env, inventories[n], n))
            log(
                f"  run {i + 1}/{runs}, {_cts(n)}: deploy {fleet[n][-1].deploy:.2f} + verify "
                f"{fleet[n][-1].verify:.2f} s (CPU {fleet[n][-1].busy:.0%}); status --all "
                f"{status[n][-1].seconds:.2f} s (CPU {status[n][-1].busy:.0%})"
            )
    stop_all(env, inventories[max(sizes)], log)
    return status_rows(sizes, status, background) + fleet_rows(sizes, fleet)

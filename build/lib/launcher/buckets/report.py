"""`buckets plan` end to end: load, optimise, simulate, and the JSON and text reports."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.buckets.lengths import check_lengths, load_lengths
from launcher.buckets.optimize import Plan, plan_buckets
from launcher.buckets.playbook import PlaybookEdit
from launcher.buckets.simulate import Simulation, simulate, simulation_steps

SCHEMA = "launcher.buckets/1"


@dataclass
class PlanReport:
    path: Path
    samples: int
    shortest: int
    longest: int
    max_len: int | None
    plan: Plan
    simulation: Simulation
    sorted_throughput: float | None  # Ktok/s of sorted batching, when given
    timings: dict[str, float] = field(default_factory=dict)
    playbook: PlaybookEdit | None = None

    def throughput(self, efficiency: float) -> float | None:
        """Ktok/s scaled from sorted batching by padding efficiency."""
        if self.sorted_throughput is None:
            return None
        return self.sorted_throughput * efficiency / self.simulation.sorted.efficiency


def total_steps(buckets: int, epochs: int) -> int:
    """Progress steps of `make_report`: load, optimise, then every packing pass."""
    return 2 + simulation_steps(buckets, epochs)


def make_report(
    path: Path,
    *,
    budget: int,
    buckets: int,
    max_len: int | None,
    field_name: str | None,
    epochs: int,
    seed: int,
    sorted_throughput: float | None,
    tick: Callable[[str], None] = lambda _stage: None,
) -> PlanReport:
    wall, cpu = time.perf_counter(), time.process_time()
    source = load_lengths(path, field=field_name)
    ordered, top = check_lengths(source, budget=budget, buckets=buckets, max_len=max_len)
    tick("optimising")
    loaded = time.perf_counter()
    plan = plan_buckets(ordered, buckets=buckets, budget=budget, top=top)
    tick("simulating")
    optimised = time.perf_counter()
    simulation = simulate(
        ordered, plan.boundaries, budget, epochs=epochs, seed=seed, tick=lambda: tick("simulating")
    )
    done = time.perf_counter()
    return PlanReport(
        path=path,
        samples=len(ordered),
        shortest=int(ordered[0]),
        longest=int(ordered[-1]),
        max_len=max_len,
        plan=plan,
        simulation=simulation,
        sorted_throughput=sorted_throughput,
        timings={
            "load": round(loaded - wall, 3),
            "optimize": round(optimised - loaded, 3),
            "simulate": round(done - optimised, 3),
            "total": round(done - wall, 3),
            "cpu": round(time.process_time() - cpu, 3),
        },
    )


def _bucket_rows(report: PlanReport) -> list[dict[str, Any]]:
    plan = report.plan
    rows = []
    for index, (samples, longest, model, seen) in enumerate(
        zip(
            plan.samples,
            plan.longest,
            plan.model_batch_sizes,
            report.simulation.bucket_sizes,
            strict=True,
        )
    ):
        rows.append(
            {
                "bucket": index + 1,
                "lower": plan.boundaries[index],  # exclusive
                "upper": plan.boundaries[index + 1],  # inclusive
                "samples": samples,
                "share": round(samples / report.samples, 6),
                "longest": longest,
                "batch_size_model": model,
                "batch_size_min": seen.smallest,
                "batch_size_max": seen.largest,
                "batches_per_epoch": round(seen.batches, 1),
            }
        )
    return rows


def to_json(report: PlanReport) -> dict[str, Any]:
    plan, simulation = report.plan, report.simulation
    edit = report.playbook
    return {
        "schema": SCHEMA,
        "input": {
            "path": str(report.path),
            "samples": report.samples,
            "distinct": plan.distinct,
            "shortest": report.shortest,
            "longest": report.longest,
            "tokens": plan.real_tokens,
        },
        "budget": plan.budget,
        "buckets": len(plan.samples),
        "max_len": report.max_len,
        "boundaries": plan.boundaries,
        "model": {
            "padded_tokens": plan.padded_tokens,
            "efficiency": round(plan.model_efficiency, 6),
        },
        "bucket_stats": _bucket_rows(report),
        "batching": {
            batching.name: {
                "label": batching.label,
                "efficiency": round(batching.efficiency, 6),
                "epoch_efficiencies": [round(e, 6) for e in batching.epoch_efficiencies],
                "batches_per_epoch": batching.batches,
                "throughput_ktok_s": _round(report.throughput(batching.efficiency)),
            }
            for batching in simulation.strategies
        },
        "simulation": {"epochs": simulation.epochs, "seed": simulation.seed},
        "timings": report.timings,
        "playbook": None
        if edit is None
        else {
            "path": str(edit.path),
            "mode": edit.mode,
            "buckets_before": edit.buckets_before,
            "q_pre_before": edit.q_pre_before,
            "q_pre": edit.q_pre,
        },
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def render_text(report: PlanReport) -> str:
    plan, simulation = report.plan, report.simulation
    k = len(plan.samples)
    lines = [
        f"samples     {report.samples:,} from {report.path} ({plan.distinct:,} distinct lengths, "
        f"{report.shortest:,}–{report.longest:,}, {plan.real_tokens:,} tokens)",
        f"budget      {plan.budget:,} tokens a batch, {k} bucket{'s' if k != 1 else ''}",
        f"boundaries  {plan.boundaries}",
        "",
    ]
    rows = [
        [
            str(row["bucket"]),
            f"{row['lower'] + 1}–{row['upper']}",
            f"{row['samples']:,}",
            f"{row['share']:.1%}",
            f"{row['longest']:,}",
            f"{row['batch_size_min']}–{row['batch_size_max']}",
            f"{row['batches_per_epoch']:,.0f}",
        ]
        for row in _bucket_rows(report)
    ]
    header = ["bucket", "lengths", "samples", "share", "longest", "batch size", "batches/epoch"]
    lines += _table(header, rows, right={2, 3, 4, 5, 6})
    lines.append("")
    rows = []
    for batching in simulation.strategies:
        speed = report.throughput(batching.efficiency)
        rows.append(
            [
                batching.label,
                f"{batching.efficiency:.1%}",
                "-" if speed is None else f"~{speed:.1f} Ktok/s",
            ]
        )
    lines += _table(["batching", "padding efficiency", "est. throughput"], rows, right={1, 2})
    lines.append("")
    seeds = (
        f"seed {simulation.seed}"
        if simulation.epochs == 1
        else f"seeds {simulation.seed}–{simulation.seed + simulation.epochs - 1}"
    )
    lines.append(
        f"cost model  {plan.model_efficiency:.1%} with every batch padded to its bucket's longest "
        "sample (the exact optimum)"
    )
    lines.append(
        f"simulated   greedy packing, {simulation.epochs} epoch(s) ({seeds}); "
        "batch size: smallest–largest full batch"
    )
    t = report.timings
    lines.append(
        f"took        {t['total']:.2f} s (load {t['load']:.2f}, optimise {t['optimize']:.2f}, "
        f"simulate {t['simulate']:.2f}; cpu {t['cpu']:.2f} s)"
    )
    edit = report.playbook
    if edit is not None:
        how = (
            "edited in place, comments kept"
            if edit.mode == "edited"
            else "rewritten with yaml.safe_dump: comments and layout were not kept"
        )
        before = "unset" if edit.q_pre_before is None else str(edit.q_pre_before)
        lines.append(
            f"playbook    {edit.path}: buckets recorded, verify.queues.q_pre {before} → "
            f"{edit.q_pre} ({how}); validated"
        )
    return "\n".join(lines)

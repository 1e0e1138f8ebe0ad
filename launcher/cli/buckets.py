"""`launcher buckets plan`: length-bucket boundaries for a bucketed shuffle, found exactly.

numpy (the optional extra `proxmox-launcher[buckets]`) and the planning modules are imported
inside the command, so that `launcher --help` stays fast and works without numpy.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from launcher.core.params import BUCKET_COUNT, EPOCHS, KTOK_PER_S, SEED, TOKENS

# Inputs at least this large (bytes) get a progress bar on a terminal.
PROGRESS_BYTES = 1 << 20


@click.group("buckets")
def buckets() -> None:
    """Plan the length buckets of a bucketed shuffle (needs numpy: proxmox-launcher[buckets]).

    \b
    Example:
      launcher buckets plan lengths.txt --budget 49152 --buckets 6 --max-len 8192
    """


@buckets.command("plan")
@click.argument("lengths_file", metavar="LENGTHS", type=click.Path(path_type=Path))
@click.option(
    "--budget", type=TOKENS, required=True, metavar="TOKENS", help="Token budget of one batch."
)
@click.option(
    "--buckets",
    "bucket_count",
    type=BUCKET_COUNT,
    default=6,
    show_default=True,
    metavar="K",
    help="Number of buckets (the playbook's q_pre).",
)
@click.option(
    "--max-len",
    type=TOKENS,
    metavar="N",
    help="Longest allowed sample: the top boundary (default: the longest in the data).",
)
@click.option(
    "--sorted-throughput",
    type=KTOK_PER_S,
    metavar="KTOK/S",
    help="Measured Ktok/s of length-sorted batching; the others are scaled by efficiency.",
)
@click.option(
    "--field", "field_name", metavar="NAME", help="JSON lines input: the key holding the length."
)
@click.option(
    "--epochs", type=EPOCHS, default=3, show_default=True, help="Simulated epochs (one seed each)."
)
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the first epoch.")
@click.option(
    "--write-playbook",
    "playbook_path",
    type=click.Path(path_type=Path),
    metavar="PLAYBOOK",
    help="Record the boundaries (buckets:) and q_pre in this playbook, then validate it.",
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the report as JSON (schema launcher.buckets/1)."
)
def plan_command(
    lengths_file: Path,
    budget: int,
    bucket_count: int,
    max_len: int | None,
    sorted_throughput: float | None,
    field_name: str | None,
    epochs: int,
    seed: int,
    playbook_path: Path | None,
    as_json: bool,
) -> None:
    """Choose bucket boundaries that minimise padding, and measure them.

    LENGTHS holds one sample length (in tokens) per line, or is a .npy array, or JSON lines
    with --field. The boundaries are the exact optimum of a dynamic programme over the distinct
    lengths (cost model: each batch padded to its bucket's longest sample), so no grid search
    does better under that model. The plan is then checked by simulating the real batching
    (shuffle within buckets, greedy packing under --budget) for several seeded epochs, beside
    length-sorted and fully random batching.

    \b
    Example:
      launcher buckets plan lengths.txt --budget 49152 --buckets 6 --max-len 8192
      launcher buckets plan lengths.npy --budget 49152 --sorted-throughput 32
      launcher buckets plan data.jsonl --field num_tokens --budget 49152 --json
      launcher buckets plan lengths.txt --budget 49152 --write-playbook playbooks/dflash.yaml
    Exit codes: 0 planned, 2 bad input (file, option, numpy missing).
    """
    from launcher.buckets import require_numpy
    from launcher.core.errors import UsageError

    require_numpy()
    from launcher.buckets.report import make_report, render_text, to_json, total_steps

    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1 (got {epochs})")
    if sorted_throughput is not None and sorted_throughput <= 0:
        raise UsageError(f"--sorted-throughput must be positive (got {sorted_throughput})")
    if playbook_path is not None and not playbook_path.is_file():
        raise UsageError(f"--write-playbook: no such file: {playbook_path}")
    steps = total_steps(max(bucket_count, 1), epochs)
    with _progress(lengths_file, steps) as tick:
        report = make_report(
            lengths_file,
            budget=budget,
            buckets=bucket_count,
            max_len=max_len,
            field_name=field_name,
            epochs=epochs,
            seed=seed,
            sorted_throughput=sorted_throughput,
            tick=tick,
        )
    if playbook_path is not None:
        from launcher.buckets.playbook import record_plan

        report.playbook = record_plan(playbook_path, report.plan.boundaries)
    if as_json:
        from launcher.output.jsonout import emit, envelope

        document = to_json(report)
        document.pop("schema", None)
        emit(envelope("buckets", [], exit_code=0, per_target=False, **document))
    else:
        click.echo(render_text(report))


@contextmanager
def _progress(path: Path, steps: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar on stderr for large inputs on a terminal; otherwise nothing."""
    from launcher.output.ui import is_tty

    try:
        large = path.stat().st_size >= PROGRESS_BYTES
    except OSError:
        large = False
    if not (large and is_tty(sys.stderr)):
        yield lambda _stage: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description:<11}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("loading", total=steps)

        def tick(stage: str) -> None:
            progress.update(task, advance=1, description=stage)

        yield tick

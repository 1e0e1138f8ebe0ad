"""Whether a run uses the GPUs it was given: a poll's GPU facts in, a judgement out. Pure.

The agent reads who holds a GPU from /proc (the run's processes with /dev/nvidia<N> open) and
asks nvidia-smi only for device facts (utilization, memory): inside a container nvidia-smi's
process list carries host PIDs. A run is judged on what it holds and on how busy those GPUs are
while it prints status lines; a run that is quiet (saving a checkpoint, say) is not judged on
utilization, as its GPUs may rightly rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

# A GPU this busy or more counts as used. Working trainers average 30-100 % (an input-bound
# one still tens of %); a GPU with a CUDA context and no kernels shows 0 %, and a run starved
# of input sits at 0-2 %. 10 % is well clear of both.
DEFAULT_MIN_UTIL = 10.0


class GpuCheckSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    """`verify.gpus` in a playbook."""

    min_util: float = Field(default=DEFAULT_MIN_UTIL, ge=0, le=100)


@dataclass(frozen=True)
class GpuSample:
    """One poll's GPUs: how many the run should hold, which it uses, and per GPU its
    utilization (%) and memory used (MiB), None where nvidia-smi did not give them; `error`:
    nvidia-smi did not answer (or failed); `age`: the facts are an earlier query's, this many
    seconds old; `watchers`: processes with device files open and no GPU in use."""

    want: int
    held: tuple[int, ...]
    util: Mapping[int, int | None] = field(default_factory=dict)
    used_mib: Mapping[int, int | None] = field(default_factory=dict)
    error: str | None = None
    age: float | None = None
    watchers: tuple[tuple[int, str, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class GpuJudgement:
    """`ok`: True pass, False fail, None: cannot tell yet (or only a warning, with `warn`)."""

    ok: bool | None
    observed: str
    expected: str
    warn: bool = False


def sample_from_answer(gpus: Mapping[str, Any] | None) -> GpuSample | None:
    """The GpuSample in a poll answer's `gpus` (None when not asked, or an older agent)."""
    if not isinstance(gpus, Mapping) or not isinstance(gpus.get("want"), int):
        return None
    held = tuple(g for g in gpus.get("held") or [] if isinstance(g, int))
    util: dict[int, int | None] = {}
    used: dict[int, int | None] = {}
    for row in gpus.get("devices") or []:
        if isinstance(row, list) and len(row) == 3 and isinstance(row[0], int):
            util[row[0]] = row[1] if isinstance(row[1], int) else None
            used[row[0]] = row[2] if isinstance(row[2], int) else None
    error = gpus.get("error")
    age = gpus.get("age")
    return GpuSample(
        gpus["want"],
        held,
        util,
        used,
        str(error) if error else None,
        float(age) if isinstance(age, int | float) else None,
        watchers_from(gpus.get("watchers")),
    )


def watchers_from(rows: Any) -> tuple[tuple[int, str, tuple[int, ...]], ...]:
    found = []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, list) and len(row) == 3 and isinstance(row[0], int):
            listed = row[2] if isinstance(row[2], list) else []
            gpus = tuple(g for g in listed if isinstance(g, int))
            found.append((row[0], str(row[1]), gpus))
    return tuple(found)


def judge(sample: GpuSample, spec: GpuCheckSpec, *, printing: bool) -> GpuJudgement:
    """`printing`: the poll brought new status lines (the run claims to be training). A value
    nvidia-smi did not give is unknown: it never fails the check by itself (a warning)."""
    want = sample.want
    floor = f"{spec.min_util:g} %"
    expected = f"the run holds {want} GPU{'' if want == 1 else 's'}, each ≥ {floor} busy"
    held = sample.held
    if len(held) < want:
        if not held:
            observed = "the run holds no GPU (running on the CPU?)"
        else:
            observed = f"the run holds {len(held)} of {want} GPUs ({span(held)})"
        # Before its first status lines a trainer may still be starting CUDA.
        return GpuJudgement(False if printing else None, observed, expected)
    if sample.error:
        observed = f"the run holds {len(held)} GPUs; utilization unknown: {sample.error}"
        return GpuJudgement(None, observed, expected, warn=True)
    aged = f" (GPU facts {sample.age:.0f} s old)" if sample.age is not None else ""
    if not printing:
        observed = f"the run holds {len(held)} GPUs ({span(held)}); no new status line"
        return GpuJudgement(True, observed, expected)
    unknown = [g for g in held if sample.util.get(g) is None]
    busy = [g for g in held if g not in unknown and (sample.util.get(g) or 0) >= spec.min_util]
    if len(busy) + len(unknown) < want:
        idle = [g for g in held if g not in busy and g not in unknown]
        shown = ", ".join(f"GPU {g} {util_text(sample.util.get(g))}" for g in idle[:8])
        more = f" and {len(idle) - 8} more" if len(idle) > 8 else ""
        observed = (
            f"{len(idle)} of the run's {len(held)} GPUs below {floor} busy while it prints "
            f"status lines: {shown}{more}{aged}"
        )
        if sample.age is not None:
            # An earlier query's facts (nvidia-smi is slow or hung) may predate the status
            # lines, and the same answer comes back poll after poll: not a measurement of now.
            return GpuJudgement(None, observed + "; not judged on an earlier answer", expected,
                                warn=True)  # fmt: skip
        return GpuJudgement(False, observed, expected)
    if unknown:
        observed = (
            f"the run holds {len(held)} GPUs ({span(held)}); utilization unknown for "
            f"GPU {span(unknown)} (nvidia-smi gave no value){aged}"
        )
        return GpuJudgement(None, observed, expected, warn=True)
    mean = sum(sample.util.get(g) or 0 for g in held) / len(held)
    observed = f"the run holds {len(held)} GPUs ({span(held)}), {mean:.0f} % busy on average{aged}"
    return GpuJudgement(True, observed, expected)


def util_text(util: int | None) -> str:
    return "?" if util is None else f"{util} %"


def span(gpus: tuple[int, ...] | list[int]) -> str:
    """`0-7`, `0, 2, 5`: GPU indexes, short."""
    items = sorted(gpus)
    if items and items == list(range(items[0], items[-1] + 1)) and len(items) > 2:
        return f"{items[0]}-{items[-1]}"
    return ", ".join(str(g) for g in items)


def status_text(sample: GpuSample) -> str:
    """`GPUs 8/8 held · util % 97 97 … · mem GiB 22.0 22.0 …`: one short line part for status;
    `?` where a value is unknown, the facts' age when they are an earlier query's, watchers."""
    indexes = sorted(sample.util) or sorted(sample.held)
    text = f"GPUs {len(sample.held)}/{sample.want} held"
    if sample.error or not sample.util:
        text += f" · {sample.error}" if sample.error else ""
    else:
        util = " ".join("?" if sample.util.get(g) is None else str(sample.util[g]) for g in indexes)
        mem = " ".join(
            "?" if sample.used_mib.get(g) is None else f"{(sample.used_mib[g] or 0) / 1024:.1f}"
            for g in indexes
        )
        text += f" · util % {util} · mem GiB {mem}"
        if sample.age is not None:
            text += f" · {sample.age:.0f} s old"
    if sample.watchers:
        text += " · " + ", ".join(
            f"{name} (pid {pid}) watches GPU{'' if len(gpus) == 1 else 's'} {span(gpus)}"
            for pid, name, gpus in sample.watchers
        )
    return text

"""Checks the playbook asks for that its status format can never feed: `inventory check`'s
warnings. Pure: the playbook's `status:` and `verify:` sections in, (key, message) pairs out.

A format whose lines may carry any field (DFlash, keyvalue, JSON, Python dicts) can feed any
check; a preset's lines carry the fields its project prints (the format strings cited in
`launcher.verify.formats.PRESETS`), a regex's the pattern's named groups. A check that names a
field no line will hold is not an error (the check skips, or waits for it until the window
ends) but it is almost always a mistake: the playbook was written for another trainer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from launcher.verify.formats import PRESETS, StatusSpec
from launcher.verify.spec import ChecksSpec

__all__ = ["unproducible"]

Finding = tuple[Sequence[str | int], str]  # a key's path in the playbook, and the message

# Each preset's fields, from its project's format string (see formats.PRESETS).
_PRESET_FIELDS: dict[str, frozenset[str]] = {
    "megatron": frozenset(
        (
            "iteration",
            "consumed samples",
            "elapsed time per iteration (ms)",
            "learning rate",
            "global batch size",
            "lm loss",
            "loss scale",
            "grad norm",
            "params norm",
            "num zeros",
            "number of skipped iterations",
            "number of nan iterations",
        )
    ),
    "nanogpt": frozenset(("iter", "loss", "time", "mfu", "step", "train loss", "val loss")),
    "torchtitan": frozenset(("step", "loss", "grad_norm", "memory", "tps", "tflops", "mfu")),
}


def unproducible(status: StatusSpec, verify: ChecksSpec) -> list[Finding]:
    """Checks set in `verify:` (or fields named in `status:`) that the format cannot feed."""
    carries = _fields(status)
    if carries is None:
        return []  # lines may carry any field
    where = _source(status)
    mapped = status.fields.queues
    found: list[Finding] = []
    if "queues" in verify.model_fields_set:
        for name in verify.queues:
            source = mapped.get(name, name)
            if not carries(source):
                found.append(
                    (
                        ("verify", "queues", name),
                        f"{where} carry no {source!r}: this check can never be judged "
                        f"(map it under status.fields.queues, or drop it)",
                    )
                )
    given = status.fields.model_dump(exclude_unset=True)
    for key in ("step", "loss", "throughput", "elapsed", "eta"):
        named = given.get(key)
        if named is not None and not carries(named):
            found.append((("status", "fields", key), f"{where} carry no {named!r}"))
    for index, watched in enumerate(given.get("watch", [])):
        if not carries(watched):
            message = f"{where} carry no {watched!r}: the finite check never sees it"
            found.append((("status", "fields", "watch", index), message))
    quantities = _quantities(status, carries)
    throughput = verify.throughput.model_fields_set & {"min", "target"}
    if throughput and "throughput" not in quantities:
        key = sorted(throughput)[0]
        found.append(
            (
                ("verify", "throughput", key),
                f"{where} carry no throughput (name it under status.fields.throughput)",
            )
        )
    if verify.loss.ceiling is not None and "loss" not in quantities:
        found.append(
            (
                ("verify", "loss", "ceiling"),
                f"{where} carry no loss (name it under status.fields.loss)",
            )
        )
    return found


# Names a preset's lines may carry beyond its set: Megatron's training_log prints every key of
# its loss dict (`lm loss`, `mtp_1 loss`, `load_balancing_loss`, ...) and a grad norm per part.
_PRESET_OPEN: dict[str, re.Pattern[str]] = {"megatron": re.compile(r"loss$|grad norm$")}


def _fields(status: StatusSpec) -> Callable[[str], bool] | None:
    """Whether the format's lines can carry a field; None when any field may appear."""
    if status.resolved_format == "regex":
        return frozenset(re.compile(status.pattern or "").groupindex).__contains__
    preset = status.preset
    if preset is None or preset not in _PRESET_FIELDS:
        return None
    known, extra = _PRESET_FIELDS[preset], _PRESET_OPEN.get(preset)
    return lambda name: name in known or (extra is not None and extra.search(name) is not None)


def _source(status: StatusSpec) -> str:
    if status.resolved_format == "regex":
        return "the status pattern's named groups"
    return f"the {status.preset} preset's lines"


def _quantities(status: StatusSpec, carries: Callable[[str], bool]) -> set[str]:
    """Which of loss and throughput the format maps to a field its lines carry."""
    preset = PRESETS[status.preset].fields if status.preset is not None else {}
    given = status.fields.model_dump(exclude_unset=True)
    chosen = {**preset, **given}
    return {q for q in ("loss", "throughput") if carries(chosen.get(q, q))}

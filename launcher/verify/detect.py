"""Find the `status:` block that reads a sample of a trainer's output. Pure: lines in, a block out.

`detect_status(lines)` tries the formats launcher reads (`launcher.verify.formats`) on the
sample, each with the fields it guesses from the lines' own key names, and keeps the block that
reads the most: the quantities the checks need first (step, loss, throughput), then the number
of lines, then the more specific reading (DFlash's default, a preset, a generic format). Its
answer is the block as a playbook holds it, with how sure it is and why. `launcher
status-format detect` and the `samples` check's note on lines it cannot read use it, as may any
command that writes a playbook from a sample of the trainer's output.

Where each shape comes from (real lines, quoted in tests/unit/test_detect.py and docs/verify.md):
nanoGPT's train.py, Megatron-LM's training_log, torchtitan's MetricsProcessor.log, the Hugging
Face Trainer's ProgressCallback, Lightning's TQDMProgressBar (`Epoch 0:   4%|▍ | 350/8000
[00:09<03:23, 37.56it/s, v_num=0]`: lightning/pytorch/callbacks/progress/tqdm_progress.py,
whose on_train_epoch_start resets the one training bar, `initial = 0`, and sets the
description `f"Epoch {trainer.current_epoch}"`; the postfix is `get_metrics`: `v_num` and the
metrics logged with prog_bar=True) and tqdm's default layout.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from launcher.verify.formats import BAR_RE, StatusSpec, rate_unit
from launcher.verify.lines import logical_lines, message_start
from launcher.verify.parse import parse_pane
from launcher.verify.readers import dict_fields, json_fields, keyvalue_fields
from launcher.verify.samples import Quantity, Sample, Share

__all__ = [
    "MAX_LINES",
    "SUGGEST_AFTER",
    "Detection",
    "detect_status",
    "status_yaml",
    "suggests",
    "unread_note",
]

MAX_LINES = 400  # the newest lines of a sample that are looked at: detection stays cheap
SUGGEST_AFTER = 3  # lines another block reads before the probe calls them the trainer's
_QUANTITIES = ("step", "loss", "throughput")
_NO_WRAP = 1 << 30

# Key names, lower case, in preference order (the first one a sample carries wins).
_STEP_KEYS = (
    "step",
    "global_step",
    "iter",
    "iteration",
    "it",
    "steps",
    "train_step",
    "trainer/global_step",
    "update",
    "updates",
    "batch",
)
_LOSS_KEYS = (
    "loss",
    "train_loss",
    "train/loss",
    "training_loss",
    "loss/train",
    "train loss",
    "lm loss",
    "train_loss_step",
    "loss_step",
    "avg_loss",
    "loss_avg",
)
_NOT_TRAIN_LOSS = re.compile(r"val|eval|test|scale|valid")
# Rates: the key names a unit (`tok/s`, `tokens_per_sec`, `perf/tps`, `samples/s`), matched
# at the end of the key; the most specific unit first. `throughput` alone counts tokens unless
# its value names its unit.
_PER_SECOND = r"(?:/|_per_|_|\s*per\s*)(?:s|sec|second)"
_RATE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"(?:^|[./_ ])(?:tok|token)s?{_PER_SECOND}$|(?:^|[./_ ])tps$"), "tok/s"),
    (
        re.compile(rf"(?:^|[./_ ])(?:sample|seq|sequence|img|image|example)s?{_PER_SECOND}$"),
        "samples/s",
    ),
    (re.compile(rf"(?:^|[./_ ])(?:it|iter|iteration|step|batch)s?{_PER_SECOND}$"), "it/s"),
    (re.compile(r"(?:^|[./_ ])throughput$"), ""),
)
# Time per iteration: its rate is one iteration per that time.
_TIME_KEYS = (
    "elapsed time per iteration (ms)",
    "time",
    "dt",
    "step_time",
    "iter_time",
    "time_per_step",
    "time_per_iter",
    "batch_time",
    "step time",
)
# Time since the start, in seconds or as a duration (not a time per step).
_ELAPSED_KEYS = ("elapsed", "elapsed_s", "elapsed_sec", "elapsed_time", "time_elapsed", "runtime")
_PATH_RE = re.compile(r"[./]")  # nested keys: `train.loss`, `train/loss`
_QUEUE_RE = re.compile(r"(?:^|[._/])(q_\w+|\w*queue\w*)$", re.IGNORECASE)
_PRESETS = ("megatron", "nanogpt", "torchtitan", "hf-trainer")
# The fields that tell each preset's lines (any one set, all of its names; lower case).
_SIGNATURES: dict[str, tuple[frozenset[str], ...]] = {
    "megatron": (
        frozenset(("iteration", "elapsed time per iteration (ms)")),
        frozenset(("iteration", "consumed samples")),
    ),
    "nanogpt": (frozenset(("iter", "time", "mfu")),),
    "torchtitan": (frozenset(("step", "tps")), frozenset(("step", "tflops"))),
    # The Trainer's logged dicts (`on_log`): the learning rate and the epoch with the loss.
    "hf-trainer": (frozenset(("loss", "learning_rate")), frozenset(("loss", "epoch"))),
}


@dataclass(frozen=True)
class Detection:
    """What a sample's lines read to best, as a playbook's `status:` block."""

    # The block (`{}`: the default, DFlash lines, read them); None: no block reads them.
    status: dict[str, Any] | None
    confidence: float  # 0..1: step, loss and throughput each read from three lines or more
    explanation: str  # one sentence a person reads: what was found, what is missing
    shape: str = ""  # the candidate that won: dflash, a preset, keyvalue, json, ...
    read: int = 0  # status lines the block reads in the sample
    lines: int = 0  # non-blank lines in the sample
    reads: tuple[str, ...] = ()  # the quantities it reads: step, loss, throughput
    examples: tuple[str, ...] = ()  # two of the lines it reads (or of the sample's lines)
    samples: tuple[Sample, ...] = field(default=(), repr=False)  # what the block read

    def yaml(self) -> str:
        """The block as YAML text, `status:` included (empty when nothing was found)."""
        return "" if self.status is None else status_yaml(self.status)


def status_yaml(status: dict[str, Any]) -> str:
    return yaml.safe_dump(
        {"status": status}, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def detect_status(lines: list[str]) -> Detection:
    """The `status:` block that reads these lines best (a log's, a pane's), and why."""
    logical = [line for line in logical_lines("\n".join(lines)) if line.strip()][-MAX_LINES:]
    text = "\n".join(logical)
    best: tuple[tuple[int, int, int], str, dict[str, Any], list[Sample]] | None = None
    for priority, (shape, block) in enumerate(reversed(_candidates(logical))):
        samples = _read(text, block)
        if not samples:
            continue
        score = (len(_covered(samples)), len(samples), priority)
        if best is None or score > best[0]:
            best = (score, shape, block, samples)
    if best is None:
        quoted = tuple(logical[-2:])
        why = (
            f"none of the {len(logical)} lines reads as a status line in a known format "
            "(DFlash, key/value, JSON, Python dict, progress bar, or a preset)"
            if logical
            else "the sample holds no lines"
        )
        return Detection(None, 0.0, why, lines=len(logical), examples=quoted)
    _, shape, block, samples = best
    covered = _covered(samples)
    reads = tuple(q for q in _QUANTITIES if q in covered)
    confidence = round(len(reads) / 3 * min(1.0, len(samples) / 3), 2)
    missing = [q for q in _QUANTITIES if q not in reads]
    why = f"{len(samples)} of {len(logical)} lines read as {_describe(shape)}"
    why += f": {', '.join(reads)}" if reads else ": no step, loss or throughput"
    if missing:
        why += f" (no {' or '.join(missing)} found: name the field under status.fields)"
    examples = tuple(dict.fromkeys(s.raw for s in samples[-2:]))
    return Detection(
        block,
        confidence,
        why,
        shape,
        len(samples),
        len(logical),
        reads,
        examples,
        tuple(samples),
    )


def _describe(shape: str) -> str:
    if shape == "dflash":
        return "DFlash lines (the default: no status: block needed)"
    if shape in _PRESETS:
        return f"the {shape} preset's lines"
    return f"{shape} lines"


def _read(text: str, block: dict[str, Any]) -> list[Sample]:
    try:
        spec = StatusSpec.model_validate(block)
    except ValidationError:
        return []  # a guessed field the format's model refuses: not this candidate
    # The lines are joined already: a width no row reaches joins none and cuts none.
    return parse_pane(text, spec, width=_NO_WRAP)


def _covered(samples: list[Sample]) -> set[str]:
    found: set[str] = set()
    for sample in samples:
        if sample.step is not None or sample.number("epoch") is not None:
            found.add("step")  # HF's dicts: the epoch stands for the step (`history._COUNTERS`)
        if sample.loss is not None:
            found.add("loss")
        if sample.throughput is not None:
            found.add("throughput")
    return found


# --- candidates -------------------------------------------------------------------------------


def _candidates(lines: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Every block worth trying, the most specific first (it wins a tie)."""
    bodies = [line[message_start(line) :] for line in lines]
    dict_rows = [fields for body in bodies if (fields := dict_fields(body))]
    names = {key.lower() for row in dict_rows for key in row}
    names |= {key.lower() for body in bodies for key in keyvalue_fields(body)}
    found: list[tuple[str, dict[str, Any]]] = [("dflash", {})]
    # A preset is tried when the lines carry its own fields: a generic format's lines that a
    # preset happens to read too (`step`, `loss`) are named as what they are.
    found += [
        (name, {"preset": name})
        for name in _PRESETS
        if any(signature <= names for signature in _SIGNATURES[name])
    ]
    bars = [m for body in bodies if (m := BAR_RE.match(body)) is not None]
    if bars:
        found.append(_bars(bars))
    json_rows = [fields for body in bodies if (fields := json_fields(body))]
    for fmt, rows in (("json", json_rows), ("python-dict", dict_rows)):
        if rows:
            found.append((fmt, _block(fmt, rows)))
    rows = [
        fields for body in bodies if not BAR_RE.match(body) and (fields := keyvalue_fields(body))
    ]
    if rows:
        found.append(("keyvalue", _block("keyvalue", rows)))
    return found


def _bars(bars: list[re.Match[str]]) -> tuple[str, dict[str, Any]]:
    """Progress bars: Lightning's `Epoch N: ...` (the loss in the postfix) or tqdm's own."""
    described = Counter(
        desc.split()[0] for m in bars if (desc := (m["desc"] or "").strip()) and desc.split()
    )
    progress: bool | str = True
    if described:
        word, count = described.most_common(1)[0]
        if count * 2 >= len(bars):
            progress = word
    rows = [keyvalue_fields(m["postfix"]) for m in bars if m["postfix"]]
    block: dict[str, Any] = {"format": "keyvalue", "progress": progress}
    loss = _loss_key(_keys(rows)) if rows else None
    if loss is not None and loss != "loss":
        block["fields"] = {"loss": loss}
    shape = "Lightning progress-bar" if progress == "Epoch" else "progress-bar"
    return shape, block


def _keys(rows: list[dict[str, object]]) -> dict[str, object]:
    """Keys most rows carry (at least a third of them), with a value of each."""
    counts: Counter[str] = Counter()
    value: dict[str, object] = {}
    for row in rows:
        for key, item in row.items():
            counts[key] += 1
            if item is not None:
                value[key] = item
    floor = max(1, len(rows) // 3)
    return {key: value.get(key) for key, n in counts.items() if n >= floor}


def _numeric(value: object) -> bool:
    return type(value) in (int, float) or isinstance(value, Quantity | Share)


def _pick(keys: dict[str, object], wanted: tuple[str, ...]) -> str | None:
    """The first wanted name a key is, or ends with as a path (`train/global_step`)."""
    lower = {key.lower(): key for key in keys if _numeric(keys[key])}
    found = next((lower[name] for name in wanted if name in lower), None)
    if found is not None:
        return found
    last = {_PATH_RE.split(name)[-1]: key for name, key in lower.items()}
    return next((last[name] for name in wanted if name in last), None)


def _loss_key(keys: dict[str, object]) -> str | None:
    found = _pick(keys, _LOSS_KEYS)
    if found is not None:
        return found
    return next(
        (
            key
            for key, value in keys.items()
            if "loss" in key.lower() and not _NOT_TRAIN_LOSS.search(key.lower()) and _numeric(value)
        ),
        None,
    )


def _throughput(keys: dict[str, object]) -> tuple[str, str] | None:
    """The throughput's field and unit: a rate if the lines carry one, else a time per step."""
    lower = {key.lower(): key for key in keys if _numeric(keys[key])}
    for pattern, unit in _RATE_PATTERNS:
        key = next((lower[name] for name in lower if pattern.search(name)), None)
        if key is None:
            continue
        value = keys[key]
        if isinstance(value, Quantity):  # `12.3Ktok/s`: the value names its unit
            own = rate_unit(value.unit)
            unit = own[0] if own is not None else unit
        return key, unit or "tok/s"
    for name in _TIME_KEYS:
        key = lower.get(name)
        if key is None:
            continue
        value = keys[key]
        if isinstance(value, Quantity):  # `30.5ms`: a duration, read as such in any unit
            if value.unit == "s":
                return key, "s/it"
            continue
        return key, "ms/it" if "ms" in name else "s/it"
    return None


def _block(fmt: str, rows: list[dict[str, object]]) -> dict[str, Any]:
    """A generic format's block: the checked quantities under the trainer's own key names."""
    keys = _keys(rows)
    fields: dict[str, Any] = {}
    step = _pick(keys, _STEP_KEYS)
    if step is not None and step != "step":
        fields["step"] = step
    loss = _loss_key(keys)
    if loss is not None and loss != "loss":
        fields["loss"] = loss
    rate = _throughput(keys)
    if rate is not None:
        fields["throughput"], fields["throughput_unit"] = rate
    elapsed = _pick(keys, _ELAPSED_KEYS)
    if elapsed is not None and elapsed != _rate_key(rate):
        fields["elapsed"] = elapsed  # seconds since the start: bounds a stall as `[Nm]` does
    queues = {
        key.rsplit(".", 1)[-1]: key
        for key in keys
        if _QUEUE_RE.search(key) and key.rsplit(".", 1)[-1] != key
    }
    if queues:
        fields["queues"] = queues
    return {"format": fmt, "fields": fields} if fields else {"format": fmt}


# --- the probe's note on lines it cannot read -------------------------------------------------


def suggests(found: Detection) -> bool:
    """Whether the lines are status lines of another shape for certain: a block reads three
    lines or more (one or two may be a start-up evaluation's) and finds the loss in them, or
    the step in lines that are not progress bars (a bar alone, e.g. a data loader's or a
    download's, may come before the training's own lines)."""
    if found.status is None or found.read < SUGGEST_AFTER:
        return False
    bars = all(sample.reading.progress for sample in found.samples)
    return "loss" in found.reads or ("step" in found.reads and not bars)


def unread_note(captured: int, found: Detection) -> str:
    """What the `samples` check says when a capture's lines hold no status line: its first
    line is the reason (two lines quoted, the block inline), then the block as YAML."""
    quoted = ", ".join(f"`{_clip(line)}`" for line in found.examples[:2])
    head = f"no status line in {captured} captured lines"
    if found.status is None or not suggests(found):
        return f"{head} (e.g. {quoted})" if quoted else head
    inline = yaml.safe_dump(
        found.status, default_flow_style=True, width=1 << 16, sort_keys=False
    ).strip()
    first = (
        f"{head}: {found.read} read as {_describe(found.shape)} with the playbook block "
        f"`status: {inline}` (e.g. {quoted})"
    )
    return f"{first}\nput this in the playbook (launcher status-format detect prints it):\n" + (
        found.yaml().rstrip()
    )


def _clip(line: str, limit: int = 100) -> str:
    line = line.strip().replace("`", "'")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _rate_key(rate: tuple[str, str] | None) -> str | None:
    return rate[0] if rate is not None else None

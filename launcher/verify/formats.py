"""Status-line formats: the playbook's `status:` section and the readers it chooses.

`launcher.verify.parse` turns a capture into logical lines (ANSI removed, `\\r` redraws resolved,
wrapped rows joined) and reads DFlash-style lines itself. The other formats are read here, each
line after the prefixes launchers and loggers add (`status.message_start`):

    keyvalue     `key=value`, `key: value` (the key may be words: `lm loss: 2.5`) and
                 `key 12.3` (a number after words: `iter 100`, `loss 4.2345,`)
    json         one JSON object a line (the whole message); nested keys joined with dots
    python-dict  a printed Python dict (`{'loss': nan, 'epoch': 0.5}`), read as literals only
    regex        the named groups of the playbook's `pattern`

The trainer's field names are then mapped to the quantities the checks read (`step`, `loss`,
`throughput` in the unit the format names, queues, `elapsed`, `eta`). A line is a status line
when it yields at least one of step, loss and throughput. Progress bars (tqdm) can be read too,
for the step, the rate and the elapsed time a bar shows.
"""

from __future__ import annotations

import gc
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from launcher.verify.lines import last_nonblank, message_start
from launcher.verify.readers import (
    READERS,
    keyvalue_fields,
    kv_value,
    regex_fields,
)
from launcher.verify.samples import (
    MISS,
    Quantity,
    Reading,
    ReadSample,
    RowMemo,
    Sample,
    Share,
    classify,
)

__all__ = [
    "BAR_RE",
    "FORMATS",
    "PRESETS",
    "FieldsSpec",
    "LineReader",
    "StatusSpec",
    "kv_value",
    "rate_unit",
    "regex_fields",
    "to_rate",
]

FORMATS = tuple(READERS)

_ABSENT = object()


# --- throughput units -------------------------------------------------------------------------

# unit -> (what it counts per second, scale to that, per-iteration time: invert)
_RATE_UNITS: dict[str, tuple[str, float, bool]] = {
    **dict.fromkeys(("tok/s", "tokens/s", "token/s", "tps", "t/s"), ("tok/s", 1.0, False)),
    **dict.fromkeys(
        ("samples/s", "sample/s", "seq/s", "sequences/s", "img/s", "images/s"),
        ("samples/s", 1.0, False),
    ),
    **dict.fromkeys(
        ("it/s", "its/s", "steps/s", "step/s", "iter/s", "batches/s"), ("it/s", 1.0, False)
    ),
    **dict.fromkeys(("s/it", "s/step", "s/iter"), ("it/s", 1.0, True)),
    **dict.fromkeys(("ms/it", "ms/step", "ms/iter"), ("it/s", 1e-3, True)),
}
_UNIT_SCALES = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}


def rate_unit(unit: str) -> tuple[str, float, bool] | None:
    """`Ktok/s` -> ("tok/s", 1000.0, False); `ms/it` -> ("it/s", 0.001, True); None if unknown."""
    known = _RATE_UNITS.get(unit)
    if known is not None:
        return known
    scale = _UNIT_SCALES.get(unit[:1])
    base = _RATE_UNITS.get(unit[1:])
    if scale is None or base is None or base[2]:
        return None
    return base[0], base[1] * scale, False


def to_rate(value: object, unit: tuple[str, float, bool]) -> float | None:
    """A field's value as a rate in the unit's base (tok/s, samples/s or it/s).

    A plain number is in `unit`; a number printed with its own unit (`12.3Ktok/s`, `1.2s/it`)
    or a duration (`123.45ms`, for a per-iteration unit) is converted from that. A rate of
    another kind than `unit` counts (it/s for tok/s) is not a reading: None.
    """
    base, scale, inverted = unit
    if isinstance(value, Share):  # `512.3/498.1`, `13/16`: the count is the reading
        value = value.value
    if type(value) is int or type(value) is float:
        number = float(value)
    elif isinstance(value, Quantity):
        if value.unit == "s":  # a duration: the time one iteration took
            if not inverted:
                return None
            number, scale = value.value, 1.0
        else:
            own = rate_unit(value.unit)
            if own is None or own[0] != base:
                return None
            (_, scale, inverted), number = own, value.value
    else:
        return None
    if not inverted:
        return number * scale
    if math.isnan(number):
        return number
    seconds = number * scale
    return 1.0 / seconds if seconds > 0 else None


# --- the playbook's `status:` section ---------------------------------------------------------


class _Model(BaseModel):
    # Built on first use, as launcher.config.models's models (its _Model says why).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class FieldsSpec(_Model):
    """Which of the trainer's fields hold the quantities the checks read."""

    step: str | None = None
    loss: str | None = None
    throughput: str | None = None
    throughput_unit: str | None = None  # e.g. tok/s, Ktok/s, samples/s, it/s, s/it, ms/it
    elapsed: str | None = None  # seconds since the start (or a duration such as 1h2m, 01:02:03)
    eta: str | None = None
    queues: dict[str, str] = Field(default_factory=dict)  # checked name -> trainer's field
    watch: list[str] = Field(default_factory=list)  # other numbers that must stay finite

    @field_validator("step", "loss", "throughput", "elapsed", "eta")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must name a field (got an empty string)")
        return value

    @field_validator("throughput_unit")
    @classmethod
    def _unit(cls, value: str | None) -> str | None:
        if value is not None and rate_unit(value) is None:
            known = "tok/s, Ktok/s, Mtok/s, samples/s, Ksamples/s, it/s, s/it, ms/it"
            raise ValueError(f"unknown throughput unit {value!r} (known: {known}, ...)")
        return value

    @field_validator("queues")
    @classmethod
    def _queues(cls, value: dict[str, str]) -> dict[str, str]:
        for name, source in value.items():
            if not name.strip() or not source.strip():
                raise ValueError("queue names and the fields they come from must not be empty")
        return value

    @field_validator("watch")
    @classmethod
    def _watch(cls, value: list[str]) -> list[str]:
        if any(not name.strip() for name in value):
            raise ValueError("must name fields (got an empty string)")
        return value


@dataclass(frozen=True)
class Preset:
    """A trainer's format: where its lines come from is cited at each preset."""

    format: str
    fields: dict[str, Any]
    progress: bool | str = False
    source: str = ""


PRESETS: dict[str, Preset] = {
    # transformers' ProgressCallback: `self.training_bar = tqdm(total=state.max_steps, ...)`
    # and `on_log`: `self.training_bar.write(str(shallow_logs))`, e.g. (transformers#35207)
    #   {'loss': 2.119, 'grad_norm': 37.657958984375, 'learning_rate': 4.58e-05, 'epoch': 0.25}
    # The dict lines hold no step and no rate: both come from the training bar (no description)
    #     25%|██▌       | 500/2000 [01:23<04:09,  6.01it/s]
    # A run whose loss prints as 0.0 while `'grad_norm': nan` (ModernBERT#233) is caught by
    # watching grad_norm.
    "hf-trainer": Preset(
        format="python-dict",
        fields={"loss": "loss", "watch": ["grad_norm"]},
        progress=True,
        source="transformers/src/transformers/trainer_callback.py (ProgressCallback)",
    ),
    # torchtitan/components/metrics.py, MetricsProcessor.log:
    #   f"{color.red}step: {step:2}  {color.green}loss: {global_avg_loss:7.4f}  "
    #   f"{color.orange}grad_norm: {grad_norm:7.4f}  {color.turquoise}memory: ...GiB(...%)  "
    #   f"{color.blue}tps: {round(tps):,}  {color.cyan}tflops: ...  {color.magenta}mfu: ...%"
    # behind torchtitan/tools/logging.py's "[titan] %(asctime)s - %(name)s - %(levelname)s - "
    # and torchrun's `[rank0]:`; tps is tokens per second per device, with thousands commas.
    "torchtitan": Preset(
        format="keyvalue",
        fields={
            "step": "step",
            "loss": "loss",
            "throughput": "tps",
            "throughput_unit": "tok/s",
            "watch": ["grad_norm"],
        },
        source="torchtitan/components/metrics.py (MetricsProcessor.log)",
    ),
    # nanoGPT train.py: print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, "
    # f"mfu {running_mfu*100:.2f}%") and, at evaluations, "step {iter_num}: train loss ...,
    # val loss ..." (no `iter`: not a step reading). The rate is one iteration per `time`.
    "nanogpt": Preset(
        format="keyvalue",
        fields={"step": "iter", "loss": "loss", "throughput": "time", "throughput_unit": "ms/it"},
        source="nanoGPT/train.py",
    ),
    # Megatron-LM megatron/training/training.py, training_log():
    #   " [%Y-%m-%d %H:%M:%S] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time
    #   per iteration (ms): {:.1f} | learning rate: {:.6E} | global batch size: {:5d} |
    #   lm loss: {:.6E} | loss scale: {:.1f} | grad norm: {:.3f} | number of skipped
    #   iterations: {:3d} | number of nan iterations: {:3d} |"
    "megatron": Preset(
        format="keyvalue",
        fields={
            "step": "iteration",
            "loss": "lm loss",
            "throughput": "elapsed time per iteration (ms)",
            "throughput_unit": "ms/it",
            "watch": ["grad norm"],
        },
        source="Megatron-LM/megatron/training/training.py (training_log)",
    ),
}

PresetName = Literal["hf-trainer", "torchtitan", "nanogpt", "megatron"]
FormatName = Literal["dflash", "keyvalue", "json", "python-dict", "regex"]


class StatusSpec(_Model):
    """The playbook's `status:` section: how the trainer's status lines are read."""

    preset: PresetName | None = None
    format: FormatName | None = None  # dflash unless a preset says otherwise
    pattern: str | None = None  # regex: named groups become fields
    fields: FieldsSpec = Field(default_factory=FieldsSpec)
    # Read tqdm progress bars too: true = bars without a description, a text = bars whose
    # description starts with it (e.g. "Epoch").
    progress: bool | str | None = None

    _reader: LineReader | None = PrivateAttr(default=None)

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str | None) -> str | None:
        if value is None:
            return value
        try:
            compiled = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        if not compiled.groupindex:
            raise ValueError("needs named groups, e.g. (?P<step>\\d+), to name the fields")
        return value

    @field_validator("progress")
    @classmethod
    def _progress(cls, value: bool | str | None) -> bool | str | None:
        if isinstance(value, str) and not value.strip():
            raise ValueError("must be true, false or the start of the bars' description")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StatusSpec:
        if self.preset is not None and self.format is not None:
            fmt = PRESETS[self.preset].format
            raise ValueError(
                f"preset {self.preset!r} already sets the format ({fmt}): "
                "give either preset or format"
            )
        fmt = self.resolved_format
        if fmt == "regex" and self.pattern is None:
            raise ValueError("format regex needs a pattern with named groups")
        if fmt != "regex" and self.pattern is not None:
            raise ValueError(f"pattern is only read with format regex (this format: {fmt})")
        if fmt == "regex":
            groups = set(re.compile(self.pattern or "").groupindex)
            for key, name in self._named_fields():
                if name not in groups:
                    raise ValueError(
                        f"fields.{key}: {name!r} is not a named group of pattern "
                        f"(groups: {', '.join(sorted(groups))})"
                    )
        return self

    def _named_fields(self) -> list[tuple[str, str]]:
        f = self.fields
        named = [
            (k, v) for k in ("step", "loss", "throughput", "elapsed", "eta") if (v := getattr(f, k))
        ]
        named += [(f"queues.{k}", v) for k, v in f.queues.items()]
        named += [("watch", v) for v in f.watch]
        return named

    @property
    def resolved_format(self) -> str:
        if self.format is not None:
            return self.format
        return PRESETS[self.preset].format if self.preset is not None else "dflash"

    def model_post_init(self, context: Any, /) -> None:
        self._reader = _compile(self)

    def reader(self) -> LineReader | None:
        """The compiled reader; None for plain DFlash lines (the parser's own fast path)."""
        return self._reader


# --- reading lines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Mapping:
    step: str | None
    loss: str | None
    throughput: str | None
    unit: tuple[str, float, bool]
    elapsed: str | None
    eta: str | None
    queues: dict[str, str] = field(default_factory=dict)

    def apply(self, fields: dict[str, object]) -> tuple[dict[str, object], float | None]:
        """The fields under the checked names, and the elapsed minutes, or None if none."""
        out = fields
        for canon, source in (("step", self.step), ("loss", self.loss), ("eta", self.eta)):
            if source is None or source == canon:
                continue
            value = fields.get(source, _ABSENT)
            if value is _ABSENT:
                out.pop(canon, None)  # a field named like a checked one is not that reading
            else:
                out[canon] = value
        if self.throughput is not None:
            value = fields.get(self.throughput, _ABSENT)
            if value is _ABSENT:
                out.pop("throughput", None)
            else:
                out["throughput"] = to_rate(value, self.unit)
        for name, source in self.queues.items():
            value = fields.get(source, _ABSENT)
            if value is not _ABSENT:
                out[name] = value
        return out, _minutes(fields.get(self.elapsed)) if self.elapsed else None


def _minutes(value: object) -> float | None:
    if isinstance(value, Share):
        value = value.value
    if type(value) is int or type(value) is float:
        return float(value) / 60.0
    if isinstance(value, Quantity) and value.unit == "s":
        return value.value / 60.0
    return None


_CHECKED = ("step", "loss", "throughput")
# What a line gives: its fields (under the checked names), elapsed minutes, raw line, reading.
_Made = tuple[dict[str, object], float | None, str, Reading]


@dataclass
class LineReader:
    """Reads one format's status lines (and, if asked, progress bars) out of logical lines."""

    format: str
    mapping: _Mapping
    reading: Reading
    pattern: re.Pattern[str] | None = None
    progress: bool | str = False
    bar_reading: Reading = field(default_factory=Reading)
    bar_throughput: bool = True  # the bars' rate is the throughput (the lines carry none)

    def read(self, lines: list[str], cut: bool, memo: RowMemo | None = None) -> list[Sample]:
        samples: list[Sample] = []
        collecting = gc.isenabled()
        gc.disable()  # as parse_pane: no cycles are made, so the collector would only rescan
        try:
            below_bar = False
            for line in lines:
                if not line.strip():
                    continue
                if memo is None:
                    bar, made = self._row(line)
                else:
                    found = memo.get(line)
                    if found is MISS:
                        found = self._row(line)
                        memo.put(line, found)
                    bar, made = found  # type: ignore[misc]
                if bar:
                    # A bar right below a bar that was read is a nested one (an
                    # evaluation's): its count is not the training step.
                    made = None if below_bar else made
                    self._add(samples, made)
                    below_bar = made is not None
                    continue
                below_bar = False
                self._add(samples, made)
        finally:
            if collecting:
                gc.enable()
        if cut and samples and samples[-1].raw == last_nonblank(lines):
            samples.pop()  # it ran to the pane's edge and the capture ended: incomplete
        return samples

    def _row(self, line: str) -> tuple[bool, _Made | None]:
        """One line read on its own: whether it is a progress bar, and what it gives."""
        start = message_start(line)
        body = line[start:] if start else line
        if self.progress:
            bar = _BAR_RE.match(body)
            if bar is not None:
                return True, self._bar(bar, line)
        return False, self._line(body, line)

    @staticmethod
    def _add(samples: list[Sample], made: _Made | None) -> None:
        if made is not None:
            fields, elapsed, raw, reading = made
            samples.append(ReadSample(len(samples), elapsed, fields, raw, reading))

    def _line(self, body: str, line: str) -> _Made | None:
        fields, elapsed = READERS[self.format](body, line, self.pattern)
        if not fields:
            return None
        fields, mapped_elapsed = self.mapping.apply(fields)
        if not any(key in fields for key in _CHECKED):
            return None
        return (
            fields,
            mapped_elapsed if mapped_elapsed is not None else elapsed,
            line.strip(),
            self.reading,
        )

    def _bar(self, bar: re.Match[str], line: str) -> _Made | None:
        desc = (bar["desc"] or "").strip()
        wanted = self.progress
        if (wanted is True and desc) or (isinstance(wanted, str) and not desc.startswith(wanted)):
            return None
        fields: dict[str, object] = keyvalue_fields(bar["postfix"]) if bar["postfix"] else {}
        epoch = _EPOCH_RE.match(desc)
        if epoch is not None and "epoch" not in fields:
            # Lightning's `Epoch 3`: its one training bar is reset (from 0) at each epoch's
            # start (tqdm_progress.py, on_train_epoch_start): a new epoch, not a restart.
            fields["epoch"] = int(epoch[1])
        fields, _ = self.mapping.apply(fields)
        fields["step"] = _count(bar["n"])
        if bar["total"]:
            fields["total"] = _count(bar["total"])
        unit = rate_unit(bar["unit"])  # it/s, s/it, or the bar's own unit (`tok/s`)
        rate = None if bar["rate"] == "?" or unit is None else to_rate(_scaled(bar["rate"]), unit)
        fields["rate"] = rate
        if self.bar_throughput:
            fields["throughput"] = rate
        elapsed = classify(bar["elapsed"])
        if bar["remaining"] and bar["remaining"] != "?":
            fields["eta"] = classify(bar["remaining"])
        reading = self.bar_reading if unit is None else _bar_reading(self.bar_reading, unit[0])
        return fields, _minutes(elapsed), line.strip(), reading


def _bar_reading(base: Reading, unit: str) -> Reading:
    return base if base.unit == unit else Reading(base.format, unit, base.watch, True)


def _scaled(text: str) -> float:
    """tqdm's unit_scale numbers: `1.20k` -> 1200.0."""
    scale = _UNIT_SCALES.get(text[-1:])
    return float(text[:-1]) * scale if scale is not None else float(text)


def _count(text: str) -> int:
    return int(_scaled(text))


def _compile(spec: StatusSpec) -> LineReader | None:
    preset = PRESETS[spec.preset] if spec.preset is not None else None
    fmt = spec.resolved_format
    given = spec.fields.model_dump(exclude_unset=True)
    base: dict[str, Any] = dict(preset.fields) if preset is not None else {}
    chosen = {**base, **given}
    progress = (
        spec.progress if spec.progress is not None else (preset.progress if preset else False)
    )
    if fmt == "dflash" and not chosen and not progress:
        return None  # the parser's own DFlash fast path
    default = fmt != "dflash"  # other formats name the usual fields by default
    unit_name = chosen.get("throughput_unit") or "tok/s"
    unit = rate_unit(unit_name)
    assert unit is not None  # validated
    throughput = chosen.get("throughput", "throughput" if default else None)
    mapping = _Mapping(
        step=chosen.get("step", "step" if default else None),
        loss=chosen.get("loss", "loss" if default else None),
        throughput=throughput,
        unit=unit,
        elapsed=chosen.get("elapsed"),
        eta=chosen.get("eta", "eta" if default else None),
        queues=dict(chosen.get("queues", {})),
    )
    watch = tuple(chosen.get("watch", ()))
    bar_throughput = "throughput" not in chosen
    # When the bars carry the rate, the run's throughput is counted in their it/s.
    reading = Reading(fmt, "it/s" if progress and bar_throughput else unit[0], watch, False)
    return LineReader(
        format=fmt,
        mapping=mapping,
        reading=reading,
        pattern=re.compile(spec.pattern) if spec.pattern is not None else None,
        progress=progress,
        bar_reading=Reading("progress", "it/s", watch, True),
        # A preset or playbook that names the throughput field reads it from the lines; the
        # bars' rate then stays a field of its own (`rate`).
        bar_throughput=bar_throughput,
    )


# --- progress bars ------------------------------------------------------------------------------

# tqdm's default layout: `{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<
# {remaining}, {rate_fmt}{postfix}]`, or without a total `{desc}: {n_fmt}{unit} [{elapsed},
# {rate_fmt}{postfix}]`; rate_fmt is `6.01it/s`, `1.23s/it` or `?it/s` before the first update.
_EPOCH_RE = re.compile(r"Epoch\s+(\d+)\b")
BAR_RE = _BAR_RE = re.compile(
    r"\s*(?:(?P<desc>[^|\[\]{}]{0,80}?):\s*)?"
    r"(?:\d{1,3}%\|[^|]*\|\s*)?"
    r"(?P<n>\d+(?:\.\d+)?[kMG]?)(?:/(?P<total>\d+(?:\.\d+)?[kMG]?))?\s*(?:[A-Za-z]+\s*)?"
    r"\[(?P<elapsed>(?:\d+:)?\d+:\d\d)(?:<(?P<remaining>(?:\d+:)?\d+:\d\d|\?))?,\s*"
    r"(?P<rate>\?|\d+(?:\.\d+)?[kMG]?)\s*(?P<unit>[A-Za-z]*/[A-Za-z]+)"
    r"(?:,\s*(?P<postfix>[^\]]*))?\]"
)

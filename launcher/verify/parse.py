"""Parse trainer status lines out of captured tmux pane text.

Pure: text in, `Sample`s out; no I/O. The grammar is generic so that any trainer printing
`key=value` fields works, not just the DFlash status line:

    [1m] step=2 loss=6.4079 lr=6.43e-07 | tgt=0.40b/s (12.3Ktok/s) | q_pre=[8, 6] ETA=10.9d

Field values become: int / float (`nan`, `inf` included), None for "not known yet" (`---`, `???`)
or a value cut off at the end of the capture, a tuple for `[a, b, ...]` lists, `Quantity` for a
number with a unit (durations normalised to seconds, `Ktok/s` to tok/s), and the raw string for
anything else. The parenthesised `(12.3Ktok/s)` becomes the field `throughput` in tok/s.

Other formats (JSON lines, Python dicts, `key: value`, regex, progress bars) are read by
`launcher.verify.formats`, chosen by the playbook's `status:` section and passed as
`parse_pane`'s `spec`; the line handling (`launcher.verify.lines`: ANSI, `\r` redraws,
logging prefixes, wrapped rows) and the samples (`launcher.verify.samples`) serve them all.
"""

from __future__ import annotations

import gc
import re

from launcher.verify.lines import (
    MINUTE_PREFIX_RE,
    clean_text,
    last_nonblank,
    message_start,
    split_rows,
)
from launcher.verify.samples import (
    MISS,
    NUMBER,
    Fields,
    RowMemo,
    Sample,
    SampleReader,
)

__all__ = ["parse_line", "parse_pane"]


# One findall per line yields (key, value) pairs: a key=value / key~value field, or
# ("", "12.3Ktok/s") for the parenthesised throughput. A key must start a token (after
# whitespace, `|` or line start) so `--lr=0.1` or `f(a=1` are not fields. A list runs to `]`
# or, when cut off, to the end of the line.
# Greedy quantifiers (Python 3.10 has no possessive ones): each is followed by a class it cannot
# take (`[=~]` after a key, the end of the match after a value), so none gives anything back.
_KEY = r"[A-Za-z_][\w.\-/]*"
_VALUE = r"\[[^\]]*\]?|\"[^\"]*\"?|[^\s|]*"
_RATE = rf"{NUMBER}\s*[kKMG]?tok/s"
_TOKEN_RE = re.compile(
    rf"(?:(?<![^\s|])({_KEY})[=~]|\(\s*)"
    rf"((?(1)(?:{_VALUE})|{_RATE}))"
    r"(?(1)|\s*\))"
)
# A line's shape (see `_Shapes`): each field as _TOKEN_RE takes it and nothing else, with only
# whitespace and `|` around the fields. A list or a string runs to its first closing mark, or to
# the end of the line when it has none, never shorter (what a possessive `[^\]]*+\]?+` says, in
# Python 3.11+ only); every other quantifier meets a class it cannot take: none gives back.
_SHAPE_KEY_VALUE = {"[": r"(\[[^\]]*(?:\]|\Z))", '"': r'("[^"]*(?:"|\Z))'}
_SHAPE_BARE_VALUE = r"((?![\[\"])[^\s|]*)"  # neither a list nor a string, as _TOKEN_RE decides
_UNSPACED_RATE = rf"\(({NUMBER}[kKMG]?tok/s)\)"  # needs no .replace(" ", "")
_UNSPACED_RATE_RE = re.compile(_UNSPACED_RATE)
_SHAPE_RATE = rf"[\s|]*{_UNSPACED_RATE}"  # it ends at its one `tok/s)`
_GAP_RE = re.compile(r"[\s|]*")
_SHAPE_TRIES = 16  # lines per pane to learn a shape from


class _Shapes:
    """The fields of `[Nm]` status lines, as `_fields(dict(_TOKEN_RE.findall(...)))`, quicker.

    A trainer prints the same status line over and over: the same keys in the same order, only
    the values changing. The shape of such a line is one anchored regex: each key literal, each
    value matched the way _TOKEN_RE matches it, and whitespace or `|` between fields. Matching
    it once costs about half of findall trying every position, and it finds the same fields:
    no field can start inside whitespace and `|`, and each field starts where findall would
    start it (after whitespace or `|`; the `[Nm]` prefix ends in `]` for every line alike).
    The shape is learned from a line findall split, for a few lines per pane; lines of any
    other shape are split by findall.
    """

    def __init__(self) -> None:
        self._shape: re.Pattern[str] | None = None
        self._groups: dict[str, int] = {}  # field -> group of the shape
        self._tries = _SHAPE_TRIES

    def fields(self, line: str, start: int) -> Fields:
        if self._shape is not None:
            m = self._shape.match(line, start)
            if m is not None:
                return Fields._of_match(self._groups, m)
        if not self._tries:
            return _fields(dict(_TOKEN_RE.findall(line, start)))
        self._tries -= 1
        tokens = list(_TOKEN_RE.finditer(line, start))
        self._learn(line, start, tokens)
        return _fields({m[1] or "": m[2] for m in tokens})

    def _learn(self, line: str, start: int, tokens: list[re.Match[str]]) -> None:
        parts = []
        groups: dict[str, int] = {}
        rate = 0
        for group, m in enumerate(tokens, 1):
            if not _GAP_RE.fullmatch(line, start, m.start()):
                return  # other text between fields: this line has no shape to learn
            key, value = m[1], m[2]
            if key:
                kind = _SHAPE_KEY_VALUE.get(value[:1], _SHAPE_BARE_VALUE)
                parts.append(rf"[\s|]+{re.escape(key)}[=~]{kind}")
                groups[key] = group  # as dict(findall): first place, last value
            elif _UNSPACED_RATE_RE.fullmatch(m[0]):
                parts.append(_SHAPE_RATE)
                rate = group
            else:
                return  # a spaced `( 12.3 Ktok/s )`: left to findall
            start = m.end()
        if tokens and _GAP_RE.fullmatch(line, start):
            parts.append(r"[\s|]*\Z")
            if rate:
                groups["throughput"] = rate  # as _fields does
            self._shape = re.compile("".join(parts))
            self._groups = groups


def _fields(raw: dict[str, str | None]) -> Fields:
    """Fields from `dict(_TOKEN_RE.findall(...))`: the `(12.3Ktok/s)` figure is `throughput`."""
    throughput = raw.pop("", None)
    if throughput is not None:
        raw["throughput"] = throughput.replace(" ", "")
    return Fields(raw)


def _parse(line: str, index: int, shapes: _Shapes | None = None) -> Sample | None:
    body = line
    prefix = MINUTE_PREFIX_RE.match(line)
    if prefix is None:
        start = message_start(line)  # `[rank0]: [3m] step=...`, `INFO:root:step=1 ...`
        if start:
            body = line[start:]  # sliced: a field must start a token of the message itself
            prefix = MINUTE_PREFIX_RE.match(body)
    if prefix is not None and shapes is not None:
        fields = shapes.fields(body, prefix.end())
    else:
        raw = dict(_TOKEN_RE.findall(body, prefix.end() if prefix else 0))
        if prefix is None and len(raw) - ("" in raw) < 2:  # two key=value fields, at least
            return None
        fields = _fields(raw)
    return Sample(index, float(prefix[1]) if prefix else None, fields, line.strip())


def _remembered(line: str, index: int, shapes: _Shapes, memo: RowMemo) -> Sample | None:
    """`_parse`, for a line the previous capture did not hold; else what it read to then."""
    found = memo.get(line)
    if found is MISS:
        found = _parse(line, index, shapes)
        memo.put(line, found)
    if found is None:
        return None
    assert isinstance(found, Sample)
    if found.index == index:
        return found
    return Sample(index, found.elapsed_min, found.fields, found.raw)


def _drop_cut_field(sample: Sample) -> Sample:
    # The row ran to the pane's edge and the capture ended there: the last value is partial.
    line = sample.raw
    last = None
    for last in _TOKEN_RE.finditer(line):  # noqa: B007
        pass
    if last is None or last.end() < len(line):
        return sample
    fields = sample.fields
    assert isinstance(fields, Fields)
    raw = {key: fields.raw(key) for key in fields}
    raw[last[1] or "throughput"] = None
    return Sample(sample.index, sample.elapsed_min, Fields(raw), sample.raw)


def parse_line(line: str) -> Sample | None:
    """Parse one (already joined) line; None when it is not a status line.

    A status line starts with `[Nm]` (after any logging prefix) or has at least two key=value /
    key~value fields.
    """
    return _parse(clean_text(line).replace("\n", " "), 0)


def parse_pane(
    text: str,
    spec: SampleReader | None = None,
    *,
    width: int | None = None,
    memo: RowMemo | None = None,
) -> list[Sample]:
    """All status lines in a captured pane, in order.

    `spec` is the playbook's `status:` section (None: DFlash-style lines). `width` is the pane
    width when the capture was taken without `-J`: a row of exactly that width may continue on
    the next row. Without it the width is inferred from the rows themselves. A row never
    continues into one that starts a line of its own (`[Nm]`, a logging prefix, tmux's
    `Pane is dead`, ...) or starts the way the line it would continue started.
    """
    lines, cut = split_rows(text, width)
    if memo is not None:
        memo.begin()
    reader = spec.reader() if spec is not None else None
    if reader is not None:
        return reader.read(lines, cut, memo)
    samples: list[Sample] = []
    # The objects made here hold no reference cycles, so pausing the cyclic collector only saves
    # it rescanning them: about a third of the time on a long scrollback.
    collecting = gc.isenabled()
    gc.disable()
    shapes = _Shapes()
    try:
        for line in lines:
            if memo is None:
                sample = _parse(line, len(samples), shapes)
            else:
                sample = _remembered(line, len(samples), shapes, memo)
            if sample is not None:
                samples.append(sample)
    finally:
        if collecting:
            gc.enable()
    if cut and samples and samples[-1].raw == last_nonblank(lines):
        samples[-1] = _drop_cut_field(samples[-1])
    return samples

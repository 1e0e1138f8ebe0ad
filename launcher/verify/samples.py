"""A status line as the checks read it (`Sample`) and how its printed values become numbers.

A leaf: the DFlash parser (`launcher.verify.parse`), the other formats' readers
(`launcher.verify.formats`, `launcher.verify.readers`) and the checks all share it. Field values
become: int / float (`nan`, `inf` included), None for "not known yet" (`---`, `???`) or a value
cut off at the end of the capture, a tuple for `[a, b, ...]` lists, `Quantity` for a number with
a unit (durations normalised to seconds, `Ktok/s` to tok/s), and the raw string for anything
else.
"""

from __future__ import annotations

import gc
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DFLASH",
    "MISS",
    "NUMBER",
    "Fields",
    "LinesReader",
    "Quantity",
    "ReadSample",
    "Reading",
    "RowMemo",
    "Sample",
    "SampleReader",
    "Share",
    "classify",
    "parse_rate",
]


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with a unit, e.g. `0.30b/s`; durations are stored as seconds with unit "s"."""

    value: float
    unit: str


@dataclass(frozen=True, slots=True)
class Share:
    """`12/16`: a count out of a total (a queue's depth of its capacity, `iteration 100/1000`).

    Read as a number it is the count (`value`); a queue check reads its `fill`.
    """

    value: float
    total: float

    @property
    def fill(self) -> float | None:
        """The count as a share of the total (0.75 for 12/16); None for a total of 0."""
        return self.value / self.total if self.total > 0 else None


class Fields(Mapping[str, object]):
    """A status line's fields: raw text kept, each value converted when first read.

    Converting lazily keeps parsing a long scrollback cheap: checks read a handful of fields.
    """

    __slots__ = ("_match", "_raw", "_values")

    def __init__(self, raw: Mapping[str, str | None]) -> None:
        # field -> text; or, for a line matched by its shape (`_Shapes`), field -> group of
        # _match, the mapping shared by all lines of that shape: a long scrollback then keeps
        # one match object per line instead of a dict and a string per field.
        self._raw: Mapping[str, Any] = raw
        self._match: re.Match[str] | None = None
        # Converted values are kept (memory for speed: each is converted once) unless the cyclic
        # collector would track them, i.e. lists and Quantities, which are rebuilt on each read:
        # keeping one per sample while reading a long scrollback sets off collector passes
        # over every sample, which cost more than the conversions they save. The dict is made
        # here, not on first read, for the same reason: parse_pane pauses the collector.
        self._values: dict[str, object] = {}

    @classmethod
    def _of_match(cls, groups: Mapping[str, int], match: re.Match[str]) -> Fields:
        fields = cls.__new__(cls)
        fields._raw, fields._match, fields._values = groups, match, {}
        return fields

    def __reduce__(self) -> tuple[type[Fields], tuple[dict[str, str | None]]]:
        return Fields, ({key: self.raw(key) for key in self._raw},)  # a match can't be pickled

    def __getitem__(self, key: str) -> object:
        value = self.get(key, _ABSENT)
        if value is _ABSENT:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __contains__(self, key: object) -> bool:
        return key in self._raw

    def get(self, key: str, default: object = None) -> object:
        value = self._values.get(key, _ABSENT)
        if value is not _ABSENT:
            return value
        if key not in self._raw:
            return default
        text = self._raw[key]
        if self._match is not None:
            text = self._match[text]
        value = _convert(key, text)
        if not gc.is_tracked(value):
            self._values[key] = value
        return value

    def raw(self, key: str) -> str | None:
        """The field's text as printed (None when absent or cut off)."""
        text = self._raw.get(key)
        return text if self._match is None or text is None else self._match[text]

    def __repr__(self) -> str:
        return f"Fields({dict(self)!r})"


@dataclass(frozen=True, slots=True)
class Reading:
    """How a kind of status line was read; one instance is shared by all its samples."""

    format: str = "dflash"
    unit: str = "tok/s"  # what `Sample.throughput` counts: tok/s, samples/s or it/s
    watch: tuple[str, ...] = ()  # other numeric fields the format names (must stay finite)
    progress: bool = False  # a progress bar: redrawn in place, so its line changes every poll


DFLASH = Reading()


@dataclass(frozen=True, slots=True)
class Sample:
    """One status line."""

    index: int  # order in the capture (0-based, among status lines)
    elapsed_min: float | None  # from the `[Nm]` prefix (or the format's elapsed field)
    fields: Mapping[str, object]
    raw: str  # the logical line (wrapped rows joined, ANSI removed)

    @property
    def reading(self) -> Reading:
        """How the line was read: DFlash here, the format's for a `ReadSample`."""
        return DFLASH

    def number(self, key: str) -> float | None:
        """The field as a float; None when missing, unknown (`---`) or not numeric."""
        value = self.fields.get(key)
        return value if type(value) is float else _as_number(value)

    def numbers(self, key: str) -> list[float] | None:
        """A list field as floats; None when missing, unknown, cut off or not all numbers."""
        fields = self.fields
        if type(fields) is Fields:
            text = fields.raw(key)
            if text is not None and _INT_LIST_RE.fullmatch(text):  # the ints' floats, sooner
                return list(map(float, text[1:-1].split(",")))
        value = fields.get(key)
        if type(value) is not tuple or not _NUMERIC.issuperset(map(type, value)):
            return None
        return list(map(float, value))

    def queue(self, key: str) -> tuple[str, list[float]] | None:
        """A queue field as the queue check reads it: ("buckets", depths) for a list,
        ("depth", [n]) for a number, ("fill", [share]) for `n/total`; None when missing,
        unknown or not numeric."""
        listed = self.numbers(key)
        if listed is not None:
            return "buckets", listed
        value = self.fields.get(key)
        if isinstance(value, Share):
            fill = value.fill
            return None if fill is None or not math.isfinite(fill) else ("fill", [fill])
        number = _as_number(value)
        return None if number is None else ("depth", [number])

    @property
    def step(self) -> int | None:
        value = self.fields.get("step")
        if type(value) is int and -_EXACT_INT <= value <= _EXACT_INT:
            return value  # what int(float(value)) gives, without the round trip
        value = _as_number(value)
        if value is None or not math.isfinite(value):
            return None
        return int(value)

    @property
    def loss(self) -> float | None:
        return self.number("loss")

    @property
    def throughput(self) -> float | None:
        """Tokens per second, from `(12.3Ktok/s)`."""
        return self.number("throughput")

    @property
    def throughput_unit(self) -> str:
        return self.reading.unit

    def watched(self) -> dict[str, float | None]:
        """The other numeric fields the format names (e.g. a gradient norm), as floats."""
        return {name: self.number(name) for name in self.reading.watch}

    @property
    def eta_seconds(self) -> float | None:
        for key in ("ETA", "eta"):
            value = self.fields.get(key)
            if isinstance(value, Quantity):
                return value.value if value.unit == "s" else None
            if value is not None:
                return _as_number(value)
        return None


@dataclass(frozen=True, slots=True)
class ReadSample(Sample):
    """A status line read by a `launcher.verify.formats` reader, which says how it was read.

    A subclass rather than a field of every Sample: the DFlash path makes one Sample per line
    of a long scrollback, and each field costs its construction time.
    """

    reading: Reading


_NUMERIC = frozenset((int, float))
_EXACT_INT = 2**53  # ints up to this size survive a float round trip unchanged
_ABSENT = object()


def _as_number(value: object) -> float | None:
    if type(value) is int or type(value) is float:
        return float(value)
    if isinstance(value, Quantity | Share):
        return value.value
    return None


NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# One fullmatch classifies a scalar; the group that matched says what it is.
_SCALAR_RE = re.compile(
    r"(?P<int>[-+]?\d+)"
    rf"|(?P<float>{NUMBER}|[-+]?(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?))"
    r"|(?P<unknown>-{2,}|\?+|n/a|N/A)"
    r"|(?P<duration>(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+)"
    rf"|(?P<qn>{NUMBER})(?P<qu>[A-Za-z%µ]+(?:/[A-Za-z]+)?)"
    r"|(?:(?P<hh>\d+):)?(?P<mm>\d{1,2}):(?P<ss>\d{2})(?:\.\d+)?"
    r"|(?P<sn>\d+(?:\.\d+)?)/(?P<st>\d+(?:\.\d+)?)"
)
# A list of integers float() reads as float(int()) does (exactly, and no overflow). Spaces and
# tabs only: `\s` would also take control characters float() refuses.
# Neighbouring classes are disjoint, so the greedy quantifiers never give back a different match.
_INT_LIST_RE = re.compile(r"\[[ \t]*[-+]?\d{1,300}[ \t]*(?:,[ \t]*[-+]?\d{1,300}[ \t]*)*\]")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_TOK_RATE_RE = re.compile(r"([kKMG]?)tok/s")
_RATE_TEXT_RE = re.compile(
    rf"\s*(?P<n>{NUMBER})\s*(?P<m>[kKMG]?)\s*(?:tok/s|tokens/s|t/s|it/s|samples/s|/s)?\s*"
)
_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_CUT = object()  # marks a value that was cut off mid-way (list element, `...`)


def parse_rate(text: str) -> float:
    """A throughput in tokens/second: "12.3Ktok/s" -> 12300.0, "5K" -> 5000.0, "900" -> 900.0."""
    m = _RATE_TEXT_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a rate: {text!r} (expected e.g. 5Ktok/s, 1.2Mtok/s, 900tok/s)")
    return float(m["n"]) * _SCALE[m["m"]]


def _tok_rate(raw: str) -> object:
    number = raw[:-5]  # drop "tok/s"
    scale = _SCALE.get(number[-1:])
    try:
        return float(number[:-1]) * scale if scale is not None else float(number)
    except ValueError:
        return classify(raw)


def _scalar(v: str) -> object:
    if not v:
        return None
    if v[-1].isdigit() and v.isascii() and "_" not in v:  # fast path: plain numbers
        try:
            return int(v) if v.lstrip("+-").isdigit() and len(v) < 4000 else float(v)
        except ValueError:  # "12:30", "1.2.3", "--5": the grammar below decides
            pass
    if v.endswith(("...", "…")):
        return _CUT
    m = _SCALAR_RE.fullmatch(v)
    if m is None:
        return v
    kind = m.lastgroup
    if kind == "int":
        try:
            return int(v)
        except ValueError:  # beyond int()'s digit limit
            return float(v)
    if kind == "float":
        return float(v)
    if kind == "unknown":
        return None
    if kind == "duration":
        return Quantity(sum(float(n) * _SECONDS[u] for n, u in _DURATION_PART_RE.findall(v)), "s")
    if kind == "ss":
        return Quantity(int(m["hh"] or 0) * 3600.0 + int(m["mm"]) * 60.0 + int(m["ss"]), "s")
    if kind == "st":
        return Share(float(m["sn"]), float(m["st"]))
    unit = m["qu"]
    tok = _TOK_RATE_RE.fullmatch(unit)
    if tok is not None:
        return Quantity(float(m["qn"]) * _SCALE[tok[1]], "tok/s")
    return Quantity(float(m["qn"]), unit)


def _convert(key: str, raw: str | None) -> object:
    if raw is None:
        return None
    if raw[-1:].isdigit() and raw.isascii() and "_" not in raw:  # _scalar's, two calls sooner
        try:
            return int(raw) if raw.lstrip("+-").isdigit() and len(raw) < 4000 else float(raw)
        except ValueError:
            pass
    if key == "throughput" and raw.endswith("tok/s"):
        return _tok_rate(raw)  # the `(12.3Ktok/s)` figure: a plain tok/s float
    return classify(raw)


def classify(v: str) -> object:
    first = v[:1]
    if first == "[":
        if not v.endswith("]"):
            return None  # cut off: never a shorter list
        inner = v[1:-1]
        if not inner.strip():
            return ()
        parts = inner.split(",")
        try:
            return tuple(map(int, parts))  # the common case: queue depths
        except ValueError:
            pass
        items = tuple(_scalar(part.strip()) for part in parts)
        return None if _CUT in items else items
    if first == '"':
        return v[1:-1] if len(v) > 1 and v.endswith('"') else None
    value = _scalar(v)
    return None if value is _CUT else value


class LinesReader(Protocol):
    """Reads a format's status lines out of a capture's logical lines (`cut`: the last one ran
    to the pane's edge as the capture ended)."""

    def read(self, lines: list[str], cut: bool, memo: RowMemo | None = None) -> list[Sample]: ...


class SampleReader(Protocol):
    """What says how a run's status lines are read: the playbook's `status:` section
    (`launcher.verify.formats.StatusSpec`); None from `reader()` means DFlash lines."""

    def reader(self) -> LinesReader | None: ...


_MISS = object()


class RowMemo:
    """What the previous poll's rows parsed to, by their text: a poll parses only rows that
    were not in the previous capture (a capture repeats most of the one before it).

    Reading a line is a function of its text alone (its index among the status lines is set
    afresh), so a remembered line reads as it would again. Only the latest capture's lines are
    kept: memory stays one capture's worth. `parsed`: lines the latest capture parsed.
    """

    def __init__(self) -> None:
        self._previous: dict[str, object] = {}
        self._current: dict[str, object] = {}
        self.parsed = 0

    def begin(self) -> None:
        """A new capture: what the last one read is what this one may reuse."""
        self._previous, self._current = self._current, {}
        self.parsed = 0

    def get(self, line: str) -> object:
        """What `line` read to, or `MISS`."""
        found = self._current.get(line, _MISS)
        if found is _MISS:
            found = self._previous.get(line, _MISS)
            if found is not _MISS:
                self._current[line] = found
        return found

    def put(self, line: str, value: object) -> None:
        self._current[line] = value
        self.parsed += 1


MISS = _MISS

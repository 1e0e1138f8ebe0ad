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
`parse_pane`'s `spec`;
the line handling here (ANSI, `\r` redraws, logging prefixes, wrapped rows) serves them all.
"""

from __future__ import annotations

import gc
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.verify.formats import StatusSpec

__all__ = [
    "DFLASH",
    "Fields",
    "Quantity",
    "ReadSample",
    "Reading",
    "Sample",
    "clean_text",
    "logical_lines",
    "message_start",
    "parse_line",
    "parse_pane",
    "parse_rate",
]


@dataclass(frozen=True, slots=True)
class Quantity:
    """A number with a unit, e.g. `0.30b/s`; durations are stored as seconds with unit "s"."""

    value: float
    unit: str


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
    if isinstance(value, Quantity):
        return value.value
    return None


# --- lexical pieces ------------------------------------------------------------------------

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ANSI_RE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (titles, hyperlinks)
    r"|[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS / SOS / PM / APC strings
    r"|[ -/]*[0-~])?"  # two-byte escapes; a lone ESC is dropped too
    r"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"  # other control characters
)
_PREFIX_RE = re.compile(r"\s*\[(\d+(?:\.\d+)?)m\]")
# One findall per line yields (key, value) pairs: a key=value / key~value field, or
# ("", "12.3Ktok/s") for the parenthesised throughput. A key must start a token (after
# whitespace, `|` or line start) so `--lr=0.1` or `f(a=1` are not fields. A list runs to `]`
# or, when cut off, to the end of the line.
_KEY = r"[A-Za-z_][\w.\-/]*+"
_VALUE = r"\[[^\]]*+\]?|\"[^\"]*+\"?|[^\s|]*+"
_RATE = rf"{_NUM}\s*[kKMG]?tok/s"
_TOKEN_RE = re.compile(
    rf"(?:(?<![^\s|])({_KEY})[=~]|\(\s*)"
    rf"((?(1)(?:{_VALUE})|{_RATE}))"
    r"(?(1)|\s*\))"
)
# A line's shape (see `_Shapes`): each field as _TOKEN_RE takes it, possessively so a match can't
# take anything else, with only whitespace and `|` around the fields.
_SHAPE_KEY_VALUE = {"[": r"(\[[^\]]*+\]?+)", '"': r'("[^"]*+"?+)'}
_SHAPE_BARE_VALUE = r"((?![\[\"])[^\s|]*+)"  # neither a list nor a string, as _TOKEN_RE decides
_UNSPACED_RATE = rf"\(({_NUM}[kKMG]?tok/s)\)"  # needs no .replace(" ", "")
_UNSPACED_RATE_RE = re.compile(_UNSPACED_RATE)
_SHAPE_RATE = rf"[\s|]*+(?>{_UNSPACED_RATE})"
_GAP_RE = re.compile(r"[\s|]*")
_SHAPE_TRIES = 16  # lines per pane to learn a shape from
# One fullmatch classifies a scalar; the group that matched says what it is.
_SCALAR_RE = re.compile(
    r"(?P<int>[-+]?\d+)"
    rf"|(?P<float>{_NUM}|[-+]?(?:[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?))"
    r"|(?P<unknown>-{2,}|\?+|n/a|N/A)"
    r"|(?P<duration>(?:\d+(?:\.\d+)?(?:ms|d|h|m|s))+)"
    rf"|(?P<qn>{_NUM})(?P<qu>[A-Za-z%µ]+(?:/[A-Za-z]+)?)"
    r"|(?:(?P<hh>\d+):)?(?P<mm>\d{1,2}):(?P<ss>\d{2})(?:\.\d+)?"
)
# A list of integers float() reads as float(int()) does (exactly, and no overflow). Spaces and
# tabs only: `\s` would also take control characters float() refuses.
_INT_LIST_RE = re.compile(r"\[[ \t]*+[-+]?\d{1,300}+[ \t]*+(?:,[ \t]*+[-+]?\d{1,300}+[ \t]*+)*+\]")
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_TOK_RATE_RE = re.compile(r"([kKMG]?)tok/s")
_RATE_TEXT_RE = re.compile(
    rf"\s*(?P<n>{_NUM})\s*(?P<m>[kKMG]?)\s*(?:tok/s|tokens/s|t/s|it/s|samples/s|/s)?\s*"
)
# Where a continuation row may start after a wrap that fell on a (trimmed) space.
_FIELD_START_RE = re.compile(r"[A-Za-z_][\w.\-/]*[=~]|\||\(")

_SCALE = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_INFER_ROWS = 4000
_MIN_INFERRED_WIDTH = 40

# What launchers and loggers put before a message, one piece per match: torchrun's `[rank3]:` /
# `[default3]:`, a tag (`[titan]`, `[INFO]`), timestamps (ISO, bracketed, `%m/%d/%Y`, time
# only), glog / absl (`I0501 12:00:00.123456 12345 file.py:42]`) and levels (`INFO:root:`,
# `INFO - `, `INFO     | `); each may be followed by a ` - `, ` | ` or `: ` separator.
_LOG_PREFIX_RE = re.compile(
    r"[ \t]*(?:"
    r"\[(?:rank|default)?\d+\]:?"
    r"|\[\d{4}-\d\d-\d\d[^\]\n]{0,40}\]"
    r"|\[[A-Za-z][\w.\-]{0,30}\]"
    r"|\d{4}[-/]\d\d[-/]\d\d(?:[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?)?(?=[ \t\]|])"
    r"|\d\d/\d\d/\d{4} \d\d:\d\d:\d\d(?:[.,]\d+)?"
    r"|\d\d:\d\d:\d\d(?:[.,]\d+)?(?=[ \t])"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\s\]]+:\d+\]"
    r"|(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)(?::[\w.]*:|(?=[ \t\-|:]))"
    r")(?:[ \t]*[-|:](?=[ \t]))?[ \t]*"
)
# After a timestamp or level: the logger's name (`root - `, `__main__:main:42 - `).
_LOGGER_NAME_RE = re.compile(r"[\w.<>]+(?::[\w.<>]+)*[ \t]+-[ \t]+")
# Rows that begin a line of their own, so a row above them never continues into them: `[Nm]`,
# logging prefixes, a tag, a progress bar, a dict or JSON object, tmux's and Python's markers.
# (Not every prefix above: a wrapped row may well start with `[8, 7]` or `12:00`.)
_NEW_LINE_RE = re.compile(
    r"\s*(?:\[\d+(?:\.\d+)?m\]"
    r"|\[(?:rank|default)\d+\]:"
    r"|\[?\d{4}[-/]\d\d[-/]\d\d[T ]\d\d:\d\d"
    r"|\d\d/\d\d/\d{4} \d\d:\d\d"
    r"|\d\d:\d\d:\d\d(?:[.,]\d+)? "
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ "
    r"|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)(?::|[ \t]+[-|][ \t])"
    r"|\[[A-Za-z][\w.\-]{0,30}\]"
    r"|\d{1,3}%\|"
    r"|\{['\"]"
    r")"
    r"|Pane is dead|Traceback \("
)
# A row's first token with digit runs as 0: two rows that start alike start two lines alike.
_HEAD_RE = re.compile(r"\s*(\S{1,24})")
_DIGITS_RE = re.compile(r"\d+")
# Erase to the end of the line: what a redraw leaves of the text it overwrote.
_ERASE_LINE_RE = re.compile(r"\x1b\[[02]?K")

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
        return _classify(raw)


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
    return _classify(raw)


def _classify(v: str) -> object:
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


# --- lines ---------------------------------------------------------------------------------


def clean_text(text: str) -> str:
    """Remove ANSI escape sequences (and stray control characters), and resolve `\\r` redraws."""
    if "\r" in text:
        text = "\n".join(
            _last_overwrite(line) if "\r" in line else line for line in text.split("\n")
        )
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    return text


def _last_overwrite(line: str) -> str:
    # A carriage return goes back to column 0 and the text after it overwrites what was there,
    # leaving the tail of a longer earlier text (unless an erase-line cleared it): what a
    # terminal shows. tqdm pads its redraws, so the bar shown is the last one drawn.
    screen = ""
    for part in line.split("\r"):
        if not part:
            continue
        erase = "\x1b" in part and _ERASE_LINE_RE.search(part) is not None
        shown = _ANSI_RE.sub("", part) if "\x1b" in part else part
        screen = shown if erase else shown + screen[len(shown) :]
    return screen


def message_start(line: str) -> int:
    """Where the message starts, after the prefixes launchers and loggers add (0: none).

    `[rank0]:[titan] 2024-05-01 12:00:00,123 - root - INFO - step: 5` -> the index of `step`.
    """
    pos = 0
    while True:
        m = _LOG_PREFIX_RE.match(line, pos)
        if (m is None or m.end() == pos) and pos:
            m = _LOGGER_NAME_RE.match(line, pos)  # only after something else was stripped
        if m is None or m.end() == pos:
            return pos
        pos = m.end()


def _display_width(line: str) -> int:
    if line.isascii():
        return len(line)
    width = 0
    for ch in line:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _head(row: str) -> str:
    m = _HEAD_RE.match(row)
    return _DIGITS_RE.sub("0", m[1]) if m else ""


def _continues(lines: list[str], i: int, first: int) -> bool:
    """Whether row i+1 can carry on the line that began at row `first` (row i being full).

    Not when it is blank, starts a line of its own (`_NEW_LINE_RE`), or starts the way that
    line started: two rows that begin alike are two lines of the same kind.
    """
    nxt = lines[i + 1]
    return not (not nxt or nxt.isspace() or _NEW_LINE_RE.match(nxt) or _alike(nxt, lines[first]))


def _first_char(row: str) -> str:
    char = row[:1]
    return row.lstrip()[:1] if char == " " or char == "\t" else char


def _alike(row: str, other: str) -> bool:
    a, b = _first_char(row), _first_char(other)
    if a != b and not (a.isdigit() and b.isdigit()):
        return False  # they differ at their first character: no need to compare heads
    return _head(row) == _head(other)


def _unclosed(text: str) -> bool:
    return (
        text.count("[") > text.count("]")
        or text.count("{") > text.count("}")
        or text.count("(") > text.count(")")
    )


def _infer_width(lines: list[str], widths: list[int]) -> int | None:
    # A capture taken without -J has no row wider than the pane, and the rows wrapped at its
    # edge are exactly that wide: the width is the widest row, when at least two rows of that
    # width carry on into the next row. A -J capture whose longest lines tie in length is not
    # taken for a wrapped one: the rows after them start lines of their own (by a prefix, or
    # by starting as those lines did). The width is the same for the whole capture, so the
    # last rows are enough evidence (and keep a huge scrollback cheap).
    lo = max(0, len(lines) - _INFER_ROWS)
    top = max(widths[lo:], default=0)
    if top < _MIN_INFERRED_WIDTH:
        return None
    count = 0
    first = lo
    for i in range(lo, len(lines) - 1):
        if widths[i] != top:
            continue
        if i == lo or widths[i - 1] != top:
            first = i  # a run of full rows: one line, begun at its first row
        if _continues(lines, i, first):
            count += 1
            if count >= 2:
                return top
    return None


def _split(text: str, width: int | None) -> tuple[list[str], bool]:
    """Logical lines, and whether the last one is cut off (it ran to the pane's edge)."""
    text = clean_text(text)
    lines = text.split("\n")
    # Trailing spaces do not count: a -J capture keeps them (tqdm pads its rows), tmux trims
    # them from rows captured without -J.
    if text.isascii():
        widths = list(map(len, map(str.rstrip, lines)))
    else:
        widths = [_display_width(line.rstrip()) for line in lines]
    if width is None:
        width = _infer_width(lines, widths)
    if width is None or width <= 1:
        return lines, False
    n = len(lines)
    # Only rows as wide as the pane (or one less: a trailing space trimmed) can continue.
    candidates = [i for i, w in enumerate(widths) if w == width or w == width - 1]
    joins: dict[int, str] = {}  # row -> separator to put between it and the next row
    last = n - 1
    while last >= 0 and not lines[last].strip():
        last -= 1
    cut = False
    new_line = _NEW_LINE_RE.match
    first, first_char, last_joined = 0, "", -2
    for i in candidates:
        if last_joined != i - 1:  # row i starts a line (else it carries on the one at `first`)
            first, first_char = i, lines[i][:1]
        nxt = lines[i + 1] if i + 1 < n else ""
        char = nxt[:1]
        # (_continues, inlined: this loop runs for every full row of a long scrollback; the
        # heads are compared only when the first characters do not already tell them apart)
        if (
            not nxt
            or nxt.isspace()
            or new_line(nxt)
            or (
                (char == first_char or char in " \t" or (char.isdigit() and first_char.isdigit()))
                and _alike(nxt, lines[first])
            )
        ):
            # The capture ends at the pane's edge: the last value is partial.
            cut = cut or (i == last and widths[i] == width)
            continue
        if widths[i] == width:
            joins[i] = ""
            last_joined = i
            continue
        # A wrap right after a space (trimmed): only where the line cannot have ended, in a
        # status line begun with `[Nm]` when the next row starts a field, or inside an open
        # `[`, `{` or `(`.
        head = lines[first]
        if (
            _FIELD_START_RE.match(nxt)
            and (_PREFIX_RE.match(head) or _PREFIX_RE.match(head, message_start(head)))
        ) or _unclosed("".join(lines[first : i + 1])):
            joins[i] = " "
            last_joined = i
    if not joins:
        return lines, cut
    out: list[str] = []
    done = 0
    for i in sorted(joins):
        if i < done:
            continue  # already part of a longer run
        out.extend(lines[done:i])
        parts = [lines[i]]
        while i in joins:
            parts.append(joins[i])
            i += 1
            parts.append(lines[i])
        out.append("".join(parts))
        done = i + 1
    out.extend(lines[done:])
    return out, cut


def logical_lines(text: str, *, width: int | None = None) -> list[str]:
    """The pane's lines with ANSI removed and rows wrapped at the pane width joined back."""
    return _split(text, width)[0]


# --- samples -------------------------------------------------------------------------------


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
                parts.append(rf"[\s|]++{re.escape(key)}[=~]{kind}")
                groups[key] = group  # as dict(findall): first place, last value
            elif _UNSPACED_RATE_RE.fullmatch(m[0]):
                parts.append(_SHAPE_RATE)
                rate = group
            else:
                return  # a spaced `( 12.3 Ktok/s )`: left to findall
            start = m.end()
        if tokens and _GAP_RE.fullmatch(line, start):
            parts.append(r"[\s|]*+\Z")
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
    prefix = _PREFIX_RE.match(line)
    if prefix is None:
        start = message_start(line)  # `[rank0]: [3m] step=...`, `INFO:root:step=1 ...`
        if start:
            body = line[start:]  # sliced: a field must start a token of the message itself
            prefix = _PREFIX_RE.match(body)
    if prefix is not None and shapes is not None:
        fields = shapes.fields(body, prefix.end())
    else:
        raw = dict(_TOKEN_RE.findall(body, prefix.end() if prefix else 0))
        if prefix is None and len(raw) - ("" in raw) < 2:  # two key=value fields, at least
            return None
        fields = _fields(raw)
    return Sample(index, float(prefix[1]) if prefix else None, fields, line.strip())


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
    text: str, spec: StatusSpec | None = None, *, width: int | None = None
) -> list[Sample]:
    """All status lines in a captured pane, in order.

    `spec` is the playbook's `status:` section (None: DFlash-style lines). `width` is the pane
    width when the capture was taken without `-J`: a row of exactly that width may continue on
    the next row. Without it the width is inferred from the rows themselves. A row never
    continues into one that starts a line of its own (`[Nm]`, a logging prefix, tmux's
    `Pane is dead`, ...) or starts the way the line it would continue started.
    """
    lines, cut = _split(text, width)
    reader = spec.reader() if spec is not None else None
    if reader is not None:
        return reader.read(lines, cut)
    samples: list[Sample] = []
    # The objects made here hold no reference cycles, so pausing the cyclic collector only saves
    # it rescanning them: about a third of the time on a long scrollback.
    collecting = gc.isenabled()
    gc.disable()
    shapes = _Shapes()
    try:
        for line in lines:
            sample = _parse(line, len(samples), shapes)
            if sample is not None:
                samples.append(sample)
    finally:
        if collecting:
            gc.enable()
    if cut and samples and samples[-1].raw == _last_nonblank(lines):
        samples[-1] = _drop_cut_field(samples[-1])
    return samples


def _last_nonblank(lines: list[str]) -> str:
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""

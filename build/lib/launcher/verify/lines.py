"""Captured pane text as logical lines: ANSI removed, `\r` redraws resolved, rows wrapped at
the pane's width joined back, the prefixes launchers and loggers add found. A leaf that every
format's reader uses; pure.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = [
    "MINUTE_PREFIX_RE",
    "clean_text",
    "last_nonblank",
    "logical_lines",
    "message_start",
    "split_rows",
]


_ANSI_RE = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]"  # CSI (colours, cursor moves)
    r"|\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC (titles, hyperlinks)
    r"|[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS / SOS / PM / APC strings
    r"|[ -/]*[0-~])?"  # two-byte escapes; a lone ESC is dropped too
    r"|[\x00-\x08\x0b\x0c\x0e-\x1a\x1c-\x1f\x7f]"  # other control characters
)
MINUTE_PREFIX_RE = re.compile(r"\s*\[(\d+(?:\.\d+)?)m\]")
# Where a continuation row may start after a wrap that fell on a (trimmed) space.
_FIELD_START_RE = re.compile(r"[A-Za-z_][\w.\-/]*[=~]|\||\(")
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


def split_rows(text: str, width: int | None) -> tuple[list[str], bool]:
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
            and (MINUTE_PREFIX_RE.match(head) or MINUTE_PREFIX_RE.match(head, message_start(head)))
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
    return split_rows(text, width)[0]


def last_nonblank(lines: list[str]) -> str:
    for line in reversed(lines):
        if line.strip():
            return line.strip()
    return ""

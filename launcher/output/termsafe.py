"""Text that came from a container, made safe to print on a terminal.

A trainer (or anything in its container) can print escape sequences that a terminal obeys: OSC 0
sets the window title, OSC 52 writes the clipboard, CSI 6n makes the terminal type an answer into
the shell, DCS talks to the terminal or to tmux. `sanitize` keeps plain text, tabs, newlines and,
if asked, SGR colours (CSI ... m), and drops everything else a terminal would act on:

- C0 controls other than \\t and \\n (BEL, backspace, ...), DEL and C1 controls (U+0080..U+009F);
- every escape sequence: CSI (ESC [ or U+009B), OSC (ESC ] or U+009D, up to BEL or ST), DCS, SOS,
  PM and APC (up to ST), and two-character ESC sequences (with any intermediate bytes);
- a bare \\r: each line is shown as a terminal would leave it after its carriage returns (later
  text written over earlier text), so a line cannot hide part of itself.

Deliberate difference from a terminal: an unterminated string sequence (OSC, DCS, ...) also ends
at a newline, so a broken one can hide at most the rest of its line, not the rest of the log.

`Sanitizer` does the same on a stream that arrives in pieces (`logs -f`): a sequence cut at the
end of one piece is remembered and finished in the next. Everything runs in linear time.
"""

from __future__ import annotations

import re

ESC = "\x1b"
BEL = "\x07"
CAN = "\x18"
SUB = "\x1a"
ST_8BIT = "\x9c"
CSI_8BIT = "\x9b"
# ESC X or its 8-bit form opens a string that runs to ST: OSC, DCS, SOS, PM, APC.
STRING_OPENERS = frozenset("]PX^_")
STRING_OPENERS_8BIT = frozenset("\x9d\x90\x98\x9e\x9f")
# A longer CSI is no SGR anyone writes: it is dropped whole without being stored.
MAX_CSI = 256

# Where a sequence may start; the text between two of them only loses its controls.
_STRUCTURAL = re.compile(r"[\x1b\x90\x98\x9b\x9d\x9e\x9f]")
# Text without any of these needs no work at all (newlines and tabs are fine).
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Inside a string sequence only these end it (or may end it).
_STRING_END = re.compile(r"[\x07\x0a\x18\x1a\x1b\x9c]")
# A CSI's parameter and intermediate bytes; then one final byte 0x40-0x7E.
_CSI_BODY = re.compile(r"[\x20-\x3f]*")
_SGR_PARAMS = re.compile(r"[0-9;:]*")
# A complete sequence in one piece, the common case, matched at once: CSI (parameters,
# intermediates, final byte), a terminated string (OSC, DCS, SOS, PM, APC), or a short ESC
# sequence. Anything else goes through the state machine, with the same result.
_COMPLETE = re.compile(
    r"(?:\x1b\[|\x9b)([\x30-\x3f]*)([\x20-\x2f]*)([\x40-\x7e])"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x0a\x18\x1a\x1b\x9c]*"
    r"(?:[\x07\x18\x1a\x9c]|\x1b\\)"
    r"|\x1b(?:[\x20-\x2f]+[\x30-\x7e]|[\x30-\x4f\x51-\x57\x59-\x5a\x5c\x60-\x7e])"
)
_ESC_RUN = re.compile(r"\x1b*")


def _drop_table(keep_cr: bool) -> dict[int, None]:
    """str.translate table: every C0 control but \\t and \\n (and \\r if kept), DEL, C1."""
    keep = {0x09, 0x0A} | ({0x0D} if keep_cr else set())
    codes = [*range(0x20), *range(0x7F, 0xA0)]
    return {code: None for code in codes if code not in keep}


_DROP = {keep_cr: _drop_table(keep_cr) for keep_cr in (False, True)}

_GROUND, _ESCAPE, _ESC_INTERMEDIATE, _CSI, _STRING, _STRING_ESC = range(6)


class Sanitizer:
    """Incremental `sanitize` for a stream of text: feed() pieces, flush() at the end.

    With keep_cr, carriage returns are passed through (for a line splitter that resolves them
    with `resolve_cr`); otherwise they are dropped like any other control.
    """

    def __init__(self, *, keep_sgr: bool = True, keep_cr: bool = False) -> None:
        self.keep_sgr = keep_sgr
        self._drop = _DROP[keep_cr]
        self._state = _GROUND
        self._csi: list[str] = []  # the parameters and intermediates of the CSI being read
        self._csi_length = 0

    def feed(self, text: str) -> str:
        out: list[str] = []
        i, n = 0, len(text)
        while i < n:
            state = self._state
            if state == _GROUND:
                match = _STRUCTURAL.search(text, i)
                stop = match.start() if match else n
                if stop > i:
                    out.append(text[i:stop].translate(self._drop))
                if match is None:
                    break
                whole = _COMPLETE.match(text, stop)
                if whole is None:  # cut short, split across chunks, or unusual: step by step
                    self._open(text[stop])
                    i = stop + 1
                    continue
                params, intermediates, final = whole.group(1, 2, 3)
                if final == "m" and not intermediates and self._keep(params):
                    out.append(f"{ESC}[{params}m")
                i = whole.end()
            elif state == _STRING:
                i = self._string(text, i)
            elif state == _CSI:
                body = _match_end(_CSI_BODY, text, i)
                if body > i:
                    self._csi_length += body - i
                    if self._csi_length <= MAX_CSI:
                        self._csi.append(text[i:body])
                    i = body
                if i < n and self._end_csi(text[i], out):
                    i += 1
            elif self._escape(text[i]):
                i += 1
            elif self._state == _ESCAPE:  # ESC ESC ...: all but the last are dropped
                i = _match_end(_ESC_RUN, text, i) - 1
                self._state = _GROUND
        return "".join(out)

    def flush(self) -> str:
        """The end of the stream: an unfinished sequence is dropped."""
        self._state = _GROUND
        self._csi = []
        self._csi_length = 0
        return ""

    def _open(self, char: str) -> None:
        """A character that starts a sequence, in text (ESC or an 8-bit introducer)."""
        if char == ESC:
            self._state = _ESCAPE
        elif char == CSI_8BIT:
            self._start_csi()
        else:
            self._state = _STRING  # 8-bit OSC, DCS, SOS, PM or APC

    def _start_csi(self) -> None:
        self._state = _CSI
        self._csi = []
        self._csi_length = 0

    def _string(self, text: str, i: int) -> int:
        """Skip string content (OSC, DCS, ...); returns where to go on."""
        match = _STRING_END.search(text, i)
        if match is None:
            return len(text)  # the whole rest is inside the string: dropped
        i = match.start()
        char = text[i]
        if char == ESC:
            self._state = _STRING_ESC
            return i + 1
        self._state = _GROUND
        # The newline itself is shown (see the module doc); BEL, ST, CAN, SUB are dropped.
        return i if char == "\n" else i + 1

    def _end_csi(self, char: str, out: list[str]) -> bool:
        """The byte after a CSI's parameters: its final byte (consumed), or a character that
        cuts it short (not consumed: read again as text, as a terminal does with a newline)."""
        self._state = _GROUND
        params = "".join(self._csi)
        self._csi = []
        if not 0x40 <= ord(char) <= 0x7E:
            return False
        if char == "m" and self._csi_length <= MAX_CSI and self._keep(params):
            out.append(f"{ESC}[{params}m")
        return True

    def _keep(self, params: str) -> bool:
        """Whether CSI `params` m (no intermediates) is kept: SGR, when colours are wanted."""
        return (
            self.keep_sgr and len(params) <= MAX_CSI and _SGR_PARAMS.fullmatch(params) is not None
        )

    def _escape(self, char: str) -> bool:
        """One character after ESC (in text, after its intermediates, or inside a string).

        Returns False when it was not consumed: it cut the sequence short and is read again.
        """
        code = ord(char)
        state = self._state
        if state == _STRING_ESC:
            if char == "\\":
                self._state = _GROUND  # ST
                return True
            self._state = _ESCAPE  # the ESC ended the string and starts a new sequence
            state = _ESCAPE
        if state == _ESCAPE:
            if char == "[":
                self._start_csi()
            elif char in STRING_OPENERS:
                self._state = _STRING
            elif char == ESC:
                return False  # ESC ESC: the first is dropped (feed skips the run)
            elif 0x20 <= code <= 0x2F:
                self._state = _ESC_INTERMEDIATE
            elif 0x30 <= code <= 0x7E:
                self._state = _GROUND  # a complete two-character sequence, dropped
            else:
                self._state = _GROUND
                return False
            return True
        # After intermediates: more of them, or the final byte 0x30-0x7E.
        if 0x20 <= code <= 0x2F:
            return True
        self._state = _GROUND
        return 0x30 <= code <= 0x7E


def _match_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    match = pattern.match(text, start)
    return match.end() if match else start


def resolve_cr(line: str) -> str:
    """A line as a terminal leaves it after its carriage returns: later text over earlier.

    `50%\\r100%` shows `100%`, `safe rm -rf /\\rsafe` shows `safe rm -rf /` (nothing hidden).
    One cell per character; a CR at the end (CRLF line endings) changes nothing. Colours cannot
    be placed cell by cell, so a line that rewrites itself loses them.
    """
    line = line.rstrip("\r")
    if "\r" not in line:
        return line
    if ESC in line or CSI_8BIT in line:
        line = Sanitizer(keep_sgr=False, keep_cr=True).feed(line)
    cells: list[str] = []
    for segment in line.split("\r"):
        cells[: len(segment)] = segment
    return "".join(cells)


def sanitize(text: str, keep_sgr: bool = True) -> str:
    """`text` without anything a terminal would act on (see the module doc)."""
    if not _UNSAFE.search(text):
        return text
    sanitizer = Sanitizer(keep_sgr=keep_sgr, keep_cr=True)
    clean = sanitizer.feed(text) + sanitizer.flush()
    if "\r" not in clean:
        return clean
    return "\n".join(resolve_cr(line) for line in clean.split("\n"))

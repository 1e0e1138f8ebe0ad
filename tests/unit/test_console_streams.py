"""stderr whose reader is gone (launcher/entry/console.py, TolerantStream): lines dropped, no
error."""

from __future__ import annotations

import io

from launcher.entry.console import TolerantStream


class GoneAfter(io.StringIO):
    """A stream whose reader leaves after `n` writes (as a pipe into `head -1`)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    def write(self, text: str) -> int:
        if self.left <= 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.left -= 1
        return super().write(text)


def test_a_write_after_the_reader_left_is_dropped_and_so_is_the_rest() -> None:
    inner = GoneAfter(1)
    stream = TolerantStream(inner)
    assert stream.write("first\n") == 6
    assert stream.write("second\n") == 7  # dropped, not raised
    inner.left = 5  # a reader that came back is not written to again: the lines are gone
    stream.write("third\n")
    stream.flush()
    assert inner.getvalue() == "first\n"


def test_everything_else_is_the_streams_own() -> None:
    inner = io.StringIO()
    assert TolerantStream(inner).isatty() is False
    assert TolerantStream(inner).getvalue() == ""

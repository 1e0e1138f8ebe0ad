"""Verdict and check words in colour on a terminal; never with NO_COLOR, TERM=dumb or no TTY."""

from __future__ import annotations

import io

import pytest

from launcher.output.ui import coloured_verdicts

REPORT = (
    "prod: UNHEALTHY (exit 1) — throughput below its own level\n"
    "  latest: step 10 · loss 2 · FAIL in a sample's text stays as it is\n"
    "  PASS  alive       session running  (expected session running)\n"
    "  FAIL  throughput  0.5 Ktok/s  (expected no sustained drop)\n"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def colour_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    return monkeypatch


def test_on_a_terminal_the_words_are_coloured(colour_env: pytest.MonkeyPatch) -> None:
    shown = coloured_verdicts(REPORT, Terminal())
    assert shown.splitlines()[0] == (
        "prod: \x1b[1;31mUNHEALTHY\x1b[0m (exit 1) — throughput below its own level"
    )
    assert "  \x1b[32mPASS\x1b[0m  alive" in shown and "  \x1b[31mFAIL\x1b[0m  throughput" in shown
    assert "FAIL in a sample's text stays as it is" in shown  # only the words in their place
    healthy = coloured_verdicts("a-b.c: HEALTHY (exit 0) — 3 passing polls", Terminal())
    assert healthy.startswith("a-b.c: \x1b[1;32mHEALTHY\x1b[0m (exit 0)")
    starting = coloured_verdicts("x: STARTING (exit 1) — warming up", Terminal())
    assert "\x1b[1;33mSTARTING" in starting


@pytest.mark.parametrize(
    ("variable", "value", "stream"),
    [("NO_COLOR", "1", Terminal()), ("TERM", "dumb", Terminal()), (None, None, io.StringIO())],
)
def test_no_colour_without_a_terminal_that_wants_it(
    colour_env: pytest.MonkeyPatch, variable: str | None, value: str | None, stream: io.StringIO
) -> None:
    if variable is not None and value is not None:
        colour_env.setenv(variable, value)
    assert coloured_verdicts(REPORT, stream) == REPORT

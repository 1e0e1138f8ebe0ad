"""The terminal sanitiser takes time linear in its input, whatever a hostile run prints. What
it removes: tests/unit/test_termsafe.py."""

from __future__ import annotations

import time

import pytest

from launcher.output.termsafe import Sanitizer, sanitize


@pytest.mark.parametrize(
    "unit",
    [
        "plain text line\n",
        "\x1b[31mred\x1b[0m \x1b]0;t\x07\x1b[6n\x9b1m\r\n",
        "\x1b" * 10,
        "\x1b[" + "1;" * 50,  # an endless CSI
        "\x1b]0;" + "x" * 50,  # an endless OSC
        "a\rb\r" * 10,
    ],
)
def test_huge_inputs_take_linear_time(unit: str) -> None:
    def cost(copies: int) -> float:
        text = unit * copies
        # CPU time of this process: other processes' load on the machine does not count
        started = time.process_time()
        sanitize(text)
        stream = Sanitizer()
        for start in range(0, len(text), 65536):
            stream.feed(text[start : start + 65536])
        return time.process_time() - started

    small = min(cost(5_000) for _ in range(3))
    large = min(cost(40_000) for _ in range(3))  # 8 times the input, up to 4 MB
    assert large < 10.0, f"{large:.2f} s for {len(unit) * 40_000} characters"
    assert large < max(small, 0.01) * 20, f"x8 input took {large / small:.1f}x the time"

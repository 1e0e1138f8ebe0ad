"""Real panes of the demo trainer, captured from tmux in a sandbox container."""

from __future__ import annotations

from pathlib import Path

from launcher.verify.parse import parse_pane

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def status_rows(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("[") and "m] step=" in line)


def test_wrapped_80_column_pane() -> None:
    text = (FIXTURES / "demo_pane_80col_wrapped.txt").read_text()
    samples = parse_pane(text)
    # Every status line starts a row of its own; the wrap splits it over two or three rows.
    assert len(samples) == status_rows(text)
    assert all(len(line) <= 80 for line in text.splitlines())
    steps = [s.step for s in samples]
    assert steps == sorted(steps) and None not in steps
    complete = samples[:-1]  # the newest line may be cut at the bottom of the capture
    assert all(
        s.numbers("q_pre") is not None and len(s.numbers("q_pre") or []) == 6 for s in complete
    )
    assert all(s.throughput is not None for s in complete)
    assert samples[0].loss is None and samples[0].throughput == 0.0
    assert all(s.eta_seconds is not None for s in complete[1:])


def test_joined_wide_pane() -> None:
    text = (FIXTURES / "demo_pane_250col_joined.txt").read_text()
    samples = parse_pane(text)
    assert len(samples) == status_rows(text) > 20
    assert all(len(s.numbers("q_pre") or []) == 6 for s in samples)
    assert all(min(s.numbers("q_pre") or [0]) > 0 for s in samples[-5:])
    assert all((s.throughput or 0) > 20_000 for s in samples[-5:])
    assert [s.step for s in samples] == sorted(s.step or 0 for s in samples)

"""Only new pane rows are parsed per poll: what the previous capture's rows read to is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.verify.formats import StatusSpec
from launcher.verify.parse import parse_pane
from launcher.verify.samples import RowMemo, Sample

PANES = Path(__file__).resolve().parents[1] / "fixtures" / "panes"
SPECS: dict[str, StatusSpec | None] = {
    "colour": None,
    "logging": None,
    "hfdicts": StatusSpec.model_validate({"preset": "hf-trainer"}),
    "hfdictsstuck": StatusSpec.model_validate({"preset": "hf-trainer"}),
    "megatron": StatusSpec.model_validate({"preset": "megatron"}),
    "nanogpt": StatusSpec.model_validate({"preset": "nanogpt"}),
    "torchtitan": StatusSpec.model_validate({"preset": "torchtitan"}),
    "progress": StatusSpec.model_validate({"format": "keyvalue", "progress": True}),
}


def shown(samples: list[Sample]) -> list[tuple[object, ...]]:
    return [(s.index, s.elapsed_min, dict(s.fields), s.raw, s.reading) for s in samples]


def windows(text: str, size: int, step: int) -> list[str]:
    """Successive captures of a pane that scrolls: each repeats most of the one before."""
    rows = text.split("\n")
    return ["\n".join(rows[max(0, end - size) : end]) for end in range(step, len(rows) + 1, step)]


@pytest.mark.parametrize("name", sorted(p.name for p in PANES.glob("*.txt")))
def test_remembered_rows_read_as_a_fresh_parse_does(name: str) -> None:
    spec = SPECS[name.split("_")[0]]
    text = (PANES / name).read_text(encoding="utf-8")
    memo = RowMemo()
    for capture in windows(text, 40, 7):
        assert shown(parse_pane(capture, spec, memo=memo)) == shown(parse_pane(capture, spec))


def test_a_poll_parses_only_the_rows_the_previous_capture_did_not_hold() -> None:
    row = "[{}m] step={} loss=1.{:03d} | (12.{}Ktok/s) | q_hs=[{}]"
    rows = [row.format(i // 60, i, i, i % 10, i) for i in range(3000)]
    memo = RowMemo()
    first = parse_pane("\n".join(rows[:2000]), memo=memo)
    assert memo.parsed == 2000 and len(first) == 2000
    second = parse_pane("\n".join(rows[5:2005]), memo=memo)  # five new rows at the bottom
    assert memo.parsed == 5
    assert [s.step for s in second] == list(range(5, 2005))
    assert [s.index for s in second] == list(range(2000))  # indices are this capture's
    parse_pane("\n".join(rows[5:2005]), memo=memo)  # nothing new: nothing parsed
    assert memo.parsed == 0
    parse_pane("\n".join(rows[1000:3000]), memo=memo)  # scrolled past half the capture
    assert memo.parsed == 995


def test_only_the_previous_capture_is_remembered() -> None:
    memo = RowMemo()
    parse_pane("[0m] step=1 loss=2.0\n", memo=memo)
    parse_pane("[0m] step=2 loss=2.0\n", memo=memo)
    parse_pane("[0m] step=1 loss=2.0\n", memo=memo)  # two captures ago: parsed again
    assert memo.parsed == 1


def test_a_row_cut_at_the_pane_edge_is_read_again_once_complete() -> None:
    memo = RowMemo()
    cut = parse_pane("[0m] step=1 loss=2.0\n[0m] step=2 loss=1.9 q_hs=[4, 5", width=34, memo=memo)
    done = parse_pane("[0m] step=1 loss=2.0\n[0m] step=2 loss=1.9 q_hs=[4, 5]\n", memo=memo)
    assert cut[-1].numbers("q_hs") is None
    assert done[-1].numbers("q_hs") == [4.0, 5.0]

"""The formats' readers as a registry, and the leaves the parser and the readers share."""

from __future__ import annotations

import re
from typing import get_args

from launcher.verify import formats, lines, parse, readers, samples
from launcher.verify.formats import FORMATS, FormatName, StatusSpec


def test_every_format_the_playbook_accepts_has_a_reader() -> None:
    assert set(get_args(FormatName)) == set(readers.READERS) == set(FORMATS)


def test_each_reader_reads_its_own_format_only() -> None:
    lines_by_format = {
        "dflash": "[3m] step=5 loss=2.5 | (1.2Ktok/s)",
        "keyvalue": "step: 5 | loss: 2.5",
        "json": '{"step": 5, "loss": 2.5}',
        "python-dict": "{'step': 5, 'loss': 2.5}",
        "regex": "it 5 l 2.5",
    }
    pattern = re.compile(r"it (?P<step>\d+) l (?P<loss>\S+)")
    for name, read in readers.READERS.items():
        text = lines_by_format[name]
        fields, _ = read(text, text, pattern)
        assert fields and fields["step"] == 5 and fields["loss"] == 2.5, name
    assert readers.read_json("step=5 loss=2.5", "step=5 loss=2.5", None) == (None, None)
    assert readers.read_dflash("[3m] step=5 x=1", "[3m] step=5 x=1", None)[1] == 3.0


def test_a_spec_with_a_format_reads_through_its_reader() -> None:
    spec = StatusSpec.model_validate({"format": "json"})
    found = parse.parse_pane('{"step": 7, "loss": 1.25}\nnoise\n', spec)
    assert [(s.step, s.loss, s.reading.format) for s in found] == [(7, 1.25, "json")]


def test_the_parser_and_the_readers_share_leaves_not_each_other() -> None:
    # parse.py reads DFlash lines and dispatches a spec through its `reader()`; it never
    # imports formats (formats imports it, through readers): no cycle, not even a typed one.
    source = parse.__file__
    assert source is not None
    with open(source, encoding="utf-8") as handle:
        text = handle.read()
    assert "verify.formats" not in text.replace("`launcher.verify.formats`", "")
    assert parse.Sample is samples.Sample and parse.clean_text is lines.clean_text
    assert formats.READERS is readers.READERS


def test_a_count_of_a_total_is_a_share_in_every_format() -> None:
    """`12/16` keeps its total: a number as its count (`iteration 100/1000` is step 100), a
    fill for a queue check (0.75)."""
    assert readers.kv_value("12/16") == samples.Share(12.0, 16.0)
    assert readers.kv_value("100/ 1000") == samples.Share(100.0, 1000.0)
    assert samples.classify("12/16") == samples.Share(12.0, 16.0)  # DFlash's `q_pre=12/16`
    (line,) = parse.parse_pane("[0m] step=3 loss=2.0 q_pre=12/16\n")
    assert line.queue("q_pre") == ("fill", [0.75]) and line.number("q_pre") == 12.0
    assert samples.Share(3.0, 0.0).fill is None  # no capacity: no fill
    assert samples.classify("2025/11/30") == "2025/11/30"  # a date is not a share

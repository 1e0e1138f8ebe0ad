from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.verify.lines import clean_text, logical_lines
from launcher.verify.parse import parse_line, parse_pane
from launcher.verify.samples import DFLASH, Quantity, Sample, parse_rate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


SEED = fixture("seed_capture.txt")


# --- the seed capture (80 columns, no -J, ends mid-list) ------------------------------------


def test_seed_capture_gives_exactly_three_samples() -> None:
    samples = parse_pane(SEED)
    assert [s.index for s in samples] == [0, 1, 2]
    assert [s.elapsed_min for s in samples] == [0.0, 0.0, 1.0]


def test_seed_first_sample_before_training_starts() -> None:
    first = parse_pane(SEED)[0]
    assert first.step == 0
    assert first.loss is None
    assert first.fields["loss"] is None
    assert first.numbers("q_pre") == [4, 4, 3, 3, 2, 2]
    assert first.numbers("q_hs") == [0]
    assert first.throughput == 0.0
    assert first.eta_seconds is None  # ETA=???


def test_seed_second_sample() -> None:
    second = parse_pane(SEED)[1]
    assert second.step == 0
    assert second.loss == pytest.approx(1.3167)
    assert second.throughput == pytest.approx(1900.0)
    assert second.numbers("q_pre") == [8, 6, 6, 5, 4, 4]
    assert second.eta_seconds == pytest.approx(10.9 * 86400)
    assert second.number("lr") == pytest.approx(6.00e-04)
    assert second.fields["tgt"] == Quantity(0.30, "b/s")
    assert second.fields["epoch"] == 0.0  # key~value


def test_seed_third_sample_is_cut_mid_list() -> None:
    third = parse_pane(SEED)[2]
    assert third.step == 2
    assert third.loss == pytest.approx(6.4079)
    assert third.throughput == pytest.approx(12300.0)
    assert third.numbers("q_pre") is None  # `q_pre=[10...`: never a shorter list
    assert "q_pre" in third.fields


def test_seed_with_explicit_width_matches_inferred() -> None:
    assert [s.raw for s in parse_pane(SEED, width=80)] == [s.raw for s in parse_pane(SEED)]


def test_seed_logical_lines_rejoin_the_wrapped_rows() -> None:
    lines = logical_lines(SEED)
    assert lines[3].endswith("epoch~0.00 ETA=???")
    assert "ETA=10.9d" in lines[4]


# --- other panes ------------------------------------------------------------------------------


def test_joined_wide_pane() -> None:
    samples = parse_pane(fixture("joined_wide_pane.txt"))
    assert [s.step for s in samples] == [0, 40, 58, 77, 96]
    assert [s.throughput for s in samples] == pytest.approx([0, 21800, 24600, 27900, 28100])
    assert samples[-1].numbers("q_pre") == [10, 9, 8, 8, 6, 6]
    assert samples[-1].eta_seconds == pytest.approx(4.5 * 86400)


def test_wide_pane_with_equal_length_lines_is_not_taken_for_wrapped() -> None:
    line = "[{}m] step={} loss=1.0000 acc=0.500 lr=6.00e-04 | (20.0Ktok/s) | q_pre=[1, 2] q_hs=[3]"
    text = "\n".join(line.format(i, 10 + i) for i in range(5))  # all rows the same length
    assert [s.step for s in parse_pane(text)] == [10, 11, 12, 13, 14]


def test_ansi_coloured_pane() -> None:
    samples = parse_pane(fixture("ansi_pane.txt"))
    assert [s.step for s in samples] == [12, 30]
    assert samples[0].loss == pytest.approx(2.5)
    assert samples[0].numbers("q_pre") == [0, 4, 3, 3, 2, 2]
    assert samples[0].throughput == pytest.approx(8500)
    assert samples[0].eta_seconds == 6 * 3600
    assert samples[1].eta_seconds == 5400
    assert all("\x1b" not in s.raw for s in samples)


def test_crash_pane_keeps_status_lines_and_ignores_the_rest() -> None:
    samples = parse_pane(fixture("crash_pane.txt"))
    assert [s.step for s in samples] == [99, 118]
    assert [s.throughput for s in samples] == pytest.approx([28200, 28300])
    assert samples[1].numbers("q_pre") == [10, 9, 8, 8, 7, 6]
    lines = logical_lines(fixture("crash_pane.txt"))
    assert "Pane is dead (status 1, Sun Nov 30 22:18:00 2025)" in lines


def test_row_of_exactly_the_width_continues() -> None:
    text = "[0m] step=1 loss=2.0\n000 lr=1e-3\n"
    (sample,) = parse_pane(text, width=20)
    assert sample.loss == 2.0
    assert sample.number("lr") == 0.001


def test_trimmed_space_at_the_wrap_is_restored() -> None:
    # tmux drops the trailing space of a row that wrapped right after it.
    text = "[0m] step=1 loss=2.5 |\nacc=0.5 lr=1e-3\n"
    (sample,) = parse_pane(text, width=23)
    assert sample.raw == "[0m] step=1 loss=2.5 | acc=0.5 lr=1e-3"


def test_row_never_continues_into_a_new_status_line() -> None:
    text = "[0m] step=1 loss=2.000\n[1m] step=2 loss=1.0\n"
    assert [s.step for s in parse_pane(text, width=22)] == [1, 2]


def test_last_row_at_the_edge_drops_the_partial_value() -> None:
    text = "[0m] step=1 loss=2.5 xx=11\n[0m] step=2 loss=2.4 lr=12\n"  # both 26 wide, capture ends
    samples = parse_pane(text, width=26)
    assert samples[0].number("xx") == 11
    assert samples[1].step == 2
    assert samples[1].number("lr") is None  # may have been 12e-5 on the next row


# --- re-joining rows: only where the capture says a row was wrapped ----------------------------
# Real tmux captures (tests/fixtures/panes/make_panes.py): 40 status lines each, at 80 and 250
# columns, taken with -J (as launcher does), without it (rows wrapped at the pane's width) and
# with the colours kept (-e).

PANES = FIXTURES / "panes"
REJOIN_CASES = [
    f"{kind}_{width}col_{variant}.txt"
    for kind in ("logging", "colour")
    for width in (80, 250)
    for variant in ("joined", "wrapped")
] + ["colour_80col_joined-ansi.txt", "colour_250col_joined-ansi.txt"]


@pytest.mark.parametrize("name", REJOIN_CASES)
def test_prefixed_and_coloured_panes_give_every_status_line(name: str) -> None:
    text = (PANES / name).read_text(encoding="utf-8")
    samples = parse_pane(text)
    base = 0 if name.startswith("logging") else 1000
    assert [s.step for s in samples] == [base + 19 * i for i in range(40)]
    assert all(s.numbers("q_pre") is not None for s in samples)
    assert all(s.throughput is not None and s.throughput >= 27_000 for s in samples)
    if name.startswith("logging"):
        assert [s.elapsed_min for s in samples] == [float(i // 10) for i in range(40)]
    # The same lines whatever the capture: one logical line per line the trainer printed.
    reference = parse_pane((PANES / f"{name.split('_')[0]}_250col_joined.txt").read_text())
    assert [s.raw for s in samples] == [s.raw for s in reference]


@pytest.mark.parametrize("name", ["progress_80col_wrapped.txt", "progress_80col_joined.txt"])
def test_progress_bar_pane_lines(name: str) -> None:
    lines = logical_lines((PANES / name).read_text(encoding="utf-8"))
    dicts = [line for line in lines if line.startswith("{'loss'")]
    assert len(dicts) == 40 and all(line.endswith("}") for line in dicts)
    shown = [line for line in lines if line.strip()][-1]
    assert shown.lstrip().startswith("10%|")  # what the terminal shows last on that row


def test_equal_length_lines_of_one_kind_are_never_merged() -> None:
    # A -J capture where every line is the longest one: nothing says any row was wrapped.
    line = "Epoch {} | it {:04d} | loss {:.4f} | lr 6.00e-04 | 12.5Ktok/s | gpu 71.2GB | ok"
    rows = [line.format(1, 100 + i, 2.0 - i / 100) for i in range(10)]
    assert len({len(row) for row in rows}) == 1 and len(rows[0]) >= 40
    assert logical_lines("\n".join(rows)) == rows
    status_rows = [
        f"12:00:{i:02d} INFO step={1000 + i} loss=2.0000 lr=6.00e-04 | (1.0Ktok/s)"
        for i in range(10)
    ]
    assert [s.step for s in parse_pane("\n".join(status_rows))] == list(range(1000, 1010))


def test_a_wrap_after_a_trimmed_space_inside_a_list_is_joined() -> None:
    # tmux trims the space the row ended with; the open `[` says the line goes on.
    row = "[rank0]:[0m] step=1 q_pre=[5, 8,"
    (sample,) = parse_pane(f"{row}\n9] q_hs=[1]\n", width=len(row) + 1)
    assert sample.numbers("q_pre") == [5.0, 8.0, 9.0]
    assert sample.raw == "[rank0]:[0m] step=1 q_pre=[5, 8, 9] q_hs=[1]"


def test_a_row_starting_like_its_line_starts_a_line() -> None:
    rows = ["[rank0]: aaaa bbbb cccc", "[rank0]: dddd eeee ffff"]  # both exactly 23 wide
    assert logical_lines("\n".join(rows), width=23) == rows
    rows = ["loss=1 lr=2 aaaa bbbbbb", "loss=3 lr=4 cccc dddddd"]
    assert logical_lines("\n".join(rows), width=23) == rows


def test_dflash_lines_behind_launcher_and_logger_prefixes() -> None:
    text = "\n".join(
        [
            "[rank0]:[3m] step=5 loss=2.0 | (1.5Ktok/s)",
            "[default1]:2025-11-30 22:10:00,123 - INFO - [4m] step=6 loss=1.9 | (1.6Ktok/s)",
            "I1130 22:10:01.123456 4242 train.py:42] [5m] step=7 loss=1.8 | (1.7Ktok/s)",
            "INFO:root:step=8 loss=1.7",
        ]
    )
    samples = parse_pane(text)
    assert [(s.step, s.elapsed_min) for s in samples] == [(5, 3.0), (6, 4.0), (7, 5.0), (8, None)]
    assert samples[0].raw.startswith("[rank0]:")  # the line as printed


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("abcdef\rxy", "xycdef"),  # a shorter redraw leaves the tail of the longer text
        ("abcdef\rxy\x1b[K", "xy"),  # ... unless it erases to the end of the line
        (" 1%|  | 1/100\r 2%|  | 2/100\r", " 2%|  | 2/100"),
        ("loss=2.0\r\n", "loss=2.0"),  # CRLF
        ("\x1b[32mabc\x1b[0m\rX", "Xbc"),
    ],
)
def test_carriage_return_keeps_what_a_terminal_shows(raw: str, shown: str) -> None:
    assert clean_text(raw).rstrip("\n") == shown


def test_shell_prompt_and_other_output_are_not_status_lines() -> None:
    text = "\n".join(
        [
            "root@ct200:~# python3 train.py --lr=0.1 --bs=4",
            "Loading shards: 100%|██████████| 4/4 [00:03<00:00,  1.2it/s]",
            "Saved checkpoint to /ckpt/step_58.pt",
            "f(a=1, b=2)",
            "",
        ]
    )
    assert parse_pane(text) == []


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("7", 7),
        ("-3", -3),
        ("0.1000", 0.1),
        ("6.00e-04", 6.00e-04),
        ("---", None),
        ("???", None),
        ("", None),
        ("[4, 4, 3]", (4, 4, 3)),
        ("[]", ()),
        ("[0.5, ---]", (0.5, None)),
        ("[10...", None),
        ("[1, 2", None),
        ("0.30b/s", Quantity(0.30, "b/s")),
        ("12.3Ktok/s", Quantity(12300.0, "tok/s")),
        ("45%", Quantity(45.0, "%")),
        ("10.9d", Quantity(10.9 * 86400, "s")),
        ("1h30m", Quantity(5400.0, "s")),
        ("250ms", Quantity(0.25, "s")),
        ("01:02:03", Quantity(3723.0, "s")),
        ("warmup", "warmup"),
        ('"two words"', "two words"),
        ("1.2...", None),
    ],
)
def test_values(raw: str, expected: object) -> None:
    sample = parse_line(f"[0m] x={raw} y=1")
    assert sample is not None
    value = sample.fields["x"]
    if isinstance(expected, Quantity):
        assert isinstance(value, Quantity)
        assert value.unit == expected.unit
        assert value.value == pytest.approx(expected.value)
    else:
        assert value == expected
        assert type(value) is type(expected)


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf"])
def test_non_finite_numbers_come_back_as_floats(raw: str) -> None:
    sample = parse_line(f"[2m] step=5 loss={raw}")
    assert sample is not None
    loss = sample.loss
    assert loss is not None
    assert not math.isfinite(loss)
    assert (loss < 0) == raw.startswith("-")


def test_numbers_needs_every_entry_numeric() -> None:
    sample = parse_line("a=[1, x] b=[1, 2] c=3")
    assert sample is not None
    assert sample.numbers("a") is None
    assert sample.numbers("b") == [1.0, 2.0]
    assert sample.numbers("c") is None
    assert sample.numbers("missing") is None


def test_unknown_fields_are_kept() -> None:
    sample = parse_line("[3m] step=4 mode=warmup host=gpu-3 gpu.mem=71.2GB")
    assert sample is not None
    assert sample.fields["mode"] == "warmup"
    assert sample.fields["host"] == "gpu-3"
    assert sample.fields["gpu.mem"] == Quantity(71.2, "GB")
    assert sample.number("mode") is None


def test_a_line_without_prefix_needs_two_fields() -> None:
    assert parse_line("loss=1.0") is None
    generic = parse_line("it=10 loss=1.0 | 3.2Ktok/s")
    assert generic is not None
    assert generic.elapsed_min is None
    assert generic.step is None
    assert parse_line("[12m] compiling kernels") == Sample(0, 12.0, {}, "[12m] compiling kernels")
    assert generic.reading is DFLASH and generic.watched() == {}


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("12.3Ktok/s", 12300.0),
        ("5Ktok/s", 5000.0),
        ("5k", 5000.0),
        ("1.5Mtok/s", 1.5e6),
        ("900", 900.0),
        ("900tok/s", 900.0),
        (" 2 Ktok/s ", 2000.0),
        ("2.5it/s", 2.5),
        ("64samples/s", 64.0),
    ],
)
def test_parse_rate(text: str, rate: float) -> None:
    assert parse_rate(text) == pytest.approx(rate)


@pytest.mark.parametrize("text", ["", "fast", "5 mtok/s", "12.3Kb/s"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a rate"):
        parse_rate(text)


# --- robustness -------------------------------------------------------------------------------


def _touch_everything(samples: list[Sample]) -> None:
    for sample in samples:
        dict(sample.fields)
        for key in sample.fields:
            sample.number(key)
            sample.numbers(key)
        _ = (sample.step, sample.loss, sample.throughput, sample.eta_seconds)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.one_of(st.none(), st.integers(min_value=-5, max_value=200)))
def test_arbitrary_text_never_raises(text: str, width: int | None) -> None:
    samples = parse_pane(text, width=width)
    _touch_everything(samples)
    assert [s.index for s in samples] == list(range(len(samples)))


_PANE_ALPHABET = st.sampled_from(list("[]0123456789m=~|.,-? \n()Ktok/sbdeETAlqpr_x\x1b"))


@settings(max_examples=300, deadline=None)
@given(st.text(_PANE_ALPHABET, max_size=300))
def test_status_like_noise_never_raises(text: str) -> None:
    _touch_everything(parse_pane(text))
    sample = parse_line(text)
    if sample is not None:
        _touch_everything([sample])


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(SEED)))
def test_cutting_the_seed_anywhere_only_loses_samples(cut: int) -> None:
    samples = parse_pane(SEED[:cut])
    assert len(samples) <= 3
    for sample in samples:
        assert sample.step in (0, 2, None)
        queue = sample.numbers("q_pre")
        assert queue is None or len(queue) == 6  # a cut list is unknown, never shorter


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SEED) - 1), max_size=5), st.text(max_size=5))
def test_corrupting_the_seed_never_raises(positions: list[int], junk: str) -> None:
    text = SEED
    for pos in sorted(positions, reverse=True):
        text = text[:pos] + junk + text[pos + 1 :]
    _touch_everything(parse_pane(text))

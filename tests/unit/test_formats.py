"""Status-line formats and presets (launcher.verify.formats), on real tmux captures and lines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from launcher.verify.formats import StatusSpec, rate_unit, to_rate
from launcher.verify.lines import message_start
from launcher.verify.parse import parse_pane
from launcher.verify.readers import MAX_OBJECT_CHARS, dict_fields, json_fields, keyvalue_fields
from launcher.verify.samples import DFLASH, Quantity, ReadSample, Sample, Share

PANES = Path(__file__).resolve().parents[1] / "fixtures" / "panes"


def pane(name: str) -> str:
    return (PANES / name).read_text(encoding="utf-8")


def spec(**kwargs: Any) -> StatusSpec:
    return StatusSpec.model_validate(kwargs)


def read(text: str, **kwargs: Any) -> list[Sample]:
    return parse_pane(text, spec(**kwargs))


# --- presets, each on its project's own lines (tests/fixtures/panes/make_panes.py) ------------


@pytest.mark.parametrize(
    "name",
    [
        "progress_80col_joined.txt",
        "progress_80col_wrapped.txt",
        "progress_250col_joined.txt",
        "progress_250col_wrapped.txt",
    ],
)
def test_hf_trainer_preset(name: str) -> None:
    samples = read(pane(name), preset="hf-trainer")
    dicts = [s for s in samples if not s.reading.progress]
    bars = [s for s in samples if s.reading.progress]
    # 40 dict lines (wrapped at 80 columns, joined back); the training bar at the bottom; not
    # the "Loading checkpoint shards" bar (it has a description) nor the FutureWarning.
    assert len(dicts) == 40 and len(bars) == 1
    assert all(s.loss is not None and math.isfinite(s.loss) for s in dicts)
    assert dicts[0].loss == pytest.approx(6.1663) and dicts[-1].loss == pytest.approx(2.3088)
    assert all(s.step is None and s.throughput is None for s in dicts)
    assert dicts[0].watched() == {"grad_norm": pytest.approx(0.5197519873323112)}
    (bar,) = bars
    assert bar is samples[-1]
    assert bar.step == 200 and bar.fields["total"] == 2000
    assert bar.throughput == pytest.approx(6.04) and bar.throughput_unit == "it/s"
    assert bar.elapsed_min == pytest.approx(33 / 60)
    assert bar.eta_seconds == pytest.approx(4 * 60 + 58)
    assert dicts[0].throughput_unit == "it/s"  # the run's throughput is the bar's


@pytest.mark.parametrize(
    "name",
    [
        "torchtitan_250col_joined.txt",
        "torchtitan_250col_wrapped.txt",
        "torchtitan_250col_joined-ansi.txt",
    ],
)
def test_torchtitan_preset(name: str) -> None:
    samples = read(pane(name), preset="torchtitan")
    # The metrics lines only: not "Starting job", the re-loop WARNING or the GC lines.
    assert [s.step for s in samples] == list(range(1, 41))
    first = samples[0]
    assert first.loss == pytest.approx(6.1901)
    assert first.throughput == 5620.0  # `tps: 5,620`: thousands commas
    assert first.throughput_unit == "tok/s"
    assert first.watched() == {"grad_norm": pytest.approx(2.303)}
    assert first.fields["memory"] == Quantity(49.66, "GiB")  # `49.66GiB(52.28%)`
    assert first.fields["mfu"] == Quantity(32.93, "%")
    assert all("\x1b" not in s.raw for s in samples)


@pytest.mark.parametrize("name", ["megatron_250col_joined.txt", "megatron_250col_wrapped.txt"])
def test_megatron_preset(name: str) -> None:
    samples = read(pane(name), preset="megatron")
    # iteration lines only: not the dataset chatter nor "saving checkpoint at iteration 200".
    assert [s.step for s in samples] == list(range(10, 410, 10))
    first, last = samples[0], samples[-1]
    assert first.loss == pytest.approx(6.222072)
    assert first.throughput == pytest.approx(1000 / 4123.7)  # iterations/s from ms/iteration
    assert last.throughput == pytest.approx(1000 / 522.6, rel=0.03)
    assert last.throughput_unit == "it/s"
    assert last.watched() == {"grad norm": pytest.approx(0.339)}
    assert last.fields["consumed samples"] == 400 * 512
    assert last.fields["learning rate"] == pytest.approx(3e-4)


@pytest.mark.parametrize("name", ["nanogpt_250col_joined.txt", "nanogpt_250col_wrapped.txt"])
def test_nanogpt_preset(name: str) -> None:
    samples = read(pane(name), preset="nanogpt")
    # `iter N:` lines; the evaluations' "step 0: train loss ..., val loss ..." are not steps.
    assert [s.step for s in samples] == list(range(40))
    assert samples[0].throughput == pytest.approx(1000 / 21300.0)  # `time 21300.00ms`
    assert samples[1].throughput == pytest.approx(1000 / 137.62)
    assert samples[1].loss == pytest.approx(6.1598)
    assert samples[-1].fields["mfu"] == Quantity(39.12, "%")


def test_presets_read_nothing_of_each_other() -> None:
    # A preset's mapping picks its own trainer's lines out of another's output: none here.
    assert read(pane("megatron_250col_joined.txt"), preset="nanogpt") == []
    assert read(pane("torchtitan_250col_joined.txt"), preset="megatron") == []
    assert read(pane("nanogpt_250col_joined.txt"), preset="hf-trainer") == []


# --- json ---------------------------------------------------------------------------------------

JSONL_LINES = "\n".join(
    [
        '{"event": "start", "run": "demo"}',
        '[rank0]:{"step": 10, "loss": 2.5, "throughput": {"tokens_per_s": 12000.5}, '
        '"queues": {"q_pre": [8, 7, 6]}, "elapsed_s": 90, "eta": "1h30m"}',
        '{"step": 11, "loss": NaN, "throughput": {"tokens_per_s": 11000}, "queues": {"q_pre": []}}',
        '{"step": 12, "loss": 2.4, "throughput": {"tokens_per_s": 12100',  # cut: not read
        "[1, 2, 3]",
        "",
    ]
)


def test_json_lines_with_mapping() -> None:
    samples = read(
        JSONL_LINES,
        format="json",
        fields={
            "throughput": "throughput.tokens_per_s",
            "queues": {"q_pre": "queues.q_pre"},
            "elapsed": "elapsed_s",
        },
    )
    assert [s.step for s in samples] == [10, 11]
    first, second = samples
    assert isinstance(first, ReadSample) and first.reading.format == "json"
    assert first.loss == 2.5 and first.throughput == 12000.5
    assert first.numbers("q_pre") == [8.0, 7.0, 6.0]
    assert first.elapsed_min == 1.5
    assert first.eta_seconds == 5400.0  # a string field read as a duration
    assert second.loss is not None and math.isnan(second.loss)
    assert second.numbers("q_pre") == []


def test_json_reads_only_objects_of_bounded_size() -> None:
    assert json_fields('{"a": 1}') == {"a": 1}
    assert json_fields("[1, 2]") is None
    assert json_fields('{"a": ') is None
    assert json_fields("{" * 100_000 + "}" * 100_000) is None  # too long (and too deep)
    deep = '{"a": ' * 5000 + "1" + "}" * 5000
    assert len(deep) < MAX_OBJECT_CHARS
    assert json_fields(deep) is None  # recursion refused, no traceback
    assert json_fields('{"a": {"b": [1, {"c": 2}]}}') == {"a.b": (1, None)}


def test_json_line_without_checked_quantity_is_not_a_status_line() -> None:
    assert read('{"event": "checkpoint", "path": "/ckpt/1"}\n', format="json") == []


# --- python-dict --------------------------------------------------------------------------------


def test_python_dict_reads_what_a_float_repr_and_numpy_print() -> None:
    fields = dict_fields(
        "{'loss': nan, 'grad_norm': inf, 'lr': -5e-05, 'acc': np.float64(0.85), "
        "'gn': tensor(1.5, device='cuda:0'), 'ok': True, 'name': 'run', 'nested': {'a': 1}}"
    )
    assert fields is not None
    assert math.isnan(fields["loss"])  # type: ignore[arg-type]
    assert fields["grad_norm"] == math.inf and fields["lr"] == -5e-05
    assert fields["acc"] == 0.85 and fields["gn"] == 1.5
    assert fields["ok"] is True and fields["name"] == "run" and fields["nested.a"] == 1


@pytest.mark.parametrize(
    "text",
    [
        "{'loss': __import__('os').system('touch /tmp/launcher-pwned')}",
        "{'loss': (lambda: 1)()}",
        "{'loss': 1 + 2}",
        "{**other}",
        "{'a': " * 150 + "1" + "}" * 150,
        "{'loss': 1",
        "not a dict {}",
        "{'x': " + "1" * MAX_OBJECT_CHARS + "}",
    ],
)
def test_python_dict_refuses_anything_but_literals(text: str) -> None:
    assert dict_fields(text) is None
    assert not Path("/tmp/launcher-pwned").exists()


def test_python_dict_nan_loss_is_a_reading() -> None:
    (sample,) = read("{'loss': nan, 'grad_norm': nan, 'epoch': 0.5}\n", format="python-dict")
    assert sample.loss is not None and math.isnan(sample.loss)


# --- keyvalue -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("step=5 loss=2.0 | (12.3Ktok/s)", {"step": 5, "loss": 2.0}),
        ("step:  4  loss:  7.62585  tps: 10,050", {"step": 4, "loss": 7.62585, "tps": 10050}),
        (
            "iteration      100/  250000 | lm loss: 2.504220E+00 | grad norm: nan |",
            {"iteration": 100, "lm loss": 2.50422, "grad norm": math.nan},
        ),
        (
            "elapsed time per iteration (ms): 512.3/498.1 |",
            {"elapsed time per iteration (ms)": 512.3},
        ),
        (
            "iter 7: loss 4.2345, time 123.45ms",
            {"iter": 7, "loss": 4.2345, "time": Quantity(0.12345, "s")},
        ),
        ("Epoch 1/3 step 200 train loss 2.3", {"Epoch": 1, "step": 200, "train loss": 2.3}),
        ("q_pre=[1, 2] eta: 01:02:03", {"q_pre": (1, 2), "eta": Quantity(3723.0, "s")}),
        ("Saving checkpoint at iteration 200 to /ckpt", {"Saving checkpoint at iteration": 200}),
        ("see http://host:8080/x and --lr=0.1", {}),
    ],
)
def test_keyvalue_fields(line: str, expected: dict[str, object]) -> None:
    fields = keyvalue_fields(line)
    for key, value in expected.items():
        got = fields[key]
        if isinstance(value, float) and math.isnan(value):
            assert isinstance(got, float) and math.isnan(got)
        elif isinstance(value, Quantity):
            assert isinstance(got, Quantity) and got.unit == value.unit
            assert got.value == pytest.approx(value.value)
        elif isinstance(got, Share):  # `100/250000`: read as its count, the total kept
            assert got.value == value and got.total > 0, (key, fields)
        else:
            assert got == value, (key, fields)
    if not expected:
        assert not {"http", "lr", "--lr"} & set(fields)


def test_keyvalue_mapping_renames_and_hides_lookalikes() -> None:
    text = "step 3: val loss 2.0\nit 4 | loss 1.5 | rate 2.5Ktok/s\n"
    samples = read(text, format="keyvalue", fields={"step": "it", "throughput": "rate"})
    # `step 3` is not the step when the step is `it`: that line holds no checked quantity.
    assert [(s.step, s.loss, s.throughput) for s in samples] == [(4, 1.5, 2500.0)]


# --- regex --------------------------------------------------------------------------------------


def test_regex_named_groups() -> None:
    pattern = (
        r"Epoch (?P<epoch>\d+) \| it (?P<it>\d+) \| loss (?P<loss>\S+) \| (?P<sps>\S+) samples/s"
    )
    text = "\n".join(
        [
            "2025-11-30 22:10:01,000 INFO Epoch 1 | it 120 | loss 2.25 | 512.5 samples/s",
            "2025-11-30 22:10:02,000 INFO Epoch 1 | it 121 | loss nan | 510.0 samples/s",
            "2025-11-30 22:10:03,000 INFO saved checkpoint",
        ]
    )
    samples = read(
        text,
        format="regex",
        pattern=pattern,
        fields={"step": "it", "throughput": "sps", "throughput_unit": "samples/s"},
    )
    assert [(s.step, s.throughput) for s in samples] == [(120, 512.5), (121, 510.0)]
    assert samples[0].loss == 2.25 and samples[0].fields["epoch"] == 1
    loss = samples[1].loss
    assert loss is not None and math.isnan(loss)
    assert samples[0].throughput_unit == "samples/s"


# --- progress bars ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bar", "step", "rate"),
    [
        (" 10%|█         | 200/2000 [00:33<04:58,  6.04it/s]", 200, 6.04),
        ("  0%|          | 0/1000 [00:00<?, ?it/s]", 0, None),
        (" 1%|          | 12/1000 [00:30<41:10,  2.50s/it]", 12, 0.4),
        ("1234it [01:02, 19.90it/s]", 1234, 19.9),
        (" 50%|█████     | 1.20k/2.40k [1:02:03<1:02:03,  1.23kit/s, loss=2.31]", 1200, 1230.0),
    ],
)
def test_progress_bars(bar: str, step: int, rate: float | None) -> None:
    (sample,) = read(bar + "\n", format="json", progress=True)
    assert sample.step == step and sample.reading.progress
    if rate is None:
        assert sample.throughput is None
    else:
        assert sample.throughput == pytest.approx(rate)
    if "loss=" in bar:
        assert sample.loss == 2.31  # tqdm's postfix is read with the format's mapping


def test_progress_bar_description_and_nesting() -> None:
    text = "\n".join(
        [
            "Loading checkpoint shards: 100%|██████████| 4/4 [00:03<00:00,  1.20it/s]",
            "Epoch 2:  40%|████      | 40/100 [00:10<00:15,  4.00it/s]",
            " 40%|████      | 400/1000 [01:40<02:30,  4.00it/s]",
            " 10%|█         | 5/50 [00:01<00:09,  5.00it/s]",  # an evaluation bar below it
        ]
    )
    assert [s.step for s in read(text, format="json", progress=True)] == [400]
    assert [s.step for s in read(text, format="json", progress="Epoch")] == [40]
    assert read(text, format="json") == []  # bars are read only when asked


def test_bar_redrawn_with_carriage_returns_in_a_log_file() -> None:
    # What `tee` or `nohup` saves: every redraw is there, the terminal shows the last one.
    redraws = "\r".join(
        f" {p}%|█         | {p}/100 [00:{p:02d}<00:10,  1.00it/s]" for p in (1, 2, 3)
    )
    text = redraws + "\r" + " " * 60 + "\r{'loss': 2.5, 'epoch': 0.1}\n" + redraws + "\n"
    samples = read(text, preset="hf-trainer")
    assert [(s.step, s.loss) for s in samples] == [(None, 2.5), (3, None)]


# --- units --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("unit", "value", "rate"),
    [
        ("tok/s", 900, 900.0),
        ("Ktok/s", 12.5, 12500.0),
        ("Mtok/s", 1.5, 1.5e6),
        ("samples/s", 64.0, 64.0),
        ("it/s", Quantity(2.0, "it/s"), 2.0),
        ("it/s", Quantity(2.0, "s/it"), 0.5),
        ("ms/it", 250, 4.0),
        ("ms/it", Quantity(0.25, "s"), 4.0),
        ("s/it", 0, None),
        ("tok/s", Quantity(12.3e3, "tok/s"), 12300.0),
        ("tok/s", Quantity(2.0, "it/s"), None),  # another kind of rate: not a reading
        ("tok/s", Quantity(0.25, "s"), None),
        ("tok/s", "fast", None),
        ("tok/s", True, None),
    ],
)
def test_to_rate(unit: str, value: object, rate: float | None) -> None:
    parsed = rate_unit(unit)
    assert parsed is not None
    got = to_rate(value, parsed)
    assert got == (None if rate is None else pytest.approx(rate))


def test_nan_rate_stays_nan() -> None:
    got = to_rate(math.nan, ("it/s", 1e-3, True))
    assert got is not None and math.isnan(got)


# --- the spec -----------------------------------------------------------------------------------


def test_default_spec_is_the_dflash_fast_path() -> None:
    assert StatusSpec().reader() is None
    line = "[2m] step=5 loss=2.0 | (1.5Ktok/s) | q_pre=[1, 2]"
    assert parse_pane(line, StatusSpec()) == parse_pane(line)
    assert parse_pane(line)[0].reading is DFLASH


def test_dflash_with_a_mapping() -> None:
    (sample,) = read(
        "[3m] it=7 loss=2.0 | (1.5Ktok/s) | buf=[1, 2]\n",
        fields={"step": "it", "queues": {"q_pre": "buf"}},
    )
    assert (sample.step, sample.elapsed_min, sample.throughput) == (7, 3.0, 1500.0)
    assert sample.numbers("q_pre") == [1.0, 2.0]


def test_cut_last_line_is_dropped() -> None:
    text = '{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.9, "note": "x' + "y" * 30
    # 40 columns, no -J: the last row runs to the edge and the capture ends there.
    rows = [text.split("\n")[0]] + [text.split("\n")[1][i : i + 40] for i in range(0, 80, 40)]
    assert [s.step for s in parse_pane("\n".join(rows), spec(format="json"), width=40)] == [1]


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"preset": "torchtitan", "format": "json"}, "give either preset or format"),
        ({"format": "regex"}, "needs a pattern"),
        ({"format": "regex", "pattern": r"step (\d+)"}, "needs named groups"),
        ({"format": "regex", "pattern": "(?P<a>[x"}, "not a valid regular expression"),
        (
            {"format": "regex", "pattern": r"(?P<it>\d+)", "fields": {"step": "iter"}},
            "not a named group",
        ),
        ({"format": "json", "pattern": "(?P<a>x)"}, "only read with format regex"),
        (
            {"format": "json", "fields": {"throughput_unit": "furlongs/s"}},
            "unknown throughput unit",
        ),
        ({"format": "yaml"}, "Input should be"),
        ({"preset": "lightning"}, "Input should be"),
        ({"format": "json", "fields": {"step": " "}}, "must name a field"),
        ({"format": "json", "fields": {"stepp": "it"}}, "Extra inputs"),
        ({"progress": ""}, "must be true, false"),
    ],
)
def test_spec_errors(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        StatusSpec.model_validate(section)


def test_preset_fields_can_be_overridden() -> None:
    custom = spec(preset="torchtitan", fields={"loss": "local loss"})
    (sample,) = parse_pane("step: 3  loss: 9.0  local loss: 2.0  tps: 1,000\n", custom)
    assert (sample.step, sample.loss, sample.throughput) == (3, 2.0, 1000.0)


# --- prefixes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[rank3]:step=1", "step=1"),
        ("[default3]:step=1", "step=1"),
        ("[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200", "step: 200"),
        ("2024-05-01 12:00:00,123 - INFO - step=1", "step=1"),
        ("2024-05-01T12:00:00.123456+00:00 INFO step=1", "step=1"),
        ("[2024-05-01 12:00:00] iteration 10/ 100 |", "iteration 10/ 100 |"),
        ("INFO:root:step=1", "step=1"),
        ("WARNING:__main__:loss is nan", "loss is nan"),
        ("05/01/2024 12:00:00 - INFO - __main__ - step=1", "step=1"),
        ("I0501 12:00:00.123456 12345 train.py:42] step=1", "step=1"),
        ("2024-05-01 12:00:00.123 | INFO     | __main__:main:42 - step=1", "step=1"),
        ("[INFO] step=1", "step=1"),
        ("12:00:01 INFO     step=1", "step=1"),
        ("[3m] step=1", "[3m] step=1"),  # DFlash's own prefix is the parser's to read
        ("step=1 loss=2", "step=1 loss=2"),
        ("[8, 7] q_hs=[1]", "[8, 7] q_hs=[1]"),
    ],
)
def test_message_start(line: str, message: str) -> None:
    assert line[message_start(line) :] == message


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.sampled_from(["keyvalue", "json", "python-dict"]), st.booleans())
def test_arbitrary_text_never_raises(text: str, fmt: str, progress: bool) -> None:
    samples = read(text, format=fmt, progress=progress)
    assert [s.index for s in samples] == list(range(len(samples)))
    for sample in samples:
        _ = (sample.step, sample.loss, sample.throughput, sample.eta_seconds, sample.watched())


_DICT_ALPHABET = st.sampled_from(list("{}[]()'\":,. 0123456789-+eanifloss_gradtensor\n"))


@settings(max_examples=300, deadline=None)
@given(st.text(_DICT_ALPHABET, max_size=200))
def test_dict_like_noise_never_raises(text: str) -> None:
    dict_fields(text)
    json_fields(text)
    read(text, preset="hf-trainer")

"""Finding the `status:` block that reads a trainer's lines (launcher.verify.detect), and the
checks that follow what the trainer reports: queues as lists, depths and fills, and no absolute
throughput floor but DFlash's unless the playbook sets one.

The sample lines are each project's own (where each comes from is cited next to it; the pane
fixtures are made by tests/fixtures/panes/make_panes.py from the same format strings).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from launcher.verify.checks import evaluate
from launcher.verify.detect import detect_status, suggests
from launcher.verify.formats import StatusSpec
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.results import Failure, Verdict
from launcher.verify.samples import Share
from launcher.verify.spec import ChecksSpec, QueueSpec

PANES = Path(__file__).resolve().parent.parent / "fixtures" / "panes"

# The trainer: `key value | key value`, queues as fills.
PIPES = [
    f"step {317 + i} | loss 2.0{i} | tok/s 5067{i} | q_pre {12 + i}/16 | q_post 3/16"
    for i in range(4)
]
# Lightning's TQDMProgressBar (the default): `Epoch {current_epoch}` as the description, the
# logged metrics (prog_bar=True) and `v_num` in the postfix; lines as Lightning users posted them.
LIGHTNING = [
    "Epoch 0:   4%|▍         | 350/8000 [00:09<03:23, 37.56it/s, v_num=0, train_loss=2.310]",
    "Epoch 0: 100%|██████████| 8000/8000 [03:32<00:00, 37.56it/s, v_num=0, train_loss=1.910]",
    "Epoch 1:   4%|▍         | 350/8000 [00:09<03:23, 37.60it/s, v_num=0, train_loss=1.870]",
]
# tqdm's default layout with no description: `{n}/{total} [{elapsed}<{remaining}, {rate}]`.
# A bar right below a bar is a nested one (an evaluation's): a log holds other lines between.
TQDM = [
    " 25%|██▌       | 500/2000 [01:23<04:09,  6.01it/s, loss=2.15]",
    "saving a checkpoint",
    " 26%|██▌       | 520/2000 [01:26<04:05,  6.03it/s, loss=2.11]",
]
JSON = [f'{{"step": {i}, "loss": {2.5 - i / 10}, "tokens_per_s": {5000 + i}}}' for i in range(3)]
# A printed dict (the HF Trainer's `on_log`, without its bar: disable_tqdm=True).
DICTS = [
    "{'loss': 2.119, 'grad_norm': 37.65, 'learning_rate': 4.58e-05, 'epoch': 0.25}",
    "{'loss': 2.011, 'grad_norm': 30.02, 'learning_rate': 4.16e-05, 'epoch': 0.5}",
]
# Logger-style names: a path of words, the unit at its end.
PATHS = [
    f"train/loss={2.0 + i / 10} train/lr=0.001 perf/tps={9000 + i} trainer/global_step={i}"
    for i in range(3)
]
NESTED = [f'{{"step": {i}, "train": {{"loss": 2.1, "tokens_per_sec": 1000}}}}' for i in range(3)]
# `step` and `loss` alone: torchtitan's preset would read them, but they are not its lines.
STEP_LOSS = [f"step {i} | loss {2 - i / 10:.2f} | elapsed 0:0{i}:10" for i in range(3)]
KEY_EQUALS = [f"it={i} train_loss={3 - i / 10:.3f} samples/s={120 + i}" for i in range(3)]
KEY_COLON = [f"Iter: {i}  Loss: {3 - i / 10:.3f}  step_time: {0.5 + i / 100}" for i in range(3)]


def lines_of(name: str) -> list[str]:
    return (PANES / name).read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize(
    ("fixture", "block"),
    [
        ("colour_250col_joined-ansi.txt", {}),  # DFlash: the default reads it
        ("logging_80col_wrapped.txt", {}),
        ("nanogpt_250col_joined.txt", {"preset": "nanogpt"}),
        ("megatron_250col_wrapped.txt", {"preset": "megatron"}),
        ("torchtitan_250col_joined-ansi.txt", {"preset": "torchtitan"}),
        ("progress_250col_joined.txt", {"preset": "hf-trainer"}),
        ("hfdicts_250col_joined.txt", {"preset": "hf-trainer"}),
    ],
)
def test_each_projects_lines_detect_as_its_preset(fixture: str, block: dict[str, Any]) -> None:
    found = detect_status(lines_of(fixture))
    assert found.status == block, found.explanation
    assert "step" in found.reads and "loss" in found.reads
    assert found.read >= 30 and suggests(found)


@pytest.mark.parametrize(
    ("lines", "block", "reads"),
    [
        (
            PIPES,
            {"format": "keyvalue", "fields": {"throughput": "tok/s", "throughput_unit": "tok/s"}},
            ("step", "loss", "throughput"),
        ),
        (
            LIGHTNING,
            {"format": "keyvalue", "progress": "Epoch", "fields": {"loss": "train_loss"}},
            ("step", "loss", "throughput"),
        ),
        (TQDM, {"format": "keyvalue", "progress": True}, ("step", "loss", "throughput")),
        # The HF Trainer's dicts are the hf-trainer preset's (its `epoch` stands for the step).
        (
            JSON,
            {
                "format": "json",
                "fields": {"throughput": "tokens_per_s", "throughput_unit": "tok/s"},
            },
            ("step", "loss", "throughput"),
        ),
        (DICTS, {"preset": "hf-trainer"}, ("step", "loss")),
        (STEP_LOSS, {"format": "keyvalue", "fields": {"elapsed": "elapsed"}}, ("step", "loss")),
        (
            PATHS,
            {
                "format": "keyvalue",
                "fields": {
                    "step": "trainer/global_step",
                    "loss": "train/loss",
                    "throughput": "perf/tps",
                    "throughput_unit": "tok/s",
                },
            },
            ("step", "loss", "throughput"),
        ),
        (
            NESTED,
            {
                "format": "json",
                "fields": {
                    "loss": "train.loss",
                    "throughput": "train.tokens_per_sec",
                    "throughput_unit": "tok/s",
                },
            },
            ("step", "loss", "throughput"),
        ),
        (
            KEY_EQUALS,
            {
                "format": "keyvalue",
                "fields": {
                    "step": "it",
                    "loss": "train_loss",
                    "throughput": "samples/s",
                    "throughput_unit": "samples/s",
                },
            },
            ("step", "loss", "throughput"),
        ),
        (
            KEY_COLON,
            {
                "format": "keyvalue",
                "fields": {
                    "step": "Iter",
                    "loss": "Loss",
                    "throughput": "step_time",
                    "throughput_unit": "s/it",
                },
            },
            ("step", "loss", "throughput"),
        ),
    ],
)
def test_generic_shapes_get_a_block_naming_their_fields(
    lines: list[str], block: dict[str, Any], reads: tuple[str, ...]
) -> None:
    found = detect_status(["starting the run", *lines])
    assert found.status == block, found.explanation
    assert found.reads == reads
    # The block is a valid `status:` section, and reads the lines as detection said.
    samples = parse_pane("\n".join(lines) + "\n", StatusSpec.model_validate(block), width=1000)
    assert samples and samples[-1].loss is not None


def test_the_block_is_printed_as_yaml_for_the_playbook() -> None:
    found = detect_status(PIPES)
    assert found.yaml() == (
        "status:\n  format: keyvalue\n  fields:\n"
        "    throughput: tok/s\n    throughput_unit: tok/s\n"
    )
    assert found.confidence == 1.0 and found.examples == (PIPES[-2], PIPES[-1])


def test_lines_that_are_no_status_lines_get_no_block() -> None:
    found = detect_status(["Loading checkpoint shards", "Map: done", "building index 3/8"])
    assert found.status is None and not suggests(found)
    assert found.examples == ("Map: done", "building index 3/8")
    # A rate alone (a data loader's bar) is no reason to fail a run that may still start.
    bar = " 40%|████      | 400/1000 [00:01<00:01, 512.00it/s]"
    bars = detect_status([bar, "Map: done", bar, "Map: done", bar])
    assert bars.read >= 2 and "step" in bars.reads and not suggests(bars)


def test_lightning_epochs_restart_the_bar_without_a_restart() -> None:
    """Each epoch's bar counts from 0: the epoch in its description says so, and the lines
    after the first of a new epoch are not "the step went backwards" either."""
    spec = ChecksSpec()
    status = StatusSpec.model_validate(detect_status(LIGHTNING).status)
    later = "Epoch 1:   5%|▍         | 400/8000 [00:10<03:22, 37.61it/s, v_num=0, train_loss=1.860]"
    # The bar is redrawn in place (`\r`): each poll's pane holds its latest drawing only.
    polls = [
        _poll(at, f"GPU available: True\n{line}", status)
        for at, line in zip((0.0, 5.0, 10.0, 15.0), [*LIGHTNING, later], strict=True)
    ]
    results = {r.name: r for r in evaluate(polls, spec)}
    assert results["restarts"].verdict is Verdict.PASS, results["restarts"].observed
    assert results["step"].observed.startswith("step 400")


# --- queues: lists, depths and fills ----------------------------------------------------------


def _poll(at: float, text: str, status: StatusSpec | None = None) -> Poll:
    state = PaneState(True, False, None, None, text + "\n")
    return Poll(at, state, tuple(parse_pane(text + "\n", status)))


KEYVALUE = StatusSpec.model_validate({"format": "keyvalue"})


def test_a_fraction_is_a_share_and_its_fill_is_checked() -> None:
    (sample,) = parse_pane("step 3 | loss 2.0 | q_pre 12/16\n", KEYVALUE)
    assert sample.fields["q_pre"] == Share(12.0, 16.0)
    assert sample.queue("q_pre") == ("fill", [0.75])
    result = _queue([_poll(0, "step 3 | loss 2.0 | q_pre 12/16", KEYVALUE)], ChecksSpec())
    assert result.verdict is Verdict.PASS and result.observed == "q_pre 75% full"


def test_min_fill_fails_a_queue_that_never_fills() -> None:
    spec = ChecksSpec(queues={"q_pre": QueueSpec(min_fill=0.5)})
    polls = [_poll(at, f"step {at:g} | loss 2.0 | q_pre 4/16", KEYVALUE) for at in (0, 10, 20)]
    result = _queue(polls, spec)
    assert result.verdict is Verdict.FAIL and result.kind is Failure.IMMEDIATE
    assert result.observed == "q_pre 25% full (below 50% full in 3 polls)"
    ok = _queue([*polls[:2], _poll(20, "step 20 | loss 2.0 | q_pre 9/16", KEYVALUE)], spec)
    assert ok.verdict is Verdict.PASS


def test_a_scalar_depth_must_be_above_zero_now_and_then() -> None:
    spec = ChecksSpec(queues={"depth": 1})
    polls = [_poll(at, f"step {at:g} | loss 2.0 | depth 0", KEYVALUE) for at in (0, 10, 20)]
    result = _queue(polls, spec, "depth")
    assert result.verdict is Verdict.FAIL and result.observed == "depth=0 (empty in 3 polls)"
    fine = [_poll(at, f"step {at:g} | loss 2.0 | depth={at:g}", KEYVALUE) for at in (0, 10, 20)]
    assert _queue(fine, spec, "depth").verdict is Verdict.PASS


def test_dflash_queue_checks_stay_on_and_stay_strict() -> None:
    """The default format reports q_pre and q_hs: missing ones fail, a wrong length fails."""
    line = "[0m] step=1 loss=2.0 | (20.0Ktok/s) | q_pre=[8, 6, 6] q_hs=[4]"
    result = _queue([_poll(0, line)], ChecksSpec())
    assert result.verdict is Verdict.FAIL and result.kind is Failure.DEFINITE
    missing = _queue([_poll(0, "[0m] step=1 loss=2.0 | (20.0Ktok/s)")], ChecksSpec())
    assert missing.verdict is Verdict.FAIL and missing.observed == "q_pre never reported"


def test_a_queue_the_other_format_does_not_print_is_not_checked() -> None:
    result = _queue([_poll(0, "step 3 | loss 2.0 | tok/s 500", KEYVALUE)], ChecksSpec())
    assert result.verdict is Verdict.SKIP


def _queue(polls: list[Poll], spec: ChecksSpec, name: str = "q_pre") -> Any:
    return {r.name: r for r in evaluate(polls, spec)}[f"queues.{name}"]


# --- throughput: judged against the run itself unless the playbook sets a floor -------------


NANOGPT = StatusSpec.model_validate({"preset": "nanogpt"})


def _nanogpt(at: float, first: int, ms: float = 900.0) -> Poll:
    # nanoGPT train.py: f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu ..."
    text = "\n".join(
        f"iter {i}: loss {3 - i / 100:.4f}, time {ms:.2f}ms, mfu 12.30%"
        for i in range(first, first + 3)
    )
    return _poll(at, text, NANOGPT)


def test_a_slow_format_is_not_held_to_dflashs_floor() -> None:
    """nanoGPT at 1.1 it/s is healthy: no floor unless the playbook sets one."""
    polls = [_nanogpt(at, int(at)) for at in (0, 10, 20)]
    result = {r.name: r for r in evaluate(polls, ChecksSpec())}["throughput"]
    assert result.verdict is Verdict.PASS, result.observed
    assert ">=" not in result.expected
    floor = ChecksSpec(throughput={"min": 2.0})  # 2 it/s, set by the playbook
    slow = {r.name: r for r in evaluate(polls, floor)}["throughput"]
    assert slow.verdict is Verdict.FAIL and "below minimum" in slow.observed


def test_a_sustained_drop_still_fails_without_a_floor() -> None:
    polls = [_nanogpt(at, int(at)) for at in (0, 10, 20)]
    polls += [_nanogpt(at, int(at), ms=3000.0) for at in (30, 40)]
    result = {r.name: r for r in evaluate(polls, ChecksSpec())}["throughput"]
    assert result.verdict is Verdict.FAIL and "peak" in result.observed


def test_dflash_keeps_its_floor_by_default() -> None:
    line = "[0m] step={} loss=2.0 | (0.5Ktok/s) | q_pre=[8, 6, 6, 5, 4, 4] q_hs=[4]"
    polls = [_poll(at, line.format(int(at))) for at in (0, 10, 20)]
    result = {r.name: r for r in evaluate(polls, ChecksSpec())}["throughput"]
    assert result.verdict is Verdict.FAIL and "below minimum" in result.observed
    assert math.isclose(ChecksSpec().throughput.min, 1000.0)

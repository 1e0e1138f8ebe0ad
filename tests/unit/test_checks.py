from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.checks import (
    CheckResult,
    ChecksSpec,
    PaneState,
    Poll,
    ThroughputSpec,
    Verdict,
    evaluate,
    fatal_signs,
    history,
    worst,
)
from launcher.status import Sample, parse_pane

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def line(
    minute: int = 0,
    *,
    step: object = 10,
    loss: object = "1.5000",
    tput: float | None = 20.0,
    q_pre: str = "[8, 6, 6, 5, 4, 4]",
    q_hs: str = "[4]",
) -> str:
    tp = f" ({tput}Ktok/s)" if tput is not None else ""
    return f"[{minute}m] step={step} loss={loss} |{tp} | q_pre={q_pre} q_hs={q_hs} | ETA=2.0d"


def poll(at: float, *lines: str, dead: bool = False, exists: bool = True) -> Poll:
    capture = "\n".join(lines) + "\n"
    state = PaneState(exists, dead, 1 if dead else None, None, capture)
    return Poll(at, state, tuple(parse_pane(capture)))


def by_name(results: Sequence[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


def check(name: str, polls: Sequence[Poll], spec: ChecksSpec | None = None) -> CheckResult:
    return by_name(evaluate(polls, spec or ChecksSpec()))[name]


HEALTHY = [
    poll(0, line(0, step=10, tput=20.0), line(0, step=12, tput=21.0)),
    poll(60, line(0, step=12, tput=21.0), line(1, step=20, tput=24.0)),
]


def test_healthy_run_passes_everything() -> None:
    results = evaluate(HEALTHY, ChecksSpec())
    assert [r.name for r in results] == [
        "alive",
        "fatal",
        "samples",
        "queues.q_pre",
        "queues.q_hs",
        "throughput",
        "step",
        "loss",
    ]
    assert {r.name: r.verdict for r in results} == dict.fromkeys(
        (r.name for r in results), Verdict.PASS
    )
    assert worst(results) is Verdict.PASS


def test_worst() -> None:
    def r(v: Verdict) -> CheckResult:
        return CheckResult("x", v, "", "")

    assert worst([]) is Verdict.PASS
    assert worst([r(Verdict.PASS), r(Verdict.WARN)]) is Verdict.WARN
    assert worst([r(Verdict.FAIL), r(Verdict.WARN), r(Verdict.PASS)]) is Verdict.FAIL


def test_no_polls_fails() -> None:
    assert worst(evaluate([], ChecksSpec())) is Verdict.FAIL


# --- history ----------------------------------------------------------------------------------


def test_history_counts_overlapping_lines_once() -> None:
    seen = history(HEALTHY)
    assert [s.sample.step for s in seen] == [10, 12, 20]
    assert [s.at for s in seen] == [0, 0, 60]


def test_history_completes_a_cut_last_line() -> None:
    full = line(1, step=20)
    polls = [poll(0, line(0, step=10), full[:30]), poll(30, line(0, step=10), full)]
    seen = history(polls)
    assert [s.sample.step for s in seen] == [10, 20]
    assert seen[1].at == 0


def test_history_without_overlap_takes_everything() -> None:
    polls = [poll(0, line(0, step=1)), poll(30, line(5, step=50), line(5, step=51))]
    assert [s.sample.step for s in history(polls)] == [1, 50, 51]


# --- alive / fatal ----------------------------------------------------------------------------


def test_alive_fails_when_session_gone() -> None:
    result = check("alive", [poll(0, line(), exists=False)])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "tmux session not found"


def test_fatal_signs_on_a_crash_pane() -> None:
    capture = (FIXTURES / "crash_pane.txt").read_text()
    state = PaneState(True, True, 1, None, capture)
    alive, fatal = fatal_signs(state, ChecksSpec())
    assert alive.name == "alive"
    assert alive.verdict is Verdict.FAIL
    assert alive.observed.startswith("pane dead, exit status 1\n")
    tail = alive.observed.splitlines()[1:]
    assert len(tail) == 5
    assert tail[-1] == "Pane is dead (status 1, Sun Nov 30 22:18:00 2025)"
    assert fatal.name == "fatal"
    assert fatal.verdict is Verdict.FAIL
    assert fatal.observed == "Traceback (most recent call last):"


def test_fatal_finds_a_pattern_split_by_wrapping() -> None:
    state = PaneState(True, False, None, None, "x" * 60 + "CUDA out \nof memory\n" + "y" * 70)
    spec = ChecksSpec(fail_patterns=["CUDA out of memory"])
    _, fatal = fatal_signs(state, spec)
    assert fatal.verdict is Verdict.PASS  # one row that wide is no evidence of wrapping
    wrapped = "A" * 69 + "CUDA out o\nf memory" + "\n" + "B" * 79 + "\nend\n"
    _, fatal = fatal_signs(PaneState(True, False, None, None, wrapped), spec)
    assert fatal.verdict is Verdict.FAIL


def test_fatal_passes_on_a_healthy_pane_and_uses_exit_code() -> None:
    state = PaneState(True, True, None, 137, line() + "\nKilled\n")
    alive, fatal = fatal_signs(state, ChecksSpec())
    assert alive.observed.startswith("pane dead, exit status 137")
    assert fatal.verdict is Verdict.FAIL
    assert fatal.observed == "Killed"
    alive, fatal = fatal_signs(PaneState(True, False, None, None, line()), ChecksSpec())
    assert (alive.verdict, fatal.verdict) == (Verdict.PASS, Verdict.PASS)


def test_fatal_remembers_earlier_polls() -> None:
    polls = [poll(0, line(), "NCCL error: unhandled system error"), poll(60, line(1, step=30))]
    result = check("fatal", polls)
    assert result.verdict is Verdict.FAIL
    assert "NCCL error" in result.observed


# --- samples / queues -------------------------------------------------------------------------


def test_silent_trainer_fails_samples() -> None:
    result = check("samples", [poll(0, "Starting pipeline...", "Loading shards")])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "no status line in 2 captured lines"


def test_empty_bucket_fails_queues() -> None:
    result = check("queues.q_pre", [poll(0, line(q_pre="[8, 6, 0, 5, 4, 4]"))])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "q_pre=[8, 6, 0, 5, 4, 4] (bucket 3 empty)"
    assert result.expected == "6 entries, all > 0"


def test_wrong_bucket_count_fails_queues() -> None:
    result = check("queues.q_pre", [poll(0, line(q_pre="[8, 6, 6]"))])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "q_pre=[8, 6, 6] (3 entries)"


def test_queue_uses_the_latest_known_value() -> None:
    # The seed ends mid-list: the last complete q_pre is the one that counts.
    seed = (FIXTURES / "seed_capture.txt").read_text()
    polls = [Poll(0, PaneState(True, False, None, None, seed), tuple(parse_pane(seed)))]
    result = check("queues.q_pre", polls)
    assert result.verdict is Verdict.PASS
    assert result.observed == "q_pre=[8, 6, 6, 5, 4, 4]"
    assert check("queues.q_hs", polls).verdict is Verdict.PASS


def test_queue_never_seen_fails() -> None:
    result = check("queues.q_pre", [poll(0, line(q_pre="---"))])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "q_pre never reported"


# --- throughput -------------------------------------------------------------------------------


def tput_polls(*values: float | None) -> list[Poll]:
    return [poll(i * 30.0, line(i, step=i * 10, tput=v)) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("values", "spec", "verdict"),
    [
        ((0.0, 1.9, 12.3), ThroughputSpec(), Verdict.PASS),  # the seed: warming up
        ((20.0, 20.0, 20.0), ThroughputSpec(), Verdict.WARN),  # flat, no target
        ((20.0, 20.0, 20.0), ThroughputSpec(target=18000), Verdict.PASS),  # plateau at target
        ((20.0, 20.0, 20.0), ThroughputSpec(target=25000), Verdict.WARN),  # flat below target
        ((20.0, 20.5, 20.4), ThroughputSpec(), Verdict.WARN),  # within the rise margin
        ((20.0, 22.0, 24.0), ThroughputSpec(target=30000), Verdict.PASS),  # rising
        ((5.0, 3.0, 0.5), ThroughputSpec(), Verdict.FAIL),  # below min
        ((0.1, 0.2, 0.4), ThroughputSpec(), Verdict.FAIL),  # rising but below min
        ((None, None), ThroughputSpec(), Verdict.FAIL),  # never reported
        ((20.0,), ThroughputSpec(), Verdict.WARN),  # one reading: no trend yet
    ],
)
def test_throughput(
    values: tuple[float | None, ...], spec: ThroughputSpec, verdict: Verdict
) -> None:
    result = check("throughput", tput_polls(*values), ChecksSpec(throughput=spec))
    assert result.verdict is verdict, result


def test_throughput_messages() -> None:
    result = check("throughput", tput_polls(5.0, 3.0, 0.5))
    assert result.observed == "5.0Ktok/s -> 3.0Ktok/s -> 500tok/s (below minimum)"
    assert result.expected == ">= 1.0Ktok/s, rising"
    assert check("throughput", tput_polls(None)).observed == "no throughput reported"


def test_throughput_spec_accepts_rates_as_text() -> None:
    spec = ChecksSpec.model_validate({"throughput": {"min": "5Ktok/s", "target": "28Ktok/s"}})
    assert (spec.throughput.min, spec.throughput.target) == (5000.0, 28000.0)
    with pytest.raises(ValidationError):
        ChecksSpec.model_validate({"throughput": {"min": "fast"}})
    with pytest.raises(ValidationError):
        ChecksSpec.model_validate({"throughput": {"minimum": 5}})


# --- step -------------------------------------------------------------------------------------


def test_step_stalled_across_polls_fails() -> None:
    polls = [
        poll(0, line(0, step=40)),
        poll(10, line(0, step=40), line(0, step=42)),
        poll(140, line(0, step=40), line(0, step=42)),
    ]
    result = check("step", polls)
    assert result.verdict is Verdict.FAIL
    assert result.observed == "step 42 unchanged for 130 s"


def test_step_advancing_passes() -> None:
    polls = [poll(0, line(0, step=40)), poll(100, line(0, step=40), line(1, step=60))]
    result = check("step", polls)
    assert result.verdict is Verdict.PASS
    assert result.observed == "step 60, last changed 0 s ago"


def test_step_stall_visible_in_one_capture_through_elapsed_minutes() -> None:
    polls = [poll(0, line(0, step=7), line(2, step=7), line(4, step=7))]
    result = check("step", polls)
    assert result.verdict is Verdict.FAIL
    assert result.observed == "step 7 unchanged for 180 s"


def test_step_never_reported_fails() -> None:
    assert check("step", [poll(0, line(step="---"))]).verdict is Verdict.FAIL


# --- loss -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("losses", "verdict", "observed"),
    [
        (("---", "---"), Verdict.PASS, "not reported yet"),
        (("2.0", "1.5", "1.4"), Verdict.PASS, "loss=1.4 (lowest 1.4)"),
        (("1.0", "1.4"), Verdict.PASS, "loss=1.4 (lowest 1)"),
        (("1.0", "1.6"), Verdict.WARN, "loss=1.6, lowest 1"),
        (("1.0", "nan"), Verdict.FAIL, "loss=nan"),
        (("1.0", "inf"), Verdict.FAIL, "loss=inf"),
        (("nan", "1.0"), Verdict.WARN, "loss=1, but it was non-finite earlier"),
    ],
)
def test_loss(losses: tuple[str, ...], verdict: Verdict, observed: str) -> None:
    polls = [poll(0, *(line(0, step=i, loss=v) for i, v in enumerate(losses)))]
    result = check("loss", polls)
    assert (result.verdict, result.observed) == (verdict, observed)


# --- the seed, end to end ---------------------------------------------------------------------


def test_seed_capture_verdicts() -> None:
    seed = (FIXTURES / "seed_capture.txt").read_text()
    samples: tuple[Sample, ...] = tuple(parse_pane(seed))
    results = by_name(
        evaluate([Poll(180, PaneState(True, False, None, None, seed), samples)], ChecksSpec())
    )
    assert results["throughput"].verdict is Verdict.PASS  # 0 -> 1.9K -> 12.3K: rising
    assert results["step"].verdict is Verdict.PASS
    assert results["loss"].verdict is Verdict.WARN  # 6.41 after 1.32: early, but worth a look
    assert results["fatal"].verdict is Verdict.PASS

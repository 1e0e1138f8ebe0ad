from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.verify.checks import Judge, evaluate, fatal_signs
from launcher.verify.detect import detect_status, suggests
from launcher.verify.history import history
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.results import CheckResult, Failure, Verdict, worst_verdict
from launcher.verify.samples import Fields, Sample
from launcher.verify.spec import ChecksSpec, LossSpec, StepSpec, ThroughputSpec

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
        "restarts",
        "samples",
        "queues.q_pre",
        "queues.q_hs",
        "throughput",
        "step",
        "loss",
        "finite",
    ]
    assert {r.name: r.verdict for r in results} == dict.fromkeys(
        (r.name for r in results), Verdict.PASS
    )
    assert worst_verdict(results) is Verdict.PASS


def test_worst() -> None:
    def r(v: Verdict) -> CheckResult:
        return CheckResult("x", v, "", "")

    assert worst_verdict([]) is Verdict.PASS
    assert worst_verdict([r(Verdict.PASS), r(Verdict.WARN)]) is Verdict.WARN
    assert worst_verdict([r(Verdict.FAIL), r(Verdict.WARN), r(Verdict.PASS)]) is Verdict.FAIL


def test_no_polls_fails() -> None:
    assert worst_verdict(evaluate([], ChecksSpec())) is Verdict.FAIL


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
    # The traceback and the exception that ended it.
    assert fatal.observed.startswith("Traceback (most recent call last): … torch.OutOfMemoryError")


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
    # The fatal line has scrolled away, and nothing advanced the step since: still fatal.
    polls = [poll(0, line(), "NCCL error: unhandled system error"), poll(60, line(0, step=10))]
    result = check("fatal", polls)
    assert result.verdict is Verdict.FAIL
    assert "NCCL error" in result.observed


def test_fatal_sign_the_run_survived_is_a_warning() -> None:
    polls = [poll(0, line(), "NCCL error: unhandled system error"), poll(60, line(1, step=30))]
    result = check("fatal", polls)
    assert result.verdict is Verdict.WARN
    assert result.observed.endswith("(the run went on: step 10 → 30)")


# --- samples / queues -------------------------------------------------------------------------


def test_silent_trainer_fails_samples() -> None:
    result = check("samples", [poll(0, "Starting pipeline...", "Loading shards")])
    assert result.verdict is Verdict.FAIL
    assert result.observed == (
        "no status line in 2 captured lines (e.g. `Starting pipeline...`, `Loading shards`)"
    )
    assert result.kind is Failure.PENDING  # it may still be starting: the window decides


def test_lines_of_another_shape_fail_at_once_with_the_block_that_reads_them() -> None:
    """The issue's trainer: a line a second the default (DFlash) reader cannot read."""
    rows = [
        f"step {317 + i} | loss 2.0{i} | tok/s 5067{i} | q_pre 13/16 | q_post 3/16"
        for i in range(4)
    ]
    result = check("samples", [poll(0, "starting", *rows)])
    assert result.verdict is Verdict.FAIL and result.kind is Failure.IMMEDIATE
    first, *rest = result.observed.splitlines()
    assert first.startswith("no status line in 5 captured lines: 4 read as keyvalue lines")
    assert (
        "`status: {format: keyvalue, fields: {throughput: tok/s, throughput_unit: tok/s}}`" in first
    )
    assert f"`{rows[-2]}`, `{rows[-1]}`" in first  # two of the lines, quoted
    assert rest[1:] == [
        "status:",
        "  format: keyvalue",
        "  fields:",
        "    throughput: tok/s",
        "    throughput_unit: tok/s",
    ]


def test_empty_bucket_fails_queues() -> None:
    result = check("queues.q_pre", [poll(0, line(q_pre="[8, 6, 0, 5, 4, 4]"))])
    assert result.verdict is Verdict.FAIL
    assert result.observed == "q_pre=[8, 6, 0, 5, 4, 4] (bucket 3 empty)"
    assert result.expected == "6 entries, each > 0 at least once in 3 polls"


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
        ((20.0, 20.0, 20.0), ThroughputSpec(), Verdict.PASS),  # a steady level
        ((20.0, 20.0, 20.0), ThroughputSpec(target=18000), Verdict.PASS),  # plateau at target
        ((20.0, 20.0, 20.0), ThroughputSpec(target=25000), Verdict.WARN),  # flat below target
        ((20.0, 20.5, 20.4), ThroughputSpec(), Verdict.PASS),  # steady within the noise
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
    assert result.observed == (
        "5.0Ktok/s -> 3.0Ktok/s -> 500tok/s (below minimum; 17% of this run's peak 3.0Ktok/s)"
    )
    assert result.kind is Failure.DEFINITE
    assert result.expected == ">= 1.0Ktok/s, not below 50% of this run's peak"
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


def quiet_poll(at: float, quiet: float | None, *lines: str) -> Poll:
    """A poll whose run has printed nothing and written no checkpoint for `quiet` s."""
    base = poll(at, *lines)
    return Poll(at, dataclasses.replace(base.state, quiet_for=quiet), base.samples)


HANG = ChecksSpec(step=StepSpec(stall_after=120, hang_after=20))


def test_a_silent_run_is_hung_after_hang_after_not_stall_after() -> None:
    polls = [
        quiet_poll(0, 0.0, line(0, step=40)),
        quiet_poll(10, 0.0, line(0, step=40), line(0, step=42)),
        quiet_poll(32, 22.0, line(0, step=40), line(0, step=42)),
    ]
    result = check("step", polls, HANG)
    assert (result.verdict, result.failure) == (Verdict.FAIL, Failure.IMMEDIATE)
    assert result.observed == (
        "step 42 unchanged, nothing printed and no checkpoint written for 22 s (hang_after 20 s)"
    )
    assert check("step", polls).verdict is Verdict.PASS  # without hang_after: not yet


@pytest.mark.parametrize(
    ("quiet", "verdict"),
    [
        (5.0, Verdict.PASS),  # printing (or writing a checkpoint) a moment ago: a long save
        (None, Verdict.PASS),  # no log to tell: only stall_after can call it
        (25.0, Verdict.FAIL),
    ],
)
def test_hang_needs_both_the_step_and_the_run_silent(quiet: float | None, verdict: Verdict) -> None:
    polls = [
        quiet_poll(0, 0.0, line(0, step=42)),
        quiet_poll(30, quiet, line(0, step=42)),
    ]
    assert check("step", polls, HANG).verdict is verdict
    # The step advancing is progress whatever the log says (a trainer that logs elsewhere).
    moving = [quiet_poll(0, 0.0, line(0, step=42)), quiet_poll(30, 25.0, line(0, step=43))]
    assert check("step", moving, HANG).verdict is Verdict.PASS


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


# --- the run's own history (Judge) ------------------------------------------------------------


def judged(*polls: Poll, spec: ChecksSpec | None = None) -> dict[str, CheckResult]:
    judge = Judge(spec or ChecksSpec())
    results: list[CheckResult] = []
    for p in polls:
        results = judge.add(p)
    return by_name(results)


def steady(start: int, count: int, *, at: float = 0, **fields: object) -> list[str]:
    return [line(0, step=start + i, **fields) for i in range(count)]  # type: ignore[arg-type]


def test_each_failing_check_says_how_it_counts() -> None:
    dead = poll(0, line(), dead=True)
    assert check("alive", [dead]).kind is Failure.IMMEDIATE
    assert check("samples", [poll(0, "Loading...")]).kind is Failure.PENDING
    assert check("loss", [poll(0, line(loss="nan"))]).kind is Failure.DEFINITE
    assert check("queues.q_pre", [poll(0, line(q_pre="---"))]).kind is Failure.PENDING
    assert check("step", [poll(0, line(step="---"))]).kind is Failure.PENDING
    assert check("throughput", [poll(0, line())]).kind is None  # passing: no kind


def test_throughput_sag_against_the_runs_own_peak() -> None:
    values = [28.0, 28.3, 27.9, 28.1, 7.0, 7.1, 6.9]
    polls = [poll(i, line(0, step=i, tput=v)) for i, v in enumerate(values)]
    result = check("throughput", polls)
    assert result.kind is Failure.DEFINITE
    assert result.observed == "throughput 6.9 Ktok/s, 25 % of this run's peak 28.1 Ktok/s"


def test_throughput_one_low_reading_among_many_does_not_sag() -> None:
    # Median of the poll's newest readings: one outlier (a checkpoint being saved) moves nothing.
    peak = steady(1, 6, tput=28.0)
    dip = [line(0, step=7, tput=28.1), line(0, step=8, tput=3.0), line(0, step=9, tput=27.9)]
    result = judged(poll(0, *peak), poll(10, *peak[-3:], *dip))["throughput"]
    assert result.verdict is Verdict.PASS, result


def test_throughput_below_the_floor_but_rising_is_pending() -> None:
    polls = [poll(i, line(0, step=i, tput=v)) for i, v in enumerate([0.1, 0.2, 0.4, 0.6, 0.8])]
    result = check("throughput", polls)
    assert (result.verdict, result.kind) == (Verdict.FAIL, Failure.PENDING)
    assert result.observed.endswith("(below minimum, rising)")


def test_throughput_in_another_unit_is_shown_in_it() -> None:
    class Iterations(Sample):
        @property
        def throughput_unit(self) -> str:
            return "it/s"

    def sample(i: int, rate: float) -> Sample:
        return Iterations(i, None, Fields({"step": str(i), "throughput": str(rate)}), f"{i} {rate}")

    samples = tuple(sample(i, r) for i, r in enumerate((6.0, 6.1, 5.9, 1.4, 1.5, 1.4)))
    state = PaneState(True, False, None, None, "\n".join(s.raw for s in samples))
    result = check("throughput", [Poll(0, state, samples)], ChecksSpec(throughput={"min": 1}))
    assert result.observed == "throughput 1.4 it/s, 23 % of this run's peak 6 it/s"


@pytest.mark.parametrize(
    ("losses", "spec", "verdict", "kind", "observed"),
    [
        ((1.4, 1.41, 1.39, 1.4, 4.0, 4.1, 4.0), LossSpec(), Verdict.FAIL, Failure.DEFINITE,
         "loss 4, up 186% from this run's lowest 1.4"),
        ((1.4, 1.41, 1.39, 1.4, 2.5, 2.5, 2.5), LossSpec(), Verdict.WARN, None,
         "loss=2.5, lowest 1.39"),
        ((1.4, 1.41, 1.39, 1.4, 4.0, 4.1, 4.0), LossSpec(max_rise=None), Verdict.WARN, None,
         "loss=4, lowest 1.39"),
        ((1.4, 1.41, 1.39, 10.3, 10.35, 10.3), LossSpec(ceiling=10.4), Verdict.FAIL,
         Failure.DEFINITE, "loss 10.3 near the ceiling 10.4 (it was 1.4)"),
        ((10.38, 10.37, 10.36), LossSpec(ceiling=10.4), Verdict.FAIL, Failure.PENDING,
         "loss 10.37 still near the ceiling 10.4 (not learning yet)"),
        ((1.0, 0.2, 1.0, 1.1, 1.0), LossSpec(), Verdict.WARN, None, "loss=1, lowest 0.2"),
    ],
)  # fmt: skip
def test_loss_against_its_own_history(
    losses: tuple[float, ...], spec: LossSpec, verdict: Verdict, kind: Failure | None, observed: str
) -> None:
    # One lucky low reading (0.2) does not make the lowest for max_rise: a median of three does.
    lines = [line(0, step=i, loss=f"{v:g}") for i, v in enumerate(losses)]
    polls = [poll(0, *lines[:-3]), poll(10, *lines)] if len(lines) > 3 else [poll(0, *lines)]
    result = check("loss", polls, ChecksSpec(loss=spec))
    assert (result.verdict, result.kind, result.observed) == (verdict, kind, observed)


def test_other_numbers_must_stay_finite() -> None:
    text = "[0m] step=5 loss=2.3100 grad_norm=nan lr=6.00e-04 | (28.0Ktok/s) | q_pre=[1] ETA=inf"
    result = check("finite", [poll(0, text)])
    assert (result.verdict, result.kind) == (Verdict.FAIL, Failure.DEFINITE)
    assert result.observed == "grad_norm=nan (while loss=2.31 looks plausible)"  # ETA=inf is fine
    recovered = check("finite", [poll(0, text, text.replace("grad_norm=nan", "grad_norm=0.9"))])
    assert recovered.verdict is Verdict.PASS  # one overflowed step (fp16 loss scaling) passes


def test_queues_bursty_pass_drained_fail_at_once() -> None:
    bursty = [
        poll(i, line(0, step=i, q_pre="[8, 7, 6, 6, 5, " + ("2]" if i % 3 == 0 else "0]")))
        for i in range(8)
    ]
    result = check("queues.q_pre", bursty)
    assert result.verdict is Verdict.PASS
    assert result.observed == "q_pre=[8, 7, 6, 6, 5, 0] (bursty: every bucket filled recently)"
    drained = [poll(i, line(0, step=i, q_pre="[8, 7, 0, 6, 5, 0]")) for i in range(3)]
    result = check("queues.q_pre", drained)
    assert (result.verdict, result.kind) == (Verdict.FAIL, Failure.IMMEDIATE)
    assert result.observed == "q_pre=[8, 7, 0, 6, 5, 0] (buckets 3, 6 empty in 3 polls)"


BANNER_LINES = ("Starting pipeline...", "Pipeline running. Monitoring...")


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ((*steady(1, 30), line(0, step=25)), "step 30 → 25 before the probe"),
        (
            (*BANNER_LINES, *steady(1, 10), *BANNER_LINES, line(0, step=11)),
            "start-up lines repeated ('Starting pipeline...') before the probe",
        ),
        (
            (*steady(1, 9), "[default] Worker group FAILED. 3/3 attempts left; will restart "
             "worker group", line(0, step=5)),
            "step 9 → 5 before the probe",
        ),
    ],
)  # fmt: skip
def test_restart_signs(lines: tuple[str, ...], why: str) -> None:
    result = check("restarts", [poll(0, *lines)])
    assert result.verdict is Verdict.WARN  # one restart, before the probe: forgiven
    assert result.observed == f"restarted once ({why})"


def test_restarts_during_the_probe_fail_and_a_new_epoch_is_no_restart() -> None:
    first = poll(0, *BANNER_LINES, *steady(1, 10))
    again = poll(10, *BANNER_LINES, *steady(1, 10), *BANNER_LINES, *steady(4, 3))
    result = check("restarts", [first, again])
    assert (result.verdict, result.kind) == (Verdict.FAIL, Failure.DEFINITE)
    assert result.observed == "restarted once (step 10 → 4 at 10 s)"
    epochs = [f"[0m] step={s} loss=2.0 epoch={e} | (28.0Ktok/s)" for e in (1, 2) for s in (1, 2, 3)]
    assert check("restarts", [poll(0, *epochs)]).verdict is Verdict.PASS


def test_a_new_pane_process_is_a_restart() -> None:
    def at(t: float, pid: int) -> Poll:
        state = PaneState(True, False, None, None, "\n".join(steady(1, int(t) + 1)), pane_pid=pid)
        return Poll(t, state, tuple(parse_pane(state.capture)))

    result = judged(at(0, 100), at(5, 100), at(10, 200))["restarts"]
    assert result.observed == "restarted once (new process behind the pane (pid 100 → 200) at 10 s)"


def test_fatal_sign_then_restart_is_fatal() -> None:
    lines = (*BANNER_LINES, *steady(1, 5), "Killed", *BANNER_LINES, *steady(1, 3))
    first = poll(0, *BANNER_LINES, *steady(1, 5))
    result = judged(first, poll(5, *lines))["fatal"]
    assert result.verdict is Verdict.FAIL
    assert result.observed == "Killed (then the run restarted)"


def test_finaliser_noise_is_harmless_even_after_lines_of_equal_width() -> None:
    # Two status lines of the same length, each followed by the noise: with the pane's width
    # known, nothing is taken for a wrapped row.
    noise = (
        "Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2c>",
        "Traceback (most recent call last):",
        '  File "dataloader.py", line 1478, in __del__',
        "AssertionError: can only test a child process",
    )
    text = "\n".join((line(0, step=1), *noise, line(0, step=2), *noise, line(0, step=3)))
    state = PaneState(True, False, None, None, text, pane_width=250)
    result = judged(Poll(0, state, tuple(parse_pane(text, width=250))))["fatal"]
    assert result.verdict is Verdict.WARN
    assert result.observed.startswith("finaliser noise, harmless: Exception ignored in")


def test_a_torchrun_rank_exit_is_a_fatal_sign() -> None:
    lines = (*steady(1, 5), "failed (exitcode: -9) local_rank: 3 (pid: 42) of binary: python3")
    result = check("fatal", [poll(0, *lines)])
    assert result.verdict is Verdict.FAIL
    assert result.observed.startswith("failed (exitcode: -9) local_rank: 3")


def test_a_half_printed_last_line_waits_for_the_next_poll() -> None:
    # A live judge takes the newest line only once it is complete (or unchanged).
    judge = Judge(ChecksSpec(), live=True)
    start = (*steady(1, 3), "Exception ignored in: <function _Multi")
    judge.add(poll(0, *start))
    done = (*steady(1, 3), "Exception ignored in: <function _MultiProcessing...__del__>",
            "Traceback (most recent call last):", "AssertionError: x", *steady(4, 1))  # fmt: skip
    results = by_name(judge.add(poll(1, *done)))
    assert results["fatal"].verdict is Verdict.WARN
    assert results["fatal"].observed.startswith("finaliser noise")


def test_a_live_display_redrawn_below_the_status_lines_is_no_restart() -> None:
    # A five-row progress display redrawn in place under the log: the previous poll's last
    # rows are gone, but its last status line is still there to resume after.
    def at(t: int) -> Poll:
        footer = [f"epoch 1 {t}%|{'#' * t}", f"  data {t * 3}/300", f"  eta {60 - t}s"]
        footer += [f"  gpu {t + 50}%", f"  mem {t + 20} GiB"]
        return poll(t, *steady(1, 5 + t), *footer)

    judge = Judge(ChecksSpec(), live=True)
    results = [judge.add(at(t)) for t in range(6)][-1]
    assert by_name(results)["restarts"].verdict is Verdict.PASS
    assert by_name(results)["step"].observed.startswith("step 10,")


def test_start_up_lines_are_learnt_only_from_a_capture_that_starts_at_the_start() -> None:
    # A capture as long as asked for may begin anywhere: here in an evaluation, which recurs.
    evaluation = ("***** Running Evaluation *****", "Evaluation done, saving metrics")
    first = (*evaluation, *steady(100, 20))
    later = (*first, *evaluation, *steady(120, 5))
    for lines, verdict in ((len(first), Verdict.PASS), (None, Verdict.FAIL)):
        judge = Judge(ChecksSpec(), history_lines=lines)
        judge.add(poll(0, *first))
        assert by_name(judge.add(poll(10, *later)))["restarts"].verdict is verdict, lines


def test_lines_of_another_shape_after_status_lines_are_a_phase_not_a_format() -> None:
    """A run that printed its status lines and then only lines another format reads (an
    evaluation printing `step N | loss X`) waits for the step checks to judge it."""
    rows = [f"eval step {i} | loss 2.0{i}" for i in range(4)]
    assert suggests(detect_status(rows))  # on their own, a format to read them would be named
    result = check("samples", [poll(0, line(0, step=10)), poll(10, *rows)])
    assert result.verdict is Verdict.FAIL and result.kind is Failure.PENDING

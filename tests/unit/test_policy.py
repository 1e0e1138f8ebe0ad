"""The verdict policy and the check registry: one counting for verify, status, smoke and watch."""

from __future__ import annotations

import pytest

from launcher.verify import registry
from launcher.verify.checks import Judge
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.policy import (
    Judgement,
    Tally,
    counted,
    describe_failures,
    outcome,
    probe_reason,
)
from launcher.verify.results import CheckResult, Failure, Verdict
from launcher.verify.rules.base import UNRANKED, Check, check
from launcher.verify.spec import ChecksSpec

LINE = "[0m] step={step} loss=1.5 | tgt=0.40b/s (20.0Ktok/s) | q_pre=[8, 6, 6, 5, 4, 4] q_hs=[4]"


def result(name: str, verdict: Verdict, failure: Failure | None = None) -> CheckResult:
    return CheckResult(name, verdict, f"{name} observed", "expected", failure)


def passing() -> list[CheckResult]:
    return [result(name, Verdict.PASS) for name in ("alive", "fatal", "restarts", "step")]


def test_the_registry_runs_every_check_in_its_order() -> None:
    capture = "\n".join(LINE.format(step=s) for s in range(1, 4)) + "\n"
    state = PaneState(True, False, None, None, capture)
    results = Judge(ChecksSpec()).add(Poll(0.0, state, tuple(parse_pane(capture))))
    heads = [r.name.split(".")[0] for r in results]
    judged = [c.name for c in registry.CHECKS if c.judge is not None and c.name != "gpus"]
    assert list(dict.fromkeys(heads)) == judged  # no GPUs asked for: no `gpus` result
    assert [r.name for r in results if r.name.startswith("queues.")] == [
        "queues.q_pre",
        "queues.q_hs",
    ]


def test_what_each_check_declares() -> None:
    warmup = {c.name for c in registry.CHECKS if c.warmup}
    events = {c.name for c in registry.CHECKS if c.event}
    ranked = sorted((c for c in registry.CHECKS if c.reason != UNRANKED), key=lambda c: c.reason)
    assert warmup == {"alive", "fatal", "restarts"}
    assert events == {"alive", "fatal", "restarts", "run"}
    assert [c.name for c in ranked] == [
        "run", "alive", "restarts", "fatal", "samples", "step", "loss", "finite",
    ]  # fmt: skip
    assert len({c.name for c in registry.CHECKS}) == len(registry.CHECKS)
    assert registry.find("queues.q_pre").name == "queues"
    # A restart inside the run is judged afresh once reported: declared, not named in watch.
    assert {c.name for c in registry.CHECKS if c.restart} == {"restarts"}
    tally = Tally(3)
    failed = [result("restarts", Verdict.FAIL), result("step", Verdict.FAIL)]
    assert tally.take(failed, judging=True).restarted
    assert not Tally(3).take([result("step", Verdict.FAIL)], judging=True).restarted
    assert not Tally(3).take([result("restarts", Verdict.WARN)], judging=True).restarted
    assert not registry.warmup_check("no such check")


def test_a_check_is_one_function_with_its_metadata() -> None:
    @check("quiet", warmup=True, reason=9)
    def quiet(run: object) -> CheckResult:
        return result("quiet", Verdict.PASS)

    assert isinstance(quiet, Check)
    assert (quiet.name, quiet.warmup, quiet.event, quiet.reason) == ("quiet", True, False, 9)
    assert quiet(Judge(ChecksSpec())) == [result("quiet", Verdict.PASS)]
    assert registry.CHECKS[0](Judge(ChecksSpec())) == []  # `run`: judged by the probe


def test_during_the_warmup_only_a_crash_a_fatal_sign_or_a_restart_counts() -> None:
    results = [
        result("alive", Verdict.PASS),
        result("samples", Verdict.FAIL, Failure.PENDING),
        result("queues.q_pre", Verdict.FAIL, Failure.IMMEDIATE),
        result("fatal", Verdict.FAIL),
    ]
    assert [r.name for r in counted(results, judging=False)] == ["alive", "fatal"]
    assert counted(results, judging=True) == results
    tally = Tally(failure_threshold=3)
    judged = tally.take(results, judging=False)
    assert not judged.immediate  # the queue does not count yet
    assert [r.name for r in judged.definite] == ["fatal"]
    assert (judged.failing, judged.passing, judged.unhealthy) == (1, 0, False)


@pytest.mark.parametrize("threshold", [1, 3])
def test_definite_failures_count_in_a_row_to_the_threshold(threshold: int) -> None:
    tally = Tally(failure_threshold=threshold)
    failing = [*passing(), result("loss", Verdict.FAIL)]
    for poll in range(1, threshold):
        judged = tally.take(failing, judging=True)
        assert (judged.unhealthy, judged.failing, judged.passing) == (False, poll, 0)
    judged = tally.take(failing, judging=True)
    assert judged.unhealthy and tally.streaks == {"loss": threshold}
    tally.take(passing(), judging=True)  # a passing poll ends the streak
    assert (tally.failing, tally.passing, tally.streaks) == (0, 1, {})


def test_an_immediate_failure_is_unhealthy_at_once_and_a_pending_one_never() -> None:
    tally = Tally(failure_threshold=3)
    pending = [*passing(), result("samples", Verdict.FAIL, Failure.PENDING)]
    for _ in range(10):
        judged = tally.take(pending, judging=True)
        assert not judged.unhealthy and judged.passing == 0 and judged.failing == 0
    judged = tally.take([result("alive", Verdict.FAIL, Failure.IMMEDIATE)], judging=False)
    assert judged.unhealthy and judged.failures == judged.immediate


def test_passing_polls_count_only_once_judging() -> None:
    tally = Tally(failure_threshold=3)
    assert tally.take(passing(), judging=False).passing == 0
    assert tally.take(passing(), judging=True).passing == 1
    warned = [*passing(), result("loss", Verdict.WARN)]
    assert tally.take(warned, judging=True).passing == 2  # a warning is no failure


def test_a_reason_names_the_most_telling_failure_first() -> None:
    failures = [
        result("loss", Verdict.FAIL),
        result("queues.q_pre", Verdict.FAIL),
        result("fatal", Verdict.FAIL),
        result("throughput", Verdict.FAIL),
        result("alive", Verdict.FAIL, Failure.IMMEDIATE),
    ]
    text = describe_failures(failures, {"loss": 3, "fatal": 3, "queues.q_pre": 3})
    assert text == (
        "alive observed; fatal observed; loss observed, for 3 polls; "
        "queues.q_pre: queues.q_pre observed, for 3 polls; throughput observed"
    )
    no_lines = [result("samples", Verdict.FAIL, Failure.PENDING), result("step", Verdict.FAIL)]
    no_lines.append(result("throughput", Verdict.FAIL, Failure.PENDING))
    assert probe_reason(no_lines, {}) == "samples observed; step observed"


def judgement(*, unhealthy: bool = False, passing: int = 0) -> Judgement:
    return Judgement([], [], [], unhealthy, 0, passing)


@pytest.mark.parametrize(
    ("judged", "judging", "window_over", "expected"),
    [
        (judgement(unhealthy=True), False, False, "unhealthy"),  # a crash counts in the warmup
        (judgement(unhealthy=True, passing=5), True, True, "unhealthy"),
        (judgement(passing=5), False, True, "pending"),  # the warmup judges nothing else
        (judgement(passing=3), True, False, "healthy"),
        (judgement(passing=3), True, True, "healthy"),  # the last poll of the window passes
        (judgement(passing=2), True, False, "pending"),
        (judgement(passing=2), True, True, "window over"),
        (judgement(), True, True, "window over"),
    ],
)
def test_one_outcome_rule_for_verify_and_watch(
    judged: Judgement, judging: bool, window_over: bool, expected: str
) -> None:
    assert outcome(judged, judging=judging, successes=3, window_over=window_over) == expected

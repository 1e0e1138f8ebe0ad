"""A run's whole life on recorded panes with a fake clock: its own cadence, finished and failed
runs, HF Trainer dicts without a bar, and the one-poll states of `status`."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher.core.errors import ExitCode
from launcher.probe.workflows import status_state
from launcher.verify.checks import Judge
from launcher.verify.formats import StatusSpec
from launcher.verify.lifecycle import State, ended, replacing, status_exit
from launcher.verify.pane import PaneState, Poll
from launcher.verify.parse import parse_pane
from launcher.verify.prober import Prober, ProbeResult, ProbeSettings, lasted
from launcher.verify.results import Verdict
from launcher.verify.samples import Sample
from launcher.verify.spec import ChecksSpec

PANES = Path(__file__).resolve().parent.parent / "fixtures"
DEMO = (PANES / "demo_pane_250col_joined.txt").read_text().splitlines()  # 80 DFlash lines
HF_DICTS = (PANES / "panes" / "hfdicts_250col_joined.txt").read_text().splitlines()
HF_STUCK = (PANES / "panes" / "hfdictsstuck_250col_joined.txt").read_text().splitlines()
HF = StatusSpec(preset="hf-trainer")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds


def recorded(
    lines: list[str], every: float, stop_at: float | None = None
) -> Callable[[float], str]:
    """The pane as it was `t` seconds in: one recorded line every `every` seconds, none after
    `stop_at` (a freeze: the pane alive, nothing more printed)."""

    def at(t: float) -> str:
        shown = int(min(t, stop_at if stop_at is not None else t) / every) + 1
        return "\n".join(lines[: min(shown, len(lines))])

    return at


def probe(
    pane: Callable[[float], str],
    clock: Clock,
    *,
    spec: ChecksSpec,
    status: StatusSpec | None = None,
    dead_at: float | None = None,
    exit_status: int = 0,
    finish_ok: bool = False,
    **settings: float,
) -> ProbeResult:
    def poll(timeout: float) -> PaneState:
        t = clock.now
        dead = dead_at is not None and t >= dead_at
        return PaneState(True, dead, exit_status if dead else None, None, pane(t))

    def parse(text: str, width: int | None) -> list[Sample]:
        return parse_pane(text, status, width=width)

    s = ProbeSettings(
        wait=settings.get("wait", 12),
        interval=settings.get("interval", 2),
        window=settings.get("window", 60),
        successes=int(settings.get("successes", 3)),
        finish_ok=finish_ok,
    )
    return Prober(poll, spec, s, clock=clock, sleep=clock.sleep, parse=parse).run()


DFLASH_SPEC = ChecksSpec.model_validate({"step": {"stall_after": 20}})


def test_a_fast_run_that_freezes_just_before_the_warmup_ends_is_not_healthy() -> None:
    # Status lines every 0.3 s until second 8, then nothing (a rank hung in all-reduce); the
    # warmup ends at 12. Counting any step younger than stall_after as progress passed it at 16.
    clock = Clock()
    result = probe(recorded(DEMO, 0.3, stop_at=8.0), clock, spec=DFLASH_SPEC)
    assert result.exit_code is ExitCode.UNHEALTHY, result.reason
    assert result.state is State.UNHEALTHY
    assert "unchanged for 2" in result.reason  # ended by stall_after (20 s), not the window
    assert 8 + 20 <= clock.now <= 8 + 20 + 2


def test_the_same_run_without_the_freeze_is_healthy() -> None:
    clock = Clock()
    result = probe(recorded(DEMO * 3, 0.3), clock, spec=DFLASH_SPEC)
    assert result.exit_code is ExitCode.OK, result.reason
    assert result.state is State.HEALTHY
    assert clock.now == pytest.approx(16)


def test_a_slow_trainer_passes_at_its_own_pace() -> None:
    # One status line every 30 s, polled every 10 s: the step holds for two polls in three.
    clock = Clock()
    spec = ChecksSpec.model_validate({"step": {"stall_after": 120}})
    result = probe(recorded(DEMO, 30.0), clock, spec=spec, wait=0, interval=10, window=300)
    assert result.exit_code is ExitCode.OK, result.reason
    assert result.state is State.HEALTHY


def test_a_poll_past_the_cadence_neither_passes_nor_fails_yet() -> None:
    judge = Judge(ChecksSpec(), live=True, interval=2.0)
    for t in (0.0, 2.0, 4.0, 6.0):
        capture = "\n".join(DEMO[: int(t) + 1])
        judge.add(Poll(t, PaneState(True, False, None, None, capture), tuple(parse_pane(capture))))
    assert judge.progress_window() == pytest.approx(4.0)  # twice its usual gap, 2 s
    capture = "\n".join(DEMO[:7])
    results = judge.add(
        Poll(11.0, PaneState(True, False, None, None, capture), tuple(parse_pane(capture)))
    )
    step = next(r for r in results if r.name == "step")
    assert step.verdict is Verdict.FAIL and step.kind is not None
    assert str(step.kind) == "pending", step
    assert "its usual gap 2 s" in step.observed


def test_hf_dicts_without_a_bar_are_healthy() -> None:
    # The epoch advances in the dicts; the format prints no rate and no queues: not reported.
    clock = Clock()
    result = probe(recorded(HF_DICTS, 3.0), clock, spec=ChecksSpec(), status=HF, wait=6)
    assert result.exit_code is ExitCode.OK, result.reason
    checks = {r.name: r for r in result.checks}
    assert checks["step"].verdict is Verdict.PASS and "epoch" in checks["step"].observed
    assert checks["throughput"].verdict is Verdict.SKIP
    assert checks["queues.q_pre"].verdict is Verdict.SKIP


def test_hf_bar_missing_from_the_captures_taken_while_tqdm_redraws_it() -> None:
    # ProgressCallback logs with tqdm.write: the bar is cleared, the dict printed and only then
    # the bar redrawn (tqdm/std.py, external_write_mode), so a capture can hold no bar at all.
    # Here every third poll falls in that window, the last one too: the step and the rate are
    # those of the bar last read, and the epoch in the dicts does not take the step's place.
    clock = Clock()

    def pane(t: float) -> str:
        logged = HF_DICTS[: int(t / 3.0) + 1]
        if int(t / 2.0) % 3 == 2:
            return "\n".join(logged)
        step = int(t * 10)
        bar = f"  1%|▏         | {step}/3000 [00:{int(t):02d}<04:58, 10.00it/s]"
        return "\n".join([*logged, bar])

    spec = ChecksSpec.model_validate({"throughput": {"min": 1}, "queues": {}})  # in it/s
    result = probe(pane, clock, spec=spec, status=HF, wait=6, window=30)
    assert result.exit_code is ExitCode.OK, result.reason
    barless = [p for p in result.polls if all(s.step is None for s in p.samples)]
    assert len(barless) >= 2 and result.polls[-1] in barless
    checks = {r.name: r for r in result.checks}
    assert re.match(r"step \d+,", checks["step"].observed), checks["step"].observed
    assert "10it/s" in checks["throughput"].observed, checks["throughput"].observed


def test_hf_dicts_with_a_loss_stuck_at_zero_and_nan_grad_norm_are_unhealthy() -> None:
    # From the 9th dict on (second 36) the loss prints as 0.0 and grad_norm as nan.
    clock = Clock()
    result = probe(recorded(HF_STUCK, 3.0), clock, spec=ChecksSpec(), status=HF, wait=40)
    assert result.exit_code is ExitCode.UNHEALTHY, result.reason
    assert "grad_norm=nan" in result.reason


def test_a_rate_the_playbook_asks_for_is_still_required() -> None:
    clock = Clock()
    spec = ChecksSpec.model_validate({"throughput": {"min": 0.5}, "queues": {}})
    result = probe(recorded(HF_DICTS, 3.0), clock, spec=spec, status=HF, wait=6, window=20)
    assert result.exit_code is ExitCode.UNHEALTHY
    assert "no throughput reported" in result.reason


def test_a_run_that_finishes_before_it_was_judged_is_not_healthy() -> None:
    # A debug max_steps left in: progress, then exit 0 at second 15, while the warmup (12 s)
    # is barely over: the probe never counted its passing polls.
    clock = Clock()
    result = probe(recorded(DEMO, 0.3), clock, spec=DFLASH_SPEC, dead_at=15.0)
    assert result.state is State.FINISHED and result.exit_code is ExitCode.UNHEALTHY
    assert "finished (exit 0) within 16 s of the probe's start at step" in result.reason
    assert "before it could be judged healthy" in result.reason
    assert "verify.finish_ok" in result.reason


def test_how_long_a_finished_run_lasted_comes_from_the_container_when_known() -> None:
    state = PaneState(True, True, 0, None, "", age=9.0, quiet_for=4.0)
    assert lasted(state, 30.0) == "after 5 s"
    assert lasted(PaneState(True, True, 0, None, ""), 30.0) == "within 30 s of the probe's start"


def test_a_run_meant_to_be_short_that_finishes_during_the_probe_is_finished_exit_0() -> None:
    clock = Clock()
    pane = recorded(DEMO, 0.3)
    result = probe(pane, clock, spec=DFLASH_SPEC, dead_at=15.0, finish_ok=True)
    assert result.state is State.FINISHED and result.exit_code is ExitCode.OK, result.reason
    assert "finished (exit 0) at step" in result.reason
    alive = next(r for r in result.checks if r.name == "alive")
    assert alive.verdict is Verdict.PASS


def test_a_run_that_exits_0_before_any_progress_proved_nothing() -> None:
    for finish_ok in (False, True):  # even a run meant to be short must show progress
        clock = Clock()
        result = probe(
            lambda t: "usage: train.py [-h]", clock, spec=DFLASH_SPEC, dead_at=1.0,
            finish_ok=finish_ok,
        )  # fmt: skip
        assert result.state is State.FINISHED and result.exit_code is ExitCode.UNHEALTHY
        assert "before any progress" in result.reason


def test_a_run_that_exits_non_zero_is_failed() -> None:
    clock = Clock()
    result = probe(recorded(DEMO, 0.3), clock, spec=DFLASH_SPEC, dead_at=5.0, exit_status=1)
    assert result.state is State.FAILED and result.exit_code is ExitCode.UNHEALTHY


# --- one poll: status -------------------------------------------------------------------------


def pane(**fields: object) -> PaneState:
    base: dict[str, object] = {
        "session_exists": True,
        "pane_dead": False,
        "dead_status": None,
        "exit_code": None,
        "capture": "",
    }
    return PaneState(**{**base, **fields})  # type: ignore[arg-type]


OTHER_SHAPE = "step 1 | loss 2.5\nstep 2 | loss 2.4\nstep 3 | loss 2.3"


def status_of(state: PaneState, wait: float = 40, window: float = 60) -> State:
    samples = tuple(parse_pane(state.capture))
    checks = Judge(ChecksSpec()).add(Poll(0.0, state, samples))
    return status_state(state, checks, wait, window)[0]


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (pane(capture="Loading model...", age=1.0), State.STARTING),  # second 1 of a 40 s load
        (pane(capture="Loading model...", age=70.0), State.STARTING),  # no line, window open
        (pane(capture="Loading model...", age=120.0), State.UNHEALTHY),  # window over
        (pane(capture="Loading model..."), State.UNHEALTHY),  # age unknown: judged at once
        # Lines of another format: past the warmup they will not turn into DFlash lines.
        (pane(capture=OTHER_SHAPE, age=70.0), State.UNHEALTHY),
        (pane(capture=OTHER_SHAPE, age=1.0), State.STARTING),
        # Two such lines may be a start-up evaluation's: the run may still be starting.
        (pane(capture="step 0 | loss 10.9\nstep 0 | loss 10.8", age=70.0), State.STARTING),
        # A fatal sign already shows: not starting any more.
        (
            pane(capture="Traceback (most recent call last)\n  x\nValueError", age=1),
            State.UNHEALTHY,
        ),
        (pane(capture="\n".join(DEMO)), State.HEALTHY),
        (pane(pane_dead=True, dead_status=0, capture=DEMO[0]), State.FINISHED),
        (pane(pane_dead=True, dead_status=1, capture=DEMO[0]), State.FAILED),
        (pane(session_exists=False, exit_code=0), State.FINISHED),
        (pane(session_exists=False, exit_code=130, stopped=True), State.STOPPED),
        (pane(session_exists=False), State.ABSENT),
        (pane(session_exists=False, deploy_lock="ops@laptop"), State.DEPLOYING),
        (pane(capture="\n".join(DEMO), deploy_lock="ops@laptop"), State.DEPLOYING),
    ],
)
def test_status_states(state: PaneState, expected: State) -> None:
    assert status_of(state) is expected


def test_one_rule_says_a_deploy_is_replacing_the_run_for_verify_and_watch() -> None:
    """The run gone or going while a deploy holds the lock: the probe waits (its `replacing`
    phase), the watch's judge reports nothing, status says deploying; a live run is judged."""
    from launcher.watch.judging import JudgeSettings, RunJudge

    going = pane(pane_dead=True, dead_status=143, deploy_lock="ops@laptop")
    why = "a deploy is replacing the run (lock held by ops@laptop)"
    assert replacing(going) == why and ended(going) is State.DEPLOYING
    assert replacing(pane(session_exists=False, deploy_lock="ops@laptop")) == why
    assert replacing(pane(deploy_lock="ops@laptop")) is None  # alive: judged as it is
    assert replacing(pane(session_exists=False)) is None
    settings = JudgeSettings(0.0, 60.0, 1, 3, 50)
    watched = RunJudge(ChecksSpec(), settings, lambda text, width: [], []).observe(going, 0.0)
    assert (watched.verdict, watched.reason) == ("replacing", why)


def test_a_crash_in_the_warmup_is_not_starting() -> None:
    dead = pane(pane_dead=True, dead_status=1, capture="Traceback", age=1.0)
    assert status_of(dead) is State.FAILED


def test_status_exit_codes() -> None:
    ok = {State.HEALTHY, State.STARTING, State.DEPLOYING, State.FINISHED}
    for state in State:
        expected = ExitCode.OK if state in ok else ExitCode.UNHEALTHY
        assert status_exit(state) is expected, state


def test_ended_prefers_the_tmux_status_to_the_exit_file() -> None:
    assert ended(pane(pane_dead=True, dead_status=0, exit_code=1)) is State.FINISHED
    assert ended(pane()) is None


def test_hf_dicts_whose_loss_reads_exactly_zero_are_unhealthy() -> None:
    # transformers before 4.38 logs no grad_norm, and its NaN filter logs an all-NaN interval as
    # 'loss': 0.0: the loss alone must tell. From the 5th dict on (second 24) it reads 0.0.
    lines = [
        re.sub(r"'loss': [0-9.e+-]+", "'loss': 0.0", re.sub(r"'grad_norm': [^,]+, ", "", line))
        if index >= 8
        else re.sub(r"'grad_norm': [^,]+, ", "", line)
        for index, line in enumerate(HF_DICTS)
    ]
    assert "'loss': 0.0" in lines[8] and "grad_norm" not in lines[8]
    clock = Clock()
    result = probe(recorded(lines, 3.0), clock, spec=ChecksSpec(), status=HF, wait=30)
    assert result.exit_code is ExitCode.UNHEALTHY, result.reason
    assert "loss exactly 0" in result.reason


def test_a_loss_that_reads_zero_once_is_not_a_failure() -> None:
    lines = [
        re.sub(r"'loss': [0-9.e+-]+", "'loss': 0.0", line) if index == 8 else line
        for index, line in enumerate(HF_DICTS)
    ]
    clock = Clock()
    result = probe(recorded(lines, 3.0), clock, spec=ChecksSpec(), status=HF, wait=30)
    assert result.exit_code is ExitCode.OK, result.reason

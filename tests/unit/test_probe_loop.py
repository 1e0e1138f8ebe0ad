"""The probe loop on recorded panes with a fake clock: no test waits for real."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from launcher.core.errors import CommandTimeout, ConnectError, ContainerError, ExitCode
from launcher.verify.pane import PaneState
from launcher.verify.prober import POLL_FLOOR, Prober, ProbeResult, ProbeSettings
from launcher.verify.results import CheckResult, Verdict
from launcher.verify.spec import ChecksSpec


def by_name(results: Sequence[CheckResult]) -> dict[str, CheckResult]:
    return {r.name: r for r in results}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def status_line(
    minute: int, step: int, loss: str, ktok: float, q_pre: str = "8, 6, 6, 5, 4, 4"
) -> str:
    return (
        f"[{minute}m] step={step} loss={loss} acc=0.000 streak=0.0 lr=6.00e-04 noise=0.1000 | "
        f"tgt=0.30b/s dft=0.05b/s ({ktok:.1f}Ktok/s) | q_pre=[{q_pre}] q_hs=[4] | "
        "epoch~0.00 ETA=10.9d"
    )


def healthy_pane(clock: FakeClock, start: float) -> PaneState:
    """A trainer whose step advances and whose throughput ramps to a plateau with time."""
    t = clock.now - start
    lines = ["Starting pipeline...", "Pipeline running. Monitoring..."]
    for i in range(int(t) + 1):
        ktok = min(28.0, 2.0 + 3.0 * i)
        lines.append(status_line(i // 60, i, f"{6.0 - 0.01 * i:.4f}", ktok))
    return PaneState(True, False, None, None, "\n".join(lines[-200:]))


def make(pane: Callable[[], PaneState], clock: FakeClock, **settings: float) -> Prober:
    s = ProbeSettings(
        wait=settings.get("wait", 20),
        interval=settings.get("interval", 2),
        window=settings.get("window", 30),
        successes=int(settings.get("successes", 3)),
    )
    spec = ChecksSpec(throughput={"min": 1000, "target": 20000})  # type: ignore[arg-type]
    return Prober(lambda timeout: pane(), spec, s, clock=clock, sleep=clock.sleep)


def test_healthy_run_passes_after_k_polls() -> None:
    clock = FakeClock()
    start = clock.now
    result = make(lambda: healthy_pane(clock, start), clock).run()
    assert result.exit_code == ExitCode.OK, result.reason
    assert result.verdict == "healthy"
    # warmup 20 s, then 3 passing polls 2 s apart
    assert clock.now - start == pytest.approx(24)


def test_crash_during_warmup_fails_within_one_interval() -> None:
    clock = FakeClock()
    start = clock.now

    def pane() -> PaneState:
        if clock.now - start < 5:
            return healthy_pane(clock, start)
        text = 'Traceback (most recent call last):\n  File "t.py", line 1\nRuntimeError: boom'
        return PaneState(True, True, 1, 1, text)

    result = make(pane, clock, wait=180, interval=2).run()
    assert result.exit_code == ExitCode.UNHEALTHY
    assert clock.now - start <= 5 + 2
    assert "Traceback (most recent call last):" in result.last_lines()


def test_drained_queues_end_the_probe_right_after_the_warmup() -> None:
    # Empty for failure_threshold polls already when the warmup ends: no need to wait longer.
    clock = FakeClock()
    stalled = "\n".join(status_line(0, 7, "5.0", 0.0, "0, 0, 0, 0, 0, 0") for _ in range(3))
    result = make(
        lambda: PaneState(True, False, None, None, stalled), clock, wait=4, window=10
    ).run()
    assert result.exit_code == ExitCode.UNHEALTHY
    assert {r.name for r in result.checks if r.verdict == "fail"} >= {"queues.q_pre", "throughput"}
    assert clock.now - 1000.0 == pytest.approx(4)


def test_window_runs_out_when_checks_are_only_pending() -> None:
    # No status line at all: it may yet come, so only the end of the window decides.
    clock = FakeClock()
    pane = PaneState(True, False, None, None, "Loading shards...")
    result = make(lambda: pane, clock, wait=4, window=10).run()
    assert result.exit_code == ExitCode.UNHEALTHY
    assert result.reason.startswith("samples: no status line")
    assert clock.now - 1000.0 == pytest.approx(14)


def test_unreachable_is_retried_then_exit_3() -> None:
    clock = FakeClock()

    def pane() -> PaneState:
        raise ConnectError("sandbox: cannot connect: refused")

    result = make(pane, clock).run()
    assert result.exit_code == ExitCode.UNREACHABLE
    assert "3 polls in a row" in result.reason


def test_one_unreachable_poll_does_not_fail_a_healthy_run() -> None:
    clock = FakeClock()
    start = clock.now
    blips = iter([True])

    def pane() -> PaneState:
        if clock.now - start > 21 and next(blips, False):
            raise ConnectError("blip")
        return healthy_pane(clock, start)

    assert make(pane, clock).run().exit_code == ExitCode.OK


def test_stopped_container_is_unreachable_at_once() -> None:
    clock = FakeClock()

    def pane() -> PaneState:
        raise ContainerError("sandbox: container 200 not running")

    result = make(pane, clock).run()
    assert result.exit_code == ExitCode.UNREACHABLE
    assert clock.sleeps == []


# --- recorded runs: every kind of failure and of health, on the fake clock --------------------


@dataclass
class Recording:
    """A trainer's pane over time: each line stamped with the second it was printed."""

    lines: list[tuple[float, str]] = field(default_factory=list)
    pids: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 100)])
    runs: list[tuple[float, str | None]] = field(default_factory=lambda: [(0.0, "train:aaa")])
    dead_at: float | None = None
    gone: tuple[float, float] | None = None  # the session missing in this time span
    locked: tuple[float, float] | None = None  # a deploy holds the lock in this time span

    def print(self, at: float, *lines: str) -> None:
        self.lines.extend((at, line) for line in lines)

    def state(self, t: float) -> PaneState:
        def latest(changes: list[tuple[float, Any]]) -> Any:
            return [value for since, value in changes if since <= t][-1]

        text = "\n".join(line for at, line in self.lines if at <= t)
        lock = "ann@ws" if self.locked and self.locked[0] <= t < self.locked[1] else None
        if self.gone and self.gone[0] <= t < self.gone[1]:
            return PaneState(False, False, None, None, "", deploy_lock=lock)
        dead = self.dead_at is not None and t >= self.dead_at
        if dead:
            text += "\nPane is dead (status 1, Mon Nov 30 22:56:20 2026)"
        return PaneState(
            True,
            dead,
            1 if dead else None,
            1 if dead else None,
            "\n".join(text.splitlines()[-400:]),
            pane_pid=latest(self.pids),
            run=latest(self.runs),
            deploy_lock=lock,
        )


BANNER = ("Starting pipeline...", "Pipeline running. Monitoring...")


def dflash(
    t: float, step: int, loss: float | str, ktok: float, q_pre: str = "8, 7, 6, 6, 5, 4", extra=""
) -> str:
    loss_text = loss if isinstance(loss, str) else f"{loss:.4f}"
    return (
        f"[{int(t // 60)}m] step={step} loss={loss_text} acc=0.300 lr=6.00e-04{extra} | "
        f"tgt=1.20b/s dft=0.70b/s ({ktok:.1f}Ktok/s) | q_pre=[{q_pre}] q_hs=[4] | "
        "epoch~0.01 ETA=4.4d"
    )


def train(
    rec: Recording,
    start: float,
    end: float,
    *,
    step: int = 0,
    banner: bool = True,
    ktok: Callable[[float], float] = lambda t: 28.0,
    loss: Callable[[float], float | str] | None = None,
    q_pre: Callable[[float], str] = lambda t: "8, 7, 6, 6, 5, 4",
    extra: Callable[[float], str] = lambda t: "",
    seed: int = 1,
) -> int:
    """A trainer printing one status line a second from `start` to `end`; its last step."""
    rng = random.Random(seed)
    if banner:
        rec.print(start, *BANNER)
    t = start
    while t < end:
        step += 1
        value = loss(t) if loss else 2.0 + 4.0 * math.exp(-step / 40) + rng.uniform(-0.05, 0.05)
        speed = ktok(t) * (1 + rng.uniform(-0.03, 0.03))
        rec.print(t, dflash(t, step, value, speed, q_pre(t), extra(t)))
        t += 1.0
    return step


def probe(
    rec: Recording,
    *,
    wait: float = 10,
    interval: float = 2,
    window: float = 60,
    successes: int = 100,
    **spec: Any,
) -> tuple[ProbeResult, float]:
    """Verify the recording; the result and when it ended (seconds after the first poll)."""
    clock = FakeClock()
    start = clock.now
    settings = ProbeSettings(wait, interval, window, successes, spec.pop("failure_threshold", 3))
    checks = ChecksSpec.model_validate({"throughput": {"min": 1000}, **spec})
    prober = Prober(lambda timeout: rec.state(clock.now - start), checks, settings, clock=clock,
                    sleep=clock.sleep)  # fmt: skip
    result = prober.run()
    return result, clock.now - start


def failed(result: ProbeResult) -> set[str]:
    return {r.name for r in result.checks if r.verdict is Verdict.FAIL}


# Definite failures: exit 1 within failure_threshold x interval of the first poll that sees them.
THRESHOLD_TIME = 3 * 2


def test_plateau_with_noise_is_healthy() -> None:
    rec = Recording()
    train(rec, -100, 200, ktok=lambda t: min(28.0, 4.0 * (t + 101)))
    result, elapsed = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    assert elapsed == pytest.approx(14)
    assert by_name(result.checks)["throughput"].observed.endswith("(steady)")


def test_slow_warmup_keeps_polling_until_it_passes() -> None:
    # Throughput still below the floor when the warmup ends, but rising: not failing yet.
    rec = Recording()
    train(rec, 0, 200, ktok=lambda t: 0.05 * t)
    result, elapsed = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    assert 20 < elapsed < 30  # crosses 1 Ktok/s at 20 s


def test_flat_below_the_floor_fails_definitely() -> None:
    rec = Recording()
    train(rec, 0, 200, ktok=lambda t: 0.5)
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert elapsed <= 10 + THRESHOLD_TIME
    assert result.reason.startswith("throughput: ") and "(below minimum)" in result.reason


def test_bursty_queues_are_healthy() -> None:
    # The last bucket fills once every three seconds, each other bucket always.
    rec = Recording()
    train(rec, 0, 200, q_pre=lambda t: "8, 7, 6, 6, 5, " + ("3" if int(t) % 3 == 0 else "0"))
    result, _ = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason


def test_drained_queues_fail_after_the_threshold() -> None:
    rec = Recording()
    train(rec, 0, 200, q_pre=lambda t: "8, 7, 6, 6, 5, 4" if t < 20 else "8, 7, 0, 6, 5, 4")
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert result.reason == "q_pre=[8, 7, 0, 6, 5, 4] (bucket 3 empty in 3 polls)"


def test_throughput_sag_fails_with_the_peak_in_the_reason() -> None:
    rec = Recording()
    train(rec, 0, 200, ktok=lambda t: 28.0 if t < 20 else 7.0)
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert re.fullmatch(
        r"throughput 7\.\d Ktok/s, 2\d % of this run's peak 2\d\.\d Ktok/s, for 3 polls",
        result.reason,
    ), result.reason


def test_nan_loss_fails_after_the_threshold() -> None:
    rec = Recording()
    train(rec, 0, 200, loss=lambda t: 3.0 if t < 20 else "nan")
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert result.reason == "loss=nan, for 3 polls"


def test_nan_grad_norm_fails_while_the_loss_looks_fine() -> None:
    rec = Recording()
    train(rec, 0, 200, extra=lambda t: " grad_norm=" + ("0.84" if t < 20 else "nan"))
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert result.reason.startswith("finite: grad_norm=nan (while loss=")


def test_loss_diverged_to_the_ceiling_fails() -> None:
    rec = Recording()
    train(rec, 0, 200, loss=lambda t: 1.4 + 0.01 * (t % 3) if t < 20 else 10.3 + 0.01 * (t % 3))
    result, elapsed = probe(rec, loss={"ceiling": 10.4, "max_rise": None})
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert result.reason.startswith("loss 10.3") and "near the ceiling 10.4" in result.reason


def test_loss_risen_far_above_its_lowest_fails() -> None:
    rec = Recording()
    train(rec, 0, 200, loss=lambda t: 1.4 + 0.01 * (t % 3) if t < 20 else 4.0 + 0.01 * (t % 3))
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME
    assert "from this run's lowest 1.4" in result.reason


def test_loss_at_the_ceiling_from_the_start_is_only_pending() -> None:
    rec = Recording()
    train(rec, 0, 200, loss=lambda t: 10.35)
    result, elapsed = probe(rec, window=20, loss={"ceiling": 10.4})
    assert result.exit_code == ExitCode.UNHEALTHY
    assert elapsed == pytest.approx(30)  # the window's end, not the threshold
    assert "(not learning yet)" in result.reason


def test_hang_with_the_pane_alive_fails_at_stall_after() -> None:
    rec = Recording()
    train(rec, 0, 20)  # then silence
    result, elapsed = probe(rec, step={"stall_after": 8})
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 19 + 8 <= elapsed <= 19 + 8 + 2
    assert result.reason.startswith("step 20 unchanged for")


def crash_loop(
    rec: Recording, *, attempts: int, every: float = 10, first: float = 0, last: float = 0
) -> None:
    """A shell loop: each attempt resumes from the last checkpoint (every 5 steps) and is killed
    after `every` seconds; the last one runs on for `last` seconds more."""
    step, t = 0, first
    for attempt in range(attempts):
        rec.print(t, *BANNER)
        if step:
            rec.print(t, f"Resuming from checkpoints/step_{step}.pt")
        final = attempt == attempts - 1
        step = train(rec, t + 0.5, t + every - 0.5 + (last if final else 0), step=step,
                     banner=False)  # fmt: skip
        if not final:
            rec.print(t + every - 0.4, "Killed")
        step -= step % 5
        t += every


def test_crash_loop_under_a_shell_loop_is_a_restart() -> None:
    rec = Recording()
    crash_loop(rec, attempts=30)
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert elapsed <= 10 + THRESHOLD_TIME  # the restart at 10 s, seen during the warmup
    assert result.reason.startswith("restarted once (step 9 → 6 at 10 s)"), result.reason
    assert "restarts" in failed(result)


def test_torchrun_worker_group_restart_is_a_restart() -> None:
    rec = Recording()
    step = train(rec, 0, 15)
    rec.print(
        15,
        "[E ProcessGroupNCCL.cpp:475] Some NCCL operations have failed or timed out.",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 3"
        " (pid: 4242) of binary: /usr/bin/python3",
        "WARNING:torch.distributed.elastic.agent.server.api:[default] Worker group FAILED. "
        "3/3 attempts left; will restart worker group",
    )
    train(rec, 17, 200, step=step - step % 10)
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 16 < elapsed <= 16 + THRESHOLD_TIME
    assert result.reason.startswith("restarted once (step 15 → 11 at 16 s)"), result.reason


def test_new_process_behind_the_pane_is_a_restart() -> None:
    rec = Recording(pids=[(0.0, 100), (20.0, 200)])
    train(rec, 0, 200)
    result, _ = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert "new process behind the pane (pid 100 → 200)" in result.reason


def test_one_resume_at_the_start_is_healthy() -> None:
    rec = Recording()
    rec.print(0, *BANNER, "Resuming from checkpoints/step_40.pt")
    train(rec, 1, 200, step=40, banner=False)
    result, _ = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    assert by_name(result.checks)["restarts"].verdict is Verdict.PASS


def test_one_restart_before_the_probe_is_forgiven_two_are_a_loop() -> None:
    once = Recording()
    crash_loop(once, attempts=2, first=-20, last=200)  # restarted at -10 s, then runs for good
    result, _ = probe(once, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    assert by_name(result.checks)["restarts"].verdict is Verdict.WARN
    looping = Recording()
    crash_loop(looping, attempts=30, first=-25)
    result, _ = probe(looping, wait=0)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert result.reason.startswith("restarted 2 times (step 9 → 6 before the probe")


def test_ranks_printing_in_turn_are_not_restarts() -> None:
    rec = Recording()
    rec.print(0, *BANNER)
    for i in range(200):
        rec.print(i, dflash(i, i + 1, 3.0, 28.0), dflash(i, i, 3.0, 28.0))  # rank 1 a step late
    result, _ = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason


FINALISER = """\
Exception ignored in: <function _MultiProcessingDataLoaderIter.__del__ at 0x7f2c2c1f1ee0>
Traceback (most recent call last):
  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1478, in __del__
    self._shutdown_workers()
  File "/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py", line 1461, in _shutdown_workers
    if w.is_alive():
  File "/usr/lib/python3.11/multiprocessing/process.py", line 160, in is_alive
    assert self._parent_pid == os.getpid(), 'can only test a child process'
AssertionError: can only test a child process"""  # noqa: E501


def test_finaliser_noise_is_a_warning_not_a_verdict() -> None:
    rec = Recording()
    step = train(rec, 0, 12)
    rec.print(12, *FINALISER.splitlines())
    train(rec, 12.5, 200, step=step, banner=False)
    result, _ = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    fatal = by_name(result.checks)["fatal"]
    assert fatal.verdict is Verdict.WARN
    assert fatal.observed.startswith("finaliser noise, harmless: Exception ignored in")


def test_traceback_the_run_went_on_after_is_a_warning() -> None:
    rec = Recording()
    step = train(rec, 0, 12)
    rec.print(
        12,
        "Traceback (most recent call last):",
        '  File "train.py", line 80, in log_metrics',
        "    wandb.log(metrics)",
        "ConnectionError: wandb upload failed",
    )
    train(rec, 12.5, 200, step=step, banner=False)
    result, _ = probe(rec, successes=3)
    assert result.exit_code == ExitCode.OK, result.reason
    assert by_name(result.checks)["fatal"].observed.endswith("(the run went on: step 12 → 13)")


def test_traceback_then_nothing_is_fatal_with_the_pane_alive() -> None:
    rec = Recording()
    train(rec, 0, 20)
    rec.print(20, "Traceback (most recent call last):", '  File "train.py", line 9',
              "RuntimeError: NCCL error: unhandled cuda error")  # fmt: skip
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert 20 < elapsed <= 20 + THRESHOLD_TIME + 2 * 2  # the trainer's own pace: 2 of its lines
    assert result.reason == (
        "fatal: Traceback (most recent call last): … RuntimeError: NCCL error: unhandled cuda error"
    )


def test_run_replaced_mid_probe_ends_it() -> None:
    rec = Recording(runs=[(0.0, "train:aaa"), (13.0, "train:bbb")])
    train(rec, 0, 200)
    result, elapsed = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert elapsed == pytest.approx(14)
    assert result.reason == "run replaced by train:bbb"
    assert result.run == "train:aaa"
    assert by_name(result.checks)["run"].verdict is Verdict.FAIL


def test_a_deploy_replacing_the_run_is_waited_for() -> None:
    # The old run is stopped and its session killed while a deploy holds the lock.
    rec = Recording(runs=[(0.0, "train:aaa"), (17.0, "train:bbb")], locked=(11.0, 18.0))
    rec.dead_at = 12.0
    rec.gone = (14.0, 17.0)
    train(rec, 0, 200)
    result, _ = probe(rec)
    assert result.exit_code == ExitCode.UNHEALTHY
    assert result.reason == "run replaced by train:bbb"


def test_each_poll_is_bounded_by_command_timeout_and_what_is_left() -> None:
    clock = FakeClock()
    deadlines: list[float] = []

    def hung(timeout: float) -> PaneState:
        deadlines.append(timeout)
        clock.now += timeout
        raise CommandTimeout(f"command did not finish within {timeout:g} s")

    settings = ProbeSettings(wait=5, interval=1, window=3, successes=3, poll_timeout=60)
    result = Prober(hung, ChecksSpec(), settings, clock=clock, sleep=clock.sleep).run()
    assert result.exit_code == ExitCode.UNREACHABLE
    assert deadlines == [10.0]  # what is left (8 s) but at least POLL_FLOOR, under 60
    assert result.duration <= 5 + 3 + POLL_FLOOR
    settings = ProbeSettings(wait=5, interval=1, window=300, successes=3, poll_timeout=4)
    deadlines.clear()
    Prober(hung, ChecksSpec(), settings, clock=clock, sleep=clock.sleep).run()
    assert deadlines == [4.0, 4.0, 4.0]


def test_lines_of_another_shape_fail_within_wait_plus_two_intervals_with_a_block() -> None:
    """The issue's trainer: a line a second, none of them DFlash's. Before, the probe said
    "no status lines yet" until the window ended (5.5 min); now the warmup notes it, with
    the block that reads them, and the first judged poll fails."""
    clock = FakeClock()
    start = clock.now

    def pane() -> PaneState:
        t = int(clock.now - start)
        lines = [
            "Starting the run",
            *(
                f"step {i} | loss {3 - i / 100:.2f} | tok/s 5067{i % 10} | "
                "q_pre 13/16 | q_post 3/16"
                for i in range(t + 1)
            ),
        ]
        return PaneState(True, False, None, None, "\n".join(lines[-200:]))

    events: list[Any] = []
    s = ProbeSettings(wait=30, interval=10, window=300, successes=3)
    prober = Prober(
        lambda timeout: pane(), ChecksSpec(), s, clock=clock, sleep=clock.sleep,
        on_event=events.append,
    )  # fmt: skip
    result = prober.run()
    assert result.exit_code == ExitCode.UNHEALTHY
    assert clock.now - start <= s.wait + 2 * s.interval
    assert result.reason.startswith("samples: no status line in 32 captured lines: 31 read as")
    assert "`status: {format: keyvalue, fields: {throughput: tok/s, throughput_unit: tok/s}}`" in (
        result.reason
    )
    assert "`step 30 | loss 2.70 | tok/s 50670 | q_pre 13/16 | q_post 3/16`" in result.reason
    # From the second line on, the warmup's polls carry the note (the CLI says it once).
    noted = [
        e for e in events if "status:\n  format: keyvalue" in by_name(e.checks)["samples"].observed
    ]
    assert noted and noted[0].phase == "warmup" and noted[0].elapsed <= s.interval

"""The probe loop on recorded panes with a fake clock: no test waits for real."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from launcher.checks import ChecksSpec, PaneState
from launcher.errors import ConnectError, ContainerError, ExitCode
from launcher.verify import Prober, ProbeSettings


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
    return Prober(pane, spec, s, clock=clock, sleep=clock.sleep)


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


def test_window_runs_out_when_checks_keep_failing() -> None:
    clock = FakeClock()
    stalled = "\n".join(status_line(0, 7, "5.0", 0.0, "0, 0, 0, 0, 0, 0") for _ in range(3))
    result = make(
        lambda: PaneState(True, False, None, None, stalled), clock, wait=4, window=10
    ).run()
    assert result.exit_code == ExitCode.UNHEALTHY
    assert {r.name for r in result.checks if r.verdict == "fail"} >= {"queues.q_pre", "throughput"}
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

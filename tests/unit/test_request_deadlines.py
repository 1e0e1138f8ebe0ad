"""No request acts after its client gave up: the deadline a changing request carries, the run a
stop names, and what a client that stopped waiting says (a CT frozen by a backup: paused)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from launcher.agent import base as agent_base
from launcher.agent import deploy as agent_deploy
from launcher.agent import params as agent_params
from launcher.agent import stop as agent_stop
from launcher.agent.base import AgentError, host_stamp
from launcher.container import ctstate
from launcher.container.agentclient import (
    DIAGNOSIS_LIMIT,
    AgentClient,
    agent_deadline,
    split_timeout,
    with_deadline,
)
from launcher.container.pct import Container, split_stamped, stamped_command
from launcher.core.errors import CommandTimeout, ExitCode, PausedError
from tests.unit.fakehost import StrictFakeHost

NOW = 1_800_000_000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The agent's clock, set by the test: [now]; the host received the request at NOW."""
    now = [NOW]
    monkeypatch.setattr(agent_params.time, "time", lambda: now[0])
    monkeypatch.setattr(agent_base.time, "time", lambda: now[0])
    monkeypatch.setattr(agent_base, "RECEIVED", [NOW])
    return now


# --------------------------------------------------------------------------- the agent's side


def test_the_deadline_counts_from_when_the_host_received_the_request(clock: list[float]) -> None:
    deadline = agent_params.deadline_param({"deadline": 30})
    assert deadline == NOW + 30
    clock[0] = NOW + 29.9
    agent_params.check_deadline(deadline, "the stop")  # still in time
    clock[0] = NOW + 70
    with pytest.raises(AgentError) as refused:
        agent_params.check_deadline(deadline, "the stop")
    assert refused.value.kind == "expired"
    assert refused.value.message.startswith("refused: the client gave up at ")
    assert "30 s after the request reached the host" in refused.value.message
    assert "the stop was not started, nothing was changed" in refused.value.message


def test_no_deadline_waits_for_as_long_as_it_takes(clock: list[float]) -> None:
    assert agent_params.deadline_param({}) is None
    clock[0] = NOW + 10**6
    agent_params.check_deadline(None, "the stop")


@pytest.mark.parametrize("bad", [-1, float("nan"), 10**9, "30", True])
def test_a_bad_deadline_is_invalid(bad: object, clock: list[float]) -> None:
    with pytest.raises(AgentError) as error:
        agent_params.deadline_param({"deadline": bad})
    assert error.value.kind == "invalid"


def test_the_host_stamp_is_the_agents_last_argument() -> None:
    assert host_stamp(["-c", "1733580000.123456789"]) == pytest.approx(1733580000.123456789)
    # BOOT run by hand (no stamp) or garbage: the agent's own start stands in.
    assert host_stamp(["-c"]) is None
    assert host_stamp(["-c", "%N"]) is None
    assert host_stamp(["-c", "nan"]) is None


def test_a_stamp_from_the_future_counts_as_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_base, "RECEIVED", [NOW + 500])
    monkeypatch.setattr(agent_base.time, "time", lambda: NOW)
    assert agent_base.request_received() == NOW


def session(run: str | None) -> dict[str, Any]:
    return {"exists": run is not None, "pane_dead": False, "dead_status": None,
            "pane_pid": 7 if run else None, "width": 250, "run": run, "created": None}  # fmt: skip


@pytest.mark.parametrize(
    ("expected", "live", "refused"),
    [
        ("demo:A", "demo:A", False),  # the run named is live: stopped
        ("demo:A", "demo:B", True),  # another run replaced it: not touched
        (None, "demo:B", True),  # the client saw no launcher run; one started since
        ("demo:A", None, False),  # it ended (or a session by hand): nothing of B's to hit
    ],
)
def test_a_stop_touches_only_the_run_it_names(
    monkeypatch: pytest.MonkeyPatch, expected: str | None, live: str | None, refused: bool
) -> None:
    monkeypatch.setattr(agent_stop, "session_state", lambda name: session(live))
    request = {"op": "stop", "session": "demo", "expect_run": expected}
    if not refused:
        agent_stop.check_expected_run(request, "demo")
        return
    with pytest.raises(AgentError) as error:
        agent_stop.check_expected_run(request, "demo")
    assert error.value.kind == "refused" and "not stopped" in error.value.message
    assert f"(now {live})" in error.value.message


def test_a_stop_without_a_named_run_stops_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_stop, "session_state", lambda name: pytest.fail("not asked"))
    agent_stop.check_expected_run({"op": "stop", "session": "demo"}, "demo")


def test_an_expired_stop_is_refused_before_the_lock_or_the_run(
    clock: list[float], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(agent_stop, "stop_run", lambda *a, **k: pytest.fail("stopped a run"))
    monkeypatch.setattr(agent_stop.DeployLock, "acquire", lambda *a: pytest.fail("locked"))
    clock[0] = NOW + 70
    request = {"op": "stop", "session": "demo", "deadline": 25.0,
               "lock_path": str(tmp_path / "lock"), "expect_run": "demo:A"}  # fmt: skip
    with pytest.raises(AgentError) as error:
        agent_stop.op_stop(request, [])
    assert error.value.kind == "expired"


def transaction(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"op": "apply", "workdir": str(tmp_path / "w"), "session": "demo",
            "command": "python3 train.py", "dest": "train.py", "sha256": "0" * 64,
            "restart": True, "lock_path": str(tmp_path / "lock"), **extra}  # fmt: skip


def test_a_deploy_held_up_in_its_checks_does_not_begin_after_its_deadline(
    clock: list[float], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A deploy frozen mid-way: the checks were under way when the CT froze; after the
    thaw the transaction must not stop the old run and launch the new one."""

    def frozen_check(state: agent_deploy.DeployState) -> tuple[str, str]:
        clock[0] = NOW + 40  # the CT thaws 40 s later; the client gave up at 12 s
        return "ok", "checked"

    monkeypatch.setattr(agent_deploy, "checks", lambda state: [("verify", frozen_check)])
    monkeypatch.setattr(agent_deploy, "start_queries", lambda state: None)
    for step in ("install", "stop_old", "launch"):
        monkeypatch.setattr(agent_deploy, step, lambda state: pytest.fail("changed"))
    state = agent_deploy.DeployState(transaction(tmp_path, deadline=12.0), [])
    error, result = agent_deploy.run_transaction(state)
    assert error is not None and error.kind == "expired"
    assert "the deploy's first change was not started" in error.message
    assert [s["name"] for s in result["steps"]] == ["verify"]
    assert result["stopped"] is None and result["launched"] is None


def test_a_deploy_that_arrives_late_runs_no_check(
    clock: list[float], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(agent_deploy, "checks", lambda state: pytest.fail("checked"))
    clock[0] = NOW + 71  # pct stalled 70 s on the host
    state = agent_deploy.DeployState(transaction(tmp_path, deadline=12.0), [])
    error, result = agent_deploy.run_transaction(state)
    assert error is not None and error.kind == "expired" and result["steps"] == []


def test_a_plan_has_no_deadline(clock: list[float], tmp_path: Path) -> None:
    state = agent_deploy.DeployState(transaction(tmp_path, deadline=1.0, plan=True), [])
    assert state.deadline is None


# --------------------------------------------------------------------------- the client's side


def test_the_deadline_ends_before_the_client_stops_waiting() -> None:
    wait, reserve = split_timeout(63.0)
    assert wait is not None and wait + reserve == 63.0 and reserve == DIAGNOSIS_LIMIT
    assert agent_deadline(wait) == wait - 2.0
    assert split_timeout(None) == (None, 0.0)
    assert split_timeout(3.0) == (3.0, 0.0)  # too short to ask the host anything
    assert agent_deadline(5.0) == 4.5


def test_only_changing_requests_carry_a_deadline() -> None:
    assert with_deadline({"op": "stop"}, 30.0)["deadline"] == 28.0
    assert with_deadline({"op": "apply"}, 30.0)["deadline"] == 28.0
    assert "deadline" not in with_deadline({"op": "apply", "plan": True}, 30.0)
    assert "deadline" not in with_deadline({"op": "poll"}, 30.0)
    assert "deadline" not in with_deadline({"op": "stop"}, None)


def test_the_stamped_command_carries_argv_unchanged() -> None:
    argv = ["python3", "-c", "it's $(x)"]
    assert split_stamped(stamped_command(200, argv)) == (200, argv)
    assert split_stamped("pct exec 200 -- true") is None


def timed_out(request: dict[str, Any]) -> dict[str, Any]:
    raise CommandTimeout("sandbox: command did not finish within 27 s: sh -c ...")


def probe_answer(**found: Any) -> Any:
    def respond(argv: list[str]) -> tuple[int, str]:
        assert argv[:4] == ["python3", "-I", "-S", "-c"] and argv[5] == "200"
        return 0, json.dumps({"status": "running", "pid": "4242", "error": None, **found})

    return respond


def test_a_frozen_ct_is_paused_not_down() -> None:
    host = StrictFakeHost()
    host.expect_agent("poll", timed_out)
    host.expect("host", probe_answer(lock="backup", freezer="frozen"))
    agent = AgentClient(Container(host, 200, label="sandbox"))  # type: ignore[arg-type]
    with pytest.raises(PausedError) as error:
        agent.poll({"op": "poll", "workdir": "/w", "session": "demo"}, timeout=30.0)
    host.assert_done()
    assert "CT 200 is locked (backup) — the run is paused, not down" in error.value.message
    assert error.value.exit_code == ExitCode.UNREACHABLE


def test_a_stop_given_up_on_says_it_may_still_complete() -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("stop", lambda request: seen.update(request) or timed_out(request))
    host.expect("host", probe_answer(lock=None, freezer="thawed"))
    agent = AgentClient(Container(host, 200, label="sandbox"))  # type: ignore[arg-type]
    with pytest.raises(CommandTimeout) as error:
        agent.stop({"op": "stop", "session": "demo"}, timeout=34.0)
    assert not isinstance(error.value, PausedError)
    assert "the stop did not finish within 34 s" in error.value.message
    assert "the stop may still complete in the container" in error.value.message
    assert error.value.hint is not None and "launcher status" in error.value.hint
    assert seen["deadline"] == pytest.approx(34.0 - 6.8 - 2.0)


def test_a_host_that_cannot_tell_is_said_so() -> None:
    state = ctstate.CtState(200, error="`pct status` did not answer within 4 s either")
    assert not state.paused
    assert state.sentence() == (
        "the host could not say why: `pct status` did not answer within 4 s either"
    )
    assert ctstate.CtState(200, lock="migrate").sentence() == (
        "CT 200 is locked (migrate): Proxmox is working on it"
    )
    assert ctstate.CtState(200, frozen=True).paused


# --------------------------------------------------------------------------- watch


def test_watch_reports_a_frozen_ct_as_paused_and_never_restarts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from launcher.watch import target as watched
    from launcher.watch.monitor import Hub, Watch, WatchSettings
    from launcher.watch.state import WatchState
    from launcher.watch.target import TargetSubject
    from tests.unit.projectfiles import load_target

    paused = PausedError("sandbox: CT 200 is locked (backup) — the run is paused, not down")

    def frozen(*args: Any, **kwargs: Any) -> Any:
        raise paused

    monkeypatch.setattr(watched, "poll_once", frozen)
    monkeypatch.setattr(watched, "deploy", lambda *a, **k: pytest.fail("restarted"))
    monkeypatch.setattr(watched, "rollback", lambda *a, **k: pytest.fail("restarted"))
    events: list[Any] = []
    state = WatchState(tmp_path / "watch.json").open()
    hub = Hub(state, None, None, events.append)
    target = load_target(tmp_path)
    host = StrictFakeHost()  # nothing may reach it: the polls are the fake above
    settings = WatchSettings(restart=True)
    subject = TargetSubject(target, host, settings)  # type: ignore[arg-type]
    watch = Watch(subject, settings, hub, threading.Event())
    watch.record.status, watch.restart_due = "unhealthy", True  # a restart was due
    for _ in range(5):
        watch.poll_and_judge()
        watch.recover()
    state.close()
    kinds = [e.kind for e in events]
    assert kinds == ["paused"]  # once, however long it lasts; not "unreachable"
    assert events[0].reason == paused.message and watch.record.reachable


def test_a_read_of_a_frozen_ct_is_paused_at_once_and_never_piles_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poll that hangs (a frozen CT) is asked about on the host while it waits: paused
    after EARLY_LOOK, not after the whole timeout; while it is left waiting, the next poll only
    asks the host (no second call hangs in the CT)."""
    import threading

    from launcher.container import agentclient
    from tests.local.test_operate import poll_answer
    from tests.unit.projectfiles import NO_SESSION

    monkeypatch.setattr(agentclient, "EARLY_LOOK", 0.05)
    thawed = threading.Event()

    def hanging(request: dict[str, Any]) -> dict[str, Any]:
        thawed.wait(10)
        return poll_answer(NO_SESSION)

    host = StrictFakeHost()
    host.expect_agent("poll", hanging)
    host.expect("host", probe_answer(lock="backup", freezer="frozen"))
    host.expect("host", probe_answer(lock="backup", freezer="frozen"))
    agent = AgentClient(Container(host, 200, label="sandbox"))  # type: ignore[arg-type]
    request = {"op": "poll", "workdir": "/w", "session": "demo"}
    for _ in range(2):
        with pytest.raises(PausedError, match=r"CT 200 is locked \(backup\) — the run is paused"):
            agent.poll(request, timeout=300.0)  # type: ignore[arg-type]
    thawed.set()
    host.expect_agent("poll", poll_answer(NO_SESSION))
    deadline = 0
    while agentclient._waiting.busy(agent.container) and deadline < 100:
        deadline += 1
        threading.Event().wait(0.05)
    assert agent.poll(request, timeout=300.0)["session"]["exists"] is False  # type: ignore[arg-type]
    host.assert_done()


def test_a_stop_for_a_named_run_does_not_look_first(tmp_path: Path) -> None:
    """A watcher that gives up on run A stops A, not what someone deployed since: it names A
    and the poll is not needed."""
    from launcher.operate.stop import stop
    from tests.local.test_operate import stop_report
    from tests.unit.projectfiles import load_target

    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("stop", lambda request: seen.update(request) or stop_report())
    stop(load_target(tmp_path), host, expect_run="dflash:A")  # type: ignore[arg-type]
    host.assert_done()
    assert seen["expect_run"] == "dflash:A"

"""One watch session for the CLI and the API (launcher.watch.session): the same request from
both, bad input refused before anything opens, stop() at any time, and the exit code judged
from what each target was left in."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.api import Launcher
from launcher.cli.main import main
from launcher.core.errors import ExitCode, UsageError
from launcher.watch.monitor import WatchSettings
from launcher.watch.notify import parse_webhook, webhook_name
from launcher.watch.policy import RestartPolicy
from launcher.watch.session import (
    WatchRequest,
    WatchResult,
    WatchSession,
    final_code,
    guarded,
)
from launcher.watch.state import TargetRecord, WatchState
from tests.unit.projectfiles import write_project


def record(**fields: Any) -> TargetRecord:
    return TargetRecord(**{"run": "r1", **fields})


@pytest.mark.parametrize(
    ("records", "errors", "code"),
    [
        ({"a": record(status="healthy")}, [], ExitCode.OK),
        ({"a": record(status="finished")}, [], ExitCode.OK),
        ({"a": record(status="stopped")}, [], ExitCode.OK),  # a person stopped it
        ({"a": record(status="stopped", gave_up_run="r1")}, [], ExitCode.UNHEALTHY),
        ({"a": record(status="stopped", gave_up_run="r0")}, [], ExitCode.OK),
        ({"a": record(status="healthy"), "b": record(status="failed")}, [], ExitCode.UNHEALTHY),
        ({"a": record(status="restarting")}, [], ExitCode.UNHEALTHY),
        ({"a": record(status="healthy", bad=True)}, [], ExitCode.UNHEALTHY),
        ({"a": record(status="healthy", reachable=False)}, [], ExitCode.UNREACHABLE),
        ({"a": record(status="unhealthy", reachable=False)}, [], ExitCode.UNHEALTHY),
        ({"a": record(status="healthy")}, ["a: ValueError: x"], ExitCode.UNREACHABLE),
    ],
)
def test_the_exit_code_at_the_end(
    records: dict[str, TargetRecord], errors: list[str], code: ExitCode
) -> None:
    assert final_code(records, errors) == code


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("webhooks", ("ftp://example.com/hook",), "not an http:// or https:// URL"),
        ("commands", ("",), "--exec: empty command"),
        ("commands", ("notify 'unclosed",), "--exec"),
    ],
)
def test_a_bad_receiver_is_refused_when_the_request_is_made(
    tmp_path: Path, field: str, value: tuple[str, ...], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        WatchRequest(state_path=tmp_path / "state.json", **{field: value})


def test_stop_before_run_ends_the_watch_at_once_with_exit_0(tmp_path: Path) -> None:
    events: list[Any] = []
    started: list[bool] = []
    session = WatchSession([], WatchRequest(state_path=tmp_path / "state.json"), events.append)
    session.stop()
    result = session.run(lambda: started.append(True))
    assert (result.exit_code, result.stopped, result.statuses) == (0, True, {})
    assert started == [True] and events == []
    # The state's lock was taken and given back: another watcher can take it now.
    assert (tmp_path / "state.lock").exists()
    WatchState(tmp_path / "state.json").open().close()
    assert "watch stopped" in result.summary and result.to_json()["stopped"] is True


class Ran(Exception):
    """What the fake WatchSession.run raises: the request it was given, and nothing opened."""

    def __init__(self, session: WatchSession) -> None:
        super().__init__("watch ran")
        self.session = session


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[WatchSession]:
    sessions: list[WatchSession] = []

    def run(self: WatchSession, started: Any = None) -> WatchResult:
        sessions.append(self)
        raise Ran(self)

    monkeypatch.setattr(WatchSession, "run", run)
    return sessions


def test_the_cli_and_the_api_run_the_same_watch(
    tmp_path: Path, ran: list[WatchSession], monkeypatch: pytest.MonkeyPatch
) -> None:
    inventory = write_project(tmp_path)
    state = tmp_path / "watch-state.json"
    monkeypatch.setenv("LAUNCHER_CONTROL_PERSIST", "0")
    with pytest.raises(Ran):
        main(
            ["-i", str(inventory), "watch", "-t", "prod", "--for", "10m", "--interval", "5",
             "--wait", "30", "--restart-on-failure", "--max-restarts", "2",
             "--restart-window", "2h", "--restart-backoff", "1m",
             "--webhook", "https://example.com/hook", "--exec", "notify-send launcher",
             "--metrics-port", "9310", "--state", str(state)]
        )  # fmt: skip
    with Launcher(inventory) as launcher, pytest.raises(Ran):
        launcher.watch(
            "prod",
            duration="10m",  # type: ignore[arg-type]  # durations as the CLI writes them too
            interval=5,
            wait=30,
            restart_on_failure=True,
            max_restarts=2,
            restart_window=7200,
            restart_backoff=60,
            webhooks=["https://example.com/hook"],
            commands=["notify-send launcher"],
            metrics_port=9310,
            state=state,
        )
    cli, api = ran
    assert cli.request == api.request
    assert cli.request == WatchRequest(
        state_path=state,
        settings=WatchSettings(5.0, 30.0, True, RestartPolicy(2, 7200.0, 60.0)),
        duration=600.0,
        webhooks=("https://example.com/hook",),
        commands=("notify-send launcher",),
        metrics_port=9310,
    )
    assert [t.name for t in cli.targets] == [t.name for t in api.targets] == ["prod"]
    hook = webhook_name(parse_webhook("https://example.com/hook"))
    names = {hook, "exec notify-send launcher"}
    assert set(cli.request.receivers) == set(api.request.receivers) == names


@pytest.mark.parametrize(
    "bad",
    [
        {"duration": -1},
        {"interval": 0},
        {"max_restarts": "3"},
        {"max_restarts": 1001},
        {"restart_window": 0},
        {"restart_window": None},
        {"restart_backoff": "soon"},
        {"metrics_port": 70000},
        {"metrics_address": 5},
        {"restart_on_failure": "yes"},
        {"webhooks": "https://example.com/hook"},
        {"webhooks": ["ftp://example.com"]},
        {"commands": [["notify-send"]]},
        {"on_event": "print"},
        {"state": 3},
    ],
)
def test_the_apis_bad_values_are_usage_errors_before_anything_runs(
    tmp_path: Path, ran: list[WatchSession], bad: dict[str, Any]
) -> None:
    with Launcher(write_project(tmp_path)) as launcher, pytest.raises(UsageError):
        launcher.watch("prod", **bad)
    assert ran == []


def test_the_result_says_how_each_target_was_left() -> None:
    result = WatchResult(
        1, {"prod": record(status="failed", restarts=[1.0, 2.0])}, ("x",), stopped=False
    )
    assert result.summary == "watch ended: prod failed (exit 1)"
    assert result.to_json() == {
        "exit_code": 1,
        "stopped": False,
        "errors": ["x"],
        "targets": {"prod": {"status": "failed", "run": "r1", "reachable": True, "restarts": 2}},
    }
    assert dataclasses.is_dataclass(result)


def test_a_callback_that_raises_is_reported_and_the_event_goes_on() -> None:
    reported: list[str] = []
    seen: list[str] = []

    def buggy(event: Any) -> None:
        seen.append(event.kind)
        raise KeyError("oops")

    deliver = guarded(buggy, reported.append)
    deliver(SimpleNamespace(kind="unhealthy", target="prod"))  # returns: the Hub goes on
    assert seen == ["unhealthy"]
    assert reported == ["prod: on_event raised KeyError: 'oops'"]

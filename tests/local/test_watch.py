"""launcher.watch without a sandbox: the restart policy, run judging on recorded panes, the
event schema, and notifications (a real local HTTP server, a real command) with retries and
the persisted outbox."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from launcher.config.models import VerifySpec
from launcher.core.errors import RefusedError, UsageError
from launcher.verify.formats import StatusSpec
from launcher.verify.pane import PaneState
from launcher.verify.parse import parse_pane
from launcher.watch.events import SCHEMA, Event
from launcher.watch.judging import JudgeSettings, RunJudge
from launcher.watch.notify import Notifier, command, parse_exec, parse_webhook, webhook
from launcher.watch.policy import RestartPolicy
from launcher.watch.state import TargetRecord, WatchState


def line(step: int, ktok: float = 28.0) -> str:
    return (
        f"[0m] step={step} loss=3.0000 acc=0.5 streak=1.0 lr=1.00e-04 noise=0.1000 | "
        f"tgt=4.00b/s dft=0.70b/s ({ktok:.1f}Ktok/s) | q_pre=[8, 7, 6, 6, 5, 4] q_hs=[4] | "
        "epoch~0.00 ETA=1.0h"
    )


def pane(lines: list[str], *, run: str = "r1", dead: bool = False) -> PaneState:
    return PaneState(True, dead, 1 if dead else None, None, "\n".join(lines), 100, run)


def judge(**verify: Any) -> RunJudge:
    spec = VerifySpec(**{"throughput": {"min": 1000}, **verify})
    settings = JudgeSettings(wait=2, window=30, successes=2, failure_threshold=2, lines=500)
    return RunJudge(spec, settings, lambda text, width: parse_pane(text), list(spec.queues))


def test_policy_counts_restarts_in_the_window_and_backs_off() -> None:
    policy = RestartPolicy(max_restarts=2, window=100, backoff=5, max_backoff=12)
    assert policy.allowed([], 1000) and policy.delay([], 1000) == 5
    assert policy.allowed([950], 1000) and policy.delay([950], 1000) == 10
    assert not policy.allowed([950, 990], 1000)
    assert policy.allowed([850, 990], 1000)  # 850 is out of the window
    assert policy.delay([960, 970, 980], 1000) == 12  # capped


def test_a_run_is_healthy_then_unhealthy_when_its_pane_dies_then_a_new_run() -> None:
    runs = judge()
    shown: list[str] = ["Starting pipeline..."]
    verdicts = []
    for at in range(6):
        shown.append(line(at + 1))
        verdicts.append(runs.observe(pane(shown), float(at)).verdict)
    assert verdicts[:2] == ["pending", "pending"]  # warmup
    assert verdicts[-1] == "healthy"
    crashed = runs.observe(pane([*shown, "RuntimeError: NCCL error"], dead=True), 6.0)
    assert crashed.verdict == "unhealthy" and "pane dead" in crashed.reason
    assert crashed.step == 6 and crashed.last_lines[-1] == "RuntimeError: NCCL error"
    fresh = runs.observe(pane(["Starting pipeline...", line(1)], run="r2"), 7.0)
    assert fresh.run == "r2" and fresh.verdict == "pending"  # judged afresh: its warmup


def test_a_hung_run_is_unhealthy_after_stall_after_and_recovers_when_it_moves() -> None:
    runs = judge(step={"stall_after": 4})
    shown = [line(1), line(2), line(3)]
    assert runs.observe(pane(shown), 0.0).verdict == "pending"
    for at in (2.0, 3.5):
        assert runs.observe(pane(shown), at).verdict != "unhealthy"
    hung = runs.observe(pane(shown), 8.0)
    assert hung.verdict == "unhealthy" and "step" in hung.reason
    assert hung.since_step == pytest.approx(8.0)
    verdicts = [runs.observe(pane([*shown, *map(line, range(4, 5 + i))]), 9.0 + i).verdict
                for i in range(3)]  # fmt: skip
    assert verdicts[-1] == "healthy"


def test_queues_printed_as_a_fill_are_watched_as_fills() -> None:
    status = StatusSpec(
        format="keyvalue", fields={"queues": {"q_pre": "q_pre", "q_post": "q_post"}}
    )
    spec = VerifySpec(queues={"q_pre": {}, "q_post": {}})
    settings = JudgeSettings(wait=0, window=30, successes=1, failure_threshold=2, lines=500)
    runs = RunJudge(
        spec, settings, lambda text, width: parse_pane(text, status), ["q_pre", "q_post"]
    )
    shown = [f"step={n} loss=2.0 tok/s=50000 q_pre=12/16 q_post={n}" for n in (1, 2)]
    seen = runs.observe(pane(shown), 1.0)
    assert seen.fills == {"q_pre": 0.75}
    assert seen.queues == {"q_post": [2.0]}


def test_event_schema_text_and_environment() -> None:
    event = Event("unhealthy", "prod", "pve1", 200, "r1", "unhealthy", "healthy", "pane dead",
                  ["a", "b"], step=7)  # fmt: skip
    body = event.to_json()
    assert body["schema"] == SCHEMA == "launcher.watch.event/1"
    assert body["text"].startswith("🔴 prod (CT 200 on pve1) run r1: unhealthy, step 7")
    assert Event.from_json(body) == event
    env = event.environment()
    assert json.loads(env["LAUNCHER_EVENT"])["id"] == event.id
    assert env["LAUNCHER_EVENT_KIND"] == "unhealthy" and env["LAUNCHER_EVENT_VMID"] == "200"


def test_bad_destinations_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="not an http"):
        parse_webhook("ftp://example.org/x")
    with pytest.raises(UsageError, match="--exec"):
        parse_exec("notify 'unterminated")
    assert parse_exec("notify-send 'a b'") == ["notify-send", "a b"]


class Flaky:
    """A webhook receiver that answers 500 to the first `failures` requests, then 200."""

    def __init__(self, failures: int) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.attempts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.attempts += 1
                if outer.attempts <= failures:
                    self.send_response(500)
                else:
                    outer.bodies.append(json.loads(body))
                    self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def event(kind: str = "unhealthy") -> Event:
    return Event(kind, "t", "h", 1, "r", kind, "healthy", "why")


def test_webhook_retried_with_backoff_delivered_once_and_state_cleared(tmp_path: Path) -> None:
    receiver = Flaky(failures=2)
    state = WatchState(tmp_path / "w.json").open()
    logged: list[str] = []
    notifier = Notifier({"hook": webhook(receiver.url)}, state, log=logged.append,
                        first_backoff=0.05)  # fmt: skip
    notifier.start()
    sent = event()
    state.add_event(sent, notifier.names)
    notifier.send(sent)
    assert notifier.drain(10)
    notifier.stop()
    receiver.server.shutdown()
    assert receiver.attempts == 3 and [b["id"] for b in receiver.bodies] == [sent.id]
    assert sum("failed (HTTP 500" in line for line in logged) == 2
    assert state.undelivered() == []
    state.close()


def test_undelivered_events_survive_a_restart_and_delivered_ones_are_not_resent(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.json"
    state = WatchState(path).open()
    done, pending = event("unhealthy"), event("recovered")
    state.add_event(done, ["hook"])
    state.add_event(pending, ["hook"])
    state.delivered(done.id, "hook")
    state.update("t", TargetRecord(run="r", status="healthy", restarts=[1.0]))
    state.close()
    receiver = Flaky(failures=0)
    again = WatchState(path).open()
    assert again.record("t").restarts == [1.0]
    notifier = Notifier({"hook": webhook(receiver.url)}, again)
    notifier.start()
    assert notifier.drain(10)
    notifier.stop()
    receiver.server.shutdown()
    assert [b["kind"] for b in receiver.bodies] == ["recovered"]
    assert len((tmp_path / "w.events.jsonl").read_text().splitlines()) == 2
    again.close()


def test_a_second_watcher_on_the_same_state_is_refused(tmp_path: Path) -> None:
    first = WatchState(tmp_path / "w.json").open()
    with pytest.raises(RefusedError, match="another watcher"):
        WatchState(tmp_path / "w.json").open()
    first.close()


def test_exec_gets_the_event_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    script = "import json,os,sys; open(sys.argv[1],'w').write(os.environ['LAUNCHER_EVENT'])"
    deliver = command([sys.executable, "-c", script, str(out)])
    sent = event("gave_up")
    deliver(sent)
    assert json.loads(out.read_text())["kind"] == "gave_up"


def test_a_finished_run_is_finished_and_a_crashed_one_failed() -> None:
    runs = judge()
    shown = [line(step) for step in range(1, 6)]
    done = PaneState(True, True, 0, 0, "\n".join([*shown, "Training completed."]), 100, "r1")
    finished = runs.observe(done, 5.0)
    assert finished.verdict == "finished" and "exit 0" in finished.reason
    assert finished.step == 5
    crashed = judge().observe(pane([*shown, "RuntimeError: boom"], dead=True), 5.0)
    assert crashed.verdict == "unhealthy" and str(crashed.state) == "failed"


def test_watch_judges_the_step_by_the_run_s_own_cadence() -> None:
    # A new step at every 1 s poll, then none: past twice its usual gap the run is no longer
    # passing (pending), well before stall_after calls it unhealthy.
    settings = JudgeSettings(
        wait=0, window=300, successes=2, failure_threshold=2, lines=500, interval=1.0
    )
    spec = VerifySpec(throughput={"min": 1000})  # type: ignore[arg-type]
    runs = RunJudge(spec, settings, lambda text, width: parse_pane(text), list(spec.queues))
    shown: list[str] = []
    for at in range(5):
        shown.append(line(at + 1))
        verdict = runs.observe(pane(shown), float(at)).verdict
    assert verdict == "healthy"
    assert runs.observe(pane(shown), 6.0).verdict == "healthy"  # 2 s: within twice 1 s
    late = runs.observe(pane(shown), 7.0)
    assert late.verdict == "pending" and "usual gap 1 s" in late.reason


def test_webhook_urls_are_never_shown_whole() -> None:
    from launcher.watch.notify import redact_url, webhook_name

    url = "https://hooks.slack.com/services/T000/B000/s3cr3tT0ken"
    assert redact_url(url) == "https://hooks.slack.com/…"
    assert redact_url("http://[::1]:8080/x?token=abc") == "http://[::1]:8080/…"
    name = webhook_name(url)
    assert "s3cr3t" not in name and name.startswith("webhook https://hooks.slack.com/… #")
    assert name != webhook_name(url + "x")  # two hooks on one host stay apart
    with pytest.raises(UsageError) as raised:
        parse_webhook("http://[::1/s3cr3t")
    assert "s3cr3t" not in raised.value.message


def test_long_pane_lines_are_cut_and_marked() -> None:
    event = Event("unhealthy", "p", "h", 1, "r", "unhealthy", "healthy", "x" * 10_000,
                  ["z" * 300_000, "short"])  # fmt: skip
    capped = event.capped()
    assert capped.last_lines[1] == "short"
    first = capped.last_lines[0]
    assert len(first) < 2100 and "[cut: 298000 more characters]" in first
    assert "[cut: " in capped.reason and capped.id == event.id
    assert sum(len(v) for v in capped.environment().values()) < 100_000
    small = Event("healthy", "p", "h", 1, "r", "healthy", "starting", "ok", ["a"])
    assert small.capped() is small

"""`launcher watch` on the sandbox: webhooks on crash and recovery, restarts that resume from
checkpoints, a restart limit, and metrics scraped over HTTP. Real sshd, LXC, tmux and HTTP."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

CRASH_AFTER = 6.0
INTERVAL = 1.0


class Receiver:
    """A webhook receiver on 127.0.0.1: every POSTed JSON body, with the time it arrived."""

    def __init__(self) -> None:
        received: list[tuple[float, dict[str, Any]]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((time.monotonic(), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def kinds(self) -> list[str]:
        return [body["kind"] for _, body in self.received]

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(at, body) for at, body in self.received if body["kind"] == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


class Watch:
    """`launcher watch` as a user runs it, in the background, its own state directory."""

    def __init__(self, project: Project, *args: str) -> None:
        self.state = project.root / "state"
        env = {**os.environ, "XDG_STATE_HOME": str(self.state)}
        self.err = (project.root / "watch.err").open("w+")
        self.proc = subprocess.Popen(
            project.argv("watch", *args),
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            env=env,
            text=True,
        )

    def stderr(self) -> str:
        if not self.err.closed:
            self.err.flush()
        return Path(self.err.name).read_text()

    def terminate(self, timeout: float = 30) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


def wait_until(predicate: Any, timeout: float, what: str, watch: Watch | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    detail = f"\nwatcher stderr:\n{watch.stderr()}" if watch else ""
    raise AssertionError(f"timed out waiting for {what}{detail}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def deploy(project: Project, name: str) -> None:
    result = project.launcher("-t", name, "deploy", "--restart")
    assert result.returncode == 0, result.stderr


def test_webhook_once_on_crash_and_once_on_recovery(project: Project, receiver: Receiver) -> None:
    crashing = project.playbook(
        "wcrash", env={"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": f"{CRASH_AFTER:g}"},
        verify={"wait": 2, "interval": INTERVAL, "successes": 2},
    )  # fmt: skip
    project.write({"wcrash": (200, crashing)})
    deploy(project, "wcrash")
    deployed = time.monotonic()
    watch = Watch(project, "-t", "wcrash", "--webhook", receiver.url, "--for", "90")
    try:
        wait_until(lambda: receiver.of("unhealthy"), 30, "the unhealthy webhook", watch)
        at, body = receiver.of("unhealthy")[0]
        # The crash happens CRASH_AFTER s after the deploy; one interval plus a few seconds.
        assert at - deployed <= CRASH_AFTER + INTERVAL + 5, at - deployed
        assert body["schema"] == "launcher.watch.event/1"
        assert body["target"] == "wcrash" and body["vmid"] == 200
        assert "NCCL error" in "\n".join(body["last_lines"])
        assert body["text"].startswith("🔴 wcrash") and "unhealthy" in body["text"]
        # An operator fixes the script and redeploys: a new run, then recovered.
        project.write({"wcrash": (200, project.playbook("wcrash", verify={"wait": 2}))})
        deploy(project, "wcrash")
        wait_until(lambda: receiver.of("recovered"), 40, "the recovered webhook", watch)
        time.sleep(3 * INTERVAL)  # a duplicate would arrive meanwhile
        assert watch.terminate() == 0
    finally:
        watch.kill()
    kinds = receiver.kinds()
    assert kinds.count("unhealthy") == 1, kinds
    assert kinds.count("recovered") == 1, kinds
    assert kinds.count("new_run") == 1, kinds
    assert receiver.of("new_run")[0][1]["run"] != body["run"]
    assert "recovered" in watch.stderr()
    # A restarted watcher does not send any of it again: same run, same state.
    again = Watch(project, "-t", "wcrash", "--webhook", receiver.url, "--for", "4")
    try:
        assert again.proc.wait(timeout=30) == 0, again.stderr()
    finally:
        again.kill()
    assert len(receiver.received) == len(kinds), receiver.kinds()


def test_restart_on_failure_resumes_then_gives_up(project: Project, receiver: Receiver) -> None:
    env = {"DEMO_MODE": "crash", "DEMO_CRASH_AFTER": "7", "DEMO_RESUME": "1"}
    book = project.playbook("wloop", env=env, verify={"wait": 2, "interval": INTERVAL})
    project.write({"wloop": (201, book)})
    project.ct(201, "rm", "-rf", "/root/wloop/checkpoints")
    deploy(project, "wloop")
    watch = Watch(
        project, "-t", "wloop", "--webhook", receiver.url, "--restart-on-failure",
        "--max-restarts", "2", "--restart-backoff", "0", "--for", "100",
    )  # fmt: skip
    resumed: list[int] = []

    def resumed_in_pane() -> bool:
        pane = project.ct_text(201, "tmux", "capture-pane", "-p", "-S", "-", "-t", "=wloop:")
        resumed.extend(int(n) for n in re.findall(r"Resuming from checkpoints/step_(\d+)", pane))
        return bool(resumed)

    try:
        wait_until(lambda: receiver.of("restart"), 30, "the first restart", watch)
        wait_until(resumed_in_pane, 15, "the restarted trainer's resume line", watch)
        wait_until(lambda: receiver.of("gave_up"), 60, "the final notification", watch)
        time.sleep(4 * INTERVAL)  # no further restart after giving up
        watch.terminate()
    finally:
        watch.kill()
    assert resumed[0] > 0  # the new run found the old run's checkpoints
    kinds = receiver.kinds()
    assert kinds.count("restart") == 2, kinds
    assert kinds.count("gave_up") == 1 and kinds[-1] == "gave_up", kinds
    assert kinds.count("unhealthy") == 3, kinds  # the first run and each restarted one
    runs = {body["run"] for _, body in receiver.of("unhealthy")}
    assert len(runs) == 3  # never mixed: three runs, three markers
    final = receiver.of("gave_up")[0][1]
    assert final["status"] == "stopped" and "left stopped" in final["reason"]
    history = (watch.state / "launcher" / "history.jsonl").read_text().splitlines()
    assert sum(json.loads(line)["target"] == "wloop" for line in history) == 2
    assert project.processes(201, "train_demo.py") == []


def scrape(port: int, target: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        if f'target="{target}"' in line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def test_metrics_show_the_step_advancing(project: Project) -> None:
    project.write({"wmetrics": (202, project.playbook("wmetrics", verify={"wait": 2}))})
    deploy(project, "wmetrics")
    port = free_port()
    watch = Watch(project, "-t", "wmetrics", "--interval", "1", "--metrics-port", str(port))
    step = 'launcher_train_step{host="sandbox",target="wmetrics",vmid="202"}'
    try:
        wait_until(lambda: step in _try_scrape(port), 20, "a step in the metrics", watch)
        first = scrape(port, "wmetrics")[step]
        healthy = 'launcher_watch_healthy{host="sandbox",target="wmetrics",vmid="202"}'

        def advanced_and_healthy() -> bool:
            now = _try_scrape(port)
            return now.get(step, first) > first and now.get(healthy) == 1.0

        wait_until(advanced_and_healthy, 20, "the step advanced, healthy", watch)
        later = scrape(port, "wmetrics")
        assert watch.terminate() == 0
    finally:
        watch.kill()
    assert later[step] > first
    labels = 'host="sandbox",target="wmetrics",vmid="202"'
    assert later[f"launcher_watch_poll_success{{{labels}}}"] == 1.0
    assert later[f"launcher_watch_healthy{{{labels}}}"] == 1.0
    assert later[f"launcher_train_throughput{{{labels}}}"] > 0
    queue = 'bucket="0",host="sandbox",queue="q_pre",target="wmetrics",vmid="202"'
    assert later[f"launcher_train_queue_depth{{{queue}}}"] > 0
    assert later[f"launcher_train_seconds_since_step{{{labels}}}"] < 5


def _try_scrape(port: int) -> dict[str, float]:
    try:
        return scrape(port, "wmetrics")
    except OSError:
        return {}

"""A hostile remote end: a port that never speaks SSH, a run that prints terminal escapes,
a reader that goes away, Ctrl-C in the middle of a deploy."""

from __future__ import annotations

import json
import os
import pty
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launcher.agent.protocol import LOCK_PATH
from tests.e2e.project import DEMO_TRAINER, Project

pytestmark = pytest.mark.e2e

VMID = 200
CONNECT_TIMEOUT = 2
LAUNCHER = [sys.executable, "-m", "launcher"]


# --------------------------------------------------------------------------- a port that stalls


class StallingServer:
    """Accepts TCP connections on 127.0.0.1 and never answers (or only with an SSH banner)."""

    def __init__(self, banner: bytes = b"") -> None:
        self.banner = banner
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.accepted.append(conn)
            if self.banner:
                conn.sendall(self.banner)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()
        for conn in self.accepted:
            conn.close()


@pytest.fixture
def silent() -> Iterator[StallingServer]:
    server = StallingServer()
    yield server
    server.close()


def stalled_inventory(root: Path, port: int, **host: object) -> Path:
    """An inventory whose one host is the stalling port (no sandbox needed)."""
    root.mkdir(parents=True, exist_ok=True)
    known_hosts = root / "known_hosts"
    known_hosts.write_text("")
    playbook = {
        "name": "stalled",
        "session": "stalled",
        "workdir": "/root/stalled",
        "script": {"source": str(DEMO_TRAINER), "dest": "train_demo.py"},
        "command": "python3 train_demo.py",
        "verify": {"window": 60},
    }
    (root / "stalled.yaml").write_text(yaml.safe_dump(playbook))
    spec = {
        "address": "127.0.0.1",
        "port": port,
        "user": "root",
        "known_hosts": str(known_hosts),
        "connect_timeout": CONNECT_TIMEOUT,
        **host,
    }
    inventory = {
        "hosts": {"stalled": spec},
        "targets": {"stalled": {"host": "stalled", "vmid": VMID, "playbook": "stalled.yaml"}},
        "default_target": "stalled",
    }
    path = root / "inventory.yaml"
    path.write_text(yaml.safe_dump(inventory))
    return path


def run_timed(inventory: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        [*LAUNCHER, "-i", str(inventory), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result, time.monotonic() - started


def test_debug_shows_paramikos_log(silent: StallingServer, tmp_path: Path) -> None:
    inventory = stalled_inventory(tmp_path / "project", silent.port)
    result, _ = run_timed(inventory, "--debug", "status")
    assert result.returncode == 3
    # --debug shows the traceback; paramiko's own log lines come only if its transport thread
    # got far enough to log before the deadline closed the socket (it may not, on a busy host).
    assert "Traceback (most recent call last)" in result.stderr
    assert "no SSH banner" in result.stderr or "paramiko" in result.stderr


# --------------------------------------------------------------------------- escapes from the run

# Prints what a hostile trainer could: title (OSC 0), clipboard (OSC 52), a terminal query
# (CSI 6n), DCS, BEL, 8-bit CSI, and an OSC cut in two writes. It also forges a deploy record
# with escapes in the fields `history` shows.
HOSTILE_TRAINER = r"""
import json, os, sys, time
out = sys.stdout.buffer

def say(data):
    out.write(data)
    out.flush()

time.sleep(1)  # after the deploy has written its own record
forged = {
    "time": "2026-01-01T00:00:00Z\x1b]0;HISTORY-TITLE\x07",
    "outcome": "launched\x1b[6n",
    "sha256": "\x9b6n" + "0" * 64,
    "operator": "eve\x1bP+q544e\x1b\\",
    "command": "python3 x.py\x1b]52;c;cm0gLXJmIH4K\x07\x07",
    "stopped": {},
    "checkpoints": {"action": "archive", "to": "/root/ckpt\x1b]0;T\x1b\\"},
}
with open(os.path.join(".launcher", "deploys.jsonl"), "a") as handle:
    handle.write(json.dumps(forged) + "\n")
deadline = time.time() + 60
while not os.path.exists("go") and time.time() < deadline:  # the test's followers are ready
    time.sleep(0.1)
for i in range(int(os.environ.get("ROUNDS", "8"))):
    say(b"round %d \x1b]0;TITLE-PWNED\x07 osc0-done\n" % i)
    say(b"\x1b]52;c;cm0gLXJmIH4K\x1b\\ osc52-done\n")
    say(b"\x1b[6n csi6n-done \x9b6n \xc2\x9b6n c1-done\n")
    say(b"\x1bP+q544e\x1b\\ dcs-done \x07bell-done\n")
    say(b"split \x1b]0;SPL")
    time.sleep(0.4)
    say(b"IT\x07 split-done\n")
    time.sleep(0.4)
"""

FORBIDDEN = [b"\x1b]", b"\x1bP", b"\x1b[6n", b"\x07", b"\x9b"]


def assert_no_escapes(output: bytes, what: str) -> None:
    for needle in FORBIDDEN:
        assert needle not in output, f"{needle!r} reached the terminal in {what}: {output[:2000]!r}"


def launcher_bytes(
    project: Project, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*LAUNCHER, "-i", str(project.inventory), *args],
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def hostile_project(project: Project, name: str) -> None:
    script = project.root / "hostile.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(HOSTILE_TRAINER)
    book = project.playbook(name, gpus=0, command="python3 hostile.py")
    book["script"] = {"source": str(script), "dest": "hostile.py"}
    project.write({name: (VMID, book)})


def test_escape_sequences_never_reach_the_terminal(project: Project) -> None:
    hostile_project(project, "escapes")
    deployed = launcher_bytes(project, "deploy", "--restart")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    # Followed twice at once: as it is shown, and unfiltered (on request, into a pipe).
    follow = [*LAUNCHER, "-i", str(project.inventory), "logs", "-f", "--tail", "0"]
    shown = subprocess.Popen(follow, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    raw_follow = subprocess.Popen(
        [*follow, "--raw-bytes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    project.wait_for(lambda: len(followers(project)) >= 2, what="both followers")
    project.ct(VMID, "touch", "/root/escapes/go")  # the trainer starts printing
    raw_out, raw_err = raw_follow.communicate(timeout=60)
    assert raw_follow.returncode == 0, raw_err
    assert b"\x1b]0;TITLE-PWNED\x07 osc0-done" in raw_out
    out, err = shown.communicate(timeout=60)
    followed = subprocess.CompletedProcess(follow, shown.returncode, out, err)
    assert followed.returncode == 0, followed.stderr
    assert b"the run ended with exit code 0" in followed.stderr
    assert_no_escapes(followed.stdout + followed.stderr, "logs -f")
    assert b"split  split-done" in followed.stdout, "an OSC cut between two chunks is dropped"
    assert b"osc0-done" in followed.stdout and b"c1-done" in followed.stdout

    tail = launcher_bytes(project, "logs", "--tail", "200")
    assert tail.returncode == 0, tail.stderr
    assert_no_escapes(tail.stdout + tail.stderr, "logs")
    assert b"round 7  osc0-done" in tail.stdout and b"split  split-done" in tail.stdout

    history = launcher_bytes(project, "history")
    assert history.returncode == 0, history.stderr
    assert_no_escapes(history.stdout + history.stderr, "history")
    assert b"by eve" in history.stdout and b"moved to /root/ckpt" in history.stdout
    records = launcher_bytes(project, "history", "--json")
    assert_no_escapes(records.stdout, "history --json")
    operators = [r.get("operator") for r in json.loads(records.stdout)["records"]]
    assert "eve\x1bP+q544e\x1b\\" in operators, "--json keeps the data, escaped"

    status = launcher_bytes(project, "status")
    assert_no_escapes(status.stdout + status.stderr, "status")

    # Unfiltered bytes on request, into a pipe; never onto a terminal.
    raw = launcher_bytes(project, "logs", "--raw-bytes", "--tail", "200")
    assert raw.returncode == 0, raw.stderr
    assert b"\x1b]0;TITLE-PWNED\x07" in raw.stdout
    primary, secondary = pty.openpty()
    try:
        on_tty = subprocess.run(
            [*LAUNCHER, "-i", str(project.inventory), "logs", "--raw-bytes"],
            stdout=secondary,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(secondary)
        os.close(primary)
    assert on_tty.returncode == 2, on_tty.stderr
    assert b"not to a terminal" in on_tty.stderr
    project.kill_session(VMID, "escapes")


# --------------------------------------------------------------------------- pipe and Ctrl-C


def followers(project: Project) -> list[str]:
    out = project.ct_text(VMID, "ps", "-eo", "args=")
    return [line for line in out.splitlines() if "launcher_agent" in line or "json,sys" in line]


def test_logs_follow_into_head_exits_141(project: Project) -> None:
    project.write({"piped": (VMID, project.playbook("piped", gpus=0))})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 0, deployed.stderr
    project.wait_for(
        lambda: "step=" in project.launcher("logs", "--tail", "3").stdout, what="status lines"
    )
    launcher = shlex.join([*LAUNCHER, "-i", str(project.inventory), "logs", "-f", "--tail", "1"])
    script = f'{launcher} | head -1; echo "PIPESTATUS=${{PIPESTATUS[*]}}" >&2'
    started = time.monotonic()
    piped = subprocess.run(
        ["bash", "-o", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert time.monotonic() - started < 20
    assert "PIPESTATUS=141 0" in piped.stderr, piped.stderr
    assert len(piped.stdout.splitlines()) == 1
    for noise in ("Traceback", "Broken pipe", "Exception ignored", "error:"):
        assert noise not in piped.stderr, piped.stderr
    project.wait_for(lambda: followers(project) == [], what="the remote follower to end")
    assert project.processes(VMID, "train_demo.py"), "the run goes on"
    project.kill_session(VMID, "piped")


def history_records(project: Project) -> list[dict[str, object]]:
    result = project.launcher("history", "--json")
    assert result.returncode == 0, result.stderr
    records: list[dict[str, object]] = json.loads(result.stdout)["records"]
    return records


def test_ctrl_c_during_deploy_says_the_transaction_goes_on(project: Project) -> None:
    book = project.playbook("sigint", gpus=0, env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=4)
    project.write({"sigint": (VMID, book)})
    deployed = project.launcher("deploy", "--restart")
    assert deployed.returncode == 0, deployed.stderr
    before = len(history_records(project))

    deploy = subprocess.Popen(
        [*LAUNCHER, "-i", str(project.inventory), "deploy", "--restart"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Interrupt once the transaction holds the lock: it is inside its slow stop (the trainer
    # ignores C-c, so the stop waits out its grace period).
    project.wait_for(
        lambda: project.ct_text(VMID, "cat", LOCK_PATH).strip() != "", what="the deploy lock"
    )
    deploy.send_signal(signal.SIGINT)
    _, err = deploy.communicate(timeout=30)
    assert deploy.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    assert "goes on in the container" in err, err
    assert "history -t sigint" in err and "status -t sigint" in err, err

    # The transaction finishes without its client: a new record, the new run started.
    project.wait_for(
        lambda: len(history_records(project)) == before + 1, timeout=30, what="the new record"
    )
    latest = history_records(project)[0]
    assert latest["outcome"] == "launched"
    assert isinstance(latest["stopped"], dict) and latest["stopped"]["forced"] is True
    project.wait_for(
        lambda: project.ct_text(VMID, "cat", LOCK_PATH).strip() == "", what="the lock released"
    )
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the new run")
    project.kill_session(VMID, "sigint")

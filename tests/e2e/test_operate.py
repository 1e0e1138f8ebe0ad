"""logs, stop, attach, history, rollback and doctor end to end, against real runs."""

from __future__ import annotations

import hashlib
import json
import queue
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.e2e.project import DEMO_TRAINER, Project, json_out

pytestmark = pytest.mark.e2e

VMID = 200
OTHER = 201
TRAINER_SHA = hashlib.sha256(DEMO_TRAINER.read_bytes()).hexdigest()


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert result.returncode == code, result.stdout + result.stderr
    return result.stdout


def popen(project: Project, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        project.argv(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """Lines of the process's stdout as they arrive (read by a thread)."""
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            found.put(line)

    threading.Thread(target=read, daemon=True).start()
    return found


def wait_line(found: queue.Queue[str], needle: str, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = found.get(timeout=0.2)
        except queue.Empty:
            continue
        if needle in line:
            return line
    raise AssertionError(f"no line with {needle!r} within {timeout} s")


def agents_in(project: Project, vmid: int) -> list[str]:
    out = project.ct_text(vmid, "ps", "-eo", "args=")
    return [line for line in out.splitlines() if "launcher_agent" in line or "json,sys" in line]


def test_follow_ctrl_c_then_stop_and_no_session_cases(project: Project) -> None:
    book = project.playbook("opsstop")
    project.write({"opsstop": (VMID, book)})
    ok(project.launcher("deploy", "--restart"))
    follower = popen(project, "logs", "-f", "--tail", "0")
    found = lines_of(follower)
    wait_line(found, "step=")  # a new status line, printed while following
    wait_line(found, "step=")
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=15)
    assert follower.returncode == 0, err
    assert "stopped following" in err
    assert project.processes(VMID, "train_demo.py"), "Ctrl-C must leave the run alive"
    project.wait_for(lambda: agents_in(project, VMID) == [], what="the remote follower to end")

    raw = ok(project.launcher("logs", "--raw", "--tail", "5"))
    assert "step=" in raw

    checkpoints = ["test", "-d", "/root/opsstop/checkpoints"]
    project.wait_for(lambda: project.ct(VMID, *checkpoints).returncode == 0, what="checkpoints")
    stop_result = project.launcher("stop", "--grace", "5")
    stopped = ok(stop_result) + stop_result.stderr  # the summary, and the steps on stderr
    assert "session opsstop: exited after C-c; pids" in stopped
    assert "✓ gpus" in stopped and "free" in stopped
    assert "checkpoints untouched" in stopped
    assert project.processes(VMID, "train_demo.py") == []
    assert project.ct(VMID, *checkpoints).returncode == 0, "checkpoints are left alone"

    # No session any more.
    again = ok(project.launcher("stop"))
    assert "no session 'opsstop' on opsstop (sandbox CT 200): nothing to stop" in again
    status = project.launcher("status")
    assert status.returncode == 1
    logs = ok(project.launcher("logs", "--tail", "3"))  # the log outlives the session
    assert logs.strip()
    no_pane = project.launcher("logs", "--raw")
    assert no_pane.returncode == 1 and "no session 'opsstop'" in no_pane.stderr
    attach = project.launcher("attach")
    assert attach.returncode == 1 and "no session 'opsstop'" in attach.stderr


@pytest.fixture
def host_tmux() -> Iterator[list[str]]:
    """A tmux server on the test host with its own socket name, killed afterwards."""
    tmux = ["tmux", "-L", f"launcher-e2e-{uuid.uuid4().hex[:8]}", "-f", "/dev/null"]
    yield tmux
    subprocess.run([*tmux, "kill-server"], capture_output=True, check=False)


def test_attach_in_a_real_terminal(project: Project, host_tmux: list[str]) -> None:
    book = project.playbook("opsattach")
    project.write({"opsattach": (VMID, book)})
    ok(project.launcher("deploy", "--restart"))
    attach = shlex.join(project.argv("attach"))
    shell = f"{attach}; echo ATTACH-EXIT=$?; sleep 30"
    subprocess.run(
        [*host_tmux, "new-session", "-d", "-s", "host", "-x", "200", "-y", "50", shell],
        check=True,
    )

    def screen() -> str:
        capture = [*host_tmux, "capture-pane", "-p", "-t", "host"]
        return subprocess.run(capture, capture_output=True, text=True, check=False).stdout

    project.wait_for(lambda: "step=" in screen(), timeout=20, what="the trainer in the terminal")
    subprocess.run([*host_tmux, "send-keys", "-t", "host", "C-b", "d"], check=True)
    project.wait_for(lambda: "ATTACH-EXIT=0" in screen(), timeout=15, what="a clean detach")
    assert "[detached" in screen()
    assert project.processes(VMID, "train_demo.py"), "detaching must leave the run alive"
    assert ok(project.launcher("status", "--json"))
    project.kill_session(VMID, "opsattach")


def test_history_and_rollback(project: Project) -> None:
    v2 = project.root / "train_v2.py"
    v2.write_bytes(DEMO_TRAINER.read_bytes() + b"\n# v2\n")
    v2_sha = hashlib.sha256(v2.read_bytes()).hexdigest()
    book = project.playbook("opsroll", gpus=0)
    fresh = project.playbook("opsfresh", gpus=0)
    project.write({"opsroll": (OTHER, book), "opsfresh": (OTHER, fresh)})
    # Nothing deployed yet: no previous version.
    ok(project.launcher("-t", "opsfresh", "deploy"))
    none = project.launcher("-t", "opsfresh", "rollback", "--restart")
    assert none.returncode == 4, none.stderr
    assert "no previous version" in none.stderr
    project.kill_session(OTHER, "opsfresh")

    ok(project.launcher("deploy", "--restart"))
    book["script"]["source"] = str(v2)
    project.write({"opsroll": (OTHER, book), "opsfresh": (OTHER, fresh)})
    ok(project.launcher("deploy", "--restart"))

    records = json_out(project.launcher("history", "--json"))["records"]
    assert [r["sha256"] for r in records[:2]] == [v2_sha, TRAINER_SHA]
    assert records[0]["stopped"]["was_running"] is True
    assert records[0]["checkpoints"]["action"] in ("archive", "none")
    text = ok(project.launcher("history"))
    assert text.index(v2_sha[:12]) < text.index(TRAINER_SHA[:12])

    refused = project.launcher("rollback")
    assert refused.returncode == 4
    assert "use --restart" in refused.stderr

    rolled = project.launcher("rollback", "--restart")
    out = ok(rolled)
    steps = rolled.stderr  # progress: the steps go to stderr, the summary to stdout
    assert "✓ sha256" in steps and "✓ compile" in steps and "✓ launch" in steps
    assert f"rolled back opsroll (sandbox CT {OTHER}): sha256 {TRAINER_SHA[:12]}" in out
    sha = project.ct_text(OTHER, "sha256sum", "/root/opsroll/train_demo.py").split()[0]
    assert sha == TRAINER_SHA
    prev = project.ct_text(OTHER, "sha256sum", "/root/opsroll/train_demo.py.prev").split()[0]
    assert prev == v2_sha
    project.wait_for(lambda: project.processes(OTHER, "train_demo.py"), what="the relaunch")
    latest = json_out(project.launcher("history", "--json", "--limit", "1"))["records"]
    assert len(latest) == 1 and latest[0]["rollback"] is True
    assert latest[0]["rolled_back_from"] == v2_sha
    leftovers = project.ct_text(OTHER, "sh", "-c", "ls -a /root/opsroll | grep launcher- || true")
    assert leftovers.strip() == ""
    project.kill_session(OTHER, "opsroll")


def test_doctor_passes_then_names_each_failure(project: Project) -> None:
    project.write({"opsdoc": (OTHER, project.playbook("opsdoc"))})
    doctor = project.launcher("doctor")
    ok(doctor)
    out = doctor.stderr + doctor.stdout  # a progress line per check on stderr, then the summary
    for name in ("config", "reachable", "host key", "auth", "pct", "running", "python3", "tmux"):
        assert f"✓ {name}" in out, out
    # The in-container checks are the deploy transaction's own, run in plan mode.
    for name in ("paths", "lock", "resources", "gpus", "compile", "checkpoint dir", "active run"):
        assert f"✓ {name}" in out, out
    assert "restart requested" not in out  # doctor asked for no restart
    assert "8 GPUs" in out and "all" in out

    project.sandbox.stop_container(OTHER)
    try:
        stopped = project.launcher("doctor")
        history = project.launcher("history")
    finally:
        project.sandbox.start_container(OTHER)
    assert stopped.returncode == 3, stopped.stdout
    assert "✗ running" in stopped.stderr and f"fix: pct start {OTHER}" in stopped.stderr
    assert history.returncode == 3 and f"container {OTHER} not running" in history.stderr

    empty = project.root / "empty_known_hosts"
    empty.write_text("")
    project.write(
        {"opsdoc": (OTHER, project.playbook("opsdoc"))},
        host=project.host(known_hosts=str(empty)),
    )
    unknown = project.launcher("doctor")
    assert unknown.returncode == 3
    assert "✓ reachable" in unknown.stderr and "✗ host key" in unknown.stderr
    assert "ssh-keyscan" in unknown.stderr

    project.write(
        {"opsdoc": (OTHER, project.playbook("opsdoc"))},
        host=project.host(port=1, connect_timeout=1),
    )
    unreachable = project.launcher("doctor")
    assert unreachable.returncode == 3 and "✗ reachable" in unreachable.stderr
    logs = project.launcher("logs")
    assert logs.returncode == 3 and "cannot connect" in logs.stderr

    project.write({"opsdoc": (OTHER, project.playbook("opsdoc", session="bad name"))})
    invalid = project.launcher("doctor")
    assert invalid.returncode == 2 and "✗ config" in invalid.stderr


def test_status_poll_has_record_and_log_age(project: Project) -> None:
    from launcher.agent.protocol import BOOT
    from launcher.container.agentclient import payload

    book = project.playbook("opspoll", gpus=0)
    project.write({"opspoll": (VMID, book)})
    ok(project.launcher("deploy", "--restart"))
    request = {"op": "poll", "workdir": "/root/opspoll", "session": "opspoll", "lines": 5}

    def poll() -> dict[str, object]:
        result = project.sandbox.ct_exec(VMID, ["python3", "-c", BOOT], input=payload(request))
        return dict(json.loads(result.stdout.decode().splitlines()[-1]))

    project.wait_for(lambda: poll()["log_age"] is not None, what="the log file")
    answer = poll()
    assert isinstance(answer["log_age"], float) and answer["log_age"] < 10
    record = answer["record"]
    assert isinstance(record, dict) and record["sha256"] == TRAINER_SHA
    project.kill_session(VMID, "opspoll")

"""Persisted connections (`control_persist:`) against the sandbox."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.project import DEMO_TRAINER, Project, local_processes

pytestmark = pytest.mark.e2e

VMID = 201
NAME = "persisted"


def servers() -> list[int]:
    """pids of this test's background processes (its own XDG_RUNTIME_DIR)."""
    mine = f"XDG_RUNTIME_DIR={os.environ['XDG_RUNTIME_DIR']}".encode()
    return [
        pid
        for pid, cmdline, environ in local_processes()
        if b"launcher.transport.persistserver" in cmdline.split(b"\0") and mine in environ
    ]


def sockets(runtime: Path) -> list[Path]:
    return sorted((runtime / "launcher").glob("*.sock"))


def status(project: Project) -> tuple[int, dict[str, object]]:
    result = project.launcher("status", "-t", NAME, "--json")
    assert result.returncode in (0, 1), result.stderr
    doc = json.loads(result.stdout)
    return result.returncode, doc


@pytest.fixture
def persisted(project: Project) -> Project:
    """A running demo trainer on a host with control_persist: 30."""
    project.deploy_healthy(NAME, VMID, host=project.host(control_persist=30))
    return project


def test_later_commands_use_the_persisted_connection(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    project = persisted
    project.wait_for(lambda: sockets(_private_runtime_dir), what="the persisted connection")
    [sock] = sockets(_private_runtime_dir)
    assert sock.stat().st_mode & 0o777 == 0o600
    assert (_private_runtime_dir / "launcher").stat().st_mode & 0o777 == 0o700

    before, pct0 = project.sshd_logins(), project.sandbox.pct_calls()
    for _ in range(3):
        code, doc = status(project)
        assert code == 0 and doc["verdict"] == "healthy"
    assert project.sshd_logins() == before  # no new SSH connection: all through the background one
    assert project.sandbox.pct_calls() - pct0 == 3  # one poll each

    # `logs` goes through it too, and so does a deploy, whose transaction is streamed.
    assert project.launcher("logs", "-t", NAME, "-n", "5").returncode == 0
    deployed = project.launcher("deploy", "-t", NAME, "--restart")
    assert deployed.returncode == 0, deployed.stderr
    assert "launch" in deployed.stderr  # its steps, as they happened
    assert project.sshd_logins() == before

    ended = project.launcher("disconnect")
    assert ended.returncode == 0 and "ended 1 persisted connection" in ended.stdout
    project.wait_for(lambda: not servers() and not sockets(_private_runtime_dir), what="the end")
    code, _ = status(project)  # connects by itself again, and starts a new one
    assert code == 0
    project.wait_for(lambda: sockets(_private_runtime_dir), what="a new persisted connection")
    # status's own connection and the new one's
    assert project.sshd_logins(at_least=before + 2) == before + 2


def test_killed_background_process_costs_nothing_but_a_connect(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    project = persisted
    project.wait_for(lambda: servers(), what="the background process")
    [pid] = servers()
    os.kill(pid, signal.SIGKILL)
    project.wait_for(lambda: not servers(), what="the kill")
    assert sockets(_private_runtime_dir)  # left behind by the killed process

    code, doc = status(project)
    assert code == 0 and doc["verdict"] == "healthy"
    project.wait_for(lambda: len(servers()) == 1, what="a new background process")


def test_idle_background_process_ends_by_itself(
    project: Project, _private_runtime_dir: Path
) -> None:
    project.write({NAME: (VMID, project.playbook(NAME))}, host=project.host(control_persist=2))
    assert project.launcher("deploy", "-t", NAME, "--restart").returncode == 0
    project.wait_for(lambda: servers(), what="the background process")
    project.wait_for(lambda: not servers(), timeout=30, what="it to end after 2 s idle")
    assert sockets(_private_runtime_dir) == []


def test_another_user_cannot_use_it(persisted: Project, _private_runtime_dir: Path) -> None:
    project = persisted
    project.wait_for(lambda: sockets(_private_runtime_dir), what="the persisted connection")
    [sock] = sockets(_private_runtime_dir)
    code = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(sock)], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "refused", result.stderr
    # Past the directory, the server still answers only its own user: tests/local/test_persist.py


def test_a_changed_inventory_gets_a_connection_of_its_own(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    project = persisted
    project.wait_for(lambda: len(sockets(_private_runtime_dir)) == 1, what="one connection")
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["hosts"]["sandbox"]["command_timeout"] = 120
    project.inventory.write_text(yaml.safe_dump(inventory))
    code, _ = status(project)
    assert code == 0
    project.wait_for(lambda: len(sockets(_private_runtime_dir)) == 2, what="a second one")


def test_on_an_interactive_terminal_the_connection_persists_by_default(
    project: Project, _private_runtime_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that sets no control_persist: `launcher status` on a terminal (a pty, through
    script(1)) leaves a background process for the next command; the same command under CI=true,
    or with its output captured (a script), leaves none."""
    project.deploy_healthy(NAME, VMID)  # no control_persist in the inventory
    assert servers() == []
    argv = project.argv("status", "-t", NAME)
    monkeypatch.delenv("LAUNCHER_CONTROL_PERSIST", raising=False)

    def on_a_terminal(ci: bool) -> None:
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        if ci:
            env["CI"] = "true"
        command = ["script", "-qec", shlex.join(argv), "/dev/null"]
        done = subprocess.run(command, env=env, capture_output=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout.decode(errors="replace")

    monkeypatch.delenv("CI", raising=False)
    assert status(project)[0] == 0  # captured output: no terminal
    on_a_terminal(ci=True)
    # A background process is started before the command ends: none now means none at all.
    assert servers() == [] and sockets(_private_runtime_dir) == []

    on_a_terminal(ci=False)
    project.wait_for(lambda: sockets(_private_runtime_dir), what="the persisted connection")
    [pid] = servers()
    before = project.sshd_logins()
    assert status(project)[0] == 0  # no terminal, but the default is the terminal's only
    assert project.sshd_logins(at_least=before + 1) == before + 1
    on_a_terminal(ci=False)
    assert project.sshd_logins() == before + 1  # through the background process
    assert servers() == [pid]


def agents_in(project: Project) -> list[str]:
    out = project.ct_text(VMID, "ps", "-eo", "args=")
    return [line for line in out.splitlines() if "launcher_agent" in line or "json,sys" in line]


def relays(server: int) -> list[int]:
    """pids of the relays that background process `server` has on the host (this machine):
    relay.py's program, in a session whose SSH_CONNECTION starts at one of its TCP ports."""
    ports = tuple(f"SSH_CONNECTION=127.0.0.1 {port} ".encode() for port in local_ports(server))
    return [
        pid
        for pid, cmdline, environ in local_processes()
        if b"launcher_relay" in cmdline and any(var.startswith(ports) for var in environ)
    ]


def started_relay(project: Project) -> tuple[int, int]:
    """The background process and its relay, which the first command through it starts.
    The process is waited for until it listens: a command sent before that runs on a
    connection of its own (as it should), and would start no relay."""
    runtime = Path(os.environ["XDG_RUNTIME_DIR"])
    project.wait_for(lambda: sockets(runtime), what="the background process's socket")
    [server] = project.wait_for(lambda: servers(), what="the background process")
    code, _ = status(project)
    assert code == 0
    [relay] = relays(server)
    return server, relay


def local_ports(pid: int) -> set[int]:
    """The local ports of process `pid`'s TCP sockets (/proc/net/tcp, by socket inode)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            ports.add(int(fields[1].rpartition(":")[2], 16))
    return ports


def test_the_hosts_session_and_login_shell_are_paid_once(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    """Through the persisted connection, commands travel through its relay on the host: after
    the first, a status, a log read or a deploy starts no sshd session (no login shell), where
    each would otherwise start one. `logs -f`, which keeps its stdin open, gets a session of
    its own."""
    project = persisted
    server, relay = started_relay(project)
    logins, sessions = project.sshd_logins(), project.sshd_sessions()
    for _ in range(3):
        code, doc = status(project)
        assert code == 0 and doc["verdict"] == "healthy"
    assert project.launcher("logs", "-t", NAME, "-n", "5").returncode == 0
    deployed = project.launcher("deploy", "-t", NAME, "--restart")
    assert deployed.returncode == 0, deployed.stderr
    assert project.sshd_sessions() == sessions and project.sshd_logins() == logins
    assert relays(server) == [relay]

    argv = project.argv()
    argv += ["logs", "-f", "--tail", "1", "-t", NAME]
    followed = subprocess.run(
        ["bash", "-c", f"{shlex.join(argv)} | head -1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert followed.stdout.count("\n") == 1, followed.stderr
    assert project.sshd_sessions(at_least=sessions + 1) == sessions + 1
    assert project.sshd_logins() == logins


def test_concurrent_commands_share_the_relay_and_each_gets_its_own_answer(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    """Four `status --json` at once through one persisted connection: four polls on the relay's
    one channel, each answer whole and its own (one JSON document, this target's), and no
    session or login beyond the relay's."""
    project = persisted
    server, relay = started_relay(project)
    logins, sessions = project.sshd_logins(), project.sshd_sessions()
    argv = project.argv()
    clients = [
        subprocess.Popen(
            [*argv, "status", "-t", NAME, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for client in clients:
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        doc = json.loads(out)
        assert doc["verdict"] == "healthy" and doc["target"] == NAME
    assert project.sshd_sessions() == sessions and project.sshd_logins() == logins
    assert relays(server) == [relay]


def test_a_deploy_outlives_its_killed_client_through_the_relay(
    project: Project, _private_runtime_dir: Path
) -> None:
    """kill -9 of `deploy --restart` while its transaction, carried by the persisted
    connection's relay, waits out the old run's stop (it ignores C-c: 3 s of grace). The
    transaction outlives its client, as over a channel of its own: the new version is installed,
    launched and recorded, and its lock released (the next deploy breaks no stale lock)."""
    book = project.playbook(NAME, env={"DEMO_IGNORE_SIGINT": "1"}, stop_grace=3)
    host = project.host(control_persist=30)
    project.write({NAME: (VMID, book)}, host=host)
    assert project.launcher("deploy", "-t", NAME, "--restart").returncode == 0
    started_relay(project)
    sessions = project.sshd_sessions()
    v2 = project.root / "train_v2.py"
    v2.write_bytes(DEMO_TRAINER.read_bytes() + b"\n# v2\n")
    v2_sha = hashlib.sha256(v2.read_bytes()).hexdigest()
    book["script"]["source"] = str(v2)
    project.write({NAME: (VMID, book)}, host=host)

    argv = project.argv()
    client = subprocess.Popen(
        [*argv, "deploy", "-t", NAME, "--restart"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stderr is not None
    seen = []
    for line in client.stderr:  # the steps as they happen: kill it during the stop's countdown
        seen.append(line)
        if line.startswith("… stop"):
            break
    else:
        raise AssertionError(f"no stop countdown: {seen}")
    client.kill()
    client.wait(timeout=10)

    def recorded() -> bool:
        doc = json.loads(project.launcher("history", "-t", NAME, "--json").stdout)
        return bool(doc["records"]) and doc["records"][0]["sha256"] == v2_sha

    project.wait_for(recorded, timeout=30, what="the killed client's deploy to be recorded")
    installed = project.ct_text(VMID, "sha256sum", f"/root/{NAME}/train_demo.py").split()[0]
    assert installed == v2_sha
    project.wait_for(lambda: project.processes(VMID, "train_demo.py"), what="the new run")
    assert project.sshd_sessions() == sessions  # it went through the relay
    again = project.launcher("deploy", "-t", NAME, "--restart")
    assert again.returncode == 0, again.stderr
    assert "broke stale lock" not in again.stderr


def test_a_relay_killed_on_the_host_costs_the_next_command_nothing_but_a_session(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    """kill -9 of the persisted connection's relay while it is idle: the next command still
    works, through a new relay, on the same SSH connection and the same background process."""
    project = persisted
    server, relay = started_relay(project)
    logins, sessions = project.sshd_logins(), project.sshd_sessions()
    os.kill(relay, signal.SIGKILL)
    project.wait_for(lambda: relay not in relays(server), what="the relay to end")
    for _ in range(2):
        code, doc = status(project)
        assert code == 0 and doc["verdict"] == "healthy"
    [again] = relays(server)
    assert again != relay
    assert project.sshd_sessions(at_least=sessions + 1) == sessions + 1  # the new relay's
    assert project.sshd_logins() == logins and servers() == [server]


def test_logs_follow_streams_through_it_and_ctrl_c_ends_the_remote_follower(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    """`logs -f` through the background process: new lines as they are written, no SSH
    connection of its own; Ctrl-C closes its socket, and the background process cuts the
    command off at once (the agent in the container sees its stdin close and ends), while the
    run goes on and the background process keeps serving."""
    project = persisted
    project.wait_for(lambda: servers(), what="the background process")
    [pid] = servers()
    before = project.sshd_logins()
    argv = project.argv()
    follower = subprocess.Popen(
        [*argv, "logs", "-f", "--tail", "0", "-t", NAME],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    found: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert follower.stdout is not None
        for line in follower.stdout:
            found.put(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 30
    seen = 0
    while seen < 2:  # two new status lines, printed while following
        assert time.monotonic() < deadline, "no new lines while following"
        with contextlib.suppress(queue.Empty):
            seen += "step=" in found.get(timeout=0.5)
    assert agents_in(project), "the follower runs in the container"
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=15)
    assert follower.returncode == 0, err
    assert "stopped following" in err
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")
    assert project.processes(VMID, "train_demo.py"), "Ctrl-C must leave the run alive"
    assert project.sshd_logins() == before  # all through the background process
    code, doc = status(project)
    assert code == 0 and doc["verdict"] == "healthy"
    assert servers() == [pid] and project.sshd_logins() == before


def test_a_reader_that_goes_away_ends_the_persisted_follow(
    persisted: Project, _private_runtime_dir: Path
) -> None:
    """`logs -f | head -2`: the reader goes away, launcher exits 141 as with a direct
    connection, and the remote follower ends."""
    project = persisted
    project.wait_for(lambda: servers(), what="the background process")
    before = project.sshd_logins()
    argv = project.argv()
    argv += ["logs", "-f", "--tail", "5", "-t", NAME]
    script = f'{shlex.join(argv)} | head -2; echo "PIPESTATUS=${{PIPESTATUS[*]}}" >&2'
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "PIPESTATUS=141 0" in done.stderr, done.stderr
    assert len(done.stdout.splitlines()) == 2
    for noise in ("Traceback", "Broken pipe", "Exception ignored", "error:"):
        assert noise not in done.stderr, done.stderr
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")
    assert project.sshd_logins() == before

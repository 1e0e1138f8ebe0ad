"""The command server (launcher/entry/cmdserver/) against the sandbox: a served command prints,
exits and ends as the same command run in-process does, and every way it can go wrong (a signal, a
closed pipe, a killed client or server, another user, changed code, a stale socket, a host
that prompts) ends in a command run once, correctly."""

from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import launcher
from launcher.entry.cmdserver import wire
from tests.e2e.project import Project, local_processes
from tests.e2e.test_ssh_paths import (  # locked_key: the fixture, a key with a passphrase
    PASSPHRASE,
    locked_inventory,
    locked_key,  # noqa: F401
    run_on_terminal,
)

pytestmark = pytest.mark.e2e

VMID = 201
NAME = "served"
SERVED_ENV = {"LAUNCHER_CONTROL_PERSIST": "30"}
LAUNCHER = [sys.executable, "-m", "launcher"]


# -- helpers -------------------------------------------------------------------------------------


def env_of(served: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LAUNCHER_CONTROL_PERSIST"}
    return {**env, **(SERVED_ENV if served else {}), **(extra or {})}


def run(
    project: Project,
    *args: str,
    served: bool = True,
    env: dict[str, str] | None = None,
    python: tuple[str, ...] = (),
    inventory: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it; served=True: LAUNCHER_CONTROL_PERSIST set (a server is used
    if one runs), False: unset (no terminal: in-process, and no server is started)."""
    argv = [sys.executable, *python, "-m", "launcher"]
    argv += ["-i", str(project.inventory)] if inventory else []
    return subprocess.run(
        [*argv, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env_of(served, env),
        cwd=cwd,
    )


def popen(project: Project, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*LAUNCHER, "-i", str(project.inventory), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_of(True),
        process_group=0,  # a job of its own, as a shell starts one (not an orphaned group)
    )


def servers(runtime: Path) -> list[int]:
    """pids of this test's command servers (its own XDG_RUNTIME_DIR)."""
    mine = f"XDG_RUNTIME_DIR={runtime}".encode()
    return [
        pid
        for pid, cmdline, environ in local_processes()
        if b"launcher.entry.cmdserver.server" in cmdline and mine in environ
    ]


def children(pid: int) -> list[int]:
    """Live (not zombie) children of pid: a server's commands under way."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(proc.name))
    return found


def sockets(runtime: Path) -> list[Path]:
    return sorted(p for p in (runtime / "launcher").glob("cmd-*") if p.suffix != ".lock")


def warm(project: Project, runtime: Path) -> int:
    """A command server for this code, started by a command run in-process; its pid."""
    result = run(project, "status", "-t", NAME, "--json")
    assert result.returncode in (0, 1), result.stderr
    project.wait_for(lambda: servers(runtime) and sockets(runtime), what="a command server")
    [pid] = servers(runtime)
    return pid


def imported(stderr: str) -> set[str]:
    """Modules `python -X importtime` says this process imported."""
    names = set()
    for line in stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rpartition("|")[2].strip())
    return names


def assert_served(result: subprocess.CompletedProcess[str]) -> None:
    """Run with `-X importtime`: the client imported neither click nor pydantic, and the
    server's child (whose stderr is the client's) imported nothing the server had not."""
    names = imported(result.stderr)
    assert "launcher.entry.cmdserver.client" in names, result.stderr[-2000:]
    heavy = {n for n in names if n.split(".")[0] in ("click", "pydantic", "paramiko", "yaml")}
    assert not heavy, heavy
    client = {"launcher", "launcher.entry", "launcher.entry.console", "launcher.core"}
    client |= {"launcher.core.version", "launcher.transport"}
    client |= {"launcher.transport.rundir", "launcher.entry.cmdserver"}
    later = {n for n in names if n.startswith("launcher")} - client
    later -= {n for n in names if n.startswith("launcher.entry.cmdserver.")}
    assert not later, sorted(later)


NUMBER = re.compile(r"\d+(\.\d+)?")
SPARKLINE = re.compile("[▁▂▃▄▅▆▇█]+")
HEX = re.compile(r"\b[0-9a-f]{6,}\b")  # a run id's or a temporary file's random part


def normalized(text: str) -> str:
    """Output with every number (times, ages, steps, sizes, timestamps) as 0, every
    sparkline (as long as the run's samples) as one block, run ids' random part as h."""
    return SPARKLINE.sub("█", NUMBER.sub("0", HEX.sub("h", text)))


def difference(mine: str, theirs: str) -> str:
    lines = normalized(mine).splitlines(), normalized(theirs).splitlines()
    return "\n".join(difflib.unified_diff(*lines, lineterm=""))


@pytest.fixture
def served(project: Project) -> Project:
    """A healthy demo run on a host whose connection persists."""
    project.deploy_healthy(NAME, VMID, host=project.host(control_persist=30))
    return project


# -- the same output and exit code ----------------------------------------------------------------


@pytest.fixture
def frozen(project: Project) -> Project:
    """A run that printed for 6 s and then nothing more (alive, GPUs held): two commands a
    moment apart see the same pane."""
    book = project.playbook(NAME, env={"DEMO_MODE": "hang", "DEMO_HANG_AFTER": "6"})
    project.write({NAME: (VMID, book)}, host=project.host(control_persist=30))
    deployed = project.launcher("deploy", "-t", NAME, "--restart")
    assert deployed.returncode == 0, deployed.stderr
    # Still means unchanged for three of the trainer's 1 s intervals: two reads that fall
    # between two of its lines match while it is still printing.
    pane, since = [""], [0.0]

    def still() -> bool:
        now = project.launcher("logs", "-t", NAME, "-n", "3").stdout
        if now != pane[0] or "step=" not in now:
            pane[0], since[0] = now, time.monotonic()
            return False
        return time.monotonic() - since[0] >= 3.0

    project.wait_for(still, timeout=40, what="the pane to stop changing")
    return project


def test_served_commands_print_and_exit_as_in_process(
    frozen: Project, _private_runtime_dir: Path
) -> None:
    project = frozen
    warm(project, _private_runtime_dir)
    for args in (
        ("status", "-t", NAME, "--json"),
        ("status", "-t", NAME),
        ("logs", "-t", NAME, "-n", "20"),
        ("history", "-t", NAME, "--json"),
        ("status", "-t", "nosuchtarget"),  # a usage error: exit 2 and its message
        ("stop", "-t", "nosuchtarget", "--json"),
    ):
        mine, theirs = run(project, *args), run(project, *args, served=False)
        assert mine.returncode == theirs.returncode, (args, mine.stderr, theirs.stderr)
        assert normalized(mine.stdout) == normalized(theirs.stdout), difference(
            mine.stdout, theirs.stdout
        )
        assert normalized(mine.stderr) == normalized(theirs.stderr), difference(
            mine.stderr, theirs.stderr
        )
    # A deploy: its steps on stderr as they happen, its JSON report (checkpoints left in
    # place: the run each deploy replaces may or may not have written one yet).
    deploy = ("deploy", "-t", NAME, "--restart", "--keep-checkpoints", "--json")
    mine, theirs = run(project, *deploy), run(project, *deploy, served=False)
    assert mine.returncode == theirs.returncode == 0, mine.stderr + theirs.stderr
    # Each replaced a run of its own (their processes, its stop's detail): the same report,
    # the same steps in the same order with the same outcome.
    ours, others = json.loads(mine.stdout), json.loads(theirs.stdout)
    assert paths(ours) == paths(others)
    assert steps(ours) == steps(others)
    assert [line.split()[:2] for line in mine.stderr.splitlines()] == [
        line.split()[:2] for line in theirs.stderr.splitlines()
    ]


def paths(doc: object, prefix: str = "") -> set[str]:
    """Every key path of a JSON document (a list's items' paths merged)."""
    if isinstance(doc, dict):
        return {p for k, v in doc.items() for p in {f"{prefix}.{k}"} | paths(v, f"{prefix}.{k}")}
    if isinstance(doc, list):
        return {p for item in doc for p in paths(item, f"{prefix}[]")}
    return set()


def steps(doc: dict[str, object]) -> list[tuple[object, object]]:
    found = json.dumps(doc)
    return re.findall(r'"name": "([a-z_]+)", "status": "([a-z]+)"', found)


def test_served_commands_run_in_the_server_and_import_nothing(
    served: Project, _private_runtime_dir: Path
) -> None:
    """With `-X importtime` (a server of its own: the flags are part of the fingerprint): the
    client imports no library, the child nothing at all."""
    project = served
    xopt = ("-X", "importtime")
    first = run(project, "status", "-t", NAME, python=xopt)
    assert first.returncode == 0 and "click" in imported(first.stderr)  # in-process
    project.wait_for(lambda: sockets(_private_runtime_dir), what="a command server")
    for args in (
        ("status", "-t", NAME, "--json"),
        ("logs", "-t", NAME, "-n", "3"),
        ("deploy", "-t", NAME, "--restart"),
        ("verify", "-t", NAME, "--wait", "3", "--interval", "1"),
    ):
        result = run(project, *args, python=xopt)
        assert result.returncode in (0, 1), result.stderr[-3000:]
        assert_served(result)


# -- signals, pipes, a client or server that goes away -------------------------------------------


def agents_in(project: Project) -> list[str]:
    out = project.ct_text(VMID, "ps", "-eo", "args=")
    return [line for line in out.splitlines() if "launcher_agent" in line or "json,sys" in line]


def started_follow(project: Project, server: int) -> subprocess.Popen[str]:
    """A served `logs -f`, following (a new status line seen), run by one child of the server."""
    proc = popen(project, "logs", "-t", NAME, "-f", "--tail", "0")
    assert proc.stdout is not None and "step=" in proc.stdout.readline()
    assert len(children(server)) == 1
    return proc


def signalled_in_process_follow(project: Project, signum: int) -> tuple[int, str]:
    """An in-process `logs -f` sent `signum` once it follows: its exit code and stderr."""
    alone = subprocess.Popen(
        [*LAUNCHER, "-i", str(project.inventory), "logs", "-t", NAME, "-f", "--tail", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env_of(False),
    )
    assert alone.stdout is not None and "step=" in alone.stdout.readline()
    alone.send_signal(signum)
    _, err = alone.communicate(timeout=15)
    return alone.returncode, err


def test_ctrl_c_on_a_served_follow_ends_it_as_in_process(
    served: Project, _private_runtime_dir: Path
) -> None:
    project = served
    server = warm(project, _private_runtime_dir)
    # In-process first: what Ctrl-C does to `logs -f` (it stops following: exit 0).
    alone_code, alone_err = signalled_in_process_follow(project, signal.SIGINT)

    proc = started_follow(project, server)
    proc.send_signal(signal.SIGINT)  # what a terminal sends the foreground process
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == alone_code, err
    assert "stopped following" in err and err.strip() == alone_err.strip()
    project.wait_for(lambda: not children(server), what="the child's end")
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")


def test_sigterm_on_a_served_command_ends_it_as_in_process(
    served: Project, _private_runtime_dir: Path
) -> None:
    project = served
    server = warm(project, _private_runtime_dir)
    alone_code, _ = signalled_in_process_follow(project, signal.SIGTERM)

    proc = started_follow(project, server)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=15)
    assert proc.returncode == alone_code == -signal.SIGTERM
    project.wait_for(lambda: not children(server), what="the child's end")
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def test_ctrl_z_stops_the_served_command_and_fg_resumes_it(
    served: Project, _private_runtime_dir: Path
) -> None:
    project = served
    server = warm(project, _private_runtime_dir)
    proc = started_follow(project, server)
    [child] = children(server)
    proc.send_signal(signal.SIGTSTP)  # Ctrl-Z
    project.wait_for(lambda: state(proc.pid) == state(child) == "T", what="both stopped")
    proc.send_signal(signal.SIGCONT)  # fg
    project.wait_for(lambda: "T" not in (state(proc.pid), state(child)), what="both resumed")
    assert proc.stdout is not None and "step=" in proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "stopped following" in err, err


def test_a_closed_pipe_ends_a_served_follow_with_141(
    served: Project, _private_runtime_dir: Path
) -> None:
    """`launcher logs -f | head -1`: the shell's own pipe, the reader gone after a line."""
    project = served
    server = warm(project, _private_runtime_dir)
    argv = [*LAUNCHER, "-i", str(project.inventory), "logs", "-t", NAME, "-f", "--tail", "0"]
    line = "import shlex, sys; print(shlex.join(sys.argv[1:]))"
    command = subprocess.run(
        [sys.executable, "-c", line, *argv], capture_output=True, text=True, check=True
    ).stdout.strip()
    shell = subprocess.run(
        ["bash", "-c", f'{command} | head -1; echo "${{PIPESTATUS[0]}}"'],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_of(True),
        check=False,
    )
    first, code = shell.stdout.splitlines()
    assert "step=" in first
    assert code == "141", shell.stderr
    project.wait_for(lambda: not children(server), what="the child's end")
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")


def test_a_killed_client_ends_its_command(served: Project, _private_runtime_dir: Path) -> None:
    project = served
    server = warm(project, _private_runtime_dir)
    proc = started_follow(project, server)
    proc.kill()
    proc.wait(10)
    project.wait_for(lambda: not children(server), what="the child's end")
    project.wait_for(lambda: agents_in(project) == [], what="the remote follower to end")
    assert servers(_private_runtime_dir) == [server]  # the server goes on
    again = run(project, "status", "-t", NAME, "--json")
    assert again.returncode == 0, again.stderr


def test_a_killed_server_or_a_stale_socket_costs_one_command_in_process(
    served: Project, _private_runtime_dir: Path
) -> None:
    project = served
    server = warm(project, _private_runtime_dir)
    [path] = sockets(_private_runtime_dir)
    os.kill(server, signal.SIGKILL)
    project.wait_for(lambda: not servers(_private_runtime_dir), what="the kill")
    assert path.exists()  # left behind: a stale socket nobody answers
    result = run(project, "status", "-t", NAME, "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["verdict"] == "healthy"
    [new] = project.wait_for(lambda: servers(_private_runtime_dir), what="a new server")
    assert new != server and sockets(_private_runtime_dir) == [path]

    # A socket file nobody listens on, planted where the server listens (its lock free).
    os.kill(new, signal.SIGKILL)
    project.wait_for(lambda: not servers(_private_runtime_dir), what="the kill")
    path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(path))
    stale.close()
    result = run(project, "status", "-t", NAME, "--json")
    assert result.returncode == 0, result.stderr
    project.wait_for(lambda: servers(_private_runtime_dir), what="a server on the stale path")
    served_again = run(project, "status", "-t", NAME, python=("-X", "importtime"))
    assert served_again.returncode == 0


def test_a_server_killed_under_a_running_command(
    served: Project, _private_runtime_dir: Path
) -> None:
    """The command goes on to its end; the next command starts a new server at once (the old
    child holds neither the lock nor the listening socket)."""
    project = served
    server = warm(project, _private_runtime_dir)
    proc = started_follow(project, server)
    [child] = children(server)  # its command line is the server's: told apart by pid

    def others() -> list[int]:
        return [pid for pid in servers(_private_runtime_dir) if pid != child]

    [path] = sockets(_private_runtime_dir)
    old_inode = path.stat().st_ino
    os.kill(server, signal.SIGKILL)
    project.wait_for(lambda: not others(), what="the kill")
    assert proc.stdout is not None and "step=" in proc.stdout.readline()  # still following
    assert run(project, "status", "-t", NAME).returncode == 0
    [new] = project.wait_for(others, what="a new server")

    def rebound() -> bool:
        return path.exists() and path.stat().st_ino != old_inode

    project.wait_for(rebound, what="the new server listening")
    served_now = run(project, "status", "-t", NAME, "--json")
    assert served_now.returncode == 0 and others() == [new]
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0 and "stopped following" in err, err


def test_another_users_process_cannot_use_it(served: Project, _private_runtime_dir: Path) -> None:
    """Its directory is the user's own (0700) and its socket 0600; opened to everyone, the
    server still answers nobody but its user (SO_PEERCRED), and runs nothing."""
    project = served
    server = warm(project, _private_runtime_dir)
    [path] = sockets(_private_runtime_dir)
    probe = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('refused'); sys.exit(0)\n"
        "s.settimeout(10)\n"
        "try:\n"
        "    socket.send_fds(s, [sys.argv[2].encode()], [0, 1, 2])\n"
        "    print('answered' if s.recv(65536) else 'closed')\n"
        "except (BrokenPipeError, ConnectionResetError):\n"
        "    print('closed')\n"
    )
    request = wire.Request(
        project.argv("stop", "-t", NAME),
        "/",
        env_of(True),
        0o022,
        [wire.Stream("utf-8", "strict", False, False)] * 3,
    )

    def as_nobody() -> str:
        result = subprocess.run(
            # the system's python3: the venv's lives under /root, which nobody may enter
            ["/usr/bin/python3", "-c", probe, str(path), wire.encode(request).decode()],
            capture_output=True,
            text=True,
            user=65534,
            group=65534,
            extra_groups=[],
            cwd="/",
            timeout=30,
            check=False,
        )
        return result.stdout.strip() or result.stderr

    assert as_nobody() == "refused"
    pct0 = project.sandbox.pct_calls()
    runtime = _private_runtime_dir / "launcher"
    for where in (_private_runtime_dir, runtime):
        where.chmod(0o777)
    path.chmod(0o777)
    try:
        assert as_nobody() == "closed"
    finally:
        path.chmod(0o600)
        runtime.chmod(0o700)
        _private_runtime_dir.chmod(0o700)
    assert not children(server)
    assert project.sandbox.pct_calls() == pct0  # nothing ran: the run was not stopped
    code = run(project, "status", "-t", NAME, "--json")
    assert code.returncode == 0 and json.loads(code.stdout)["verdict"] == "healthy"


def test_changed_code_gets_a_server_of_its_own(
    served: Project, _private_runtime_dir: Path, tmp_path: Path
) -> None:
    """The code changed is a copy of the package of this test's own (on PYTHONPATH, ahead of
    the installed one): the checkout's files, which every worker's commands run, stay as
    they are (a changed mtime there turns other workers' servers away while it lasts)."""
    project = served
    shutil.copytree(
        Path(launcher.__file__).resolve().parent,
        tmp_path / "code" / "launcher",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    own = {"PYTHONPATH": str(tmp_path / "code")}
    where = subprocess.run(
        [sys.executable, "-c", "import launcher; print(launcher.__file__)"],
        env=env_of(True, own),
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,  # `-m` and `-c` put the working directory first on sys.path
    )
    assert where.stdout.strip() == str(tmp_path / "code" / "launcher" / "__init__.py")
    result = run(project, "status", "-t", NAME, "--json", env=own, cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    project.wait_for(lambda: sockets(_private_runtime_dir), what="a command server")
    [old] = servers(_private_runtime_dir)
    [old_path] = sockets(_private_runtime_dir)
    source = tmp_path / "code" / "launcher" / "core" / "version.py"
    stamp = source.stat()
    os.utime(source, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000_000))
    first = run(project, "status", "-t", NAME, env=own, python=("-X", "importtime"), cwd=tmp_path)
    assert first.returncode == 0 and "click" in imported(first.stderr)  # not the old one
    project.wait_for(lambda: len(sockets(_private_runtime_dir)) == 2, what="a new server")
    [new_path] = [p for p in sockets(_private_runtime_dir) if p != old_path]
    assert new_path.name != old_path.name
    assert old in servers(_private_runtime_dir)  # idle until its time is up, serving nobody


def test_concurrent_served_commands(served: Project, _private_runtime_dir: Path) -> None:
    project = served
    warm(project, _private_runtime_dir)
    results: list[subprocess.CompletedProcess[str]] = []

    def one() -> None:
        results.append(run(project, "status", "-t", NAME, "--json"))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 6
    for result in results:
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["verdict"] == "healthy"
    assert len(servers(_private_runtime_dir)) == 1


def test_an_environment_too_large_to_hand_over_runs_in_process(
    project: Project, _private_runtime_dir: Path
) -> None:
    project.write({NAME: (VMID, project.playbook(NAME))})
    assert run(project, "history", "-t", NAME).returncode == 0  # starts a server
    project.wait_for(lambda: sockets(_private_runtime_dir), what="a command server")
    theirs = run(project, "history", "-t", NAME)
    # more than the socket's buffer takes in one packet (EMSGSIZE); more than MAX_PACKET
    for count in (3, 12):
        big = {f"BIG{n}": "x" * 110_000 for n in range(count)}
        mine = run(project, "history", "-t", NAME, env=big)
        assert mine.returncode == theirs.returncode == 0, mine.stderr
        assert mine.stdout == theirs.stdout


def test_the_server_ends_when_idle(project: Project, _private_runtime_dir: Path) -> None:
    project.write({NAME: (VMID, project.playbook(NAME))})
    quick = {"LAUNCHER_CONTROL_PERSIST": "2"}
    result = run(project, "history", "-t", NAME, env=quick)
    assert result.returncode == 0, result.stderr
    project.wait_for(lambda: servers(_private_runtime_dir), what="a command server")
    project.wait_for(lambda: not servers(_private_runtime_dir), timeout=15, what="its idle end")
    assert not sockets(_private_runtime_dir)


def test_disconnect_ends_the_command_server(served: Project, _private_runtime_dir: Path) -> None:
    project = served
    warm(project, _private_runtime_dir)
    ended = run(project, "disconnect", served=False)
    assert ended.returncode == 0, ended.stderr
    assert "and 1 command server(s)" in ended.stdout, ended.stdout
    assert not sockets(_private_runtime_dir)  # no later command reaches it
    project.wait_for(lambda: not servers(_private_runtime_dir), timeout=10, what="its end")
    # The next command runs in-process and starts a new server, which serves the one after
    # (with `-X importtime`, which is part of the fingerprint: a server of its own).
    xopt = ("-X", "importtime")
    first = run(project, "status", "-t", NAME, python=xopt)
    assert first.returncode == 0 and "click" in imported(first.stderr)  # in-process
    project.wait_for(lambda: sockets(_private_runtime_dir), what="a new command server")
    assert_served(run(project, "status", "-t", NAME, python=xopt))
    again = run(project, "disconnect", served=False)
    assert "and 1 command server(s)" in again.stdout, again.stdout
    project.wait_for(lambda: not servers(_private_runtime_dir), timeout=10, what="its end")


# -- what a fresh process would see -------------------------------------------------------------


def test_each_served_command_sees_its_own_environment_and_terminal(
    served: Project, _private_runtime_dir: Path, tmp_path: Path
) -> None:
    """NO_COLOR, COLUMNS, the terminal, GitHub's summary file and LAUNCHER_INVENTORY, different
    in consecutive commands of one server: each prints what a fresh process prints."""
    project = served
    server = warm(project, _private_runtime_dir)
    # A dry-run deploy's steps are coloured on a terminal (ui.echo_step).
    argv = [*LAUNCHER, "-i", str(project.inventory), "deploy", "-t", NAME, "--restart", "--dry-run"]
    for extra in ({}, {"NO_COLOR": "1"}, {}, {"TERM": "dumb"}):
        mine = run_on_terminal(argv, [], env=env_of(True, extra))
        theirs = run_on_terminal(
            argv, [], env=env_of(False, {"LAUNCHER_CONTROL_PERSIST": "0", **extra})
        )
        assert mine[0] == theirs[0] == 0, mine[1]
        colored = "\x1b[" in mine[1]
        assert colored == ("\x1b[" in theirs[1]) == (not extra), (extra, mine[1])
    assert servers(_private_runtime_dir) == [server]

    helps = {}
    for columns in ("50", "140", "50"):
        mine = run(project, "status", "--help", env={"COLUMNS": columns})
        theirs = run(project, "status", "--help", env={"COLUMNS": columns}, served=False)
        assert mine.stdout == theirs.stdout
        helps[columns] = mine.stdout
    assert helps["50"] != helps["140"]

    for n in (1, 2):
        summary = tmp_path / f"summary-{n}.md"
        github = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "CI": "true"}
        result = run(project, "status", "-t", NAME, env=github)
        assert result.returncode == 0, result.stderr
        assert NAME in summary.read_text()
    plain = run(project, "status", "-t", NAME, env={"GITHUB_STEP_SUMMARY": str(tmp_path / "x")})
    assert plain.returncode == 0 and not (tmp_path / "x").exists()

    elsewhere = tmp_path / "nowhere.yaml"
    for where, ok in ((project.inventory, True), (elsewhere, False), (project.inventory, True)):
        env = {"LAUNCHER_INVENTORY": str(where)}
        mine = run(project, "status", "-t", NAME, "--json", env=env, inventory=False)
        theirs = run(
            project, "status", "-t", NAME, "--json", env=env, inventory=False, served=False
        )
        assert mine.returncode == theirs.returncode
        assert (mine.returncode == 0) == ok, mine.stderr
        assert normalized(mine.stderr) == normalized(theirs.stderr)
    assert servers(_private_runtime_dir) == [server]


def test_a_host_that_prompts_is_run_in_process(
    served: Project,
    _private_runtime_dir: Path,
    locked_key: Path,  # noqa: F811  (test_ssh_paths' fixture)
    tmp_path: Path,
) -> None:
    """A host whose key's passphrase is typed on the terminal: the server's child has no
    terminal, so it declines before anything runs and the client runs the command itself,
    asking on the terminal."""
    project = served
    server = warm(project, _private_runtime_dir)
    inv = locked_inventory(tmp_path, project.info, locked_key, passphrase="prompt")
    code, screen = run_on_terminal(
        [*LAUNCHER, "-i", str(inv), "doctor"], answers=[PASSPHRASE], timeout=90
    )
    assert screen.count(f"Passphrase for {locked_key} (pve): ") == 1, screen
    assert code == 0, screen
    assert server in servers(_private_runtime_dir)  # it was there, and declined

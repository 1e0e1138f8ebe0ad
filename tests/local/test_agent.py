"""The in-container agent, run on this host against a real, isolated tmux server."""

from __future__ import annotations

import ast
import base64
import contextlib
import fcntl
import gzip
import hashlib
import importlib
import json
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from launcher.agent import MODULES, protocol
from launcher.agent import base as agent_base
from launcher.agent import deploy as agent_deploy
from launcher.agent import gpus as agent_gpus
from launcher.agent import main as agent_main
from launcher.agent import nvsmi as agent_nvsmi
from launcher.agent import paths as agent_paths
from launcher.agent import poll as agent_poll
from launcher.agent import processes as agent_processes
from launcher.agent import stop as agent_stop
from launcher.agent import tmux as agent_tmux
from launcher.agent.protocol import BOOT, RUN_ENV
from launcher.container.agentclient import agent_sources, payload
from tests.unit.agentcontract import HandlerContract

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

PROTOCOL_SOURCE = Path(protocol.__file__).read_text()
TMUX = shutil.which("tmux") or "tmux"
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"

# Starts a child that leaves the pane's session and ignores SIGHUP and SIGINT, as a data-loader
# worker holding GPU memory might; only the LAUNCHER_RUN marker still ties it to the run.
ESCAPER = """
import subprocess, sys, time
CHILD = (
    "import signal, time\\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)\\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
    "time.sleep(120)\\n"
)
child = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
with open("child.pid", "w") as f:
    f.write(str(child.pid))
print("parent running", flush=True)
time.sleep(60)
"""


def wait_until(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def pid_alive(pid: int) -> bool:
    stat = agent_processes.proc_stat(pid)
    return stat is not None and stat[0] != "Z"


class Target:
    """One isolated container stand-in: a workdir, a lock file and a unique session name."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.workdir = root / "wd"
        self.lock_path = root / "run" / "deploy.lock"
        self.session = "t" + uuid.uuid4().hex[:10]
        self.pushes = 0

    def push(self, source: str) -> tuple[str, str]:
        """Write a pushed temp file the way the client would; returns (path, sha256)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pushes += 1
        tmp = self.workdir / f".launcher-push-{self.pushes}.tmp"
        tmp.write_text(source)
        return str(tmp), hashlib.sha256(source.encode()).hexdigest()

    def apply_request(self, source: str = SLEEPER, **overrides: Any) -> dict[str, Any]:
        tmp, sha = self.push(source)
        request: dict[str, Any] = {
            "op": "apply",
            "workdir": str(self.workdir),
            "dest": "train.py",
            "tmp": tmp,
            "sha256": sha,
            "session": self.session,
            "restart": False,
            "grace": 0.5,
            "checkpoints": "checkpoints",
            "checkpoint_mode": "archive",
            "keep_archives": 2,
            "command": "exec python3 train.py",
            "env": {},
            "width": 250,
            "height": 50,
            "history_limit": 4321,
            "gpus": 0,
            "record": {"playbook": "demo"},
            "lock_path": str(self.lock_path),
            "operator": {"user": "alice", "host": "laptop", "pid": 4242},
        }
        request.update(overrides)
        return request

    def apply(self, source: str = SLEEPER, **overrides: Any) -> dict[str, Any]:
        return agent_main.run_local(self.apply_request(source, **overrides))

    def poll(self, lines: int = 50) -> dict[str, Any]:
        request = {"op": "poll", "workdir": str(self.workdir), "session": self.session}
        return agent_main.run_local({**request, "lines": lines})

    def state(self) -> dict[str, Any]:
        return agent_tmux.session_state(self.session)

    def state_file(self, name: str) -> Path:
        return self.workdir / ".launcher" / name


@pytest.fixture(autouse=True)
def gpu_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """nvidia-smi's kept answers and its lock in this test's directory, not this machine's /run."""
    monkeypatch.setattr(agent_nvsmi, "STATE_DIR", str(tmp_path / "gpu-state"))


@pytest.fixture(autouse=True)
def contract(monkeypatch: pytest.MonkeyPatch) -> Iterator[HandlerContract]:
    """Every op run here also checks the protocol both ways (see tests/unit/agentcontract.py)."""
    checked = HandlerContract()
    checked.install(monkeypatch)
    yield checked
    checked.assert_kept()


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Target]:
    # A short private socket directory (unix socket paths are limited to ~100 bytes), and no
    # $TMUX so nothing reaches the developer's own tmux server.
    socket_dir = tempfile.mkdtemp(prefix="lt-")
    monkeypatch.setenv("TMUX_TMPDIR", socket_dir)
    monkeypatch.delenv("TMUX", raising=False)
    t = Target(tmp_path)
    yield t
    subprocess.run([TMUX, "kill-server"], capture_output=True, check=False)
    agent_stop.terminate(agent_processes.run_pids(None, t.session), 0.1)
    shutil.rmtree(socket_dir, ignore_errors=True)


def oldest_python() -> str | None:
    """A Python 3.8 on this host, if any: the oldest a container may bring."""
    candidates = [shutil.which("python3.8") or ""]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.8*/bin/python3.8"))
    for python in filter(None, candidates):
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def run_boot(request: dict[str, Any], python: str | None = None) -> tuple[int, list[str]]:
    """Run the agent exactly as launcher does inside the container: python3 -c BOOT."""
    python = python or shutil.which("python3") or sys.executable
    proc = subprocess.run(
        [python, "-c", BOOT], input=payload(request), capture_output=True, timeout=30
    )
    return proc.returncode, proc.stdout.decode().splitlines()


# --------------------------------------------------------------------------- envelope


def test_agent_source_is_python38_syntax() -> None:
    for _, source in agent_sources():
        ast.parse(source, feature_version=(3, 8))
    ast.parse(PROTOCOL_SOURCE, feature_version=(3, 8))


def agent_modules() -> list[ModuleType]:
    return [importlib.import_module(f"launcher.agent.{name}") for name in MODULES]


def patch_agent(monkeypatch: pytest.MonkeyPatch, name: str, value: object) -> None:
    """Replace the agent's `name` in every module of it that uses it: each one imported the
    name from the module that defines it, so patching only that one would change nothing."""
    original = getattr(agent_base, name, None) or getattr(agent_gpus, name)
    for module in agent_modules():
        if getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, value)


def test_protocol_and_agent_agree() -> None:
    """The ops the protocol names are the ops the agent handles; every error kind is known."""
    assert set(agent_main.HANDLERS) == set(protocol.OPS)
    assert agent_base.AgentError("bogus", "x").kind == "failed"
    assert {k for k in protocol.ERROR_KINDS} == set(agent_base.ERROR_KINDS)


def test_unknown_op_is_invalid() -> None:
    result = agent_main.run_local({"op": "explode"})
    assert result["ok"] is False
    assert result["error"]["kind"] == "invalid"


def test_bad_session_name_is_invalid(target: Target) -> None:
    result = target.apply(session="a:b")
    assert result["error"]["kind"] == "invalid"


def test_boot_line_prints_one_json_envelope(target: Target) -> None:
    rc, lines = run_boot({"op": "nope"})
    assert rc == 0
    assert json.loads(lines[-1])["error"]["kind"] == "invalid"

    request = {
        "op": "preflight",
        "workdir": str(target.workdir),
        "dest": "train.py",
        "session": target.session,
        "checkpoints": "checkpoints",
        "gpus": 0,
        "need_bytes": 1,
        "create_workdir": False,
        "lock_path": str(target.lock_path),
    }
    rc, lines = run_boot(request)
    assert rc == 0
    assert len(lines) == 1
    answer = json.loads(lines[-1])
    assert set(answer) >= {"ok", "op", "error", "warnings", "python", "tmux", "session"}
    assert answer["ok"] is True and answer["op"] == "preflight"


def test_boot_apply_returns_while_the_tmux_server_lives_on(target: Target) -> None:
    # The tmux server started by the agent must not keep the answer pipe open.
    rc, lines = run_boot(target.apply_request())
    assert rc == 0
    answer = json.loads(lines[-1])
    assert answer["ok"] is True, answer["error"]
    assert target.state()["exists"] is True


def test_boot_on_python38(target: Target) -> None:
    python = oldest_python()
    if python is None:
        pytest.skip("no python3.8 on this host")
    rc, lines = run_boot(target.apply_request(command="echo done; exit 4"), python)
    assert rc == 0
    answer = json.loads(lines[-1])
    assert answer["ok"] is True, answer["error"]
    poll = {"op": "poll", "workdir": str(target.workdir), "session": target.session, "lines": 5}
    result = wait_until(lambda: (r := json.loads(run_boot(poll, python)[1][-1]))["exit_code"] and r)
    assert result["exit_code"] == 4 and "done" in result["capture"]


# --------------------------------------------------------------------------- preflight


def preflight(target: Target, create: bool, gpus: int = 0) -> dict[str, Any]:
    return agent_main.run_local(
        {
            "op": "preflight",
            "workdir": str(target.workdir),
            "dest": "train.py",
            "session": target.session,
            "checkpoints": "checkpoints",
            "gpus": gpus,
            "need_bytes": 1024,
            "create_workdir": create,
            "lock_path": str(target.lock_path),
        }
    )


def test_preflight_missing_workdir_without_create(target: Target) -> None:
    result = preflight(target, create=False)
    assert result["ok"] is True
    assert result["workdir"] == {"exists": False, "writable": False, "created": False}
    assert not target.workdir.exists()
    assert result["free_bytes"] > 0
    assert result["session"]["exists"] is False
    assert result["dest_sha256"] is None
    assert result["checkpoints"]["exists"] is False and result["checkpoints"]["unsafe"] is None
    assert result["lock"] is None
    assert result["gpus"]["skipped"] is True
    assert result["tmux"].startswith("tmux ")


def test_preflight_creates_workdir_when_asked(target: Target) -> None:
    result = preflight(target, create=True)
    assert result["workdir"] == {"exists": True, "writable": True, "created": True}
    assert (target.workdir / ".launcher").is_dir()


def test_preflight_reports_missing_nvidia_smi(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_which = agent_base.which
    patch_agent(
        monkeypatch, "which", lambda name: None if name == "nvidia-smi" else real_which(name)
    )
    result = preflight(target, create=False, gpus=2)
    assert result["gpus"]["visible"] == 0
    assert result["gpus"]["error"] == "nvidia-smi not found"
    assert "2 GPUs wanted, 0 visible" in result["warnings"]


# --------------------------------------------------------------------------- apply: launch

AWKWARD_ENV = {
    "SPACES": "a  b c",
    "QUOTES": 'it\'s "quoted" \\ back',
    "SUBST": "$(touch PWNED) `touch PWNED2` $HOME",
    "SEMI": "x; echo injected;",
    "NEWLINES": "line1\nline2\n",
    "TMUXFMT": "#{session_name} #(touch PWNED3) ~",
}
ENV_DUMPER = """
import json, os, sys, time
names = sys.argv[1:]
with open("env.json", "w") as f:
    json.dump({n: os.environ.get(n) for n in names + ["LAUNCHER_RUN"]}, f)
print("x" * 400, flush=True)
print("dumped", flush=True)
time.sleep(1.0)
sys.exit(3)
"""


def test_apply_fresh_launch(target: Target) -> None:
    command = "python3 train.py " + " ".join(sorted(AWKWARD_ENV))
    result = target.apply(ENV_DUMPER, command=command, env=AWKWARD_ENV)
    assert result["ok"] is True, result["error"]
    assert [s["name"] for s in result["steps"]][-2:] == ["launch", "record"]
    launched = result["launched"]
    assert launched["width"] == 250
    assert launched["session"] == target.session

    env_file = target.workdir / "env.json"
    assert wait_until(env_file.exists)
    seen = json.loads(env_file.read_text())
    assert {k: seen[k] for k in AWKWARD_ENV} == AWKWARD_ENV
    assert seen["LAUNCHER_RUN"] == launched["run"]
    assert launched["run"].startswith(target.session + ":")
    assert not list(target.workdir.glob("PWNED*"))

    state = target.state()
    assert state["width"] == 250 and state["run"] == launched["run"]
    assert tmux_format(target, "#{history_limit}") == "4321"
    assert tmux_format(target, "#{session_windows}") == "1"

    log = Path(launched["log_file"])
    assert wait_until(lambda: log.exists() and "dumped" in log.read_text())
    exit_file = Path(launched["exit_file"])
    assert wait_until(exit_file.exists, timeout=5)
    assert exit_file.read_text().strip() == "3"
    # remain-on-exit: the pane stays, dead, with its status and output readable.
    dead = wait_until(lambda: (st := target.poll()["session"])["dead_status"] is not None and st)
    assert dead and dead["pane_dead"] is True and dead["dead_status"] == 3
    assert "x" * 400 in target.poll()["capture"]  # -J joins the wrapped line

    record = json.loads(target.state_file("current.json").read_text())
    assert record["playbook"] == "demo" and record["sha256"] == result["script"]["sha256"]
    lines = target.state_file("deploys.jsonl").read_text().splitlines()
    assert len(lines) == 1
    assert target.lock_path.read_text() == ""  # released
    assert not list(target.workdir.glob(".launcher-push-*"))
    assert not list(target.workdir.rglob("__pycache__"))


def test_the_run_is_told_about_itself(target: Target) -> None:
    names = " ".join(RUN_ENV)
    result = target.apply(ENV_DUMPER, command=f"python3 train.py {names}", restart_count=2)
    assert result["ok"] is True, result["error"]
    env_file = target.workdir / "env.json"
    assert wait_until(env_file.exists)
    seen = json.loads(env_file.read_text())
    run_id = result["launched"]["run"].split(":", 1)[1]
    assert seen["LAUNCHER_RUN_ID"] == run_id
    assert seen["LAUNCHER_RELEASE"] == result["script"]["sha256"]
    assert seen["LAUNCHER_WORKDIR"] == str(target.workdir)
    assert seen["LAUNCHER_CHECKPOINTS"] == str(target.workdir / "checkpoints")
    assert seen["LAUNCHER_RESTART_COUNT"] == "2"


def test_a_playbook_env_may_not_set_what_launcher_tells_the_run(target: Target) -> None:
    result = target.apply(env={"LAUNCHER_WORKDIR": "/elsewhere"})
    assert result["error"]["kind"] == "invalid"
    assert "LAUNCHER_WORKDIR" in result["error"]["message"]


def tmux_format(target: Target, fmt: str) -> str:
    proc = subprocess.run(
        [TMUX, "display-message", "-p", "-t", f"={target.session}:", fmt],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip()


def test_apply_refuses_an_active_session_without_restart(target: Target) -> None:
    first = target.apply()
    assert first["ok"] is True
    pane_pid = first["launched"]["pane_pid"]
    before = (target.workdir / "train.py").read_text()

    result = target.apply("print('new version')\n")
    assert result["error"]["kind"] == "refused"
    assert "use --restart" in result["error"]["message"]
    assert (target.workdir / "train.py").read_text() == before
    assert not list(target.workdir.glob(".launcher-push-*"))
    assert target.state()["pane_pid"] == pane_pid and not target.state()["pane_dead"]
    assert target.lock_path.read_text() == ""


def test_a_preview_shows_the_plan_past_an_active_session_and_a_plain_plan_refuses(
    target: Target,
) -> None:
    """deploy --dry-run (preview) on a running target: a warning and the plan --restart would
    run; a plan alone (a job's checks before it acts) still refuses, as the deploy would."""
    first = target.apply()
    assert first["ok"] is True
    planned = target.apply("print('new version')\n", plan=True, preview=True)
    assert planned["ok"] is True, planned["error"]
    steps = {step["name"]: step for step in planned["steps"]}
    assert steps["active_check"]["status"] == "warning"
    assert "unless --restart replaces it" in steps["active_check"]["detail"]
    assert steps["stop"]["status"] == "planned"
    assert steps["stop"]["detail"].startswith(f"with --restart: session '{target.session}'")
    checked = target.apply("print('new version')\n", plan=True)
    assert checked["error"]["kind"] == "refused" and "use --restart" in checked["error"]["message"]
    assert target.state()["pane_pid"] == first["launched"]["pane_pid"]  # nothing was stopped
    assert "new version" not in (target.workdir / "train.py").read_text()


def test_apply_restart_stops_everything_and_archives_checkpoints(target: Target) -> None:
    first = target.apply(ESCAPER)
    assert first["ok"] is True, first["error"]
    pid_file = target.workdir / "child.pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text())
    child = int(pid_file.read_text())
    old_pane = first["launched"]["pane_pid"]
    ckpt = target.workdir / "checkpoints"
    ckpt.mkdir()
    (ckpt / "step1.pt").write_text("weights")
    for stamp in ("20000101T000000Z", "20010101T000000Z"):
        (target.workdir / ("checkpoints.archived-" + stamp)).mkdir()

    result = target.apply(
        "print('v2')\nimport time\ntime.sleep(60)\n", restart=True, keep_archives=2
    )
    assert result["ok"] is True, result["error"]
    stopped = result["stopped"]
    assert stopped["was_running"] is True and stopped["leftover"] == []
    assert child in stopped["pids"] and old_pane in stopped["pids"]
    assert stopped["forced"] is True  # the child ignored C-c and SIGHUP
    assert not pid_alive(child) and not pid_alive(old_pane)

    moved = result["checkpoints"]
    assert moved["action"] == "archive" and not ckpt.exists()
    assert (Path(moved["to"]) / "step1.pt").read_text() == "weights"
    archives = sorted(p.name for p in target.workdir.glob("checkpoints.archived-*"))
    assert len(archives) == 2 and Path(moved["to"]).name in archives
    assert "checkpoints.archived-20000101T000000Z" not in archives

    assert (target.workdir / "train.py.prev").read_text() == ESCAPER
    assert result["launched"]["pane_pid"] != old_pane
    assert target.state()["pane_dead"] is False
    history = list((target.workdir / ".launcher" / "scripts").glob("*.py"))
    assert len(history) == 2


def test_apply_restart_purge_and_stop_op(target: Target) -> None:
    assert target.apply()["ok"] is True
    ckpt = target.workdir / "checkpoints"
    ckpt.mkdir()
    result = target.apply(restart=True, checkpoint_mode="purge")
    assert result["ok"] is True, result["error"]
    assert result["checkpoints"]["action"] == "purge" and not ckpt.exists()
    assert result["script"]["unchanged"] is True
    assert [s["status"] for s in result["steps"] if s["name"] == "install"] == ["unchanged"]

    # C-c once the relaunched trainer runs, not while its interpreter starts (a loaded machine)
    assert wait_until(lambda: "started" in target.poll()["capture"], timeout=30)
    request = {"op": "stop", "workdir": str(target.workdir), "session": target.session}
    stop = agent_main.run_local({**request, "grace": 2.0, "lock_path": str(target.lock_path)})
    assert stop["ok"] is True
    assert stop["stopped"]["was_running"] is True and stop["stopped"]["forced"] is False
    assert target.state()["exists"] is False
    again = agent_main.run_local({**request, "grace": 0.1, "lock_path": str(target.lock_path)})
    assert again["ok"] is True and again["stopped"]["was_running"] is False


def test_a_process_that_outlives_sigkill_is_named_with_why(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that SIGKILL does not end (in practice one blocked in a driver call, state D)
    is reported as left over, and a warning names its command and what its state means."""
    assert target.apply()["ok"] is True
    assert wait_until(lambda: "started" in target.poll()["capture"], timeout=30)
    with subprocess.Popen(["sleep", "60"]) as stuck:
        try:
            os.kill(stuck.pid, signal.SIGSTOP)  # state T: what SIGKILL could not end, stood in
            assert wait_until(lambda: agent_processes.proc_stat(stuck.pid)[0] == "T", 5)
            real = agent_stop.terminate

            def terminate(pids: set[int], grace: float) -> set[int]:
                assert stuck.pid not in pids, pids  # not the run's: nothing signals it
                return real(pids, grace) | {stuck.pid}

            monkeypatch.setattr(agent_stop, "terminate", terminate)
            request = {"op": "stop", "workdir": str(target.workdir), "session": target.session}
            stop = agent_main.run_local(
                {**request, "grace": 2.0, "lock_path": str(target.lock_path)}
            )
            assert stop["ok"] is True
            assert stop["stopped"]["leftover"] == [stuck.pid]
            assert stop["warnings"] == [
                f"pid {stuck.pid} (sleep 60) still alive 5 s after SIGKILL: stopped"
            ]
        finally:
            stuck.kill()
    assert "blocked in a kernel call" in agent_stop.KILLED_BUT_ALIVE["D"]
    assert agent_stop.describe_leftover(stuck.pid).endswith("after SIGKILL: state ?")  # gone


# --------------------------------------------------------------------------- apply: checks


def test_corrupt_transfer_is_rejected_and_old_run_untouched(target: Target) -> None:
    first = target.apply()
    pane_pid = first["launched"]["pane_pid"]
    request = target.apply_request("print('v2')\n", restart=True, sha256="0" * 64)
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "corrupt"
    assert "expected " + "0" * 64 in result["error"]["message"]
    assert not os.path.exists(request["tmp"])
    assert (target.workdir / "train.py").read_text() == SLEEPER
    assert target.state()["pane_pid"] == pane_pid and not target.state()["pane_dead"]
    assert result["steps"][-1] == {
        "name": "verify",
        "status": "failed",
        "detail": result["error"]["message"],
        "kind": "corrupt",
    }


def test_compile_error_is_rejected(target: Target) -> None:
    request = target.apply_request("def broken(:\n    pass\n")
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "compile"
    assert "SyntaxError" in result["error"]["message"]
    assert not os.path.exists(request["tmp"])
    assert not (target.workdir / "train.py").exists()
    assert not list(target.workdir.rglob("__pycache__"))
    assert target.state()["exists"] is False


@pytest.mark.parametrize("case", ["dotdot", "root", "symlink", "workdir", "elsewhere", "empty"])
def test_unsafe_checkpoints_touch_nothing(target: Target, case: str) -> None:
    outside = target.root / "outside"
    outside.mkdir()
    (outside / "precious.pt").write_text("keep me")
    target.workdir.mkdir()
    (target.workdir / "link").symlink_to(outside)
    paths = {
        "dotdot": "../outside",
        "root": "/",
        "symlink": "link",
        "workdir": ".",
        "elsewhere": str(outside),
        "empty": "",
    }
    request = target.apply_request(checkpoints=paths[case], checkpoint_mode="purge")
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "unsafe_path", result
    assert (outside / "precious.pt").read_text() == "keep me"
    assert not (target.workdir / "train.py").exists()
    assert not os.path.exists(request["tmp"])
    assert target.state()["exists"] is False


def test_checkpoint_guard_accepts_nested_child(target: Target) -> None:
    target.workdir.mkdir()
    path, reason = agent_paths.checkpoint_problem(str(target.workdir), "runs/ckpt")
    assert reason is None and path == str(target.workdir / "runs" / "ckpt")


# --------------------------------------------------------------------------- lock


def test_live_lock_holder_refuses(target: Target) -> None:
    target.lock_path.parent.mkdir(parents=True)
    holder_info = {"operator": "bob", "from_host": "desk", "agent_pid": 1, "since": "then"}
    holder_code = (
        "import fcntl, json, sys, time\n"
        "f = open(sys.argv[1], 'w')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(sys.argv[2]); f.flush()\n"
        "print('held', flush=True)\n"
        "time.sleep(30)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(target.lock_path), json.dumps(holder_info)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        request = target.apply_request()
        result = agent_main.run_local(request)
        assert result["error"]["kind"] == "locked"
        assert result["error"]["holder"]["operator"] == "bob"
        assert "bob from desk" in result["error"]["message"]
        assert not os.path.exists(request["tmp"])
        assert target.state()["exists"] is False

        lock = preflight(target, create=False)["lock"]
        assert lock["operator"] == "bob" and lock["stale"] is False
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_broken_with_a_warning(target: Target) -> None:
    target.lock_path.parent.mkdir(parents=True)
    stale = {"operator": "carol", "from_host": "gone", "agent_pid": 999999, "since": "T0"}
    target.lock_path.write_text(json.dumps(stale))
    assert preflight(target, create=False)["lock"]["stale"] is True

    result = target.apply()
    assert result["ok"] is True, result["error"]
    expected = (
        "broke stale lock held by carol from gone (pid ?; in the container pid 999999) since T0"
    )
    assert expected in result["warnings"]
    assert target.lock_path.read_text() == ""


def test_lock_content_while_held(target: Target, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    real_launch = agent_deploy.launch

    def spy(state: agent_deploy.DeployState) -> Any:
        seen.update(json.loads(Path(state.lock.path).read_text()))
        with open(state.lock.path) as f, pytest.raises(BlockingIOError):
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return real_launch(state)

    monkeypatch.setattr(agent_deploy, "launch", spy)
    assert target.apply()["ok"] is True
    assert seen["operator"] == "alice" and seen["from_host"] == "laptop"
    assert seen["client_pid"] == 4242 and seen["agent_pid"] == os.getpid()


# --------------------------------------------------------------------------- poll


def test_poll_live_pane(target: Target) -> None:
    assert target.apply()["ok"] is True
    result = wait_until(lambda: (r := target.poll()) and "started" in r["capture"] and r)
    assert result["ok"] is True
    assert result["session"]["exists"] is True and result["session"]["pane_dead"] is False
    assert result["exit_code"] is None
    assert abs(result["now"] - time.time()) < 5


def test_poll_pane_that_crashed_at_once(target: Target) -> None:
    result = target.apply(command="echo boom; exit 5")
    assert result["ok"] is True, result["error"]
    poll = wait_until(
        lambda: (r := target.poll()) and r["session"]["dead_status"] is not None and r
    )
    assert poll["session"]["pane_dead"] is True and poll["session"]["dead_status"] == 5
    assert "boom" in poll["capture"]
    assert poll["exit_code"] == 5


def test_poll_absent_session(target: Target) -> None:
    result = target.poll()
    assert result["ok"] is True
    assert result["session"]["exists"] is False and result["capture"] == ""
    assert result["exit_code"] is None


def test_dead_session_is_replaced_without_restart(target: Target) -> None:
    assert target.apply(command="exit 1")["ok"] is True
    assert wait_until(lambda: target.state()["pane_dead"])
    result = target.apply(command="echo second; sleep 30")
    assert result["ok"] is True, result["error"]
    assert result["stopped"]["session_existed"] is True
    assert target.state()["pane_dead"] is False


def test_signals_restored_after_apply(target: Target) -> None:
    before = signal.getsignal(signal.SIGHUP)
    target.apply()
    assert signal.getsignal(signal.SIGHUP) == before


def ignored_signals(status_line: str) -> set[int]:
    """The signals a `SigIgn:` line of /proc/PID/status names."""
    mask = int(status_line.split()[1], 16)
    return {number for number in range(1, 65) if mask & (1 << (number - 1))}


def test_what_a_transaction_starts_gets_sighup_and_sigpipe_at_their_default(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction outlives its client by catching SIGHUP (and ignoring SIGPIPE), yet what
    it starts (tmux, nvidia-smi, the compile check) begins with both at their default: an
    ignored SIGHUP would be inherited, a caught one is reset by exec."""
    seen: list[str] = []
    check_launch = agent_deploy.check_launch

    def spy(state: agent_deploy.DeployState) -> Any:
        assert signal.getsignal(signal.SIGHUP) is not signal.SIG_DFL  # the client may go
        seen.append(agent_base.run(["grep", "SigIgn:", "/proc/self/status"])[1])
        return check_launch(state)

    monkeypatch.setattr(agent_deploy, "check_launch", spy)
    result = target.apply()
    assert result["ok"] is True, result["error"]
    assert not ignored_signals(seen[0]) & {signal.SIGHUP, signal.SIGPIPE}, seen[0]


def test_an_agent_started_with_sighup_ignored_still_ignores_it_but_as_a_handler() -> None:
    code = (
        "import signal\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
        "from launcher.agent import base, main\n"
        "main.main({'op': 'nope'})\n"
        "print(signal.getsignal(signal.SIGHUP) is base.ignore_hangup)\n"
        "print(base.run(['grep', 'SigIgn:', '/proc/self/status'])[1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    envelope, handled, status = result.stdout.splitlines()[:3]
    assert json.loads(envelope)["error"]["kind"] == "invalid"
    assert handled == "True"
    assert signal.SIGHUP not in ignored_signals(status)


def test_wait_exit_returns_when_a_process_exits_not_at_the_timeout() -> None:
    quick = subprocess.Popen(["sleep", "0.2"])
    slow = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        agent_processes.wait_exit({quick.pid, slow.pid}, 20.0)
        assert time.monotonic() - started < 10.0  # woken by `quick`, long before 20 s
        assert quick.wait(1) == 0
        assert slow.poll() is None
    finally:
        slow.kill()
        slow.wait()


def test_wait_exit_of_nothing_or_of_the_gone_returns_at_once() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    started = time.monotonic()
    agent_processes.wait_exit(set(), 20.0)
    agent_processes.wait_exit({gone.pid}, 20.0)
    assert time.monotonic() - started < 10.0


# --------------------------------------------------------------------------- failures, GPUs


def test_failure_after_install_still_answers_with_steps(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_launch(state: agent_deploy.DeployState) -> Any:
        raise RuntimeError("tmux exploded")

    monkeypatch.setattr(agent_deploy, "launch", broken_launch)
    result = target.apply(checkpoints=None, checkpoint_mode="keep")
    # Not "failed" (which reads as unreachable): reached, acted on, nothing running.
    assert result["ok"] is False and result["error"]["kind"] == "down"
    assert "tmux exploded" in result["error"]["message"]
    assert result["error"]["message"].startswith("run is down")
    statuses = {s["name"]: s["status"] for s in result["steps"]}
    assert statuses["install"] == "ok" and statuses["launch"] == "failed"
    assert statuses["checkpoints"] == "skipped"
    assert result["record"]["outcome"].startswith("failed")
    assert json.loads(target.state_file("current.json").read_text())["outcome"].startswith("failed")
    assert target.lock_path.read_text() == ""


# Inside a container nvidia-smi's process list has host PIDs: asking for it is a bug.
FAKE_NVIDIA_SMI = """#!/bin/sh
[ "$1" = -q ] && { printf 'GPU 00000000:18:00.0\\n  Minor Number : 0\\n'
  printf 'GPU 00000000:19:00.0\\n  Minor Number : 1\\n'; exit 0; }
case "$1" in
  -L) echo "GPU 0: NVIDIA Fake 80GB (UUID: GPU-1)"; echo "GPU 1: NVIDIA Fake 80GB (UUID: GPU-2)";;
  --query-gpu=index,uuid,pci.bus_id,memory.used,memory.total,utilization.gpu,name)
    echo "0, GPU-1, 00000000:18:00.0, 22512, 81559, 97, NVIDIA Fake 80GB"
    echo "1, GPU-2, 00000000:19:00.0, 3, 81559, 0, NVIDIA Fake 80GB";;
  *) echo "unexpected nvidia-smi $*" >&2; exit 99;;
esac
"""


def test_preflight_lists_gpus_and_what_is_used_from_outside(
    target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    real_which = agent_base.which
    patch_agent(monkeypatch, "which", lambda n: str(fake) if n == "nvidia-smi" else real_which(n))
    # This machine's /proc may show a sandbox container's GPU holders: none here.
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    gpus = preflight(target, create=False, gpus=2)["gpus"]
    assert gpus["visible"] == 2 and gpus["names"] == ["NVIDIA Fake 80GB"] * 2
    assert gpus["error"] is None
    # No process here has /dev/nvidia0 open, so GPU 0's memory is someone else's; GPU 1's 3 MiB
    # are the driver's own.
    assert gpus["holders"] == []
    assert gpus["outside"] == [{"index": 0, "used_mib": 22512}]


def test_used_outside_ignores_gpus_held_here_and_idle_ones() -> None:
    devices = [
        {"index": 0, "used_mib": 22512, "total_mib": 1, "util": 0},
        {"index": 1, "used_mib": 22512, "total_mib": 1, "util": 0},
        {"index": 2, "used_mib": agent_gpus.GPU_IDLE_MIB, "total_mib": 1, "util": 0},
        {"index": 3, "used_mib": 9000, "total_mib": 1, "util": 0},
    ]
    held = {77: [1]}
    assert agent_gpus.used_outside(devices, held, {0, 1, 2}) == [{"index": 0, "used_mib": 22512}]


def test_stop_of_a_hand_started_shell_session_is_not_forced(target: Target) -> None:
    """A person's session: an interactive shell runs the trainer. C-c ends the trainer (the
    shell lives on), and the stop must see the run as finished, not wait out the grace."""
    target.workdir.mkdir(parents=True)
    subprocess.run(
        [
            TMUX,
            "new-session",
            "-d",
            "-s",
            target.session,
            "-x",
            "120",
            "-y",
            "20",
            "bash",
            "--norc",
        ],
        check=True,
    )
    subprocess.run(
        [
            TMUX,
            "send-keys",
            "-t",
            f"={target.session}:",
            "python3 -c 'import time; time.sleep(60)'",
            "Enter",
        ],
        check=True,
    )
    wait_until(
        lambda: len(agent_processes.run_pids(target.state()["pane_pid"], target.session)) >= 2
    )
    request = {"op": "stop", "workdir": str(target.workdir), "session": target.session}
    started = time.monotonic()
    stop = agent_main.run_local({**request, "grace": 20.0, "lock_path": str(target.lock_path)})
    assert stop["ok"] is True, stop["error"]
    assert stop["stopped"]["forced"] is False
    assert time.monotonic() - started < 10
    assert target.state()["exists"] is False


def test_apply_with_the_script_inline_creates_the_workdir(target: Target) -> None:
    source = SLEEPER
    request = target.apply_request(source)
    os.remove(request["tmp"])
    shutil.rmtree(target.workdir)
    request.update(tmp=None, content_b64=base64.b64encode(source.encode()).decode())
    result = agent_main.run_local(request)
    assert result["ok"] is True, result["error"]
    # The paths are checked before anything is written into the workdir.
    assert [s["name"] for s in result["steps"][:2]] == ["paths", "receive"]
    assert (target.workdir / "train.py").read_text() == source
    assert [p.name for p in target.workdir.iterdir() if ".launcher-" in p.name] == []


def test_inline_script_that_does_not_match_is_corrupt(target: Target) -> None:
    request = target.apply_request()
    os.remove(request["tmp"])
    request.update(tmp=None, content_b64=base64.b64encode(b"print('other')\n").decode())
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "corrupt"
    assert not (target.workdir / "train.py").exists()
    assert [p.name for p in target.workdir.iterdir() if ".launcher-" in p.name] == []
    bad = dict(request, content_b64="not base64!")
    assert agent_main.run_local(bad)["error"]["kind"] == "corrupt"


# --------------------------------------------------------------------------- hostile cases


@pytest.mark.parametrize(
    "workdir", ["/", "//", "///", "/etc", "/usr/lib/x", "/proc/1", "/var", "/tmp", "/home"]
)
def test_system_workdirs_are_refused(workdir: str) -> None:
    request = {"op": "poll", "workdir": workdir, "session": "s"}
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "unsafe_path", result


def test_workdir_symlinked_to_root_is_refused_and_nothing_is_touched(target: Target) -> None:
    link = target.root / "wd-link"
    link.symlink_to("/")
    request = target.apply_request(checkpoints="victim", checkpoint_mode="purge")
    request["workdir"] = str(link)
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "unsafe_path", result
    assert "resolves to /" in result["error"]["message"]
    assert not result.get("steps")  # refused before the first step
    assert not os.path.exists("/.launcher")


@pytest.mark.parametrize(
    ("checkpoints", "dest"),
    [
        (".launcher", "train.py"),  # launcher's own state: log, exit file, records
        (".launcher/runs", "train.py"),  # inside it
        ("code", "code/train.py"),  # contains the script
        ("train.py", "train.py"),  # is the script
    ],
)
def test_checkpoints_may_not_touch_what_launcher_needs(
    target: Target, checkpoints: str, dest: str
) -> None:
    (target.workdir / ".launcher").mkdir(parents=True)
    (target.workdir / ".launcher" / "deploys.jsonl").write_text("{}\n")
    request = target.apply_request(checkpoints=checkpoints, dest=dest, checkpoint_mode="purge")
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "unsafe_path", result
    assert "launcher needs" in result["error"]["message"]
    assert (target.workdir / ".launcher" / "deploys.jsonl").read_text() == "{}\n"
    assert target.state()["exists"] is False


def test_checkpoints_behind_a_symlinked_parent_are_refused(target: Target) -> None:
    outside = target.root / "outside"
    (outside / "ckpt").mkdir(parents=True)
    target.workdir.mkdir()
    (target.workdir / "data").symlink_to(outside)
    request = target.apply_request(checkpoints="data/ckpt", checkpoint_mode="purge")
    result = agent_main.run_local(request)
    assert result["error"]["kind"] == "unsafe_path", result
    assert (outside / "ckpt").is_dir()


def test_purge_rechecks_right_before_deleting(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoints swapped for a symlink after the guard passed are still not followed."""
    outside = target.root / "outside"
    outside.mkdir()
    (outside / "precious.pt").write_text("keep me")
    (target.workdir / "checkpoints").mkdir(parents=True)
    original_stop = agent_deploy.stop_old

    def stop_then_swap(state: agent_deploy.DeployState) -> Any:
        answer = original_stop(state)
        shutil.rmtree(target.workdir / "checkpoints")
        (target.workdir / "checkpoints").symlink_to(outside)
        return answer

    monkeypatch.setattr(agent_deploy, "stop_old", stop_then_swap)
    result = target.apply(checkpoint_mode="purge")
    assert result["error"]["kind"] == "unsafe_path", result
    assert (outside / "precious.pt").read_text() == "keep me"


def test_env_and_command_travel_in_a_private_file_not_in_argv(target: Target) -> None:
    # Unique: the scan below reads every process on the machine, other test runs' too.
    token = f"s3cr3t{uuid.uuid4().hex}"
    secret = token + "-" + "x" * (20000 - len(token))  # 20 KB: too long for tmux's command line
    script = (
        "import os, time\nprint('KEY', len(os.environ['API_KEY']), flush=True)\ntime.sleep(60)\n"
    )
    result = target.apply(script, env={"API_KEY": secret})
    assert result["ok"] is True, result["error"]
    run_file = target.workdir / ".launcher" / f"{target.session}.run"
    assert run_file.stat().st_mode & 0o777 == 0o600
    assert wait_until(lambda: "KEY 20001" in target.poll()["capture"])
    start_command = tmux_format(target, "#{pane_start_command}")
    assert token not in start_command
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                assert token.encode() not in Path(f"/proc/{name}/cmdline").read_bytes()


def test_a_command_too_long_to_run_is_refused_before_the_stop(target: Target) -> None:
    assert target.apply()["ok"] is True
    pane_pid = target.state()["pane_pid"]
    result = target.apply(restart=True, command="echo " + "y" * 200_000)
    assert result["error"]["kind"] == "invalid"
    assert "command is" in result["error"]["message"]
    assert target.state()["pane_pid"] == pane_pid and pid_alive(pane_pid)


def test_an_environment_too_large_is_refused_before_the_stop(target: Target) -> None:
    assert target.apply()["ok"] is True
    pane_pid = target.state()["pane_pid"]
    result = target.apply(restart=True, env={"BIG": "z" * (2 << 20)})
    assert result["error"]["kind"] == "invalid" and "env BIG is" in result["error"]["message"]
    assert "MAX_ARG_STRLEN" in result["error"]["message"]
    # Each value fits one string, all of them together not.
    many = {f"V{i}": "z" * (100 << 10) for i in range(12)}
    result = target.apply(restart=True, env=many)
    assert result["error"]["kind"] == "invalid" and "env is" in result["error"]["message"]
    assert pid_alive(pane_pid)


@pytest.mark.parametrize("grace", [-1.0, float("inf"), 1e9])
def test_grace_is_bounded(target: Target, grace: float) -> None:
    result = target.apply(grace=grace)
    assert result["error"]["kind"] == "invalid"
    assert "grace" in result["error"]["message"]


def test_stale_temp_files_of_killed_deploys_are_removed(target: Target) -> None:
    target.workdir.mkdir(parents=True)
    stale = target.workdir / ".train.py.launcher-0123456789ab.tmp"
    stale.write_bytes(b"\0" * (5 << 20))
    unrelated = target.workdir / ".notes.tmp"
    unrelated.write_text("mine")
    result = target.apply()
    assert result["ok"] is True, result["error"]
    assert not stale.exists()
    assert unrelated.read_text() == "mine"
    assert any(s["name"] == "leftovers" and str(stale) in s["detail"] for s in result["steps"])


def test_a_release_deploy_removes_the_leftovers_of_killed_release_deploys(target: Target) -> None:
    """A killed release deploy leaves a pushed stream, a `current` about to be renamed and a
    staging directory: the next release deploy removes them (under the lock), nothing else."""
    releases = target.workdir / "releases"
    releases.mkdir(parents=True)
    stream = target.workdir / ".release.launcher-0123456789ab.tmp"
    link = target.workdir / ".current.launcher-0123456789ab.tmp"
    staging = releases / ".20260101T000000Z-0123abcd.tmp"
    staging.mkdir()
    stream.write_bytes(b"partial")
    link.symlink_to("releases/gone")
    unrelated = releases / ".notes.tmp"
    unrelated.write_text("mine")
    data = b"print(1)\n"
    digest = hashlib.sha256(data).hexdigest()
    frames = gzip.compress(f"{digest} {len(data)}\n".encode() + data)
    release = {
        "manifest": [["main.py", len(data), 0o644, digest]],
        "manifest_sha256": "0" * 64,
        "blobs_b64": base64.b64encode(frames).decode(),
    }
    request = target.apply_request(dest=None, sha256=None, tmp=None, command="exec sleep 60",
                                   release=release)  # fmt: skip
    result = agent_main.run_local(request)
    assert result["ok"] is True, result["error"]
    assert not stream.exists() and not link.is_symlink() and not staging.exists()
    assert unrelated.read_text() == "mine"


def test_compile_error_quotes_the_new_script_not_the_installed_one(target: Target) -> None:
    assert target.apply("x = 1\ny = 2\nz = 3\n", command="sleep 60")["ok"] is True
    result = target.apply("x = 1\ny = (\nz = 3\n", restart=True, command="sleep 60")
    message = result["error"]["message"]
    assert result["error"]["kind"] == "compile"
    assert "y = (" in message, message
    assert "y = 2" not in message


def test_compile_error_with_another_interpreter_quotes_the_new_script(target: Target) -> None:
    python = oldest_python() or sys.executable
    assert target.apply("a = 1\n", command="sleep 60")["ok"] is True
    result = target.apply("a = [\n", restart=True, command="sleep 60", python=python)
    assert result["error"]["kind"] == "compile"
    assert "a = [" in result["error"]["message"]


SLOW_NVIDIA_SMI = """#!/bin/sh
log=%(log)s
[ "$1" = -q ] && { printf 'GPU 00000000:18:00.0\\n  Minor Number : 0\\n'
  printf 'GPU 00000000:19:00.0\\n  Minor Number : 1\\n'; exit 0; }
case "$1" in
  -L)
    echo "names start" >> "$log"; sleep 0.5; echo "names end" >> "$log"
    echo "GPU 0: NVIDIA Fake 80GB (UUID: GPU-1)"; echo "GPU 1: NVIDIA Fake 80GB (UUID: GPU-2)";;
  --query-gpu=index,uuid,pci.bus_id,memory.used,memory.total,utilization.gpu,name|\
  --query-compute-apps=gpu_uuid,used_memory)
    what=devices; case "$1" in --query-compute-apps*) what=contexts;; esac
    echo "$what start $$" >> "$log"
    [ -e %(hang)s ] && exec sleep 30
    sleep 0.5; echo "$what end" >> "$log"
    [ $what = devices ] && echo "0, GPU-1, 00000000:18:00.0, 0, 81559, 0, Fake" &&
      echo "1, GPU-2, 00000000:19:00.0, 0, 81559, 0, Fake";;
  *) echo "unexpected nvidia-smi $*" >&2; exit 99;;
esac
exit 0
"""


def slow_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    log, hang = tmp_path / "nvidia-smi.log", tmp_path / "hang"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        SLOW_NVIDIA_SMI % {"log": shlex.quote(str(log)), "hang": shlex.quote(str(hang))}
    )
    fake.chmod(0o755)
    real_which = agent_base.which
    patch_agent(monkeypatch, "which", lambda n: str(fake) if n == "nvidia-smi" else real_which(n))
    # This machine's /proc may show a sandbox container's GPU holders: none here.
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    return log, hang


def test_gpu_queries_run_one_at_a_time_started_before_their_checks(
    target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The nvidia-smi queries start with the transaction, one after the other (never two of
    launcher's nvidia-smi at once in a container), and answer while the checks before theirs
    run. Their answers are still judged."""
    log, _ = slow_nvidia_smi(tmp_path, monkeypatch)
    result = target.apply(gpus=2, check_resources=True)
    assert result["ok"] is True, result["error"]
    events = [line.split()[:2] for line in log.read_text().splitlines()]
    assert events == [
        ["devices", "start"], ["devices", "end"], ["contexts", "start"], ["contexts", "end"],
    ], events  # fmt: skip
    steps = {s["name"]: s for s in result["steps"]}
    assert steps["resources"]["detail"].endswith(", 2 GPUs")
    assert steps["gpus"]["status"] == "ok" and steps["gpus"]["detail"] == "free"


def test_a_refused_deploy_leaves_no_gpu_query_running(
    target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Refused before the GPU holders check (a run is active, no --restart): the query it
    started is killed, not waited for."""
    log, hang = slow_nvidia_smi(tmp_path, monkeypatch)
    assert target.apply(gpus=2, check_resources=True)["ok"] is True
    first = len(log.read_text().splitlines())
    hang.touch()
    started = time.monotonic()
    result = target.apply(gpus=2, check_resources=True, restart=False)
    assert result["error"]["kind"] == "refused" and "--restart" in result["error"]["message"]
    assert time.monotonic() - started < 10  # the 30 s query was not waited for
    # Each query of this apply that got as far as logging its start hangs (30 s) and must be
    # gone. One killed before its shell's first line (a refusal can come that fast on a busy
    # machine) logged nothing: it is gone all the same.
    lines = [line.split() for line in log.read_text().splitlines()[first:]]
    hung = [words for words in lines if words[0] in ("devices", "contexts")]
    assert all(words[1] == "start" for words in hung), lines  # none ran to its end
    # Killed with the runner's process group: gone, or a zombie its new parent has yet to reap.
    assert not [pid for _, _, pid in hung if pid_alive(int(pid))], hung


# A driver that frees GPU 0's memory at the time (epoch seconds) in the file `freed_at`; every
# query is one line in `log`.
RELEASING_NVIDIA_SMI = """#!/bin/sh
[ "$1" = -q ] && { printf 'GPU 00000000:18:00.0\\n  Minor Number : 0\\n'
  printf 'GPU 00000000:19:00.0\\n  Minor Number : 1\\n'; exit 0; }
echo query >> %(log)s
case "$1" in
  --query-gpu=index,uuid,pci.bus_id,memory.used,memory.total,utilization.gpu,name) ;;
  *) echo "unexpected nvidia-smi $*" >&2; exit 99;;
esac
used=$(python3 -c 'import sys, time
print(0 if time.time() >= float(open(sys.argv[1]).read()) else 40000)' %(freed_at)s)
echo "0, GPU-1, 00000000:18:00.0, $used, 81559, 0, Fake"
"""


def releasing_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, after: float
) -> tuple[Path, float]:
    """A fake nvidia-smi whose GPU 0 is freed `after` s from now; (its query log, that time)."""
    log, freed_at = tmp_path / "queries.log", tmp_path / "freed_at"
    when = time.time() + after
    freed_at.write_text(repr(when))
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        RELEASING_NVIDIA_SMI
        % {"log": shlex.quote(str(log)), "freed_at": shlex.quote(str(freed_at))}
    )
    fake.chmod(0o755)
    real_which = agent_base.which
    patch_agent(monkeypatch, "which", lambda n: str(fake) if n == "nvidia-smi" else real_which(n))
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    return log, when


class GpuClock:
    """The stop's clock and sleep, and a GPU 0 whose memory the driver frees at `freed`: each
    look at it (nvidia-smi) takes `query` s of this clock."""

    def __init__(self, freed: float, query: float = 0.08) -> None:
        self.now, self.freed, self.query = 0.0, freed, query
        self.sleeps: list[float] = []
        self.looks: list[float] = []  # when each look ended

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds

    def devices(self, started: object = None) -> tuple[list[dict[str, Any]], None]:
        self.now += self.query
        self.looks.append(self.now)
        used = 0 if self.now >= self.freed else 40000
        return [
            {"index": 0, "uuid": "GPU-1", "used_mib": used, "total_mib": 81559, "util": 0}
        ], None


def gpu_clock(monkeypatch: pytest.MonkeyPatch, freed: float) -> GpuClock:
    clock = GpuClock(freed)
    monkeypatch.setattr(agent_stop, "time", clock)
    patch_agent(monkeypatch, "gpu_devices", clock.devices)
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    return clock


def test_a_stop_sees_the_gpus_freed_within_a_look_and_a_short_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The driver frees the memory 0.6 s into the wait: the wait ends within one short pause and
    one look after that (not a quarter of a second later), and says the GPU is free."""
    clock = gpu_clock(monkeypatch, freed=0.6)
    warnings: list[str] = []
    assert agent_stop.gpu_release(set(), {0}, warnings, timeout=10.0) == ({}, {}, [])
    assert warnings == []
    assert set(clock.sleeps) == {agent_stop.GPU_RELEASE_PAUSE}, clock.sleeps
    assert clock.now - clock.freed <= agent_stop.GPU_RELEASE_PAUSE + clock.query + 1e-9
    assert agent_stop.GPU_RELEASE_PAUSE <= 0.05  # the pause that makes "soon" soon


def test_a_busy_gpu_is_looked_at_less_often_after_the_first_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Memory that is never freed: short pauses for GPU_RELEASE_SOON s, then the longer one,
    until the timeout; the GPU is reported used from outside."""
    clock = gpu_clock(monkeypatch, freed=float("inf"))
    _, _, outside = agent_stop.gpu_release(set(), {0}, [], timeout=10.0)
    assert outside == [{"index": 0, "used_mib": 40000}]
    soon = [at for at in clock.looks if at < agent_stop.GPU_RELEASE_SOON]
    later = clock.looks[len(soon) :]
    assert len(soon) >= 10 and len(later) <= 8 / agent_stop.GPU_RELEASE_PAUSE_LATER + 2
    assert max(clock.sleeps) == agent_stop.GPU_RELEASE_PAUSE_LATER
    assert 10.0 <= clock.now <= 10.0 + clock.query + 1e-9  # one last look at the deadline


def test_a_gpu_that_stays_busy_ends_the_wait_at_its_timeout_after_few_queries(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Memory that is never freed: the wait ends at its timeout, reports the GPU used from
    outside, and after the first seconds looks only every GPU_RELEASE_PAUSE_LATER s."""
    monkeypatch.setattr(agent_stop, "GPU_RELEASE_SOON", 0.3)
    log, _ = releasing_nvidia_smi(tmp_path, monkeypatch, after=3600)
    started = time.monotonic()
    _, _, outside = agent_stop.gpu_release(set(), {0}, [], timeout=1.5)
    took = time.monotonic() - started
    assert outside == [{"index": 0, "used_mib": 40000}]
    assert 1.5 <= took < 2.5, took
    # At most one query per short pause for 0.3 s, then one per 0.5 s: not one per 0.05 s.
    assert len(log.read_text().splitlines()) <= 0.3 / agent_stop.GPU_RELEASE_PAUSE + 5


def test_tree_age_sees_a_save_being_written_two_levels_down(tmp_path: Path) -> None:
    """poll's checkpoint_age: the newest write at or below the directory (a DCP save writes
    files inside a step directory); none for a missing one; a tree too large to look through
    counts as being written."""
    assert agent_poll.tree_age(str(tmp_path / "missing")) is None
    assert agent_poll.tree_age(None) is None
    root = tmp_path / "checkpoints"
    (root / "step_100").mkdir(parents=True)
    shard = root / "step_100" / "__0_0.distcp"
    shard.write_bytes(b"x")
    old = time.time() - 600
    for path in (shard, root / "step_100", root):
        os.utime(path, (old, old))
    age = agent_poll.tree_age(str(root))
    assert age is not None and 590 < age < 700
    shard.write_bytes(b"xy")  # the save goes on
    age = agent_poll.tree_age(str(root))
    assert age is not None and age < 5
    os.utime(shard, (old, old))
    deep = root / "step_100" / "more" / "deeper.bin"  # three levels down: not looked at
    deep.parent.mkdir()
    deep.write_bytes(b"z")
    os.utime(deep.parent, (old, old))
    os.utime(root / "step_100", (old, old))
    age = agent_poll.tree_age(str(root))
    assert age is not None and age > 590
    for i in range(5):
        (root / f"f{i}").write_bytes(b"")
        os.utime(root / f"f{i}", (old, old))
    os.utime(root, (old, old))
    assert agent_poll.tree_age(str(root), limit=3) == 0.0


def test_a_launch_that_fails_after_the_stop_is_retried_once_then_run_is_down(
    target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert target.apply()["ok"] is True
    ckpt = target.workdir / "checkpoints"
    ckpt.mkdir()
    calls: list[str] = []

    def unstartable(state: agent_deploy.DeployState, marker: str) -> list[str]:
        calls.append(marker)
        return ["no-such-tmux-command"]

    monkeypatch.setattr(agent_deploy, "launch_args", unstartable)
    result = target.apply(restart=True, checkpoint_mode="archive")
    assert len(calls) == 2, "tried, then retried once"
    error = result["error"]
    assert error["kind"] == "down", error  # exit 1: reached, acted on, nothing running
    assert error["message"].startswith("run is down: session")
    assert "the old run was stopped (pids" in error["message"]
    assert "checkpoints archived to " + str(ckpt) + ".archived-" in error["message"]
    assert any("retrying once" in w for w in result["warnings"])
    assert target.state()["exists"] is False


def test_login_env_is_a_login_shells_not_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `pct exec --keep-env` brings from the node's session stays out of the base a run
    starts from; what the container's login profile exports is in it."""
    from launcher.agent import base

    (tmp_path / ".profile").write_text("export FROM_PROFILE=yes\n")
    account = {"HOME": str(tmp_path), "SHELL": "/bin/sh", "PATH": base.LOGIN_PATH}
    monkeypatch.setattr(base, "account_env", lambda: dict(account, USER="root"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/0")
    monkeypatch.setenv("SSH_CONNECTION", "10.0.0.9 50000 10.0.0.1 22")
    env = base.read_login_env()
    assert env["FROM_PROFILE"] == "yes" and env["HOME"] == str(tmp_path)
    assert not {"XDG_RUNTIME_DIR", "SSH_CONNECTION", "PWD", "SHLVL"} & set(env)
    account["SHELL"] = str(tmp_path / "no-such-shell")  # then /bin/sh, still a login shell
    assert base.read_login_env()["FROM_PROFILE"] == "yes"


def test_a_removed_tmux_socket_is_made_again_for_its_live_server(target: Target) -> None:
    """systemd-tmpfiles may remove tmux's socket (and its directory) under a live server
    (tmux/tmux#4640): the run is found by its server's listening socket, SIGUSR1 restores it,
    and the poll says so; a second deploy is refused, not started next to it."""
    assert target.apply()["ok"] is True
    server = tmux_format(target, "#{pid}")
    path = agent_tmux.socket_path()
    shutil.rmtree(os.path.dirname(path))  # the socket and its directory, as tmpfiles does
    polled = target.poll()
    assert polled["session"]["exists"] is True, polled
    note = f"had been removed under its live server (pid {server};"
    assert any(note in w for w in polled["warnings"]), polled["warnings"]
    assert os.path.exists(path) and stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    refused = target.apply()
    assert refused["ok"] is False and refused["error"]["kind"] == "refused", refused["error"]
    assert tmux_format(target, "#{pid}") == server
    assert agent_tmux.restore_socket() is None  # the socket is there: nothing to do


def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """A fake nvidia-smi: a shell script that runs `body`; the PID of each call in calls.log."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\necho $$ >> {shlex.quote(str(log))}\n{body}\n")
    fake.chmod(0o755)
    real_which = agent_base.which
    patch_agent(monkeypatch, "which", lambda n: str(fake) if n == "nvidia-smi" else real_which(n))
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    return log


def test_a_hung_nvidia_smi_is_not_joined_by_another_and_polls_do_not_wait_for_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = fake_nvidia_smi(tmp_path, monkeypatch, "exec sleep 30")
    queries = [agent_gpus.poll_query() for _ in range(6)]
    try:
        started = time.monotonic()
        first = agent_gpus.poll_gpus(8, set(), queries[0], 0.5)
        assert "has not answered in" in first["error"] and first["devices"] == []
        later = [agent_gpus.poll_gpus(8, set(), q, 0.5) for q in queries[1:]]
        assert time.monotonic() - started < 3.0  # the busy ones are not waited for
        assert all("an earlier nvidia-smi has run for" in p["error"] for p in later), later
        assert len(log.read_text().split()) == 1  # one nvidia-smi, however many polls
    finally:
        for query in queries:
            query.cancel()


def test_an_endless_answer_is_cut_and_unknown(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """100 MB from nvidia-smi: cut at its limit (RLIMIT_FSIZE on the runner's file), read as
    unknown, quickly."""
    fake_nvidia_smi(tmp_path, monkeypatch, "exec yes '0, GPU-1, 00000000:18:00.0, 1, 2, 3, X'")
    started = time.monotonic()
    answer = agent_gpus.poll_gpus(8, set(), agent_gpus.poll_query(), 10.0)
    assert time.monotonic() - started < 5.0
    assert "cut at its size limit" in answer["error"] and answer["devices"] == []


def test_cuda_visible_devices_naming_no_gpu_here_refuses_the_deploy_as_a_config_error(
    target: Target, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    real_which = agent_base.which
    patch_agent(monkeypatch, "which", lambda n: str(fake) if n == "nvidia-smi" else real_which(n))
    patch_agent(monkeypatch, "scan_device_files", lambda pids=None: {})
    result = target.apply(gpus=1, env={"CUDA_VISIBLE_DEVICES": "GPU-9"})
    assert result["error"]["kind"] == "invalid", result["error"]
    assert "CUDA_VISIBLE_DEVICES=GPU-9: GPU-9 matches no GPU here" in result["error"]["message"]
    assert target.apply(gpus=1, env={"CUDA_VISIBLE_DEVICES": "GPU-2"})["ok"] is True

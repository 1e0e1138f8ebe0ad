# mypy: allow-untyped-calls
"""logs, stop, attach, history, rollback and doctor: agent ops on this host, workflows on a
strict fake host, and the CLI's help."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from launcher.agent import base as agent_base
from launcher.agent import logs as agent_logs
from launcher.agent import main as agent_main
from launcher.agent import paths as agent_paths
from launcher.agent import stop as agent_stop
from launcher.cli.main import cli
from launcher.config.models import HostSpec
from launcher.core.errors import (
    ConfigError,
    ConnectError,
    ExitCode,
    HostKeyError,
    LauncherError,
    RemoteError,
)
from launcher.deploy.doctor import config_failed, doctor
from launcher.operate.attach import attach, attach_argv
from launcher.operate.history import history, history_lines
from launcher.operate.logs import LineSplitter, logs
from launcher.operate.rollback import rollback
from launcher.operate.stop import stop
from launcher.transport.resolve import resolve_endpoint
from tests.unit.agentcontract import HandlerContract
from tests.unit.fakehost import StrictFakeHost
from tests.unit.projectfiles import NO_SESSION, load_target

RUNNING = {**NO_SESSION, "exists": True, "pane_dead": False, "pane_pid": 42, "width": 250}
needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


# --------------------------------------------------------------------------- agent: logs


def test_tail_file_reads_only_the_end(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_bytes(b"".join(b"line %d\r\n" % i for i in range(5000)) + b"partial")
    lines, partial, offset = agent_logs.tail_file(str(log), 3, block=64)
    assert lines == ["line 4997", "line 4998", "line 4999"]
    assert partial == "partial"
    assert offset == log.stat().st_size - len("partial")


def test_tail_file_cuts_endless_lines(tmp_path: Path) -> None:
    """A 5 MB line costs what the asked lines can take (read backwards, a block at a time),
    and comes back cut and marked; the lines after it are whole."""
    log = tmp_path / "run.log"
    limit = agent_logs.LINE_LIMIT
    log.write_bytes(b"before\n" + b"x" * 5_000_000 + b"\nstep=1\nstep=2\n" + b"y" * (limit + 9))
    lines, partial, offset = agent_logs.tail_file(str(log), 3)
    assert lines == [f"[line cut: its start not read] {'x' * limit}", "step=1", "step=2"]
    assert partial == f"[line cut: 9 bytes before] {'y' * limit}"
    assert offset == log.stat().st_size - limit - 9
    log.write_bytes(b"a\n" + b"z" * (3 * limit) + b"\nb\n")
    lines, _, _ = agent_logs.tail_file(str(log), 5)
    assert lines == ["a", "z" * limit + f" [line cut: {2 * limit} more bytes]", "b"]


def test_tail_file_short_and_empty_files(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    data = b"\n=== launcher run x ===\nbar 10%\rbar 100%\n"
    log.write_bytes(data)
    expected = ["", "=== launcher run x ===", "bar 100%"]
    assert agent_logs.tail_file(str(log), 50) == (expected, "", len(data))
    assert agent_logs.tail_file(str(log), 0)[0] == []
    log.write_bytes(b"")
    assert agent_logs.tail_file(str(log), 5) == ([], "", 0)


def test_logs_op_without_a_log_or_session(tmp_path: Path, private_tmux: None) -> None:
    answer = agent_main.run_local(
        {"op": "logs", "workdir": str(tmp_path), "session": "nothere", "lines": 5}
    )
    assert answer["ok"] is True
    assert answer["log_exists"] is False and answer["lines"] == []
    assert answer["session"]["exists"] is False


def wait_a_little(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def test_follow_log_streams_until_the_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = str(tmp_path)
    os.makedirs(agent_paths.state_dir(workdir))
    log = agent_paths.log_path(workdir, "s")
    with open(log, "wb") as f:
        f.write(b"old\n")
    ended: dict[str, Any] = {}
    monkeypatch.setattr(agent_logs, "run_end", lambda w, s: ended.get("how"))

    def writer() -> None:
        for i in range(3):
            time.sleep(0.05)
            with open(log, "ab") as f:
                f.write(b"new %d\n" % i)
        ended["how"] = {"reason": "exited", "exit_code": 1}
        with open(log, "ab") as f:
            f.write(b"Traceback\n")

    got = bytearray()
    thread = threading.Thread(target=writer)
    thread.start()
    result = agent_logs.follow_log(
        workdir,
        "s",
        4,
        got.extend,
        lambda: None,
        wait_a_little,
        {"interval": 0.02, "check_every": 0.02, "settle": 0.1},
    )
    thread.join()
    assert bytes(got) == b"new 0\nnew 1\nnew 2\nTraceback\n"
    assert result["ended"] == {"reason": "exited", "exit_code": 1}
    assert result["client_gone"] is False
    assert result["offset"] == os.path.getsize(log)


def test_follow_log_ends_when_the_client_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent_logs, "run_end", lambda w, s: None)
    beats: list[int] = []
    result = agent_logs.follow_log(
        str(tmp_path), "s", 0, lambda d: None, lambda: beats.append(1), lambda t: True
    )
    assert result == {"ended": None, "client_gone": True, "offset": 0}
    assert beats == [1]


def test_follow_log_restarts_a_truncated_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = str(tmp_path)
    os.makedirs(agent_paths.state_dir(workdir))
    log = agent_paths.log_path(workdir, "s")
    with open(log, "wb") as f:
        f.write(b"short\n")
    monkeypatch.setattr(agent_logs, "run_end", lambda w, s: {"reason": "session gone"})
    got = bytearray()
    options = {"interval": 0.01, "check_every": 0.0, "settle": 0.05}
    agent_logs.follow_log(workdir, "s", 1000, got.extend, lambda: None, lambda t: False, options)
    assert bytes(got) == b"short\n"


# --------------------------------------------------------------------------- agent: poll, history


def test_poll_reports_record_and_log_age(tmp_path: Path, private_tmux: None) -> None:
    request = {"op": "poll", "workdir": str(tmp_path), "session": "s", "lines": 5}
    answer = agent_main.run_local(request)
    assert answer["record"] is None and answer["log_age"] is None
    agent_paths.append_record(str(tmp_path), {"sha256": "abc"})
    with open(agent_paths.log_path(str(tmp_path), "s"), "w") as f:
        f.write("x\n")
    answer = agent_main.run_local(request)
    assert answer["record"] == {"sha256": "abc"}
    assert 0 <= answer["log_age"] < 5


def test_history_op_newest_first_skips_bad_lines(tmp_path: Path) -> None:
    for n in range(3):
        agent_paths.append_record(str(tmp_path), {"n": n})
    with open(os.path.join(agent_paths.state_dir(str(tmp_path)), "deploys.jsonl"), "a") as f:
        f.write("{not json\n")
    answer = agent_main.run_local({"op": "history", "workdir": str(tmp_path)})
    assert [r["n"] for r in answer["records"]] == [2, 1, 0]
    assert answer["total"] == 3
    assert "1 unreadable line(s)" in answer["warnings"][0]
    limited = agent_main.run_local({"op": "history", "workdir": str(tmp_path), "limit": 1})
    assert [r["n"] for r in limited["records"]] == [2]
    empty = agent_main.run_local({"op": "history", "workdir": str(tmp_path / "none")})
    assert empty["records"] == [] and empty["ok"] is True


# --------------------------------------------------------------------------- agent: rollback


@pytest.fixture(autouse=True)
def contract(monkeypatch: pytest.MonkeyPatch) -> Iterator[HandlerContract]:
    """The agent ops run here also check the protocol both ways (tests/unit/agentcontract.py)."""
    checked = HandlerContract()
    checked.install(monkeypatch)
    yield checked
    checked.assert_kept()


@pytest.fixture
def private_tmux(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A private tmux socket directory, so nothing reaches the developer's tmux server."""
    socket_dir = tempfile.mkdtemp(prefix="lo-")
    monkeypatch.setenv("TMUX_TMPDIR", socket_dir)
    monkeypatch.delenv("TMUX", raising=False)
    yield
    subprocess.run(["tmux", "kill-server"], capture_output=True, check=False)
    shutil.rmtree(socket_dir, ignore_errors=True)


SLEEPER = "import time\nprint('v%d', flush=True)\ntime.sleep(60)\n"


def apply_request(tmp_path: Path, session: str, version: int, **extra: Any) -> dict[str, Any]:
    workdir = tmp_path / "wd"
    workdir.mkdir(exist_ok=True)
    source = SLEEPER % version
    tmp = workdir / f".push-{version}.tmp"
    tmp.write_text(source)
    request = {
        "op": "apply",
        "workdir": str(workdir),
        "dest": "train.py",
        "tmp": str(tmp),
        "sha256": hashlib.sha256(source.encode()).hexdigest(),
        "session": session,
        "restart": True,
        "grace": 0.5,
        "checkpoints": "checkpoints",
        "checkpoint_mode": "keep",
        "command": "exec python3 train.py",
        "record": {"playbook": "demo"},
        "lock_path": str(tmp_path / "run" / "deploy.lock"),
    }
    request.update(extra)
    return request


def sha_of(version: int) -> str:
    return hashlib.sha256((SLEEPER % version).encode()).hexdigest()


@needs_tmux
def test_rollback_op_restores_prev_through_the_transaction(
    tmp_path: Path, private_tmux: None
) -> None:
    session = "r" + uuid.uuid4().hex[:8]
    workdir = tmp_path / "wd"
    try:
        first = agent_main.run_local(apply_request(tmp_path, session, 1))
        assert first["ok"], first["error"]
        request = apply_request(tmp_path, session, 1)
        del request["tmp"], request["sha256"]
        request["op"] = "rollback"
        none = agent_main.run_local(request)
        assert none["error"]["kind"] == "refused"
        assert "no previous version" in none["error"]["message"]

        assert agent_main.run_local(apply_request(tmp_path, session, 2))["ok"]
        refused = agent_main.run_local({**request, "restart": False})
        assert refused["error"]["kind"] == "refused"
        assert "use --restart" in refused["error"]["message"]

        done = agent_main.run_local(request)
        assert done["ok"], done["error"]
        assert [s["name"] for s in done["steps"]][-4:] == [
            "stop",
            "checkpoints",
            "launch",
            "record",
        ]
        assert agent_base.sha256_file(str(workdir / "train.py")) == sha_of(1)
        assert agent_base.sha256_file(str(workdir / "train.py.prev")) == sha_of(2)
        assert done["record"]["rollback"] is True
        assert done["record"]["rolled_back_from"] == sha_of(2)
        assert done["stopped"]["was_running"] is True
        assert [p.name for p in workdir.iterdir() if "launcher-rollback" in p.name] == []
    finally:
        agent_stop.stop_run(session, 0.2, 0, [])


@needs_tmux
def test_rollback_puts_the_previous_run_back_with_its_env_and_checkpoints(
    tmp_path: Path, private_tmux: None
) -> None:
    session = "r" + uuid.uuid4().hex[:8]
    workdir = tmp_path / "wd"
    ckpt = workdir / "checkpoints"
    archive = {"checkpoint_mode": "archive", "keep_archives": 5}
    try:
        first = apply_request(tmp_path, session, 1, env={"LR": "1e-3"}, **archive)
        first["record"] = {"overrides": {"env": ["LR"], "set": [], "command": None}}
        assert agent_main.run_local(first)["ok"]
        ckpt.mkdir()
        (ckpt / "step_40.pt").write_text("good")
        good_inode = ckpt.stat().st_ino
        second = agent_main.run_local(
            apply_request(tmp_path, session, 2, env={"LR": "9"}, **archive)
        )
        assert second["ok"], second["error"]
        ckpt.mkdir()
        (ckpt / "step_1.pt").write_text("broken")

        request = apply_request(tmp_path, session, 1, env={"LR": "playbook"})
        del request["tmp"], request["sha256"]
        request.update({"op": "rollback", "checkpoint_mode": "restore", "keep_archives": 5})
        done = agent_main.run_local(request)
        assert done["ok"], done["error"]
        assert agent_base.sha256_file(str(workdir / "train.py")) == sha_of(1)
        assert ckpt.stat().st_ino == good_inode and (ckpt / "step_40.pt").read_text() == "good"
        moved = done["checkpoints"]
        assert moved["action"] == "restore" and moved["to"] == str(ckpt)
        assert (Path(moved["archived"]) / "step_1.pt").read_text() == "broken"
        run_file = (workdir / ".launcher" / f"{session}.run").read_text()
        assert "export LR=1e-3" in run_file, run_file  # the put-back run's env, not the playbook's
        record = done["record"]
        assert record["rollback"] is True and record["rolled_back_to"] == first_run(workdir)
        assert record["overrides"]["env"] == ["LR"]

        records = agent_main.run_local({"op": "history", "workdir": str(workdir)})["records"]
        now = {r["run"]: r["checkpoints_now"] for r in records}
        assert now[record["run"]] == {"state": "live", "path": str(ckpt)}
        assert now[first_run(workdir)]["state"] == "restored"
        assert now[second["record"]["run"]] == {"state": "archived", "path": moved["archived"]}
        shown = "\n".join(history_lines(records[0]))
        assert "moved back in place" in shown and f"in place at {ckpt}" in shown

        fresh = agent_main.run_local(request)  # the second rollback puts run 2 back: undone
        assert fresh["ok"], fresh["error"]
        assert agent_base.sha256_file(str(workdir / "train.py")) == sha_of(2)
        assert (ckpt / "step_1.pt").read_text() == "broken"
        assert "export LR=9" in (workdir / ".launcher" / f"{session}.run").read_text()
    finally:
        agent_stop.stop_run(session, 0.2, 0, [])


def first_run(workdir: Path) -> str:
    line = (workdir / ".launcher" / "deploys.jsonl").read_text().splitlines()[0]
    return str(json.loads(line)["run"])


def test_rollback_op_refuses_an_unsafe_dest(tmp_path: Path) -> None:
    request = apply_request(tmp_path, "s", 1, op="rollback", dest="../x.py")
    answer = agent_main.run_local(request)
    assert answer["error"]["kind"] == "unsafe_path"


# --------------------------------------------------------------------------- workflows: logs


@pytest.fixture
def target(tmp_path: Path) -> Any:
    return load_target(tmp_path)


def logs_answer(**overrides: Any) -> dict[str, Any]:
    answer: dict[str, Any] = {
        "source": "log",
        "log_file": "/root/dflash/.launcher/dflash.log",
        "log_exists": True,
        "lines": ["a", "b"],
        "partial": "",
        "offset": 10,
        "session": RUNNING,
        "exit_code": None,
    }
    answer.update(overrides)
    return answer


def test_logs_tail_shows_lines_and_partial(target: Any) -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("logs", lambda req: seen.update(req) or logs_answer(partial="c"))
    shown: list[str] = []
    result = logs(target, host, tail=7, on_line=shown.append)  # type: ignore[arg-type]
    host.assert_done()
    assert shown == ["a", "b", "c"]
    assert result.exit_code == ExitCode.OK and not result.followed
    assert seen["lines"] == 7 and seen["raw"] is False and seen["session"] == "dflash"


def test_logs_without_log_or_pane_exit_1(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("logs", logs_answer(log_exists=False, lines=[], session=NO_SESSION))
    result = logs(target, host)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.UNHEALTHY
    assert "no log file" in result.summary and "no session" in result.summary
    host.expect_agent("logs", logs_answer(source="pane", session=NO_SESSION))
    raw = logs(target, host, raw=True)  # type: ignore[arg-type]
    assert raw.exit_code == ExitCode.UNHEALTHY and "no session 'dflash'" in raw.summary
    host.assert_done()


def envelope(**data: Any) -> bytes:
    body = {"ok": True, "op": "follow", "error": None, "warnings": [], **data}
    return ("\n" + json.dumps(body) + "\n").encode()


def test_logs_follow_streams_over_one_exec(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("logs", logs_answer(partial="half"))
    seen: dict[str, Any] = {}

    def follow(request: dict[str, Any], out: Callable[[bytes], None], err: Any) -> int:
        seen.update(request)
        out(b"half line\r\nnext ")
        err(b"\n")  # heartbeat
        out(b"one\nbar 1%\rbar 99%\r\nlast")
        err(envelope(ended={"reason": "exited", "exit_code": 0}, client_gone=False, offset=30))
        return 0

    host.expect_stream("follow", follow)
    shown: list[str] = []
    result = logs(target, host, follow=True, on_line=shown.append)  # type: ignore[arg-type]
    host.assert_done()
    assert shown == ["a", "b", "half line", "next one", "bar 99%", "last"]
    assert seen["offset"] == 10
    assert result.followed and result.ended == {"reason": "exited", "exit_code": 0}
    assert result.summary == "the run ended with exit code 0"


def test_logs_follow_ctrl_c_stops_following_only(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("logs", logs_answer())

    def interrupted(request: dict[str, Any], out: Callable[[bytes], None], err: Any) -> int:
        out(b"x\n")
        raise KeyboardInterrupt

    host.expect_stream("follow", interrupted)
    result = logs(target, host, follow=True)  # type: ignore[arg-type]
    host.assert_done()
    assert result.interrupted and result.exit_code == ExitCode.OK
    assert "the run goes on" in result.summary


def test_logs_follow_not_started_when_the_run_ended(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("logs", logs_answer(exit_code=1, partial="tail"))
    shown: list[str] = []
    result = logs(target, host, follow=True, on_line=shown.append)  # type: ignore[arg-type]
    host.assert_done()
    assert shown[-1] == "tail" and not result.followed
    assert "not following: the run has ended" in result.summary


def test_logs_follow_failure_is_remote_error(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("logs", logs_answer())

    def broken(request: dict[str, Any], out: Callable[[bytes], None], err: Any) -> int:
        err(b"lxc-attach: failed\n")
        return 1

    host.expect_stream("follow", broken)
    with pytest.raises(RemoteError, match="following the log failed"):
        logs(target, host, follow=True)  # type: ignore[arg-type]


def test_line_splitter_joins_split_utf8() -> None:
    shown: list[str] = []
    splitter = LineSplitter(shown.append)
    data = "é ok\n".encode()
    splitter.feed(data[:1])
    splitter.feed(data[1:])
    splitter.flush()
    assert shown == ["é ok"]


# --------------------------------------------------------------------------- stop, attach


def stop_report(**overrides: Any) -> dict[str, Any]:
    report: dict[str, Any] = {
        "was_running": True,
        "session_existed": True,
        "pids": [42, 43],
        "forced": False,
        "leftover": [],
        "gpu_holders": [],
        "gpu_others": [],
        "gpu_outside": [],
    }
    report.update(overrides)
    return {"stopped": report}


LIVE = {**NO_SESSION, "exists": True, "pane_dead": False, "pane_pid": 41, "run": "dflash:r1"}


def test_stop_reports_pids_and_gpus(target: Any) -> None:
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    host.expect_agent("poll", poll_answer(LIVE))
    host.expect_agent("stop", lambda req: seen.update(req) or stop_report())
    result = stop(target, host, grace=7)  # type: ignore[arg-type]
    host.assert_done()
    assert result.exit_code == ExitCode.OK
    assert seen["grace"] == 7 and seen["gpus"] == 8 and seen["lock_path"]
    # The run the poll saw is the one the stop is for; it gives up with its client.
    assert seen["expect_run"] == "dflash:r1"
    assert 0 < seen["deadline"] < 7 + 30 + host.endpoint.command_timeout
    assert [(s.name, s.status) for s in result.steps] == [
        ("stop", "ok"),
        ("processes", "ok"),
        ("gpus", "ok"),
    ]
    assert "pids 42, 43" in result.summary


def test_stop_without_session_and_with_leftovers(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("poll", poll_answer(NO_SESSION))
    host.expect_agent("stop", stop_report(was_running=False, session_existed=False, pids=[]))
    result = stop(target, host)  # type: ignore[arg-type]
    assert result.exit_code == ExitCode.OK and "nothing to stop" in result.summary
    assert result.steps == []
    host.expect_agent("poll", poll_answer(NO_SESSION))
    host.expect_agent(
        "stop",
        stop_report(forced=True, leftover=[43], gpu_holders=[{"pid": 43, "name": "python3"}]),
    )
    bad = stop(target, host)  # type: ignore[arg-type]
    host.assert_done()
    assert bad.exit_code == ExitCode.UNREACHABLE
    assert [s.status for s in bad.steps] == ["ok", "failed", "failed"]


def test_attach_argv_uses_the_hosts_settings() -> None:
    spec = HostSpec(
        address="10.0.0.5",
        port=2222,
        user="ops",
        identity_file="/keys/id",
        known_hosts="/kh/known hosts",
        host_key_policy="accept-new",
        jump="bastion:2200",
        connect_timeout=7.5,
    )
    endpoint = resolve_endpoint("pve", spec, ssh_config=Path("/nonexistent"))
    argv = attach_argv(endpoint, 200, "dflash")
    assert argv == [
        "ssh",
        "-t",
        "-p",
        "2222",
        "-l",
        "ops",
        "-i",
        "/keys/id",
        "-o",
        'UserKnownHostsFile="/kh/known hosts"',
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "ProxyJump=bastion:2200",
        "-o",
        "ConnectTimeout=8",
        "--",
        "10.0.0.5",
        "pct exec 200 -- tmux attach -t =dflash:",
    ]
    strict = attach_argv(resolve_endpoint("pve", HostSpec(address="h"), Path("/none")), 1, "s")
    assert "StrictHostKeyChecking=yes" in strict and not any("ProxyJump" in a for a in strict)


def poll_answer(session: dict[str, Any]) -> dict[str, Any]:
    return {
        "session": session,
        "capture": "",
        "exit_code": None,
        "stopped": None,
        "now": 0.0,
        "record": None,
        "log_age": None,
        "checkpoint_age": None,
        "lock": None,
        "gpus": None,
    }


def test_attach_checks_the_session_first(target: Any) -> None:
    host = StrictFakeHost()
    host.expect_agent("poll", poll_answer(NO_SESSION))
    missing = attach(target, host)  # type: ignore[arg-type]
    assert missing.exit_code == ExitCode.UNHEALTHY and missing.argv == []
    assert "no session 'dflash'" in missing.summary


# --------------------------------------------------------------------------- history, rollback

RECORD = {
    "time": "2026-01-02T03:04:05Z",
    "operator": "ann@ws",
    "sha256": "3f2a9c1b0d4e" + "0" * 52,
    "outcome": "launched",
    "command": "python3 train.py",
    "stopped": {"session_existed": True, "pids": [5, 6], "forced": True},
    "checkpoints": {"action": "archive", "from": "/w/c", "to": "/w/c.archived-1"},
}


def test_history_passes_records_newest_first(target: Any) -> None:
    host = StrictFakeHost()
    older = {**RECORD, "time": "2026-01-01T00:00:00Z"}
    host.expect_agent("history", {"records": [RECORD, older], "total": 2, "path": "/p"})
    result = history(target, host)  # type: ignore[arg-type]
    host.assert_done()
    assert [r["time"] for r in result.records] == [RECORD["time"], older["time"]]
    assert "2 deploy(s)" in result.summary and "3f2a9c1b0d4e" in result.summary
    lines = history_lines({**RECORD, "rollback": True})
    assert lines[0].endswith("[rollback]")
    assert "pids 5, 6 (forced)" in lines[2] and "c.archived-1" in lines[3]


def test_rollback_request_and_refusal(target: Any, tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    host = StrictFakeHost()
    seen: dict[str, Any] = {}
    applied = {
        "steps": [{"name": "verify", "status": "ok", "detail": "sha"}],
        "record": {"sha256": "a" * 64, "rolled_back_from": "b" * 64},
    }
    host.expect_agent("rollback", lambda req: seen.update(req) or applied)
    steps: list[Any] = []
    result = rollback(target, host, restart=True, on_step=steps.append)  # type: ignore[arg-type]
    assert seen["restart"] is True and seen["checkpoint_mode"] == "archive"
    assert "tmp" not in seen and "sha256" not in seen
    assert [s.name for s in steps] == ["verify"]
    assert result.summary.endswith(f"sha256 {'a' * 12} (was {'b' * 12})")

    error = {"kind": "refused", "message": "no previous version to roll back to"}
    host.expect_agent("rollback", {"ok": False, "error": error})
    with pytest.raises(LauncherError) as caught:
        rollback(target, host)  # type: ignore[arg-type]
    assert caught.value.exit_code == ExitCode.REFUSED


# --------------------------------------------------------------------------- doctor


PLAN_CHECKS = ["paths", "receive", "lock", "tmux", "resources", "active_check", "gpus",
               "verify", "compile", "checkpoint_guard", "launch_check"]  # fmt: skip


def doctor_plan(failed: dict[str, str] | None = None) -> Any:
    """The agent's plan-mode answer: every check ok except `failed` (name -> error kind)."""
    failed = failed or {}

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        assert request["plan"] is True and request["keep_going"] is True
        steps: list[dict[str, Any]] = []
        for name in PLAN_CHECKS:
            if name in failed:
                steps.append(
                    {"name": name, "status": "failed", "detail": "no", "kind": failed[name]}
                )
            else:
                steps.append({"name": name, "status": "ok", "detail": "fine"})
        steps.append({"name": "launch", "status": "planned", "detail": "tmux session"})
        first = next(iter(failed.items()), None)
        error = {"kind": first[1], "message": "no"} if first else None
        return {"ok": not failed, "error": error, "warnings": [], "steps": steps,
                "preflight": {"python": "3.11.2"}}  # fmt: skip

    return answer


def doctor_host(status: str = "status: running", failed: dict[str, str] | None = None) -> Any:
    host = StrictFakeHost()
    host.expect("host", lambda argv: (0, "/usr/sbin/pct\n") if argv[:2] == ["command", "-v"] else 9)
    host.expect("host", lambda argv: (0, status + "\n") if argv[:2] == ["pct", "status"] else 9)
    host.expect_agent("apply", doctor_plan(failed))
    return host


def test_doctor_all_pass_shows_the_deploy_checks(target: Any) -> None:
    host = doctor_host()
    result = doctor(target, host)
    host.assert_done()
    assert result.exit_code == ExitCode.OK, result.checks
    assert [c.name for c in result.checks] == [
        "config", "reachable", "host key", "auth", "pct", "container", "running", "python3",
        *PLAN_CHECKS,
    ]  # fmt: skip
    assert all(c.status == "ok" for c in result.checks)


def test_doctor_stopped_container_exit_3(target: Any) -> None:
    host = StrictFakeHost()
    host.expect("host", lambda argv: (0, "/usr/sbin/pct\n"))
    host.expect("host", lambda argv: (0, "status: stopped\n"))
    result = doctor(target, host)
    host.assert_done()
    assert result.exit_code == ExitCode.UNREACHABLE
    running = next(c for c in result.checks if c.name == "running")
    assert running.status == "failed" and running.fix == "pct start 200"
    assert next(c for c in result.checks if c.name == "deploy checks").status == "skipped"


def test_doctor_shows_every_failed_check_first_decides(target: Any) -> None:
    host = doctor_host(failed={"resources": "missing", "lock": "locked"})
    result = doctor(target, host)
    failed = [(c.name, c.exit_code) for c in result.checks if c.status == "failed"]
    assert failed == [("lock", ExitCode.REFUSED), ("resources", ExitCode.UNREACHABLE)]
    assert result.exit_code == ExitCode.REFUSED  # the first failure decides
    assert next(c for c in result.checks if c.name == "lock").fix


def test_doctor_host_key_and_unreachable(target: Any) -> None:
    host = StrictFakeHost()

    def unknown(argv: list[str]) -> int:
        raise HostKeyError("host key not known", hint="ssh-keyscan -p 22 h >> kh")

    host.expect("host", unknown)
    result = doctor(target, host)
    statuses = {c.name: c.status for c in result.checks}
    assert statuses["reachable"] == "ok" and statuses["host key"] == "failed"
    assert statuses["auth"] == "skipped"
    assert "ssh-keyscan" in (result.checks[2].fix or "")

    def refused(argv: list[str]) -> int:
        raise ConnectError("cannot connect")

    host.expect("host", refused)
    down = doctor(target, host)
    host.assert_done()
    assert down.exit_code == ExitCode.UNREACHABLE
    assert {c.name: c.status for c in down.checks}["reachable"] == "failed"


def test_doctor_config_failure_exit_2() -> None:
    result = config_failed(ConfigError(["inventory.yaml:3: hosts.pve.port: bad"]))
    assert result.exit_code == ExitCode.USAGE
    assert result.checks[0].name == "config" and result.checks[0].status == "failed"
    assert all(c.status == "skipped" for c in result.checks[1:])


# --------------------------------------------------------------------------- CLI


@pytest.mark.parametrize("name", ["logs", "stop", "attach", "history", "rollback", "doctor"])
def test_every_command_has_help_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    assert "Example:" in result.output and f"launcher {name}" in result.output


def test_a_deploys_overrides_are_recorded_with_secrets_redacted() -> None:
    from launcher.deploy.deploy import DeployOptions, override_record

    options = DeployOptions(
        env={"WANDB_API_KEY": "s3cret", "LR": "3e-4"},
        sets=("env.HF_TOKEN=hf_abc", "verify.wait=60"),
        command="python3 train.py --fast",
        message="try a higher lr",
    )
    record = override_record(options)
    assert "s3cret" not in str(record) and "hf_abc" not in str(record)
    assert record["overrides"] == {
        "env": ["LR", "WANDB_API_KEY"],
        "set": ["env.HF_TOKEN=<redacted>", "verify.wait=60"],
        "command": "python3 train.py --fast",
        "message": "try a higher lr",
    }
    shown = history_lines({**RECORD, **record, "user": "ann", "client_host": "laptop"})
    assert (
        "  overrides    --env LR --env WANDB_API_KEY --set env.HF_TOKEN=<redacted> "
        "--set verify.wait=60 --command 'python3 train.py --fast'"
    ) in shown
    assert "  by           ann from laptop" in shown


def test_where_each_runs_checkpoints_are_follows_every_record(tmp_path: Path) -> None:
    from launcher.agent.runs import where_checkpoints_are

    live, kept = str(tmp_path / "c"), tmp_path / "c.archived-2"
    kept.mkdir()
    records = [
        {"run": "s:1", "outcome": "launched", "checkpoints": {"action": "none", "from": live}},
        {"run": "s:2", "replaced": "s:1", "outcome": "launched",
         "checkpoints": {"action": "archive", "from": live, "to": live + ".archived-1"}},
        {"run": "s:3", "replaced": "s:2", "outcome": "launched",
         "checkpoints": {"action": "archive", "from": live, "to": str(kept)}},
        {"run": "s:4", "replaced": "s:3", "outcome": "launched",
         "checkpoints": {"action": "keep", "from": live}},
        {"run": "s:5", "outcome": "failed: launch", "checkpoints": {"action": "purge"}},
    ]  # fmt: skip
    where = where_checkpoints_are(records)
    assert where["s:1"] == {"state": "gone", "path": live + ".archived-1"}  # not there any more
    assert where["s:2"] == {"state": "archived", "path": str(kept)}
    assert where["s:3"] == {"state": "continued", "path": live, "by": "s:4"}
    assert where["s:4"] == {"state": "deleted"}  # the failed deploy after it purged them
    assert "s:5" not in where


def test_a_diff_of_two_runs_names_what_changed_and_never_an_env_value() -> None:
    from launcher.core.errors import UsageError
    from launcher.operate.history import diff_lines, find_run, run_diff

    first = {**RECORD, "run": "s:20260101T000000Z-aa", "overrides": {"env": ["LR"]}}
    second = {
        **RECORD,
        "run": "s:20260102T000000Z-bb",
        "sha256": "9" * 64,
        "command": "python3 train.py --fast",
    }
    records = [second, first, {**first, "outcome": "failed: launch"}]
    assert find_run(records, "20260101") is first
    with pytest.raises(UsageError, match="names several runs"):
        find_run(records, "2026")
    env = {"known": True, "added": [], "removed": [], "changed": ["WANDB_API_KEY"]}
    diff = run_diff(first, second, env)
    assert [c["aspect"] for c in diff["changes"]] == ["code", "command", "overrides", "env changed"]
    lines = diff_lines(diff)
    assert lines[0] == "s:20260101T000000Z-aa -> s:20260102T000000Z-bb"
    assert "  code         sha256 3f2a9c1b0d4e  ->  sha256 999999999999" in lines
    assert "  env changed  WANDB_API_KEY" in lines
    assert diff_lines(run_diff(first, first, None))[1:] == [
        "  no difference in code, command, environment or overrides",
        "  (env: a run's spec was not kept, so its values could not be compared)",
    ]


def test_a_rollback_after_a_watchers_restart_goes_back_past_it() -> None:
    from launcher.agent.runs import previous_run

    records = [
        {"run": "s:1", "session": "s", "outcome": "launched"},
        {"run": "s:2", "session": "s", "outcome": "launched", "replaced": "s:1"},
        {"run": "s:3", "session": "s", "outcome": "launched", "replaced": "s:2",
         "restarted_by": "watch (1/3)"},
        {"run": "s:4", "session": "s", "outcome": "launched", "replaced": "s:3",
         "restarted_by": "watch (2/3)"},
    ]  # fmt: skip
    assert previous_run(records, "s") == "s:1"  # s:3 and s:4 were s:2 again
    assert previous_run(records[:2], "s") == "s:1"
    assert previous_run(records[:1], "s") is None

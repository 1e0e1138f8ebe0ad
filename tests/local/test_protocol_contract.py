"""The protocol checked both ways: every op has a request and an answer type (and the agent a
handler), each handler reads only the keys its request type declares, and each answer is what
its type says (the check the client makes on every answer)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import pytest
from typing_extensions import is_typeddict

from launcher.agent import main as agent_main
from launcher.agent import protocol as p
from launcher.container.agentclient import ANSWERS, REQUESTS, AgentFailure, check_answer
from launcher.container.answers import adapter, problem
from launcher.core.errors import ExitCode, ProtocolError
from tests.unit.agentcontract import HandlerContract, declared_keys

TMUX = shutil.which("tmux")


def test_every_op_has_a_handler_a_request_type_and_an_answer_type() -> None:
    assert set(agent_main.HANDLERS) == set(REQUESTS) == set(ANSWERS) == set(p.OPS)


@pytest.mark.parametrize("op", p.OPS)
def test_a_request_type_names_its_op_as_a_literal(op: str) -> None:
    required, hint = declared_keys(REQUESTS[op])["op"]
    assert required and get_origin(hint) is Literal and op in get_args(hint)
    # and no other op's: a request type is for its own op(s) only
    assert {o for o in p.OPS if REQUESTS[o] is REQUESTS[op]} == set(get_args(hint))


@pytest.mark.parametrize("op", p.OPS)
def test_an_answer_type_is_an_envelope(op: str) -> None:
    envelope = declared_keys(p.Envelope)
    answer = declared_keys(ANSWERS[op])
    assert all(answer[name] == envelope[name] for name in envelope)


def test_every_protocol_type_can_be_checked() -> None:
    """A type pydantic cannot build an adapter for fails here, not on the first answer in the
    field."""
    for name, kind in vars(p).items():
        if isinstance(kind, type) and is_typeddict(kind):
            assert problem({}, kind) is None or "has no" in str(problem({}, kind)), name


def test_an_adapter_is_built_for_the_types_checked_only() -> None:
    """Built on first use: a process that checks one op's answers pays for that op's alone."""
    adapter.cache_clear()
    check_answer("ct", "history", envelope(**HISTORY))
    assert adapter.cache_info().currsize == 2  # the envelope's and the history answer's


# --------------------------------------------------------------------------- the client's check


def envelope(op: str = "history", **data: Any) -> dict[str, Any]:
    return {"ok": True, "op": op, "error": None, "warnings": [], **data}


HISTORY = {"path": "/w/.launcher/deploys.jsonl", "records": [], "total": 0}


def test_a_good_answer_passes_as_it_is() -> None:
    answer = envelope(**HISTORY, extra="an answer may carry more")
    assert check_answer("ct", "history", answer) is answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("text", "answer is str 'text', not an object"),
        (envelope(), "answer has no 'path'"),
        (envelope(**{**HISTORY, "total": "0"}), "answer['total'] is str '0', not an integer"),
        (envelope(**{**HISTORY, "total": True}), "answer['total'] is bool True, not an integer"),
        (envelope(**{**HISTORY, "records": [1]}), "answer['records'][0] is int 1, not an object"),
        (envelope("poll", **HISTORY), "answer['op'] is 'poll', not 'history'"),
        ({**envelope(**HISTORY), "warnings": None}, "answer['warnings'] is NoneType None"),
        ({**envelope(), "ok": False}, "answer['ok'] disagrees with answer['error']"),
        ({**envelope(), "ok": False, "error": {"kind": 3}}, "answer['error']['kind'] is int 3"),
        ({**envelope(), "ok": False, "error": {"kind": "refused"}}, "has no 'message'"),
    ],
)
def test_an_answer_unlike_its_type_is_a_protocol_error(answer: Any, expected: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        check_answer("ct", "history", answer)
    assert caught.value.exit_code == ExitCode.UNREACHABLE
    assert "the agent's answer to 'history' does not match this launcher's protocol" in str(
        caught.value.message
    )
    assert expected in caught.value.message


def test_an_error_answer_is_its_kind_without_the_ops_data() -> None:
    failed = {**envelope(), "ok": False, "error": {"kind": "locked", "message": "held"}}
    with pytest.raises(AgentFailure, match="ct: held") as caught:
        check_answer("ct", "history", failed)
    assert caught.value.exit_code == ExitCode.REFUSED


def test_nested_types_are_checked_where_they_are() -> None:
    session = {"exists": True, "pane_dead": False, "dead_status": None, "pane_pid": 7,
               "width": 250, "run": "s:r", "created": 1}  # fmt: skip
    poll = envelope("poll", session=session, capture="", exit_code=None, stopped=None,
                    now=1.5, record=None, log_age=None, checkpoint_age=None, lock=None,
                    gpus=None)  # fmt: skip
    assert check_answer("ct", "poll", poll) is poll
    poll["now"] = 2  # an int is a number
    assert check_answer("ct", "poll", poll) is poll
    poll["gpus"] = {"want": 1, "held": [0], "devices": [[0, None, "9"]], "error": None}
    with pytest.raises(ProtocolError, match=r"answer\['gpus'\]\['devices'\]\[0\]\[2\]"):
        check_answer("ct", "poll", poll)


# --------------------------------------------------------------------------- the agent's side

SCRIPT = "import time\nprint('started', flush=True)\ntime.sleep(60)\n"


@pytest.fixture
def contract(monkeypatch: pytest.MonkeyPatch) -> HandlerContract:
    checked = HandlerContract()
    checked.install(monkeypatch)
    return checked


@pytest.fixture
def tmux_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if TMUX is None:
        pytest.skip("tmux is not installed")
    socket_dir = tempfile.mkdtemp(prefix="lc-")
    monkeypatch.setenv("TMUX_TMPDIR", socket_dir)
    monkeypatch.delenv("TMUX", raising=False)
    yield
    subprocess.run([TMUX, "kill-server"], capture_output=True, check=False)
    shutil.rmtree(socket_dir, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_each_handler_reads_only_the_keys_its_request_type_declares(
    contract: HandlerContract, tmux_env: None, tmp_path: Path
) -> None:
    """Every op, through its deep paths (a launch, a rollback, a release with a setup), with
    requests that record each key read."""
    workdir = str(tmp_path / "wd")
    session = "c" + uuid.uuid4().hex[:10]
    lock = str(tmp_path / "run" / "deploy.lock")
    common = {"workdir": workdir, "session": session}

    def run(request: dict[str, Any]) -> dict[str, Any]:
        answer = agent_main.run_local(request)
        assert answer["ok"], answer
        return answer

    def apply(source: str, **overrides: Any) -> dict[str, Any]:
        data = source.encode()
        return run(
            {
                "op": "apply", **common, "dest": "train.py", "command": "exec python3 train.py",
                "content_b64": base64.b64encode(data).decode(), "restart": True, "grace": 0.5,
                "sha256": hashlib.sha256(data).hexdigest(), "checkpoints": "checkpoints",
                "checkpoint_mode": "archive", "lock_path": lock, "check_resources": True,
                "operator": {"user": "ann", "host": "ws", "pid": 1}, "record": {"p": "x"},
                "env": {"A": "1"}, "need_bytes": 1, "wait_lock": 0.0, "expect_run": None,
                **overrides,
            }
        )  # fmt: skip

    run({"op": "preflight", **common, "dest": "train.py", "create_workdir": True, "gpus": 0,
         "checkpoints": "checkpoints", "need_bytes": 1, "lock_path": lock})  # fmt: skip
    apply(SCRIPT, plan=True, keep_going=True)
    apply(SCRIPT, events=False)
    run({"op": "poll", **common, "lines": 5, "gpus": 1, "checkpoints": "checkpoints",
         "lock_path": lock})  # fmt: skip
    run({"op": "logs", **common, "lines": 5, "raw": False})
    apply(SCRIPT + "# v2\n")
    run({"op": "rollback", **common, "dest": "train.py", "command": "exec python3 train.py",
         "restart": True, "grace": 0.5, "lock_path": lock})  # fmt: skip
    run({"op": "history", "workdir": workdir, "limit": 2})

    def release(data: bytes, setup_hash: str) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        frames = gzip.compress(f"{digest} {len(data)}\n".encode() + data)
        return {
            "manifest": [["main.py", len(data), 0o644, digest]], "manifest_sha256": "0" * 64,
            "blobs_b64": base64.b64encode(frames).decode(), "blobs_parts": None, "sent_files": 1,
            "keep_releases": 2, "setup": {"run": ["true"], "hash": setup_hash, "timeout": 30.0},
        }  # fmt: skip

    project = {"dest": None, "sha256": None, "content_b64": None, "command": "exec sleep 60"}
    for data, setup_hash in [(b"print(1)\n", "h1"), (b"print(2)\n", "h2")]:
        run({"op": "apply", **common, **project, "release": release(data, setup_hash),
             "restart": True, "grace": 0.5, "lock_path": lock})  # fmt: skip
    digest = hashlib.sha256(b"print(2)\n").hexdigest()
    run({"op": "releases", "workdir": workdir, "want": [digest], "contents": ["main.py"]})
    run({"op": "rollback", **common, **project, "release": {"rollback": True}, "restart": True,
         "grace": 0.5, "lock_path": lock})  # fmt: skip
    run({"op": "stop", **common, "grace": 0.5, "gpus": 0, "cuda_visible_devices": "0",
         "lock_path": lock, "operator": {"user": "ann", "host": "ws", "pid": 1}})  # fmt: skip
    run({"op": "follow", **common, "offset": 0, "heartbeat": 0.2, "interval": 0.05})
    port = free_port()
    run({"op": "network", "resolve": ["localhost"], "pythons": ["/nonexistent/python3"],
         "listen": {"port": port, "seconds": 0.5, "expect": 0},
         "probe": {"address": "127.0.0.1", "port": port, "seconds": 0.3}})  # fmt: skip

    contract.assert_kept()
    assert set(contract.answers) == set(p.OPS)
    # The reads reached the typed parts inside a request too.
    assert {"ReleaseSpec", "SetupRequest", "Operator"} <= {kind for kind, _ in contract.reads}


def test_the_check_catches_an_undeclared_read_and_a_wrong_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    checked = HandlerContract()
    history = agent_main.HANDLERS["history"]

    def nosy(request: dict[str, Any], warnings: list[str]) -> Any:
        request.get("verbose")
        return {**history(request, warnings), "total": "many"}

    monkeypatch.setitem(agent_main.HANDLERS, "history", checked.wrap("history", nosy))
    assert agent_main.run_local({"op": "history", "workdir": str(tmp_path)})["ok"]
    assert checked.undeclared() == ["HistoryRequest.verbose"]
    assert checked.problems == ["history: answer['total'] is str 'many', not an integer"]


def test_a_failed_answer_has_the_data_it_carries_checked() -> None:
    failed = {**envelope("apply"), "ok": False, "error": {"kind": "refused", "message": "no"}}
    steps = [{"name": "lock", "status": "failed", "detail": "held", "kind": "refused"}]
    with pytest.raises(AgentFailure) as caught:
        check_answer("ct", "apply", {**failed, "steps": steps})
    assert caught.value.response["steps"] == steps
    with pytest.raises(ProtocolError, match=r"answer\['steps'\] is str 'lock', not a list"):
        check_answer("ct", "apply", {**failed, "steps": "lock"})

"""Every agent op, called through AgentClient against the real agent in a sandbox container:
each answer carries exactly the keys its protocol type promises (the contract cannot drift)."""

from __future__ import annotations

import base64
import gzip
import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from launcher.agent import protocol as p
from launcher.config.models import load_inventory
from launcher.container.agentclient import AgentClient, AgentFailure
from launcher.container.answers import problem
from launcher.container.pct import Container
from launcher.core.errors import ExitCode, ProtocolError
from launcher.deploy.deploy import operator_info, transaction_request
from launcher.transport.pool import ConnectionPool
from tests.e2e.project import DEMO_TRAINER, Project
from tests.unit.agentcontract import declared_keys

pytestmark = pytest.mark.e2e

VMID = 203
SESSION = "proto"
WORKDIR = "/root/proto"


def assert_shape(answer: Any, kind: type) -> None:
    """`answer` has every required key of the TypedDict `kind`, no key it does not name, and
    every value of its declared type."""
    keys = declared_keys(kind)
    required = {name for name, (needed, _) in keys.items() if needed}
    assert required <= set(answer), f"{kind.__name__}: missing {required - set(answer)}"
    assert set(answer) <= set(keys), f"{kind.__name__}: unexpected {set(answer) - set(keys)}"
    assert problem(answer, kind) is None, f"{kind.__name__}: {problem(answer, kind)}"


@pytest.fixture
def client(project: Project) -> Iterator[tuple[AgentClient, Project]]:
    book = project.playbook(SESSION, workdir=WORKDIR, gpus=8)
    project.write({SESSION: (VMID, book)})
    inventory = load_inventory(project.inventory)
    target = inventory.target(SESSION)
    with ConnectionPool() as pool:
        conn = pool.get(target.host_name, target.host)
        yield AgentClient(Container(conn, VMID, label=target.label)), project
    project.ct(VMID, "tmux", "kill-session", "-t", f"={SESSION}")


def transaction(project: Project, **overrides: Any) -> p.TransactionRequest:
    target = load_inventory(project.inventory).target(SESSION)
    request = transaction_request(target, op="apply", restart=True, grace=2.0, mode="archive")
    script = DEMO_TRAINER.read_bytes()
    request.update(
        {
            "content_b64": base64.b64encode(script).decode(),
            "sha256": hashlib.sha256(script).hexdigest(),
            "check_resources": True,
            "need_bytes": 1,
        }
    )
    request.update(overrides)  # type: ignore[typeddict-item]
    return request


def test_every_op_round_trips_through_the_protocol_types(
    client: tuple[AgentClient, Project],
) -> None:
    agent, project = client
    preflight: p.PreflightRequest = {
        "op": "preflight", "workdir": WORKDIR, "session": SESSION, "dest": "train_demo.py",
        "checkpoints": "checkpoints", "gpus": 8, "need_bytes": 1, "create_workdir": False,
        "lock_path": p.LOCK_PATH,
    }  # fmt: skip
    answer = agent.preflight(preflight)
    assert_shape(answer, p.PreflightAnswer)
    assert_shape(answer["session"], p.SessionState)
    assert_shape(answer["gpus"], p.GpuReport)

    planned = agent.transaction(transaction(project, plan=True))
    assert_shape(planned, p.TransactionAnswer)
    assert {s["status"] for s in planned["steps"]} <= {"ok", "planned", "warning", "skipped"}
    for step in planned["steps"]:
        assert_shape(step, p.Step)

    applied = agent.transaction(transaction(project))
    assert_shape(applied, p.TransactionAnswer)
    assert applied["launched"] and applied["launched"]["session"] == SESSION

    poll: p.PollRequest = {"op": "poll", "workdir": WORKDIR, "session": SESSION, "lines": 20}
    polled = agent.poll(poll)
    assert_shape(polled, p.PollAnswer)
    assert_shape(polled["session"], p.SessionState)
    assert polled["session"]["run"] == applied["launched"]["run"]

    logs: p.LogsRequest = {
        "op": "logs", "workdir": WORKDIR, "session": SESSION, "lines": 5, "raw": False,
    }  # fmt: skip
    assert_shape(agent.logs(logs), p.LogsAnswer)

    history: p.HistoryRequest = {"op": "history", "workdir": WORKDIR, "limit": 2}
    records = agent.history(history)
    assert_shape(records, p.HistoryAnswer)
    assert records["records"][0]["sha256"] == applied["record"]["sha256"]  # type: ignore[index]

    # A second deploy, so that rollback has a .prev to go back to.
    changed = DEMO_TRAINER.read_bytes() + b"\n# v2\n"
    agent.transaction(
        transaction(
            project,
            content_b64=base64.b64encode(changed).decode(),
            sha256=hashlib.sha256(changed).hexdigest(),
        )
    )
    rolled = agent.transaction(transaction(project, op="rollback", content_b64=None))
    assert_shape(rolled, p.TransactionAnswer)
    assert rolled["record"] and rolled["record"]["rollback"] is True

    # A project release, then the releases op: the current release, its manifest, the blobs.
    data = b"print('release')\n"
    digest = hashlib.sha256(data).hexdigest()
    frames = gzip.compress(f"{digest} {len(data)}\n".encode() + data)
    release: p.ReleaseSpec = {
        "manifest": [["main.py", len(data), 0o644, digest]],
        "manifest_sha256": "0" * 64,
        "blobs_b64": base64.b64encode(frames).decode(),
        "sent_files": 1,
        "keep_releases": 2,
        "setup": None,
    }
    built = agent.transaction(
        transaction(
            project,
            release=release,
            dest=None,
            sha256=None,
            content_b64=None,
            command="python3 main.py",  # the release's own script (checked before the stop)
        )
    )
    assert_shape(built, p.TransactionAnswer)
    assert built["release"] and built["release"]["sent_files"] == 1
    query: p.ReleasesRequest = {
        "op": "releases", "workdir": WORKDIR, "want": [digest, "f" * 64], "contents": ["main.py"],
    }  # fmt: skip
    held = agent.releases(query)
    assert_shape(held, p.ReleasesAnswer)
    assert held["current"] == built["release"]["id"] and held["have"] == [digest]
    assert held["contents"]["main.py"] == base64.b64encode(data).decode()

    stop: p.StopRequest = {
        "op": "stop", "session": SESSION, "grace": 2.0, "gpus": 8, "lock_path": p.LOCK_PATH,
        "operator": operator_info(),
    }  # fmt: skip
    stopped = agent.stop(stop)
    assert_shape(stopped, p.StopAnswer)
    assert_shape(stopped["stopped"], p.StopReport)

    chunks: list[bytes] = []
    follow: p.FollowRequest = {
        "op": "follow", "workdir": WORKDIR, "session": SESSION, "offset": 0, "heartbeat": 1.0,
        "interval": 0.2,
    }  # fmt: skip
    followed = agent.follow(follow, chunks.append, idle_timeout=10)
    assert_shape(followed, p.FollowAnswer)
    assert followed["ended"] is not None and b"launcher run" in b"".join(chunks)

    # A job's network check: names, interfaces, torch; a listener and a probe; the hosts block
    # written and taken out again.
    network: p.NetworkRequest = {
        "op": "network", "resolve": ["localhost"], "pythons": ["python3"],
        "listen": {"port": 29593, "seconds": 0.5, "expect": 0},
        "probe": {"address": "127.0.0.1", "port": 29594, "seconds": 0.3},
        "hosts": {"marker": "LAUNCHER PROTOCOL TEST", "lines": ["10.9.9.9 protocol-test"]},
    }  # fmt: skip
    checked = agent.network(network)
    assert_shape(checked, p.NetworkAnswer)
    assert checked["hostname"] and checked["hosts"] == "/etc/hosts"
    assert checked["listened"] is not None and checked["listened"]["bound"]
    assert checked["probed"] is not None and not checked["probed"]["ok"]  # nothing listens there
    assert_shape(checked["resolved"]["localhost"], p.Resolved)
    block: p.HostsBlock = {"marker": "LAUNCHER PROTOCOL TEST", "lines": []}
    cleared = agent.network({"op": "network", "hosts": block})
    assert cleared["hosts"] == "/etc/hosts"


def test_an_error_answer_carries_its_kind_and_the_steps(
    client: tuple[AgentClient, Project],
) -> None:
    agent, project = client
    with pytest.raises(AgentFailure) as failure:
        agent.transaction(transaction(project, checkpoints=".launcher", plan=True))
    answer = failure.value.response
    assert_shape(answer, p.TransactionAnswer)
    assert answer["error"]["kind"] == "unsafe_path"
    assert answer["steps"][-1]["kind"] == "unsafe_path"


# What a container whose `python3` is not the agent's interpreter might answer (a wrapper, a
# stub, something hostile): each is a protocol mismatch, exit 3, before any workflow reads it.
NOT_THE_AGENT = {
    "no data": ('{"ok": true, "op": "poll", "error": null, "warnings": []}', "has no 'session'"),
    "another op": (
        '{"ok": true, "op": "stop", "error": null, "warnings": []}',
        "answer['op'] is 'stop', not 'poll'",
    ),
    "error not an object": (
        '{"ok": false, "op": "poll", "error": "boom", "warnings": []}',
        "answer['error'] is str 'boom'",
    ),
    "ok with an error": (
        '{"ok": true, "op": "poll", "error": {"kind": "refused", "message": "x"}, "warnings": []}',
        "disagrees",
    ),
    "not an object": ("[1, 2]", "answer is list"),
    "wrong type": (
        '{"ok": true, "op": "poll", "error": null, "warnings": [], "session": {"exists": "yes"},'
        ' "capture": "", "exit_code": null, "stopped": null, "now": 1, "record": null,'
        ' "log_age": null, "checkpoint_age": null, "lock": null, "gpus": null}',
        "answer['session']['exists'] is str 'yes', not a boolean",
    ),
}
# The pct stand-in's PATH inside the container starts with /sbin, the container's own directory
# (as /usr/sbin is ahead of /usr/bin on a Proxmox CT's PATH): a python3 there shadows the real.
FAKE_PYTHON = "/sbin/python3"


@pytest.mark.parametrize("case", sorted(NOT_THE_AGENT))
def test_an_answer_that_is_not_the_protocol_is_a_protocol_error(
    client: tuple[AgentClient, Project], case: str
) -> None:
    agent, project = client
    answer, expected = NOT_THE_AGENT[case]
    script = f"#!/bin/sh\ncat >/dev/null\nprintf '%s\\n' '{answer}'\n"
    install = f"cat > {FAKE_PYTHON} && chmod 755 {FAKE_PYTHON}"
    written = project.sandbox.ct_exec(VMID, ["sh", "-c", install], input=script.encode())
    try:
        assert written.returncode == 0, written
        poll: p.PollRequest = {"op": "poll", "workdir": WORKDIR, "session": SESSION}
        with pytest.raises(ProtocolError) as caught:
            agent.poll(poll)
    finally:
        project.ct(VMID, "rm", "-f", FAKE_PYTHON)
    assert caught.value.exit_code == ExitCode.UNREACHABLE
    assert "does not match this launcher's protocol" in caught.value.message
    assert expected in caught.value.message, caught.value.message


def test_status_against_a_python3_that_is_not_the_agent_exits_3(
    client: tuple[AgentClient, Project],
) -> None:
    _, project = client
    script = b"#!/bin/sh\ncat >/dev/null\necho '{\"ok\": true}'\n"
    install = f"cat > {FAKE_PYTHON} && chmod 755 {FAKE_PYTHON}"
    written = project.sandbox.ct_exec(VMID, ["sh", "-c", install], input=script)
    try:
        assert written.returncode == 0, written
        result = project.launcher("status", "-t", SESSION)
    finally:
        project.ct(VMID, "rm", "-f", FAKE_PYTHON)
    assert result.returncode == ExitCode.UNREACHABLE, result
    assert "does not match this launcher's protocol" in result.stdout + result.stderr, result
    assert "Traceback" not in result.stderr

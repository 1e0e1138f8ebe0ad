"""The next run of a command starts early (launcher/prefetch.py), against the sandbox.

The second run of the same command line connects and starts the agent from the hint the first
left, before its configuration loads: it must still make one SSH connection and one `pct` call,
answer exactly as without the hint, and never act on a hint that is stale, tampered with or for
another place. Each test has its own runtime directory (conftest), so hints do not cross tests.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.project import Project

pytestmark = pytest.mark.e2e

VMID, OTHER = 200, 201
NAME = "early"


def logins(project: Project) -> int:
    log = project.sandbox.state_dir / "sshd.log"
    return log.read_text(errors="replace").count("Accepted publickey")


def hints(runtime: Path) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, json.loads(p.read_text())) for p in sorted((runtime / "launcher").glob("hint-*"))]


def pct_vmids(project: Project, since: int) -> list[str]:
    """The container of each `pct exec` since call number `since`."""
    lines = (project.sandbox.state_dir / "pct-calls.log").read_text().splitlines()[since:]
    return [json.loads(line)["argv"][1] for line in lines]


def status(project: Project) -> tuple[int, dict[str, Any]]:
    result = project.launcher("status", "-t", NAME, "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def history_count(project: Project) -> int:
    result = project.launcher("history", "-t", NAME, "--json")
    assert result.returncode == 0, result.stderr
    return len(json.loads(result.stdout)["records"])


@pytest.fixture
def running(project: Project) -> Project:
    project.deploy_healthy(NAME, VMID)
    return project


def test_a_second_run_uses_its_early_connection_once(
    running: Project, _private_runtime_dir: Path
) -> None:
    project = running
    status(project)  # leaves status's hint (the first status calls may have left it already)
    [(_, hint)] = [(p, h) for p, h in hints(_private_runtime_dir) if "stdin" in h]
    assert hint["endpoint"]["port"] == project.info.port
    assert hint["command"].startswith(f"pct exec {VMID} -- python3 -I -S -c ")
    assert json.loads(bytes.fromhex(hint["stdin"]))["request"]["op"] == "poll"

    for _ in range(2):
        calls, seen = project.sandbox.pct_calls(), logins(project)
        code, doc = status(project)
        assert (code, doc["verdict"]) == (0, "healthy"), doc
        assert project.sandbox.pct_calls() - calls == 1, "the early poll was the poll"
        assert logins(project) - seen == 1

    # deploy: the early connection and agent, never its request (it is built from the config).
    for _ in range(2):
        records = history_count(project)
        calls, seen = project.sandbox.pct_calls(), logins(project)
        deployed = project.launcher("deploy", "-t", NAME, "--restart")
        assert deployed.returncode == 0, deployed.stderr
        assert project.sandbox.pct_calls() - calls == 1, "one transaction"
        assert logins(project) - seen == 1
        assert history_count(project) == records + 1
    deploy_hints = [h for _, h in hints(_private_runtime_dir) if "stdin" not in h]
    assert deploy_hints and all("request" not in json.dumps(h) for h in deploy_hints)


def test_a_changed_inventory_makes_the_hint_stale(
    running: Project, _private_runtime_dir: Path
) -> None:
    """The inventory now points the target at another container: nothing is started early in
    the old one, and the status is the new container's."""
    project = running
    status(project)
    project.write({NAME: (OTHER, project.playbook(NAME))})
    calls = project.sandbox.pct_calls()
    code, doc = status(project)
    assert code == 1 and doc["verdict"] == "unhealthy"  # no run in the other container
    assert pct_vmids(project, calls) == [str(OTHER)]


def test_a_hint_for_another_place_is_never_used(
    running: Project, _private_runtime_dir: Path
) -> None:
    """A hint whose files still match but whose endpoint or agent differ from what the config
    resolves to (tampered with, or a stale ssh_config) connects and starts that agent, which
    does nothing; the command then acts where its configuration says."""
    project = running
    status(project)
    [(path, hint)] = [(p, h) for p, h in hints(_private_runtime_dir) if "stdin" in h]
    hint["command"] = hint["command"].replace(f"pct exec {VMID} ", f"pct exec {OTHER} ")
    path.write_text(json.dumps(hint))
    calls = project.sandbox.pct_calls()
    code, doc = status(project)
    assert (code, doc["verdict"]) == (0, "healthy")
    # The hinted agent was started (and read end of file), the status polled its own.
    assert sorted(pct_vmids(project, calls)) == [str(VMID), str(OTHER)]

    # An endpoint other than the one resolved now (here: another connect_timeout) is never
    # adopted: the status opens its own connection.
    hint = dict(json.loads(path.read_text()))
    hint["endpoint"] = {**hint["endpoint"], "connect_timeout": 1.0}
    path.write_text(json.dumps(hint))
    calls, seen = project.sandbox.pct_calls(), logins(project)
    code, doc = status(project)
    assert (code, doc["verdict"]) == (0, "healthy")
    assert logins(project) - seen == 2
    assert str(VMID) in pct_vmids(project, calls)


def test_only_a_poll_is_sent_before_it_is_asked_for(
    running: Project, _private_runtime_dir: Path
) -> None:
    """A hint carrying another request (a stop, say) is never sent: the run goes on."""
    project = running
    status(project)
    [(path, hint)] = [(p, h) for p, h in hints(_private_runtime_dir) if "stdin" in h]
    line = json.loads(bytes.fromhex(hint["stdin"]))
    line["request"] = {"op": "stop", "workdir": f"/root/{NAME}", "session": NAME, "grace": 1}
    hint["stdin"] = json.dumps(line).encode().hex()
    path.write_text(json.dumps(hint))
    pane = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", f"={NAME}:", "#{pane_pid}")
    code, doc = status(project)
    assert (code, doc["verdict"]) == (0, "healthy"), doc
    after = project.ct_text(VMID, "tmux", "display-message", "-p", "-t", f"={NAME}:", "#{pane_pid}")
    assert after == pane and project.processes(VMID, "train_demo.py")


def test_a_changed_playbook_changes_the_request(
    running: Project, _private_runtime_dir: Path
) -> None:
    """The early poll was built from the old playbook: with the new one the request differs,
    so its answer is dropped and status polls with what the playbook says now."""
    project = running
    status(project)
    book = project.root / "playbooks" / f"{NAME}.yaml"
    doc = yaml.safe_load(book.read_text())
    doc["verify"]["lines"] = 77
    book.write_text(yaml.safe_dump(doc))
    calls = project.sandbox.pct_calls()
    code, report = status(project)
    assert (code, report["verdict"]) == (0, "healthy")
    assert project.sandbox.pct_calls() - calls == 1  # stale hint: nothing started early


def test_a_child_still_polling_holds_none_of_the_commands_output(
    running: Project, _private_runtime_dir: Path
) -> None:
    """status's early poll runs in a child process. Here the hint's host has gone silent (it
    accepts and never says a word): the child hangs in its handshake, the command (whose
    configuration resolves elsewhere) polls by itself, and whoever reads its output sees the
    end of it as the command ends, while the child is still waiting: it holds none of the
    command's descriptors."""
    project = running
    status(project)
    [(path, hint)] = [(p, h) for p, h in hints(_private_runtime_dir) if "stdin" in h]
    with socket.create_server(("127.0.0.1", 0)) as silent:
        hint["endpoint"] = {
            **hint["endpoint"],
            "port": silent.getsockname()[1],
            "connect_timeout": 60.0,
        }
        path.write_text(json.dumps(hint))
        calls, seen = project.sandbox.pct_calls(), logins(project)
        code, doc = status(project)  # captured: returns at the end of its output
        assert (code, doc["verdict"]) == (0, "healthy"), doc
        assert project.sandbox.pct_calls() - calls == 1 and logins(project) - seen == 1
        silent.settimeout(10)
        child, _ = silent.accept()
        with child:
            child.settimeout(10)
            assert child.recv(8) == b"SSH-2.0-"  # the early child, still in its handshake
            assert child.recv(4096).endswith(b"\r\n")  # the rest of its banner line
            child.setblocking(False)
            with pytest.raises(BlockingIOError):  # and no end of file: it is still there
                child.recv(4096)

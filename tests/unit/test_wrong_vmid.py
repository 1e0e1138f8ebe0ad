"""A VMID the host does not have: the error lists the containers it has (`pct list`)."""

from __future__ import annotations

import shlex

import pytest

from launcher.container.pct import Container, host_containers, missing_container_hint
from launcher.core.errors import ContainerError, RemoteError
from launcher.transport.endpoint import CommandResult

# pve-container's `pct list`: VMID, Status, Lock (blank unless locked), Name.
PCT_LIST = (
    "VMID       Status     Lock         Name                \n"
    "200        running                 train-a             \n"
    "201        stopped    backup       train-b             \n"
)
NO_CONFIG = b"Configuration file 'nodes/pve/lxc/999.conf' does not exist\n"


class ScriptedHost:
    """Answers the commands it was given, in order; anything else fails the test."""

    def __init__(self, *answers: tuple[list[str], CommandResult | Exception]) -> None:
        self.answers = list(answers)

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        assert self.answers, f"unexpected command {command!r}"
        argv, answer = self.answers.pop(0)
        assert shlex.split(command)[: len(argv)] == argv, command
        assert timeout is not None  # every host call is bounded
        if isinstance(answer, Exception):
            raise answer
        return answer


def result(code: int, out: str = "", err: bytes = b"") -> CommandResult:
    return CommandResult("cmd", code, out.encode(), err, 0.0)


def test_the_error_names_the_containers_the_host_has() -> None:
    host = ScriptedHost(
        (["pct", "exec", "999"], result(255, err=NO_CONFIG)),
        (["pct", "list"], result(0, PCT_LIST)),
    )
    with pytest.raises(ContainerError) as failed:
        Container(host, 999, label="prod").exec(["true"], timeout=5)
    assert failed.value.message == "prod: container 999 does not exist on the host"
    assert failed.value.hint == (
        "containers on this host: 200 (running, train-a), 201 (stopped, train-b); "
        "set the target's vmid to one of them"
    )
    assert not host.answers


@pytest.mark.parametrize(
    ("listing", "hint"),
    [
        (result(0, ""), "the host has no containers"),
        (result(2, err=b"permission denied"), "against `pct list` on the host"),
        (RemoteError("timed out"), "against `pct list` on the host"),
    ],
)
def test_without_a_list_the_hint_says_where_to_look(
    listing: CommandResult | Exception, hint: str
) -> None:
    host = ScriptedHost((["pct", "exec"], result(255, err=NO_CONFIG)), (["pct", "list"], listing))
    with pytest.raises(ContainerError) as failed:
        Container(host, 999, label="prod").exec(["true"], timeout=5)
    assert failed.value.hint is not None and hint in failed.value.hint


def test_a_long_list_is_cut() -> None:
    rows = "".join(f"{vmid}        running                 ct{vmid}\n" for vmid in range(100, 150))
    listing = (["pct", "list"], result(0, "VMID Status Lock Name\n" + rows))
    found = host_containers(ScriptedHost(listing))
    assert found is not None and len(found) == 50 and found[0] == ("100", "running", "ct100")
    hint = missing_container_hint(ScriptedHost(listing), 999)
    assert "119 (running, ct119) and 30 more;" in hint and "ct120" not in hint

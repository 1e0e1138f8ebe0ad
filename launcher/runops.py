"""Run-level operations over the agent: one `pct exec` each (poll, stop)."""

from __future__ import annotations

from typing import Any

from launcher.agentcall import call_agent
from launcher.checks import PaneState
from launcher.config import Target
from launcher.container import Container
from launcher.remote import Connection


def container_for(target: Target, conn: Connection) -> Container:
    return Container(conn, target.vmid, label=target.label)


def poll_request(target: Target, lines: int) -> dict[str, Any]:
    spec = target.playbook.spec
    return {"op": "poll", "workdir": spec.workdir, "session": spec.session, "lines": lines}


def poll_once(container: Container, target: Target, lines: int) -> tuple[PaneState, dict[str, Any]]:
    """Capture (joined, with history), pane state and exit code in one round trip."""
    answer = call_agent(container, poll_request(target, lines), timeout=60)
    session = answer.get("session") or {}
    state = PaneState(
        session_exists=bool(session.get("exists")),
        pane_dead=bool(session.get("pane_dead")),
        dead_status=session.get("dead_status"),
        exit_code=answer.get("exit_code"),
        capture=str(answer.get("capture") or ""),
    )
    return state, answer

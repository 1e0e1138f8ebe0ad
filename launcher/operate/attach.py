"""`launcher attach`: the session checked with one poll, and the ssh command that attaches a
terminal to it (run by the CLI, not here)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.config.models import Target
from launcher.container.agentclient import container_for
from launcher.container.pct import HostConnection, exec_command
from launcher.core.errors import ExitCode
from launcher.probe.poll import poll_once
from launcher.transport.endpoint import Endpoint


@dataclass
class AttachResult:
    exit_code: ExitCode
    summary: str
    session: str
    argv: list[str] = field(default_factory=list)  # the ssh client command to exec


def attach_argv(endpoint: Endpoint, vmid: int, session: str) -> list[str]:
    """The system ssh client with a terminal, the host's settings and strict host keys, running
    `tmux attach` inside the container (the remote command is quoted once, by container.py)."""
    argv = ["ssh", "-t", "-p", str(endpoint.port), "-l", endpoint.user]
    for identity in endpoint.identity_files:
        argv += ["-i", identity]
    policy = "accept-new" if endpoint.accept_new else "yes"
    argv += ["-o", f'UserKnownHostsFile="{endpoint.known_hosts}"']
    argv += ["-o", f"StrictHostKeyChecking={policy}"]
    if endpoint.jump:
        argv += ["-o", f"ProxyJump={endpoint.jump}"]
    if endpoint.proxy_command:
        argv += ["-o", f"ProxyCommand={endpoint.proxy_command}"]
    argv += ["-o", f"ConnectTimeout={max(1, math.ceil(endpoint.connect_timeout))}"]
    remote = exec_command(vmid, ["tmux", "attach", "-t", f"={session}:"])
    return [*argv, "--", endpoint.hostname, remote]


def attach(target: Target, conn: HostConnection) -> AttachResult:
    """Check (one poll) that the session exists, and say how to attach to it interactively."""
    spec = target.playbook.spec
    state, _ = poll_once(container_for(target, conn), target, 1)
    if not state.session_exists:
        return AttachResult(
            ExitCode.UNHEALTHY,
            f"no session '{spec.session}' on {target.label}: nothing to attach to "
            f"(launcher deploy -t {target.name} starts one)",
            spec.session,
        )
    argv = attach_argv(conn.endpoint, target.vmid, spec.session)
    note = " (its pane is dead)" if state.pane_dead else ""
    summary = f"attaching to session '{spec.session}' on {target.label}{note}; detach: C-b d"
    return AttachResult(ExitCode.OK, summary, spec.session, argv)

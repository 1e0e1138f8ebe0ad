"""Client side of the in-container agent: one `pct exec` per call, request and answer as JSON.

The agent's source travels on stdin next to the request, so nothing is installed in the
container and the command line stays short: `pct exec VMID -- python3 -c BOOT`.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from launcher.container import Container
from launcher.errors import (
    ContainerError,
    LauncherError,
    RefusedError,
    RemoteError,
    TransferError,
    UnsafePathError,
    UsageError,
)

BOOT = (
    "import json,sys;m=json.loads(sys.stdin.readline());g={'__name__':'launcher_agent'};"
    "exec(compile(m['agent'],'launcher_agent.py','exec'),g);sys.exit(g['main'](m['request']))"
)

# How each agent error kind maps onto the one exit-code table (via the error classes).
ERROR_KINDS: dict[str, type[LauncherError]] = {
    "refused": RefusedError,
    "locked": RefusedError,
    "unsafe_path": UnsafePathError,
    "corrupt": TransferError,
    "compile": UsageError,
    "missing": ContainerError,
    "invalid": UsageError,
    "failed": RemoteError,
}


class AgentFailure(LauncherError):
    """Carries the agent's whole answer (e.g. the deploy steps done so far) with the error."""

    def __init__(self, error: LauncherError, response: dict[str, Any]) -> None:
        super().__init__(error.message, hint=error.hint)
        self.exit_code = error.exit_code
        self.response = response


@cache
def agent_source() -> str:
    return resources.files("launcher").joinpath("agent.py").read_text(encoding="utf-8")


def call_agent(
    container: Container, request: dict[str, Any], *, timeout: float | None = None
) -> dict[str, Any]:
    """Run one agent op in the container and return its answer; failures become errors."""
    payload = json.dumps({"agent": agent_source(), "request": request}) + "\n"
    result = container.exec(["python3", "-c", BOOT], stdin=payload.encode(), timeout=timeout)
    text = result.out.strip()
    if result.exit_code != 0 or not text:
        if result.exit_code in (126, 127) or (
            "python3" in result.err and "not found" in result.err
        ):
            raise ContainerError(
                f"{container.label}: python3 is not available inside the container",
                hint="install python3 in the container (apt-get install python3)",
            )
        raise RemoteError(
            f"{container.label}: agent op {request.get('op')!r} failed "
            f"(exit {result.exit_code}): {result.tail(5)}"
        )
    try:
        response: dict[str, Any] = json.loads(text.splitlines()[-1])
    except json.JSONDecodeError:
        raise RemoteError(f"{container.label}: unreadable agent answer: {result.tail(3)}") from None
    error = response.get("error")
    if not response.get("ok") and error:
        kind = ERROR_KINDS.get(str(error.get("kind")), RemoteError)
        raise AgentFailure(kind(f"{container.label}: {error.get('message')}"), response)
    return response

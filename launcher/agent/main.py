# mypy: allow-untyped-calls
"""The agent's entry point: the op table, the envelope every answer is, `main(request)`."""

from __future__ import annotations

import json
import signal
import sys

from launcher.agent.base import RECEIVED, AgentError, host_stamp, ignore_hangup
from launcher.agent.deploy import op_apply
from launcher.agent.logs import op_follow, op_history, op_logs
from launcher.agent.network import op_network
from launcher.agent.poll import op_poll
from launcher.agent.preflight import op_preflight
from launcher.agent.protocol import OPS, STREAMING_OPS
from launcher.agent.release import dispatching, op_releases
from launcher.agent.rollback import op_rollback
from launcher.agent.stop import op_stop
from launcher.agent.tmux import NOTES

# A request with a release runs the release transaction; apply and rollback without one, a
# script's.
HANDLERS = {
    "preflight": op_preflight,
    "apply": dispatching(op_apply),
    "stop": op_stop,
    "poll": op_poll,
    "logs": op_logs,
    "follow": op_follow,
    "history": op_history,
    "rollback": dispatching(op_rollback),
    "releases": op_releases,
    "network": op_network,
}
assert set(HANDLERS) == set(OPS), "protocol.OPS lists every op handled"


def envelope(op, error, warnings, data):
    result = {"ok": error is None, "op": op, "error": error, "warnings": warnings}
    result.update(data or {})
    return result


def run_local(request):
    """Run one op and return its envelope (no printing): what main prints, for tests."""
    result = run_op(request)
    result["warnings"].extend(NOTES)  # what the agent mended on its way (tmux's socket)
    del NOTES[:]
    return result


def run_op(request):
    warnings: list[str] = []
    op = request.get("op") if isinstance(request, dict) else None
    if op not in HANDLERS:
        error = {"kind": "invalid", "message": "unknown op %r" % (op,)}
        return envelope(str(op), error, warnings, None)
    try:
        data = HANDLERS[op](request, warnings)
        return envelope(op, None, warnings, data)
    except AgentError as exc:
        data = exc.extra.pop("data", None)
        return envelope(op, exc.as_dict(), warnings, data)
    except Exception as exc:
        error = {"kind": "failed", "message": "%s: %s" % (type(exc).__name__, exc)}
        return envelope(op, error, warnings, None)


def main(request):
    RECEIVED[0] = host_stamp(sys.argv)
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        # Ignored by whoever started the agent: it stays ignored here, but as a caught signal,
        # so that what the agent starts gets the default (see ignore_hangup).
        signal.signal(signal.SIGHUP, ignore_hangup)
    result = run_local(request)
    streaming = isinstance(request, dict) and request.get("op") in STREAMING_OPS
    out = sys.stderr if streaming else sys.stdout
    try:
        out.write(json.dumps(result) + "\n")
        out.flush()
    except (BrokenPipeError, OSError):
        return 0  # the work is done; nobody is listening for the answer
    return 0

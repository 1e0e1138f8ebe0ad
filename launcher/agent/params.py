# mypy: allow-untyped-calls
"""A request's values, checked: each bad or missing one is an `invalid` (or `unsafe_path`)
error, never a traceback."""

from __future__ import annotations

import os
import re
import time

from launcher.agent.base import COMMAND_VAR, MARKER_VAR, AgentError, request_received, utc_iso
from launcher.agent.protocol import RUN_ENV, system_path_problem

# Patterns are compiled on first use (re keeps them): each call starts a new interpreter.
SESSION_NAME = r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
# Stop grace is bounded: a trainer that ignores C-c must not hold the deploy lock forever.
GRACE_LIMIT = 3600.0
# A deadline further out than any client waits is a mistake, not a wish.
DEADLINE_LIMIT = 8 * 86400.0


# --------------------------------------------------------------------------- request parsing


def param(request, key, kind, default=None, required=False):
    """Fetch request[key] checked against kind; bad or missing values are `invalid` errors."""
    if key not in request or request[key] is None:
        if required:
            raise AgentError("invalid", "missing parameter %r" % key)
        return default
    value = request[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if kind is int and isinstance(value, bool):
        raise AgentError("invalid", "parameter %r must be an integer" % key)
    if not isinstance(value, kind):
        raise AgentError("invalid", "parameter %r must be %s" % (key, kind.__name__))
    return value


def session_param(request):
    session = param(request, "session", str, required=True)
    # tmux rewrites '.' and ':' in names and targets would misparse; the name is also a file name.
    if not re.match(SESSION_NAME, session):
        raise AgentError("invalid", "session name %r must match %s" % (session, SESSION_NAME))
    return session


def workdir_param(request):
    """The workdir, refused when it (or what its symlinks resolve to) is / or a system directory.

    Checked by the real path inside the container at the moment of use: a workdir that is a
    symlink to / would otherwise make every workdir-relative path a path below /."""
    workdir = param(request, "workdir", str, required=True)
    if not os.path.isabs(workdir):
        raise AgentError("unsafe_path", "workdir must be an absolute path: %r" % workdir)
    # POSIX keeps a leading '//' in normpath; it means / here.
    workdir = "/" + os.path.normpath(workdir).lstrip("/")
    real = os.path.realpath(workdir)
    problem = system_path_problem(workdir)
    if problem is None and system_path_problem(real):
        problem = "it resolves to %s (%s)" % (real, system_path_problem(real))
    if problem:
        raise AgentError("unsafe_path", "workdir %s is refused: %s" % (workdir, problem))
    return workdir


def env_param(request):
    env = param(request, "env", dict, default={})
    for key, value in env.items():
        if not re.match(ENV_NAME, key) or key in (MARKER_VAR, COMMAND_VAR) + RUN_ENV:
            raise AgentError("invalid", "bad environment variable name %r" % key)
        if not isinstance(value, str) or "\0" in value:
            raise AgentError(
                "invalid", "environment value of %s must be a string without NUL" % key
            )
    return env


def grace_param(request):
    grace = param(request, "grace", float, default=30.0)
    if not (0.0 <= grace <= GRACE_LIMIT):  # also false for nan
        raise AgentError("invalid", "grace must be 0 to %g seconds (got %r)" % (GRACE_LIMIT, grace))
    return grace


def deadline_param(request):
    """When (time.time()) this request may no longer start to change anything: `deadline`
    seconds after the host received it (base.request_received). None: no deadline was sent (a
    client that waits for as long as it takes)."""
    budget = param(request, "deadline", float)
    if budget is None:
        return None
    if not (0.0 <= budget <= DEADLINE_LIMIT):  # also false for nan
        raise AgentError(
            "invalid", "deadline must be 0 to %g seconds (got %r)" % (DEADLINE_LIMIT, budget)
        )
    return request_received() + budget


def check_deadline(deadline, what):
    """Refuse (`expired`) to start `what` once its client has given up: a request held up on
    the way (a stalled `pct`, a CT frozen by a backup) must not act minutes later, for a client
    that has reported a failure and moved on."""
    if deadline is None:
        return
    now = time.time()
    if now <= deadline:
        return
    received = request_received()
    raise AgentError(
        "expired",
        "refused: the client gave up at %s (%.0f s after the request reached the host at %s); "
        "it is %s: %s was not started, nothing was changed"
        % (utc_iso(deadline), deadline - received, utc_iso(received), utc_iso(now), what),
    )

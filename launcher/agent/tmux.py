# mypy: allow-untyped-calls
"""tmux: its version, its commands, a session's state from one `list-panes`."""

from __future__ import annotations

import os
import re

from launcher.agent.base import AgentError, Started, as_int, run, which

PANE_PREFIX = "LAUNCHER-PANE"
PANE_FORMAT = "\t".join(
    [
        PANE_PREFIX,
        "#{pane_dead}",
        "#{pane_dead_status}",
        "#{pane_pid}",
        "#{pane_width}",
        "#{@launcher_run}",
        "#{session_created}",
    ]
)


# --------------------------------------------------------------------------- tmux


TMUX_VERSIONS: dict[str, str | None] = {}  # tmux binary -> its `-V`, asked once per call


def start_tmux_version():
    """`tmux -V` started now, for tmux_version to read when its check comes (None: no tmux)."""
    binary = which("tmux")
    return Started([binary, "-V"], timeout=10) if binary else None


def tmux_version(started=None):
    """'tmux 3.3a' or None when tmux is not installed (from its `started` run, if given)."""
    binary = which("tmux")
    if not binary:
        return None
    if binary not in TMUX_VERSIONS:
        _, out, err = started.result() if started else run([binary, "-V"], timeout=10)
        TMUX_VERSIONS[binary] = out.strip() or err.strip() or None
    return TMUX_VERSIONS[binary]


def tmux_version_tuple(text):
    match = re.search(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else (99, 0)


def tmux(args, timeout=15.0, env=None):
    """tmux with `args`; env: the client's environment (None: the agent's). A server this
    starts takes the client's environment as its global one. Every call talks to the same
    server: the agent's own TMUX_TMPDIR (or none: /tmp/tmux-UID/default), never one from
    `env` or an enclosing $TMUX."""
    binary = which("tmux")
    if not binary:
        raise AgentError("missing", "tmux is not installed in the container")
    env = dict(os.environ if env is None else env)
    env.pop("TMUX", None)
    env.pop("TMUX_TMPDIR", None)
    if os.environ.get("TMUX_TMPDIR"):
        env["TMUX_TMPDIR"] = os.environ["TMUX_TMPDIR"]
    return run([binary, *args], timeout=timeout, env=env)


def tmux_arg(text):
    # tmux treats any argument ending in ';' as a command separator; '\;' keeps a literal ';'.
    return text[:-1] + "\\;" if text.endswith(";") else text


def format_escape(text):
    # Arguments tmux format-expands (-c, pipe-pane's command) need '#' doubled.
    return text.replace("#", "##")


def no_session(state=None):
    base = {
        "exists": False,
        "pane_dead": None,
        "dead_status": None,
        "pane_pid": None,
        "width": None,
        "run": None,
        "created": None,
    }
    if state:
        base.update(state)
    return base


def parse_pane_line(line):
    fields = line.split("\t")
    fields += [""] * (7 - len(fields))
    return no_session(
        {
            "exists": True,
            "pane_dead": fields[1] == "1",
            "dead_status": as_int(fields[2]),
            "pane_pid": as_int(fields[3]),
            "width": as_int(fields[4]),
            "run": fields[5] or None,
            "created": as_int(fields[6]),
        }
    )


def session_state(session):
    """SESSION dict from one `list-panes`; an absent session or server means exists: false."""
    if not which("tmux"):
        return no_session()
    _, out, _ = tmux(["list-panes", "-t", "=%s:" % session, "-F", PANE_FORMAT])
    for line in out.splitlines():
        if line.startswith(PANE_PREFIX + "\t"):
            return parse_pane_line(line)
    return no_session()


def pane_active(state):
    return bool(state["exists"] and not state["pane_dead"])

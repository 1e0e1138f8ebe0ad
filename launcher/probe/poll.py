"""One poll of a run: capture, pane state, exit code, run marker and deploy lock in one round
trip of the agent's `poll` op, turned into the PaneState the checks judge."""

from __future__ import annotations

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient
from launcher.container.pct import Container
from launcher.verify.gpus import sample_from_answer
from launcher.verify.pane import PaneState


def poll_request(target: Target, lines: int) -> p.PollRequest:
    spec = target.playbook.spec
    return {
        "op": "poll",
        "workdir": spec.workdir,
        "session": spec.session,
        "lines": lines,
        "lock_path": p.LOCK_PATH,
        "checkpoints": target.playbook.checkpoints_path,
        "gpus": spec.gpus,
    }


def poll_once(
    container: Container, target: Target, lines: int, *, timeout: float | None = None
) -> tuple[PaneState, p.PollAnswer]:
    """Capture (joined, with history), pane state and exit code in one round trip.

    `timeout` bounds the round trip (default: the host's `command_timeout`); the probe passes
    less when less of it is left.
    """
    limit = target.host.command_timeout if timeout is None else timeout
    answer = AgentClient(container).poll(poll_request(target, lines), timeout=limit)
    return pane_state(answer), answer


def pane_state(answer: p.PollAnswer) -> PaneState:
    """The PaneState in a poll answer: pane, capture, exit code, run marker, deploy lock."""
    session = answer["session"]
    # .get for what an older agent (still cached in a container) may not send yet.
    return PaneState(
        session_exists=bool(session["exists"]),
        pane_dead=bool(session.get("pane_dead")),
        dead_status=_int(session.get("dead_status")),
        exit_code=_int(answer.get("exit_code")),
        capture=answer.get("capture") or "",
        pane_pid=_int(session.get("pane_pid")),
        run=session.get("run") or None,
        deploy_lock=lock_holder(answer.get("lock")),
        pane_width=_int(session.get("width")),
        quiet_for=quiet_for(answer),
        age=session_age(answer),
        stopped=bool(answer.get("stopped")),
        gpus=sample_from_answer(answer.get("gpus")),
    )


def session_age(answer: p.PollAnswer) -> float | None:
    """Seconds since tmux created the session, both times from the container's clock."""
    created = _number(answer["session"].get("created"))
    now = _number(answer.get("now"))
    return None if created is None or now is None else max(0.0, now - created)


def quiet_for(answer: p.PollAnswer) -> float | None:
    """How long the run has been silent: nothing printed (its log's age) and, when it has a
    checkpoints directory, nothing written there either. None without a log to tell."""
    log_age = _number(answer.get("log_age"))
    if log_age is None:
        return None
    checkpoint_age = _number(answer.get("checkpoint_age"))
    return log_age if checkpoint_age is None else min(log_age, checkpoint_age)


def _number(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else None  # type: ignore[arg-type]


def lock_holder(lock: p.LockState | None) -> str | None:
    """Who holds the deploy lock, in words; None when nobody does (or it is stale)."""
    if not lock or lock.get("stale"):
        return None
    who = lock.get("operator") or "?"
    where = lock.get("from_host")
    since = lock.get("since")
    return f"{who}" + (f"@{where}" if where else "") + (f" since {since}" if since else "")


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

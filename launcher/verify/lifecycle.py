"""Where a run is in its life: one state for every judgement (status, verify, smoke, watch).

    deploying  a deploy holds the container's lock (the run is being replaced or launched)
    starting   within its warmup, or no status line yet while the window still allows one
    healthy    progressing now (the checks pass)
    unhealthy  running, but failing the checks
    finished   the run exited 0: terminal success, as SkyPilot's SUCCEEDED and a Kubernetes
               Job's Completed (the exit file the runner writes says so)
    failed     the run exited non-zero
    stopped    stopped by a person or by launcher (`launcher stop`, a watcher that gave up)
    absent     no session and nothing that says why

Pure: pane state in, state out. What each command's exit code is for a state is decided here,
once, so that status, verify and watch cannot disagree (see `status_exit` and `probe_exit`).
"""

from __future__ import annotations

from launcher.core.enums import StrEnum
from launcher.core.errors import ExitCode
from launcher.verify.pane import PaneState


class State(StrEnum):
    DEPLOYING = "deploying"
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    ABSENT = "absent"


def exit_status(state: PaneState) -> int | None:
    """How the run's process ended: tmux's dead status, else the runner's exit file."""
    if state.dead_status is not None:
        return state.dead_status
    return state.exit_code


def replacing(state: PaneState) -> str | None:
    """Why this poll is not the run's to judge: its session is gone or going while a deploy
    holds the container's lock, so its successor is about to appear (None: it is judged).
    The one place the rule is written: verify's probe waits for the successor, a watch reports
    nothing, status says `deploying`."""
    gone = not state.session_exists or state.pane_dead
    if gone and state.deploy_lock:
        return f"a deploy is replacing the run (lock held by {state.deploy_lock})"
    return None


def ended(state: PaneState) -> State | None:
    """The state of a run that is over (finished, failed, stopped, absent); None while it runs.

    A deploy that holds the lock is `deploying` whatever the pane shows (`replacing`).
    """
    if replacing(state) is not None:
        return State.DEPLOYING
    if state.session_exists and not state.pane_dead:
        return None
    if state.stopped:
        return State.STOPPED
    code = exit_status(state)
    if state.pane_dead or code is not None:
        # The session may be gone too (tmux's remain-on-exit off): the exit file still says.
        if code == 0:
            return State.FINISHED
        return State.FAILED
    return State.ABSENT


def status_exit(state: State) -> ExitCode:
    """`launcher status`: 0 unless something is wrong or the run is not there to judge.

    Starting, deploying and finished are not failures (a dashboard that polls status stays
    green through a deploy's warmup and after a run completes); stopped and absent are 1, as a
    missing session always was: nothing is running.
    """
    if state in (State.HEALTHY, State.STARTING, State.DEPLOYING, State.FINISHED):
        return ExitCode.OK
    return ExitCode.UNHEALTHY


def verdict_word(code: ExitCode) -> str:
    """The `verdict` field: the exit code in words (healthy: 0, nothing wrong)."""
    if code is ExitCode.OK:
        return "healthy"
    if code is ExitCode.UNREACHABLE:
        return "unreachable"
    return "unhealthy"

"""Each `launcher job` command's request, declared as the single-target ones are
(`launcher.core.requests`): a job's name, then its parameters; the docstring is the command's
help."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from launcher.core.declare import flag, option, seconds
from launcher.core.params import (
    GRACE,
    INTERVAL,
    LINES,
    MAX_RESTARTS,
    SUCCESSES,
    WAIT,
    WATCH_FOR,
)
from launcher.core.requests import (
    CheckpointMode,
    WatchOutlets,
    checkpoints,
    json_flag,
    tail_lines,
)

RESULT_JSON = "Print the result as JSON."
STOP_FIRST = "Stop every node's running session first."
AFTER_CTRL_C = "Wait this long after C-c."


def job_name() -> str:
    return option("The job's name (the inventory's `jobs:`).", argument=True)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class JobDeployRequest:
    """Deploy job NAME on all its nodes, or on none.

    Every node's network (rank 0's master port reached from every node, the rendezvous torchrun
    gets) and checks (script, GPUs, disk, lock, active session) pass before any old run is
    stopped; then every old run stops (--restart); then every node launches, all with one run
    id. A launch that fails on some nodes is undone on the others (unless --keep-partial); a
    node that fails after the first stop is reported with the state each node was left in.

    \b
    Examples:
      launcher job deploy --restart --dry-run train   # every node's plan
      launcher job deploy --restart train
    Exit codes: 0 deployed (or planned), 2 bad input, 3 unreachable or a step failed,
    4 refused on a node (lock held, run active, GPUs busy): the worst node's.
    """

    name: str = job_name()
    restart: bool = flag(STOP_FIRST)
    dry_run: bool = flag("Every node's plan and checks; change nothing.")
    grace: float | None = seconds(AFTER_CTRL_C, GRACE)
    checkpoint_mode: CheckpointMode = checkpoints(
        "Delete old checkpoints.", "Leave checkpoints in place."
    )
    kill_gpu_holders: bool = flag(
        "Kill processes outside the old runs that hold the GPUs (default: refuse, exit 4)."
    )
    keep_partial: bool = flag(
        "A launch that fails on some nodes leaves the others running (default: they are "
        "stopped again)."
    )
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobVerifyRequest:
    """One verdict for job NAME: the status rank's startup probe, every node alive.

    The status rank (jobs.NAME.status_rank, default 0) is probed as `launcher verify` probes
    a target; every other node must keep its session, its run's process and the same run
    throughout. A node that dies ends the probe: the job is unhealthy and the report names it.

    \b
    Example:
      launcher job verify --wait 3m train
    Exit codes: 0 healthy, 1 unhealthy, 2 bad input, 3 a node unreachable.
    """

    name: str = job_name()
    wait: float | None = seconds("How long the probe may take.", WAIT)
    interval: float | None = seconds("Between polls.", INTERVAL)
    successes: int | None = option("Healthy polls needed.", type=SUCCESSES, metavar="N")
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobStatusRequest:
    """One line per job (default: every job) and one per node, from one poll of each.

    \b
    Example:
      launcher job status train
    Exit codes: 0 every job healthy, 1 a job unhealthy, 2 bad input, 3 a node unreachable.
    """

    names: tuple[str, ...] = option(
        "The jobs (default: every job).", (), argument=True, repeat=True
    )
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobStopRequest:
    """Stop job NAME on every node at once; each node's outcome is reported.

    \b
    Example:
      launcher job stop --grace 2m train
    Exit codes: 0 stopped everywhere (or nothing to stop), 2 bad input, 3 a node unreachable
    or not stopped completely, 4 refused (lock held).
    """

    name: str = job_name()
    grace: float | None = seconds(AFTER_CTRL_C, GRACE)
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobHistoryRequest:
    """Job NAME's deploys, newest first: one line per run id, each node's outcome.

    Read from every node's own records (<workdir>/.launcher/deploys.jsonl); a node without a
    record of a run shows `no record`.

    \b
    Example:
      launcher job history --limit 5 train
    Exit codes: 0 shown, 2 bad input, 3 a node unreachable (the others are still shown).
    """

    name: str = job_name()
    limit: int = option("Only the newest N runs.", 0, type=LINES, metavar="N")
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobWatchRequest(WatchOutlets):
    """Watch job NAME as `launcher watch` watches a target: each transition an event.

    Its one verdict (`job status`) polled; transitions go to stdout, to the state file's events
    log and to every --webhook and --exec (schema launcher.watch.event/1; the event's target is
    the job); --metrics-port serves each node's status and GPUs. A failure is two unhealthy
    polls in a row, or one that finds a node's run gone, restarted or replaced.
    --restart-on-failure redeploys the whole job (all or nothing, a new run id, checkpoints
    kept) after a backoff and runs its startup probe, at most --max-restarts times in
    --restart-window; then the job is stopped. A finished job is never restarted.

    \b
    Example:
      launcher job watch --restart-on-failure --for 12h --webhook https://hooks.slack.com/... train
    Exit codes (at --for's end, as `launcher watch`): 0 healthy or finished, 1 unhealthy or
    stopped after the last restart, 2 bad input, 3 a node unreachable or a restart failed;
    SIGTERM ends it with 0, Ctrl-C with 130.
    """

    name: str = job_name()
    interval: float = seconds("Between polls (default 10s).", INTERVAL, 10.0)
    duration: float | None = seconds("End after this long.", WATCH_FOR, names=("--for",))
    restart_on_failure: bool = flag(
        "Redeploy the whole job with its checkpoints kept (every rank resumes)."
    )
    max_restarts: int = option(
        "At most N restarts in --restart-window; then the job is stopped (exit 1).",
        3,
        type=MAX_RESTARTS,
        show_default=True,
        metavar="N",
    )
    state: str | None = option(
        "State file (default: one per inventory and job under $XDG_STATE_HOME/launcher/watch/).",
        type=click.Path(dir_okay=False, path_type=Path),
    )


@dataclass(frozen=True)
class JobRollbackRequest:
    """Roll job NAME back to its previous version on all its nodes, or on none.

    As `launcher rollback` on every node (each node's previous script version, <dest>.prev),
    all or nothing as `job deploy`: every node's checks (a previous version there, lock,
    active session) pass before any old run is stopped; then every old run stops (--restart);
    then every node relaunches, all with one new run id. A node that fails after the first
    stop is reported with the state each node was left in.

    \b
    Examples:
      launcher job rollback --restart --dry-run train   # every node's checks
      launcher job rollback --restart train
    Exit codes: 0 rolled back (or planned), 2 bad input, 3 unreachable or a step failed,
    4 refused on a node (no previous version, lock held, run active): the worst node's.
    """

    name: str = job_name()
    restart: bool = flag(STOP_FIRST)
    dry_run: bool = flag("Every node's rollback checks; change nothing.")
    grace: float | None = seconds(AFTER_CTRL_C, GRACE)
    keep_checkpoints: bool = flag("Leave checkpoints in place.")
    json: bool = json_flag(RESULT_JSON)


@dataclass(frozen=True)
class JobLogsRequest:
    """Job NAME's logs: every node's lines, each prefixed with its node (`[n0] ...`).

    As `launcher logs` on each node. The last lines are shown node by node in rank order;
    with -f every node is followed at once (one stream each) and new lines are shown as they
    come, until every node's run has ended; Ctrl-C stops following, never the runs (exit 0).
    Each node's outcome goes to stderr.

    \b
    Examples:
      launcher job logs train                 # the last 50 lines of every node
      launcher job logs --node n1 -n 200 train
      launcher job logs -f train              # follow every node
    Exit codes: 0 shown, 1 nothing to show on a node (no log, or no session with --raw),
    2 bad input, 3 a node unreachable (the others are still shown).
    """

    name: str = job_name()
    node: str | None = option("Only this node's lines (default: every node).", metavar="NAME")
    tail: int = tail_lines("How many of each node's last lines to show.")
    # Not the API's: its logs come back as a result (the CLI and the tasks follow).
    follow: bool = flag(
        "Keep printing every node's new lines until every run ends or Ctrl-C.",
        names=("-f", "--follow"),
        api=False,
    )
    raw: bool = flag("Show each tmux pane instead of each log.")

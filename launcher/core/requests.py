"""Each command's request, declared once: its fields are the command's parameters (help, bounds,
defaults: `launcher.core.declare`), its docstring the command's help. The CLI's options,
`api.Launcher`'s keywords and the Fabric tasks' options are made from these
(`launcher.commands.table` registers each with its run function). Frozen dataclasses and
nothing else, so that naming a command's request loads none of the workflows (deploy's is
`deploy.DeployOptions`, which every probe loads anyway)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import click

from launcher.core.declare import flag, option, seconds
from launcher.core.errors import UsageError
from launcher.core.params import (
    GRACE,
    HOUR,
    INTERVAL,
    LINES,
    MAX_RESTARTS,
    PORT,
    RESTART_BACKOFF,
    RESTART_WINDOW,
    SUCCESSES,
    WAIT,
    WAIT_LOCK,
    WATCH_FOR,
    WINDOW,
)

# What a deploy does with the old run's checkpoints.
CheckpointMode = Literal["archive", "purge", "keep"]
CHECKPOINT_MODES: tuple[str, ...] = get_args(CheckpointMode)


def checkpoints(purge: str, keep: str) -> Any:
    """The checkpoint mode, spelled `--purge-checkpoints` or `--keep-checkpoints` (archive
    without either); the API's keyword `checkpoints`."""
    return option(
        "Old checkpoints: archive, purge or keep (default archive).",
        "archive",
        keyword="checkpoints",
        spelled=(("purge", "--purge-checkpoints", purge), ("keep", "--keep-checkpoints", keep)),
    )


def lock_wait() -> Any:
    """`--wait-lock DURATION` (deploy, smoke, rollback): a CI job queues behind a deploy that
    holds the container's lock instead of failing with exit 4 at once."""
    return option(
        "Wait up to this long for another deploy's lock (90s, 10m; default 0: refuse at "
        "once, exit 4).",
        0.0,
        type=WAIT_LOCK,
        metavar="DURATION",
        none_is_default=True,
    )


def rollback_flag() -> Any:
    return flag(
        "If the new run fails its probe, put the previous run back (code, env, checkpoints)."
    )


def tail_lines(help: str) -> Any:
    """`--tail N` (`-n`): how many of a log's last lines."""
    return option(help, 50, type=LINES, names=("--tail", "-n"), show_default=True, metavar="N")


def json_flag(help: str) -> Any:
    return flag(help, api=False)


def env_values(items: tuple[str, ...]) -> dict[str, str]:
    """`--env` KEY=VALUE items as the deploy's environment."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: write KEY=VALUE")
        env[key] = value
    return env


@dataclass(frozen=True)
class DeployOptions:
    """Upload the script (verified), stop the old run, set checkpoints aside, launch in tmux.

    \b
    Examples:
      launcher deploy -t staging              # first launch; refuses if a run is active
      launcher deploy --restart -t prod       # replace the running job
      launcher deploy --restart --dry-run     # show the plan, change nothing
      launcher deploy --restart --all         # every target, in parallel, one table
      launcher deploy --restart --wait-lock 10m   # CI: queue behind a deploy in progress
      launcher deploy --restart --verify --rollback-on-failure   # the last good run back if not
    Steps go to stderr as they happen (-q: none); the result or --json to stdout.
    Exit codes: 0 deployed (or planned; with --verify: and healthy), 1 (--verify) unhealthy,
    2 bad input, 3 unreachable or a step failed, 4 refused (lock held, run active, GPUs busy;
    with --rollback-on-failure: no run it could go back to), 5 rolled back and the previous
    run healthy again, 6 rolled back but not healthy, 7 the rollback failed, 130 interrupted;
    a fleet: the highest.
    """

    restart: bool = flag("Stop the running session first (C-c, wait, kill).")
    dry_run: bool = flag("Print every step it would take; change nothing.")
    grace: float | None = seconds(
        "Wait this long after C-c: 90, 90s, 2m; 0 s to 1 h (default: playbook stop_grace).", GRACE
    )
    checkpoint_mode: CheckpointMode = checkpoints(
        "Delete old checkpoints, not archive them.", "Leave checkpoints in place (for a resume)."
    )
    # Kill GPU holders that are not part of the old run instead of refusing (exit 4).
    kill_gpu_holders: bool = flag(
        "Kill processes outside the old run that hold the GPUs (default: refuse, exit 4)."
    )
    # Beyond keep_archives, prune also archives worth more than the runs kept in their place.
    prune_archives: bool = flag(
        "Beyond the playbook's keep_archives, prune also archives of runs that lived longer "
        "or hold more checkpoints than the runs kept (default: those are kept)."
    )
    # Wait this long (seconds) for another deploy's lock instead of refusing at once.
    wait_lock: float = lock_wait()
    # For this deploy only (recorded in history): env values, playbook keys, the command, why.
    env: dict[str, str] = option(
        "Set an environment value for this deploy (repeatable; history records the name).",
        factory=dict,
        repeat=True,
        metavar="KEY=VALUE",
        parse=env_values,
    )
    sets: tuple[str, ...] = option(
        "Override a playbook key for this deploy, e.g. verify.wait=60 (repeatable).",
        (),
        names=("--set",),
        repeat=True,
        metavar="KEY=VALUE",
    )
    command: str | None = option("Run this command instead of the playbook's.")
    message: str | None = option(
        "Why: recorded in history with the deploy.", names=("--message", "-m")
    )
    diff: bool = flag("With a project: show text diffs of changed files.")
    # Probe the new run after the deploy (launcher.operate.redeploy); on failure, with
    # rollback_on_failure, put the previous run back. rollback_on_failure also makes the
    # transaction refuse, before any change, when that would be impossible.
    verify: bool = flag("Then run the startup probe on the new run (exit 1 unhealthy).")
    rollback_on_failure: bool = rollback_flag()
    json: bool = json_flag("Print the report as JSON (schema launcher.deploy/1).")
    # Replace only this run (a watcher's restart): refused (exit 4) if another replaced it.
    expect_run: str | None = None
    # A multi-node job (launcher.jobs.job): the run id every node records, and the job's name.
    run_id: str | None = None
    job: str | None = None


@dataclass(frozen=True)
class ProbeOverrides:
    """The probe's settings that override the playbook's `verify:` (None: the playbook's)."""

    wait: float | None = seconds(
        "Warmup: only fatal signs are judged; 90, 90s, 3m, 1h; up to 7 days "
        "(default: playbook verify.wait, itself 180 s by default).",
        WAIT,
    )
    interval: float | None = seconds(
        "Time between polls: 2, 2s, 1m; 0.2 s to 1 h (default: playbook "
        "verify.interval, itself 10 s by default).",
        INTERVAL,
    )
    window: float | None = seconds(
        "How long after the warmup it may poll: 300, 5m; up to 7 days (default: "
        "playbook verify.window, itself 300 s by default).",
        WINDOW,
    )
    successes: int | None = option(
        "Consecutive passing polls needed (default: playbook verify.successes, "
        "itself 3 by default).",
        type=SUCCESSES,
        metavar="K",
    )
    failure_threshold: int | None = option(
        "Failing polls in a row that end the probe (default: playbook verify.failure_threshold).",
        type=SUCCESSES,
        metavar="N",
    )


VERBOSE = "Show every check with its expectation (default: the ones that did not pass)."


@dataclass(frozen=True)
class Verbose:
    """-v: every check shown with its expectation (the CLI's and the tasks')."""

    verbose: bool = flag(VERBOSE, names=("-v", "--verbose"), api=False)


@dataclass(frozen=True)
class ProbeReports:
    """How the CLI shows a probe: its reports (not the API's: its results are objects)."""

    json: bool = json_flag(
        "Print the report as JSON (schema launcher.<command>/2); progress stays on stderr."
    )
    junit: str | None = option(
        "Write a JUnit XML report here.",
        type=click.Path(dir_okay=False, path_type=Path),
        api=False,
    )
    report: str | None = option(
        "Write a self-contained HTML report here (charts, checks, last lines).",
        type=click.Path(dir_okay=False, writable=True, path_type=Path),
        metavar="FILE.html",
        api=False,
    )


@dataclass(frozen=True)
class VerifyRequest(ProbeReports, ProbeOverrides, Verbose):
    """Startup probe: fail fast on a crash, then judge queues, throughput, step and loss.

    Polls the run's tmux pane from the start; during the warmup only a dead pane, a gone
    session, a fatal sign the run did not survive or a restart ends the probe. After the
    warmup every poll is judged against the run's own history: K passing polls in a row make
    it healthy; a definite failure (loss not finite, throughput sagged from its peak, queues
    drained, a restart, ...) for N failing polls in a row (--failure-threshold) makes it
    unhealthy at once; a check that is only not passing yet waits for the window's end. The
    run the probe started on is pinned: a deploy that replaces it ends the probe (exit 1).

    \b
    Examples:
      launcher verify --wait 180 -t prod
      launcher verify --wait 20 --json --junit verify.xml -t staging
      launcher verify --all --wait 60          # a fleet, in parallel, one table
    Each poll is one progress line on stderr (a live line on a terminal; -q: none).
    Exit codes: 0 healthy, 1 unhealthy, 2 bad input, 3 unreachable, 130 interrupted;
    a fleet: the worst.
    """


@dataclass(frozen=True)
class StatusRequest:
    """One poll of the run: session and pane, the latest sample, the checks, the deployed script.

    \b
    Examples:
      launcher status -t prod
      launcher status --all
    Exit codes: 0 healthy, 1 unhealthy (or no run), 2 bad input, 3 unreachable;
    a fleet: the worst.
    """

    json: bool = json_flag("Print the status as JSON (schema launcher.status/2).")
    verbose: bool = flag(VERBOSE, names=("-v", "--verbose"), api=False)


@dataclass(frozen=True)
class SmokeRequest(ProbeReports, ProbeOverrides, Verbose):
    """CI smoke check: `deploy --restart`, then `verify`, with JUnit and JSON reports.

    Non-interactive; deploy steps and polls are progress lines on stderr (-q: none).
    Exit codes: 0 healthy, 1 unhealthy, 2 config, 3 unreachable, 4 refused (with
    --rollback-on-failure also: no run it could go back to), 5 rolled back and the previous
    run healthy again, 6 rolled back but not healthy, 7 the rollback failed, 130
    interrupted; a fleet: the highest (the one table).

    \b
    Example:
      launcher smoke -t staging --wait 60 --junit smoke.xml --report smoke.html --json > smoke.json
    """

    wait_lock: float = lock_wait()
    rollback_on_failure: bool = rollback_flag()


@dataclass(frozen=True)
class StopRequest:
    """Stop the run gracefully: C-c, wait, kill the session and any leftover process.

    The same stop as `deploy --restart`; it confirms no process of the run is left and
    that the GPUs are free. Checkpoints are not touched. No session: says so, exit 0.

    \b
    Example:
      launcher stop -t prod
      launcher stop --grace 120 -t prod      # give the trainer two minutes to save
    Steps go to stderr (-q: none); the summary to stdout.
    Exit codes: 0 stopped (or nothing to stop), 2 bad input, 3 unreachable or the stop
    failed, 4 refused (lock held); a fleet: the worst.
    """

    grace: float | None = seconds(
        "Wait this long after C-c before killing: 90, 2m; 0 s to 1 h (default: playbook "
        "stop_grace, itself 30 s by default).",
        GRACE,
    )


@dataclass(frozen=True)
class LogsRequest:
    """Show the run's log file (<workdir>/.launcher/<session>.log), or follow it.

    The log holds everything the pane printed, so it works after the pane's scrollback has
    rolled over. With -f it follows until the run ends (exit file written or session gone);
    Ctrl-C stops following, never the run (exit 0).

    What the run printed is shown without the control characters and escape sequences a
    terminal would act on (window title, clipboard, terminal queries...); SGR colours stay.
    --raw-bytes writes it unchanged, and only into a file or a pipe.

    \b
    Example:
      launcher logs -t prod                  # the last 50 lines
      launcher logs -f --tail 5 -t prod      # follow until the run ends or Ctrl-C
      launcher logs --raw -t prod            # the pane as tmux shows it
      launcher logs --raw-bytes -t prod > run.log
    Exit codes: 0 shown, 1 nothing to show (no log, or no session with --raw), 2 --raw-bytes
    on a terminal, 3 unreachable, 141 the reader went away (`| head`).
    """

    tail: int = tail_lines("How many of the last lines to show.")
    follow: bool = flag(
        "Keep printing new lines until the run ends or Ctrl-C.", names=("-f", "--follow")
    )
    raw: bool = flag("Show the tmux pane (capture-pane) instead of the log.")
    raw_bytes: bool = flag(
        "Write the log unfiltered, escape sequences and all (not to a terminal: exit 2).",
        api=False,
    )


@dataclass(frozen=True)
class HistoryRequest:
    """The deploys recorded in the container, newest first.

    Each record says when, who, the script's sha256, the command, what was stopped and
    where the checkpoints went (<workdir>/.launcher/deploys.jsonl). Several targets: each
    one's records under its name, then one table.

    \b
    Example:
      launcher history -t prod
      launcher history --json --limit 5 -t prod
      launcher history --limit 1 --all
      launcher history --diff 20261207T0101 20261207T0215 -t prod
    Exit codes: 0 shown (also when none are recorded), 2 bad input, 3 unreachable;
    a fleet: the worst.
    """

    json: bool = json_flag("Print the records as JSON (schema launcher.history/1).")
    limit: int = option("Only the newest N records (default: all).", 0, type=LINES, metavar="N")
    # Two runs (their ids, or the start of them): what changed from the first to the second.
    diff: tuple[str, ...] = option(
        "What changed from run A to run B: code, command, env names, overrides (run ids, or "
        "the start of them).",
        (),
        nargs=2,
        metavar="A B",
    )


@dataclass(frozen=True)
class RollbackRequest:
    """Put the previous run back: its script (verified like an upload), command, environment
    and checkpoints, and relaunch.

    The run the current one replaced: its script from the copies every deploy keeps (or
    <dest>.prev), its command and env as it was launched with them, and its checkpoints moved
    back in place from their archive when it is there (the current run's go to an archive of
    their own; --no-checkpoints: start fresh; --keep-checkpoints: leave the current ones). A
    second rollback undoes the first. Refuses (exit 4) when there is no previous version, or a
    run is active and --restart was not given.

    \b
    Example:
      launcher rollback --restart -t prod
      launcher rollback --restart -t canary,prod   # several: in parallel, one table
    Steps go to stderr (-q: none); the summary to stdout.
    Exit codes: 0 rolled back, 2 bad input, 3 unreachable or a step failed, 4 refused
    (no previous version, lock held, run active without --restart); a fleet: the worst.
    """

    restart: bool = flag("Stop the running session first (C-c, wait, kill).")
    grace: float | None = seconds(
        "Wait this long after C-c: 90, 2m; 0 s to 1 h (default: playbook stop_grace, itself "
        "30 s by default).",
        GRACE,
    )
    keep_checkpoints: bool = flag("Leave checkpoints in place (for a resume).")
    wait_lock: float = lock_wait()
    # Start fresh: the put-back run's archived checkpoints stay where they are.
    no_checkpoints: bool = flag(
        "Start fresh: leave the put-back run's archived checkpoints archived."
    )


@dataclass(frozen=True)
class DoctorRequest:
    """Check everything a deploy needs, and say how to fix what is wrong.

    Config, host reachable, host key, auth, pct, container exists and runs, python3 and
    tmux inside, GPUs, disk space, workdir and the deploy lock: one line per check, on
    stderr (-q: none); the summary, a fleet's table or --json on stdout.

    \b
    Example:
      launcher doctor -t prod
      launcher doctor --all --json > doctor.json
    Exit codes: 0 all pass; else the first failure's: 2 config, 3 host or container, 4 lock;
    a fleet: the worst.
    """

    json: bool = json_flag("Print the checks as JSON (schema launcher.doctor/1).")


@dataclass(frozen=True)
class LsRequest:
    """List the inventory's targets: name, host, VMID, cluster and jobs, one row each.

    Read from the inventory alone: no connection is made and no playbook is read (a cluster
    target's node is found when a command runs on it).

    \b
    Examples:
      launcher ls
      launcher ls --json | jq -r '.targets[].target'
    Exit codes: 0 listed, 2 the inventory does not load.
    """

    json: bool = json_flag("Print the targets as JSON (schema launcher.ls/1).")


@dataclass(frozen=True, kw_only=True)
class WatchOutlets:
    """What a watch takes alike of a target (`WatchOptions`) or of a job
    (`jobrequests.JobWatchRequest`): its restart budget's window and backoff, and where its
    events go."""

    webhooks: tuple[str, ...] = option(
        "POST each event as JSON (schema launcher.watch.event/1, Slack-compatible `text`). "
        "Repeatable.",
        (),
        names=("--webhook",),
        repeat=True,
        metavar="URL",
    )
    commands: tuple[str, ...] = option(
        "Run CMD (split like a shell would, run without one) for each event, with the event "
        "in LAUNCHER_EVENT_* variables. Repeatable.",
        (),
        names=("--exec",),
        repeat=True,
        metavar="CMD",
    )
    restart_window: float = seconds(
        "The sliding window --max-restarts counts in (default 1h).", RESTART_WINDOW, HOUR
    )
    restart_backoff: float = seconds(
        "Wait before the first restart in a window, doubled for each further one (default 10s).",
        RESTART_BACKOFF,
        10.0,
    )
    metrics_port: int | None = option(
        "Serve Prometheus metrics on this port.", type=PORT, metavar="PORT"
    )
    metrics_address: str = option(
        "Address the metrics server binds to.", "127.0.0.1", show_default=True, metavar="ADDR"
    )


@dataclass(frozen=True)
class WatchOptions(WatchOutlets):
    """`launcher watch`'s settings: its click options are made from these fields."""

    interval: float | None = option(
        "Time between polls of a target (default: playbook verify.interval).",
        type=INTERVAL,
        metavar="SECONDS",
    )
    wait: float | None = option(
        "Warmup of a new run: only a crash, a fatal sign or a restart counts "
        "(default: playbook verify.wait).",
        type=WAIT,
        metavar="SECONDS",
    )
    duration: float | None = seconds(
        "End after this long: 90, 10m, 2h.", WATCH_FOR, names=("--for",)
    )
    restart_on_failure: bool = flag(
        "Redeploy a run that crashed or hung, with its checkpoints kept (it resumes)."
    )
    max_restarts: int = option(
        "At most N restarts per target in --restart-window; then the run is left stopped.",
        3,
        type=MAX_RESTARTS,
        show_default=True,
        metavar="N",
    )
    state: str | None = option(
        "State file (default: one per inventory under $XDG_STATE_HOME/launcher/watch/).",
        type=click.Path(dir_okay=False, path_type=Path),
    )
    as_json: bool = flag("Also print each event as JSON on stdout.", names=("--json",), api=False)

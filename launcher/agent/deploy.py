# mypy: allow-untyped-calls
"""The deploy transaction: every check that can stop it before its first change, then install,
stop, set the checkpoints aside, launch, record; the `apply` op (rollback.py's `rollback` op
runs through it too).

It is step functions over one state object (`DeployState`), run in the order of two short
lists (`checks`, `changes`); a project release (release.py) plugs its own steps and hooks into
them as `state.release`."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import signal
import sys
import time

from launcher.agent.archives import (
    archive_name,
    archives_of,
    choose_prunes,
    describe_archive,
    measured_archives,
    prune_archives,
    record_archive,
    run_seconds,
)
from launcher.agent.base import (
    AgentError,
    as_int,
    emit_event,
    ignore_hangup,
    list_dir,
    login_env,
    new_run_id,
    random_hex,
    remove_quietly,
    run,
    sha256_file,
    sha256_or_none,
    utc_iso,
)
from launcher.agent.commandcheck import CommandCheck
from launcher.agent.gpus import (
    describe_outside,
    start_gpu_queries,
)
from launcher.agent.lock import DeployLock, describe_holder, lock_state
from launcher.agent.params import (
    check_deadline,
    deadline_param,
    env_param,
    grace_param,
    param,
    session_param,
    workdir_param,
)
from launcher.agent.paths import (
    append_record,
    checkpoint_problem,
    dest_path,
    dest_problem,
    exit_path,
    log_path,
    protected_paths,
    remove_tree,
    run_file_path,
    run_file_text,
    state_dir,
    stopped_path,
    tmp_path,
    write_private,
)
from launcher.agent.processes import run_pids
from launcher.agent.protocol import (
    HISTORY_LIMIT,
    LOCK_PATH,
    PANE_HEIGHT,
    PANE_WIDTH,
    RELEASES_DIR,
    RUN_ENV,
    RUN_REPLACED,
    SPEC_NOT_KEPT,
)
from launcher.agent.resources import check_disk_and_gpus, check_gpu_holders
from launcher.agent.runs import (
    archive_problem,
    find_script,
    latest_run,
    load_run_spec,
    new_spec,
    read_records,
    save_run_spec,
)
from launcher.agent.stop import (
    LAUNCH_RETRY_PAUSE,
    describe_processes,
    kill_session,
    stop_report,
    stop_run,
)
from launcher.agent.tmux import (
    format_escape,
    pane_active,
    session_state,
    start_tmux_version,
    tmux,
    tmux_arg,
    tmux_version,
    tmux_version_tuple,
)

# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCRIPT_HISTORY = 5
PLACEHOLDER_WINDOW = "launcher-placeholder"
RUN_WINDOW = "run"
# Runs the playbook command and records how it ended. The command and the environment come from
# the run file ($1, mode 0600, written by the deploy), so no secret is ever in a command line or a
# tmux format; the exit file ($2) and the shell ($3) arrive as positional parameters, never glued
# into this text. The trap keeps the runner alive through C-c / SIGHUP so it can still write the
# exit code; caught signals are reset to default in the command, unlike ignored ones.
# The command starts from an empty environment (`env -i`) plus the run file (the container's
# login environment and the playbook's env) and the pane's own TERM, TMUX, TMUX_PANE: nothing of
# the tmux server's global environment, which is whatever its first client had.
RUNNER = (
    "trap : INT TERM HUP\n"
    'if [ -r "$1" ]; then env -i ${TERM:+"TERM=$TERM"} ${TMUX:+"TMUX=$TMUX"} '
    '${TMUX_PANE:+"TMUX_PANE=$TMUX_PANE"} "$3" -c \'. "$1" && exec "$2" -c "$LAUNCHER_COMMAND"\' '
    'launcher-run "$1" "$3"; code=$?\n'
    'else echo "launcher: cannot read the run file $1" >&2; code=126; fi\n'
    'printf "%s\\n" "$code" > "$2.tmp" && mv -f "$2.tmp" "$2"\nexit "$code"\n'
)
# One argument to exec may be at most 128 KiB (MAX_ARG_STRLEN) and the whole environment shares
# ARG_MAX with it: refuse what could not start, before anything is stopped.
COMMAND_LIMIT = 100000
ENV_LIMIT = 1 << 20
# Linux: one argv or environment string, its NUL included (fs/exec.c: valid_arg_len,
# MAX_ARG_STRLEN = 32 pages); exec fails with E2BIG ("Argument list too long") above it.
ARG_STRLEN = 32 * 4096
# Sources the staged run file and execs the shell with its environment: proves exec takes it
# (E2BIG shows here, before the stop, not as a run that dies at once after it).
DRY_LAUNCH = '. "$1" && exec "$2" -c :'

# Compiles argv[1] as if it were argv[2] with another interpreter; a syntax error is answered as
# JSON [line, column, message] (exit 3) so the message can quote the *new* script's line.
COMPILE = (
    "import json,sys\n"
    "src=sys.stdin.buffer.read() if sys.argv[1]=='-' else open(sys.argv[1],'rb').read()\n"
    "try: compile(src,sys.argv[2],'exec',dont_inherit=True)\n"
    "except SyntaxError as e: print(json.dumps([e.lineno,e.offset,e.msg])); sys.exit(3)\n"
)


# --------------------------------------------------------------------------- the transaction


class DeployState:
    """One deploy transaction: the request's values (checked), what the checks found, the lock,
    the steps done and the answer being built (`result`). The steps are the functions below,
    each `step(state) -> (status, detail)`; `release` is a project release's part of it
    (release.py's `Release`), None for a script."""

    def __init__(self, request, warnings):
        self.warnings = warnings
        self.workdir = workdir_param(request)
        self.session = session_param(request)
        # A project release (release.py) may come without a script.
        project = bool(request.get("release"))
        self.release: Any = None
        self.dest_rel = param(request, "dest", str, required=not project)
        self.dest: Any = None  # the script's path, once check_paths proved it safe
        self.start_dir = self.workdir
        # The script comes either inline (base64, written here to a temp file) or pushed before
        # this call with `pct push` to `tmp`; no script at all when the client saw it in place.
        self.tmp = param(request, "tmp", str)
        self.content_b64 = param(request, "content_b64", str)
        self.sha256 = (param(request, "sha256", str, required=not project) or "").lower()
        self.restart = param(request, "restart", bool, default=False)
        self.expect_run = param(request, "expect_run", str)
        self.grace = grace_param(request)
        self.kill_gpu_holders = param(request, "kill_gpu_holders", bool, default=False)
        # deploy --rollback-on-failure: refuse before any change unless the run it replaces can
        # be put back (its spec and code kept, its checkpoints not about to be deleted).
        self.rollback_guard = param(request, "rollback_guard", bool, default=False)
        self.replaced = None
        self.old_state: dict[str, Any] = {}
        self.old_pids: set[int] = set()
        self.foreign_holders: list[dict[str, Any]] = []
        self.queries: dict[str, Any] = {}
        self.wanted: set[int] = set()
        self.query_flags = (False, False, False)
        self.run_file_next = None
        self.checkpoints_rel = param(request, "checkpoints", str)
        self.checkpoints: Any = None  # their path, once the guard proved it safe
        self.mode = param(request, "checkpoint_mode", str, default="keep")
        # None: every archive kept. With a limit, one worth more than the runs kept in its
        # place is pruned only with prune_archives (the user's --prune-archives).
        self.keep_archives = param(request, "keep_archives", int)
        self.prune_archives = param(request, "prune_archives", bool, default=False)
        # restore: the current checkpoints to an archive of their own, then this archive (the
        # run being put back had them) moved back in place: a rename, same inode.
        self.restore_from = param(request, "restore_from", str)
        self.restore_run = param(request, "restore_run", str)
        self.command = param(request, "command", str, required=True)
        self.env = env_param(request)
        self.width = param(request, "width", int, default=PANE_WIDTH)
        self.height = param(request, "height", int, default=PANE_HEIGHT)
        self.history_limit = param(request, "history_limit", int, default=HISTORY_LIMIT)
        self.gpus = param(request, "gpus", int, default=0)
        # Check disk space and GPUs here too, so a deploy needs no separate preflight call.
        self.check_resources = param(request, "check_resources", bool, default=False)
        self.need_bytes = param(request, "need_bytes", int, default=0)
        self.shell = param(request, "shell", str, default="/bin/sh")
        self.python = param(request, "python", str, default=sys.executable or "python3")
        self.record_base = param(request, "record", dict, default={})
        self.run_id = param(request, "run_id", str) or new_run_id()
        self.restart_count = max(param(request, "restart_count", int, default=0), 0)
        # plan: run every check, change nothing, and say what the deploy would do. keep_going:
        # (with plan) record a failed check and go on, so doctor can show them all.
        self.plan = param(request, "plan", bool, default=False)
        # Another deploy's lock: wait this long for it before refusing (--wait-lock).
        self.wait_lock = min(max(param(request, "wait_lock", float, default=0.0), 0.0), 7 * 86400.0)
        # events: each step (and the stop's countdown) as a JSON line on stderr as it happens.
        self.events = param(request, "events", bool, default=False)
        self.keep_going = self.plan and param(request, "keep_going", bool, default=False)
        # The last moment its first change may begin (its client gives up then); a plan
        # changes nothing and has none.
        self.deadline = None if self.plan else deadline_param(request)
        self.preview = self.plan and param(request, "preview", bool, default=False)
        self.content = None
        self.failures: list[AgentError] = []
        lock_path = param(request, "lock_path", str, default=LOCK_PATH)
        self.lock = DeployLock(lock_path, request.get("operator"))
        validate(self)
        self.steps: list[dict[str, Any]] = []
        self.destructive = False
        self.tmp_ok = False
        self.result: dict[str, Any] = {
            "steps": self.steps,
            "script": None,
            "stopped": None,
            "checkpoints": None,
            "launched": None,
            "record": None,
            "preflight": None,
        }


def validate(state):
    if state.mode not in ("archive", "purge", "keep", "restore"):
        raise AgentError("invalid", "checkpoint_mode must be archive, purge, keep or restore")
    if state.mode == "restore" and not state.restore_from:
        raise AgentError("invalid", "checkpoint_mode restore needs restore_from")
    if state.mode != "keep" and state.checkpoints_rel is None:
        raise AgentError("invalid", "checkpoint_mode %s needs checkpoints" % state.mode)
    keep = state.keep_archives if state.keep_archives is not None else 0
    if state.width < 20 or state.height < 5 or state.history_limit < 0 or keep < 0:
        raise AgentError("invalid", "width, height, history_limit or keep_archives out of range")
    if not state.command.strip():
        raise AgentError("invalid", "command is empty")
    if len(state.command.encode()) > COMMAND_LIMIT:
        raise AgentError(
            "invalid",
            "command is %d bytes; at most %d can be run"
            % (len(state.command.encode()), COMMAND_LIMIT),
        )
    for key, value in sorted(state.env.items()):
        size = len(key.encode()) + len(value.encode()) + 2  # "KEY=value" and its NUL
        if size > ARG_STRLEN:
            raise AgentError(
                "invalid",
                "env %s is %d bytes as KEY=value; exec takes at most %d for one string "
                "(MAX_ARG_STRLEN): put large values in a file the trainer reads"
                % (key, size, ARG_STRLEN),
            )
    env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in state.env.items())
    if env_bytes > ENV_LIMIT:
        raise AgentError(
            "invalid",
            "env is %d bytes; at most %d fit a process environment (put large values in a "
            "file the trainer reads)" % (env_bytes, ENV_LIMIT),
        )


# -- the driver


def checks(state):
    """Every check that can stop the deploy, in order; none of them changes anything that
    matters (the inline script goes to a temp file, the lock is taken)."""
    checks = [("paths", check_paths)]
    if state.content_b64 is not None:
        checks.append(("receive", receive))
    checks += [
        ("lock", take_lock),
        ("tmux", check_tmux),
        ("active_check", check_active),
        ("verify", verify_sha),
        ("compile", compile_check),
        ("checkpoint_guard", guard_checkpoints),
        ("launch_check", check_launch),
    ]
    if state.rollback_guard:
        checks.append(("rollback_guard", check_rollback_ready))
    # Last, so that the nvidia-smi queries (started with the transaction; slow on a real
    # 8-GPU host) answer while the checks above run.
    if state.check_resources:
        checks.append(("resources", check_disk_and_gpus))
    if state.gpus > 0:
        checks.append(("gpus", check_gpu_holders))
    if state.release is not None:
        checks = state.release.checks(state, checks)
    return checks


# What a failure of these leaves: the old run stopped and the new one not up (run_down).
AFTER_THE_STOP = ("checkpoints", "launch")


def changes(state):
    """The destructive steps, in order, once every check has passed."""
    changes = [
        ("install", install),
        ("stop", stop_old),
        ("checkpoints", set_checkpoints_aside),
        ("launch", launch),
        ("record", write_record),
    ]
    if state.release is not None:
        changes = state.release.changes(state, changes)
    return changes


def run_transaction(state):
    """The checks, then (unless a plan) the changes: (the first error or None, the answer).
    Every check that can stop it runs before the first change; after that, a failure still
    answers with the steps done so far."""
    try:
        check_deadline(state.deadline, "the %s" % what(state))
        run_checks(state, checks(state))
        if state.plan:
            plan_actions(state)
            return None, state.result
        # The point of no return: a transaction held up in its checks (a lock waited for,
        # a CT frozen by a backup) must not begin to change things once its client gave up.
        check_deadline(state.deadline, "the %s's first change" % what(state))
        for name, action in changes(state):
            try:
                step(state, name, action)
            except AgentError as exc:
                if name in AFTER_THE_STOP:  # the old run is stopped: say what is left
                    raise run_down(state, exc) from None
                raise
        error = None
    except AgentError as exc:
        error = exc
        if state.destructive and state.result["record"] is None:
            try_record_failure(state, exc)
    finally:
        cleanup(state)
    return error, state.result


def run_checks(state, checks):
    names = [name for name, _ in checks]
    # nvidia-smi and tmux -V answer while the checks before their own run (they read).
    # -L only when CUDA_VISIBLE_DEVICES names MIG devices: it lists them under their GPU.
    mig = "MIG-" in state.env.get("CUDA_VISIBLE_DEVICES", "")
    asked = "gpus" in names
    state.query_flags = (asked and mig, asked or "resources" in names, asked)
    start_queries(state)
    for name, check in checks:
        try:
            step(state, name, check)
        except AgentError as exc:
            if not state.keep_going:
                raise
            state.failures.append(exc)
        if name == "lock" and not state.plan:
            remove_stale_temps(state)
    if state.failures:
        raise state.failures[0]


def what(state):
    release_rollback = state.release is not None and state.release.rollback
    return "rollback" if release_rollback or state.record_base.get("rollback") else "deploy"


def plan_actions(state):
    """What the deploy would change, as `planned` steps (from the checks' view of the CT)."""
    planned = []
    if state.dest is not None:
        unchanged = sha256_or_none(state.dest) == state.sha256
        planned.append(("install", "%s %s" % (state.dest, "unchanged" if unchanged else
                        "replaced (the old one kept as .prev)")))  # fmt: skip
    if state.release is not None:
        planned.append(("release", state.release.planned_switch(state)))
    active = pane_active(state.old_state) or state.old_pids
    if active or state.foreign_holders:
        # A preview without --restart: the stop that --restart would add.
        needs = "with --restart: " if active and not state.restart else ""
        planned.append(("stop", "%ssession '%s' (pane pid %s): C-c, wait %g s, kill the "
                        "session and what is left of the run" % (needs, state.session,
                        state.old_state["pane_pid"], state.grace)))  # fmt: skip
    else:
        planned.append(("stop", "nothing to stop: no active session '%s'" % state.session))
    where = state.checkpoints
    if where is None or state.mode == "keep":
        planned.append(("checkpoints", "keep %s for a resume" % where))
    elif not os.path.lexists(where) and state.mode != "restore":
        planned.append(("checkpoints", "nothing to set aside at %s" % where))
    elif state.mode == "purge":
        planned.append(("checkpoints", "DELETE %s" % where))
    elif state.mode == "restore":
        planned.append(("checkpoints", "move %s to %s.archived-<UTC time>, then %s back to %s"
                        % (where, where, state.restore_from, where)))  # fmt: skip
    else:
        planned.append(("checkpoints", "move %s to %s.archived-<UTC time>, %s"
                        % (where, where, archive_policy(state))))  # fmt: skip
    planned.append(("launch", "tmux session '%s' in %s: %s"
                    % (state.session, state.workdir, state.command)))  # fmt: skip
    planned.append(("record", os.path.join(state_dir(state.workdir), "deploys.jsonl")))
    for name, detail in planned:
        state.steps.append({"name": name, "status": "planned", "detail": detail})


def step(state, name, action):
    """One step run and recorded (as a step event too): a failure is recorded, then raised."""
    started = time.monotonic()
    try:
        status, detail = action(state)
    except AgentError as exc:
        state.steps.append(
            {"name": name, "status": "failed", "detail": exc.message, "kind": exc.kind}
        )
        emit_step(state)
        raise
    except Exception as exc:  # an unexpected error still answers with the steps so far
        message = "%s: %s" % (type(exc).__name__, exc)
        state.steps.append({"name": name, "status": "failed", "detail": message, "kind": "failed"})
        emit_step(state)
        raise AgentError("failed", "%s failed: %s" % (name, message)) from exc
    seconds = round(time.monotonic() - started, 3)
    state.steps.append({"name": name, "status": status, "detail": detail, "seconds": seconds})
    emit_step(state)


def start_queries(state):
    state.queries = start_gpu_queries(*state.query_flags)
    state.queries["tmux"] = start_tmux_version()


def emit_step(state):
    if state.events:
        emit_event({"event": "step", "step": state.steps[-1]})


def emit_progress(state, name):
    """A function that emits `name`'s progress lines as events, or None when none are wanted."""
    if not state.events:
        return None

    def progress(detail):
        emit_event({"event": "progress", "name": name, "detail": detail})

    return progress


def cleanup(state):
    for query in state.queries.values():  # a check failed before reading it
        if query is not None:
            query.cancel()
    # The pushed temp file never outlives the transaction; only removed once proven ours.
    if state.tmp_ok:
        remove_quietly(state.tmp)
    if state.run_file_next:
        remove_quietly(state.run_file_next)
    try:
        state.lock.release()
    except OSError as exc:
        state.warnings.append("could not release the lock: %s" % exc)
    if state.release is not None:
        state.release.cleanup(state)


# -- checks (nothing destructive)


def receive(state):
    """Write the inline script next to where it will live (same filesystem: mv is a rename)."""
    if state.tmp is not None:
        raise AgentError("invalid", "give either tmp or content_b64, not both")
    try:
        data = base64.b64decode(state.content_b64, validate=True)
    except (ValueError, TypeError) as exc:
        raise AgentError(
            "corrupt", "transfer corrupted: the script is not valid base64: %s" % exc
        ) from None
    if state.plan:
        state.content = data
        return "ok", "%d bytes received (plan: kept in memory)" % len(data)
    os.makedirs(state_dir(state.workdir), exist_ok=True)
    name = ".%s.launcher-%s.tmp" % (os.path.basename(state.dest_rel), random_hex(12))
    path = os.path.join(state.workdir, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    state.tmp, state.tmp_ok = path, True  # ours from here on: removed on any failure
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return "ok", "%d bytes to %s" % (len(data), path)


def check_paths(state):
    # workdir_param already refused a workdir that resolves to / or a system directory.
    state.dest = dest_path(state.workdir, state.dest_rel)
    if state.tmp is not None:
        state.tmp = tmp_path(state.workdir, state.tmp)
        # Proven inside the workdir: from here on the temp file is ours to remove on failure.
        state.tmp_ok = True
    # (A dest in the checkpoints is refused by the checkpoint guard: it protects the script.)
    reason = dest_problem(state.workdir, state.dest)
    if reason:
        raise AgentError(
            "unsafe_path", "script destination %r is refused: %s" % (state.dest_rel, reason)
        )
    return "ok", state.dest


def remove_stale_temps(state):
    """Temp files of earlier deploys that were killed mid-way (kill -9, a dropped link).

    Runs under the lock, so no other deploy's transaction is using them."""
    if state.dest_rel is not None:  # a release may come without a script
        remove_stale_script_temps(state)
    if state.release is not None:
        state.release.remove_stale_temps(state)


def remove_stale_script_temps(state):
    removed = []
    name = os.path.basename(state.dest)
    prefixes = (".%s.launcher-" % name,)
    for directory in sorted({state.workdir, os.path.dirname(state.dest)}):
        for entry in list_dir(directory):
            full = os.path.join(directory, entry)
            if not (entry.startswith(prefixes) and entry.endswith(".tmp")) or full == state.tmp:
                continue
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            remove_quietly(full)
            removed.append(full)
    records = state_dir(state.workdir)
    for entry in list_dir(records):
        if entry.startswith(state.session + ".run.next"):
            remove_quietly(os.path.join(records, entry))
    if removed:
        state.steps.append(
            {"name": "leftovers", "status": "ok", "seconds": 0.0,
             "detail": "removed %d stale temp file(s) of killed deploys: %s"
             % (len(removed), ", ".join(removed))}
        )  # fmt: skip
        emit_step(state)


def take_lock(state):
    if state.plan:
        holder = lock_state(state.lock.path)
        if holder and not holder["stale"]:
            raise AgentError(
                "locked", "another deploy is running: %s" % describe_holder(holder),
                holder=holder,
            )  # fmt: skip
        return "ok", "%s free (plan: not taken)" % state.lock.path
    progress = emit_progress(state, "lock")
    if state.lock.acquire(state.warnings, wait=state.wait_lock, progress=progress):
        # The queries started with the transaction saw the containers as they were before
        # the deploy that held the lock: its run's GPUs would look held from outside.
        for query in state.queries.values():
            if query is not None:
                query.cancel()
        start_queries(state)
    return "ok", state.lock.path


def check_tmux(state):
    version = tmux_version(state.queries.get("tmux"))
    if not version:
        raise AgentError("missing", "tmux is not installed in the container")
    return "ok", version


def archive_policy(state):
    if state.keep_archives is None:
        return "every archive kept (keep_archives unset)"
    return "keep %d archive(s)%s" % (
        state.keep_archives,
        " (--prune-archives: also older runs worth more)" if state.prune_archives else "",
    )


def check_active(state):
    state.old_state = session_state(state.session)
    state.old_pids = run_pids(state.old_state["pane_pid"], state.session)
    # The run this deploy replaces: the session's, or (its session gone) the last launched.
    state.replaced = state.old_state.get("run") or latest_run(
        read_records(state.workdir)[0], state.session
    )
    if state.expect_run is not None and state.old_state.get("run") != state.expect_run:
        # Checked under the deploy lock: whoever replaced the run first is the only one.
        raise AgentError(
            "refused",
            "session '%s' %s %s (now %s): someone else replaced it"
            % (
                state.session,
                RUN_REPLACED,
                state.expect_run,
                state.old_state.get("run") or "nothing",
            ),
        )
    if state.restart:
        # Said as what is there: doctor plans with restart too, and asked for nothing.
        if pane_active(state.old_state) or state.old_pids:
            return "ok", "session '%s' is running: --restart replaces it" % (state.session)
        return "ok", "no active run"
    if state.preview and (pane_active(state.old_state) or state.old_pids):
        return "warning", (
            "session '%s' is running: a deploy refuses (exit 4) unless --restart replaces it"
            % state.session
        )
    if pane_active(state.old_state):
        raise AgentError(
            "refused", "session '%s' is running; use --restart to replace it" % state.session
        )
    if state.old_pids:
        raise AgentError(
            "refused",
            "session '%s' has ended but processes of its run are alive (pids %s); use --restart"
            % (state.session, ", ".join(str(p) for p in sorted(state.old_pids))),
        )
    return "ok", "no active run"


def verify_sha(state):
    if state.content is not None:
        got = hashlib.sha256(state.content).hexdigest()
        if got != state.sha256:
            raise AgentError(
                "corrupt", "transfer corrupted: expected %s, got %s" % (state.sha256, got)
            )
        return "ok", got
    if state.tmp is None:
        got = sha256_or_none(state.dest)
        if got != state.sha256:
            raise AgentError(
                "failed", "%s changed since the preflight (sha256 %s)" % (state.dest, got)
            )
        return "unchanged", "%s already in place" % got
    got = sha256_file(state.tmp)
    if got != state.sha256:
        raise AgentError("corrupt", "transfer corrupted: expected %s, got %s" % (state.sha256, got))
    return "ok", got


def compile_check(state):
    if state.content is not None:
        source = state.content
    elif state.tmp is None:
        return "skipped", "script unchanged"
    else:
        with open(state.tmp, "rb") as handle:
            source = handle.read()
    if os.path.realpath(state.python) == os.path.realpath(sys.executable or ""):
        # The run's interpreter is this one: compile here, without a second start-up.
        try:
            compile(source, state.dest, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise AgentError("compile", syntax_message(state.dest, source, exc.lineno,
                             exc.offset, exc.msg)) from None  # fmt: skip
        except ValueError as exc:  # e.g. NUL bytes
            raise AgentError("compile", "%s: %s" % (state.dest, exc)) from None
        return "ok", state.python
    rc, out, err = run([state.python, "-c", COMPILE, "-", state.dest], timeout=120, input=source)
    if rc == 3:
        try:
            line, column, message = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError, TypeError):
            line, column, message = None, None, out.strip()
        raise AgentError("compile", syntax_message(state.dest, source, line, column, message))
    if rc != 0:
        message = (err.strip() or out.strip()).splitlines()
        raise AgentError("compile", "\n".join(message[-12:]) or "compile exited %d" % rc)
    return "ok", state.python


def guard_checkpoints(state):
    if state.checkpoints_rel is None:
        state.checkpoints = None
        return "skipped", "no checkpoints directory"
    state.checkpoints = safe_checkpoints(state)
    if state.mode == "restore":
        problem = archive_problem(state.workdir, state.checkpoints, state.restore_from)
        if problem:
            raise AgentError("refused", "cannot restore the checkpoints: %s" % problem)
        return "ok", "%s (%s goes back there)" % (state.checkpoints, state.restore_from)
    return "ok", state.checkpoints


def safe_checkpoints(state):
    protected = protected_paths(state.workdir, state.session, state.dest)
    if state.release is not None:
        protected += state.release.protected_paths(state)
    path, reason = checkpoint_problem(state.workdir, state.checkpoints_rel, protected)
    if reason is None and state.release is not None:
        reason = state.release.checkpoints_problem(state, path)
    if reason:
        raise AgentError(
            "unsafe_path", "checkpoints path %r is unsafe: %s" % (state.checkpoints_rel, reason)
        )
    return path


def check_rollback_ready(state):
    """deploy --rollback-on-failure: the run being replaced must be one a rollback can put
    back, judged now, before anything is stopped: its spec (command, env) and its code kept,
    and its checkpoints not deleted or pruned by this deploy."""
    marker = state.replaced
    if not marker:
        raise AgentError("refused", "rollback impossible: no previous run in session '%s' "
                         "to go back to" % state.session)  # fmt: skip
    spec = load_run_spec(state.workdir, marker)
    if spec is None:
        raise AgentError("refused", "rollback impossible: run %s cannot be put back: %s "
                         "(launched before launcher kept run specs, or too long ago)"
                         % (marker, SPEC_NOT_KEPT))  # fmt: skip
    code = rollback_code_problem(state, spec)
    if code:
        raise AgentError("refused", "rollback impossible: %s" % code)
    if state.checkpoints is not None and state.mode == "purge":
        raise AgentError("refused", "rollback impossible: --purge-checkpoints deletes the "
                         "checkpoints of %s that a rollback would need" % marker)  # fmt: skip
    # keep_archives None keeps every archive; 0 prunes the one this deploy makes at once.
    if state.checkpoints is not None and state.mode == "archive" and state.keep_archives == 0:
        raise AgentError("refused", "rollback impossible: keep_archives 0 prunes the archive "
                         "of %s's checkpoints at once" % marker)  # fmt: skip
    state.result["rollback_to"] = marker
    return "ok", "%s can be put back: its code, command, env and checkpoints" % marker


def rollback_code_problem(state, spec):
    release = spec.get("release")
    if release:
        if os.path.isdir(os.path.join(state.workdir, RELEASES_DIR, release)):
            return None
        return "release %s of run %s is gone" % (release, spec["run"])
    dest = state.dest or ""
    if find_script(state.workdir, dest, spec.get("sha256")) is None:
        return "the script of run %s (sha256 %s) is no longer kept" % (
            spec["run"],
            str(spec.get("sha256"))[:12],
        )
    return None


def check_launch(state):
    """Everything the launch needs, proven before the old run is stopped: the shell, the
    state directory and the run file (command and env, mode 0600) written and staged."""
    if not (os.path.isabs(state.shell) and os.access(state.shell, os.X_OK)):
        raise AgentError("missing", "shell %s is not executable in the container" % state.shell)
    if state.plan:
        existing = state_dir(state.workdir)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise AgentError("missing", "%s is not writable: the run file cannot be written"
                             % existing)  # fmt: skip
        check_command(state)
        return "ok", "%s writable; %d env value(s) go in a 0600 run file" % (
            existing,
            len(state.env),
        )
    os.makedirs(state_dir(state.workdir), exist_ok=True)
    marker = "%s:%s" % (state.session, state.run_id)
    state.run_file_next = run_file_path(state.workdir, state.session) + ".next"
    env = login_env()  # the base: a login's in this container, not the node's session
    env.update(state.env)
    text = run_file_text(marker, state.command, env, run_env(state))
    write_private(state.run_file_next, text)
    dry_launch(state)
    check_command(state)
    with open(log_path(state.workdir, state.session), "a"):
        pass
    return "ok", "run file staged (%d env value(s), mode 0600)" % len(state.env)


def command_check(state):
    """What the command is judged against: the run starts in the workdir, where the new
    script is installed after the checks (a release's: in the release)."""
    if state.release is not None:
        return state.release.command_check(state)
    dest = state.dest
    return CommandCheck(state.start_dir, {}, [dest] if dest else [], state.env)


def check_command(state):
    """The command's program and script exist where the run starts (a typo in `command`
    refused here, not found by the new run after the old one is stopped)."""
    check = command_check(state)
    problem = check.problem(state.command) if check is not None else None
    if problem:
        raise AgentError("invalid", problem)


def run_env(state):
    """What the run is told about itself (protocol.RUN_ENV, in that order)."""
    label = state.release.release_id if state.release is not None else state.sha256
    values = (state.run_id, label, state.workdir, state.checkpoints or "",
              str(state.restart_count))  # fmt: skip
    return dict(zip(RUN_ENV, values))


def dry_launch(state):
    argv = [state.shell, "-c", DRY_LAUNCH, "launcher-dry-launch", state.run_file_next, state.shell]
    try:
        rc, _, err = run(argv, timeout=10.0)
    except OSError as exc:
        rc, err = 126, str(exc)
    if rc != 0:
        raise AgentError(
            "invalid",
            "the run's environment cannot be started (a dry launch of %s with it failed, "
            "exit %s): %s" % (state.shell, rc, err.strip()[-500:]),
        )


# -- the changes


def install(state):
    state.destructive = True
    previous = sha256_or_none(state.dest)
    script: dict[str, Any] = {
        "path": state.dest,
        "sha256": state.sha256,
        "previous_sha256": previous,
    }
    script["unchanged"] = previous == state.sha256
    state.result["script"] = script
    if script["unchanged"]:
        if state.tmp is not None:
            remove_quietly(state.tmp)
        return "unchanged", "%s already has sha256 %s" % (state.dest, state.sha256)
    os.makedirs(os.path.dirname(state.dest), exist_ok=True)
    if previous:
        shutil.copy2(state.dest, state.dest + ".prev.tmp")
        os.replace(state.dest + ".prev.tmp", state.dest + ".prev")
    os.replace(state.tmp, state.dest)
    keep_history(state)
    return "ok", "installed %s" % state.dest


def keep_history(state):
    history = os.path.join(state_dir(state.workdir), "scripts")
    os.makedirs(history, exist_ok=True)
    shutil.copy2(state.dest, os.path.join(history, state.sha256 + ".py"))
    os.utime(os.path.join(history, state.sha256 + ".py"))
    entries = [os.path.join(history, n) for n in os.listdir(history) if n.endswith(".py")]
    entries.sort(key=os.path.getmtime, reverse=True)
    for old in entries[SCRIPT_HISTORY:]:
        remove_quietly(old)


def stop_old(state):
    if not state.old_state["exists"] and not state.old_pids and not state.foreign_holders:
        state.result["stopped"] = stop_report(False, False, ())
        return "skipped", "no session '%s'" % state.session
    extra = set(h["pid"] for h in state.foreign_holders)
    progress = emit_progress(state, "stop")
    report = stop_run(
        state.session,
        state.grace,
        state.gpus,
        state.warnings,
        extra_pids=extra,
        progress=progress,
        wanted=state.wanted if state.gpus > 0 else (),
    )
    state.result["stopped"] = report
    if report["gpu_others"]:
        raise AgentError(
            "refused",
            "GPUs are still in use by %s; not launching onto busy GPUs"
            % describe_processes(report["gpu_others"]),
        )
    if report["gpu_outside"]:
        raise AgentError(
            "refused",
            "%s after the old run stopped: used from outside this container; not launching "
            "onto busy GPUs" % describe_outside(report["gpu_outside"]),
            gpus_outside=report["gpu_outside"],
        )
    if report["leftover"] or report["gpu_holders"]:
        raise AgentError(
            "failed",
            "old run did not stop: pids %s still alive"
            % ", ".join(
                str(p) for p in report["leftover"] + [h["pid"] for h in report["gpu_holders"]]
            ),
        )
    pids = ", ".join(str(p) for p in report["pids"]) or "none"
    if report["forced"]:
        # Asking was not enough: the run was killed. Worth a look, so not a plain ok.
        return "warning", "forced: still running %g s after C-c, killed (pids %s)" % (
            state.grace,
            pids,
        )
    return "ok", "stopped after C-c (pids %s)" % pids


def set_checkpoints_aside(state):
    action = {"action": state.mode, "from": state.checkpoints, "to": None}
    state.result["checkpoints"] = action
    if state.mode == "keep" or state.checkpoints is None:
        action["action"] = "keep"
        return "skipped", "checkpoints kept"
    if state.mode == "restore":
        return restore_checkpoints(state, action)
    if not os.path.lexists(state.checkpoints):
        action["action"] = "none"
        return "skipped", "nothing to set aside"
    # Checked again right before the move: the tree may have changed since the guard.
    safe_checkpoints(state)
    if state.mode == "purge":
        remove_tree(state.checkpoints)
        return "ok", "purged %s" % state.checkpoints
    run = state.old_state.get("run")
    seconds = run_seconds(state.workdir, state.session, run)
    action["to"] = archive_name(state.checkpoints)
    os.rename(state.checkpoints, action["to"])
    made = record_archive(state.workdir, action["to"], run, seconds, state.warnings)
    detail = "archived to %s (%s)" % (action["to"], describe_archive(made))
    others = [a for a in archives_of(state.checkpoints) if a != action["to"]]
    older = measured_archives(state.workdir, others)
    to_prune, spared = choose_prunes([made] + older, state.keep_archives,
                                       state.prune_archives)  # fmt: skip
    action["pruned"] = prune_archives(to_prune, state.workdir, state.warnings)
    action["kept"] = [{"path": a["path"], "reason": a["reason"]} for a in spared]
    if action["pruned"]:
        detail += "; pruned (keep_archives %d): %s" % (
            state.keep_archives, ", ".join(action["pruned"]))  # fmt: skip
    for archive in spared:
        state.warnings.append(
            "kept %s beyond keep_archives %d: %s; deploy with --prune-archives to prune it"
            % (archive["path"], state.keep_archives, archive["reason"])
        )
    return "ok", detail


def restore_checkpoints(state, action):
    """The current checkpoints to an archive of their own, the put-back run's archive moved
    back in place (rename: same inode, nothing copied). Both checked again right before."""
    checkpoints, archive = safe_checkpoints(state), str(state.restore_from)
    problem = archive_problem(state.workdir, checkpoints, archive)
    if problem:
        raise AgentError("failed", "cannot restore the checkpoints: %s" % problem)
    action.update({"from": archive, "to": checkpoints, "archived": None,
                   "run": state.restore_run})  # fmt: skip
    if os.path.lexists(checkpoints):
        action["archived"] = archive_name(checkpoints)
        os.rename(checkpoints, action["archived"])
    os.rename(archive, checkpoints)
    kept = action["archived"] or "there were none"
    return "ok", "%s moved back in place; the replaced run's to %s" % (archive, kept)


def launch(state):
    os.makedirs(state_dir(state.workdir), exist_ok=True)
    remove_quietly(exit_path(state.workdir, state.session))
    remove_quietly(stopped_path(state.workdir, state.session))
    os.replace(str(state.run_file_next), run_file_path(state.workdir, state.session))
    state.run_file_next = None
    marker = "%s:%s" % (state.session, state.run_id)
    # The log is appended across runs: mark where this one starts.
    with open(log_path(state.workdir, state.session), "a") as log:
        log.write("\n=== launcher run %s at %s ===\n" % (marker, utc_iso()))
    # A server this starts gets the login environment as its global one, and the new
    # session copies nothing of the node's session (tmux's update-environment: SSH_*).
    rc, out, err = tmux(launch_args(state, marker), env=login_env())
    if rc != 0:
        # Once more, on a clean slate: the old run is already stopped, so giving up here
        # leaves nothing running. What the failed chain created of the session goes first.
        state.warnings.append("launch failed (%s): retrying once" % err.strip())
        if session_state(state.session)["exists"]:
            kill_session(state.session, state.warnings)
        time.sleep(LAUNCH_RETRY_PAUSE)
        rc, out, err = tmux(launch_args(state, marker), env=login_env())
    if rc != 0:
        raise AgentError("failed", "tmux could not start the session: %s" % err.strip())
    parts = out.strip().split()
    pane_pid = as_int(parts[1]) if len(parts) > 1 else None
    width = as_int(parts[2]) if len(parts) > 2 else None
    if width != state.width:
        state.warnings.append("pane is %s columns wide, not %d" % (width, state.width))
    state.result["launched"] = {
        "session": state.session,
        "pane_pid": pane_pid,
        "log_file": log_path(state.workdir, state.session),
        "exit_file": exit_path(state.workdir, state.session),
        "width": width,
        "run": marker,
    }
    return "ok", "session %s, pane pid %s" % (state.session, pane_pid)


def run_down(state, exc):
    """The error of a launch (or the checkpoint move before it) that failed after the stop:
    nothing is running, so say so, with what was stopped and where the checkpoints are."""
    stopped = state.result["stopped"] or {}
    if stopped.get("was_running"):
        pids = ", ".join(str(p) for p in stopped.get("pids") or ()) or "none left"
        was = "the old run was stopped (pids %s)" % pids
    else:
        was = "no run was running before"
    moved = state.result["checkpoints"] or {}
    action = moved.get("action")
    if action == "archive":
        where = "checkpoints archived to %s" % moved.get("to")
    elif action == "purge":
        where = "checkpoints purged from %s" % moved.get("from")
    elif state.checkpoints is not None:
        where = "checkpoints left in %s" % state.checkpoints
    else:
        where = "no checkpoints directory"
    # A refusal keeps its kind (and exit code); a plain failure is "down", not unreachable.
    return AgentError(
        "down" if exc.kind == "failed" else exc.kind,
        "run is down: session '%s' is not running: %s; %s; %s failed: %s"
        % (state.session, was, where, state.steps[-1]["name"], exc.message),
    )


def launch_args(state, marker):
    """One tmux command chain, so the session never exists half-configured.

    history-limit only applies to panes created after it is set, so the session starts with
    a placeholder window, gets its options, then the real window, then loses the placeholder.
    remain-on-exit is set in the same chain, before the server can notice a t=0 crash.
    """
    s = state.session
    # No value of the run's own is in this argv: it lands in the tmux server's command line
    # and in #{pane_start_command}, readable by anyone. The run file carries them.
    command = [state.shell, "-c", RUNNER, "launcher-run", run_file_path(state.workdir, s)]
    command += [exit_path(state.workdir, s), state.shell]
    if tmux_version_tuple(tmux_version()) < (3, 0):
        command = [shlex.join(command)]  # tmux < 3.0 runs a single string through a shell
    pipe = "cat >> %s" % shlex.quote(log_path(state.workdir, s))
    start_dir = format_escape(state.start_dir)
    chain = [
        ["new-session", "-d", "-s", s, "-n", PLACEHOLDER_WINDOW, "-c", start_dir,
         "-x", str(state.width), "-y", str(state.height), "sleep", "600"],
        ["set-option", "-t", "=%s:" % s, "history-limit", str(state.history_limit)],
        ["set-option", "-t", "=%s:" % s, "@launcher_run", marker],
        ["new-window", "-t", "=%s:" % s, "-n", RUN_WINDOW, "-c", start_dir, "-P", "-F",
         "#{pane_id} #{pane_pid} #{pane_width}", "--", *command],
        ["set-option", "-w", "-t", "=%s:{end}" % s, "remain-on-exit", "on"],
        ["pipe-pane", "-o", "-t", "=%s:{end}" % s, format_escape(pipe)],
        ["kill-window", "-t", "=%s:{start}" % s],
    ]  # fmt: skip
    args: list[str] = []
    for command_args in chain:
        args += (";",) if args else ()
        args += [tmux_arg(a) for a in command_args]
    return args


def write_record(state):
    record = build_record(state, "launched")
    try:
        save_spec(state, record)
    except (OSError, AgentError) as exc:  # the run is up: a rollback to it just knows less
        state.warnings.append("could not keep the run's spec: %s" % exc)
    append_record(state.workdir, record)
    state.result["record"] = record
    return "ok", os.path.join(state_dir(state.workdir), "deploys.jsonl")


def save_spec(state, record):
    spec = new_spec(record["run"], state.command, state.env, state.checkpoints, record)
    spec.update({"sha256": state.sha256 or None, "dest": state.dest})
    spec["release"] = (record.get("release") or {}).get("id")
    save_run_spec(state.workdir, spec)


def build_record(state, outcome):
    record = dict(state.record_base)
    script = state.result["script"] or {}
    record.update(
        {
            "time": utc_iso(),
            "session": state.session,
            "run": "%s:%s" % (state.session, state.run_id),
            # The run this one replaced (its checkpoints went where `checkpoints` says).
            "replaced": state.replaced,
            "outcome": outcome,
            "sha256": state.sha256,
            "previous_sha256": script.get("previous_sha256"),
            "stopped": state.result["stopped"],
            "checkpoints": state.result["checkpoints"],
            "launched": state.result["launched"],
        }
    )
    if state.release is not None:
        state.release.add_to_record(state, record)
    return record


def try_record_failure(state, exc):
    try:
        record = build_record(state, "failed: %s" % exc.message)
        append_record(state.workdir, record)
        state.result["record"] = record
    except Exception as record_exc:
        state.warnings.append("could not record the failed deploy: %s" % record_exc)


def syntax_message(dest, source, line, column, message):
    """`File "dest", line N` with that line quoted from the NEW script (not the installed one)."""
    text = "%s: %s" % (dest, message)
    if not line:
        return text
    lines = source.decode("utf-8", "replace").splitlines()
    quoted = lines[line - 1] if 0 < line <= len(lines) else ""
    text = 'File "%s", line %d\n    %s' % (dest, line, quoted.strip())
    if column and quoted:
        indent = len(quoted) - len(quoted.lstrip())
        text += "\n    " + " " * max(column - 1 - indent, 0) + "^"
    return text + "\nSyntaxError: %s" % message


def op_apply(request, warnings):
    return run_to_the_end(DeployState(request, warnings))


def run_to_the_end(state):
    """Run a deploy transaction (a script's or a release's); a client that disconnects mid-way
    must not leave half a deploy behind: it finishes regardless."""
    saved = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, ignore_hangup),
        signal.SIGPIPE: signal.signal(signal.SIGPIPE, signal.SIG_IGN),
    }
    try:
        error, result = run_transaction(state)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if error:
        raise AgentError(error.kind, error.message, data=result, **error.extra)
    return result

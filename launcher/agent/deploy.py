# mypy: allow-untyped-calls
"""The deploy transaction (`Deploy`): every check that can stop it before its first change,
then stop, set the checkpoints aside, install, launch, record; and the `apply` and
`rollback` ops."""

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
    measure_tree,
    measured_archives,
    prune_archives,
    record_archive,
    run_seconds,
    size_text,
)
from launcher.agent.base import (
    PYTHON_VERSION,
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
    describe_holders,
    describe_outside,
    describe_watchers,
    gpu_contexts,
    gpu_devices,
    gpu_holders,
    gpu_names,
    gpu_report,
    holder_entries,
    shared_from_outside,
    start_gpu_queries,
    used_outside,
    wanted_gpus,
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
from launcher.agent.preflight import free_bytes
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
from launcher.agent.runs import (
    archive_problem,
    checkpoints_of,
    latest_run,
    load_run_spec,
    new_spec,
    previous_run,
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
OUTSIDE_GRACE = 2.0  # s a GPU seen used from outside is looked at again (check_gpu_holders)
OUTSIDE_RECHECK = 0.25
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


# --------------------------------------------------------------------------- op: apply


class Deploy:
    """The deploy transaction. Every check that can stop it runs before the first destructive
    step; after that, a failure still answers with the steps done so far."""

    def __init__(self, request, warnings):
        self.warnings = warnings
        self.workdir = workdir_param(request)
        self.session = session_param(request)
        # A project release (release.py) may come without a script.
        project = bool(request.get("release"))
        self.dest_rel = param(request, "dest", str, required=not project)
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
        self.foreign_holders: list[dict[str, Any]] = []
        self.queries: dict[str, Any] = {}
        self.wanted: set[int] = set()
        self.query_flags = (False, False, False)
        self.run_file_next = None
        self.checkpoints_rel = param(request, "checkpoints", str)
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
        self.validate()
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

    def validate(self):
        if self.mode not in ("archive", "purge", "keep", "restore"):
            raise AgentError("invalid", "checkpoint_mode must be archive, purge, keep or restore")
        if self.mode == "restore" and not self.restore_from:
            raise AgentError("invalid", "checkpoint_mode restore needs restore_from")
        if self.mode != "keep" and self.checkpoints_rel is None:
            raise AgentError("invalid", "checkpoint_mode %s needs checkpoints" % self.mode)
        keep = self.keep_archives if self.keep_archives is not None else 0
        if self.width < 20 or self.height < 5 or self.history_limit < 0 or keep < 0:
            raise AgentError(
                "invalid", "width, height, history_limit or keep_archives out of range"
            )
        if not self.command.strip():
            raise AgentError("invalid", "command is empty")
        if len(self.command.encode()) > COMMAND_LIMIT:
            raise AgentError(
                "invalid",
                "command is %d bytes; at most %d can be run"
                % (len(self.command.encode()), COMMAND_LIMIT),
            )
        for key, value in sorted(self.env.items()):
            size = len(key.encode()) + len(value.encode()) + 2  # "KEY=value" and its NUL
            if size > ARG_STRLEN:
                raise AgentError(
                    "invalid",
                    "env %s is %d bytes as KEY=value; exec takes at most %d for one string "
                    "(MAX_ARG_STRLEN): put large values in a file the trainer reads"
                    % (key, size, ARG_STRLEN),
                )
        env_bytes = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in self.env.items())
        if env_bytes > ENV_LIMIT:
            raise AgentError(
                "invalid",
                "env is %d bytes; at most %d fit a process environment (put large values in a "
                "file the trainer reads)" % (env_bytes, ENV_LIMIT),
            )

    # -- driver

    def checks(self):
        """Every check that can stop the deploy, in order; none of them changes anything that
        matters (the inline script goes to a temp file, the lock is taken)."""
        checks = [("paths", self.check_paths)]
        if self.content_b64 is not None:
            checks.append(("receive", self.receive))
        checks += [
            ("lock", self.take_lock),
            ("tmux", self.check_tmux),
            ("active_check", self.check_active),
            ("verify", self.verify_sha),
            ("compile", self.compile_check),
            ("checkpoint_guard", self.guard_checkpoints),
            ("launch_check", self.check_launch),
        ]
        if self.rollback_guard:
            checks.append(("rollback_guard", self.check_rollback_ready))
        # Last, so that the nvidia-smi queries (started with the transaction; slow on a real
        # 8-GPU host) answer while the checks above run.
        if self.check_resources:
            checks.append(("resources", self.check_disk_and_gpus))
        if self.gpus > 0:
            checks.append(("gpus", self.check_gpu_holders))
        return checks

    def run(self):
        try:
            check_deadline(self.deadline, "the %s" % self.what)
            checks = self.checks()
            names = [name for name, _ in checks]
            # nvidia-smi and tmux -V answer while the checks before their own run (they read).
            # -L only when CUDA_VISIBLE_DEVICES names MIG devices: it lists them under their GPU.
            mig = "MIG-" in self.env.get("CUDA_VISIBLE_DEVICES", "")
            asked = "gpus" in names
            self.query_flags = (asked and mig, asked or "resources" in names, asked)
            self.start_queries()
            for name, check in checks:
                try:
                    self.step(name, check)
                except AgentError as exc:
                    if not self.keep_going:
                        raise
                    self.failures.append(exc)
                if name == "lock" and not self.plan:
                    self.remove_stale_temps()
            if self.failures:
                raise self.failures[0]
            if self.plan:
                self.plan_actions()
                return None, self.result
            # The point of no return: a transaction held up in its checks (a lock waited for,
            # a CT frozen by a backup) must not begin to change things once its client gave up.
            check_deadline(self.deadline, "the %s's first change" % self.what)
            self.step("install", self.install)
            self.step("stop", self.stop_old)
            try:
                self.step("checkpoints", self.set_checkpoints_aside)
                self.step("launch", self.launch)
            except AgentError as exc:
                raise self.run_down(exc) from None  # the old run is stopped: say what is left
            self.step("record", self.write_record)
            error = None
        except AgentError as exc:
            error = exc
            if self.destructive and self.result["record"] is None:
                self.try_record_failure(exc)
        finally:
            self.cleanup()
        return error, self.result

    @property
    def what(self):
        rollback = getattr(self, "rollback", False) or self.record_base.get("rollback")
        return "rollback" if rollback else "deploy"

    def plan_actions(self):
        """What the deploy would change, as `planned` steps (from the checks' view of the CT)."""
        planned = []
        if getattr(self, "dest", None) is not None:
            unchanged = sha256_or_none(self.dest) == self.sha256
            planned.append(("install", "%s %s" % (self.dest, "unchanged" if unchanged else
                            "replaced (the old one kept as .prev)")))  # fmt: skip
        active = pane_active(self.old_state) or self.old_pids
        if active or self.foreign_holders:
            # A preview without --restart: the stop that --restart would add.
            needs = "with --restart: " if active and not self.restart else ""
            planned.append(("stop", "%ssession '%s' (pane pid %s): C-c, wait %g s, kill the "
                            "session and what is left of the run" % (needs, self.session,
                            self.old_state["pane_pid"], self.grace)))  # fmt: skip
        else:
            planned.append(("stop", "nothing to stop: no active session '%s'" % self.session))
        where = self.checkpoints
        if where is None or self.mode == "keep":
            planned.append(("checkpoints", "keep %s for a resume" % where))
        elif not os.path.lexists(where) and self.mode != "restore":
            planned.append(("checkpoints", "nothing to set aside at %s" % where))
        elif self.mode == "purge":
            planned.append(("checkpoints", "DELETE %s" % where))
        elif self.mode == "restore":
            planned.append(("checkpoints", "move %s to %s.archived-<UTC time>, then %s back to %s"
                            % (where, where, self.restore_from, where)))  # fmt: skip
        else:
            planned.append(("checkpoints", "move %s to %s.archived-<UTC time>, %s"
                            % (where, where, self.archive_policy())))  # fmt: skip
        planned.append(("launch", "tmux session '%s' in %s: %s"
                        % (self.session, self.workdir, self.command)))  # fmt: skip
        planned.append(("record", os.path.join(state_dir(self.workdir), "deploys.jsonl")))
        for name, detail in planned:
            self.steps.append({"name": name, "status": "planned", "detail": detail})

    def step(self, name, action):
        started = time.monotonic()
        try:
            status, detail = action()
        except AgentError as exc:
            self.steps.append(
                {"name": name, "status": "failed", "detail": exc.message, "kind": exc.kind}
            )
            self.emit_step()
            raise
        except Exception as exc:  # an unexpected error still answers with the steps so far
            message = "%s: %s" % (type(exc).__name__, exc)
            self.steps.append(
                {"name": name, "status": "failed", "detail": message, "kind": "failed"}
            )
            self.emit_step()
            raise AgentError("failed", "%s failed: %s" % (name, message)) from exc
        seconds = round(time.monotonic() - started, 3)
        self.steps.append({"name": name, "status": status, "detail": detail, "seconds": seconds})
        self.emit_step()

    def start_queries(self):
        self.queries = start_gpu_queries(*self.query_flags)
        self.queries["tmux"] = start_tmux_version()

    def emit_step(self):
        if self.events:
            emit_event({"event": "step", "step": self.steps[-1]})

    def cleanup(self):
        for query in self.queries.values():  # a check failed before reading it
            if query is not None:
                query.cancel()
        # The pushed temp file never outlives the transaction; only removed once proven ours.
        if self.tmp_ok:
            remove_quietly(self.tmp)
        if self.run_file_next:
            remove_quietly(self.run_file_next)
        try:
            self.lock.release()
        except OSError as exc:
            self.warnings.append("could not release the lock: %s" % exc)

    # -- checks (nothing destructive)

    def receive(self):
        """Write the inline script next to where it will live (same filesystem: mv is a rename)."""
        if self.tmp is not None:
            raise AgentError("invalid", "give either tmp or content_b64, not both")
        try:
            data = base64.b64decode(self.content_b64, validate=True)
        except (ValueError, TypeError) as exc:
            raise AgentError(
                "corrupt", "transfer corrupted: the script is not valid base64: %s" % exc
            ) from None
        if self.plan:
            self.content = data
            return "ok", "%d bytes received (plan: kept in memory)" % len(data)
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        name = ".%s.launcher-%s.tmp" % (os.path.basename(self.dest_rel), random_hex(12))
        path = os.path.join(self.workdir, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.tmp, self.tmp_ok = path, True  # ours from here on: removed on any failure
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return "ok", "%d bytes to %s" % (len(data), path)

    def check_paths(self):
        # workdir_param already refused a workdir that resolves to / or a system directory.
        self.dest = dest_path(self.workdir, self.dest_rel)
        if self.tmp is not None:
            self.tmp = tmp_path(self.workdir, self.tmp)
            # Proven inside the workdir: from here on the temp file is ours to remove on failure.
            self.tmp_ok = True
        # (A dest in the checkpoints is refused by the checkpoint guard: it protects the script.)
        reason = dest_problem(self.workdir, self.dest)
        if reason:
            raise AgentError(
                "unsafe_path", "script destination %r is refused: %s" % (self.dest_rel, reason)
            )
        return "ok", self.dest

    def remove_stale_temps(self):
        """Temp files of earlier deploys that were killed mid-way (kill -9, a dropped link).

        Runs under the lock, so no other deploy's transaction is using them."""
        removed = []
        name = os.path.basename(self.dest)
        prefixes = (".%s.launcher-" % name,)
        for directory in sorted({self.workdir, os.path.dirname(self.dest)}):
            for entry in list_dir(directory):
                full = os.path.join(directory, entry)
                if not (entry.startswith(prefixes) and entry.endswith(".tmp")) or full == self.tmp:
                    continue
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                remove_quietly(full)
                removed.append(full)
        state = state_dir(self.workdir)
        for entry in list_dir(state):
            if entry.startswith(self.session + ".run.next"):
                remove_quietly(os.path.join(state, entry))
        if removed:
            self.steps.append(
                {"name": "leftovers", "status": "ok", "seconds": 0.0,
                 "detail": "removed %d stale temp file(s) of killed deploys: %s"
                 % (len(removed), ", ".join(removed))}
            )  # fmt: skip
            self.emit_step()

    def take_lock(self):
        if self.plan:
            holder = lock_state(self.lock.path)
            if holder and not holder["stale"]:
                raise AgentError(
                    "locked", "another deploy is running: %s" % describe_holder(holder),
                    holder=holder,
                )  # fmt: skip
            return "ok", "%s free (plan: not taken)" % self.lock.path
        progress = None
        if self.events:

            def progress(detail):
                emit_event({"event": "progress", "name": "lock", "detail": detail})

        if self.lock.acquire(self.warnings, wait=self.wait_lock, progress=progress):
            # The queries started with the transaction saw the containers as they were before
            # the deploy that held the lock: its run's GPUs would look held from outside.
            for query in self.queries.values():
                if query is not None:
                    query.cancel()
            self.start_queries()
        return "ok", self.lock.path

    def check_tmux(self):
        version = tmux_version(self.queries.get("tmux"))
        if not version:
            raise AgentError("missing", "tmux is not installed in the container")
        return "ok", version

    def check_disk_and_gpus(self):
        free = free_bytes(self.workdir)
        # Who holds the GPUs is judged once the old run's processes are known (check_gpu_holders).
        gpus = gpu_report(self.gpus, holders=False, devices_started=self.queries.get("devices"))
        self.result["preflight"] = {
            "python": PYTHON_VERSION,
            "free_bytes": free,
            "gpus": gpus,
        }
        if free is not None and free < self.need_bytes:
            raise AgentError("missing", "only %d bytes free under %s" % (free, self.workdir))
        if self.gpus > 0 and gpus["error"]:
            # A driver that fails (version mismatch, a lost GPU, a hung nvidia-smi): refused
            # here, before anything is stopped.
            kind = "missing" if "nvidia-smi not found" in gpus["error"] else "refused"
            raise AgentError(kind, "playbook wants %d GPUs: %s" % (self.gpus, gpus["error"]))
        room = self.check_room_for_the_new_run()
        if self.gpus > 0 and gpus["visible"] < self.gpus:
            raise AgentError(
                "missing", "playbook wants %d GPUs, %d visible" % (self.gpus, gpus["visible"])
            )
        detail = "python %s, %d MiB free" % (
            PYTHON_VERSION,
            (free or 0) // 2**20,
        )
        if self.gpus > 0:
            detail += ", %d GPUs" % gpus["visible"]
        return "ok", detail + room

    def archive_policy(self):
        if self.keep_archives is None:
            return "every archive kept (keep_archives unset)"
        return "keep %d archive(s)%s" % (
            self.keep_archives,
            " (--prune-archives: also older runs worth more)" if self.prune_archives else "",
        )

    def check_room_for_the_new_run(self):
        """Archiving the checkpoints frees no space, and the new run writes as many again:
        when the disk will not hold that, say so before the stop (what the archives hold, what
        pruning may free) instead of pruning to make room."""
        if self.mode != "archive" or self.checkpoints is None:
            return ""
        if not os.path.isdir(self.checkpoints) or os.path.islink(self.checkpoints):
            return ""
        free = free_bytes(os.path.dirname(self.checkpoints))  # its filesystem: a mount may differ
        if free is None:
            return ""
        now = measure_tree(self.checkpoints)
        need = self.need_bytes + now["bytes"]
        if free >= need:
            return ""
        old = measured_archives(self.workdir, archives_of(self.checkpoints))
        held = sum(a.get("bytes") or 0 for a in old)
        to_prune, _ = choose_prunes([now] + old, self.keep_archives, self.prune_archives)
        freed = sum(a.get("bytes") or 0 for a in to_prune)
        if free + freed >= need:
            return "; pruning %d archive(s) frees %s for the new run" % (
                len(to_prune), size_text(freed))  # fmt: skip
        raise AgentError(
            "missing",
            "the disk will not hold the new run: %s free under %s, and the run it replaces "
            "wrote %s of checkpoints (%s), which the new run will write again; %d archive(s) of "
            "older checkpoints hold %s%s. Nothing was stopped: free space, deploy with "
            "--purge-checkpoints or --keep-checkpoints, or set keep_archives and deploy with "
            "--prune-archives" % (
                size_text(free), self.workdir, size_text(now["bytes"]), self.checkpoints,
                len(old), size_text(held),
                " (%s)" % ", ".join(os.path.basename(a["path"]) for a in old[:5]) if old else "",
            ),
        )  # fmt: skip

    def check_gpu_holders(self):
        """Refuse to launch onto GPUs used by processes that are not the old run's (a child
        that double-forked out of the run, another job): stopping the run would not free them.
        Users are this container's processes with /dev/nvidia-uvm and /dev/nvidia<N> open (a
        CUDA context); watchers (device files only: nvtop, NVML monitors) never count. A GPU
        with memory in use and no user here is used from outside (another CT, the host):
        nothing done here can free it, so that refuses whatever the options."""
        devices, held, watchers, contexts = self.gpu_facts(
            self.queries.get("devices"), self.queries.get("contexts")
        )
        listing = ""
        if "MIG-" in self.env.get("CUDA_VISIBLE_DEVICES", ""):
            listing = gpu_names(self.queries.get("names"))[2]
        self.wanted = wanted = wanted_gpus(self.gpus, self.env, devices, listing)
        outside = self.outside_of(wanted, devices, held, contexts)
        # A run that has just exited (a crash a watcher restarts at once) still shows its
        # memory for a moment, with no process here holding the device: the driver frees it
        # after the process ends. Look again for a moment before calling it someone else's.
        deadline = time.monotonic() + OUTSIDE_GRACE
        while outside and time.monotonic() < deadline:
            time.sleep(OUTSIDE_RECHECK)
            devices, held, watchers, contexts = self.gpu_facts(warn=False)
            outside = self.outside_of(wanted, devices, held, contexts)
        if outside:
            raise AgentError(
                "refused",
                "%s: used from outside this container (another container or the host; its "
                "processes cannot be seen or stopped from here); free %s there first"
                % (describe_outside(outside), "it" if len(outside) == 1 else "them"),
                gpus_outside=outside,
            )
        ours = holder_entries({p: g for p, g in held.items() if p in self.old_pids})
        self.foreign_holders = holder_entries(
            {p: g for p, g in held.items() if p not in self.old_pids and wanted & set(g)}
        )
        if self.foreign_holders and not self.kill_gpu_holders:
            raise AgentError(
                "refused",
                "GPUs are held by processes outside session '%s''s run: %s; stop them, or "
                "deploy with --kill-gpu-holders"
                % (self.session, describe_processes(self.foreign_holders)),
                holders=self.foreign_holders,
            )
        if self.foreign_holders:
            return "warning", "held by %s: killed with the old run" % describe_processes(
                self.foreign_holders
            )
        # Not this run's GPUs, but worth saying (doctor shows it): others use them from outside.
        rest = set(d["index"] for d in devices) - wanted
        elsewhere = self.outside_of(rest, devices, held, contexts)
        note = "; used from outside, not by this run: %s" % describe_outside(elsewhere)
        note = note if elsewhere else ""
        others = {p: g for p, g in watchers.items() if p not in self.old_pids}
        if others:  # never blocks, never killed: said so
            note += "; %s (no GPU in use, left alone)" % describe_watchers(others)
        if ours:
            return "ok", "held by the old run (%s)%s" % (describe_holders(ours), note)
        return "ok", "free" + note

    def gpu_facts(self, devices_query=None, contexts_query=None, warn=True):
        """(devices, users here, watchers here, contexts) from the queries started (None:
        query now). nvidia-smi failing (a driver fault, a lost GPU, no answer) refuses."""
        devices, error = gpu_devices(devices_query)
        if error:
            raise AgentError("refused", "cannot read the GPUs: %s" % error)
        held, watchers = gpu_holders(devices=devices)
        contexts, contexts_error = gpu_contexts(contexts_query)
        if contexts_error and warn:
            self.warnings.append("cannot count the GPUs' contexts: %s" % contexts_error)
        return devices, held, watchers, contexts

    @staticmethod
    def outside_of(wanted, devices, held, contexts):
        """GPUs of `wanted` used from outside: memory and no user here, or more contexts than
        users here."""
        outside = used_outside(devices, held, wanted)
        return outside + shared_from_outside(devices, held, wanted, contexts)

    def check_active(self):
        self.old_state = session_state(self.session)
        self.old_pids = run_pids(self.old_state["pane_pid"], self.session)
        # The run this deploy replaces: the session's, or (its session gone) the last launched.
        self.replaced = self.old_state.get("run") or latest_run(
            read_records(self.workdir)[0], self.session
        )
        if self.expect_run is not None and self.old_state.get("run") != self.expect_run:
            # Checked under the deploy lock: whoever replaced the run first is the only one.
            raise AgentError(
                "refused",
                "session '%s' %s %s (now %s): someone else replaced it"
                % (
                    self.session,
                    RUN_REPLACED,
                    self.expect_run,
                    self.old_state.get("run") or "nothing",
                ),
            )
        if self.restart:
            # Said as what is there: doctor plans with restart too, and asked for nothing.
            if pane_active(self.old_state) or self.old_pids:
                return "ok", "session '%s' is running: --restart replaces it" % (self.session)
            return "ok", "no active run"
        if self.preview and (pane_active(self.old_state) or self.old_pids):
            return "warning", (
                "session '%s' is running: a deploy refuses (exit 4) unless --restart replaces it"
                % self.session
            )
        if pane_active(self.old_state):
            raise AgentError(
                "refused", "session '%s' is running; use --restart to replace it" % self.session
            )
        if self.old_pids:
            raise AgentError(
                "refused",
                "session '%s' has ended but processes of its run are alive (pids %s); use --restart"
                % (self.session, ", ".join(str(p) for p in sorted(self.old_pids))),
            )
        return "ok", "no active run"

    def verify_sha(self):
        if self.content is not None:
            got = hashlib.sha256(self.content).hexdigest()
            if got != self.sha256:
                raise AgentError(
                    "corrupt", "transfer corrupted: expected %s, got %s" % (self.sha256, got)
                )
            return "ok", got
        if self.tmp is None:
            got = sha256_or_none(self.dest)
            if got != self.sha256:
                raise AgentError(
                    "failed", "%s changed since the preflight (sha256 %s)" % (self.dest, got)
                )
            return "unchanged", "%s already in place" % got
        got = sha256_file(self.tmp)
        if got != self.sha256:
            raise AgentError(
                "corrupt", "transfer corrupted: expected %s, got %s" % (self.sha256, got)
            )
        return "ok", got

    def compile_check(self):
        if self.content is not None:
            source = self.content
        elif self.tmp is None:
            return "skipped", "script unchanged"
        else:
            with open(self.tmp, "rb") as handle:
                source = handle.read()
        if os.path.realpath(self.python) == os.path.realpath(sys.executable or ""):
            # The run's interpreter is this one: compile here, without a second start-up.
            try:
                compile(source, self.dest, "exec", dont_inherit=True)
            except SyntaxError as exc:
                raise AgentError("compile", syntax_message(self.dest, source, exc.lineno,
                                 exc.offset, exc.msg)) from None  # fmt: skip
            except ValueError as exc:  # e.g. NUL bytes
                raise AgentError("compile", "%s: %s" % (self.dest, exc)) from None
            return "ok", self.python
        rc, out, err = run([self.python, "-c", COMPILE, "-", self.dest], timeout=120, input=source)
        if rc == 3:
            try:
                line, column, message = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError, TypeError):
                line, column, message = None, None, out.strip()
            raise AgentError("compile", syntax_message(self.dest, source, line, column, message))
        if rc != 0:
            message = (err.strip() or out.strip()).splitlines()
            raise AgentError("compile", "\n".join(message[-12:]) or "compile exited %d" % rc)
        return "ok", self.python

    def guard_checkpoints(self):
        if self.checkpoints_rel is None:
            self.checkpoints = None
            return "skipped", "no checkpoints directory"
        self.checkpoints = self.safe_checkpoints()
        if self.mode == "restore":
            problem = archive_problem(self.workdir, self.checkpoints, self.restore_from)
            if problem:
                raise AgentError("refused", "cannot restore the checkpoints: %s" % problem)
            return "ok", "%s (%s goes back there)" % (self.checkpoints, self.restore_from)
        return "ok", self.checkpoints

    def safe_checkpoints(self):
        protected = protected_paths(self.workdir, self.session, self.dest)
        path, reason = checkpoint_problem(self.workdir, self.checkpoints_rel, protected)
        if reason:
            raise AgentError(
                "unsafe_path", "checkpoints path %r is unsafe: %s" % (self.checkpoints_rel, reason)
            )
        return path

    def check_rollback_ready(self):
        """deploy --rollback-on-failure: the run being replaced must be one a rollback can put
        back, judged now, before anything is stopped: its spec (command, env) and its code kept,
        and its checkpoints not deleted or pruned by this deploy."""
        marker = self.replaced
        if not marker:
            raise AgentError("refused", "rollback impossible: no previous run in session '%s' "
                             "to go back to" % self.session)  # fmt: skip
        spec = load_run_spec(self.workdir, marker)
        if spec is None:
            raise AgentError("refused", "rollback impossible: run %s cannot be put back: %s "
                             "(launched before launcher kept run specs, or too long ago)"
                             % (marker, SPEC_NOT_KEPT))  # fmt: skip
        code = self.rollback_code_problem(spec)
        if code:
            raise AgentError("refused", "rollback impossible: %s" % code)
        if self.checkpoints is not None and self.mode == "purge":
            raise AgentError("refused", "rollback impossible: --purge-checkpoints deletes the "
                             "checkpoints of %s that a rollback would need" % marker)  # fmt: skip
        # keep_archives None keeps every archive; 0 prunes the one this deploy makes at once.
        if self.checkpoints is not None and self.mode == "archive" and self.keep_archives == 0:
            raise AgentError("refused", "rollback impossible: keep_archives 0 prunes the archive "
                             "of %s's checkpoints at once" % marker)  # fmt: skip
        self.result["rollback_to"] = marker
        return "ok", "%s can be put back: its code, command, env and checkpoints" % marker

    def rollback_code_problem(self, spec):
        release = spec.get("release")
        if release:
            if os.path.isdir(os.path.join(self.workdir, RELEASES_DIR, release)):
                return None
            return "release %s of run %s is gone" % (release, spec["run"])
        dest = getattr(self, "dest", None) or ""
        if find_script(self.workdir, dest, spec.get("sha256")) is None:
            return "the script of run %s (sha256 %s) is no longer kept" % (
                spec["run"],
                str(spec.get("sha256"))[:12],
            )
        return None

    def check_launch(self):
        """Everything the launch needs, proven before the old run is stopped: the shell, the
        state directory and the run file (command and env, mode 0600) written and staged."""
        if not (os.path.isabs(self.shell) and os.access(self.shell, os.X_OK)):
            raise AgentError("missing", "shell %s is not executable in the container" % self.shell)
        if self.plan:
            existing = state_dir(self.workdir)
            while not os.path.exists(existing):
                existing = os.path.dirname(existing)
            if not os.access(existing, os.W_OK | os.X_OK):
                raise AgentError("missing", "%s is not writable: the run file cannot be written"
                                 % existing)  # fmt: skip
            self.check_command()
            return "ok", "%s writable; %d env value(s) go in a 0600 run file" % (
                existing,
                len(self.env),
            )
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        marker = "%s:%s" % (self.session, self.run_id)
        self.run_file_next = run_file_path(self.workdir, self.session) + ".next"
        env = login_env()  # the base: a login's in this container, not the node's session
        env.update(self.env)
        text = run_file_text(marker, self.command, env, self.run_env())
        write_private(self.run_file_next, text)
        self.dry_launch()
        self.check_command()
        with open(log_path(self.workdir, self.session), "a"):
            pass
        return "ok", "run file staged (%d env value(s), mode 0600)" % len(self.env)

    def command_check(self):
        """What the command is judged against: the run starts in the workdir, where the new
        script is installed after the checks."""
        dest = getattr(self, "dest", None)
        return CommandCheck(self.start_dir, {}, [dest] if dest else [], self.env)

    def check_command(self):
        """The command's program and script exist where the run starts (a typo in `command`
        refused here, not found by the new run after the old one is stopped)."""
        check = self.command_check()
        problem = check.problem(self.command) if check is not None else None
        if problem:
            raise AgentError("invalid", problem)

    def run_env(self):
        """What the run is told about itself (protocol.RUN_ENV, in that order)."""
        values = (self.run_id, self.release_label(), self.workdir, self.checkpoints or "",
                  str(self.restart_count))  # fmt: skip
        return dict(zip(RUN_ENV, values))

    def release_label(self):
        return self.sha256

    def dry_launch(self):
        argv = [self.shell, "-c", DRY_LAUNCH, "launcher-dry-launch", self.run_file_next, self.shell]
        try:
            rc, _, err = run(argv, timeout=10.0)
        except OSError as exc:
            rc, err = 126, str(exc)
        if rc != 0:
            raise AgentError(
                "invalid",
                "the run's environment cannot be started (a dry launch of %s with it failed, "
                "exit %s): %s" % (self.shell, rc, err.strip()[-500:]),
            )

    # -- destructive steps

    def install(self):
        self.destructive = True
        previous = sha256_or_none(self.dest)
        script: dict[str, Any] = {
            "path": self.dest,
            "sha256": self.sha256,
            "previous_sha256": previous,
        }
        script["unchanged"] = previous == self.sha256
        self.result["script"] = script
        if script["unchanged"]:
            if self.tmp is not None:
                remove_quietly(self.tmp)
            return "unchanged", "%s already has sha256 %s" % (self.dest, self.sha256)
        os.makedirs(os.path.dirname(self.dest), exist_ok=True)
        if previous:
            shutil.copy2(self.dest, self.dest + ".prev.tmp")
            os.replace(self.dest + ".prev.tmp", self.dest + ".prev")
        os.replace(self.tmp, self.dest)
        self.keep_history()
        return "ok", "installed %s" % self.dest

    def keep_history(self):
        history = os.path.join(state_dir(self.workdir), "scripts")
        os.makedirs(history, exist_ok=True)
        shutil.copy2(self.dest, os.path.join(history, self.sha256 + ".py"))
        os.utime(os.path.join(history, self.sha256 + ".py"))
        entries = [os.path.join(history, n) for n in os.listdir(history) if n.endswith(".py")]
        entries.sort(key=os.path.getmtime, reverse=True)
        for old in entries[SCRIPT_HISTORY:]:
            remove_quietly(old)

    def stop_old(self):
        if not self.old_state["exists"] and not self.old_pids and not self.foreign_holders:
            self.result["stopped"] = stop_report(False, False, ())
            return "skipped", "no session '%s'" % self.session
        extra = set(h["pid"] for h in self.foreign_holders)
        progress = None
        if self.events:

            def progress(detail):
                emit_event({"event": "progress", "name": "stop", "detail": detail})

        report = stop_run(
            self.session,
            self.grace,
            self.gpus,
            self.warnings,
            extra_pids=extra,
            progress=progress,
            wanted=self.wanted if self.gpus > 0 else (),
        )
        self.result["stopped"] = report
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
                self.grace,
                pids,
            )
        return "ok", "stopped after C-c (pids %s)" % pids

    def set_checkpoints_aside(self):
        action = {"action": self.mode, "from": self.checkpoints, "to": None}
        self.result["checkpoints"] = action
        if self.mode == "keep" or self.checkpoints is None:
            action["action"] = "keep"
            return "skipped", "checkpoints kept"
        if self.mode == "restore":
            return self.restore_checkpoints(action)
        if not os.path.lexists(self.checkpoints):
            action["action"] = "none"
            return "skipped", "nothing to set aside"
        # Checked again right before the move: the tree may have changed since the guard.
        self.safe_checkpoints()
        if self.mode == "purge":
            remove_tree(self.checkpoints)
            return "ok", "purged %s" % self.checkpoints
        run = self.old_state.get("run")
        seconds = run_seconds(self.workdir, self.session, run)
        action["to"] = archive_name(self.checkpoints)
        os.rename(self.checkpoints, action["to"])
        made = record_archive(self.workdir, action["to"], run, seconds, self.warnings)
        detail = "archived to %s (%s)" % (action["to"], describe_archive(made))
        others = [a for a in archives_of(self.checkpoints) if a != action["to"]]
        older = measured_archives(self.workdir, others)
        to_prune, spared = choose_prunes([made] + older, self.keep_archives,
                                           self.prune_archives)  # fmt: skip
        action["pruned"] = prune_archives(to_prune, self.workdir, self.warnings)
        action["kept"] = [{"path": a["path"], "reason": a["reason"]} for a in spared]
        if action["pruned"]:
            detail += "; pruned (keep_archives %d): %s" % (
                self.keep_archives, ", ".join(action["pruned"]))  # fmt: skip
        for archive in spared:
            self.warnings.append(
                "kept %s beyond keep_archives %d: %s; deploy with --prune-archives to prune it"
                % (archive["path"], self.keep_archives, archive["reason"])
            )
        return "ok", detail

    def restore_checkpoints(self, action):
        """The current checkpoints to an archive of their own, the put-back run's archive moved
        back in place (rename: same inode, nothing copied). Both checked again right before."""
        checkpoints, archive = self.safe_checkpoints(), str(self.restore_from)
        problem = archive_problem(self.workdir, checkpoints, archive)
        if problem:
            raise AgentError("failed", "cannot restore the checkpoints: %s" % problem)
        action.update({"from": archive, "to": checkpoints, "archived": None,
                       "run": self.restore_run})  # fmt: skip
        if os.path.lexists(checkpoints):
            action["archived"] = archive_name(checkpoints)
            os.rename(checkpoints, action["archived"])
        os.rename(archive, checkpoints)
        kept = action["archived"] or "there were none"
        return "ok", "%s moved back in place; the replaced run's to %s" % (archive, kept)

    def launch(self):
        os.makedirs(state_dir(self.workdir), exist_ok=True)
        remove_quietly(exit_path(self.workdir, self.session))
        remove_quietly(stopped_path(self.workdir, self.session))
        os.replace(str(self.run_file_next), run_file_path(self.workdir, self.session))
        self.run_file_next = None
        marker = "%s:%s" % (self.session, self.run_id)
        # The log is appended across runs: mark where this one starts.
        with open(log_path(self.workdir, self.session), "a") as log:
            log.write("\n=== launcher run %s at %s ===\n" % (marker, utc_iso()))
        # A server this starts gets the login environment as its global one, and the new
        # session copies nothing of the node's session (tmux's update-environment: SSH_*).
        rc, out, err = tmux(self.launch_args(marker), env=login_env())
        if rc != 0:
            # Once more, on a clean slate: the old run is already stopped, so giving up here
            # leaves nothing running. What the failed chain created of the session goes first.
            self.warnings.append("launch failed (%s): retrying once" % err.strip())
            if session_state(self.session)["exists"]:
                kill_session(self.session, self.warnings)
            time.sleep(LAUNCH_RETRY_PAUSE)
            rc, out, err = tmux(self.launch_args(marker), env=login_env())
        if rc != 0:
            raise AgentError("failed", "tmux could not start the session: %s" % err.strip())
        parts = out.strip().split()
        pane_pid = as_int(parts[1]) if len(parts) > 1 else None
        width = as_int(parts[2]) if len(parts) > 2 else None
        if width != self.width:
            self.warnings.append("pane is %s columns wide, not %d" % (width, self.width))
        self.result["launched"] = {
            "session": self.session,
            "pane_pid": pane_pid,
            "log_file": log_path(self.workdir, self.session),
            "exit_file": exit_path(self.workdir, self.session),
            "width": width,
            "run": marker,
        }
        return "ok", "session %s, pane pid %s" % (self.session, pane_pid)

    def run_down(self, exc):
        """The error of a launch (or the checkpoint move before it) that failed after the stop:
        nothing is running, so say so, with what was stopped and where the checkpoints are."""
        stopped = self.result["stopped"] or {}
        if stopped.get("was_running"):
            pids = ", ".join(str(p) for p in stopped.get("pids") or ()) or "none left"
            was = "the old run was stopped (pids %s)" % pids
        else:
            was = "no run was running before"
        moved = self.result["checkpoints"] or {}
        action = moved.get("action")
        if action == "archive":
            where = "checkpoints archived to %s" % moved.get("to")
        elif action == "purge":
            where = "checkpoints purged from %s" % moved.get("from")
        elif self.checkpoints is not None:
            where = "checkpoints left in %s" % self.checkpoints
        else:
            where = "no checkpoints directory"
        # A refusal keeps its kind (and exit code); a plain failure is "down", not unreachable.
        return AgentError(
            "down" if exc.kind == "failed" else exc.kind,
            "run is down: session '%s' is not running: %s; %s; %s failed: %s"
            % (self.session, was, where, self.steps[-1]["name"], exc.message),
        )

    def launch_args(self, marker):
        """One tmux command chain, so the session never exists half-configured.

        history-limit only applies to panes created after it is set, so the session starts with
        a placeholder window, gets its options, then the real window, then loses the placeholder.
        remain-on-exit is set in the same chain, before the server can notice a t=0 crash.
        """
        s = self.session
        # No value of the run's own is in this argv: it lands in the tmux server's command line
        # and in #{pane_start_command}, readable by anyone. The run file carries them.
        command = [self.shell, "-c", RUNNER, "launcher-run", run_file_path(self.workdir, s)]
        command += [exit_path(self.workdir, s), self.shell]
        if tmux_version_tuple(tmux_version()) < (3, 0):
            command = [shlex.join(command)]  # tmux < 3.0 runs a single string through a shell
        pipe = "cat >> %s" % shlex.quote(log_path(self.workdir, s))
        start_dir = format_escape(self.start_dir)
        chain = [
            ["new-session", "-d", "-s", s, "-n", PLACEHOLDER_WINDOW, "-c", start_dir,
             "-x", str(self.width), "-y", str(self.height), "sleep", "600"],
            ["set-option", "-t", "=%s:" % s, "history-limit", str(self.history_limit)],
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

    def write_record(self):
        record = self.build_record("launched")
        try:
            self.save_spec(record)
        except (OSError, AgentError) as exc:  # the run is up: a rollback to it just knows less
            self.warnings.append("could not keep the run's spec: %s" % exc)
        append_record(self.workdir, record)
        self.result["record"] = record
        return "ok", os.path.join(state_dir(self.workdir), "deploys.jsonl")

    def save_spec(self, record):
        spec = new_spec(record["run"], self.command, self.env, self.checkpoints, record)
        spec.update({"sha256": self.sha256 or None, "dest": getattr(self, "dest", None)})
        spec["release"] = (record.get("release") or {}).get("id")
        save_run_spec(self.workdir, spec)

    def build_record(self, outcome):
        record = dict(self.record_base)
        script = self.result["script"] or {}
        record.update(
            {
                "time": utc_iso(),
                "session": self.session,
                "run": "%s:%s" % (self.session, self.run_id),
                # The run this one replaced (its checkpoints went where `checkpoints` says).
                "replaced": self.replaced,
                "outcome": outcome,
                "sha256": self.sha256,
                "previous_sha256": script.get("previous_sha256"),
                "stopped": self.result["stopped"],
                "checkpoints": self.result["checkpoints"],
                "launched": self.result["launched"],
            }
        )
        return record

    def try_record_failure(self, exc):
        try:
            record = self.build_record("failed: %s" % exc.message)
            append_record(self.workdir, record)
            self.result["record"] = record
        except Exception as record_exc:
            self.warnings.append("could not record the failed deploy: %s" % record_exc)


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
    return run_to_the_end(Deploy(request, warnings))


def run_to_the_end(deploy):
    """Run a deploy transaction (a `Deploy` or a release's); a client that disconnects mid-way
    must not leave half a deploy behind: it finishes regardless."""
    saved = {
        signal.SIGHUP: signal.signal(signal.SIGHUP, ignore_hangup),
        signal.SIGPIPE: signal.signal(signal.SIGPIPE, signal.SIG_IGN),
    }
    try:
        error, result = deploy.run()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if error:
        raise AgentError(error.kind, error.message, data=result, **error.extra)
    return result


def op_rollback(request, warnings):
    """Put the previous run back through the same transaction as apply (lock, guards, stop,
    launch, record): its script (from the kept copies, verified like an upload; <dest>.prev for
    a run launched before specs were kept), its command and environment, and (restore) its
    archived checkpoints."""
    request = rollback_request(request, warnings)
    workdir = workdir_param(request)
    dest = dest_path(workdir, param(request, "dest", str, required=True))
    wanted = request.pop("script_sha256", None)
    previous = find_script(workdir, dest, wanted) if wanted else dest + ".prev"
    if previous is None:
        raise AgentError("refused", "the script of run %s (sha256 %s) is no longer kept"
                         % (request.get("to_run") or "being put back", wanted[:12]))  # fmt: skip
    if os.path.islink(previous) or not os.path.isfile(previous):
        raise AgentError(
            "refused", "no previous version to roll back to: %s does not exist" % previous
        )
    sha = sha256_file(previous)
    directory, name = os.path.split(dest)
    tmp = os.path.join(directory, ".%s.launcher-rollback-%s.tmp" % (name, random_hex(12)))
    shutil.copy2(previous, tmp)
    record = dict(request["record"])
    if not request.get("relaunch"):
        record["rolled_back_from"] = sha256_or_none(dest)
    applied = dict(request)
    applied.update({"op": "apply", "tmp": tmp, "sha256": sha, "record": record})
    try:
        return op_apply(applied, warnings)
    finally:
        remove_quietly(tmp)  # the transaction moved or removed it; this covers an early refusal


def rollback_request(request, warnings):
    """The rollback's request with the run it puts back filled in: `to_run` (default: the run
    the session's latest run replaced), its command and env from its spec, `restore_from`
    (checkpoint_mode restore: its archive, when there; otherwise a fresh start, said so), and
    for a script the sha256 of its kept copy. `relaunch` (a watcher's restart): the run is put
    back as it was, checkpoints kept in place, not called a rollback."""
    workdir = workdir_param(request)
    session = session_param(request)
    records = read_records(workdir)[0]
    relaunch = param(request, "relaunch", bool, default=False)
    marker = param(request, "to_run", str)
    marker = marker or (
        latest_run(records, session) if relaunch else previous_run(records, session)
    )
    request = dict(request)
    record = dict(param(request, "record", dict, default={}))
    if not relaunch:
        record["rollback"] = True
    use_spec = param(request, "use_spec", bool, default=True)
    spec = load_run_spec(workdir, marker) if marker and use_spec else None
    if spec is not None:
        record.update({"rolled_back_to": marker, "command": spec["command"]})
        if spec.get("overrides") is not None:
            record["overrides"] = spec["overrides"]
        request.update({"command": spec["command"], "env": spec["env"]})
        request["script_sha256"] = spec.get("sha256")
        if request.get("release") and spec.get("release"):
            request["release"] = dict(request["release"], to=spec["release"])
    elif marker and (relaunch or param(request, "need_spec", bool, default=False)):
        raise AgentError("refused", "cannot put run %s back: %s" % (marker, SPEC_NOT_KEPT))
    elif marker and use_spec:
        warnings.append("run %s was launched before launcher kept run specs: the playbook's "
                        "command and env are used" % marker)  # fmt: skip
    request["record"] = record
    if param(request, "checkpoint_mode", str) == "restore":
        state, where = checkpoints_of(records, marker) if marker else (None, None)
        if state == "archived" and where and os.path.isdir(where):
            request.update({"restore_from": where, "restore_run": marker})
        elif state == "kept":
            request["checkpoint_mode"] = "keep"  # they never left: the replaced run went on
        else:
            request["checkpoint_mode"] = "archive"
            reasons = {"archived": "its archive %s is gone" % where, "deleted": "they were deleted",
                       "none": "it had none"}  # fmt: skip
            why = reasons.get(state or "", "no record says where they went")
            warnings.append("checkpoints of %s not restored (%s): the run starts fresh"
                            % (marker or "the previous run", why))  # fmt: skip
    return request


def find_script(workdir, dest, sha):
    """A file with the script of sha256 `sha`: its kept copy (.launcher/scripts/<sha>.py), the
    installed script or its .prev; None when none of them has it."""
    if not sha or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
        return None
    kept = os.path.join(state_dir(workdir), "scripts", sha + ".py")
    for path in (kept, dest, dest + ".prev") if dest else (kept,):
        if not os.path.islink(path) and sha256_or_none(path) == sha:
            return path
    return None

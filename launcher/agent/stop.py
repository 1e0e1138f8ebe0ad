# mypy: allow-untyped-calls
"""Stopping a run for real (C-c, the grace, then TERM and KILL to its whole tree; its GPUs
freed) and the `stop` op."""

from __future__ import annotations

import json
import os
import signal
import time

from launcher.agent.base import AgentError, as_int, utc_iso, write_atomic
from launcher.agent.gpus import (
    GPU_RELEASE_WAIT,
    gpu_devices,
    gpu_holders,
    gpu_names,
    holder_entries,
    scan_device_files,
    start_gpu_queries,
    used_outside,
    wanted_gpus,
)
from launcher.agent.lock import DeployLock
from launcher.agent.params import (
    check_deadline,
    deadline_param,
    grace_param,
    param,
    session_param,
    workdir_param,
)
from launcher.agent.paths import state_dir, stopped_path
from launcher.agent.processes import (
    alive,
    grace_countdown,
    is_shell,
    proc_stat,
    process_command,
    run_pids,
    signal_pids,
    wait_for,
)
from launcher.agent.protocol import LOCK_PATH, RUN_REPLACED
from launcher.agent.tmux import pane_active, session_state, tmux

# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# --------------------------------------------------------------------------- stop


def stop_run(session, grace, gpus, warnings, extra_pids=(), progress=None, wanted=()):
    """Ask (C-c), wait, kill the session, TERM then KILL what is left, confirm it is gone.

    `extra_pids` (GPU holders the operator asked to kill, container PIDs from /proc) are ended
    with the run's leftovers; `progress(detail)` hears how much of the grace period is left,
    about once a second. With `gpus`, it then waits for the run's processes to close their GPU
    devices and for the memory of the GPUs in `wanted` (the next run's) to fall."""
    state = session_state(session)
    pane_pid = state["pane_pid"]
    seen = run_pids(pane_pid, session) | set(extra_pids)
    report = stop_report(pane_active(state) or bool(seen), state["exists"], seen)
    if not state["exists"] and not seen:
        return report
    holders: dict[str, Any] = {}
    confirming: list[bool] = []  # once

    def confirm():
        """The run's processes have exited: nvidia-smi can start on the confirmation that
        they left the GPUs while the pane's end is noticed and the session goes."""
        if not confirming:
            confirming.append(True)
            holders.update(start_gpu_queries(False, gpus > 0))  # device facts only

    if pane_active(state):
        tmux(["send-keys", "-t", "=%s:" % session, "C-c"])
        # A session someone started by hand runs the trainer under an interactive shell, which
        # survives C-c: there the run is over when everything but that shell has exited.
        shell = pane_pid if state.get("run") is None and is_shell(pane_pid) else None

        def finished():
            seen.update(run_pids(pane_pid, session))
            if alive(seen - {shell}):
                return False
            confirm()
            return shell is not None or not pane_active(session_state(session))

        def waited_for():
            return alive(seen) - {shell}

        # forced: asking was not enough within the grace period.
        report["forced"] = not wait_for(
            finished, grace, on_tick=grace_countdown(grace, progress), pids=waited_for
        )
    if not report["forced"]:
        confirm()
    if state["exists"]:
        kill_session(session, warnings)
    seen.update(run_pids(pane_pid, session))
    # Killing the session sends SIGHUP: give what it ends a moment to exit before calling
    # anything left "forced" (an interactive shell, the pane's own process).
    wait_for(lambda: not alive(seen), 1.0, pids=lambda: alive(seen))
    report["pids"] = sorted(seen)
    report["forced"] = report["forced"] or bool(alive(seen))
    report["leftover"] = sorted(terminate(seen, grace))
    for pid in report["leftover"]:
        warnings.append(describe_leftover(pid))
    if report["leftover"] or report["forced"]:
        for query in holders.values():
            query.cancel()  # it saw processes that have been killed since
        holders.clear()
    if gpus > 0:
        # Memory is judged on the GPUs the next run needs only: an old run's GPU that another
        # container also uses is no reason to refuse a run that will not use it.
        ours, others, outside = gpu_release(
            seen, set(wanted), warnings, started=holders.get("devices")
        )
        report["gpu_holders"], report["gpu_others"] = holder_entries(ours), holder_entries(others)
        report["gpu_outside"] = outside
    return report


LAUNCH_RETRY_PAUSE = 0.5
# How long a tmux server that lost its last session may take to exit (it frees the panes' history
# first: a 100,000-line history or one 10 MB line takes it a while) before it is ended.
SERVER_EXIT_WAIT = 20.0


def kill_session(session, warnings, timeout=SERVER_EXIT_WAIT):
    """Kill the session; when it was the server's last one, return only once the server is gone.

    A server whose last session is killed exits on its own, but only after it has freed every
    pane: a client started meanwhile (the next launch) connects to the exiting server and fails
    with "server exited unexpectedly", leaving nothing running. Waiting for the server's pid to
    end closes that window. A server still there after `timeout` is left alone (a session may
    have been started on it since): the launch retries once."""
    rc, out, _ = tmux(["list-sessions", "-F", "#{pid}"])
    servers = set(as_int(line) for line in out.split()) - {None} if rc == 0 else set()
    tmux(["kill-session", "-t", "=%s" % session])
    if len(out.split()) != 1 or len(servers) != 1:
        return  # other sessions keep the server running: it does not exit
    server = set(servers)
    if wait_for(lambda: not alive(server), timeout, pids=lambda: alive(server)):
        return
    warnings.append(
        "tmux server %s still running %g s after its last session" % (min(server), timeout)
    )


def stop_report(was_running, session_existed, pids):
    return {
        "was_running": was_running,
        "session_existed": session_existed,
        "pids": sorted(pids),
        "forced": False,
        "leftover": [],
        "gpu_holders": [],
        "gpu_others": [],
        "gpu_outside": [],
    }


KILL_WAIT = 5.0  # how long a SIGKILLed process may take to exit before it is reported

# Why a process outlives SIGKILL, by its /proc state. D is the one seen in practice: a call into
# the kernel (a GPU driver after an Xid error, a hung NFS mount) that signals cannot interrupt.
KILLED_BUT_ALIVE = {
    "D": "uninterruptible sleep: blocked in a kernel call (a driver, a hung filesystem) that "
    "no signal interrupts; it ends when that call returns, or with a reboot",
    "R": "still running: its exit had not finished",
    "S": "sleeping",
    "T": "stopped",
    "t": "stopped by a tracer",
}


def terminate(pids, grace):
    """SIGTERM, short wait, SIGKILL; returns the pids still alive afterwards."""
    targets = alive(pids)
    if not targets:
        return set()
    signal_pids(targets, signal.SIGTERM)
    wait_for(lambda: not alive(targets), min(max(grace, 1.0), 10.0), pids=lambda: alive(targets))
    signal_pids(alive(targets), signal.SIGKILL)
    wait_for(lambda: not alive(targets), KILL_WAIT, pids=lambda: alive(targets))
    return alive(targets)


def describe_leftover(pid):
    """A warning naming a process that outlived SIGKILL: its command and why, from its state."""
    stat = proc_stat(pid)
    state = stat[0] if stat else "?"
    why = KILLED_BUT_ALIVE.get(state, "state %s" % state)
    named = describe_processes([{"pid": pid, "name": "?"}])  # `pid 437 (python3 train.py)`
    return "%s still alive %g s after SIGKILL: %s" % (named, KILL_WAIT, why)


# The pause between two looks at the GPUs' memory after a stop: short for the first
# GPU_RELEASE_SOON s (a driver frees an exited process's memory within a fraction of a second,
# and each look is an nvidia-smi run of 0.05-1 s by itself, so the release is seen within about
# one query), then longer (a GPU that stays busy costs few queries until the timeout).
GPU_RELEASE_PAUSE = 0.05
GPU_RELEASE_SOON = 2.0
GPU_RELEASE_PAUSE_LATER = 0.5


def gpu_release(pids, wanted, warnings, timeout=GPU_RELEASE_WAIT, started=None):
    """After a stop, wait (bounded) for `pids` to close their GPU device handles and for the
    memory of the `wanted` GPUs to fall: the driver frees an exited process's memory a moment
    after it exits. The first look may use a query `started` once the run had exited.

    Returns ({pid: GPUs} of `pids` still holding, {pid: GPUs} of other processes here holding
    `wanted` GPUs, `wanted` GPUs still used from outside the container)."""
    found: dict[str, Any] = {"ours": {}, "others": {}, "outside": [], "error": None}
    first = [started]

    def released():
        devices, found["error"] = gpu_devices(first.pop() if first else None)
        scan = scan_device_files()
        users, watchers = gpu_holders(None, devices, scan)
        # The run's own processes must close every device file, a watcher of its too; of the
        # others only those using a GPU (a CUDA context) keep it from the next run.
        found["ours"] = {pid: g for pid, g in users.items() if pid in pids}
        found["ours"].update((pid, g) for pid, g in watchers.items() if pid in pids)
        found["others"] = {p: g for p, g in users.items() if p not in pids and wanted & set(g)}
        found["outside"] = used_outside(devices, users, wanted)
        return found["error"] is not None or not (found["ours"] or found["outside"])

    begun = time.monotonic()
    deadline = begun + timeout
    while not released() and time.monotonic() < deadline:
        now = time.monotonic()
        pause = GPU_RELEASE_PAUSE if now - begun < GPU_RELEASE_SOON else GPU_RELEASE_PAUSE_LATER
        time.sleep(min(pause, max(deadline - now, 0.0)))
    if found["error"]:
        warnings.append("could not confirm GPUs were released: %s" % found["error"])
    return found["ours"], found["others"], found["outside"]


def describe_processes(holders):
    """`pid 136 (python3 -c ...)`: GPU holders with their command lines, for refusals."""
    seen, parts = set(), []
    for holder in holders:
        if holder["pid"] in seen:
            continue
        seen.add(holder["pid"])
        command = holder.get("command") or process_command(holder["pid"]) or holder.get("name")
        parts.append("pid %s (%s)" % (holder["pid"], command))
    return ", ".join(parts)


# --------------------------------------------------------------------------- ops: stop, poll


def op_stop(request, warnings):
    session = session_param(request)
    grace = grace_param(request)
    gpus = param(request, "gpus", int, default=0)
    # The GPUs the playbook's run uses, so that `stop` says whether they are free for the next.
    visible = param(request, "cuda_visible_devices", str, default="")
    wanted = stop_wanted(gpus, visible, warnings) if gpus > 0 else ()
    lock = DeployLock(param(request, "lock_path", str, default=LOCK_PATH), request.get("operator"))
    deadline = deadline_param(request)
    check_deadline(deadline, "the stop")
    # A stop racing a deploy's launch would leave either run half-dead: serialise on the lock.
    lock.acquire(warnings)
    try:
        check_expected_run(request, session)
        report = stop_run(session, grace, gpus, warnings, wanted=wanted)
        workdir = request.get("workdir")
        if workdir and (report["session_existed"] or report["pids"]):
            mark_stopped(workdir_param(request), session, request.get("operator"), warnings)
        return {"stopped": report}
    finally:
        lock.release()


def check_expected_run(request, session):
    """Refuse to stop a run other than the one the client named (checked under the deploy
    lock, so no deploy replaces it between this look and the stop). A session that runs no
    launcher run by now (ended, or started by hand) is left to the stop: nothing of another
    launcher run is in it."""
    if "expect_run" not in request:
        return
    expected = param(request, "expect_run", str)
    current = session_state(session).get("run")
    if current is not None and current != expected:
        raise AgentError(
            "refused",
            "session '%s' %s %s (now %s): not stopped"
            % (session, RUN_REPLACED, expected or "what the client saw", current),
        )


def stop_wanted(gpus, visible, warnings):
    """The GPUs the playbook's run uses; UUIDs and MIG ids need nvidia-smi's answer."""
    needs_devices = any(not e.strip().isdigit() for e in visible.split(",") if e.strip())
    devices, listing = [], ""
    if needs_devices:
        queries = start_gpu_queries(True, True)
        listing = gpu_names(queries["names"])[2]
        devices = gpu_devices(queries["devices"])[0]
    try:
        return wanted_gpus(gpus, {"CUDA_VISIBLE_DEVICES": visible}, devices, listing)
    except AgentError as exc:
        warnings.append("%s: judging the first %d GPUs" % (exc.message, gpus))
        return set(range(gpus))


def mark_stopped(workdir, session, operator, warnings):
    """Leave the stop marker (see stopped_path); a run's state says `stopped` while it lasts."""
    try:
        os.makedirs(state_dir(workdir), exist_ok=True)
        who = operator if isinstance(operator, dict) else {}
        write_atomic(stopped_path(workdir, session), json.dumps({"time": utc_iso(), **who}) + "\n")
    except OSError as exc:
        warnings.append("could not record the stop: %s" % exc)

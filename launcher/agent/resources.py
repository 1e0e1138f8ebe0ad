# mypy: allow-untyped-calls
"""The deploy transaction's checks of what the new run needs (deploy.py's `resources` and `gpus`
steps): room on the disk (the checkpoints it will write again) and GPUs no one else holds."""

from __future__ import annotations

import os
import time

from launcher.agent.archives import (
    archives_of,
    choose_prunes,
    measure_tree,
    measured_archives,
    size_text,
)
from launcher.agent.base import PYTHON_VERSION, AgentError
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
    used_outside,
    wanted_gpus,
)
from launcher.agent.preflight import free_bytes
from launcher.agent.stop import describe_processes

OUTSIDE_GRACE = 2.0  # s a GPU seen used from outside is looked at again (check_gpu_holders)
OUTSIDE_RECHECK = 0.25


def check_disk_and_gpus(state):
    free = free_bytes(state.workdir)
    # Who holds the GPUs is judged once the old run's processes are known (check_gpu_holders).
    gpus = gpu_report(state.gpus, holders=False, devices_started=state.queries.get("devices"))
    state.result["preflight"] = {
        "python": PYTHON_VERSION,
        "free_bytes": free,
        "gpus": gpus,
    }
    if free is not None and free < state.need_bytes:
        raise AgentError("missing", "only %d bytes free under %s" % (free, state.workdir))
    if state.gpus > 0 and gpus["error"]:
        # A driver that fails (version mismatch, a lost GPU, a hung nvidia-smi): refused
        # here, before anything is stopped.
        kind = "missing" if "nvidia-smi not found" in gpus["error"] else "refused"
        raise AgentError(kind, "playbook wants %d GPUs: %s" % (state.gpus, gpus["error"]))
    room = check_room_for_the_new_run(state)
    if state.gpus > 0 and gpus["visible"] < state.gpus:
        raise AgentError(
            "missing", "playbook wants %d GPUs, %d visible" % (state.gpus, gpus["visible"])
        )
    detail = "python %s, %d MiB free" % (
        PYTHON_VERSION,
        (free or 0) // 2**20,
    )
    if state.gpus > 0:
        detail += ", %d GPUs" % gpus["visible"]
    return "ok", detail + room


def check_room_for_the_new_run(state):
    """Archiving the checkpoints frees no space, and the new run writes as many again:
    when the disk will not hold that, say so before the stop (what the archives hold, what
    pruning may free) instead of pruning to make room."""
    if state.mode != "archive" or state.checkpoints is None:
        return ""
    if not os.path.isdir(state.checkpoints) or os.path.islink(state.checkpoints):
        return ""
    free = free_bytes(os.path.dirname(state.checkpoints))  # its filesystem: a mount may differ
    if free is None:
        return ""
    now = measure_tree(state.checkpoints)
    need = state.need_bytes + now["bytes"]
    if free >= need:
        return ""
    old = measured_archives(state.workdir, archives_of(state.checkpoints))
    held = sum(a.get("bytes") or 0 for a in old)
    to_prune, _ = choose_prunes([now] + old, state.keep_archives, state.prune_archives)
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
            size_text(free), state.workdir, size_text(now["bytes"]), state.checkpoints,
            len(old), size_text(held),
            " (%s)" % ", ".join(os.path.basename(a["path"]) for a in old[:5]) if old else "",
        ),
    )  # fmt: skip


def check_gpu_holders(state):
    """Refuse to launch onto GPUs used by processes that are not the old run's (a child
    that double-forked out of the run, another job): stopping the run would not free them.
    Users are this container's processes with /dev/nvidia-uvm and /dev/nvidia<N> open (a
    CUDA context); watchers (device files only: nvtop, NVML monitors) never count. A GPU
    with memory in use and no user here is used from outside (another CT, the host):
    nothing done here can free it, so that refuses whatever the options."""
    devices, held, watchers, contexts = gpu_facts(
        state, state.queries.get("devices"), state.queries.get("contexts")
    )
    listing = ""
    if "MIG-" in state.env.get("CUDA_VISIBLE_DEVICES", ""):
        listing = gpu_names(state.queries.get("names"))[2]
    state.wanted = wanted = wanted_gpus(state.gpus, state.env, devices, listing)
    outside = outside_of(wanted, devices, held, contexts)
    # A run that has just exited (a crash a watcher restarts at once) still shows its
    # memory for a moment, with no process here holding the device: the driver frees it
    # after the process ends. Look again for a moment before calling it someone else's.
    deadline = time.monotonic() + OUTSIDE_GRACE
    while outside and time.monotonic() < deadline:
        time.sleep(OUTSIDE_RECHECK)
        devices, held, watchers, contexts = gpu_facts(state, warn=False)
        outside = outside_of(wanted, devices, held, contexts)
    if outside:
        raise AgentError(
            "refused",
            "%s: used from outside this container (another container or the host; its "
            "processes cannot be seen or stopped from here); free %s there first"
            % (describe_outside(outside), "it" if len(outside) == 1 else "them"),
            gpus_outside=outside,
        )
    ours = holder_entries({p: g for p, g in held.items() if p in state.old_pids})
    state.foreign_holders = holder_entries(
        {p: g for p, g in held.items() if p not in state.old_pids and wanted & set(g)}
    )
    if state.foreign_holders and not state.kill_gpu_holders:
        raise AgentError(
            "refused",
            "GPUs are held by processes outside session '%s''s run: %s; stop them, or "
            "deploy with --kill-gpu-holders"
            % (state.session, describe_processes(state.foreign_holders)),
            holders=state.foreign_holders,
        )
    if state.foreign_holders:
        return "warning", "held by %s: killed with the old run" % describe_processes(
            state.foreign_holders
        )
    # Not this run's GPUs, but worth saying (doctor shows it): others use them from outside.
    rest = set(d["index"] for d in devices) - wanted
    elsewhere = outside_of(rest, devices, held, contexts)
    note = "; used from outside, not by this run: %s" % describe_outside(elsewhere)
    note = note if elsewhere else ""
    others = {p: g for p, g in watchers.items() if p not in state.old_pids}
    if others:  # never blocks, never killed: said so
        note += "; %s (no GPU in use, left alone)" % describe_watchers(others)
    if ours:
        return "ok", "held by the old run (%s)%s" % (describe_holders(ours), note)
    return "ok", "free" + note


def gpu_facts(state, devices_query=None, contexts_query=None, warn=True):
    """(devices, users here, watchers here, contexts) from the queries started (None:
    query now). nvidia-smi failing (a driver fault, a lost GPU, no answer) refuses."""
    devices, error = gpu_devices(devices_query)
    if error:
        raise AgentError("refused", "cannot read the GPUs: %s" % error)
    held, watchers = gpu_holders(devices=devices)
    contexts, contexts_error = gpu_contexts(contexts_query)
    if contexts_error and warn:
        state.warnings.append("cannot count the GPUs' contexts: %s" % contexts_error)
    return devices, held, watchers, contexts


def outside_of(wanted, devices, held, contexts):
    """GPUs of `wanted` used from outside: memory and no user here, or more contexts than
    users here."""
    outside = used_outside(devices, held, wanted)
    return outside + shared_from_outside(devices, held, wanted, contexts)

# mypy: allow-untyped-calls
"""GPUs as the container sees them: `nvidia-smi` for device facts and context counts (never
PIDs: inside a container they are the host's), /proc/<pid>/fd for who holds a device."""

from __future__ import annotations

import os
import re

from launcher.agent.base import Started, as_int, run, which
from launcher.agent.processes import proc_table, process_command

# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# --------------------------------------------------------------------------- GPUs


GPU_NAMES_ARGS = ["-L"]
# Device facts only. Inside a container nvidia-smi's process list carries HOST PIDs (the driver
# is not PID-namespace aware: NVIDIA/nvidia-docker#179, #1460, #1483), which name nothing or,
# worse, an unrelated process here: launcher never asks nvidia-smi for processes, so no PID it
# signals can have come from there. Who holds a GPU is read from /proc (gpu_device_holders).
GPU_QUERY_ARGS = [
    "--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu",
    "--format=csv,noheader,nounits",
]
# How many contexts each GPU has and their memory, without PIDs: more contexts on a GPU than
# processes here with it open means someone outside uses it too, while the old run holds it.
GPU_CONTEXTS_ARGS = ["--query-compute-apps=gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
GPU_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")
# Memory in use on a GPU (MiB) above which someone uses it: an idle GPU shows 0 to a few MiB,
# and the smallest CUDA context takes a few hundred.
GPU_IDLE_MIB = 256
GPU_RELEASE_WAIT = 10.0  # s the driver may take to free an exited process's memory


def start_gpu_queries(names, devices, contexts=False):
    """The nvidia-smi queries asked for, started at once (each can take a good part of a
    second on a real 8-GPU host) for gpu_names, gpu_devices and gpu_contexts to read."""
    binary = which("nvidia-smi")
    started = {}
    if binary and names:
        started["names"] = Started([binary, *GPU_NAMES_ARGS])
    if binary and devices:
        started["devices"] = Started([binary, *GPU_QUERY_ARGS])
    if binary and contexts:
        started["contexts"] = Started([binary, *GPU_CONTEXTS_ARGS])
    return started


def gpu_contexts(started=None):
    """({GPU uuid: [MiB of each context]}, error): no PIDs are asked for or kept."""
    binary = which("nvidia-smi")
    if not binary:
        return {}, "nvidia-smi not found"
    rc, out, err = started.result() if started else run([binary, *GPU_CONTEXTS_ARGS])
    if rc != 0:
        return {}, (err.strip() or out.strip() or "nvidia-smi exited %d" % rc)
    contexts: dict[str, list[Any]] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0]:
            contexts.setdefault(parts[0], []).append(as_int(parts[1]))
    return contexts, None


def shared_from_outside(devices, held, wanted, contexts):
    """GPUs of `wanted` held here that have more contexts than processes here holding them:
    someone outside the container uses them too (stopping the old run would not free them)."""
    shared = []
    for d in devices:
        here = sum(1 for gpus in held.values() if d["index"] in gpus)
        count = len(contexts.get(d.get("uuid") or "", []))
        if d["index"] in wanted and here and count > here:
            shared.append(
                {"index": d["index"], "used_mib": d["used_mib"], "contexts": count, "here": here}
            )
    return shared


def gpu_names(started=None):
    """(names, error): one name per visible GPU from `nvidia-smi -L` (or its `started` run)."""
    binary = which("nvidia-smi")
    if not binary:
        return [], "nvidia-smi not found"
    rc, out, err = started.result() if started else run([binary, *GPU_NAMES_ARGS])
    if rc != 0:
        return [], (err.strip() or out.strip() or "nvidia-smi -L exited %d" % rc)
    names = []
    for line in out.splitlines():
        match = re.match(r"^GPU \d+: (.*?)(?: \(UUID: [^)]*\))?\s*$", line)
        if match:
            names.append(match.group(1))
    return names, None


def gpu_devices(started=None, timeout=30.0):
    """(devices, error): per GPU its index, memory used and total (MiB) and utilization (%)."""
    binary = which("nvidia-smi")
    if not binary:
        return [], "nvidia-smi not found"
    if started is not None:
        rc, out, err = started.result()
    else:
        rc, out, err = run([binary, *GPU_QUERY_ARGS], timeout=timeout)
    if rc != 0:
        return [], (err.strip() or out.strip() or "nvidia-smi exited %d" % rc)
    devices = []
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 5 or as_int(parts[0]) is None:
            continue
        devices.append(
            {
                "index": int(parts[0]),
                "uuid": parts[1],
                "used_mib": as_int(parts[2]),  # [N/A] on some boards: None
                "total_mib": as_int(parts[3]),
                "util": as_int(parts[4]),
            }
        )
    return devices, None


def gpu_device_holders(pids=None):
    """{pid: [GPU index, ...]}: the processes of this container with /dev/nvidia<N> open (what
    `fuser -v /dev/nvidia*` finds; CUDA keeps one handle per device it uses), container PIDs.
    `pids`: look at these only."""
    held = {}
    me = os.getpid()
    for pid in pids if pids is not None else proc_table():
        if pid == me:
            continue
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        gpus = set()
        for fd in fds:
            try:
                match = GPU_DEVICE.match(os.readlink(os.path.join(fd_dir, fd)))
            except OSError:
                continue
            if match:
                gpus.add(int(match.group(1)))
        if gpus:
            held[pid] = sorted(gpus)
    return held


def held_gpus(held):
    return set(g for gpus in held.values() for g in gpus)


def used_outside(devices, held, wanted):
    """GPUs of `wanted` with memory in use that no process of this container holds: another
    container (Proxmox passes the same /dev/nvidia* to several) or the host uses them."""
    mine = held_gpus(held)
    return [
        {"index": d["index"], "used_mib": d["used_mib"]}
        for d in devices
        if d["index"] in wanted and d["index"] not in mine and (d["used_mib"] or 0) > GPU_IDLE_MIB
    ]


def describe_outside(outside):
    """`GPU 3 (22512 MiB in use)`: GPUs used from outside the container."""
    parts = []
    for d in outside:
        if "contexts" in d:
            parts.append(
                "GPU %d (%s MiB in use by %d processes, %d of them in this container)"
                % (d["index"], d["used_mib"], d["contexts"], d["here"])
            )
        else:
            parts.append("GPU %d (%s MiB in use)" % (d["index"], d["used_mib"]))
    return ", ".join(parts)


def holder_entries(held):
    """Holders for answers and messages: container PID, name, GPUs, command line."""
    return [
        {"pid": pid, "name": proc_name(pid), "gpus": gpus, "command": process_command(pid)}
        for pid, gpus in sorted(held.items())
    ]


def proc_name(pid):
    try:
        with open("/proc/%d/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "?"


def describe_holders(holders):
    """`pid 106 python3 (8 GPUs)`: one entry per process, however many GPUs it holds."""
    return ", ".join(
        "pid %s %s (%d GPU%s)"
        % (h["pid"], h["name"], len(h["gpus"]), "" if len(h["gpus"]) == 1 else "s")
        for h in holders
    )


def wanted_gpus(gpus, env=None):
    """The GPU indexes a run of `gpus` GPUs uses: CUDA_VISIBLE_DEVICES when it lists indexes,
    else the first `gpus`."""
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", "")
    listed = [as_int(part.strip()) for part in visible.split(",") if part.strip()]
    if listed and all(i is not None for i in listed):
        return set(listed)
    return set(range(max(gpus, 0)))


def gpu_report(wanted, holders=True, started=None, devices_started=None):
    if wanted <= 0:
        return {"visible": 0, "names": [], "error": None, "holders": [], "skipped": True,
                "outside": []}  # fmt: skip
    names, error = gpu_names(started)
    held, outside = {}, []
    if holders and not error:
        devices, error = gpu_devices(devices_started)
        held = gpu_device_holders()
        outside = used_outside(devices, held, set(range(len(names))))
    return {
        "visible": len(names),
        "names": names,
        "error": error,
        "holders": holder_entries(held),
        "skipped": False,
        "outside": outside,
    }


def poll_gpus(want, run, started):
    """What a poll tells about the run's GPUs, small: how many it should hold, those its
    processes hold, and per GPU [index, utilization %, memory used MiB]."""
    held = gpu_device_holders(run)
    devices, error = gpu_devices(started)
    return {
        "want": want,
        "held": sorted(held_gpus(held)),
        "devices": [[d["index"], d["util"], d["used_mib"]] for d in devices],
        "error": error[:200] if error else None,
    }

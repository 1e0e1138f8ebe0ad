# mypy: allow-untyped-calls
"""GPUs as the container sees them: `nvidia-smi` for device facts and context counts (never
PIDs: inside a container they are the host's), /proc/<pid>/fd for who holds a device.

Two facts of real hosts shape it (docs/gpus.md):
- `/dev/nvidia<N>` carries the kernel's minor number, not nvidia-smi's index: a container given
  the host's GPUs 6 and 7 has /dev/nvidia6 and /dev/nvidia7 and sees index 0 and 1
  (NVIDIA/nvidia-docker#1432, #907). Minors are tied to indexes through the PCI bus id:
  `--query-gpu=pci.bus_id` per index, `Device Minor` in /proc/driver/nvidia/gpus/<bus>/information
  (or `Minor Number` in `nvidia-smi -q` where the container's /proc lacks it).
- An open device file is not a GPU in use: NVML users (nvtop, pynvml, wandb's monitor, DCGM)
  open every /dev/nvidia* with no CUDA context. A process uses GPU N when it holds
  /dev/nvidia-uvm and /dev/nvidia<N> (CUDA opens both); holding device files without
  /dev/nvidia-uvm makes it a watcher, which never blocks, is never killed and never counts.
"""

from __future__ import annotations

import os
import re
import time

from launcher.agent.base import AgentError
from launcher.agent.nvsmi import (
    Part,
    Query,
    answer_path,
    answer_result,
    describe_failure,
    read_answer,
)
from launcher.agent.processes import proc_table, process_command

# --------------------------------------------------------------------------- GPUs


GPU_NAMES_ARGS = ["-L"]
# Device facts only. Inside a container nvidia-smi's process list carries HOST PIDs (the driver
# is not PID-namespace aware: NVIDIA/nvidia-docker#179, #1460, #1483), which name nothing or,
# worse, an unrelated process here: launcher never asks nvidia-smi for processes, so no PID it
# signals can have come from there. Who holds a GPU is read from /proc (gpu_holders).
# One call for all device facts, names included: without the persistence daemon every call
# can take seconds, and launcher runs one at a time (nvsmi). `-L` only for MIG ids.
GPU_QUERY_ARGS = [
    "--query-gpu=index,uuid,pci.bus_id,memory.used,memory.total,utilization.gpu,name",
    "--format=csv,noheader,nounits",
]
# How many contexts each GPU has and their memory, without PIDs: more contexts on a GPU than
# processes here using it means someone outside uses it too, while the old run holds it.
GPU_CONTEXTS_ARGS = ["--query-compute-apps=gpu_uuid,used_memory", "--format=csv,noheader,nounits"]
# Minor numbers where /proc/driver/nvidia is not there to read: asked once, kept.
GPU_DETAILS_ARGS = ["-q"]
DETAILS_LIMIT = 4 * 1024 * 1024  # bytes: -q takes a few KB per GPU
PROC_GPUS = "/proc/driver/nvidia/gpus"
GPU_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")
UVM_DEVICE = "/dev/nvidia-uvm"
# Memory in use on a GPU (MiB) above which someone uses it: an idle GPU shows 0 to a few MiB,
# and the smallest CUDA context takes a few hundred.
GPU_IDLE_MIB = 256
GPU_RELEASE_WAIT = 10.0  # s the driver may take to free an exited process's memory
STALE_AFTER = 60.0  # s after which a kept answer tells nothing about now
QUERY_TIMEOUT = 30.0  # s a deploy, doctor or stop waits for nvidia-smi


def start_gpu_queries(names, devices, contexts=False, timeout=QUERY_TIMEOUT):
    """The nvidia-smi queries asked for, run one after the other by one runner (nvsmi.Query),
    for gpu_names, gpu_devices and gpu_contexts to read: {name: Part}."""
    wanted = [("names", names, GPU_NAMES_ARGS), ("devices", devices, GPU_QUERY_ARGS),
              ("contexts", contexts, GPU_CONTEXTS_ARGS)]  # fmt: skip
    tails = [(key, tail) for key, asked, tail in wanted if asked]
    if not tails:
        return {}
    if devices and needs_details():
        tails.append(("details", GPU_DETAILS_ARGS))
    limits = {i: DETAILS_LIMIT for i, (key, _) in enumerate(tails) if key == "details"}
    query = Query([t for _, t in tails], timeout=timeout, limits=limits)
    return {key: Part(query, i) for i, (key, _) in enumerate(tails)}


def asked(started, key):
    """The Part of `started` for `key`, or a query of its own, started now."""
    if started is not None:
        return started
    return start_gpu_queries(key == "names", key == "devices", key == "contexts")[key]


# --------------------------------------------------------------------------- values


def number(text, high=None):
    """An integer nvidia-smi gave, or None for anything else: `[N/A]`, `[Not Supported]`,
    `ERR!`, garbage, out of range. Unknown is never 0."""
    text = text.strip()
    if not text.isdigit():
        return None
    value = int(text)
    return value if high is None or value <= high else None


def norm_bus(text):
    """`0000:18:00.0` for nvidia-smi's `00000000:18:00.0` and /proc's `0000:18:00.0`."""
    match = re.match(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$",
                     text.strip())  # fmt: skip
    if not match:
        return None
    return "%04x:%s" % (int(match.group(1), 16), match.group(2).lower())


def parse_devices(out):
    """Rows of --query-gpu (GPU_QUERY_ARGS): one dict per well-formed row, a repeated index
    dropped; values nvidia-smi did not give are None."""
    devices, seen = [], set()
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 7:
            continue
        index = number(parts[0], 1023)
        if index is None or index in seen or not parts[1].startswith("GPU-"):
            continue
        seen.add(index)
        devices.append(
            {
                "index": index,
                "uuid": parts[1],
                "bus": norm_bus(parts[2]),
                "used_mib": number(parts[3]),
                "total_mib": number(parts[4]),
                "util": number(parts[5], 100),
                "name": ",".join(parts[6:]).strip(),
            }
        )
    return devices


# --------------------------------------------------------------------------- minor numbers


def proc_minors(root=PROC_GPUS):
    """{bus: minor} from /proc/driver/nvidia/gpus/<bus>/information (`Device Minor`)."""
    minors: dict[str, int] = {}
    try:
        entries = os.listdir(root)
    except OSError:
        return minors
    for entry in entries:
        try:
            with open(os.path.join(root, entry, "information")) as f:
                text = f.read(8192)
        except OSError:
            continue
        minor = re.search(r"^Device Minor:\s*(\d+)\s*$", text, re.M)
        bus = norm_bus(entry)
        if minor and bus:
            minors[bus] = int(minor.group(1))
    return minors


def details_minors(text):
    """{bus: minor} from `nvidia-smi -q`: a `GPU 00000000:18:00.0` heading per GPU, its
    `Minor Number : 6` below (`N/A` on some platforms: left out)."""
    minors, bus = {}, None
    for line in text.splitlines():
        heading = re.match(r"^GPU ([0-9A-Fa-f:.]+)\s*$", line)
        if heading:
            bus = norm_bus(heading.group(1))
            continue
        minor = re.match(r"^\s+Minor Number\s*:\s*(\d+)\s*$", line)
        if minor and bus:
            minors[bus] = int(minor.group(1))
    return minors


def kept_details(state_dir=None):
    answer = read_answer(answer_path(GPU_DETAILS_ARGS, state_dir))
    if answer is None:
        return {}
    rc, out, _ = answer_result(answer)
    return details_minors(out) if rc == 0 else {}


def minor_map(proc_root=PROC_GPUS, state_dir=None):
    """{bus: minor}: /proc first, the kept `nvidia-smi -q` for what /proc lacks."""
    found = kept_details(state_dir)
    found.update(proc_minors(proc_root))
    return found


def needs_details(proc_root=PROC_GPUS, state_dir=None):
    """Whether `nvidia-smi -q` must be asked: the minors of some GPU nvidia-smi last listed
    (or of any GPU, before its first answer) are known nowhere."""
    known = minor_map(proc_root, state_dir)
    last = read_answer(answer_path(GPU_QUERY_ARGS, state_dir))
    buses = [d["bus"] for d in parse_devices(answer_result(last)[1])] if last else []
    return not known or any(b not in known for b in buses if b)


def with_minors(devices, minors):
    """The devices with their minor number; when no GPU's is known at all, the minor is taken
    to be the index (true on a host whose GPUs are all in the container, in bus order)."""
    known = any(d["bus"] in minors for d in devices)
    for d in devices:
        d["minor"] = minors.get(d["bus"]) if known else d["index"]
    return devices


# --------------------------------------------------------------------------- nvidia-smi


def gpu_contexts(started=None):
    """({GPU uuid: [MiB of each context]}, error): no PIDs are asked for or kept."""
    rc, out, err = asked(started, "contexts").result()
    if rc != 0:
        return {}, describe_failure(rc, out, err)[1]
    contexts: dict[str, list[Any]] = {}
    for line in out.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 2 and parts[0].startswith("GPU-"):
            contexts.setdefault(parts[0], []).append(number(parts[1]))
    return contexts, None


def shared_from_outside(devices, held, wanted, contexts):
    """GPUs of `wanted` used here that have more contexts than processes here using them:
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
    """(names, error, listing): one name per visible GPU from `nvidia-smi -L`, and its text
    (MIG devices are listed under their GPU)."""
    rc, out, err = asked(started, "names").result()
    if rc != 0:
        return [], describe_failure(rc, out, err)[1], ""
    names = []
    for line in out.splitlines():
        match = re.match(r"^GPU \d+: (.*?)(?: \(UUID: [^)]*\))?\s*$", line)
        if match:
            names.append(match.group(1))
    return names, None, out


def gpu_devices(started=None):
    """(devices, error): per GPU its index, UUID, bus id, minor number, memory used and total
    (MiB) and utilization (%); a value nvidia-smi did not give is None."""
    rc, out, err = asked(started, "devices").result()
    if rc != 0:
        return [], describe_failure(rc, out, err)[1]
    return with_minors(parse_devices(out), minor_map()), None


# --------------------------------------------------------------------------- holders


def scan_device_files(pids=None):
    """{pid: (minors of /dev/nvidia<N> it has open, whether it has /dev/nvidia-uvm open)}:
    the container's processes with a GPU device file open, container PIDs (what
    `fuser -v /dev/nvidia*` finds). `pids`: look at these only."""
    found = {}
    me = os.getpid()
    for pid in pids if pids is not None else proc_table():
        if pid == me:
            continue
        fd_dir = "/proc/%d/fd" % pid
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        minors, uvm = set(), False
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            match = GPU_DEVICE.match(target)
            if match:
                minors.add(int(match.group(1)))
            elif target == UVM_DEVICE:
                uvm = True
        if minors:
            found[pid] = (minors, uvm)
    return found


def index_of_minor(devices):
    """{minor: index}; with no devices known (nvidia-smi failed), the last kept answer's, or
    the minor taken for the index."""
    if not devices:
        last = read_answer(answer_path(GPU_QUERY_ARGS))
        rc, out, _ = answer_result(last) if last else (1, "", "")
        devices = with_minors(parse_devices(out), minor_map()) if rc == 0 else []
    if not devices:
        return None
    return {d["minor"]: d["index"] for d in devices if d.get("minor") is not None}


def gpu_holders(pids=None, devices=None, scan=None):
    """({pid: [GPU index]} of processes using GPUs, {pid: [GPU index]} of watchers): a user
    holds /dev/nvidia-uvm and the device files of its GPUs (a CUDA context), a watcher only
    device files (NVML: nvtop, nvidia-smi, wandb's monitor). `scan`: scan_device_files's."""
    mapping = index_of_minor(devices or [])
    users: dict[int, list[int]] = {}
    watchers: dict[int, list[int]] = {}
    if scan is None:
        scan = scan_device_files(pids)
    elif pids is not None:
        scan = dict((pid, scan[pid]) for pid in pids if pid in scan)
    for pid, (minors, uvm) in scan.items():
        if mapping is None:
            indexes = sorted(minors)
        else:
            indexes = sorted(mapping[m] for m in minors if m in mapping)
        if indexes:
            (users if uvm else watchers)[pid] = indexes
    return users, watchers


def held_gpus(held):
    return set(g for gpus in held.values() for g in gpus)


def used_outside(devices, held, wanted):
    """GPUs of `wanted` with memory in use that no process of this container uses: another
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


def span(gpus):
    """`0-7`, `0, 2, 5`: GPU indexes, short."""
    items = sorted(gpus)
    if len(items) > 2 and items == list(range(items[0], items[-1] + 1)):
        return "%d-%d" % (items[0], items[-1])
    return ", ".join(str(g) for g in items)


def describe_watchers(watchers, limit=4):
    """`nvtop (pid 812) watches GPUs 0-7`: processes with device files open and no context."""
    parts = [
        "%s (pid %d) watches GPU%s %s"
        % (proc_name(pid), pid, "" if len(gpus) == 1 else "s", span(gpus))
        for pid, gpus in sorted(watchers.items())[:limit]
    ]
    more = len(watchers) - limit
    return ", ".join(parts) + (" and %d more" % more if more > 0 else "")


# --------------------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def mig_parents(listing):
    """{MIG uuid: index of its GPU} from `nvidia-smi -L` (MIG devices come under their GPU)."""
    parents, index = {}, None
    for line in listing.splitlines():
        gpu = re.match(r"^GPU (\d+):", line)
        if gpu:
            index = int(gpu.group(1))
            continue
        mig = re.search(r"\(UUID: (MIG-[^)\s]+)\)", line)
        if mig and index is not None:
            parents[mig.group(1)] = index
    return parents


def resolve_visible(entry, devices, listing):
    """The GPU index a CUDA_VISIBLE_DEVICES entry names, or why it names none. Integers are
    read as nvidia-smi's indexes (CUDA's own order is the same with CUDA_DEVICE_ORDER=PCI_BUS_ID);
    `GPU-…` is a UUID or a unique prefix of one, as CUDA takes it; `MIG-…` a MIG device (its
    GPU's index), `MIG-GPU-<uuid>/…` the older form."""
    indexes = [d["index"] for d in devices]
    if entry.isdigit():
        if devices and int(entry) not in indexes:
            return None, "no GPU with index %s here (%d visible)" % (entry, len(devices))
        return int(entry), None
    if entry.startswith("MIG-GPU-"):
        entry = entry[len("MIG-") :].split("/")[0]
    if entry.startswith("GPU-"):
        found = [d["index"] for d in devices if d.get("uuid", "").startswith(entry)]
        if len(found) == 1:
            return found[0], None
        return None, "%s matches %s GPU here" % (entry, "more than one" if found else "no")
    if entry.startswith("MIG-"):
        parents = mig_parents(listing)
        if entry in parents:
            return parents[entry], None
        return None, "no MIG device %s in nvidia-smi -L" % entry
    return None, "%r is neither an index, a GPU-… UUID nor a MIG-… id" % entry


def wanted_gpus(gpus, env=None, devices=None, listing=""):
    """The GPU indexes a run of `gpus` GPUs uses: those CUDA_VISIBLE_DEVICES names (indexes,
    UUIDs, MIG ids), else the first `gpus` of the container's. A name that resolves to no GPU
    here is a configuration error (CUDA would silently drop it and every name after it)."""
    visible = (env or {}).get("CUDA_VISIBLE_DEVICES", "")
    entries = [part.strip() for part in visible.split(",") if part.strip()]
    if not entries:
        return set(range(max(gpus, 0)))
    wanted, problems = set(), []
    for entry in entries:
        index, problem = resolve_visible(entry, devices or [], listing)
        if problem:
            problems.append(problem)
        else:
            wanted.add(index)
    if problems:
        raise AgentError("invalid", "CUDA_VISIBLE_DEVICES=%s: %s" % (visible, "; ".join(problems)))
    return wanted


# --------------------------------------------------------------------------- reports


def gpu_report(wanted, holders=True, devices_started=None):
    """What doctor and a deploy's resources check show: the GPUs' names (from the device
    query), nvidia-smi's failure named, and with `holders` who uses them."""
    if wanted <= 0:
        return {"visible": 0, "names": [], "error": None, "holders": [], "skipped": True,
                "outside": [], "watchers": ""}  # fmt: skip
    devices, error = gpu_devices(devices_started)
    held, watchers, outside = {}, {}, []
    if holders and not error:
        held, watchers = gpu_holders(devices=devices)
        outside = used_outside(devices, held, set(d["index"] for d in devices))
    return {
        "visible": len(devices),
        "names": [d["name"] for d in devices],
        "error": error,
        "holders": holder_entries(held),
        "skipped": False,
        "outside": outside,
        "watchers": describe_watchers(watchers) if watchers else "",
    }


POLL_WATCHERS = 4  # watchers named in a poll's answer at most


def poll_query():
    """The poll's query: device facts (and -q when minors are unknown)."""
    return start_gpu_queries(False, True)["devices"].query


def poll_gpus(want, run, query, wait):
    """What a poll tells about the run's GPUs, small: how many it should hold, those its
    processes use, per GPU [index, utilization %, memory used MiB] (None: unknown), the
    answer's age when it is an earlier query's (this one still runs), and watchers."""
    # Waited for only when it is this poll's own and the last one answered within `wait`: a
    # slow driver's (20 s) or a hung one's is not, and the last answer serves, with its age.
    last = query.latest(0)
    took = float(last.get("ended") or 0) - float(last.get("began") or 0) if last else 0.0
    query.wait(wait if query.proc is not None and took <= wait else 0.0, 0)
    answer = query.answer(0)
    fresh = answer is not None
    if answer is None:
        answer = query.latest(0)
    devices, error, age = [], None, None
    if answer is None:
        error = query.why_none()[1]
    else:
        age = max(0.0, time.time() - float(answer.get("ended") or 0))
        rc, out, err = answer_result(answer)
        if rc != 0:
            error = describe_failure(rc, out, err)[1]
        elif age > STALE_AFTER and not fresh:
            error = "nvidia-smi's last answer is %d s old: %s" % (age, query.why_none()[1])
        else:
            devices = with_minors(parse_devices(out), minor_map())
    scan = scan_device_files()  # watchers anywhere in the container, users in the run
    users = gpu_holders(run, devices, scan)[0]
    all_watchers = gpu_holders(None, devices, scan)[1]
    result = {
        "want": want,
        "held": sorted(held_gpus(users)),
        "devices": [[d["index"], d["util"], d["used_mib"]] for d in devices],
        "error": error[:200] if error else None,
    }
    if devices and not fresh:
        result["age"] = round(age or 0.0, 1)
    if all_watchers:
        shown = sorted(all_watchers.items())[:POLL_WATCHERS]
        result["watchers"] = [[pid, proc_name(pid)[:32], gpus] for pid, gpus in shown]
    return result


# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

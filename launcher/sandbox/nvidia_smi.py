#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for nvidia-smi inside sandbox containers, answering as the real one does there.

The container has N GPUs, /dev/nvidia0..N-1 (N is in /etc/sandbox-gpus). The driver's view is
the shared directory /var/lib/sandbox-gpu (see launcher/sandbox/gpus.py): one record per process
that uses a GPU, in the pool of GPUs this container shares with others (/etc/sandbox-gpu-pool),
with its host PID and its memory and utilization per device.

As inside a real container, the processes it lists carry their HOST PIDs: the NVIDIA driver is
not PID-namespace aware (NVIDIA/nvidia-docker#1483, a maintainer: "anytime you query it for the
set of processes that are using GPUs, you will always get the host pids, not the container
pids"; also #179, #1460), and it lists the processes of every container sharing the GPUs. Names
are looked up in the container's own /proc, so they come out as `[Not Found]` (or as whatever
container process has that number). /etc/sandbox-gpu-pids `bare-metal` reports each process's
own PID instead, as on a host without containers. Supported:

  nvidia-smi                      a short table
  nvidia-smi -L                   one line per GPU
  nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]
  nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]
"""

import contextlib
import json
import os
import sys
import time
import uuid

DRIVER_DIR = "/var/lib/sandbox-gpu"
HOST_PROC = DRIVER_DIR + "/hostproc"
COUNT_FILE = "/etc/sandbox-gpus"
POOL_FILE = "/etc/sandbox-gpu-pool"
PIDS_FILE = "/etc/sandbox-gpu-pids"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell"
MEMORY_TOTAL_MIB = 97887
DRIVER_FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
NOT_FOUND = "[Not Found]"

GPU_FIELDS = {
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "memory.free",
    "utilization.gpu",
    "pci.bus_id",
}
APP_FIELDS = {"pid", "process_name", "used_memory", "gpu_uuid", "gpu_bus_id", "name"}
UNITS = {
    "memory.used": " MiB",
    "memory.total": " MiB",
    "memory.free": " MiB",
    "used_memory": " MiB",
    "utilization.gpu": " %",
}


def read_word(path, default):
    try:
        with open(path) as f:
            return f.read().strip() or default
    except OSError:
        return default


def gpu_count():
    try:
        return int(read_word(COUNT_FILE, "0"))
    except ValueError:
        return 0


def pool():
    return read_word(POOL_FILE, "host")


def gpu_uuid(index):
    # The same physical GPU has the same UUID in every container of its pool.
    seed = "sandbox-gpu:%s:%d" % (pool(), index)
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, seed))


def start_time(proc, pid):
    """Field 22 of /proc/PID/stat (start time since boot): the same in every PID namespace."""
    try:
        with open("%s/%s/stat" % (proc, pid)) as f:
            return f.read().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def process_name(pid):
    """Looked up in the container's /proc, as the real nvidia-smi does with a host PID."""
    try:
        return os.readlink("/proc/%s/exe" % pid)
    except OSError:
        pass
    try:
        with open("/proc/%s/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return NOT_FOUND


def still_held(record, host_proc, check=True):
    """Whether the driver still counts a record's memory: an exited process's until its
    released_at (the driver frees it a moment after the exit), a running one's while its
    process lives (by host PID and start time; `check` False: no host /proc to look in)."""
    released = record.get("released_at")
    if released is not None:
        return time.time() < released
    return not check or start_time(host_proc, record.get("host_pid")) == record.get("start")


def records():
    """Live records of the pool: (pid as reported, {gpu index: (util %, MiB)}).
    A record whose process is gone (by host PID and start time) or whose release lag is over
    is removed, as the driver frees what an exited process held."""
    directory = os.path.join(DRIVER_DIR, "pools", pool())
    bare = read_word(PIDS_FILE, "host") == "bare-metal"
    check = os.path.isdir(HOST_PROC + "/1")
    found: list[tuple[int, dict[int, tuple[int, int]]]] = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                record = json.load(f)
            host_pid = int(record["host_pid"])
            devices = {int(k): (int(v[0]), int(v[1])) for k, v in record["devices"].items()}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        if not still_held(record, HOST_PROC, check):
            with contextlib.suppress(OSError):
                os.unlink(path)
            continue
        found.append((int(record["pid"]) if bare else host_pid, devices))
    return found


def holders(count):
    """(gpu index, pid, util, MiB) for every process using a GPU, sorted."""
    held = []
    for pid, devices in records():
        for gpu, (util, mib) in devices.items():
            if 0 <= gpu < count:
                held.append((gpu, pid, util, mib))
    return sorted(held)


def parse_format(spec):
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or parts[0] != "csv":
        raise ValueError("only --format=csv is supported")
    return "noheader" not in parts, "nounits" not in parts


def render(fields, rows, header, units):
    out = []
    if header:
        out.append(", ".join(f + (" [MiB]" if UNITS.get(f) == " MiB" else "") for f in fields))
    for row in rows:
        values = []
        for f in fields:
            value = str(row[f])
            if units and f in UNITS:
                value += UNITS[f]
            values.append(value)
        out.append(", ".join(values))
    return "\n".join(out) + ("\n" if out else "")


def gpu_rows(count, held):
    rows = []
    for i in range(count):
        users = [(util, mib) for gpu, _, util, mib in held if gpu == i]
        used = sum(mib for _, mib in users)
        rows.append(
            {
                "index": i,
                "uuid": gpu_uuid(i),
                "name": GPU_NAME,
                "memory.used": used,
                "memory.total": MEMORY_TOTAL_MIB,
                "memory.free": MEMORY_TOTAL_MIB - used,
                "utilization.gpu": min(100, sum(util for util, _ in users)),
                "pci.bus_id": "00000000:%02X:00.0" % (0x18 + i),
            }
        )
    return rows


def app_rows(held):
    rows = []
    for gpu, pid, _, mib in held:
        rows.append(
            {
                "pid": pid,
                "process_name": process_name(pid),
                "name": process_name(pid),
                "used_memory": mib,
                "gpu_uuid": gpu_uuid(gpu),
                "gpu_bus_id": "00000000:%02X:00.0" % (0x18 + gpu),
            }
        )
    return rows


def table(count, held):
    lines = ["+" + "-" * 60 + "+", "| %-58s |" % "NVIDIA-SMI 575.57.08 (sandbox stand-in)"]
    for row in gpu_rows(count, held):
        lines.append(
            "| %d  %-25s %3d %% %6d MiB / %6d MiB |"
            % (row["index"], GPU_NAME[:25], row["utilization.gpu"], row["memory.used"],
               MEMORY_TOTAL_MIB)
        )  # fmt: skip
    lines.append("+" + "-" * 60 + "+")
    lines.append("| %-58s |" % "Processes:")
    if not held:
        lines.append("| %-58s |" % " No running processes found")
    for gpu, pid, _, mib in held:
        lines.append("| %3d %8d  %-33s %6d MiB |" % (gpu, pid, process_name(pid)[-32:], mib))
    lines.append("+" + "-" * 60 + "+")
    return "\n".join(lines) + "\n"


def option_value(args, i, name):
    arg = args[i]
    if arg.startswith(name + "="):
        return arg[len(name) + 1 :], i + 1
    if i + 1 >= len(args):
        raise ValueError("option %s needs a value" % name)
    return args[i + 1], i + 2


def main(argv):
    list_gpus = False
    query_gpu = query_apps = None
    fmt = None
    i = 0
    try:
        while i < len(argv):
            arg = argv[i]
            if arg in ("-L", "--list-gpus"):
                list_gpus = True
                i += 1
            elif arg.startswith("--query-gpu"):
                query_gpu, i = option_value(argv, i, "--query-gpu")
            elif arg.startswith("--query-compute-apps"):
                query_apps, i = option_value(argv, i, "--query-compute-apps")
            elif arg.startswith("--format"):
                fmt, i = option_value(argv, i, "--format")
            else:
                raise ValueError("Invalid combination of input arguments: %s" % arg)
    except ValueError as exc:
        sys.stderr.write("%s\nPlease run 'nvidia-smi -h' for help.\n" % exc)
        return 2

    count = gpu_count()
    if count <= 0:
        sys.stdout.write(
            DRIVER_FAILED + " Make sure that the latest NVIDIA driver is installed and running.\n\n"
        )
        return 9

    if list_gpus:
        for n in range(count):
            sys.stdout.write("GPU %d: %s (UUID: %s)\n" % (n, GPU_NAME, gpu_uuid(n)))
        return 0

    if query_gpu is not None or query_apps is not None:
        try:
            header, units = parse_format(fmt or "")
        except ValueError as exc:
            sys.stderr.write("%s\n" % exc)
            return 2
        query = query_gpu if query_gpu is not None else query_apps or ""
        known = GPU_FIELDS if query_gpu is not None else APP_FIELDS
        fields = [f.strip() for f in query.split(",") if f.strip()]
        bad = [f for f in fields if f not in known]
        if bad or not fields:
            sys.stderr.write('Field "%s" is not a valid field to query.\n' % ",".join(bad))
            return 2
        held = holders(count)
        rows = gpu_rows(count, held) if query_gpu is not None else app_rows(held)
        sys.stdout.write(render(fields, rows, header, units))
        return 0

    sys.stdout.write(table(count, holders(count)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

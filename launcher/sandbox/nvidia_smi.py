#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for nvidia-smi inside sandbox containers.

The container has N fake GPU device files, /var/lib/sandbox-gpu/nvidia0..N-1 (N is in
/etc/sandbox-gpus). A process "holds a GPU" while it has that GPU's file open, which is
found by scanning /proc/*/fd, the same way memory held by a live process is found on a
real host. Supported:

  nvidia-smi                      a short table
  nvidia-smi -L                   one line per GPU
  nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]
  nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]
"""

import os
import socket
import sys
import uuid

GPU_DIR = "/var/lib/sandbox-gpu"
COUNT_FILE = "/etc/sandbox-gpus"
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell"
MEMORY_TOTAL_MIB = 97887
MEMORY_PER_PROCESS_MIB = 22512
DRIVER_FAILED = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."

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


def gpu_count():
    try:
        with open(COUNT_FILE) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def gpu_uuid(index):
    seed = "sandbox-gpu:%s:%d" % (socket.gethostname(), index)
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, seed))


def gpu_paths(count):
    return {os.path.join(GPU_DIR, "nvidia%d" % i): i for i in range(count)}


def process_name(pid):
    try:
        return os.readlink("/proc/%s/exe" % pid)
    except OSError:
        pass
    try:
        with open("/proc/%s/comm" % pid) as f:
            return f.read().strip()
    except OSError:
        return "[unknown]"


def holders(count):
    """Return a sorted list of (gpu index, pid) for every open GPU file."""
    paths = gpu_paths(count)
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fd_dir = "/proc/%s/fd" % entry
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in paths:
                found.add((paths[target], int(entry)))
    return sorted(found)


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
        users = [pid for gpu, pid in held if gpu == i]
        used = MEMORY_PER_PROCESS_MIB * len(users)
        rows.append(
            {
                "index": i,
                "uuid": gpu_uuid(i),
                "name": GPU_NAME,
                "memory.used": used,
                "memory.total": MEMORY_TOTAL_MIB,
                "memory.free": MEMORY_TOTAL_MIB - used,
                "utilization.gpu": 97 if users else 0,
                "pci.bus_id": "00000000:%02X:00.0" % (0x18 + i),
            }
        )
    return rows


def app_rows(held):
    rows = []
    for gpu, pid in held:
        rows.append(
            {
                "pid": pid,
                "process_name": process_name(pid),
                "name": process_name(pid),
                "used_memory": MEMORY_PER_PROCESS_MIB,
                "gpu_uuid": gpu_uuid(gpu),
                "gpu_bus_id": "00000000:%02X:00.0" % (0x18 + gpu),
            }
        )
    return rows


def table(count, held):
    lines = ["+" + "-" * 60 + "+", "| %-58s |" % "NVIDIA-SMI 575.57.08 (sandbox stand-in)"]
    for row in gpu_rows(count, held):
        lines.append(
            "| %d  %-31s %6d MiB / %6d MiB |"
            % (row["index"], GPU_NAME, row["memory.used"], MEMORY_TOTAL_MIB)
        )
    lines.append("+" + "-" * 60 + "+")
    lines.append("| %-58s |" % "Processes:")
    if not held:
        lines.append("| %-58s |" % " No running processes found")
    for gpu, pid in held:
        lines.append(
            "| %3d %8d  %-33s %6d MiB |"
            % (gpu, pid, process_name(pid)[-32:], MEMORY_PER_PROCESS_MIB)
        )
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

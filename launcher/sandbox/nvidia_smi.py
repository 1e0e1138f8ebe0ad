#!/usr/bin/python3
# mypy: allow-untyped-calls
"""Stand-in for nvidia-smi inside sandbox containers, answering as the real one does there.

The container has a slice of the host's GPUs, by minor number (/etc/sandbox-gpu-minors, e.g.
6,7: /dev/nvidia6 and /dev/nvidia7); as in a real container, nvidia-smi numbers them from 0 in
bus order (index 0 and 1) and `-q` gives each one's `Minor Number` (NVIDIA/nvidia-docker#1432).
The driver's view is the shared directory /var/lib/sandbox-gpu (see launcher/sandbox/gpus.py):
one record per process that uses a GPU, in the pool of GPUs this container shares with others
(/etc/sandbox-gpu-pool), with its host PID and its memory and utilization per device (by minor).

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
  nvidia-smi -q                   per GPU: bus id, minor number, UUID, memory, utilization

/etc/sandbox-gpu-fault makes it fail as real drivers do (one fault a line; launcher/sandbox/gpus.py
FAULTS): the exit code is NVML's return code (nvmlReturn_t) and the message is nvidia-smi's.
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
MINORS_FILE = "/etc/sandbox-gpu-minors"
FAULT_FILE = "/etc/sandbox-gpu-fault"
DRIVER_VERSION = "575.57.08"
NA = "[N/A]"
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


def gpu_minors():
    """The host's GPUs this container was given, by minor number, in bus order (= index);
    none when /etc/sandbox-gpus says 0 (the driver is missing)."""
    count = gpu_count()
    text = read_word(MINORS_FILE, "")
    try:
        minors = sorted(set(int(m) for m in text.split(",") if m.strip()))
    except ValueError:
        minors = []
    if count <= 0:
        return []
    return minors if text else list(range(count))


def faults():
    """{fault: argument} from /etc/sandbox-gpu-fault (see launcher/sandbox/gpus.py FAULTS)."""
    found = {}
    try:
        with open(FAULT_FILE) as f:
            for line in f:
                words = line.split()
                if words:
                    found[words[0]] = words[1] if len(words) > 1 else ""
    except OSError:
        pass
    return found


def pool():
    return read_word(POOL_FILE, "host")


def gpu_uuid(minor):
    # The same physical GPU has the same UUID in every container of its pool.
    seed = "sandbox-gpu:%s:%d" % (pool(), minor)
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, seed))


def bus_id(minor, digits=8):
    """The GPU's PCI address: nvidia-smi writes an 8-digit domain, the kernel a 4-digit one."""
    return "%s:%02X:00.0" % ("0" * digits, (0x18 + minor) % 256)


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


def holders(minors):
    """(gpu index, pid, util, MiB) for every process using one of `minors`, sorted. Records
    name GPUs by minor (the device file the process opened); the index is the position in the
    container's slice."""
    held = []
    for pid, devices in records():
        for minor, (util, mib) in devices.items():
            if minor in minors:
                held.append((minors.index(minor), pid, util, mib))
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
            if units and f in UNITS and value != NA:
                value += UNITS[f]
            values.append(value)
        out.append(", ".join(values))
    return "\n".join(out) + ("\n" if out else "")


def gpu_rows(minors, held, na=False):
    rows = []
    for i, minor in enumerate(minors):
        users = [(util, mib) for gpu, _, util, mib in held if gpu == i]
        used = sum(mib for _, mib in users)
        rows.append(
            {
                "index": i,
                "uuid": gpu_uuid(minor),
                "name": GPU_NAME,
                "memory.used": NA if na else used,
                "memory.total": MEMORY_TOTAL_MIB,
                "memory.free": NA if na else MEMORY_TOTAL_MIB - used,
                "utilization.gpu": NA if na else min(100, sum(util for util, _ in users)),
                "pci.bus_id": bus_id(minor),
                "minor": minor,
            }
        )
    return rows


def app_rows(minors, held):
    rows = []
    for gpu, pid, _, mib in held:
        rows.append(
            {
                "pid": pid,
                "process_name": process_name(pid),
                "name": process_name(pid),
                "used_memory": mib,
                "gpu_uuid": gpu_uuid(minors[gpu]),
                "gpu_bus_id": bus_id(minors[gpu]),
            }
        )
    return rows


def details(rows):
    """`nvidia-smi -q`, the parts launcher and people read: per GPU its bus id heading, minor
    number, UUID, memory and utilization."""
    out = ["", "==============NVSMI LOG==============", "",
           "Driver Version                            : %s" % DRIVER_VERSION,
           "", "Attached GPUs                             : %d" % len(rows)]  # fmt: skip
    for row in rows:
        unit = "" if row["memory.used"] == NA else " MiB"
        util = "" if row["utilization.gpu"] == NA else " %"
        out += [
            "GPU %s" % row["pci.bus_id"],
            "    Product Name                          : %s" % GPU_NAME,
            "    Minor Number                          : %d" % row["minor"],
            "    GPU UUID                              : %s" % row["uuid"],
            "    PCI",
            "        Bus Id                            : %s" % row["pci.bus_id"],
            "    FB Memory Usage",
            "        Total                             : %d MiB" % MEMORY_TOTAL_MIB,
            "        Used                              : %s%s" % (row["memory.used"], unit),
            "    Utilization",
            "        Gpu                               : %s%s" % (row["utilization.gpu"], util),
            "",
        ]
    return "\n".join(out) + "\n"


def table(rows, held):
    lines = [
        "+" + "-" * 60 + "+",
        "| %-58s |" % ("NVIDIA-SMI %s (sandbox stand-in)" % DRIVER_VERSION),
    ]
    for row in rows:
        lines.append(
            "| %d  %-25s %5s %% %6s MiB / %6d MiB |"
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


def fail_as_driver(found, minors):
    """The exit code and message of a driver fault, or None. Exit codes are NVML's return codes
    (nvmlReturn_t): 18 LIB_RM_VERSION_MISMATCH, 15 GPU_IS_LOST, as nvidia-smi exits with them."""
    if "mismatch" in found:
        major_minor = DRIVER_VERSION.rsplit(".", 1)[0]
        return 18, ("Failed to initialize NVML: Driver/library version mismatch\n"
                    "NVML library version: %s\n" % major_minor)  # fmt: skip
    if "lost" in found:
        index = int(found["lost"] or 0)
        if 0 <= index < len(minors):
            return 15, "Unable to determine the device handle for GPU%s: Unknown Error\n" % (
                bus_id(minors[index], 4)
            )
    return None


def stall(found):
    """`delay S`: the call takes S seconds (no persistence daemon); `hang`: it never ends."""
    if "hang" in found:
        while True:
            time.sleep(3600)
    delay = found.get("delay")
    if delay:
        time.sleep(float(delay))


def option_value(args, i, name):
    arg = args[i]
    if arg.startswith(name + "="):
        return arg[len(name) + 1 :], i + 1
    if i + 1 >= len(args):
        raise ValueError("option %s needs a value" % name)
    return args[i + 1], i + 2


def main(argv):
    list_gpus = details_asked = False
    query_gpu = query_apps = None
    fmt = None
    i = 0
    try:
        while i < len(argv):
            arg = argv[i]
            if arg in ("-L", "--list-gpus"):
                list_gpus = True
                i += 1
            elif arg in ("-q", "--query"):
                details_asked = True
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

    minors = gpu_minors()
    if not minors:
        sys.stdout.write(
            DRIVER_FAILED + " Make sure that the latest NVIDIA driver is installed and running.\n\n"
        )
        return 9
    found = faults()
    stall(found)
    failure = fail_as_driver(found, minors)
    if failure is not None:
        sys.stdout.write(failure[1])
        return failure[0]

    if list_gpus:
        for n, minor in enumerate(minors):
            sys.stdout.write("GPU %d: %s (UUID: %s)\n" % (n, GPU_NAME, gpu_uuid(minor)))
        return 0

    held = holders(minors)
    rows = gpu_rows(minors, held, na="na" in found)
    if details_asked:
        sys.stdout.write(details(rows))
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
        if query_gpu is None:
            rows = [] if "no-apps" in found else app_rows(minors, held)
        sys.stdout.write(render(fields, rows, header, units))
        return 0

    sys.stdout.write(table(rows, held))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

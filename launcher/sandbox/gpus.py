"""Sandbox GPUs as a container on a real GPU host sees them.

- Devices: `/dev/nvidia<minor>` for each of the host's GPUs the container was given (its slice:
  all 8 by default, or e.g. 6 and 7, as a CI staging CT gets a slice of the host), plus
  `/dev/nvidiactl` and `/dev/nvidia-uvm`; each the host's /dev/null bind-mounted with
  `create=file`, the way Proxmox passes GPUs to a CT (`lxc.mount.entry: /dev/nvidia6
  dev/nvidia6 none bind,optional,create=file`). Harmless to open, and a process's
  `/proc/<pid>/fd` link reads `/dev/nvidia6` as it does with the real device, so
  `fuser -v /dev/nvidia*` and launcher's own scan find the holders inside the container. The
  file carries the kernel's minor number; nvidia-smi's index restarts at 0 in the container
  (NVIDIA/nvidia-docker#1432): the slice 6,7 is index 0 and 1 there, `Minor Number` 6 and 7 in
  `nvidia-smi -q`.
- The "driver": one host directory, bind-mounted into every container at /var/lib/sandbox-gpu.
  `pools/<pool>/*.json` holds one record per process that uses a GPU (the demo trainer writes
  its host PID, and its memory and utilization per device, by minor number); containers in the
  same pool share the same GPUs, so a process in CT 201 holding GPU 3 is memory used on GPU 3
  in CT 200. The host's /proc is bind-mounted at /var/lib/sandbox-gpu/hostproc: the real driver
  is not PID-namespace aware and reports host PIDs (NVIDIA/nvidia-docker#179, #1460, #1483), so
  the nvidia-smi stand-in reads host PIDs and liveness there.
- Per container: /etc/sandbox-gpu-minors (the slice), /etc/sandbox-gpus (how many),
  /etc/sandbox-gpu-pool (which pool; default `host`: every container shares one host's GPUs),
  /etc/sandbox-gpu-pids (`host`, the default, or `bare-metal`: PIDs reported as the process
  sees its own, as on a host without containers) and /etc/sandbox-gpu-fault (the driver's
  faults, FAULTS: none by default).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path

DRIVER_DIR = "var/lib/sandbox-gpu"  # in the container; the shared host directory
COUNT_FILE = "etc/sandbox-gpus"
MINORS_FILE = "etc/sandbox-gpu-minors"
FAULT_FILE = "etc/sandbox-gpu-fault"
POOL_FILE = "etc/sandbox-gpu-pool"
PIDS_FILE = "etc/sandbox-gpu-pids"
DEFAULT_POOL = "host"
PID_MODES = ("host", "bare-metal")
# What the stand-in nvidia-smi can be made to do, as real drivers do (docs/gpus.md):
#   mismatch     exit 18, "Failed to initialize NVML: Driver/library version mismatch"
#   lost N       GPU index N fell off the bus: exit 15, "Unable to determine the device handle"
#   na           utilization and memory "[N/A]" (MIG, some boards)
#   delay S      every call takes S seconds first (no persistence daemon on the host)
#   hang         every call hangs (a wedged GPU)
#   no-apps      --query-compute-apps lists no rows (a container that cannot see them)
FAULTS = ("mismatch", "lost", "na", "delay", "hang", "no-apps")


def driver_dir(state_dir: Path) -> Path:
    """The host directory every container's GPUs are accounted in."""
    return state_dir / "gpus"


def config_lines(state_dir: Path, minors: Sequence[int]) -> str:
    """LXC config lines: the shared driver directory, the host's /proc, one device file per GPU
    of the slice (by minor number), /dev/nvidiactl and /dev/nvidia-uvm."""
    shared = driver_dir(state_dir)
    (shared / "pools").mkdir(parents=True, exist_ok=True)
    (shared / "hostproc").mkdir(exist_ok=True)
    lines = [
        f"lxc.mount.entry = {fstab_escape(str(shared))} {DRIVER_DIR} none bind,create=dir 0 0",
        f"lxc.mount.entry = /proc {DRIVER_DIR}/hostproc none rbind,ro 0 0",
    ]
    names = [f"nvidia{m}" for m in minors] + (["nvidiactl", "nvidia-uvm"] if minors else [])
    lines += [f"lxc.mount.entry = /dev/null dev/{n} none bind,create=file 0 0" for n in names]
    return "\n".join(lines) + "\n"


def slice_of(gpus: int | Sequence[int]) -> list[int]:
    """The minors of a container's GPUs: `8` is 0..7, `[6, 7]` is itself."""
    if isinstance(gpus, int):
        return list(range(gpus))
    minors = sorted(set(gpus))
    if any(m < 0 or m > 255 for m in minors):
        raise ValueError(f"GPU minor numbers are 0..255, not {minors}")
    return minors


def outdated(config: Path, minors: Sequence[int] | None = None) -> bool:
    """A container configured before its GPUs were devices with nvidia-uvm, or with another
    slice than `minors` (restarted by `sandbox up`, as mounts change only then)."""
    try:
        text = config.read_text()
    except OSError:
        return False
    if f"{DRIVER_DIR}/hostproc" not in text or ("dev/nvidia-uvm" not in text and minors):
        return True
    if minors is None:
        return False
    return config_minors(text) != list(minors)


def config_minors(text: str) -> list[int]:
    found = re.findall(r"^lxc\.mount\.entry = /dev/null dev/nvidia(\d+) ", text, re.M)
    return sorted(int(m) for m in found)


def with_slice(config: str, state_dir: Path, minors: Sequence[int]) -> str:
    """A container's config with its GPU lines for `minors` (the others kept as they are)."""
    kept = [
        line
        for line in config.splitlines()
        if not line.startswith("lxc.mount.entry = /dev/null dev/nvidia")
        and f" {DRIVER_DIR}" not in line
    ]
    return "\n".join(kept) + "\n" + config_lines(state_dir, minors)


def fstab_escape(path: str) -> str:
    """A path in an lxc.mount.entry, which is read as an fstab line (getmntent): whitespace and
    backslashes as octal escapes, so a state directory may have a space in its name."""
    for char in "\\ \t\n":
        path = path.replace(char, f"\\{ord(char):03o}")
    return path


def prepare_rootfs(root: Path, minors: Sequence[int]) -> None:
    """The per-container GPU files; a pool, PID mode or fault set before stays as it is."""
    driver = root / DRIVER_DIR
    if driver.is_dir() and any(driver.iterdir()):
        # The files of a sandbox from before GPUs were devices: a mount point stays empty. (The
        # host sees the rootfs under the container's mounts, so this is never the shared one.)
        shutil.rmtree(driver)
    driver.mkdir(parents=True, exist_ok=True)
    set_minors(root, minors)
    if not (root / POOL_FILE).is_file():
        _write(root / POOL_FILE, DEFAULT_POOL + "\n")
    if not (root / PIDS_FILE).is_file():
        _write(root / PIDS_FILE, "host\n")


def set_minors(root: Path, minors: Sequence[int]) -> None:
    _write(root / MINORS_FILE, ",".join(str(m) for m in minors) + "\n")
    _write(root / COUNT_FILE, f"{len(minors)}\n")


def set_fault(root: Path, faults: Sequence[str]) -> None:
    """The driver's faults for this container (FAULTS, e.g. `delay 20`, `lost 1`); none: healthy."""
    for fault in faults:
        words = fault.split()
        if not words or words[0] not in FAULTS:
            raise ValueError(f"GPU faults are {', '.join(FAULTS)}, not {fault!r}")
        if words[0] in ("lost", "delay") and (len(words) != 2 or not _number(words[1])):
            raise ValueError(f"{words[0]} takes a number: {words[0]} N, not {fault!r}")
    _write(root / FAULT_FILE, "".join(f"{f.strip()}\n" for f in faults))


def _number(text: str) -> bool:
    try:
        return float(text) >= 0
    except ValueError:
        return False


def set_pool(root: Path, pool: str) -> None:
    """Which GPUs the container sees: containers with the same pool share them."""
    if not pool or not pool.replace("-", "").isalnum():
        raise ValueError(f"pool names are letters, digits and '-', not {pool!r}")
    _write(root / POOL_FILE, pool + "\n")


def set_pid_mode(root: Path, mode: str) -> None:
    """`host` (as nvidia-smi inside a real container) or `bare-metal` (PIDs match)."""
    if mode not in PID_MODES:
        raise ValueError(f"PID mode must be one of {', '.join(PID_MODES)}, not {mode!r}")
    _write(root / PIDS_FILE, mode + "\n")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.chmod(0o644)
    tmp.replace(path)

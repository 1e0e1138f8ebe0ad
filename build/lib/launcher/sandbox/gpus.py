"""Sandbox GPUs as a container on a real GPU host sees them.

- Devices: `/dev/nvidia0..N-1` in every container, each the host's /dev/null bind-mounted with
  `create=file`, the way Proxmox passes GPUs to a CT (`lxc.mount.entry: /dev/nvidia0
  dev/nvidia0 none bind,optional,create=file`). Harmless to open, and a process's
  `/proc/<pid>/fd` link reads `/dev/nvidiaN` as it does with the real device, so
  `fuser -v /dev/nvidia*` and launcher's own scan find the holders inside the container.
- The "driver": one host directory, bind-mounted into every container at /var/lib/sandbox-gpu.
  `pools/<pool>/*.json` holds one record per process that uses a GPU (the demo trainer writes
  its host PID, and its memory and utilization per device); containers in the same pool
  share the same GPUs, so a process in CT 201 holding GPU 3 is memory used on GPU 3 in CT 200.
  The host's /proc is bind-mounted at /var/lib/sandbox-gpu/hostproc: the real driver is not
  PID-namespace aware and reports host PIDs (NVIDIA/nvidia-docker#179, #1460, #1483), so the
  nvidia-smi stand-in reads host PIDs and liveness there.
- Per container: /etc/sandbox-gpus (how many GPUs), /etc/sandbox-gpu-pool (which pool; default
  `host`: every container shares one host's GPUs) and /etc/sandbox-gpu-pids (`host`, the
  default, or `bare-metal`: PIDs reported as the process sees its own, as on a host without
  containers).
"""

from __future__ import annotations

import shutil
from pathlib import Path

DRIVER_DIR = "var/lib/sandbox-gpu"  # in the container; the shared host directory
COUNT_FILE = "etc/sandbox-gpus"
POOL_FILE = "etc/sandbox-gpu-pool"
PIDS_FILE = "etc/sandbox-gpu-pids"
DEFAULT_POOL = "host"
PID_MODES = ("host", "bare-metal")


def driver_dir(state_dir: Path) -> Path:
    """The host directory every container's GPUs are accounted in."""
    return state_dir / "gpus"


def config_lines(state_dir: Path, gpus: int) -> str:
    """LXC config lines: the shared driver directory, the host's /proc, one device per GPU."""
    shared = driver_dir(state_dir)
    (shared / "pools").mkdir(parents=True, exist_ok=True)
    (shared / "hostproc").mkdir(exist_ok=True)
    lines = [
        f"lxc.mount.entry = {fstab_escape(str(shared))} {DRIVER_DIR} none bind,create=dir 0 0",
        f"lxc.mount.entry = /proc {DRIVER_DIR}/hostproc none rbind,ro 0 0",
    ]
    lines += [
        f"lxc.mount.entry = /dev/null dev/nvidia{i} none bind,create=file 0 0" for i in range(gpus)
    ]
    return "\n".join(lines) + "\n"


def outdated(config: Path) -> bool:
    """A container configured before its GPUs were devices (restarted by `sandbox up`)."""
    try:
        return f"{DRIVER_DIR}/hostproc" not in config.read_text()
    except OSError:
        return False


def fstab_escape(path: str) -> str:
    """A path in an lxc.mount.entry, which is read as an fstab line (getmntent): whitespace and
    backslashes as octal escapes, so a state directory may have a space in its name."""
    for char in "\\ \t\n":
        path = path.replace(char, f"\\{ord(char):03o}")
    return path


def prepare_rootfs(root: Path, gpus: int) -> None:
    """The per-container GPU files; a pool or PID mode set before stays as it is."""
    driver = root / DRIVER_DIR
    if driver.is_dir() and any(driver.iterdir()):
        # The files of a sandbox from before GPUs were devices: a mount point stays empty. (The
        # host sees the rootfs under the container's mounts, so this is never the shared one.)
        shutil.rmtree(driver)
    driver.mkdir(parents=True, exist_ok=True)
    _write(root / COUNT_FILE, f"{gpus}\n")
    if not (root / POOL_FILE).is_file():
        _write(root / POOL_FILE, DEFAULT_POOL + "\n")
    if not (root / PIDS_FILE).is_file():
        _write(root / PIDS_FILE, "host\n")


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

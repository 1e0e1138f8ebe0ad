"""What a sandbox's state dir holds that the sandbox made, and removing only that.

`launcher sandbox up` writes a marker (`.launcher-sandbox`: the sandbox's id, the containers it
made, whether it made the directory itself) before it makes anything else; `down` refuses a
directory without one and removes only the entries below, so a mistyped `--state-dir` or
`LAUNCHER_SANDBOX_DIR` is refused, and a file a user put next to the sandbox's stays.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from launcher.core.errors import UsageError

MARKER = ".launcher-sandbox"
# Every entry of the state dir a sandbox writes (manager.py, sshd.py, gpus.py, network.py,
# cluster.py, pct.py), with the temp names it writes first. Trees only the sandbox writes into
# are removed whole; `lxc` (one directory per container), `bin` and `playbooks` entry by entry.
FILES = (
    "inventory.yaml",
    "inventory.yaml.tmp",
    "sshd_config",
    "sshd.pid",
    "sshd.log",
    "ssh_host_ed25519_key",
    "ssh_host_ed25519_key.pub",
    "id_ed25519",
    "id_ed25519.pub",
    "known_hosts",
    "authorized_keys",
    "faults.json",
    "faults.json.tmp",
    "pct-calls.log",
    "cluster.json",
    "cluster.json.tmp",
    "cluster_known_hosts",
    "network.json",
    "bin/pct",
    "bin/pct.tmp",
    "bin/pvesh",
    "bin/pvesh.tmp",
    "playbooks/demo.yaml",
    "playbooks/demo.yaml.tmp",
)
TREES = ("gpus", "nodes", "jumps", "home")
DIRS = ("lxc", "bin", "playbooks")  # emptied of the sandbox's entries, removed when empty


@dataclass(frozen=True)
class Marker:
    """The sandbox's claim on its state dir."""

    id: str
    vmids: tuple[int, ...]
    made_dir: bool  # up created the state dir itself: down removes it once empty

    def with_vmids(self, vmids: list[int]) -> Marker:
        return Marker(self.id, tuple(sorted(set(self.vmids) | set(vmids))), self.made_dir)


def read(state_dir: Path) -> Marker | None:
    """The marker, or None when the directory has none (or an unreadable one)."""
    try:
        data = json.loads((state_dir / MARKER).read_text())
        vmids = tuple(int(v) for v in data["vmids"])
        return Marker(str(data["id"]), vmids, bool(data["made_dir"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(state_dir: Path, marker: Marker) -> None:
    data = {"id": marker.id, "vmids": list(marker.vmids), "made_dir": marker.made_dir}
    tmp = state_dir / (MARKER + ".tmp")
    tmp.write_text(json.dumps(data) + "\n")
    tmp.replace(state_dir / MARKER)


def claim(state_dir: Path, vmids: list[int]) -> Marker:
    """The marker of the sandbox in `state_dir`, made (with the directory) if there is none.

    A directory that holds anything else and no marker is not a sandbox's: refused, nothing
    written. One that a sandbox made before markers existed (its `lxc/` and `bin/pct`) is
    claimed with the containers it holds."""
    if state_dir.exists() and not state_dir.is_dir():
        raise UsageError(f"{state_dir} is not a directory: nothing was changed")
    marker = read(state_dir)
    if marker is None:
        made_dir = not state_dir.exists()
        others = [] if made_dir else _entries(state_dir)
        if others and not _older_sandbox(state_dir):
            raise UsageError(
                f"{state_dir} is not a sandbox's state dir (no {MARKER} in it) and is not "
                f"empty ({_names(others)}): nothing was changed",
                hint="give launcher sandbox up an empty or new directory (--state-dir)",
            )
        if others:  # a sandbox from before markers: what it made is in lxc/
            vmids = vmids + [int(p.name) for p in (state_dir / "lxc").iterdir() if p.name.isdigit()]
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        marker = Marker(uuid.uuid4().hex, (), made_dir)
    marker = marker.with_vmids(vmids)
    write(state_dir, marker)
    return marker


def required(state_dir: Path) -> Marker:
    """The marker `down` needs before it touches anything (exit 2 without it)."""
    marker = read(state_dir) if state_dir.is_dir() else None
    if marker is None:
        raise UsageError(
            f"refusing to remove {state_dir}: it has no {MARKER}, so launcher sandbox up did "
            "not make it; nothing was touched",
            hint="check --state-dir and LAUNCHER_SANDBOX_DIR; a sandbox made by an older "
            "launcher gets its marker from one `launcher sandbox up` with the same state dir",
        )
    return marker


def remove_made(state_dir: Path, marker: Marker) -> list[Path]:
    """Remove what the sandbox made (its processes stopped, nothing mounted); what is left
    (a user's files), sorted."""
    for name in FILES:
        _remove(state_dir / name, tree=False)
    for name in TREES:
        _remove(state_dir / name, tree=True)
    for vmid in marker.vmids:
        _remove(state_dir / "lxc" / str(vmid), tree=True)
    for name in DIRS:
        _rmdir_if_empty(state_dir / name)
    left = _entries(state_dir)
    if not left:
        _remove(state_dir / MARKER, tree=False)
        if marker.made_dir:
            _rmdir_if_empty(state_dir)
    return left


def _entries(state_dir: Path) -> list[Path]:
    """What the directory holds besides the marker, down into the sandbox's own directories."""
    found = []
    for entry in sorted(state_dir.iterdir()):
        if entry.name in (MARKER, MARKER + ".tmp"):
            continue
        if entry.name in DIRS and entry.is_dir() and not entry.is_symlink():
            found += sorted(entry.iterdir())
        else:
            found.append(entry)
    return found


def _older_sandbox(state_dir: Path) -> bool:
    return (state_dir / "lxc").is_dir() and (state_dir / "bin" / "pct").is_file()


def _names(paths: list[Path]) -> str:
    shown = ", ".join(p.name for p in paths[:5])
    return shown + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def _remove(path: Path, *, tree: bool) -> None:
    """Never follows a symlink: a link the sandbox did not make is removed as a link."""
    if tree and path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.is_file():
        path.unlink()
    # else: missing, or a directory where the sandbox writes a file: not the sandbox's


def _rmdir_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):  # missing, not empty, or not a directory: left
        os.rmdir(path)

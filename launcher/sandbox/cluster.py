"""A two-node "Proxmox cluster" in the sandbox: the sandbox's sshd is node pve1, a second sshd
on loopback is node pve2, and a `pvesh` stand-in says which node runs each VMID.

Both nodes see the same LXC containers (they are one machine); <state_dir>/cluster.json says
which node "runs" each, and `migrate()` changes that, as a real migration would. pve2's `pct`
refuses a VMID that runs elsewhere, like the real one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import UsageError
from launcher.sandbox import sshd

if TYPE_CHECKING:
    from launcher.sandbox.manager import Sandbox

HERE = Path(__file__).resolve().parent  # the stand-ins' sources, as manager.HERE

FIRST = "pve1"  # the sandbox's own sshd
SECOND = "pve2"
NODES = (FIRST, SECOND)


@dataclass(frozen=True)
class Node:
    name: str
    port: int
    log: Path  # the node's sshd log: who connected, when


@dataclass(frozen=True)
class ClusterInfo:
    nodes: dict[str, Node]
    known_hosts: Path  # both nodes' host keys

    def inventory(self, sandbox: Sandbox, **overrides: object) -> dict[str, object]:
        """`clusters.<name>` of an inventory: both nodes, as launcher should reach them."""
        nodes = {}
        for node in self.nodes.values():
            nodes[node.name] = {
                "address": sshd.ADDRESS,
                "port": node.port,
                "user": "root",
                "identity_file": str(sandbox.identity_file),
                "known_hosts": str(self.known_hosts),
                "connect_timeout": 5,
                **overrides,
            }
        return {"nodes": nodes}


def node_dir(sandbox: Sandbox, name: str) -> Path:
    return sandbox.state_dir / "nodes" / name


def up(sandbox: Sandbox) -> ClusterInfo:
    """Start the second node (idempotent), install pvesh, put unplaced VMIDs on pve1."""
    info = sandbox.info()
    _install(sandbox.state_dir / "bin" / "pvesh", (HERE / "pvesh.py").read_bytes())
    second = _ensure_second_node(sandbox)
    state = _load(sandbox)
    state["nodes"] = {name: {"ip": sshd.ADDRESS, "online": True} for name in NODES}
    for vmid in info.vmids:
        state["vms"].setdefault(str(vmid), FIRST)
    _save(sandbox, state)
    known = sandbox.state_dir / "cluster_known_hosts"
    second_key = (node_dir(sandbox, SECOND) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    known.write_text(
        sandbox.known_hosts.read_text()
        + f"[{sshd.ADDRESS}]:{second} {second_key[0]} {second_key[1]}\n"
    )
    return ClusterInfo(
        {
            FIRST: Node(FIRST, info.port, sandbox.state_dir / "sshd.log"),
            SECOND: Node(SECOND, second, node_dir(sandbox, SECOND) / "sshd.log"),
        },
        known,
    )


def migrate(sandbox: Sandbox, vmid: int, node: str) -> None:
    """Say that `node` runs `vmid` from now on (the pvesh stand-in answers so)."""
    state = _load(sandbox)
    if node not in state["nodes"]:
        raise UsageError(f"unknown node {node!r} (nodes: {', '.join(sorted(state['nodes']))})")
    if str(vmid) not in state["vms"]:
        raise UsageError(f"VMID {vmid} is not in the sandbox cluster")
    state["vms"][str(vmid)] = node
    _save(sandbox, state)


def set_online(sandbox: Sandbox, node: str, online: bool) -> None:
    """Take `node` offline in the cluster's eyes (or back): pvesh reports its guests' status
    as unknown and the node as `online: 0`, as Proxmox does for a node that is down."""
    state = _load(sandbox)
    if node not in state["nodes"]:
        raise UsageError(f"unknown node {node!r} (nodes: {', '.join(sorted(state['nodes']))})")
    row = state["nodes"][node]
    state["nodes"][node] = {**(row if isinstance(row, dict) else {}), "online": online}
    _save(sandbox, state)


def add_qemu(sandbox: Sandbox, vmid: int, node: str) -> None:
    """A QEMU guest on `node` (a row in /cluster/resources, no container behind it)."""
    state = _load(sandbox)
    state["qemu"][str(vmid)] = node
    _save(sandbox, state)


def set_guest(sandbox: Sandbox, vmid: int, *, lock: str = "", hastate: str = "") -> None:
    """The `lock` and `hastate` /cluster/resources shows for `vmid` ("": none)."""
    state = _load(sandbox)
    state["props"][str(vmid)] = {"lock": lock, "hastate": hastate}
    _save(sandbox, state)


def _ensure_second_node(sandbox: Sandbox) -> int:
    home = node_dir(sandbox, SECOND)
    (home / "bin").mkdir(parents=True, exist_ok=True)
    sshd.ensure_key(home / "ssh_host_ed25519_key", f"launcher-sandbox {SECOND}")
    (home / "authorized_keys").write_text((sandbox.state_dir / "authorized_keys").read_text())
    for name in ("pct", "pvesh"):  # pct: the node guard in pvesh.py, then the pct stand-in
        link = home / "bin" / name
        if not link.is_symlink():
            link.symlink_to(sandbox.state_dir / "bin" / "pvesh")
    config = home / "sshd_config"
    port = sshd.config_port(config)
    if sshd.find_listeners(config) and port is not None and sshd.accepting(port):
        return port
    sshd.stop_all(config)
    port = sshd.free_port()
    # sshd keeps only the first SetEnv directive: the node's name joins the PATH one.
    text = sshd.config_text(home, port, home=sandbox.session_home).replace(
        "\nSetEnv ", f'\nSetEnv "LAUNCHER_SANDBOX_NODE={SECOND}" ', 1
    )
    config.write_text(text)
    sshd.start(home, config, port)
    return port


def _load(sandbox: Sandbox) -> dict[str, dict[str, object]]:
    try:
        state = json.loads((sandbox.state_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        state = {}
    keys = ("nodes", "vms", "qemu", "props")
    return {key: dict(state.get(key) or {}) for key in keys}


def _save(sandbox: Sandbox, state: dict[str, dict[str, object]]) -> None:
    tmp = sandbox.state_dir / "cluster.json.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(sandbox.state_dir / "cluster.json")


def _install(target: Path, data: bytes) -> None:
    if target.is_file() and target.read_bytes() == data:
        return
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    os.replace(tmp, target)

"""Sandbox containers that reach each other, as CTs on a Proxmox bridge (vmbr0) do.

Opt-in per sandbox (the others keep `lxc.net.0.type = empty`): a Linux bridge of the sandbox's
own and a veth per container with an address in 10.213.0.0/24. The bridge has no address on
the host, so the host has no route into the subnet and forwards nothing out of it: traffic
stays between the sandbox's containers. down() removes the bridge (network.remove).

A Proxmox CT has its loopback up (pct's network setup brings `lo` up); a bare LXC container
with no network config leaves it down, and torchrun's c10d rendezvous fails without it
(DESIGN.md, facts for the third round). LXC brings `lo` up in a container that has a network
configured; it is set up here too, so a container is as a CT whichever LXC runs it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import yaml

from launcher.sandbox import containers

SUBNET = ipaddress.ip_network("10.213.0.0/24")
STATE_FILE = "network.json"
EMPTY_NET = "lxc.net.0.type = empty"


class NetworkError(containers.ContainerError):
    """The sandbox network could not be set up."""


def bridge_name(state_dir: Path) -> str:
    """The sandbox's own bridge (a name is at most 15 characters)."""
    return "lsb" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]


def address(vmid: int) -> str:
    """The container's address: one per VMID within a sandbox (VMIDs 100..339 stay apart)."""
    host = 10 + (vmid - 100) % 240
    return str(SUBNET.network_address + host)


def net_config(bridge: str, vmid: int) -> str:
    return "\n".join(
        [
            "lxc.net.0.type = veth",
            f"lxc.net.0.link = {bridge}",
            "lxc.net.0.flags = up",
            "lxc.net.0.name = eth0",
            f"lxc.net.0.ipv4.address = {address(vmid)}/{SUBNET.prefixlen}",
        ]
    )


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def _ensure_bridge(bridge: str) -> None:
    if _ip("link", "show", "dev", bridge).returncode != 0:
        made = _ip("link", "add", "name", bridge, "type", "bridge")
        if made.returncode != 0:
            raise NetworkError(f"cannot create bridge {bridge}: {made.stderr.strip()}")
    up = _ip("link", "set", "dev", bridge, "up")
    if up.returncode != 0:
        raise NetworkError(f"cannot bring bridge {bridge} up: {up.stderr.strip()}")


# How each container's /etc/hosts is written (write_hosts): as Proxmox writes it for a CT with
# a static address, or without one (DHCP), or (opt-in) every container's name in every file, as
# a cluster's DNS would answer them.
HOSTS_MODES = ("static", "dhcp", "all")
PVE_BEGIN = "# --- BEGIN PVE ---\n"
PVE_END = "# --- END PVE ---\n"


def enable(
    state_dir: Path, lxcpath: Path, vmids: Sequence[int], hosts: str = "static"
) -> dict[int, str]:
    """Put the containers on the sandbox's bridge (restarting those whose config changes) and
    bring their loopback up; returns each one's address. `hosts`: how /etc/hosts is written
    (HOSTS_MODES)."""
    if hosts not in HOSTS_MODES:
        raise NetworkError(f"hosts: {hosts!r} is not one of {', '.join(HOSTS_MODES)}")
    if len({address(v) for v in vmids}) != len(set(vmids)):
        raise NetworkError(f"VMIDs {sorted(vmids)} would share addresses (240 apart)")
    bridge = bridge_name(state_dir)
    _ensure_bridge(bridge)
    (state_dir / STATE_FILE).write_text(json.dumps({"bridge": bridge}) + "\n")
    restart = []
    for vmid in vmids:
        config = lxcpath / str(vmid) / "config"
        text = config.read_text()
        if EMPTY_NET in text:
            config.write_text(text.replace(EMPTY_NET, net_config(bridge, vmid)))
            restart.append(vmid)
    if restart:
        containers.stop(lxcpath, restart)
        containers.start(lxcpath, restart)
    for vmid in vmids:
        write_hosts(lxcpath / str(vmid) / "rootfs" / "etc" / "hosts", vmid, vmids, hosts)
        result = containers.attach(lxcpath, vmid, ["ip", "link", "set", "dev", "lo", "up"])
        if result.returncode != 0:
            raise NetworkError(f"container {vmid}: loopback: {result.stdout.decode().strip()}")
    return {vmid: address(vmid) for vmid in vmids}


def write_hosts(path: Path, vmid: int, vmids: Sequence[int], mode: str) -> None:
    """The container's /etc/hosts as Proxmox writes it (pve-container src/PVE/LXC/Setup/Base.pm,
    `update_etc_hosts`, inside its `# --- BEGIN PVE ---` section, `ct_modify_file`): localhost,
    then the CT's own name on its static address, or on 127.0.1.1 when it has none (DHCP).
    Nothing about the other CTs: a node finds another's name only through DNS, which the
    sandbox has not. `all` (opt-in) adds every container's name, as a cluster's DNS would."""
    own = address(vmid) if mode != "dhcp" else "127.0.1.1"
    lines = [
        "127.0.0.1 localhost.localnet localhost",
        "::1 localhost.localnet localhost",
        f"{own} {containers.hostname(vmid)}",
    ]
    if mode == "all":
        lines += [f"{address(v)} {containers.hostname(v)}" for v in vmids if v != vmid]
    path.write_text(PVE_BEGIN + "".join(f"{line}\n" for line in lines) + PVE_END)


def add_job(inventory: Path, vmids: Sequence[int]) -> None:
    """A `demo-job` over the connected containers in the sandbox's inventory (two or more)."""
    if len(vmids) < 2:
        return
    data = yaml.safe_load(inventory.read_text())
    nodes = [f"sandbox-{vmid}" for vmid in sorted(vmids)]
    data["jobs"] = {"demo-job": {"nodes": nodes, "playbook": "playbooks/demo.yaml"}}
    tmp = inventory.with_name(inventory.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    tmp.replace(inventory)


def remove(state_dir: Path) -> None:
    """Delete the sandbox's bridge, if it made one (its containers are stopped first)."""
    state = state_dir / STATE_FILE
    if not state.is_file():
        return
    bridge = json.loads(state.read_text()).get("bridge")
    if isinstance(bridge, str) and _ip("link", "show", "dev", bridge).returncode == 0:
        _ip("link", "delete", "dev", bridge)
    state.unlink()

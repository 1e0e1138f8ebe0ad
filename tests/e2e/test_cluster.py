"""A cluster target follows its container from one sandbox node to the other (pvesh, 2 sshds)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from launcher.sandbox import Sandbox, SandboxInfo
from launcher.sandbox import cluster as sandbox_cluster
from launcher.sandbox.cluster import ClusterInfo
from tests.e2e.project import Project, accepted_logins

pytestmark = pytest.mark.e2e

VMID = 201


@pytest.fixture
def pve(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[ClusterInfo]:
    sb, _ = sandbox
    info = sandbox_cluster.up(sb)
    yield info
    sandbox_cluster.migrate(sb, VMID, sandbox_cluster.FIRST)  # back where the others expect it


def write_cluster_inventory(project: Project, pve: ClusterInfo, **cluster: object) -> Path:
    project.write({"prod": (VMID, project.playbook("pvedemo"))})
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["clusters"] = {"pve": {**pve.inventory(project.sandbox), **cluster}}
    inventory["targets"]["prod"] = {
        "cluster": "pve",
        "vmid": VMID,
        "playbook": "playbooks/prod.yaml",
    }
    del inventory["hosts"]
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    return project.inventory


def sessions(node: sandbox_cluster.Node, at_least: int = 0) -> int:
    """SSH logins the node's sshd has accepted so far."""
    return accepted_logins(node.log, at_least)


def test_cluster_target_follows_a_migrated_container(project: Project, pve: ClusterInfo) -> None:
    write_cluster_inventory(project, pve, entry=["pve1"])
    first, second = pve.nodes["pve1"], pve.nodes["pve2"]

    before = sessions(second)
    deployed = project.launcher("deploy", "--restart", "-t", "prod")
    assert deployed.returncode == 0, deployed.stderr
    assert "pve/pve1 CT 201" in deployed.stdout
    assert sessions(second) == before  # pve1 answered pvesh and runs the container

    sandbox_cluster.migrate(project.sandbox, VMID, "pve2")
    # The migrated container's run starts over: past its first status lines (a queue may
    # still be empty at step 1), then the logins of one status are counted.
    project.wait_for(
        lambda: project.launcher("status", "-t", "prod").returncode == 0,
        timeout=30,
        what="the migrated run healthy",
    )
    before_first, before_second = sessions(first), sessions(second)
    status = project.launcher("status", "-t", "prod")
    assert status.returncode == 0, status.stdout + status.stderr
    # pvesh was asked on the entry node (pve1), the container was reached through pve2's sshd,
    # whose pct refuses VMIDs of other nodes: the call went where the container runs now.
    assert sessions(first, at_least=before_first + 1) == before_first + 1
    assert sessions(second, at_least=before_second + 1) == before_second + 1

    deployed = project.launcher("deploy", "--restart", "-t", "prod")
    assert deployed.returncode == 0, deployed.stderr
    assert "pve/pve2 CT 201" in deployed.stdout


def test_the_second_node_refuses_a_container_it_does_not_run(
    project: Project, pve: ClusterInfo
) -> None:
    # The inventory names pve2 as a plain host: CT 201 runs on pve1, so pct there refuses (3).
    write_cluster_inventory(project, pve)
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["hosts"] = {"pve2": inventory["clusters"]["pve"]["nodes"]["pve2"]}
    inventory["targets"]["prod"] = {"host": "pve2", "vmid": VMID, "playbook": "playbooks/prod.yaml"}
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    status = project.launcher("status", "-t", "prod")
    assert status.returncode == 3, status.stdout + status.stderr


def test_unreachable_entry_nodes_exit_3_naming_each(project: Project, pve: ClusterInfo) -> None:
    write_cluster_inventory(project, pve)
    inventory = yaml.safe_load(project.inventory.read_text())
    for node in inventory["clusters"]["pve"]["nodes"].values():
        node.update(port=1, connect_timeout=2)
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    status = project.launcher("status", "-t", "prod")
    assert status.returncode == 3
    assert "cluster pve: no entry node could tell where VMID 201 runs" in status.stderr
    assert "pve1:" in status.stderr and "pve2:" in status.stderr


def test_an_offline_node_is_named_at_once(project: Project, pve: ClusterInfo) -> None:
    """pvesh says `status: unknown` for the guest and `online: 0` for its node: launcher says
    so before any SSH connection to that node (whose timeout would be the only other sign)."""
    write_cluster_inventory(project, pve, entry=["pve1"])
    sandbox_cluster.migrate(project.sandbox, VMID, "pve2")
    sandbox_cluster.set_online(project.sandbox, "pve2", False)
    sandbox_cluster.set_guest(project.sandbox, VMID, hastate="started")
    try:
        before = sessions(pve.nodes["pve2"])
        started = time.monotonic()
        status = project.launcher("status", "-t", "prod")
        took = time.monotonic() - started
    finally:
        sandbox_cluster.set_online(project.sandbox, "pve2", True)
        sandbox_cluster.set_guest(project.sandbox, VMID)
    assert status.returncode == 3, status.stdout + status.stderr
    assert "cluster pve: node pve2 is offline (VMID 201 is there; HA started)" in status.stderr
    assert took < 5, f"{took:.1f} s: named at once, not after a timeout"
    assert sessions(pve.nodes["pve2"]) == before, "no connection to the offline node"


def test_a_qemu_guest_is_never_a_target(project: Project, pve: ClusterInfo) -> None:
    sandbox_cluster.add_qemu(project.sandbox, 300, "pve1")
    write_cluster_inventory(project, pve, entry=["pve1"])
    inventory = yaml.safe_load(project.inventory.read_text())
    inventory["targets"]["prod"]["vmid"] = 300
    project.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
    calls = project.sandbox.pct_calls()
    status = project.launcher("status", "-t", "prod")
    assert status.returncode == 3, status.stdout + status.stderr
    assert "VMID 300 on node pve1 is a QEMU virtual machine, not a container" in status.stderr
    assert project.sandbox.pct_calls() == calls, "no pct call aimed at a VM"

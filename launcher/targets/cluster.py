"""Proxmox clusters: find the node that runs a target's VMID now, and use that node.

A cluster target names a cluster of the inventory instead of a host. Before a call, an entry
node is asked (`pvesh get /cluster/resources --type vm` and `pvesh get /cluster/status`) which
node runs the VMID and how to reach it; the target then goes there. A container migrated to
another node is followed without editing the inventory. Entry nodes are tried in order: one
that cannot be reached (or has no pvesh) is skipped, and only when none answers is the target
unreachable (exit 3).

The cluster's answer is read as Proxmox writes it (pve-manager `PVE/API2/Cluster.pm`, the
resources call, and `PVE/API2Tools.pm: extract_vm_stats`): `--type vm` lists QEMU guests too
(`type: qemu`), which launcher never targets; a guest whose node sends no stats (an offline
node) has `status: unknown`, and then `/cluster/status` says whether its node is `online`, so
an offline node is named at once rather than found by an SSH timeout. `lock` and `hastate`
appear when set and are kept on the placement.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from launcher.config.models import Cluster, HostSpec, Target, address_problem
from launcher.container.pct import HostShell
from launcher.core.errors import ContainerError, LauncherError, RemoteError

RESOURCES = ["pvesh", "get", "/cluster/resources", "--type", "vm", "--output-format", "json"]
STATUS = ["pvesh", "get", "/cluster/status", "--output-format", "json"]
# pvesh answers from the cluster's own database: a few seconds is plenty, even on a busy node.
PVESH_TIMEOUT = 30.0
# A cluster's VM list is about 300 bytes a guest: 8 MiB is tens of thousands of them.
PVESH_ANSWER_LIMIT = 8 << 20
EXIT_MARK = "launcher-pvesh-exit"


class Pool(Protocol):
    """What placement needs from a connection pool (transport/pool.py's is the real one)."""

    def get(self, name: str, host: HostSpec) -> HostShell: ...


class PveshError(RemoteError):
    """An entry node could not tell where the VMID runs (pvesh missing, failed or odd output)."""


class NodeOffline(ContainerError):
    """The cluster says the node that holds the VMID is offline: nothing to connect to."""


@dataclass(frozen=True)
class Placement:
    """Where a VMID runs now: the node's name, its address from the cluster, and its status."""

    vmid: int
    node: str
    status: str
    ip: str | None
    entry: str  # the entry node that answered
    lock: str | None = None  # the guest's config lock (backup, snapshot, migrate, ...)
    hastate: str | None = None  # the HA manager's state for it (started, stopped, fence, ...)


@dataclass(frozen=True)
class Guest:
    """One `vm` row of /cluster/resources: what launcher reads of it."""

    vmid: int
    node: str
    type: str  # lxc or qemu
    status: str  # running, stopped, ... or unknown (its node sends no stats: offline)
    lock: str | None = None
    hastate: str | None = None


def connection_name(cluster: str, node: str) -> str:
    """The pool key and label of a cluster node's connection, e.g. `pve/pve2`."""
    return f"{cluster}/{node}"


def entry_nodes(cluster: Cluster) -> list[str]:
    return list(cluster.spec.entry or cluster.spec.nodes)


def parse_resources(text: str, vmid: int) -> Guest:
    """`vmid`'s row in `pvesh get /cluster/resources --type vm` JSON output; a QEMU guest is
    refused (launcher runs in LXC containers)."""
    rows = _json_list(text, "/cluster/resources")
    for row in rows:
        if isinstance(row, dict) and row.get("vmid") == vmid:
            return _guest(row, vmid)
    raise ContainerError(
        f"VMID {vmid} is on no node of the cluster (pvesh get /cluster/resources)",
        hint="check the VMID in the inventory, or whether the container was deleted",
    )


def _guest(row: dict[str, Any], vmid: int) -> Guest:
    node, status, kind = row.get("node"), row.get("status"), row.get("type", "lxc")
    if not isinstance(node, str) or not node:
        raise PveshError(f"/cluster/resources: VMID {vmid} has no node")
    if kind != "lxc":
        raise ContainerError(
            f"VMID {vmid} on node {node} is a {'QEMU virtual machine' if kind == 'qemu' else kind}"
            ", not a container: launcher runs in LXC containers (pct)",
            hint="check the VMID in the inventory",
        )
    return Guest(
        vmid,
        node,
        str(kind),
        status if isinstance(status, str) else "unknown",
        _text(row.get("lock")),
        _text(row.get("hastate")),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def parse_nodes(text: str) -> dict[str, dict[str, Any]]:
    """Node name -> its row in `pvesh get /cluster/status` JSON output (entries of type node)."""
    return {
        row["name"]: row
        for row in _json_list(text, "/cluster/status")
        if isinstance(row, dict)
        and row.get("type", "node") == "node"
        and isinstance(row.get("name"), str)
    }


def parse_node_ips(text: str) -> dict[str, str]:
    """Node name -> ip from `pvesh get /cluster/status` JSON output (entries of type node)."""
    return parse_node_ips_of(parse_nodes(text))


def parse_node_ips_of(nodes: dict[str, dict[str, Any]]) -> dict[str, str]:
    ips: dict[str, str] = {}
    for name, row in nodes.items():
        ip = row.get("ip")
        if isinstance(ip, str) and ip:
            problem = address_problem(ip)
            if problem:  # it becomes the address launcher connects to
                raise PveshError(f"/cluster/status: node {name}'s ip: {problem}"[:300])
            ips[name] = ip
    return ips


def _json_list(text: str, what: str) -> list[Any]:
    try:
        data = json.loads(text)
    except ValueError:
        raise PveshError(f"{what}: pvesh did not answer JSON: {text[:120]!r}") from None
    if not isinstance(data, list):
        raise PveshError(f"{what}: expected a JSON list from pvesh")
    return data


def locate(cluster: Cluster, vmid: int, pool: Pool) -> Placement:
    """Ask the entry nodes in turn where `vmid` runs; the first that answers decides."""
    errors: list[str] = []
    for name in entry_nodes(cluster):
        spec = cluster.spec.nodes[name]
        conn = pool.get(connection_name(cluster.name, name), spec)
        # The node's own deadline, as for every other command on it (at most PVESH_TIMEOUT).
        timeout = min(PVESH_TIMEOUT, spec.command_timeout)
        try:
            guest = parse_resources(_pvesh(conn, RESOURCES, timeout), vmid)
            ip = None
            # Asked only when needed: a node the inventory does not list (its address), or a
            # guest without stats (its node may be offline).
            if guest.node not in cluster.spec.nodes or guest.status == "unknown":
                nodes = parse_nodes(_pvesh(conn, STATUS, timeout))
                check_online(guest, nodes)
                ip = parse_node_ips_of(nodes).get(guest.node)
            return Placement(vmid, guest.node, guest.status, ip, name, guest.lock, guest.hastate)
        except ContainerError as error:
            # The cluster answered: the VMID is not there, and asking another node won't help.
            raise type(error)(f"cluster {cluster.name}: {error.message}", hint=error.hint) from None
        except RemoteError as error:
            errors.append(f"{name}: {error.message}")
    raise RemoteError(
        f"cluster {cluster.name}: no entry node could tell where VMID {vmid} runs: "
        + "; ".join(errors),
        hint="check that the entry nodes are reachable and that pvesh works there",
    )


def check_online(guest: Guest, nodes: dict[str, dict[str, Any]]) -> None:
    """A guest whose node the cluster counts offline: said now, not after an SSH timeout."""
    row = nodes.get(guest.node)
    if row is not None and row.get("online") in (0, False):
        states = [
            f"lock {guest.lock}" if guest.lock else "",
            f"HA {guest.hastate}" if guest.hastate else "",
        ]
        extra = ", ".join(x for x in states if x)
        raise NodeOffline(
            f"node {guest.node} is offline (VMID {guest.vmid} is there"
            + (f"; {extra}" if extra else "")
            + ")",
            hint="the run cannot be reached until the node is back (or the guest is moved)",
        )


def pvesh_command(argv: Sequence[str]) -> str:
    """pvesh's answer cut on the node at PVESH_ANSWER_LIMIT + 1 bytes (a runaway answer never
    crosses the link whole, or fills memory here); its exit status goes to stderr, marked,
    since a pipeline's own status is head's."""
    return f"{{ {shlex.join(argv)}; echo {EXIT_MARK} $? >&2; }} | head -c {PVESH_ANSWER_LIMIT + 1}"


def _pvesh(conn: HostShell, argv: Sequence[str], timeout: float) -> str:
    result = conn.run(pvesh_command(argv), timeout=timeout)
    detail = result.stderr.decode("utf-8", "replace").strip().splitlines()
    code = result.exit_code
    marks = [line for line in detail if line.startswith(EXIT_MARK + " ")]
    if marks:
        code = int(marks[-1].split()[-1]) if marks[-1].split()[-1].isdigit() else 1
        detail = [line for line in detail if not line.startswith(EXIT_MARK + " ")]
    if len(result.stdout) > PVESH_ANSWER_LIMIT:
        raise PveshError(f"{argv[2]}: pvesh answered more than {PVESH_ANSWER_LIMIT} bytes")
    if code != 0:
        raise PveshError(f"{argv[2]}: pvesh exited {code}: {' '.join(detail)[:200]}")
    return result.stdout.decode("utf-8", "replace")


def node_host(cluster: Cluster, placement: Placement) -> HostSpec:
    """How to reach the node: the inventory's entry for it, else its cluster address with the
    connection settings of the node that answered (same user, key, known_hosts, port)."""
    spec = cluster.spec.nodes.get(placement.node)
    if spec is not None:
        return spec
    if placement.ip is None:
        raise PveshError(
            f"cluster {cluster.name}: VMID {placement.vmid} runs on node {placement.node}, "
            "which the inventory does not list and /cluster/status gives no address for",
            hint=f"add {placement.node} under clusters.{cluster.name}.nodes",
        )
    return cluster.spec.nodes[placement.entry].model_copy(update={"address": placement.ip})


def place(target: Target, pool: Pool) -> Target:
    """The target on the node that runs its VMID now (a host target comes back unchanged)."""
    cluster = target.cluster
    if cluster is None:
        return target
    placement = locate(cluster, target.vmid, pool)
    return dataclasses.replace(
        target,
        host_name=connection_name(cluster.name, placement.node),
        host=node_host(cluster, placement),
    )


def place_all(
    targets: Sequence[Target], pool: Pool
) -> tuple[list[Target], dict[str, LauncherError]]:
    """Place every target; one that cannot be placed is returned as its error, by name."""
    placed: list[Target] = []
    failed: dict[str, LauncherError] = {}
    for target in targets:
        try:
            placed.append(place(target, pool))
        except LauncherError as error:
            failed[target.name] = error
    return placed, failed

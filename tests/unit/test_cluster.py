"""Cluster targets: inventory validation and finding the node that runs a VMID (pvesh)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.config.models import Cluster, HostSpec, load_inventory
from launcher.core.errors import ConfigError, ContainerError, ExitCode, RemoteError
from launcher.targets.cluster import (
    NodeOffline,
    PveshError,
    locate,
    parse_node_ips,
    parse_resources,
    place,
)
from launcher.transport.endpoint import CommandResult

RESOURCES = [
    {"id": "lxc/200", "type": "lxc", "vmid": 200, "node": "pve2", "status": "running"},
    {"id": "lxc/300", "type": "lxc", "vmid": 300, "node": "pve3", "status": "running"},
    {"id": "qemu/400", "type": "qemu", "vmid": 400, "node": "pve1", "status": "running"},
    # A guest on an offline node: no stats, so status unknown (pve-manager API2Tools.pm,
    # extract_vm_stats); lock and hastate come from its config and the HA manager all the same.
    {"id": "lxc/500", "type": "lxc", "vmid": 500, "node": "pve4", "status": "unknown"},
    {
        "id": "lxc/600",
        "type": "lxc",
        "vmid": 600,
        "node": "pve2",
        "status": "unknown",
        "lock": "backup",
        "hastate": "started",
    },
]
STATUS = [
    {"type": "cluster", "name": "lab"},
    {"type": "node", "name": "pve1", "ip": "10.0.0.1", "online": 1},
    {"type": "node", "name": "pve2", "ip": "10.0.0.2", "online": 1},
    {"type": "node", "name": "pve3", "ip": "10.0.0.3", "online": 1},
    {"type": "node", "name": "pve4", "ip": "10.0.0.4", "online": 0},
]


class FakeNode:
    """Answers pvesh like an entry node, or fails like one that cannot be reached."""

    def __init__(self, name: str, log: list[str], *, down: bool = False) -> None:
        self.name, self.log, self.down = name, log, down

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        self.log.append(f"{self.name}: {command}")
        if self.down:
            raise RemoteError(f"{self.name}: connection refused")
        data = RESOURCES if "/cluster/resources" in command else STATUS
        return CommandResult(command, 0, json.dumps(data).encode(), b"", 0.0)


class FakePool:
    def __init__(self, down: tuple[str, ...] = ()) -> None:
        self.log: list[str] = []
        self.down = down

    def get(self, name: str, host: HostSpec) -> FakeNode:
        return FakeNode(name, self.log, down=name.split("/")[-1] in self.down)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "demo.py").write_text("print(1)\n")
    (tmp_path / "book.yaml").write_text(
        "name: d\nsession: d\nworkdir: /root/d\ncommand: python3 demo.py\n"
        "script: {source: demo.py, dest: demo.py}\n"
    )
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return path


CLUSTER = """\
clusters:
  lab:
    nodes:
      pve1: {address: 10.0.0.1}
      pve2: {address: 10.0.0.2, port: 2222}
targets:
  prod: {cluster: lab, vmid: 200, playbook: book.yaml}
  vm: {cluster: lab, vmid: 300, playbook: book.yaml}
"""


def test_cluster_target_is_placed_on_the_node_that_runs_it(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, CLUSTER))
    target = inventory.target("prod")
    assert target.host_name == "lab" and target.cluster is not None
    pool = FakePool()
    placed = place(target, pool)
    assert placed.host_name == "lab/pve2" and placed.host.port == 2222
    assert placed.label == "prod (lab/pve2 CT 200)"
    assert pool.log == [
        "lab/pve1: { pvesh get /cluster/resources --type vm --output-format json; "
        "echo launcher-pvesh-exit $? >&2; } | head -c 8388609"
    ]


def test_a_node_missing_from_the_inventory_is_reached_at_its_cluster_ip(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, CLUSTER))
    placed = place(inventory.target("vm"), FakePool())
    assert placed.host_name == "lab/pve3" and placed.host.address == "10.0.0.3"


def test_entry_nodes_are_tried_in_order(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, CLUSTER))
    pool = FakePool(down=("pve1",))
    assert place(inventory.target("prod"), pool).host_name == "lab/pve2"
    assert [line.split(":")[0] for line in pool.log] == ["lab/pve1", "lab/pve2"]
    cluster = inventory.target("prod").cluster
    assert cluster is not None
    with pytest.raises(RemoteError) as error:
        locate(cluster, 200, FakePool(down=("pve1", "pve2")))
    assert error.value.exit_code == ExitCode.UNREACHABLE
    assert "lab/pve1: connection refused" in str(error.value)


def test_unknown_vmid_and_odd_output() -> None:
    with pytest.raises(ContainerError, match="VMID 999 is on no node"):
        parse_resources(json.dumps(RESOURCES), 999)
    with pytest.raises(PveshError, match="did not answer JSON"):
        parse_resources("Permission check failed", 200)
    assert parse_node_ips(json.dumps(STATUS)) == {
        "pve1": "10.0.0.1",
        "pve2": "10.0.0.2",
        "pve3": "10.0.0.3",
        "pve4": "10.0.0.4",
    }


def cluster_of(tmp_path: Path) -> Cluster:
    cluster = load_inventory(write(tmp_path, CLUSTER)).target("prod").cluster
    assert cluster is not None
    return cluster


def test_a_qemu_guest_is_never_a_target(tmp_path: Path) -> None:
    pool = FakePool()
    with pytest.raises(ContainerError) as error:
        locate(cluster_of(tmp_path), 400, pool)
    assert error.value.exit_code == ExitCode.UNREACHABLE
    assert str(error.value.message) == (
        "cluster lab: VMID 400 on node pve1 is a QEMU virtual machine, not a container: "
        "launcher runs in LXC containers (pct)"
    )
    assert len(pool.log) == 1, "one pvesh call, no other entry node asked"


def test_an_offline_node_is_named_at_once(tmp_path: Path) -> None:
    pool = FakePool()
    with pytest.raises(NodeOffline) as error:
        locate(cluster_of(tmp_path), 500, pool)
    assert error.value.exit_code == ExitCode.UNREACHABLE
    assert error.value.message == "cluster lab: node pve4 is offline (VMID 500 is there)"
    assert [line.split()[4] for line in pool.log] == ["/cluster/resources", "/cluster/status"]


def test_status_unknown_on_an_online_node_is_placed_with_its_lock_and_hastate(
    tmp_path: Path,
) -> None:
    placement = locate(cluster_of(tmp_path), 600, FakePool())
    assert (placement.node, placement.status) == ("pve2", "unknown")
    assert (placement.lock, placement.hastate) == ("backup", "started")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            "targets:\n  prod: {vmid: 200, playbook: book.yaml}\n",
            ":2: targets.prod: give either host or cluster (exactly one of them)",
        ),
        (
            CLUSTER.replace("cluster: lab, vmid: 200", "cluster: nope, vmid: 200"),
            ":7: targets.prod.cluster: unknown cluster 'nope' (clusters: lab)",
        ),
        (
            CLUSTER.replace("    nodes:", "    entry: [pve9]\n    nodes:"),
            ":3: clusters.lab.entry.0: unknown node 'pve9' (nodes: pve1, pve2)",
        ),
        (
            "clusters:\n  lab: {nodes: {}}\ntargets: {}\n",
            ":2: clusters.lab.nodes:",
        ),
    ],
)
def test_bad_cluster_inventories_name_file_line_and_key(
    tmp_path: Path, text: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_inventory(path)
    assert f"{path}{problem}" in str(error.value)


class RunawayNode(FakeNode):
    """An entry node whose pvesh answers more than launcher reads, or fails behind the pipe."""

    def __init__(self, name: str, log: list[str], answer: bytes, stderr: bytes) -> None:
        super().__init__(name, log)
        self.answer, self.stderr = answer, stderr

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout: float | None = None
    ) -> CommandResult:
        assert "| head -c" in command and timeout is not None and timeout <= 30
        return CommandResult(command, 0, self.answer, self.stderr, 0.0)


@pytest.mark.parametrize(
    ("answer", "stderr", "message"),
    [
        (b"[" * (8 << 20) + b"[", b"launcher-pvesh-exit 141\n", "more than 8388608 bytes"),
        (b"", b"no quorum\nlauncher-pvesh-exit 255\n", "pvesh exited 255: no quorum"),
    ],
)
def test_pvesh_answers_are_bounded_and_their_exit_status_kept(
    answer: bytes, stderr: bytes, message: str
) -> None:
    from launcher.targets.cluster import _pvesh

    node = RunawayNode("n", [], answer, stderr)
    with pytest.raises(PveshError) as raised:
        _pvesh(node, ["pvesh", "get", "/cluster/resources"], 5.0)
    assert message in raised.value.message

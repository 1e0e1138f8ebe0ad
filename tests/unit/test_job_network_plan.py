"""A job's network plan without a host (launcher.jobs.network): the addresses and interfaces chosen
from what the nodes report, and the rendezvous torchrun gets for the names they resolve."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.agent import protocol as p
from launcher.agent.base import AgentError
from launcher.agent.network import write_hosts_block
from launcher.core.errors import ExitCode
from launcher.jobs.network import (
    Interface,
    NetworkPlan,
    NetworkProblem,
    NodeFacts,
    choose_addresses,
    choose_rendezvous,
    name_checks,
)

OLD_TORCH: p.TorchInfo = {"python": "python3", "version": "1.13.0a0", "local_addr": False}
NEW_TORCH: p.TorchInfo = {"python": "python3", "version": "2.5.1", "local_addr": True}


def node(
    name: str, *interfaces: tuple[str | None, str, int | None], torch: Any = OLD_TORCH
) -> NodeFacts:
    found = tuple(Interface(*i) for i in interfaces)
    return NodeFacts(name, name, name, found, torch)


TWO_NETS = [
    # rank 0: an uplink first, then the cluster network the other node shares
    node("n0", ("eth0", "192.168.7.20", 24), ("eth1", "10.9.0.20", 16)),
    node("n1", ("ens18", "10.9.3.4", 16), ("ens19", "172.16.0.4", 24)),
]


def test_the_address_on_the_subnet_every_node_shares_and_each_nodes_interface() -> None:
    addresses, ifnames, note = choose_addresses(TWO_NETS, [None, None], "train")
    assert addresses == ("10.9.0.20", "10.9.3.4")
    assert ifnames == ("eth1", "ens18") and note is None


def test_a_configured_address_wins_and_names_its_interface_when_it_is_local() -> None:
    addresses, ifnames, _ = choose_addresses(TWO_NETS, ["192.168.7.20", None], "train")
    assert addresses[0] == "192.168.7.20" and ifnames[0] == "eth0"
    addresses, ifnames, _ = choose_addresses(TWO_NETS, ["203.0.113.9", None], "train")
    assert addresses[0] == "203.0.113.9" and ifnames[0] is None  # a NAT address: not here


def test_no_common_subnet_is_said_and_loopback_link_local_never_chosen() -> None:
    facts = [
        node("n0", ("eth0", "127.0.1.1", 8), ("eth0", "fe80::1", 64), ("eth0", "10.1.0.2", 24)),
        node("n1", ("eth0", "10.2.0.3", 24)),
    ]
    addresses, _, note = choose_addresses(facts, [None, None], "train")
    assert addresses == ("10.1.0.2", "10.2.0.3")
    assert note == "no subnet common to every node: 10.1.0.2 is reached through a router"


def test_rank0_without_a_reachable_address_names_the_fix() -> None:
    facts = [node("n0", ("eth0", "169.254.3.3", 16)), node("n1", ("eth0", "10.2.0.3", 24))]
    with pytest.raises(NetworkProblem) as caught:
        choose_addresses(facts, [None, None], "train")
    assert caught.value.message == (
        "n0 has no address the other nodes can reach (its addresses: 169.254.3.3)"
    )
    assert caught.value.hint == "set jobs.train.addresses.n0 in the inventory"


def resolved(*addresses: str, error: str | None = None, name: str = "n0") -> dict[str, p.Resolved]:
    return {name: {"addresses": list(addresses), "error": error}}


N0_RESOLVES_N1 = resolved("10.9.3.4", name="n1")


def plan_for(
    facts: list[NodeFacts], answers: list[dict[str, p.Resolved]], **options: Any
) -> NetworkPlan:
    plan = NetworkPlan("10.9.0.20", ("10.9.0.20", "10.9.3.4"), ("eth1", "ens18"))
    settings = {"wanted": "auto", "max_restarts": 0, "job": "train", **options}
    choose_rendezvous(plan, facts, name_checks(facts, answers), **settings)
    return plan


def test_c10d_when_every_node_resolves_every_other_nodes_name() -> None:
    plan = plan_for(TWO_NETS, [N0_RESOLVES_N1, resolved("10.9.0.20")])
    assert plan.backend == "c10d" and plan.local_addrs == ()
    assert plan.notes == ["rendezvous: c10d; every node resolves every other node's name"]


def test_any_node_may_become_group_rank_0_so_every_name_counts() -> None:
    """torch orders the rendezvous' nodes by name: the node whose name sorts first publishes
    it, whatever its NODE_RANK. n1 resolving n0 is not enough when n0 cannot resolve n1."""
    plan = plan_for(TWO_NETS, [{}, resolved("10.9.0.20")])
    assert plan.backend == "static"
    assert "n0 cannot resolve n1 (not asked)" in plan.notes[0]


def test_two_nodes_with_one_name_never_get_c10d() -> None:
    twins = [node("ct", *[(i.name, i.address, i.prefix) for i in f.interfaces]) for f in TWO_NETS]
    plan = plan_for(twins, [resolved("10.9.3.4", name="ct"), resolved("10.9.0.20", name="ct")])
    assert plan.backend == "static" and "ct names more than one node" in plan.notes[0]


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (resolved(error="[Errno -2] Name or service not known"), "n1 cannot resolve n0"),
        # A DHCP CT's own line on another node's /etc/hosts, or a stale DNS record.
        (resolved("127.0.1.1"), "n1 resolves n0 to 127.0.1.1, not that node's address"),
    ],
)
def test_static_by_address_when_a_node_cannot_resolve_rank0s_name(
    answer: dict[str, p.Resolved], why: str
) -> None:
    plan = plan_for(TWO_NETS, [N0_RESOLVES_N1, answer])
    assert plan.backend == "static" and plan.torch == "1.13.0a0"
    assert plan.notes[0].startswith(f"rendezvous: static, by address ({why}")


def test_local_addr_on_newer_torch_keeps_c10d() -> None:
    facts = [node(f.name, *[(i.name, i.address, i.prefix) for i in f.interfaces], torch=NEW_TORCH)
             for f in TWO_NETS]  # fmt: skip
    plan = plan_for(facts, [{}, resolved(error="not known")])
    assert plan.backend == "c10d" and plan.local_addrs == ("10.9.0.20", "10.9.3.4")


def test_c10d_insisted_on_without_names_is_refused_with_the_fixes() -> None:
    with pytest.raises(NetworkProblem) as caught:
        plan_for(TWO_NETS, [N0_RESOLVES_N1, resolved(error="not known")], wanted="c10d")
    error = caught.value
    assert error.exit_code == ExitCode.REFUSED
    assert error.message.startswith("rendezvous c10d: n1 cannot resolve n0 (not known)")
    assert "DNS" in str(error.hint) and "jobs.train.rendezvous: static" in str(error.hint)


def test_in_place_restarts_without_names_are_refused() -> None:
    with pytest.raises(NetworkProblem) as caught:
        plan_for(TWO_NETS, [N0_RESOLVES_N1, resolved(error="not known")], max_restarts=2)
    assert caught.value.message.startswith("max_restarts 2 needs the c10d rendezvous")
    assert "jobs.train.max_restarts: 0" in str(caught.value.hint)


def test_static_when_the_job_says_so() -> None:
    plan = plan_for(TWO_NETS, [N0_RESOLVES_N1, resolved("10.9.0.20")], wanted="static")
    assert plan.backend == "static"


def test_manage_hosts_gives_c10d_and_each_node_the_others_names() -> None:
    plan = plan_for(TWO_NETS, [{}, resolved(error="not known")], manage_hosts=True)
    assert plan.backend == "c10d"
    assert plan.hosts == (("10.9.3.4 n1",), ("10.9.0.20 n0",))
    assert "jobs.train.manage_hosts" in plan.notes[0]


def test_the_refusal_names_the_hosts_block_among_the_fixes() -> None:
    with pytest.raises(NetworkProblem) as caught:
        plan_for(TWO_NETS, [{}, resolved(error="not known")], wanted="c10d")
    assert "jobs.train.manage_hosts: true" in str(caught.value.hint)


PVE_HOSTS = """\
# --- BEGIN PVE ---
127.0.0.1 localhost.localnet localhost
127.0.1.1 ct300
# --- END PVE ---
"""


def test_the_hosts_block_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    """Proxmox's own section stays as it was (it rewrites only that on a CT start); a second
    write replaces launcher's block, an empty one removes it."""
    hosts = tmp_path / "hosts"
    hosts.write_text(PVE_HOSTS + "10.0.0.9 printer\n")
    write_hosts_block(str(hosts), "LAUNCHER JOB train", ["10.9.3.4 ct301.lan ct301"])
    write_hosts_block(str(hosts), "LAUNCHER JOB train", ["10.9.3.5 ct301.lan ct301"])
    assert hosts.read_text() == PVE_HOSTS + (
        "10.0.0.9 printer\n"
        "# --- BEGIN LAUNCHER JOB train ---\n"
        "10.9.3.5 ct301.lan ct301\n"
        "# --- END LAUNCHER JOB train ---\n"
    )
    write_hosts_block(str(hosts), "LAUNCHER JOB train", [])
    assert hosts.read_text() == PVE_HOSTS + "10.0.0.9 printer\n"
    with pytest.raises(AgentError):
        write_hosts_block(str(hosts), "LAUNCHER JOB train", ["10.0.0.1 a # comment"])

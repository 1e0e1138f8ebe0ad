"""A job's network checked before anything is stopped, and torchrun's rendezvous chosen for it.

Every node is asked (the agent's `network` op) for its names, interfaces and torch; then rank 0
listens on the master port while every other node probes it and looks up rank 0's name. From
that:

- **addresses**: rank 0's address (`MASTER_ADDR`) is the one on a subnet every node has an
  address in (several interfaces: the cluster network, not the uplink); each node's interface
  on it goes to gloo and NCCL. `addresses:` in the inventory overrides a node's address.
- **rendezvous**: torch 1.13's c10d rendezvous publishes the fully qualified hostname of the
  agent that became group rank 0 as every worker's MASTER_ADDR (`_get_fq_hostname`,
  torch/distributed/elastic/agent/server/api.py; `_get_addr_and_port` in torch/distributed/
  launcher/api.py returns no address for any backend but `static`), and group rank 0 is the
  node whose name sorts first, not NODE_RANK 0 (`_NodeDesc` is ordered by fqdn,
  `_mark_rendezvous_complete` in torch/distributed/elastic/rendezvous/dynamic_rendezvous.py).
  A Proxmox CT's /etc/hosts has its own name only (pve-container src/PVE/LXC/Setup/Base.pm,
  `update_etc_hosts`), so without DNS the other nodes cannot resolve it and their workers hang
  in init. So c10d only when every node resolves every other node's name to that node's
  address (and no two share a name); else c10d with `--local_addr` where every node's
  torchrun has it (newer torch), else the static backend, which hands the workers the address
  itself.
  c10d's `is_host` is always given: rank 0 would otherwise host the store only when the
  endpoint matches its hostname's addresses (`_matches_machine_hostname`,
  torch/distributed/elastic/rendezvous/utils.py; 127.0.1.1 on a DHCP CT never does).
- **refusals**, each naming the node and what it lacks, with the fixes: the master port not
  reachable from a node; `rendezvous: c10d` asked for where rank 0's name does not resolve;
  torchrun's in-place restarts (`max_restarts` > 0) where only the static backend works (a
  static rendezvous does not bring the other nodes' workers back).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.agent import protocol as p
from launcher.config.models import Target, reachable_address_problem
from launcher.container.agentclient import AgentClient, container_for
from launcher.container.pct import HostConnection
from launcher.core.errors import ExitCode, LauncherError

if TYPE_CHECKING:
    from launcher.jobs.job import Job, JobNodes, NodeResult

Say = Callable[[str, str], None]  # (node, line)

LISTEN_SECONDS = 10.0  # rank 0's listener; it ends as soon as every other node connected
PROBE_SECONDS = 8.0  # each node's connects, retried while rank 0's listener starts
PYTHONS = ("python3",)


class NetworkProblem(LauncherError):
    """The job's network cannot carry torchrun's rendezvous: nothing was changed."""

    def __init__(
        self, message: str, code: ExitCode, hint: str | None = None, node: str | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = code
        self.node = node  # the node that lacks what torchrun needs


@dataclass(frozen=True)
class Interface:
    name: str | None
    address: str
    prefix: int | None

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        if self.prefix is None:
            return None
        return ipaddress.ip_network(f"{self.address}/{self.prefix}", strict=False)


@dataclass(frozen=True)
class NodeFacts:
    """What one node said about itself."""

    name: str
    hostname: str
    fqdn: str
    interfaces: tuple[Interface, ...]
    torch: p.TorchInfo | None

    @property
    def reachable(self) -> list[Interface]:
        """Its addresses other nodes could reach (no loopback, link-local), IPv4 first."""
        usable = [i for i in self.interfaces if reachable_address_problem(i.address) is None]
        return sorted(usable, key=lambda i: ":" in i.address)


@dataclass
class NetworkPlan:
    """The addresses, interfaces and rendezvous a job's run gets, and why."""

    master_addr: str
    addresses: tuple[str, ...]
    ifnames: tuple[str | None, ...]
    backend: str = "c10d"
    local_addrs: tuple[str, ...] = ()
    torch: str | None = None
    notes: list[str] = field(default_factory=list)
    # manage_hosts: each rank's block for its /etc/hosts (the other nodes' names), written
    # just before the launch (launcher.jobs.deploy).
    hosts: tuple[tuple[str, ...], ...] = ()


def facts_from(name: str, answer: p.NetworkAnswer) -> NodeFacts:
    interfaces = tuple(
        Interface(i["name"], i["address"].split("%")[0], i["prefix"]) for i in answer["interfaces"]
    )
    return NodeFacts(name, answer["hostname"], answer["fqdn"], interfaces, answer["torch"])


# --------------------------------------------------------------------------- addresses (pure)


def choose_addresses(
    facts: Sequence[NodeFacts], configured: Sequence[str | None], job: str
) -> tuple[tuple[str, ...], tuple[str | None, ...], str | None]:
    """Each node's address and interface (rank order), and a note when no subnet is common.

    Rank 0's address is its first (IPv4 first) on a subnet every other node has an address
    in; each other node's is its address on rank 0's subnet. A configured address wins."""
    first = facts[0]
    master = configured[0]
    note = None
    if master is None:
        common = [i for i in first.reachable if _everyone_on(i, facts[1:])]
        if not first.reachable:
            said = ", ".join(i.address for i in first.interfaces) or "none but loopback"
            raise NetworkProblem(
                f"{first.name} has no address the other nodes can reach (its addresses: {said})",
                ExitCode.UNREACHABLE,
                hint=f"set jobs.{job}.addresses.{first.name} in the inventory",
                node=first.name,
            )
        master = (common or first.reachable)[0].address
        if not common and len(facts) > 1:
            note = f"no subnet common to every node: {master} is reached through a router"
    home = next((i.network for i in first.interfaces if i.address == master), None)
    addresses = [master]
    for facts_r, wanted in zip(facts[1:], configured[1:], strict=True):
        addresses.append(wanted or _address_towards(facts_r, home))
    ifnames = tuple(
        next((i.name for i in f.interfaces if i.address == a), None)
        for f, a in zip(facts, addresses, strict=True)
    )
    return tuple(addresses), ifnames, note


def _everyone_on(candidate: Interface, others: Sequence[NodeFacts]) -> bool:
    network = candidate.network
    if network is None:
        return False
    return all(any(_inside(i.address, network) for i in o.reachable) for o in others)


def _inside(address: str, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return ipaddress.ip_address(address) in network


def _address_towards(
    node: NodeFacts, network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
) -> str:
    on_it = [i for i in node.reachable if network is not None and _inside(i.address, network)]
    chosen = on_it or node.reachable
    if not chosen:
        return ""  # no address of its own: it only connects, torchrun asks no more of it
    return chosen[0].address


# --------------------------------------------------------------------------- rendezvous (pure)


@dataclass(frozen=True)
class NameCheck:
    """Whether a node resolves another node's advertised name to one of its addresses."""

    node: str
    name: str
    addresses: tuple[str, ...]
    error: str | None
    ok: bool

    def why(self) -> str:
        if self.error or not self.addresses:
            return f"{self.node} cannot resolve {self.name} ({self.error or 'no address'})"
        where = ", ".join(self.addresses)
        return f"{self.node} resolves {self.name} to {where}, not that node's address"


def name_checks(
    facts: Sequence[NodeFacts], resolved: Sequence[dict[str, p.Resolved]]
) -> list[NameCheck]:
    """Every node's advertised name as every other node resolves it (any node may become
    group rank 0); a name two nodes share fails on each (torch orders the nodes by it)."""
    checks = []
    names = [f.fqdn for f in facts]
    for subject in facts:
        own = {i.address for i in subject.reachable}
        shared = names.count(subject.fqdn) > 1
        for node, answers in zip(facts, resolved, strict=True):
            if node is subject:
                continue
            found = answers.get(subject.fqdn, {"addresses": [], "error": "not asked"})
            addresses = tuple(found["addresses"])
            error = f"{subject.fqdn} names more than one node" if shared else found["error"]
            ok = bool(own & set(addresses)) and not shared
            checks.append(NameCheck(node.name, subject.fqdn, addresses, error, ok))
    return checks


def hosts_blocks(
    facts: Sequence[NodeFacts], addresses: Sequence[str]
) -> tuple[tuple[str, ...], ...]:
    """Each node's /etc/hosts block: every other node's address and names (its FQDN, which
    torch publishes, and its hostname)."""
    blocks = []
    for node in facts:
        lines = []
        for other, address in zip(facts, addresses, strict=True):
            if other is not node and address:
                names = dict.fromkeys([other.fqdn, other.hostname])  # once each, in order
                lines.append(" ".join([address, *names]))
        blocks.append(tuple(lines))
    return tuple(blocks)


def choose_rendezvous(
    plan: NetworkPlan,
    facts: Sequence[NodeFacts],
    checks: Sequence[NameCheck],
    *,
    wanted: str,
    max_restarts: int,
    job: str,
    manage_hosts: bool = False,
) -> None:
    """Set `plan.backend` (and `local_addrs`, `hosts`) from what the nodes resolve, their
    torch, and whether launcher writes the names into their /etc/hosts."""
    torches = [f.torch for f in facts]
    found = sorted({t["version"] or "?" for t in torches if t is not None})
    plan.torch = ", ".join(found) or None
    failed = [c for c in checks if not c.ok]
    if wanted == "static":
        plan.backend = "static"
        plan.notes.append(f"rendezvous: static (jobs.{job}.rendezvous)")
        return
    names = [f.fqdn for f in facts]
    if failed and manage_hosts and len(set(names)) == len(names):
        plan.backend = "c10d"
        plan.hosts = hosts_blocks(facts, plan.addresses)
        plan.notes.append(
            "rendezvous: c10d; every node's /etc/hosts gets the other nodes' names before "
            f"the launch (jobs.{job}.manage_hosts)"
        )
        return
    if not failed:
        plan.backend = "c10d"
        plan.notes.append("rendezvous: c10d; every node resolves every other node's name")
        return
    if torches and all(t is not None and t["local_addr"] for t in torches):
        plan.backend = "c10d"
        plan.local_addrs = plan.addresses
        plan.notes.append(
            f"rendezvous: c10d with --local_addr ({failed[0].why()}; torch {plan.torch})"
        )
        return
    why = "; ".join(c.why() for c in failed)
    fixes = (
        "make every node resolve every other node's name to its address (DNS, or "
        f"jobs.{job}.manage_hosts: true to have launcher write them into each node's "
        "/etc/hosts), give the CTs static addresses with names in DNS, or use a torch whose "
        "torchrun has --local_addr"
    )
    if wanted == "c10d":
        raise NetworkProblem(
            f"rendezvous c10d: {why}; torch {plan.torch or 'not found'} publishes a node's "
            "hostname as every worker's MASTER_ADDR, so their init would hang",
            ExitCode.REFUSED,
            hint=f"{fixes}; or set jobs.{job}.rendezvous: static (or auto)",
            node=failed[0].node,
        )
    if max_restarts > 0:
        raise NetworkProblem(
            f"max_restarts {max_restarts} needs the c10d rendezvous, and {why}: a static "
            "rendezvous does not bring the other nodes' workers back after a restart",
            ExitCode.REFUSED,
            hint=f"{fixes}; or set jobs.{job}.max_restarts: 0 (`launcher job watch "
            "--restart-on-failure` restarts the whole job)",
            node=failed[0].node,
        )
    plan.backend = "static"
    plan.notes.append(f"rendezvous: static, by address ({why})")


# --------------------------------------------------------------------------- the round trips


def plan_network(job: Job, nodes: JobNodes, say: Say) -> NetworkPlan:
    """Ask every node, probe the master port, choose (see the module); NetworkProblem when
    the job cannot run on this network. Changes nothing anywhere."""
    targets = nodes.targets
    first = nodes.each(
        lambda rank, target, conn: _ask(target, conn, {"op": "network", "pythons": pythons(target)})
    )
    _raise_first(first, "network check")
    facts = [facts_from(r.target.name, _answer(r.value)) for r in first]
    configured = [job.spec.addresses.get(t.name) for t in targets]
    addresses, ifnames, note = choose_addresses(facts, configured, job.name)
    plan = NetworkPlan(addresses[0], addresses, ifnames)
    if note:
        plan.notes.append(note)
    port = job.spec.master_port
    names = sorted({f.fqdn for f in facts})

    def second(rank: int, target: Target, conn: HostConnection) -> p.NetworkAnswer:
        request: p.NetworkRequest = {"op": "network", "resolve": names}
        if rank == 0:
            request["listen"] = {
                "port": port,
                "seconds": LISTEN_SECONDS,
                "expect": len(targets) - 1,
            }
        else:
            request["probe"] = {"address": plan.master_addr, "port": port, "seconds": PROBE_SECONDS}
        return _ask(target, conn, request, extra=LISTEN_SECONDS)

    probed = nodes.each(second)
    _raise_first(probed, "master port check")
    answers = [_answer(r.value) for r in probed]
    _check_port(answers, [t.name for t in targets], plan.master_addr, port, job.name)
    if answers[0]["listened"] and answers[0]["listened"]["in_use"]:
        plan.notes.append(f"port {port} is in use on {targets[0].name}: probed that listener")
    checks = name_checks(facts, [a["resolved"] for a in answers])
    choose_rendezvous(
        plan,
        facts,
        checks,
        wanted=job.spec.rendezvous,
        max_restarts=job.spec.max_restarts,
        job=job.name,
        manage_hosts=job.spec.manage_hosts,
    )
    for line in plan.notes:
        say(job.name, line)
    return plan


HOSTS_MARKER = "LAUNCHER JOB"


def write_hosts(job: Job, nodes: JobNodes, plan: NetworkPlan, say: Say) -> list[str]:
    """manage_hosts: each node's /etc/hosts block written, all nodes at once; the nodes where
    it failed, with why (empty: every node has its block)."""
    marker = f"{HOSTS_MARKER} {job.name}"

    def one(rank: int, target: Target, conn: HostConnection) -> p.NetworkAnswer:
        block: p.HostsBlock = {"marker": marker, "lines": list(plan.hosts[rank])}
        return _ask(target, conn, {"op": "network", "hosts": block})

    written = nodes.each(one)
    for result in written:
        if result.ok:
            say(result.target.name, f"/etc/hosts: {len(plan.hosts[result.rank])} other node(s)")
    return [f"{r.target.name}: {r.error.message}" for r in written if r.error is not None]


def pythons(target: Target) -> list[str]:
    """Where the node's torch is looked for: the workdir's virtualenv, then python3."""
    workdir = target.playbook.spec.workdir.rstrip("/")
    return [f"{workdir}/.venv/bin/python", f"{workdir}/current/.venv/bin/python", *PYTHONS]


def _ask(
    target: Target, conn: HostConnection, request: p.NetworkRequest, extra: float = 0.0
) -> p.NetworkAnswer:
    client = AgentClient(container_for(target, conn))
    return client.network(request, timeout=target.host.command_timeout + extra)


def _answer(value: p.NetworkAnswer | None) -> p.NetworkAnswer:
    assert value is not None
    return value


def _raise_first(results: Sequence[NodeResult[Any]], what: str) -> None:
    """The first node's failure as the job's NetworkProblem, naming that node."""
    for result in results:
        error = result.error
        if error is not None:
            node = result.target.name
            raise NetworkProblem(
                f"{what}: {error.message}", error.exit_code, hint=error.hint, node=node
            )


def _check_port(
    answers: Sequence[p.NetworkAnswer], names: Sequence[str], master: str, port: int, job: str
) -> None:
    listened = answers[0]["listened"]
    if listened is not None and not listened["bound"] and not listened["in_use"]:
        raise NetworkProblem(
            f"{names[0]} cannot listen on the master port {port}: {listened['error']}",
            ExitCode.REFUSED,
            hint=f"choose another jobs.{job}.master_port",
            node=names[0],
        )
    unreached = [
        (name, f"{name} ({a['probed']['error']})")
        for name, a in zip(names[1:], answers[1:], strict=True)
        if a["probed"] is not None and not a["probed"]["ok"]
    ]
    if unreached:
        why = ", ".join(text for _, text in unreached)
        raise NetworkProblem(
            f"rank 0's master port {master}:{port} is not reachable from {why}",
            ExitCode.UNREACHABLE,
            hint=f"allow TCP to {master}:{port} between the nodes (firewall), or set "
            f"jobs.{job}.addresses.{names[0]} to an address they reach",
            node=unreached[0][0],
        )

"""A training job across several containers: its nodes in rank order, where the ranks meet, and
one connection per host for every phase of a job command.

Each node is a target running the job's playbook; its run gets the rendezvous facts (`NNODES`,
`NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT`, `JOB_ID`) through the same 0600 run file as the
playbook's `env:` values, never on a command line.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Generic, TypeVar

from launcher.agentclient import container_for
from launcher.cluster import place
from launcher.config import (
    Inventory,
    JobSpec,
    Playbook,
    Target,
    load_playbook,
    reachable_address_problem,
)
from launcher.container import HostConnection
from launcher.errors import ConfigError, LauncherError, RemoteError, UsageError
from launcher.transport.pool import ConnectionPool

RENDEZVOUS_KEYS = ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_ID")

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """A validated job: its nodes (targets running the job's playbook) in rank order."""

    name: str
    spec: JobSpec
    playbook: Playbook
    nodes: tuple[Target, ...]

    @property
    def status_rank(self) -> int:
        return self.spec.status_rank


def load_job(inventory: Inventory, name: str) -> Job:
    """The inventory's job `name`, its playbook loaded and checked against the job's keys."""
    spec = inventory.spec.jobs.get(name)
    if spec is None:
        known = ", ".join(sorted(inventory.spec.jobs)) or "none"
        raise UsageError(f"{inventory.path}: unknown job {name!r} (jobs: {known})")
    document = inventory.document
    playbook = load_playbook(
        inventory.base_dir / spec.playbook,
        referenced_from=document.problem(("jobs", name, "playbook"), ""),
    )
    # The job's values would silently replace the playbook's: say so instead.
    clash = sorted(set(playbook.spec.env) & set(RENDEZVOUS_KEYS))
    if clash:
        raise ConfigError(
            [
                f"{playbook.path}: env: {', '.join(clash)} set by the playbook; "
                f"job {name!r} sets them on every node (remove them from env:)"
            ]
        )
    nodes = tuple(inventory.target(node, playbook) for node in spec.nodes)
    return Job(name, spec, playbook, nodes)


def new_run_id() -> str:
    """As the agent makes one (agent.new_run_id): UTC time and 8 hex digits."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Rendezvous:
    """Where and as what the ranks of one run of a job meet."""

    run_id: str
    job_id: str
    master_addr: str
    master_port: int
    nnodes: int

    def env(self, rank: int) -> dict[str, str]:
        return {
            "NNODES": str(self.nnodes),
            "NODE_RANK": str(rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "JOB_ID": self.job_id,
        }


def with_env(targets: Sequence[Target], rendezvous: Rendezvous) -> list[Target]:
    """Each node's target (rank order) with its rank's rendezvous values added to its env."""
    result = []
    for rank, target in enumerate(targets):
        spec = target.playbook.spec
        env = {**spec.env, **rendezvous.env(rank)}
        playbook = dataclasses.replace(target.playbook, spec=spec.model_copy(update={"env": env}))
        result.append(dataclasses.replace(target, playbook=playbook))
    return result


def choose_address(text: str) -> str | None:
    """From `hostname -I` output: the first address other nodes can reach, IPv4 first."""
    usable = [a for a in text.split() if reachable_address_problem(a.split("%")[0]) is None]
    ipv4 = [a for a in usable if ":" not in a]
    chosen = ipv4 or usable
    return chosen[0] if chosen else None


def node_address(job: Job, node: Target, conn: HostConnection) -> str:
    """The node's address as the other nodes reach it: configured, or the container's own."""
    configured = job.spec.addresses.get(node.name)
    if configured is not None:
        return configured
    result = container_for(node, conn).exec(["hostname", "-I"], timeout=node.host.command_timeout)
    text = result.stdout.decode(errors="replace")
    address = choose_address(text) if result.ok else None
    if address is None:
        said = text.strip() or result.stderr.decode(errors="replace").strip() or "nothing"
        raise RemoteError(
            f"{node.label} has no address the other nodes can reach "
            f"(`hostname -I` said: {said[:200]})",
            hint=f"set jobs.{job.name}.addresses.{node.name} in the inventory",
        )
    return address


@dataclass
class NodeResult(Generic[T]):
    """What one phase came to on one node: a value or the error that stopped it."""

    rank: int
    target: Target
    value: T | None = None
    error: LauncherError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class JobNodes:
    """The job's nodes placed (a cluster target: the node that runs its VMID), one connection
    per host for every phase of the command."""

    def __init__(self, pool: ConnectionPool, nodes: Sequence[Target]) -> None:
        self.pool = pool
        self.targets = [place(node, pool) for node in nodes]
        self._per_host = Counter(t.host_name for t in self.targets)

    def conn(self, target: Target) -> HostConnection:
        return self.pool.get(
            target.host_name, target.host, targets=self._per_host[target.host_name]
        )

    def each(
        self, work: Callable[[int, Target, HostConnection], T], targets: Sequence[Target] = ()
    ) -> list[NodeResult[T]]:
        """`work` on every node at once; one node's failure never stops the others."""
        chosen = list(targets or self.targets)

        def one(rank: int) -> NodeResult[T]:
            target = chosen[rank]
            try:
                return NodeResult(rank, target, value=work(rank, target, self.conn(target)))
            except LauncherError as error:
                return NodeResult(rank, target, error=error)

        with ThreadPoolExecutor(max_workers=len(chosen)) as executor:
            return list(executor.map(one, range(len(chosen))))


def on_job(job: Job, action: Callable[[Job, JobNodes], T]) -> T:
    """`action` on the job's nodes, their hosts' connections opened for it and closed after
    (the one place a job command's connections are handled)."""
    with ConnectionPool() as pool:
        return action(job, JobNodes(pool, job.nodes))

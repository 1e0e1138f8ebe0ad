"""A training job across several containers: its nodes in rank order, where the ranks meet, and
one connection per host for every phase of a job command.

Each node is a target running the job's playbook; its run gets the rendezvous facts (`NNODES`,
`NODE_RANK`, `MASTER_ADDR`, `MASTER_PORT`, `JOB_ID`) through the same 0600 run file as the
playbook's `env:` values, never on a command line, and torchrun's own options as `PET_*`
variables: torchrun reads each option it was not given on its command line from `PET_<OPTION>`
(torch/distributed/argparse_util.py, `env`), so `torchrun --nproc_per_node N train.py` needs no
other flag and a flag given explicitly still wins.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

from launcher.config.models import (
    Inventory,
    JobSpec,
    Playbook,
    Target,
    load_playbook,
)
from launcher.container.pct import HostConnection
from launcher.core.errors import ConfigError, LauncherError, UsageError
from launcher.targets.cluster import place
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


@dataclass(frozen=True)
class Rendezvous:
    """Where and as what the ranks of one run of a job meet, and how torchrun gets there.

    `backend` is torchrun's rendezvous: `c10d` (rank 0's agent hosts the store, told so by
    `is_host`, not left to guess from its hostname) or `static` (every address given, no name
    looked up; jobnet.py says which one a job gets). `local_addrs`: each rank's own address for
    torchrun's `--local_addr` (newer torch; c10d only). `ifnames`: each rank's interface on the
    nodes' common subnet, for gloo and NCCL."""

    run_id: str
    job_id: str
    master_addr: str
    master_port: int
    nnodes: int
    backend: str = "c10d"
    max_restarts: int = 0
    local_addrs: tuple[str, ...] = ()
    ifnames: tuple[str | None, ...] = ()

    def env(self, rank: int) -> dict[str, str]:
        return {
            "NNODES": str(self.nnodes),
            "NODE_RANK": str(rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "JOB_ID": self.job_id,
        }

    def torchrun_env(self, rank: int) -> dict[str, str]:
        """torchrun's options for this rank as `PET_<OPTION>` (argparse_util.env), and the
        interface gloo and NCCL use.

        gloo binds to the address this node's hostname resolves to (ProcessGroupGloo.cpp,
        `createDefaultDevice`): 127.0.1.1 on a Proxmox CT without a static address, which the
        other nodes cannot reach; GLOO_SOCKET_IFNAME names the interface instead."""
        env = {
            "PET_NNODES": str(self.nnodes),
            "PET_NODE_RANK": str(rank),
            "PET_MAX_RESTARTS": str(self.max_restarts),
            "PET_RDZV_ID": self.job_id,
        }
        if self.backend == "static":
            # run.py get_rdzv_endpoint: the static backend's endpoint is master_addr:port,
            # and its agent hands that address (not a hostname) to the workers.
            env["PET_RDZV_BACKEND"] = "static"
            env["PET_MASTER_ADDR"] = self.master_addr
            env["PET_MASTER_PORT"] = str(self.master_port)
        else:
            env["PET_RDZV_BACKEND"] = "c10d"
            env["PET_RDZV_ENDPOINT"] = endpoint(self.master_addr, self.master_port)
            env["PET_RDZV_CONF"] = f"is_host={1 if rank == 0 else 0}"
            if self.local_addrs:
                env["PET_LOCAL_ADDR"] = self.local_addrs[rank]
        ifname = self.ifnames[rank] if rank < len(self.ifnames) else None
        if ifname:
            env["GLOO_SOCKET_IFNAME"] = ifname
            env["NCCL_SOCKET_IFNAME"] = ifname
        return env


def endpoint(address: str, port: int) -> str:
    """`host:port` as torchrun parses it (an IPv6 address in brackets)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def with_env(targets: Sequence[Target], rendezvous: Rendezvous) -> list[Target]:
    """Each node's target (rank order) with its rank's rendezvous values added to its env.

    The playbook's own `env:` wins over torchrun's `PET_*` and the interface variables (a
    playbook that pins one means it); the rendezvous facts themselves it may not set."""
    result = []
    for rank, target in enumerate(targets):
        spec = target.playbook.spec
        env = {**rendezvous.torchrun_env(rank), **spec.env, **rendezvous.env(rank)}
        playbook = dataclasses.replace(target.playbook, spec=spec.model_copy(update={"env": env}))
        result.append(dataclasses.replace(target, playbook=playbook))
    return result


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

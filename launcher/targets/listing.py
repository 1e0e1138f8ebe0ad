"""`launcher ls`: the inventory's targets, one row each, from the inventory alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from launcher.config.models import Inventory
from launcher.core.errors import ExitCode
from launcher.core.requests import LsRequest
from launcher.output.jsonout import envelope

COLUMNS = ("TARGET", "HOST", "VMID", "CLUSTER", "JOBS")


@dataclass(frozen=True)
class TargetRow:
    """A target as the inventory declares it: on a host, or in a cluster (its node found when
    a command runs); the jobs it is a node of."""

    target: str
    host: str | None
    vmid: int
    cluster: str | None
    jobs: tuple[str, ...]

    def cells(self) -> tuple[str, ...]:
        return (
            self.target,
            self.host or "-",
            str(self.vmid),
            self.cluster or "-",
            ",".join(self.jobs) or "-",
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "host": self.host,
            "vmid": self.vmid,
            "cluster": self.cluster,
            "jobs": list(self.jobs),
        }


@dataclass(frozen=True)
class Listing:
    rows: tuple[TargetRow, ...]
    exit_code: ExitCode = ExitCode.OK

    @property
    def summary(self) -> str:
        """The rows as a table, a column each, aligned."""
        lines = [COLUMNS, *(row.cells() for row in self.rows)]
        widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
            for line in lines
        )

    def to_json(self) -> dict[str, Any]:
        items = [row.to_json() for row in self.rows]
        return envelope("ls", items, exit_code=int(self.exit_code), per_target=False)


def run_ls(inventory: Inventory, request: LsRequest) -> Listing:
    """Every target of the inventory, in its order."""
    spec = inventory.spec
    return Listing(
        tuple(
            TargetRow(
                name,
                target.host,
                target.vmid,
                target.cluster,
                tuple(job for job, nodes in spec.jobs.items() if name in nodes.nodes),
            )
            for name, target in spec.targets.items()
        )
    )

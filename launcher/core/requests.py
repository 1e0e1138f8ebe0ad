"""Each command's request: what the CLI's options, `api.Launcher`'s keywords and the Fabric
tasks' options build (`commands.py`), and the one run function for it takes
(`commands.WORKFLOWS`). Frozen dataclasses and nothing else, so that naming a command's
request loads none of the workflows (deploy's is `deploy.DeployOptions`, which every probe
loads anyway)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeOverrides:
    """The probe's settings that override the playbook's `verify:` (None: the playbook's)."""

    wait: float | None = None
    interval: float | None = None
    window: float | None = None
    successes: int | None = None
    failure_threshold: int | None = None


@dataclass(frozen=True)
class VerifyRequest(ProbeOverrides):
    """`launcher verify`: the startup probe with these settings."""


@dataclass(frozen=True)
class StatusRequest:
    """`launcher status`: one poll, nothing to choose but the target."""


@dataclass(frozen=True)
class SmokeRequest:
    """`launcher smoke`: `deploy --restart` (waiting `wait_lock` for a lock), then the probe."""

    overrides: ProbeOverrides
    wait_lock: float = 0.0
    # If the new run fails its probe, put the previous run back (launcher.operate.redeploy).
    rollback_on_failure: bool = False


@dataclass(frozen=True)
class StopRequest:
    """`launcher stop`: C-c, wait `grace` (None: the playbook's stop_grace), kill the rest."""

    grace: float | None = None


@dataclass(frozen=True)
class LogsRequest:
    """`launcher logs`: the last `tail` lines (of the pane with `raw`), then with `follow` the
    new ones; they go to the context's `output` (`raw_output`: unfiltered bytes)."""

    tail: int = 50
    follow: bool = False
    raw: bool = False


@dataclass(frozen=True)
class HistoryRequest:
    """`launcher history`: the newest `limit` deploy records (0: all)."""

    limit: int = 0
    # Two runs (their ids, or the start of them): what changed from the first to the second.
    diff: tuple[str, ...] = ()


@dataclass(frozen=True)
class RollbackRequest:
    """`launcher rollback`: the previous version back, through deploy's transaction."""

    restart: bool = False
    grace: float | None = None
    keep_checkpoints: bool = False
    wait_lock: float = 0.0
    # Start fresh: the put-back run's archived checkpoints stay where they are.
    no_checkpoints: bool = False


@dataclass(frozen=True)
class DoctorRequest:
    """`launcher doctor`: every check a deploy needs, nothing to choose but the target."""

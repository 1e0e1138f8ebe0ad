"""The checks a run is judged by, in the order their results are shown, and what the policy
needs to know of each (see `launcher.verify.policy`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHECKS", "Check", "event_check", "reason_rank", "warmup_check"]

UNRANKED = 1000  # after every ranked check in a reason, in the order the results came


@dataclass(frozen=True)
class Check:
    name: str
    warmup: bool = False  # counts during the warmup: a crash needs no warm run
    event: bool = False  # an event, not a level: "for N polls" says nothing about it
    reason: int = UNRANKED  # where its failure goes in a reason line: the most telling first


CHECKS: tuple[Check, ...] = (
    Check("run", event=True, reason=0),
    Check("alive", warmup=True, event=True, reason=1),
    Check("fatal", warmup=True, event=True, reason=3),
    Check("restarts", warmup=True, event=True, reason=2),
    Check("samples", reason=4),
    Check("queues"),
    Check("throughput"),
    Check("step", reason=5),
    Check("loss", reason=6),
    Check("finite", reason=7),
    Check("gpus"),
)
_BY_NAME = {c.name: c for c in CHECKS}
_NONE = Check("")


def _info(name: str) -> Check:
    # A queue's result is named `queues.<name>`: its check is `queues`.
    return _BY_NAME.get(name.split(".")[0], _NONE)


def warmup_check(name: str) -> bool:
    return _info(name).warmup


def event_check(name: str) -> bool:
    return _info(name).event


def reason_rank(name: str) -> int:
    return _info(name).reason

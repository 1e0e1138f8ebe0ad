"""What the playbook's `verify:` section says the checks expect (thresholds and patterns)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from launcher.verify.gpus import GpuCheckSpec
from launcher.verify.samples import parse_rate

__all__ = ["ChecksSpec", "LossSpec", "QueueSpec", "StepSpec", "ThroughputSpec", "queue_spec"]

# The models are built on first use (defer_build), as launcher.config.models's (_Model says why).


class ThroughputSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    # tok/s ("5Ktok/s" is accepted too). The default is DFlash's floor: another format's run
    # has a floor only when the playbook sets one, in its unit (`rules.numbers._floor`).
    min: float = Field(default=1000.0, ge=0)
    target: float | None = Field(default=None, ge=0)
    rise_margin: float = Field(default=0.05, ge=0)  # later must beat earlier by this fraction
    # Failing below this fraction of the run's own peak; null: no such check.
    drop: float | None = Field(default=0.5, gt=0, lt=1)

    @field_validator("min", "target", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, str) else value


class QueueSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    """One queue's check. A queue prints as a list of depths (`[8, 7, 6]`, one per bucket),
    a depth (`12`) or a depth of a capacity (`12/16`, a fill of 0.75)."""

    # A list's entries (the trainer's buckets); null: any number of entries.
    buckets: int | None = Field(default=None, ge=0, le=1_000_000)
    # `n/total` queues: the fill each poll window must reach at least once; 0: above empty.
    min_fill: float = Field(default=0.0, ge=0, le=1)


def queue_spec(value: int | QueueSpec) -> QueueSpec:
    """`q_pre: 6` is short for `q_pre: {buckets: 6}`."""
    return value if isinstance(value, QueueSpec) else QueueSpec(buckets=value)


_MAX_BUCKETS = 1_000_000


def _queue_entry(value: object) -> object:
    """A queue's setting, checked here so that a wrong one reads as one error at its key
    (a union would report each of its members)."""
    if isinstance(value, QueueSpec):
        return value
    if isinstance(value, dict):
        try:
            return QueueSpec.model_validate(value)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            if first["type"] == "extra_forbidden":
                message = "unknown key (known: buckets, min_fill)"
            raise ValueError(f"{where}: {message}" if where else message) from None
    if type(value) is not int:
        raise PydanticCustomError(
            "int_type", "Input should be a valid integer or {buckets: N, min_fill: F}"
        )
    if not 0 <= value <= _MAX_BUCKETS:
        raise PydanticCustomError(
            "less_than_equal", f"Input should be from 0 to {_MAX_BUCKETS} (entries)"
        )
    return value


QueueEntry = Annotated[int | QueueSpec, BeforeValidator(_queue_entry)]
_DFLASH_QUEUES: dict[str, int | QueueSpec] = {"q_pre": 6, "q_hs": 1}


class StepSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    stall_after: float = Field(default=120.0, gt=0)  # seconds
    # Hung sooner: the step unchanged, nothing printed and nothing written below the checkpoints
    # directory for this long (seconds). A checkpoint save that writes as it goes, however long,
    # is not silent; one that prints nothing and writes nothing is. None: no such check.
    hang_after: float | None = Field(default=None, gt=0)


class LossSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    warn_rise: float = Field(default=0.5, ge=0)  # fraction above the lowest loss seen
    # Failing this fraction above the lowest (smoothed) loss seen; null: no such check.
    max_rise: float | None = Field(default=1.0, gt=0)
    # The loss of a model that predicts nothing (e.g. ln(vocabulary size)); null: unknown.
    ceiling: float | None = Field(default=None, gt=0)


class ChecksSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    fail_patterns: list[str] = Field(
        default_factory=lambda: [
            "Traceback (most recent call last)",
            "CUDA out of memory",
            "OutOfMemoryError",
            "NCCL error",
            "Killed",
        ]
    )
    # Lines a supervisor prints when it restarts the trainer (torchrun's elastic agent).
    restart_patterns: list[str] = Field(
        default_factory=lambda: ["will restart worker group", "Restarting worker group"]
    )
    # DFlash's queues; in another format a queue is judged when its lines carry it (or the
    # playbook names it).
    queues: dict[str, QueueEntry] = Field(default_factory=lambda: _DFLASH_QUEUES.copy())
    throughput: ThroughputSpec = Field(default_factory=ThroughputSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    # Failing polls in a row that end the probe (Kubernetes' failureThreshold).
    failure_threshold: StrictInt = Field(default=3, ge=1, le=1000)
    gpus: GpuCheckSpec = Field(default_factory=GpuCheckSpec)

"""What the playbook's `verify:` section says the checks expect (thresholds and patterns)."""

from __future__ import annotations

from pydantic import BaseModel, Field, StrictInt, field_validator

from launcher.verify.gpus import GpuCheckSpec
from launcher.verify.samples import parse_rate

__all__ = ["ChecksSpec", "LossSpec", "StepSpec", "ThroughputSpec"]

# The models are built on first use (defer_build), as launcher.config's (its _Model says why).


class ThroughputSpec(BaseModel, extra="forbid", allow_inf_nan=False, defer_build=True):
    min: float = Field(default=1000.0, ge=0)  # tok/s; "5Ktok/s" is accepted too
    target: float | None = Field(default=None, ge=0)
    rise_margin: float = Field(default=0.05, ge=0)  # later must beat earlier by this fraction
    # Failing below this fraction of the run's own peak; null: no such check.
    drop: float | None = Field(default=0.5, gt=0, lt=1)

    @field_validator("min", "target", mode="before")
    @classmethod
    def _rate(cls, value: object) -> object:
        return parse_rate(value) if isinstance(value, str) else value


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
    queues: dict[str, int] = Field(default_factory=lambda: {"q_pre": 6, "q_hs": 1})
    throughput: ThroughputSpec = Field(default_factory=ThroughputSpec)
    step: StepSpec = Field(default_factory=StepSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    # Failing polls in a row that end the probe (Kubernetes' failureThreshold).
    failure_threshold: StrictInt = Field(default=3, ge=1, le=1000)
    gpus: GpuCheckSpec = Field(default_factory=GpuCheckSpec)

"""Prometheus metrics of a watcher (text format, served by prometheus_client).

Every series carries `target`, `host` and `vmid`; queue depths also `queue` and `bucket`.
Bound to 127.0.0.1 unless told otherwise: the run's numbers are nobody else's business.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from launcher.verify.gpus import GpuSample

LABELS = ("target", "host", "vmid")
STATUSES = (
    "starting",
    "healthy",
    "unhealthy",
    "unreachable",
    "restarting",
    "stopped",
    "finished",
    "failed",
    "paused",
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def gauge(name: str, doc: str, labels: Sequence[str] = LABELS) -> Gauge:
            return Gauge(name, doc, labels, registry=self.registry)

        self.status = gauge(
            "launcher_watch_status",
            "1 for the target's current status (starting, healthy, unhealthy, unreachable, "
            "restarting, stopped), 0 for the others",
            [*LABELS, "status"],
        )
        self.healthy = gauge("launcher_watch_healthy", "1 when the run is judged healthy")
        self.step = gauge("launcher_train_step", "The newest step reported")
        self.throughput = gauge(
            "launcher_train_throughput",
            "The newest throughput, in the unit the trainer reports (tokens/s for tok/s)",
        )
        self.loss = gauge("launcher_train_loss", "The newest loss")
        self.queue = gauge(
            "launcher_train_queue_depth",
            "Each queue's depth, per bucket",
            [*LABELS, "queue", "bucket"],
        )
        self.fill = gauge(
            "launcher_train_queue_fill",
            "Each queue's fill (0 to 1) when the trainer prints it as `n/total`",
            [*LABELS, "queue"],
        )
        self.since_step = gauge(
            "launcher_train_seconds_since_step",
            "Seconds since the step last advanced (as of the last poll)",
        )
        self.restarts = Counter(
            "launcher_watch_restarts", "Restarts the watcher made", LABELS, registry=self.registry
        )
        self.poll_duration = gauge(
            "launcher_watch_poll_duration_seconds", "How long the last poll took"
        )
        self.poll_success = gauge(
            "launcher_watch_poll_success", "1 when the last poll got an answer"
        )
        gpu_labels = [*LABELS, "gpu"]
        self.gpu_util = gauge(
            "launcher_gpu_utilization_percent",
            "Each GPU's utilization (nvidia-smi utilization.gpu), as of the last poll",
            gpu_labels,
        )
        self.gpu_memory = gauge(
            "launcher_gpu_memory_used_bytes",
            "Each GPU's memory in use (by anyone), as of the last poll",
            gpu_labels,
        )
        self.gpu_held = gauge(
            "launcher_gpu_held_by_run",
            "1 when the run's processes have this GPU's device open",
            gpu_labels,
        )
        self._server: Any = None

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        self._server, _thread = start_http_server(port, addr=address, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def labels(self, target: str, host: str, vmid: int) -> dict[str, str]:
        return {"target": target, "host": host, "vmid": str(vmid)}

    def set_status(self, labels: dict[str, str], status: str) -> None:
        for name in STATUSES:
            self.status.labels(**labels, status=name).set(1.0 if name == status else 0.0)
        self.healthy.labels(**labels).set(1.0 if status == "healthy" else 0.0)

    def set_poll(self, labels: dict[str, str], seconds: float, ok: bool) -> None:
        self.poll_duration.labels(**labels).set(seconds)
        self.poll_success.labels(**labels).set(1.0 if ok else 0.0)

    def set_sample(
        self,
        labels: dict[str, str],
        *,
        step: int | None,
        throughput: float | None,
        loss: float | None,
        queues: Mapping[str, Sequence[float]],
        since_step: float | None,
        fills: Mapping[str, float] | None = None,
    ) -> None:
        _set(self.step, labels, None if step is None else float(step))
        _set(self.throughput, labels, throughput)
        _set(self.loss, labels, loss)
        _set(self.since_step, labels, since_step)
        for name, depths in queues.items():
            for bucket, depth in enumerate(depths):
                self.queue.labels(**labels, queue=name, bucket=str(bucket)).set(depth)
        for name, fill in (fills or {}).items():
            self.fill.labels(**labels, queue=name).set(fill)

    def set_gpus(self, labels: dict[str, str], sample: GpuSample) -> None:
        """Per-GPU gauges (label `gpu`: the index) from one poll."""
        for index in sorted(set(sample.util) | set(sample.held)):
            gpu = {**labels, "gpu": str(index)}
            self.gpu_held.labels(**gpu).set(1.0 if index in sample.held else 0.0)
            util, used = sample.util.get(index), sample.used_mib.get(index)
            if util is not None:
                self.gpu_util.labels(**gpu).set(float(util))
            if used is not None:
                self.gpu_memory.labels(**gpu).set(float(used) * 2**20)


def _set(gauge: Gauge, labels: dict[str, str], value: float | None) -> None:
    # A loss of nan is exported as NaN (Prometheus takes it); nothing known yet: no sample.
    if value is not None and (math.isfinite(value) or math.isnan(value)):
        gauge.labels(**labels).set(value)

"""When the watcher may restart a run: at most N restarts in a sliding window, with backoff.

Pure (times in, decisions out), so the policy is tested without waiting. Times are epoch
seconds, because the restarts are persisted and a restarted watcher must count them too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 3
    window: float = 3600.0
    backoff: float = 5.0  # before the first restart in a window; doubled for each further one
    max_backoff: float = 300.0

    def recent(self, restarts: Sequence[float], now: float) -> list[float]:
        """The restarts that still count: those within the window."""
        return [t for t in restarts if now - t < self.window]

    def allowed(self, restarts: Sequence[float], now: float) -> bool:
        return len(self.recent(restarts, now)) < self.max_restarts

    def delay(self, restarts: Sequence[float], now: float) -> float:
        """Seconds to wait before the next restart: backoff x 2^(restarts in the window)."""
        count = len(self.recent(restarts, now))
        return float(min(self.backoff * 2**count, self.max_backoff))

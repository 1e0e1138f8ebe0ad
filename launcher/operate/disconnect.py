"""`launcher disconnect`: this user's persisted connections and command servers ended now."""

from __future__ import annotations


def disconnect() -> tuple[int, int]:
    """End this user's persisted connections and command servers now (each ends after its idle
    time anyway); how many of each were asked to."""
    from launcher.entry.cmdserver import client
    from launcher.transport import persist

    return len(persist.stop_all()), client.end_all()

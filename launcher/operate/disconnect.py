"""`launcher disconnect`: this user's persisted connections ended now."""

from __future__ import annotations


def disconnect() -> int:
    """End this user's persisted connections now (each ends after its idle time anyway); how
    many were asked to."""
    from launcher.transport import persist

    return len(persist.stop_all())

"""A run's id, made on the client (a job's run, a watcher's restart) as the agent makes one."""

from __future__ import annotations

import secrets
from datetime import datetime, timezone


def new_run_id() -> str:
    """As the agent makes one (agent.base.new_run_id): UTC time and 8 hex digits."""
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"

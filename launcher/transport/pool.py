"""One connection per host for a command's targets: a `Connection` for each, opened lazily."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.transport.connection import Connection
from launcher.transport.resolve import resolve_endpoint

if TYPE_CHECKING:
    from launcher.config.models import HostSpec


class ConnectionPool:
    """One lazily opened connection per host, shared by every target on that host."""

    def __init__(self, ssh_config: Path | None = None) -> None:
        self._ssh_config = ssh_config
        self._connections: dict[str, Connection] = {}
        self._lock = threading.Lock()

    def get(self, name: str, host: HostSpec, *, targets: int = 1) -> Connection:
        """The connection to host `name`; `targets`: how many of this command's targets it
        serves (more than one: their commands share one channel, see Connection.use_relay)."""
        with self._lock:
            conn = self._connections.get(name)
            if conn is None:
                endpoint = resolve_endpoint(name, host, self._ssh_config)
                conn = Connection(endpoint)
                self._connections[name] = conn
        if targets > 1:
            conn.use_relay()
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._connections.values():
                conn.close()
            self._connections.clear()

    def __enter__(self) -> ConnectionPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Fabric's `Connection` over a connection launcher opened (SSHConnection.fabric), for Fabric's
own API: run, sudo, put, get, sftp. Imported only then: Fabric and invoke are not on the path of
a command that only connects.

Opening it opens launcher's connection (or reuses it): the same client, so the same host-key
policy, deadlines, jump hosts and transport as launcher's own channels. Fabric's default client
(which accepts unknown host keys) is replaced before anything is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fabric

from launcher.transport.sshlibs import paramiko

if TYPE_CHECKING:
    from launcher.transport.endpoint import Endpoint


class OpenedConnection(fabric.Connection):  # type: ignore[misc]  # fabric has no types
    """Fabric's Connection whose `open()` is launcher's connect (`connected`)."""

    def __init__(
        self,
        ep: Endpoint,
        connected: Callable[[], paramiko.SSHClient],
        gateway: OpenedConnection | str | None,
    ) -> None:
        # ssh_config was already read the OpenSSH way (launcher.sshconfig): Fabric gets an
        # empty one, and no Fabric config files.
        config = fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True)
        super().__init__(
            ep.hostname,
            user=ep.user,
            port=ep.port,
            config=config,
            gateway=gateway if gateway else False,
            connect_timeout=None,
        )
        self._connected = connected
        self.client: paramiko.SSHClient = connected()

    def open(self) -> Any:
        """launcher's connection, opened if it is not (within its deadline), as Fabric's."""
        self.client = self._connected()
        self.transport = self.client.get_transport()

    def open_gateway(self) -> Any:
        raise RuntimeError("launcher opens the gateway: Fabric's open() is not used")

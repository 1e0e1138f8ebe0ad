"""A host's SSH key before anything trusts it (`launcher init`): fetched in a key exchange of
its own (no login, nothing sent but the handshake), shown by its fingerprint, and written to
known_hosts only when the person says so.

The key type is the one paramiko negotiates, so it is the one every later connection checks.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from launcher.core.errors import ConfigError, ConnectError


@dataclass(frozen=True)
class HostKey:
    entry: str  # the known_hosts name: `address`, or `[address]:port` off port 22
    key_type: str  # e.g. ssh-ed25519
    base64: str
    fingerprint: str  # SHA256:…, as OpenSSH prints it

    def line(self) -> str:
        return f"{self.entry} {self.key_type} {self.base64}\n"


def known_hosts_entry(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


def fetch(address: str, port: int, timeout: float) -> HostKey:
    """The key the host's sshd presents (ConnectError, exit 3: nothing answers as sshd)."""
    from launcher.transport.sshlibs import paramiko

    where = f"{address}:{port}"
    try:
        sock = socket.create_connection((address, port), timeout=timeout)
    except OSError as exc:
        raise ConnectError(
            f"{where}: cannot connect: {exc.strerror or exc}",
            hint="check the address and port, and that sshd runs on the host",
        ) from None
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise ConnectError(f"{where}: no SSH key exchange: {exc}") from None
    finally:
        transport.close()
        sock.close()
    return HostKey(known_hosts_entry(address, port), key.get_name(), key.get_base64(),
                   key.fingerprint)  # fmt: skip


def known(path: Path, key: HostKey) -> str:
    """`same` (this key is known for the host), `changed` (another key of its type is), or
    `unknown`."""
    from launcher.transport.sshlibs import paramiko

    if not path.is_file():
        return "unknown"
    try:
        keys = paramiko.HostKeys(str(path))
    except (OSError, UnicodeDecodeError, paramiko.hostkeys.InvalidHostKey) as exc:
        raise ConfigError([f"{path}: cannot read the known host keys: {exc}"]) from None
    found = keys.lookup(key.entry)
    if found is None or key.key_type not in found:
        return "unknown"
    return "same" if found[key.key_type].get_base64() == key.base64 else "changed"


def remember(path: Path, key: HostKey) -> None:
    """Append the key's line (the file and its directory made private when new)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as handle:
        handle.write(key.line())

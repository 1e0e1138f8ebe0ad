"""A leaf, standard library only: the user's private directory for sockets and the check of
who is at the other end of one. The persisted connection (persist.py, persistserver.py) and
the command server (cmdserver/) both live there; the command server's client imports this
before click, so it imports nothing of launcher's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from pathlib import Path

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def runtime_dir() -> Path | None:
    """The user's private directory for sockets, made if missing; None when it is not a real
    directory owned by the user with mode 0700 (then nothing is persisted or served)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(xdg) / "launcher" if xdg and os.path.isabs(xdg) else None
    if base is None or len(str(base)) > 60:  # a socket path must fit in 108 bytes
        base = Path(f"/tmp/launcher-{os.geteuid()}")
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        base.mkdir(mode=0o700)
    try:
        info = base.lstat()
    except OSError:
        return None
    private = info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0
    return base if os.path.isdir(base) and not base.is_symlink() and private else None


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (SO_PEERCRED, set by the
    kernel at connect: the peer cannot lie about it)."""
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    return int(_PEERCRED.unpack(data)[1])

"""A leaf, standard library only: the user's private directory for sockets and the check of
who is at the other end of one, where the persisted connection (persist.py, persistserver.py)
lives.
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
    directory owned by the user with mode 0700 (then nothing is persisted)."""
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


def connect_own(path: Path, kind: socket.SocketKind, timeout: float) -> socket.socket | None:
    """A connection to a live server of this user's at `path`, or None (nothing listens, or
    another user's process does)."""
    sock = socket.socket(socket.AF_UNIX, kind)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
        if peer_uid(sock) != os.geteuid():
            raise OSError("the socket is served by another user")
        return sock
    except OSError:
        sock.close()
        return None


def listen_private(path: Path, kind: socket.SocketKind) -> socket.socket:
    """A socket listening at `path`, mode 0600 from the start (bound under umask 0177); a file
    left there by a killed server is removed first (the caller holds the path's lock)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    listener = socket.socket(socket.AF_UNIX, kind)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    listener.listen(64)
    return listener

"""Reading a local file with a bound on its size and its type.

A path the user gives (a key, a script) may name a device (`/dev/zero` never ends), a FIFO (its
open blocks until a writer comes) or a file of gigabytes: each would hang launcher or fill its
memory before any check ran. Opened non-blocking, checked by fstat to be a regular file of at
most `limit` bytes, and read no further than that.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class BoundedReadError(OSError):
    """Not a regular file, or larger than the limit; the message says which."""


def regular_file_problem(path: Path | str, limit: int) -> str | None:
    """Why `path` cannot be read within `limit` bytes, or None (stat only, no read)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return _problem(info, limit)


def _problem(info: os.stat_result, limit: int) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a device, FIFO or directory)"
    if info.st_size > limit:
        return f"{info.st_size} bytes, more than the {limit} a file here may have"
    return None


def read_regular(path: Path | str, limit: int) -> bytes:
    """The file's bytes, or BoundedReadError (also OSError for a file that cannot be opened)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    try:
        problem = _problem(os.fstat(fd), limit)
        if problem:
            raise BoundedReadError(problem)
        chunks = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:  # it grew since the fstat
            raise BoundedReadError(f"more than the {limit} bytes a file here may have")
        return data
    finally:
        os.close(fd)

# mypy: allow-untyped-calls
"""The bundle cache in the container: the bundle and its compiled code kept under
/run/launcher by sha256 (see launcher/agent/__init__.py and boot.py)."""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import re
import sys
import time

from launcher.agent.base import random_hex

# --------------------------------------------------------------------------- bundle cache
# The loader (boot.py) hands over the bundle it was sent and has just run, so
# that later calls can send only its sha256. Best effort: a cache that cannot be kept (read-only
# or full /run, a directory that is not ours) only means the bundle travels again. The loader
# hashes the bytes it reads before running them, so nothing stored here is trusted as it lies.

BUNDLE_FILE = r"^agent-[0-9a-f]{64}\.bundle$"
CODE_FILE = r"^agent-([0-9a-f]{64})\.[\w.-]+\.code$"  # <sha256>.<cache_tag>.code
BUNDLE_TMP = r"^\.agent-[0-9a-f]{64}\.(?:bundle|[\w.-]+\.code)\.[0-9a-f]{12}\.tmp$"
BUNDLES_KEPT = 3  # two launcher versions used side by side do not evict each other
BUNDLE_TMP_STALE = 60.0  # a temp file this old was left by a writer that died


def store_bundle(directory, text):
    """Cache `text` as <directory>/agent-<sha256>.bundle (mode 0600, the directory 0700 and
    ours) and prune older bundles; the path, or None when it could not be written."""
    try:
        data = text.encode("utf-8")
        if not private_dir(directory):
            return None
        path = os.path.join(directory, "agent-%s.bundle" % hashlib.sha256(data).hexdigest())
        write_whole(path, data)
        prune_bundles(directory, path)
        return path
    except Exception:  # the op runs whatever happened to its cache
        return None


def code_key(digest, payload):
    """What a cached compiled bundle starts with: binds the marshal `payload` to the bundle's
    sha256 and to this very interpreter (marshal and bytecode change between versions), and
    shows a corrupt file. The loader (boot.py) computes the same to check it."""
    return hashlib.sha256(("%s %s\0" % (digest, sys.version)).encode() + payload).digest()


def store_code(directory, text, codes):
    """Cache the compiled bundle (`codes`, the (module name, code) pairs compiled
    from `text`) as <directory>/agent-<sha256>.<cache_tag>.code, so later calls skip compiling
    it; the path, or None when it could not be written."""
    try:
        tag = sys.implementation.cache_tag
        if not tag or not private_dir(directory):
            return None
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        payload = marshal.dumps(tuple(codes))
        path = os.path.join(directory, "agent-%s.%s.code" % (digest, tag))
        write_whole(path, code_key(digest, payload) + payload)
        return path
    except Exception:  # the op runs whatever happened to its cache
        return None


def private_dir(directory):
    """Make `directory` (not its parents) mode 0700; False when it is not a real directory
    owned by this user (then it is left alone)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if os.path.islink(directory) or not os.path.isdir(directory) or info.st_uid != os.geteuid():
        return False
    if info.st_mode & 0o777 != 0o700:
        os.chmod(directory, 0o700)  # e.g. made earlier by the deploy lock with the umask's mode
    return True


def write_whole(path, data):
    """`data` to `path` through a new 0600 temp file beside it: readers see the whole file or
    the old one, and a failed write (a full disk) leaves nothing behind."""
    tmp = os.path.join(
        os.path.dirname(path), ".%s.%s.tmp" % (os.path.basename(path), random_hex(12))
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def prune_bundles(directory, current):
    """Keep `current` and the newest others up to BUNDLES_KEPT, and the compiled copies of the
    bundles kept; drop the rest and temp files of dead writers."""
    bundles, codes, now = [], [], time.time()
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError):
            if re.match(BUNDLE_FILE, name) and path != current:
                bundles.append((os.lstat(path).st_mtime, path))
            elif re.match(CODE_FILE, name):
                codes.append((name[6:70], path))
            elif re.match(BUNDLE_TMP, name) and now - os.lstat(path).st_mtime > BUNDLE_TMP_STALE:
                os.unlink(path)
    bundles.sort(reverse=True)
    dropped = bundles[BUNDLES_KEPT - 1 :]
    for _, path in dropped:
        with contextlib.suppress(OSError):
            os.unlink(path)
    kept = {os.path.basename(p)[6:-7] for _, p in bundles[: BUNDLES_KEPT - 1]}
    kept.add(os.path.basename(current)[6:-7])
    for digest, path in codes:
        if digest not in kept:
            with contextlib.suppress(OSError):
                os.unlink(path)

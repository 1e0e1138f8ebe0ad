# The loader: what BOOT (launcher.agent.protocol) runs inside the container, in BOOT's own
# namespace, where `m` is the stdin line: {"boot" (this source), "request", and "bundle" (the
# agent's sources, see launcher/agent/__init__.py) and/or "sha256" (the cache key);
# "cache_dir" is for tests}. It travels on every call, so it is kept small: the client sends it
# without its comment lines and blank lines (agentclient.boot_source; a test checks that this
# changes no code), zlib-compressed in base64 (agentclient.boot_wire).
#
# With a bundle it runs that (and caches it when a sha256 came too); with only the sha256 it runs
# the cached copy whose bytes hash to it, or answers a miss and runs nothing (the client then
# sends the bundle). The cached compiled bundle (<cache>/agent-<sha256>.<cache_tag>.code,
# marshal) saves compiling ~90 KB of source on every call; it is used only after the bundle
# itself has passed its hash, when the file and its directory are ours and writable by nobody
# else, and when its key (cache.code_key: the bundle's sha256, this interpreter's version and
# the code) matches, so a corrupt, foreign or other-version file is compiled afresh instead (and
# rewritten). The answer written, the process ends without the interpreter's teardown (~10 ms).
# Python 3.8, standard library only; imported on the client only for its constants.
from __future__ import annotations

import hashlib
import marshal
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any

CACHE_DIR = "/run/launcher"
MISS_EXIT = 75
MISS_MARKER = "launcher-agent-not-cached"
# Set in each module the loader makes: launcher.agent.protocol skips the typing import then.
BUNDLED = "__launcher_bundled__"


def cached_code(directory: str, digest: str) -> tuple[tuple[str, CodeType], ...] | None:
    try:
        uid = os.geteuid()
        name = "%s/agent-%s.%s.code" % (directory, digest, sys.implementation.cache_tag)
        with open(name, "rb") as f:
            info = os.fstat(f.fileno())
            data = f.read()
        parent = os.stat(directory)
        if info.st_uid != uid or parent.st_uid != uid or (info.st_mode | parent.st_mode) & 0o22:
            return None
        key = hashlib.sha256(("%s %s\0" % (digest, sys.version)).encode() + data[32:])
        if key.digest() != data[:32]:
            return None
        codes: tuple[tuple[str, CodeType], ...] = marshal.loads(data[32:])
        return codes
    except Exception:
        return None


def compiled(text: str) -> tuple[tuple[str, CodeType], ...]:
    parts = text.split("\0")
    return tuple(
        (name, compile(source, name.replace(".", "/") + ".py", "exec", dont_inherit=True))
        for name, source in zip(parts[::2], parts[1::2])
    )


def load(line: dict[str, Any]) -> int:
    digest = line.get("sha256")
    text = line.get("bundle")
    directory = line.get("cache_dir", CACHE_DIR)
    codes = None
    if text is None:
        try:
            with open("%s/agent-%s.bundle" % (directory, digest), "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        if hashlib.sha256(data).hexdigest() != digest:
            sys.stderr.write("%s %s\n" % (MISS_MARKER, digest))
            return MISS_EXIT
        text = data.decode()
        codes = cached_code(directory, digest)
    fresh = codes is None
    if codes is None:
        codes = compiled(text)
    for name, unit in codes:
        module = type(sys)(name)
        setattr(module, BUNDLED, True)
        sys.modules[name] = module
        exec(unit, vars(module))
    if digest and "bundle" in line:
        sys.modules["launcher.agent.cache"].store_bundle(directory, text)
    if digest and fresh:
        sys.modules["launcher.agent.cache"].store_code(directory, text, codes)
    status: int = sys.modules["launcher.agent.main"].main(line["request"])
    return status


if __name__ == "__main__":
    result = load(globals()["m"])
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(result)

"""Root filesystems of Debian releases for sandbox containers, built once with debootstrap.

A Proxmox CT is created from a template: its own /etc, /usr, python3 and tmux. The sandbox
builds the same from Debian's packages (`debootstrap --variant=minbase` plus what launcher's
agent needs) and keeps the result in a cache outside any sandbox's state directory (so every
sandbox, the test suite's included, reuses it). Each container sees it through an overlay
(LXC's `overlay:` rootfs: the cached tree as the read-only lower layer, the container's own
directory as the upper one), so a container costs no copy and writes nothing to the cache.
A cached tree is never changed once complete (only a missing one is built).

The cache is safe against a build killed half-way: a build goes to a temporary directory next
to its final place and is renamed into place only once debootstrap finished; a lock serialises
builds of one release by concurrent sandboxes (two test workers, say); leftovers of a killed
build are removed by the next build under the same lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from launcher.core.errors import UsageError

# `host`: the container bind-mounts this machine's /usr (seconds to create, no download).
HOST = "host"
# Release -> what it ships (python3, tmux), for messages and the README.
DISTROS: Mapping[str, str] = {
    "bullseye": "Debian 11: Python 3.9, tmux 3.1c",
    "bookworm": "Debian 12: Python 3.11, tmux 3.3a",
    "trixie": "Debian 13: Python 3.13, tmux 3.5a",
}
CHOICES = (HOST, *DISTROS)
# What launcher's agent needs, and the init a Proxmox template boots: systemd (as PID 1, with
# journald, logind and systemd-tmpfiles, which ages /tmp), and the D-Bus logind talks over.
PACKAGES = ("python3", "tmux", "procps", "systemd", "systemd-sysv", "dbus")
# A cached tree is never changed: one built with other packages has another name (the trees of
# an older launcher, without systemd, stay where they are, unused).
FLAVOUR = "systemd"
DEFAULT_CACHE = Path("/var/cache/launcher-sandbox/rootfs")
CACHE_ENV = "LAUNCHER_SANDBOX_CACHE"
MIRROR_ENV = "LAUNCHER_SANDBOX_MIRROR"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
BUILD_TIMEOUT = 900.0


class RootfsError(UsageError):
    """A root filesystem could not be built (no debootstrap, no mirror, a failed build)."""


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else DEFAULT_CACHE


def mirror() -> str:
    """The Debian mirror apt on this machine uses (a proxy or a local mirror keeps working)."""
    env = os.environ.get(MIRROR_ENV)
    if env:
        return env
    for path in APT_SOURCES:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split()
            # deb822 (`URIs: http://.../debian`) and one-line (`deb http://.../debian bookworm`)
            candidates = words[1:2] if words[:1] in (["URIs:"], ["deb"]) else []
            for uri in candidates:
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


def cached(distro: str, cache: Path | None = None) -> Path:
    """The cached root filesystem of `distro`, built first if it is not there yet."""
    if distro not in DISTROS:
        raise UsageError(f"unknown distribution {distro!r}: use one of {', '.join(CHOICES)}")
    cache = cache or cache_dir()
    final = lower_dir(distro, cache)
    if final.is_dir():
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / f".{final.name}.lock"):
        if final.is_dir():  # another sandbox built it while this one waited
            return final
        for stale in cache.glob(f".{final.name}.build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        build = Path(tempfile.mkdtemp(prefix=f".{final.name}.build-", dir=cache))
        try:
            _debootstrap(distro, build)
            build.chmod(0o755)
            build.rename(final)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            raise
    return final


def _debootstrap(distro: str, target: Path) -> None:
    tool = shutil.which("debootstrap")
    if tool is None:
        raise RootfsError(
            f"the {distro} sandbox container needs debootstrap",
            hint="apt-get install debootstrap (./run setup does), or use --distro host",
        )
    argv = [
        tool,
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        distro,
        str(target),
        mirror(),
    ]
    try:
        result = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RootfsError(f"debootstrap {distro} took over {BUILD_TIMEOUT:.0f}s") from exc
    if result.returncode != 0:
        log = target / "debootstrap" / "debootstrap.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        text += result.stdout.decode(errors="replace") + result.stderr.decode(errors="replace")
        tail = "\n".join(text.strip().splitlines()[-8:])
        raise RootfsError(f"debootstrap {distro} failed (exit {result.returncode}):\n{tail}")


def lower_dir(distro: str, cache: Path | None = None) -> Path:
    """Where `distro`'s cached root filesystem is (built or not)."""
    return (cache or cache_dir()) / f"{distro}-{FLAVOUR}"


def real_path(lower: Path, name: str) -> str:
    """`name` (etc, sbin, ...) with the symlinks of the cached tree resolved inside it: a
    container's own files go to the same place in its upper layer (sbin -> usr/sbin)."""
    path = (lower / name).resolve()
    if not path.is_relative_to(lower.resolve()):
        raise RootfsError(f"{lower / name} leads out of the root filesystem: {path}")
    return str(path.relative_to(lower.resolve()))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)

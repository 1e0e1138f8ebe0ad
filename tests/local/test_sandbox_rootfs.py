"""The sandbox's cache of Debian root filesystems: built once, never half, one build at a time.
debootstrap is a stand-in script on PATH that records its calls (or fails when told to)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from launcher.cli.sandbox import DISTROS
from launcher.core.errors import UsageError
from launcher.sandbox import containers, rootfs

FAKE = """#!/bin/sh
# debootstrap --variant=minbase --include=... DISTRO TARGET MIRROR
echo "$@" >> "{calls}"
[ -e "{fail}" ] && {{ echo "E: Couldn't download packages" >&2; exit 1; }}
sleep {delay}
mkdir -p "$4/etc" "$4/usr/sbin" "$4/debootstrap" && ln -s usr/sbin "$4/sbin"
echo "VERSION_CODENAME=$3" > "$4/etc/os-release"
"""


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "debootstrap"
    script.write_text(FAKE.format(calls=tmp_path / "calls", fail=tmp_path / "fail", delay=0.3))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv(rootfs.MIRROR_ENV, "http://mirror.invalid/debian")
    return tmp_path


def calls(tmp: Path) -> list[str]:
    path = tmp / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_built_once_then_reused(fake: Path) -> None:
    cache = fake / "cache"
    built = rootfs.cached("bullseye", cache)
    assert built == cache / "bullseye-systemd"
    assert (built / "etc" / "os-release").read_text() == "VERSION_CODENAME=bullseye\n"
    (line,) = calls(fake)
    # what the agent needs, and systemd to boot as the container's init, as a Proxmox CT's
    include = "--include=python3,tmux,procps,systemd,systemd-sysv,dbus"
    assert line.startswith(f"--variant=minbase {include} bullseye ")
    assert line.endswith(" http://mirror.invalid/debian")
    assert rootfs.cached("bullseye", cache) == built
    assert len(calls(fake)) == 1
    assert sorted(p.name for p in cache.iterdir()) == [
        ".bullseye-systemd.lock",
        "bullseye-systemd",
    ]


def test_a_killed_build_leaves_no_cache_and_is_redone(fake: Path) -> None:
    cache = fake / "cache"
    half = cache / ".trixie-systemd.build-abc123"  # what a build killed half-way leaves
    (half / "usr").mkdir(parents=True)
    built = rootfs.cached("trixie", cache)
    assert built.is_dir() and not half.exists()
    assert len(calls(fake)) == 1


def test_a_failed_build_leaves_nothing_and_says_why(fake: Path) -> None:
    cache = fake / "cache"
    (fake / "fail").touch()
    with pytest.raises(rootfs.RootfsError, match="Couldn't download packages"):
        rootfs.cached("bookworm", cache)
    assert sorted(p.name for p in cache.iterdir()) == [".bookworm-systemd.lock"]


def test_concurrent_sandboxes_build_once(fake: Path) -> None:
    cache = fake / "cache"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(rootfs.cached("bookworm", cache)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    assert results == [cache / "bookworm-systemd"] * 3
    assert len(calls(fake)) == 1


def test_no_debootstrap_names_the_package_and_the_fast_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(rootfs.RootfsError) as raised:
        rootfs.cached("bookworm", tmp_path / "cache")
    assert "debootstrap" in str(raised.value) and "--distro host" in (raised.value.hint or "")


def test_unknown_release_is_refused_before_anything_runs(fake: Path) -> None:
    with pytest.raises(UsageError, match="unknown distribution 'sid'"):
        rootfs.cached("sid", fake / "cache")
    assert calls(fake) == [] and not (fake / "cache").exists()


def test_mirror_is_the_one_apt_uses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(rootfs.MIRROR_ENV, raising=False)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\nURIs: http://ftp.example.org/debian/\nSuites: bookworm\n")
    monkeypatch.setattr(rootfs, "APT_SOURCES", (tmp_path / "missing", deb822))
    assert rootfs.mirror() == "http://ftp.example.org/debian"
    one_line = tmp_path / "sources.list"
    one_line.write_text("# comment\ndeb http://proxy.example:3142/debian bookworm main\n")
    monkeypatch.setattr(rootfs, "APT_SOURCES", (one_line,))
    assert rootfs.mirror() == "http://proxy.example:3142/debian"
    monkeypatch.setattr(rootfs, "APT_SOURCES", ())
    assert rootfs.mirror() == rootfs.DEFAULT_MIRROR


def test_container_files_go_where_the_tree_has_its_directories(fake: Path) -> None:
    """/sbin is usr/sbin in a merged-/usr tree: the upper layer gets usr/sbin/ctinit."""
    cache = fake / "cache"
    lower = rootfs.cached("bookworm", cache)
    assert rootfs.real_path(lower, "sbin") == "usr/sbin"
    assert rootfs.real_path(lower, "etc") == "etc"
    (lower / "escape").symlink_to("/usr")
    with pytest.raises(rootfs.RootfsError, match="leads out"):
        rootfs.real_path(lower, "escape")


def test_config_of_each_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rootfs.CACHE_ENV, str(tmp_path / "cache"))
    host = containers.config_text(tmp_path, 200)
    assert f"lxc.rootfs.path = dir:{tmp_path}/200/rootfs" in host
    assert "lxc.mount.entry = /usr usr none bind,ro 0 0" in host
    assert "lxc.init.cmd = /sbin/ctinit" in host
    trixie = containers.config_text(tmp_path, 222, "trixie")
    lower = f"{tmp_path}/cache/trixie-systemd"
    assert f"lxc.rootfs.path = overlay:{lower}:{tmp_path}/222/rootfs" in trixie
    assert "lxc.mount.entry" not in trixie
    # a distribution's container boots its own systemd, which halts on SIGRTMIN+3
    assert "lxc.init.cmd = /sbin/init\nlxc.signal.halt = SIGRTMIN+3\n" in trixie
    assert "127.0.1.1\tsandbox-222\n" in containers.hosts_text(222)


def test_cli_offers_every_kind() -> None:
    assert rootfs.CHOICES == DISTROS

"""The sandbox network's /etc/hosts, as Proxmox writes a CT's (pve-container
src/PVE/LXC/Setup/Base.pm, update_etc_hosts): the CT's own name only, on its static address or
on 127.0.1.1 (DHCP); every container's name in every file only when asked (`all`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.sandbox import network

PVE_LOCALHOST = (
    "# --- BEGIN PVE ---\n"
    "127.0.0.1 localhost.localnet localhost\n"
    "::1 localhost.localnet localhost\n"
)


@pytest.mark.parametrize(
    ("mode", "lines"),
    [
        ("static", ["10.213.0.210 sandbox-300"]),
        ("dhcp", ["127.0.1.1 sandbox-300"]),
        ("all", ["10.213.0.210 sandbox-300", "10.213.0.211 sandbox-301"]),
    ],
)
def test_each_container_knows_its_own_name_only_unless_asked(
    tmp_path: Path, mode: str, lines: list[str]
) -> None:
    hosts = tmp_path / "hosts"
    network.write_hosts(hosts, 300, (300, 301), mode)
    assert hosts.read_text() == PVE_LOCALHOST + "".join(f"{line}\n" for line in lines) + (
        "# --- END PVE ---\n"
    )


def test_an_unknown_hosts_mode_is_refused(tmp_path: Path) -> None:
    with pytest.raises(network.NetworkError, match="hosts: 'dns' is not one of"):
        network.enable(tmp_path, tmp_path, (300,), hosts="dns")

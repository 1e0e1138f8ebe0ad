"""launcher: deploy and verify long training runs inside Proxmox LXC containers over SSH."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.core.version import __version__

__all__ = ["Launcher", "__version__"]

if TYPE_CHECKING:
    from launcher.api import Launcher


def __getattr__(name: str) -> Any:
    # Imported on first use only: `launcher --help` must not pay for paramiko and pydantic.
    if name == "Launcher":
        from launcher.api import Launcher

        return Launcher
    raise AttributeError(f"module 'launcher' has no attribute {name!r}")

"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.3 s that `--help`, a config error or a local command never pay."""

from __future__ import annotations

import fabric
import paramiko

__all__ = ["fabric", "paramiko"]

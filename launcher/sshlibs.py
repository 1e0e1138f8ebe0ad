"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.2 s that `--help`, a config error or a local command never pay."""

from __future__ import annotations

import sys

import yaml

# paramiko (for ssh_config's Match exec) and Fabric import invoke, which imports its vendored
# pure-Python PyYAML 5.4 on start-up (~50 ms) only to read invoke/fabric config files with
# yaml.safe_load. invoke's own fallback, for packagers who unvendor it, is the installed
# PyYAML, which launcher has already loaded for its own configuration (with the C loader).
sys.modules.setdefault("invoke.vendor.yaml", yaml)

import fabric  # noqa: E402 - after the line above
import paramiko  # noqa: E402

__all__ = ["fabric", "paramiko"]

"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.2 s that `--help`, a config error or a local command never pay."""

from __future__ import annotations

import sys
import types
from typing import Any

import yaml

# paramiko (for ssh_config's Match exec) and Fabric import invoke, which imports its vendored
# pure-Python PyYAML 5.4 on start-up (~50 ms) only to read invoke/fabric config files with
# yaml.safe_load. invoke's own fallback, for packagers who unvendor it, is the installed
# PyYAML, which launcher has already loaded for its own configuration (with the C loader).
sys.modules.setdefault("invoke.vendor.yaml", yaml)


class _DeferredMock:
    """invoke.context imports `unittest.mock.Mock` for MockContext alone, a test double that
    launcher never makes; importing unittest.mock (and asyncio, ssl, ... with it) costs ~50 ms
    of every connection's start. While Fabric is imported this stands in for it, and makes the
    real Mock if anything ever asks it for one."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from unittest import mock

        return mock.Mock(*args, **kwargs)


_stand_in = types.ModuleType("unittest.mock")
_stand_in.Mock = _DeferredMock  # type: ignore[attr-defined]
_deferred = sys.modules.setdefault("unittest.mock", _stand_in) is _stand_in
try:
    import fabric
    import paramiko
finally:
    if _deferred and sys.modules.get("unittest.mock") is _stand_in:
        del sys.modules["unittest.mock"]  # whoever imports it from now on gets the real one

__all__ = ["fabric", "paramiko"]

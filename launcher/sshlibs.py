"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.2 s that `--help`, a config error or a local command never pay.

What they import is on the way to every connection's handshake (a command that was hinted
connects before its configuration loads: prefetch.py), so three modules they import for
things launcher never uses are stood in for while they load, each turning into the real
module the moment anything asks it for more than the stand-in knows."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _deferred(name: str, attributes: dict[str, Any]) -> types.ModuleType:
    """A stand-in for module `name` that has `attributes`, and imports the real module for
    any other attribute (dropping itself from sys.modules first)."""
    stand_in = types.ModuleType(name)
    stand_in.__dict__.update(attributes)

    def __getattr__(attribute: str) -> Any:
        if attribute.startswith("__"):  # the import system's questions (__path__, ...)
            raise AttributeError(attribute)
        return getattr(_real_module(name, stand_in), attribute)

    stand_in.__getattr__ = __getattr__  # type: ignore[method-assign]
    return stand_in


def _real_module(name: str, stand_in: types.ModuleType) -> types.ModuleType:
    """Module `name` itself, imported now if need be, `stand_in` first dropped from
    sys.modules if it is there."""
    if sys.modules.get(name) is stand_in:
        del sys.modules[name]
    import importlib

    return importlib.import_module(name)


@contextmanager
def _standing_in(name: str, stand_in: types.ModuleType) -> Iterator[None]:
    """`stand_in` is module `name` for the imports in this block, unless the real one is
    already loaded; after it, whoever imports `name` gets the real module."""
    placed = sys.modules.setdefault(name, stand_in) is stand_in
    try:
        yield
    finally:
        if placed and sys.modules.get(name) is stand_in:
            del sys.modules[name]


class _DeferredMock:
    """invoke.context imports `unittest.mock.Mock` for MockContext alone, a test double that
    launcher never makes; importing unittest.mock (and asyncio, ssl, ... with it) costs ~50 ms.
    This makes the real Mock if anything ever asks it for one."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from unittest import mock

        return mock.Mock(*args, **kwargs)


def installed_version(distribution: str) -> str:
    """A distribution's version, from the name of its `.dist-info` folder on sys.path (what
    `importlib.metadata.version` reads it from, for a wheel's install), else as that reads it.

    paramiko's `__init__` imports importlib.metadata (and email, zipfile, csv, ... with it:
    ~30 ms) only for this, its own version, which it puts in the SSH banner."""
    prefix = distribution.replace("-", "_").lower() + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.endswith(".dist-info") and name.lower().startswith(prefix):
                return name[len(prefix) : -len(".dist-info")]
    real: Any = _real_module("importlib.metadata", _metadata)  # not this function's stand-in
    return str(real.version(distribution))


# invoke imports its vendored pure-Python PyYAML 5.4 (~50 ms) only to read invoke/fabric
# config files (Config.load_* with yaml.safe_load), which launcher never asks it to read. Its
# stand-in loads the installed PyYAML (with the C loader), which launcher's own configuration
# loads anyway, when invoke first asks it for yaml.safe_load. It stays: invoke looks it up
# once, at import.
sys.modules.setdefault("invoke.vendor.yaml", _deferred("yaml", {}))

_mock = _deferred("unittest.mock", {"Mock": _DeferredMock})
_metadata = _deferred("importlib.metadata", {"version": installed_version})
with _standing_in("unittest.mock", _mock), _standing_in("importlib.metadata", _metadata):
    import fabric
    import paramiko

__all__ = ["fabric", "paramiko"]

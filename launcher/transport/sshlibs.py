"""paramiko, imported here and only when a connection is opened: ~0.1 s of CPU that `--help`, a
config error or a local command never pay. Fabric is not on this path: launcher drives
paramiko's client itself (sshopen.py), and Fabric's API is built over it on request
(fabricview.py).

paramiko.config imports invoke when it is installed (~27 ms), only to run the command of an
ssh_config `Match exec` in its own parser. It is imported here with invoke hidden, and then given
an invoke that loads on first use: that parser behaves as before, and a later `import invoke`
anywhere in the process finds the real one as usual.

They are imported with the cyclic garbage collector paused (as verify/parse.py pauses it while
it parses a pane): the import makes ~40 % of a command's objects, modules and classes that live
as long as the process, and the collections it would trigger on the way (the process's one full
collection among them) scan everything allocated so far and free nothing. The collector's state
is put back as it was.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
import types
from typing import Any


class _InvokeOnUse(types.ModuleType):
    """Stands in for invoke in paramiko.config: imports it when paramiko first uses it."""

    def __getattr__(self, name: str) -> Any:
        import invoke

        return getattr(invoke, name)


_collecting = gc.isenabled()
gc.disable()
# Hidden only when it is there to import (else paramiko's own ImportError says it is missing).
_hidden = "invoke" not in sys.modules and importlib.util.find_spec("invoke") is not None
if _hidden:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails at once
try:
    import paramiko
    import paramiko.config
finally:
    if _hidden:
        del sys.modules["invoke"]
    if _collecting:
        gc.enable()
if _hidden:
    paramiko.config.invoke = _InvokeOnUse("invoke")  # type: ignore[attr-defined]
    paramiko.config.invoke_import_error = None

__all__ = ["paramiko"]

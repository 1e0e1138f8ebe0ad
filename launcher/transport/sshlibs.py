"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.3 s that `--help`, a config error or a local command never pay.

They are imported with the cyclic garbage collector paused (as verify/parse.py pauses it while
it parses a pane): the import makes ~40 % of a command's objects, modules and classes that live
as long as the process, and the collections it would trigger on the way (a full one among them)
scan everything allocated so far and free nothing: ~25 ms of `launcher status`'s ~70 ms in
the collector. The collector's state is put back as it was.
"""

from __future__ import annotations

import gc

_collecting = gc.isenabled()
gc.disable()
try:
    import fabric
    import paramiko
finally:
    if _collecting:
        gc.enable()

__all__ = ["fabric", "paramiko"]

"""The SSH libraries (paramiko, and Fabric on top of it), imported here and only when a
connection is opened: ~0.15 s of CPU that `--help`, a config error or a local command never pay.

They are imported with the cyclic garbage collector paused (as verify/parse.py pauses it while
it parses a pane): the import makes ~40 % of a command's objects, modules and classes that live
as long as the process, and the collections it would trigger on the way (the process's one full
collection among them) scan everything allocated so far and free nothing. In `launcher status`
with a new connection: 124 collections instead of 85, and about twice the time in the
collector. The collector's state is put back as it was.
"""

from __future__ import annotations

import gc

_collecting = gc.isenabled()
gc.disable()
try:
    # paramiko first, so that `-X importtime` (bench/imports.py) names what costs: paramiko,
    # with invoke (paramiko.config imports it when it is installed, and Fabric needs it), then
    # Fabric's own modules (a few milliseconds).
    import paramiko

    # isort: split
    import fabric
finally:
    if _collecting:
        gc.enable()

__all__ = ["fabric", "paramiko"]

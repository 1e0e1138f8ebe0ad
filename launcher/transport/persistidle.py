"""A leaf, standard library only: how long a host's connection persists when its inventory
sets no control_persist. Read for every host that a command resolves (resolve.py), so it is
apart from the persisted connection's client (persist.py, and the frame format it imports),
which a command that persists nothing never loads."""

from __future__ import annotations

import os

# The idle seconds for a host whose inventory sets no control_persist. The console script sets
# it to INTERACTIVE_IDLE on an interactive terminal (console.py); a user may set it (0: off).
DEFAULT_ENV = "LAUNCHER_CONTROL_PERSIST"
INTERACTIVE_IDLE = 60.0  # as Ansible's ssh connection (ControlPersist=60s)
MAX_IDLE = 24 * 3600.0  # what the inventory allows (config.HostSpec.control_persist)


def default_idle(passphrase: str) -> float:
    """control_persist for a host whose inventory leaves it unset: LAUNCHER_CONTROL_PERSIST's
    seconds, if it is a number within 0..MAX_IDLE (anything else: off); always off for a host
    whose key is unlocked on the terminal, which a background process cannot do."""
    if passphrase == "prompt":
        return 0.0
    try:
        seconds = float(os.environ.get(DEFAULT_ENV, "0"))
    except ValueError:
        return 0.0
    return seconds if 0.0 <= seconds <= MAX_IDLE else 0.0

"""The syntax of one ProxyJump hop, shared by the inventory's check and ssh_config's reader."""

from __future__ import annotations

import re

# One ProxyJump hop: [user@]host[:port], IPv6 in brackets.
JUMP_RE = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^@:\s\[\]]+)(?::(?P<port>.*))?$"
)

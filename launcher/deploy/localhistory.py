"""The local deploy history: one JSON line per deploy, under the user's state directory, for the
operator to read (docs/ci.md); launcher itself reads the container's record."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def history_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(base) / "launcher" / "history.jsonl"


def append_local_history(target: str, record: dict[str, Any]) -> None:
    """Best effort: a history that cannot be written must not fail a deploy that succeeded."""
    path = history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"target": target, **record}, sort_keys=True) + "\n")
    except OSError:
        pass

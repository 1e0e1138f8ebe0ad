"""The local deploy history: one JSON line per deploy, under the user's state directory."""

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


def read_local_history(target: str | None = None) -> list[dict[str, Any]]:
    """Records, newest first, optionally for one target."""
    path = history_path()
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if target is None or record.get("target") == target:
            records.append(record)
    return list(reversed(records))

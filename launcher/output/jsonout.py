"""The one JSON envelope every `--json` output shares (schemas: launcher/schemas/*.schema.json).

`{"schema": "launcher.<command>/<version>", "exit_code": N, "targets": [...], ...}`: the same keys
for one target and for many. With exactly one target, that target's fields are repeated at the
top level, which is how a one-target document looked before the envelope: scripts written for it
keep working.
Only json and click are imported here; the result models live in launcher.schemas.models.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import click

ENVELOPE_KEYS = ("schema", "exit_code", "targets")
# A command's schema version goes up when a field's meaning changes (within a version fields are
# only added). /2 of verify, status and smoke: each target has the run's lifecycle `state`, and
# `verdict`/`exit_code` follow it (a finished run is exit 0, a starting one is 0 in status).
VERSIONS = {"verify": 2, "status": 2, "smoke": 2}


def schema_name(command: str) -> str:
    """`launcher.<command>/<version>`."""
    return f"launcher.{command}/{VERSIONS.get(command, 1)}"


def envelope(
    command: str,
    items: Sequence[Mapping[str, Any]],
    *,
    exit_code: int,
    per_target: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """The document for `command`; `extra` holds keys beside `targets` (inventory, buckets)."""
    document: dict[str, Any] = {"schema": schema_name(command), "exit_code": int(exit_code)}
    if per_target and len(items) == 1:
        document.update((k, v) for k, v in items[0].items() if k not in ENVELOPE_KEYS)
    document.update(extra)
    document["targets"] = [dict(item) for item in items]
    return document


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity (not JSON: `JSON.parse` fails on Python's bare
    `Infinity`) replaced by null. The documents flag what they know to be non-finite; this is
    the net under every field that has no flag of its own."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def emit(document: Mapping[str, Any]) -> None:
    """One document on stdout; progress and errors never go there."""
    click.echo(json.dumps(finite(document), indent=2, allow_nan=False))

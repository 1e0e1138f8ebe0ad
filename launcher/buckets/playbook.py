"""Record a bucket plan in a playbook: top-level `buckets:` and `verify.queues.q_pre`.

The file is edited in place, line by line, so its comments and layout survive: the `buckets`
value is replaced (or a `buckets:` line inserted before `verify:`), and q_pre's value replaced
(or the entry added, or a `queues:` entry written with the default queues and the new q_pre).
The edited text is parsed again and must load as exactly the intended data; when it does not, or
when the layout is one the edit does not handle, the whole file is rewritten with
yaml.safe_dump instead (comments are then lost, and the result says so). Either way the new file
is validated with `load_playbook` before it replaces the old one.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.config.models import load_playbook
from launcher.core.errors import ConfigError
from launcher.verify.spec import queue_spec


@dataclass(frozen=True)
class PlaybookEdit:
    path: Path
    mode: str  # "edited" (comments kept) | "rewritten" (yaml.safe_dump)
    buckets_before: list[int] | None
    q_pre_before: int | None
    q_pre: int


class _CannotEdit(Exception):
    """The layout is not one the line edit handles."""


def record_plan(path: Path, boundaries: list[int]) -> PlaybookEdit:
    """Write the boundaries and q_pre = number of buckets into the playbook at `path`."""
    original = load_playbook(path)  # refuse to touch an invalid playbook (ConfigError, exit 2)
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    spec = original.spec
    # A queue set as {buckets: N, min_fill: F} is written back as such; q_pre becomes a count.
    queues: dict[str, Any] = {
        name: value if isinstance(value, int) else value.model_dump(exclude_defaults=True)
        for name, value in spec.verify.queues.items()
    }
    before = spec.verify.queues.get("q_pre")
    q_pre_before = queue_spec(before).buckets if before is not None else None
    queues["q_pre"] = len(boundaries) - 1
    if q_pre_before is None:
        queues = {"q_pre": queues.pop("q_pre"), **queues}

    wanted = copy.deepcopy(data)
    wanted["buckets"] = list(boundaries)
    verify = wanted.get("verify")
    if not isinstance(verify, dict):
        verify = wanted["verify"] = {}
    verify["queues"] = queues

    mode = "edited"
    try:
        new_text = _line_edit(text, boundaries, queues)
        if yaml.safe_load(new_text) != wanted:
            raise _CannotEdit("the edited text does not load as the intended data")
    except (_CannotEdit, yaml.YAMLError):
        mode = "rewritten"
        new_text = yaml.safe_dump(wanted, sort_keys=False, default_flow_style=None)
    _replace_validated(path, new_text)
    return PlaybookEdit(path, mode, spec.buckets, q_pre_before, queues["q_pre"])


def _replace_validated(path: Path, text: str) -> None:
    """Write `text` beside `path`, load it as a playbook, then move it over `path`."""
    temp = path.with_name(f".{path.name}.buckets-{os.getpid()}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        shutil.copymode(path, temp)
        try:
            load_playbook(temp)
        except ConfigError as exc:
            problems = [p.replace(str(temp), str(path)) for p in exc.problems]
            raise ConfigError(
                [*problems, f"{path}: left unchanged (the edited playbook would not load)"]
            ) from None
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def _flow(value: Any) -> str:
    """One-line flow YAML for a list of ints or a flat mapping of ints."""
    return yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()


def _entry(node: yaml.Node, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    if not isinstance(node, yaml.MappingNode):
        raise _CannotEdit("not a mapping")
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def _line_start(text: str, index: int) -> int:
    return text.rfind("\n", 0, index) + 1


def _line_edit(text: str, boundaries: list[int], queues: dict[str, int]) -> str:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        raise _CannotEdit("the playbook is not a block mapping")
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement), non-overlapping
    appended: list[str] = []  # whole lines added at the end of the file

    verify = _entry(root, "verify")
    buckets = _entry(root, "buckets")
    if buckets is not None:
        edits.append(_replace_value(text, *buckets, _flow(list(boundaries))))
    else:
        line = f"buckets: {_flow(list(boundaries))}\n"
        if verify is not None and root.value[0][0] is not verify[0]:
            at = _line_start(text, verify[0].start_mark.index)
            while at > 0:  # comment lines just above `verify:` stay with it
                above = _line_start(text, at - 1)
                if not text[above:at].startswith("#"):
                    break
                at = above
            edits.append((at, at, line))
        else:
            appended.append(line)
    if verify is None:
        appended.append(f"verify:\n  queues: {_flow(queues)}\n")
    else:
        edits.extend(_queue_edits(text, verify[1], queues))

    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    if appended and text and not text.endswith("\n"):
        text += "\n"
    return text + "".join(appended)


def _replace_value(
    text: str, key: yaml.Node, value: yaml.Node, replacement: str
) -> tuple[int, int, str]:
    """Replace a mapping value with a one-line flow value, keeping a trailing comment."""
    if isinstance(value, yaml.ScalarNode) or getattr(value, "flow_style", False):
        if value.start_mark.index == value.end_mark.index:  # `key:` with nothing after it
            return key.end_mark.index, _colon_end(text, key), f": {replacement}"
        return value.start_mark.index, value.end_mark.index, replacement
    if isinstance(value, yaml.SequenceNode) and all(
        isinstance(item, yaml.ScalarNode) for item in value.value
    ):
        # A block sequence's own end mark runs past trailing comments; its last item's does not.
        return key.end_mark.index, value.value[-1].end_mark.index, f": {replacement}"
    raise _CannotEdit("unexpected layout")


def _colon_end(text: str, key: yaml.Node) -> int:
    at = key.end_mark.index
    while at < len(text) and text[at] in " \t":
        at += 1
    if at >= len(text) or text[at] != ":":
        raise _CannotEdit("no ':' after the key")
    return at + 1


def _queue_edits(
    text: str, verify: yaml.Node, queues: dict[str, int]
) -> list[tuple[int, int, str]]:
    entry = _entry(verify, "queues")
    q_pre = str(queues["q_pre"])
    if entry is None:
        return [_add_entry(text, verify, "queues", _flow(queues))]
    key, value = entry
    if not isinstance(value, yaml.MappingNode) or not value.value:
        return [_replace_value(text, key, value, _flow(queues))]
    current = _entry(value, "q_pre")
    if current is None:
        return [_add_entry(text, value, "q_pre", q_pre)]
    q_key, q_value = current
    if not isinstance(q_value, yaml.ScalarNode):
        raise _CannotEdit("q_pre is not a scalar")
    return [_replace_value(text, q_key, q_value, q_pre)]


def _add_entry(text: str, mapping: yaml.Node, key: str, value: str) -> tuple[int, int, str]:
    """Insert `key: value` as the first entry of a non-empty or flow mapping."""
    if not isinstance(mapping, yaml.MappingNode):
        raise _CannotEdit("not a mapping")
    if mapping.flow_style:
        at = mapping.start_mark.index
        if text[at : at + 1] != "{":
            raise _CannotEdit("flow mapping without '{'")
        separator = ", " if mapping.value else ""
        return at + 1, at + 1, f"{key}: {value}{separator}"
    if not mapping.value:
        raise _CannotEdit("empty block mapping")
    first = mapping.value[0][0]
    at = _line_start(text, first.start_mark.index)
    if text[at : first.start_mark.index].strip():
        raise _CannotEdit("first key does not start its line")
    indent = " " * first.start_mark.column
    return at, at, f"{indent}{key}: {value}\n"

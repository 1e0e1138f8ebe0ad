"""YAML loading that remembers where every key came from, so errors can name the line."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.errors import ConfigError


@dataclass(frozen=True)
class YamlDocument:
    """A parsed YAML file plus its node tree, for mapping key paths back to line numbers."""

    path: Path
    data: Any
    root: yaml.Node | None

    def line_of(self, loc: Sequence[str | int]) -> int:
        """The 1-based line of the deepest node on `loc` that exists (a missing key: its parent)."""
        node = self.root
        line = 1 if node is None else node.start_mark.line + 1
        for part in loc:
            child = _child(node, part)
            if child is None:
                break
            key_node, node = child
            line = (key_node or node).start_mark.line + 1
        return line

    def problem(self, loc: Sequence[str | int], message: str) -> str:
        """One error line: `file:line: key.path: message`."""
        where = ".".join(str(p) for p in loc) or "(top level)"
        return f"{self.path}:{self.line_of(loc)}: {where}: {message}"


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if str(key_node.value) == str(part):
                return key_node, value_node
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return None, node.value[part]
    return None


def load_yaml(path: Path, *, what: str) -> YamlDocument:
    """Parse `path` with the safe loader; every failure is a ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: {what} file not found"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot read {what}: {exc}"]) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError([f"{where}: YAML syntax error: {exc.problem or exc}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: YAML syntax error: {exc}"]) from None
    doc = YamlDocument(path=path, data=data, root=root)
    duplicates = list(_duplicate_keys(root, ()))
    if duplicates:
        raise ConfigError([doc.problem(loc, "key appears more than once") for loc in duplicates])
    return doc


def _duplicate_keys(
    node: yaml.Node | None, loc: tuple[str | int, ...]
) -> list[tuple[str | int, ...]]:
    """Key paths defined twice in one mapping (safe_load would silently keep the last one)."""
    found: list[tuple[str | int, ...]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                found.append((*loc, key))
            seen.add(key)
            found.extend(_duplicate_keys(value_node, (*loc, key)))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.extend(_duplicate_keys(item, (*loc, index)))
    return found

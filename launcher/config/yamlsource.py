"""YAML loading that remembers where every key came from, so errors can name the line.

Inventories and playbooks are a few KB. Anything far beyond that is refused before it is walked:
the file size is checked before it is read, and while the document is composed, its nesting
depth, its aliases and its number of values (an alias counts as everything it stands for) are
counted, so neither an alias bomb ("billion laughs") nor deep nesting can make a later step
(construction, the duplicate-key walk, validation) slow or recursive without bound.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader, ReaderError
from yaml.resolver import Resolver
from yaml.scanner import Scanner

from launcher.core.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 64  # nested collections, aliases expanded
MAX_ALIASES = 100
MAX_VALUES = 20_000  # scalars and collections, aliases expanded (a big inventory: ~1000)


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


class _LimitError(yaml.MarkedYAMLError):
    """The document is beyond a limit (depth, aliases, values)."""


class _BoundedComposer(Composer):
    """Composes the node graph while measuring it as if every alias were expanded."""

    peek_event: Callable[[], Any]  # from the parser it is mixed with

    def __init__(self) -> None:
        super().__init__()
        self._aliases = 0
        self._values = 0
        self._depth = 0
        # id(node) -> (values, height) of a finished node, aliases expanded. A collection is
        # measured when it is finished, so an alias to a collection still open is a cycle.
        self._measures: dict[int, tuple[int, int]] = {}

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            alias = super().compose_node(parent, index)  # raises on an undefined alias
            self._alias(str(event.anchor), alias, event.start_mark)
            return alias
        self._depth += 1
        if self._depth > MAX_DEPTH:
            _refuse(f"nested more than {MAX_DEPTH} levels deep", event.start_mark)
        self._count(1, event.start_mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._measures[id(node)] = self._measure(node)
        return node

    def _alias(self, anchor: str, node: Node | None, mark: Any) -> None:
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            _refuse(f"more than {MAX_ALIASES} aliases (*name)", mark)
        measure = self._measures.get(id(node))
        if measure is None:
            _refuse(f"alias *{anchor} is inside the value it refers to (a cycle)", mark)
        values, height = measure
        if self._depth + height > MAX_DEPTH:
            _refuse(f"alias *{anchor} nests the document more than {MAX_DEPTH} levels deep", mark)
        self._count(values, mark)

    def _count(self, values: int, mark: Any) -> None:
        self._values += values
        if self._values > MAX_VALUES:
            _refuse(f"more than {MAX_VALUES} values (aliases expanded)", mark)

    def _measure(self, node: Node | None) -> tuple[int, int]:
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            return 1, 1
        measures = [self._measures[id(child)] for child in children]
        return 1 + sum(m[0] for m in measures), 1 + max((m[1] for m in measures), default=0)


def _refuse(message: str, mark: Any) -> NoReturn:
    raise _LimitError(problem=message, problem_mark=mark)


class _Constructor(SafeConstructor):
    """safe_load's constructor, with bad scalars (`2024-13-01`, `!!int x`) as marked errors."""

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception as exc:
            # PyYAML's constructors fail on odd scalars with whatever they hit: ValueError for
            # `2024-13-01`, AttributeError for an empty `!!timestamp`. The depth is bounded,
            # so this is never a RecursionError.
            problem = f"cannot read this value: {exc or type(exc).__name__}"
            raise ConstructorError(problem=problem, problem_mark=node.start_mark) from None


class _PyLoader(Reader, Scanner, Parser, _BoundedComposer, _Constructor, Resolver):
    def __init__(self, stream: str) -> None:
        Reader.__init__(self, stream)
        Scanner.__init__(self)
        Parser.__init__(self)
        _BoundedComposer.__init__(self)
        _Constructor.__init__(self)
        Resolver.__init__(self)


try:
    from yaml._yaml import CParser

    class _CLoader(_BoundedComposer, CParser, _Constructor, Resolver):
        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            _Constructor.__init__(self)
            Resolver.__init__(self)

    # libyaml's parser (about 20 times faster than the pure-Python one), the bounded composer.
    _Loader: type[_CLoader | _PyLoader] = _CLoader
except ImportError:  # PyYAML built without libyaml
    _Loader = _PyLoader


NOT_FOUND_HINTS = {
    "inventory": "pass -i FILE or set LAUNCHER_INVENTORY (default ./inventory.yaml); "
    "`launcher sandbox up` prints the path of the sandbox's inventory",
    "playbook": "a target's playbook path is relative to the inventory file's directory",
}


def _read_text(path: Path, *, what: str) -> str:
    """The file's text, refusing what is not a regular file of at most MAX_BYTES."""
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([f"{path}: {what} is not a regular file"])
        if info.st_size > MAX_BYTES:
            raise ConfigError([_too_large(path, what, info.st_size)])
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)  # the file may have grown since the stat
        if len(data) > MAX_BYTES:
            raise ConfigError([_too_large(path, what, len(data))])
        return data.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            [f"{path}: {what} file not found"], hint=NOT_FOUND_HINTS.get(what)
        ) from None
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read {what}: {exc.strerror or exc}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            [f"{path}: cannot read {what}: not UTF-8 text ({exc.reason} at byte {exc.start})"]
        ) from None
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError([f"{str(path)!r}: cannot read {what}: {exc}"]) from None


def _too_large(path: Path, what: str, size: int) -> str:
    return f"{path}: {what} is too large ({size} bytes; at most {MAX_BYTES}, 1 MiB)"


def load_yaml(path: Path, *, what: str) -> YamlDocument:
    """Parse `path` with the safe loader; every failure is a ConfigError naming the file."""
    text = _read_text(path, what=what)
    try:
        root, data, duplicates = _compose_and_construct(text)
    except _LimitError as exc:
        raise ConfigError([f"{_where(path, exc)}: {what} refused: {exc.problem}"]) from None
    except yaml.MarkedYAMLError as exc:
        problem = ", ".join(part for part in (exc.context, exc.problem) if part) or str(exc)
        raise ConfigError([f"{_where(path, exc)}: YAML syntax error: {problem}"]) from None
    except ReaderError as exc:  # a control character
        problem = f"unacceptable character #x{exc.character:04x}: {exc.reason}"
        where = _reader_where(path, text, exc.position)
        raise ConfigError([f"{where}: YAML syntax error: {problem}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: YAML syntax error: {exc}"]) from None
    doc = YamlDocument(path=path, data=data, root=root)
    if duplicates:
        raise ConfigError([doc.problem(loc, "key appears more than once") for loc in duplicates])
    return doc


def _compose_and_construct(
    text: str,
) -> tuple[yaml.Node | None, Any, list[tuple[str | int, ...]]]:
    """The node tree, the data, and the duplicate keys, in one bounded parse."""
    loader = _Loader(text)  # the pure-Python reader may already refuse a character here
    try:
        root = loader.get_single_node()
        duplicates = _duplicate_keys(root)
        # Construction rewrites mappings with merge keys (`<<: *base`) in place: keep the
        # nodes as written, for the line numbers of error messages.
        written = [(node, list(node.value)) for node in _merging(root)]
        data = loader.construct_document(root) if root is not None else None
        for node, value in written:
            node.value = value
        return root, data, duplicates
    finally:
        loader.dispose()


def _reader_where(path: Path, text: str, position: int) -> str:
    if _Loader is not _PyLoader:  # libyaml counts UTF-8 bytes, the Python reader characters
        position = len(text.encode()[:position].decode("utf-8", errors="ignore"))
    line = text.count("\n", 0, position) + 1
    column = position - text.rfind("\n", 0, position)
    return f"{path}:{line}:{column}"


def _where(path: Path, exc: yaml.MarkedYAMLError) -> str:
    mark = exc.problem_mark
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)


def _duplicate_keys(
    node: yaml.Node | None,
    loc: tuple[str | int, ...] = (),
    walked: set[int] | None = None,
) -> list[tuple[str | int, ...]]:
    """Key paths defined twice in one mapping (safe_load would silently keep the last one).

    A node shared through aliases is walked once (its duplicates are reported at the first
    path that reaches it), so an alias bomb costs no more than its text. The composer bounds
    the depth, so the recursion is bounded too.
    """
    walked = set() if walked is None else walked
    found: list[tuple[str | int, ...]] = []
    if node is None or isinstance(node, ScalarNode) or id(node) in walked:
        return found
    walked.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in keys:
                found.append((*loc, key))
            keys.add(key)
            found.extend(_duplicate_keys(value_node, (*loc, key), walked))
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found.extend(_duplicate_keys(item, (*loc, index), walked))
    return found


def _merging(root: yaml.Node | None) -> list[yaml.MappingNode]:
    """The mappings that hold a merge key, each once."""
    found: list[yaml.MappingNode] = []
    walked: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, yaml.CollectionNode) or id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.MappingNode):
            if any(key.tag == "tag:yaml.org,2002:merge" for key, _ in node.value):
                found.append(node)
            stack.extend(part for pair in node.value for part in pair)
        else:
            stack.extend(node.value)
    return found

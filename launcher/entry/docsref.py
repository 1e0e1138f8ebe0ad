"""The generated parts of the docs: the configuration keys (from the pydantic models) and the
command reference (from the click tree), so the reference cannot drift from the code.

    python -m launcher.entry.docsref --write   regenerate docs/configuration.md, docs/cli.md
    python -m launcher.entry.docsref --check   exit 1 when either is out of date (a unit test too)
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[2]
CONFIG_PAGE = ROOT / "docs" / "configuration.md"
CLI_PAGE = ROOT / "docs" / "cli.md"
BEGIN, END = "<!-- generated:config:begin -->", "<!-- generated:config:end -->"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        names = " or ".join(_type_name(a) for a in args)
        return names + (" or null" if len(args) < len(typing.get_args(annotation)) else "")
    if origin in (list, tuple):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping of {_type_name(args[1])}" if len(args) == 2 else "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping (below)"
    name = getattr(annotation, "__name__", str(annotation))
    return {"str": "text", "int": "integer", "float": "number", "bool": "true/false"}.get(
        name, name
    )


def _bounds(info: FieldInfo) -> str:
    words = []
    metadata = list(info.metadata)
    optional = typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
    for arg in typing.get_args(info.annotation) if optional else ():  # `Annotated[...] | None`
        if typing.get_origin(arg) is typing.Annotated:
            for item in typing.get_args(arg)[1:]:
                metadata += item.metadata if isinstance(item, FieldInfo) else [item]
    for item in metadata:
        for kind, sign in ((Ge, ">="), (Gt, ">"), (Le, "<="), (Lt, "<")):
            if isinstance(item, kind):
                words.append(f"{sign} {_number(getattr(item, kind.__name__.lower()))}")
        if isinstance(item, MinLen) and item.min_length:
            words.append(f"at least {item.min_length} long")
        if isinstance(item, MaxLen):
            words.append(f"at most {item.max_length} long")
    return ", ".join(words)


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return "(see below)" if isinstance(value, BaseModel) else f"`{value!r}`"
    if info.default is None or info.default is PydanticUndefined:
        return "—"
    return f"`{info.default!r}`".replace("'", "")


def _nested(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _nested(arg)


def model_tables(model: type[BaseModel], path: str) -> list[str]:
    """One table of `model`'s keys, then one per nested model, depth first."""
    rows = [f"### `{path}`", "", "| key | type | default | bounds |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        key = info.alias or name
        rows.append(
            f"| `{key}` | {_type_name(info.annotation)} | {_default(info)} | {_bounds(info)} |"
        )
        for sub in _nested(info.annotation):
            mapping = typing.get_origin(info.annotation) is dict
            nested.append((f"{path}.{key}.NAME" if mapping else f"{path}.{key}", sub))
    out = ["\n".join(rows)]
    for sub_path, sub in nested:
        out.extend(model_tables(sub, sub_path))
    return out


def config_reference() -> str:
    from launcher.config.models import InventorySpec, PlaybookSpec

    parts = ["## Inventory keys", *model_tables(InventorySpec, "inventory")]
    parts += ["## Playbook keys", *model_tables(PlaybookSpec, "playbook")]
    return "\n\n".join(parts).replace("### `inventory`", "### `inventory` (top level)")


def _commands(group: click.Group, prefix: list[str]) -> Iterator[tuple[list[str], click.Command]]:
    ctx = click.Context(group)
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        yield [*prefix, name], command
        if isinstance(command, click.Group):
            yield from _commands(command, [*prefix, name])


def _option_row(param: click.Parameter) -> str:
    if not isinstance(param, click.Option):
        return f"| `{param.human_readable_name}` | argument |"
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    text = re.sub(r"\s+", " ", param.help or "").replace("|", "\\|")
    if param.envvar:
        text += f" (env `{param.envvar}`)"
    return f"| {names} | {text} |"


def cli_reference() -> str:
    from launcher.cli.main import cli

    parts = [
        "# Command reference",
        "",
        "Generated from the CLI itself (`python -m launcher.entry.docsref --write`); every",
        "command's `--help` says the same, with an example and its exit codes. Exit codes for",
        "every command: [README](../README.md#exit-codes).",
    ]
    parts += ["", "## launcher (global options)", "", "| option | meaning |", "|---|---|"]
    parts += [_option_row(p) for p in cli.params if p.name != "help"]
    for path, command in _commands(cli, ["launcher"]):
        summary = (command.help or "").split("\n\n")[0].replace("\n", " ").strip()
        parts += ["", f"## {' '.join(path)}", "", summary]
        rows = [_option_row(p) for p in command.params if p.name != "help"]
        if rows:
            parts += ["", "| option | meaning |", "|---|---|", *rows]
    return "\n".join(parts) + "\n"


def config_page(current: str) -> str:
    """docs/configuration.md with its generated block replaced."""
    start, end = current.index(BEGIN) + len(BEGIN), current.index(END)
    return current[:start] + "\n" + config_reference() + "\n" + current[end:]


def main(argv: list[str]) -> int:
    config_now = CONFIG_PAGE.read_text(encoding="utf-8")
    wanted = {CONFIG_PAGE: config_page(config_now), CLI_PAGE: cli_reference()}
    if argv == ["--write"]:
        for path, content in wanted.items():
            path.write_text(content, encoding="utf-8")
        return 0
    if argv == ["--check"]:
        stale = [p for p, c in wanted.items() if not p.is_file() or p.read_text() != c]
        for path in stale:
            print(
                f"{path} is out of date: python -m launcher.entry.docsref --write", file=sys.stderr
            )
        return 1 if stale else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The status-line formats' readers, one function each, and their registry (`READERS`).

A reader takes one logical line, as the message (after the prefixes launchers and loggers add:
`launcher.verify.lines.message_start`) and as the whole line, and the playbook's `pattern` (for
`regex`); it returns the line's fields as the trainer named them (None or empty: not a status
line of this format) and the minutes elapsed when the line itself says. `formats.LineReader`
then maps the fields to the quantities the checks read. A new format is one reader function
(here or in a module of its own) and one line in `READERS` (and its name in
`formats.FormatName`, the playbook's type: `tests/unit/test_formats.py` checks they agree).
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from launcher.verify.parse import parse_line
from launcher.verify.samples import Share, classify

__all__ = [
    "MAX_OBJECT_CHARS",
    "READERS",
    "Read",
    "Reader",
    "dict_fields",
    "json_fields",
    "keyvalue_fields",
    "kv_value",
    "regex_fields",
]

MAX_OBJECT_CHARS = 64 * 1024  # a JSON / dict line longer than this is not read
_MAX_DEPTH = 32  # nesting of a printed dict that is still read

# A line's fields (None or empty: not a status line) and the elapsed minutes it carries.
Read = tuple[dict[str, object] | None, float | None]
# A format's reader: the message, the whole line and the playbook's pattern in.
Reader = Callable[[str, str, "re.Pattern[str] | None"], Read]


# --- keyvalue -----------------------------------------------------------------------------------

_KV_KEY = r"[A-Za-z_][\w.\-/]*"  # never followed by a key's character
_KV_WORDS = rf"{_KV_KEY}(?: {_KV_KEY})*(?: \([^()\s]{{1,16}}\))?"
_KV_VALUE = r"\[[^\]]*\]?|\"[^\"]*\"?|[^\s|;\[\"][^\s|;]*"  # the match's end
_KV_NUMBER = (
    r"(?:[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:\s*/\s*\d+(?:\.\d+)?)?"
    r"(?:[A-Za-z%µ]+(?:/[A-Za-z]+)?)?|[-+]?(?:nan|NaN|inf|Inf))(?![\w.])"
)
# A field starts a token (line start, whitespace, `|`, `,` or `;` before it): `key=value`,
# `key: value` (the key may be words: `lm loss: 2.5`, `elapsed time per iteration (ms): 512`),
# or words then a number (`iter 100`, `loss 4.2345,`, `iteration   100/ 1000`).
_KV_RE = re.compile(
    rf"(?<![^\s|,;])(?:(?P<a>{_KV_KEY})\s*=\s*(?P<av>{_KV_VALUE})"
    rf"|(?P<b>{_KV_WORDS})\s*:(?!//)\s*(?P<bv>{_KV_VALUE})"
    rf"|(?P<c>{_KV_WORDS})\s+(?P<cv>{_KV_NUMBER}))"
)
_THOUSANDS_RE = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_OF_TOTAL_RE = re.compile(r"([-+]?\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)")  # 100/1000: a Share
_WITH_NOTE_RE = re.compile(r"(.+?)\([^()]*\)")  # 66.91GiB(37.51%) -> 66.91GiB


def kv_value(text: str) -> object:
    """A value as printed in a key/value line: thousands commas, `n/total` and notes read."""
    v = text.rstrip(",;")
    if "," in v and _THOUSANDS_RE.fullmatch(v):
        v = v.replace(",", "")
    else:
        share = _OF_TOTAL_RE.fullmatch(v) if "/" in v else None
        if share is not None:  # a count out of a total: its number is the count
            return Share(float(share[1]), float(share[2]))
        m = _WITH_NOTE_RE.fullmatch(v) if v.endswith(")") else None
        if m is not None:
            v = m[1]
    return classify(v) if v else None


def keyvalue_fields(body: str) -> dict[str, object]:
    fields: dict[str, object] = {}
    for m in _KV_RE.finditer(body):
        key = m["a"] or m["b"] or m["c"]
        fields[key] = kv_value(m["av"] if m["a"] else m["bv"] if m["b"] else m["cv"])
    return fields


def regex_fields(body: str, pattern: re.Pattern[str]) -> dict[str, object] | None:
    m = pattern.search(body)
    if m is None:
        return None
    return {key: kv_value(value) for key, value in m.groupdict().items() if value is not None}


# --- json and python-dict -----------------------------------------------------------------------


def _object_text(body: str) -> str | None:
    # The object is the whole message (after the prefixes): `{...}`, nothing before or after.
    text = body.strip()
    if not text.startswith("{") or not text.endswith("}") or len(text) > MAX_OBJECT_CHARS:
        return None
    return text


def json_fields(body: str) -> dict[str, object] | None:
    text = _object_text(body)
    if text is None:
        return None
    try:
        value = json.loads(text)  # NaN and Infinity are read, as Python's json writes them
    except (ValueError, RecursionError):
        return None
    return _flatten(value) if isinstance(value, dict) else None


def _flatten(
    obj: Mapping[Any, Any], prefix: str = "", out: dict[str, object] | None = None
) -> dict[str, object]:
    """Nested objects as dotted keys; lists as tuples; strings read as values (`"1h30m"`)."""
    out = {} if out is None else out
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            _flatten(value, name + ".", out)
        elif isinstance(value, list | tuple):
            out[name] = tuple(_scalar(v) for v in value)
        else:
            out[name] = _scalar(value)
    return out


def _scalar(value: object) -> object:
    if isinstance(value, str):
        return classify(value) if value else None
    if isinstance(value, dict | list | tuple):
        return None  # nested inside a list: not a reading
    return value


# Names and calls a printed dict may hold: nan/inf (repr of a float), numpy 2's `np.float64(x)`,
# a tensor's `tensor(x, device='cuda:0')`.
_NAMES: dict[str, object] = {
    "nan": math.nan,
    "inf": math.inf,
    "NaN": math.nan,
    "Infinity": math.inf,
    "True": True,
    "False": False,
    "None": None,
    "true": True,
    "false": False,
    "null": None,
}
_WRAPPERS = frozenset(
    ("float", "int", "tensor", "float64", "float32", "float16", "bfloat16", "int64", "int32")
)


class _NotLiteral(Exception):
    pass


def dict_fields(body: str) -> dict[str, object] | None:
    """A printed Python dict's fields, read as `ast.literal_eval` reads literals (never run).

    Beyond literal_eval: `nan`/`inf` (how a float's repr prints), and a number wrapped as
    `np.float64(0.5)` or `tensor(0.5, device='cuda:0')`.
    """
    text = _object_text(body)
    if text is None:
        return None
    try:
        tree = ast.parse(text, mode="eval")
        value = _literal(tree.body, 0)
    except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError, _NotLiteral):
        return None
    return _flatten(value) if isinstance(value, dict) else None


def _literal(node: ast.AST, depth: int) -> object:
    if depth > _MAX_DEPTH:
        raise _NotLiteral
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        out: dict[str, object] = {}
        for k, v in zip(node.keys, node.values, strict=True):
            if k is None:
                raise _NotLiteral  # `**other`
            out[_key(_literal(k, depth + 1))] = _literal(v, depth + 1)
        return out
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return tuple(_literal(e, depth + 1) for e in node.elts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _literal(node.operand, depth + 1)
        if type(operand) not in (int, float):
            raise _NotLiteral
        return -operand if isinstance(node.op, ast.USub) else operand  # type: ignore[operator]
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.Call) and node.args and _callee(node.func) in _WRAPPERS:
        return _literal(node.args[0], depth + 1)
    raise _NotLiteral


def _key(value: object) -> str:
    if isinstance(value, dict | tuple):
        raise _NotLiteral
    return str(value)


def _callee(func: ast.AST) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


# --- the registry -------------------------------------------------------------------------------


def read_dflash(body: str, line: str, pattern: re.Pattern[str] | None) -> Read:
    """DFlash `key=value` lines, as the parser reads them (with its `[Nm]` minutes)."""
    sample = parse_line(line)
    return (None, None) if sample is None else (dict(sample.fields), sample.elapsed_min)


def read_keyvalue(body: str, line: str, pattern: re.Pattern[str] | None) -> Read:
    return keyvalue_fields(body), None


def read_json(body: str, line: str, pattern: re.Pattern[str] | None) -> Read:
    return json_fields(body), None


def read_python_dict(body: str, line: str, pattern: re.Pattern[str] | None) -> Read:
    return dict_fields(body), None


def read_regex(body: str, line: str, pattern: re.Pattern[str] | None) -> Read:
    assert pattern is not None  # the playbook's validation requires one
    return regex_fields(body, pattern), None


READERS: dict[str, Reader] = {
    "dflash": read_dflash,
    "keyvalue": read_keyvalue,
    "json": read_json,
    "python-dict": read_python_dict,
    "regex": read_regex,
}

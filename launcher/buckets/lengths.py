"""Sample lengths from a file: one integer a line, a `.npy` array, or JSON lines with a field.

Every problem is a UsageError (exit 2) that says where: `file:line` for text and JSON lines,
the array index for `.npy`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from launcher.core.errors import UsageError

Lengths = NDArray[np.int64]


@dataclass(frozen=True)
class LengthFile:
    """Lengths as read, in file order, and how to name the place of one of them."""

    path: Path
    kind: str  # "text" | "npy" | "jsonl"
    lengths: Lengths

    def where(self, index: int) -> str:
        """`file:line` (text, JSON lines) or `file[index]` (.npy) of the index-th length."""
        return f"{self.path}[{index}]" if self.kind == "npy" else _line_of(self.path, index)


def _line_of(path: Path, index: int) -> str:
    """`file:line` of the index-th non-blank line (blank lines are skipped but counted)."""
    seen = -1
    with path.open("rb") as stream:
        for number, line in enumerate(stream, start=1):
            if line.strip():
                seen += 1
                if seen == index:
                    return f"{path}:{number}"
    return str(path)


def load_lengths(path: Path, *, field: str | None = None) -> LengthFile:
    """Read `path`: `.npy` by its suffix, JSON lines when `field` is given, otherwise text."""
    if path.suffix == ".npy":
        if field:
            raise UsageError(f"{path}: --field applies to JSON lines, not to a .npy array")
        return LengthFile(path, "npy", _load_npy(path))
    if path.suffix in (".jsonl", ".json", ".ndjson") and not field:
        raise UsageError(
            f"{path}: JSON lines need --field NAME (the key that holds each sample's length)"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = [line for line in data.splitlines() if line.strip()]
    if not lines:
        raise UsageError(f"{path}: no lengths in the file (it is empty)")
    if field:
        return LengthFile(path, "jsonl", _parse_jsonl(path, lines, field))
    return LengthFile(path, "text", _parse_text(path, lines))


def _parse_text(path: Path, lines: list[bytes]) -> Lengths:
    try:
        return np.array([int(line) for line in lines], dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    for index, line in enumerate(lines):
        try:
            value = int(line)
            np.int64(value)
        except (ValueError, OverflowError):
            where = _line_of(path, index)
            text = line.decode("utf-8", "replace").strip()
            raise UsageError(
                f"{where}: not an integer length: {text[:40]!r}",
                hint="the file must hold one integer a line (or use a .npy array or --field)",
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _parse_jsonl(path: Path, lines: list[bytes], field: str) -> Lengths:
    values: list[int] = []
    for index, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError as exc:
            where = _line_of(path, index)
            raise UsageError(f"{where}: not valid JSON: {exc}") from None
        problem = None
        if not isinstance(record, dict):
            problem = "not a JSON object"
        elif field not in record:
            problem = f"no field {field!r}"
        else:
            value = record[field]
            if isinstance(value, bool) or not isinstance(value, int):
                problem = f"field {field!r} is not an integer length: {value!r}"[:120]
            else:
                values.append(value)
        if problem:
            where = _line_of(path, index)
            raise UsageError(f"{where}: {problem}")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        raise UsageError(f"{path}: a length is too large for a 64-bit integer") from None


def _load_npy(path: Path) -> Lengths:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read {path} as a .npy array: {exc}") from None
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        shape = getattr(array, "shape", "?")
        raise UsageError(f"{path}: expected a one-dimensional array of lengths (shape {shape})")
    if array.size == 0:
        raise UsageError(f"{path}: no lengths in the array (it is empty)")
    if np.issubdtype(array.dtype, np.integer):
        if np.issubdtype(array.dtype, np.unsignedinteger) and int(array.max()) > 2**63 - 1:
            raise UsageError(f"{path}: a length is too large for a 64-bit integer")
        return array.astype(np.int64)
    if np.issubdtype(array.dtype, np.floating):
        bad = ~np.isfinite(array) | (array != np.round(array)) | (np.abs(array) > 2**53)
        if bad.any():
            index = int(np.argmax(bad))
            raise UsageError(f"{path}[{index}]: not an integer length: {array[index]!r}")
        return array.astype(np.int64)
    raise UsageError(f"{path}: expected integer lengths, the array holds {array.dtype}")


def check_lengths(
    source: LengthFile, *, budget: int, buckets: int, max_len: int | None
) -> tuple[Lengths, int]:
    """The lengths sorted ascending and the top boundary, or a UsageError naming the problem."""
    lengths = source.lengths
    if buckets < 1:
        raise UsageError(f"--buckets must be at least 1 (got {buckets})")
    if budget < 1:
        raise UsageError(f"--budget must be a positive number of tokens (got {budget})")
    if max_len is not None and max_len < 1:
        raise UsageError(f"--max-len must be a positive length (got {max_len})")
    if len(lengths) == 0:
        raise UsageError(f"{source.path}: no lengths in the file (it is empty)")
    bad = lengths < 1
    if bad.any():
        index = int(np.argmax(bad))
        kind = "negative" if lengths[index] < 0 else "zero"
        raise UsageError(
            f"{source.where(index)}: {kind} length {int(lengths[index])} "
            f"({int(bad.sum())} length(s) below 1); lengths must be positive token counts"
        )
    longest_index = int(np.argmax(lengths))
    longest = int(lengths[longest_index])
    if max_len is not None and longest > max_len:
        over = int((lengths > max_len).sum())
        raise UsageError(
            f"{over} length(s) exceed --max-len {max_len}; the longest is {longest} "
            f"at {source.where(longest_index)}",
            hint="raise --max-len, or drop or truncate those samples first",
        )
    top = max_len if max_len is not None else longest
    if budget < top:
        what = f"--max-len {max_len}" if max_len is not None else f"the longest sample ({longest})"
        raise UsageError(
            f"--budget {budget} is smaller than {what}: such a sample fits in no batch",
            hint=f"use --budget {top} or more",
        )
    ordered = np.sort(lengths)
    distinct = int(np.count_nonzero(np.diff(ordered))) + 1
    if distinct < buckets:
        raise UsageError(
            f"--buckets {buckets} but the data has only {distinct} distinct length(s); "
            "a bucket would stay empty",
            hint=f"use --buckets {distinct} or fewer",
        )
    return ordered, top

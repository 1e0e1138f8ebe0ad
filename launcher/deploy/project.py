"""A project directory as a release: its manifest, the stream of the files a container lacks,
and the differences between two manifests (for --dry-run and --diff).

The manifest lists every file (path, size, mode, sha256), sorted by path. Paths are relative,
normalised, '/'-separated, never absolute, never '..', never with control characters; a symlink
is followed only when it resolves to a regular file inside the project (its content travels, not
the link), so a release never holds a link that leads out of it. The agent checks the same again
(launcher/agent/release.py): nothing from the client is trusted as it arrives.

The stream of missing files is gzip over frames `<sha256> <size>\\n<bytes>`: the agent writes
each blob by its hash, never by a name from the stream. It is made as it is sent, a block at a
time (blob_stream, pieces): the client's memory does not grow with the tree.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
import subprocess
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from launcher.core.errors import UsageError

# Never part of a release: version control data and Python's caches.
ALWAYS_EXCLUDED = (".git", "__pycache__", "*.pyc", ".launcher")


@dataclass(frozen=True)
class Limits:
    max_files: int
    max_bytes: int
    max_file_bytes: int


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    mode: int  # 0o644 or 0o755: only the executable bit travels
    sha256: str
    local: Path

    def as_list(self) -> list[object]:
        return [self.path, self.size, self.mode, self.sha256]


@dataclass(frozen=True)
class Manifest:
    entries: tuple[Entry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def as_lists(self) -> list[list[object]]:
        return [e.as_list() for e in self.entries]

    @property
    def digest(self) -> str:
        """The manifest's own sha256 (what history shows): over its canonical JSON."""
        text = json.dumps(self.as_lists(), separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def by_path(self) -> dict[str, Entry]:
        return {e.path: e for e in self.entries}


def path_problem(rel: str) -> str | None:
    """Why `rel` cannot be a path in a release, or None."""
    if not rel or rel.startswith("/"):
        return "it is empty or absolute"
    if any(ch in rel for ch in "\x00\n\r") or any(ord(ch) < 32 or ord(ch) == 127 for ch in rel):
        return "it contains a newline or another control character"
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "it is not normalised (empty, '.' or '..' parts)"
    if len(rel.encode("utf-8", "surrogateescape")) > 4000:
        return "it is too long"
    return None


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    """gitignore-like: a pattern without '/' matches any path component; one with '/' matches
    the path from the project root; a trailing '/' is dropped (directories are matched by their
    path, which their files start with)."""
    parts = rel.split("/")
    for raw in patterns:
        pattern = raw.strip().rstrip("/")
        if not pattern or pattern.startswith("#"):
            continue
        if "/" in pattern:
            anchored = pattern.lstrip("/")
            if any(
                fnmatch.fnmatchcase("/".join(parts[:i]), anchored) for i in range(1, len(parts) + 1)
            ):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


def _git_ignored(root: Path, candidates: list[str]) -> set[str]:
    """The candidates git ignores (`git check-ignore`, git's own rules), or none without git."""
    if not candidates:
        return set()
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "check-ignore", "--no-index", "-z", "--stdin"],
            input=b"\0".join(c.encode("utf-8", "surrogateescape") for c in candidates) + b"\0",
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()
    if result.returncode not in (0, 1):  # 128: not a git work tree; read .gitignore ourselves
        patterns = _gitignore_patterns(root)
        return {c for c in candidates if _excluded(c, patterns)}
    return {p.decode("utf-8", "surrogateescape") for p in result.stdout.split(b"\0") if p}


def _gitignore_patterns(root: Path) -> list[str]:
    try:
        text = (root / ".gitignore").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip() and not line.startswith("!")]


def build_manifest(
    root: Path, *, exclude: Iterable[str] = (), gitignore: bool = True, limits: Limits
) -> Manifest:
    """Walk `root` and hash every file; UsageError naming the first thing that cannot travel
    (a link out of the tree, a bad name, a limit passed). Limits are checked while walking, so
    a tree of a million files is refused after max_files of them, not after hashing them all."""
    try:
        root = root.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop: RuntimeError before Python 3.13
        raise UsageError(f"project.source {root} cannot be resolved: {_why(exc)}") from None
    if not root.is_dir():
        raise UsageError(f"project.source {root} is not a directory")
    patterns = [*ALWAYS_EXCLUDED, *exclude]
    found: list[tuple[str, Path, os.stat_result]] = []
    total = 0

    def unreadable(error: OSError) -> None:  # os.walk would skip the directory silently
        where = Path(error.filename or root)
        rel = where.relative_to(root).as_posix() if where.is_relative_to(root) else str(where)
        raise UsageError(f"project {root}: {rel!r} cannot be listed: {_why(error)}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=False):
        base = Path(dirpath)
        rel_dir = base.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for name in sorted(dirnames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if _excluded(rel, patterns):
                continue
            _check_name(root, rel)
            if (base / name).is_symlink():
                raise UsageError(
                    f"project {root}: {rel!r} is a symlink to a directory "
                    f"({_link_text(base / name)}); a release holds files only"
                )
            keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if _excluded(rel, patterns):
                continue
            _check_name(root, rel)
            info = _file_stat(root, base / name, rel)
            if info.st_size > limits.max_file_bytes:
                raise UsageError(
                    f"project {root}: {rel!r} is {info.st_size} bytes, over the limit of "
                    f"{limits.max_file_bytes} per file (project.max_file_bytes), or exclude it"
                )
            total += info.st_size
            if total > limits.max_bytes:
                raise UsageError(
                    f"project {root}: more than {limits.max_bytes} bytes in all "
                    "(project.max_bytes); exclude data and outputs, or raise the limit"
                )
            found.append((rel, base / name, info))
            if len(found) > limits.max_files:
                raise UsageError(
                    f"project {root}: more than {limits.max_files} files "
                    "(project.max_files); exclude data and outputs, or raise the limit"
                )
    if gitignore:
        ignored = _git_ignored(root, [rel for rel, _, _ in found])
        found = [item for item in found if item[0] not in ignored]
    entries = [
        Entry(rel, info.st_size, 0o755 if info.st_mode & 0o111 else 0o644,
              _hashed(root, path, rel, info), path)
        for rel, path, info in sorted(found, key=lambda item: item[0])
    ]  # fmt: skip
    if not entries:
        raise UsageError(f"project {root}: no files to deploy (all excluded?)")
    return Manifest(tuple(entries))


def _check_name(root: Path, rel: str) -> None:
    problem = path_problem(rel)
    if problem:
        raise UsageError(f"project {root}: the name {rel!r} cannot be deployed: {problem}")


def _file_stat(root: Path, path: Path, rel: str) -> os.stat_result:
    """The file's stat; a symlink counts only when it resolves to a regular file in the tree."""
    try:
        if path.is_symlink():
            real = path.resolve(strict=True)
            if not real.is_relative_to(root):
                raise UsageError(
                    f"project {root}: {rel!r} is a symlink to {_link_text(path)}, outside the "
                    "project; a release never leads out of itself"
                )
        info = path.stat()
    except (OSError, RuntimeError) as exc:  # gone, unreadable, a symlink loop
        raise UsageError(f"project {root}: {rel!r} cannot be read: {_why(exc)}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"project {root}: {rel!r} is not a regular file")
    return info


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _hashed(root: Path, path: Path, rel: str, info: os.stat_result) -> str:
    """The file's sha256, read as it was listed: one removed or rewritten meanwhile (a trainer
    still writing into the tree) is an error naming it, never a traceback or a wrong entry."""
    try:
        digest = _sha256(path)
        now = path.stat()
    except (OSError, RuntimeError) as exc:
        raise UsageError(
            f"project {root}: {rel!r} vanished or became unreadable while the manifest was "
            f"built: {_why(exc)}; deploy again once the tree is still"
        ) from None
    if (now.st_size, now.st_mtime_ns) != (info.st_size, info.st_mtime_ns):
        raise UsageError(
            f"project {root}: {rel!r} changed while the manifest was built; deploy again "
            "once the tree is still"
        )
    return digest


def _why(exc: BaseException) -> str:
    """An OSError's reason (`Too many levels of symbolic links`), or the error's text."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _link_text(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError as exc:
        return f"unreadable: {_why(exc)}"


BLOCK = 1 << 20  # bytes read, hashed and compressed at a time


@dataclass
class StreamCounts:
    """What a blob stream has carried so far."""

    files: int = 0
    raw_bytes: int = 0  # the files' bytes
    bytes: int = 0  # the compressed stream's


def blob_stream(
    manifest: Manifest, missing: Iterable[str], counts: StreamCounts | None = None
) -> Iterator[bytes]:
    """The gzip stream of the blobs named in `missing` (each once), in pieces as they are
    compressed: each file is read, hashed and compressed a block at a time, so memory does not
    grow with the tree or with a file. A file whose size or sha256 is no longer the manifest's
    raises UsageError (it changed while deploying it)."""
    counts = counts if counts is not None else StreamCounts()
    wanted = set(missing)
    sources = {e.sha256: e for e in manifest.entries if e.sha256 in wanted}
    # wbits 31: the gzip container (a fixed header, mtime 0), as GzipFile(mtime=0) writes it.
    deflate = zlib.compressobj(6, zlib.DEFLATED, 31)

    def out(data: bytes) -> bytes:
        counts.bytes += len(data)
        return data

    for digest, entry in sorted(sources.items()):
        if piece := deflate.compress(f"{digest} {entry.size}\n".encode()):
            yield out(piece)
        hasher, left = hashlib.sha256(), entry.size
        try:
            with entry.local.open("rb") as handle:
                while left:
                    block = handle.read(min(BLOCK, left))
                    if not block:
                        break
                    hasher.update(block)
                    left -= len(block)
                    if piece := deflate.compress(block):
                        yield out(piece)
                longer = bool(handle.read(1))
        except OSError as exc:
            raise UsageError(f"project file {entry.path} cannot be read: {exc.strerror}") from None
        if left or longer or hasher.hexdigest() != digest:
            raise UsageError(f"project file {entry.path} changed while deploying it")
        counts.files += 1
        counts.raw_bytes += entry.size
    yield out(deflate.flush())


def pieces(stream: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The stream regrouped into pieces of `size` bytes (the last one shorter)."""
    buffer = bytearray()
    for data in stream:
        buffer += data
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            del buffer[:size]
    if buffer:
        yield bytes(buffer)


@dataclass(frozen=True)
class Change:
    kind: str  # added | changed | removed
    path: str
    size: int
    old_size: int | None = None


def changes(manifest: Manifest, current: list[list[object]] | None) -> list[Change]:
    """What a deploy of `manifest` changes against the release in place (`current`, the agent's
    manifest rows), sorted by path."""
    old = {str(row[0]): row for row in current or []}
    new = manifest.by_path()
    out: list[Change] = []
    for path in sorted(set(old) | set(new)):
        entry, row = new.get(path), old.get(path)
        if entry is None and row is not None:
            out.append(Change("removed", path, 0, _int(row[1])))
        elif entry is not None and row is None:
            out.append(Change("added", path, entry.size))
        elif (
            entry is not None
            and row is not None
            and (str(row[3]) != entry.sha256 or _int(row[2]) != entry.mode)
        ):
            out.append(Change("changed", path, entry.size, _int(row[1])))
    return out


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


def text_diff(path: str, old: bytes | None, new: bytes | None, *, limit: int = 200) -> list[str]:
    """A unified diff of one file, or one line saying why there is none (binary, too long)."""
    import difflib

    def lines(data: bytes | None) -> list[str] | None:
        if data is None:
            return []
        if b"\0" in data:
            return None
        try:
            return data.decode("utf-8").splitlines()
        except UnicodeDecodeError:
            return None

    a, b = lines(old), lines(new)
    if a is None or b is None:
        return [f"Binary file {path} differs"]
    diff = list(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", lineterm="", n=3))
    if len(diff) > limit:
        diff = [*diff[:limit], f"... {len(diff) - limit} more diff line(s) of {path}"]
    return diff

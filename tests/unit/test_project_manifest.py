"""The client's project manifest: what is in it, what is refused, and what a deploy changes."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.project import (
    Limits,
    blob_stream,
    build_manifest,
    changes,
    path_problem,
    text_diff,
)

LIMITS = Limits(max_files=100, max_bytes=10_000, max_file_bytes=5_000)


def tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "model.py").write_text("X = 1\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o755)
    (root / "outputs").mkdir()
    (root / "outputs" / "big.bin").write_bytes(b"x" * 100)
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    return root


def test_manifest_lists_files_sorted_with_mode_and_hash(tmp_path: Path) -> None:
    manifest = build_manifest(tree(tmp_path), exclude=["outputs/"], gitignore=False, limits=LIMITS)
    rows = manifest.as_lists()
    assert [r[0] for r in rows] == ["pkg/__init__.py", "pkg/model.py", "run.sh"]
    assert rows[1] == ["pkg/model.py", 6, 0o644, hashlib.sha256(b"X = 1\n").hexdigest()]
    assert rows[2][2] == 0o755
    assert len(manifest.digest) == 64


def test_gitignore_is_respected_without_git(tmp_path: Path) -> None:
    root = tree(tmp_path)
    (root / ".gitignore").write_text("outputs/\n*.sh\n")
    paths = [e.path for e in build_manifest(root, limits=LIMITS).entries]
    assert paths == [".gitignore", "pkg/__init__.py", "pkg/model.py"]


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda r: os.symlink("/", r / "root"), "symlink to a directory"),
        (lambda r: os.symlink("/etc/hostname", r / "host"), "outside the project"),
        (lambda r: (r / "bad\nname").write_text(""), "newline"),
        (lambda r: (r / "huge").write_bytes(b"x" * 6000), "per file"),
        (lambda r: [(r / f"f{i}").touch() for i in range(120)], "more than 100 files"),
    ],
)
def test_hostile_trees_are_refused(tmp_path: Path, make: object, needle: str) -> None:
    root = tree(tmp_path)
    make(root)  # type: ignore[operator]
    with pytest.raises(UsageError, match=needle):
        build_manifest(root, exclude=["outputs"], gitignore=False, limits=LIMITS)


def test_a_symlink_inside_the_project_travels_as_its_file(tmp_path: Path) -> None:
    root = tree(tmp_path)
    os.symlink("pkg/model.py", root / "alias.py")
    manifest = build_manifest(root, exclude=["outputs"], gitignore=False, limits=LIMITS)
    assert manifest.by_path()["alias.py"].sha256 == manifest.by_path()["pkg/model.py"].sha256


def test_path_problem() -> None:
    assert path_problem("a/b.py") is None
    for bad in ("", "/abs", "a/../b", "a//b", "./a", "a\nb", "a\x1bb"):
        assert path_problem(bad), bad


def test_changes_and_the_stream(tmp_path: Path) -> None:
    manifest = build_manifest(tree(tmp_path), exclude=["outputs"], gitignore=False, limits=LIMITS)
    old = manifest.as_lists()
    old[1] = ["pkg/model.py", 3, 0o644, "0" * 64]
    old.append(["gone.txt", 9, 0o644, "1" * 64])
    del old[0]
    kinds = [(c.kind, c.path) for c in changes(manifest, old)]
    assert kinds == [("removed", "gone.txt"), ("added", "pkg/__init__.py"),
                     ("changed", "pkg/model.py")]  # fmt: skip
    model = manifest.by_path()["pkg/model.py"]
    stream, files, raw = blob_stream(manifest, [model.sha256])
    assert (files, raw) == (1, 6)
    assert gzip.decompress(stream) == f"{model.sha256} 6\n".encode() + b"X = 1\n"


def test_text_diff() -> None:
    assert "+b" in text_diff("f", b"a\n", b"b\n")
    assert text_diff("f", b"\0", b"x") == ["Binary file f differs"]


@pytest.mark.parametrize(
    "rows",
    [
        [["../etc/passwd", 1, 0o644, "a" * 64]],
        [["/abs", 1, 0o644, "a" * 64]],
        [["a\nb", 1, 0o644, "a" * 64]],
        [["a/./b", 1, 0o644, "a" * 64]],
        [["a", 1, 0o4755, "a" * 64]],
        [["a", -1, 0o644, "a" * 64]],
        [["a", 1, 0o644, "not-a-hash"]],
        [["a", 1, 0o644, "a" * 64], ["a", 1, 0o644, "a" * 64]],
        [["a", 1, 0o644, "a" * 64], ["a/b", 1, 0o644, "a" * 64]],
        [],
    ],
)
def test_the_agent_refuses_bad_manifests(rows: list[list[object]]) -> None:
    from launcher.agent.base import AgentError
    from launcher.agent.release import manifest_param

    with pytest.raises(AgentError):
        manifest_param(rows)


def test_the_agent_reads_only_frames_the_manifest_names(tmp_path: Path) -> None:
    import io

    from launcher.agent.base import AgentError
    from launcher.agent.release import read_frames

    data = b"hello"
    digest = hashlib.sha256(data).hexdigest()
    rows = [["a.txt", 5, 0o644, digest]]
    good = gzip.compress(f"{digest} 5\n".encode() + data)
    assert read_frames(io.BytesIO(good), rows, str(tmp_path)) == 1
    assert (tmp_path / digest).read_bytes() == data
    for bad in (
        gzip.compress(f"{'b' * 64} 5\n".encode() + data),  # not in the manifest
        gzip.compress(f"{digest} 5\n".encode() + b"hell"),  # cut short
        gzip.compress(f"{digest} 5\n".encode() + b"HELLO"),  # wrong content
        gzip.compress(b"../../x 5\n" + data),  # a name, not a hash
    ):
        target = tmp_path / "other"
        target.mkdir(exist_ok=True)
        for leftover in target.iterdir():
            leftover.unlink()
        with pytest.raises(AgentError):
            read_frames(io.BytesIO(bad), rows, str(target))

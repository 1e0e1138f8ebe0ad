"""The client's project manifest: what is in it, what is refused, and what a deploy changes."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from launcher.core.errors import UsageError
from launcher.deploy.project import (
    Limits,
    StreamCounts,
    blob_stream,
    build_manifest,
    changes,
    path_problem,
    pieces,
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


def test_a_symlink_loop_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    root = tree(tmp_path)
    os.symlink("b.py", root / "a.py")
    os.symlink("a.py", root / "b.py")
    with pytest.raises(UsageError, match=r"'a\.py' cannot be read: .*(loop|levels)"):
        build_manifest(root, exclude=["outputs"], gitignore=False, limits=LIMITS)


def test_a_project_source_that_loops_is_a_usage_error(tmp_path: Path) -> None:
    os.symlink(tmp_path / "src", tmp_path / "src")
    with pytest.raises(UsageError, match=r"project.source .*src cannot be resolved"):
        build_manifest(tmp_path / "src", limits=LIMITS)


@pytest.mark.parametrize(
    ("act", "needle"),
    [
        (lambda f: f.unlink(), r"'pkg/model\.py' vanished or became unreadable .* No such file"),
        (lambda f: f.write_text("X = 22\n"), r"'pkg/model\.py' changed while the manifest"),
    ],
    ids=["removed", "rewritten"],
)
def test_a_file_that_goes_while_the_manifest_is_built_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, act: object, needle: str
) -> None:
    """Listed, then removed or rewritten before it is hashed (a trainer writing in the tree):
    between the walk and the hashing, where the .gitignore is asked."""
    root = tree(tmp_path)

    def meanwhile(root: Path, candidates: list[str]) -> set[str]:
        act(root / "pkg" / "model.py")  # type: ignore[operator]
        return set()

    monkeypatch.setattr("launcher.deploy.project._git_ignored", meanwhile)
    with pytest.raises(UsageError, match=needle):
        build_manifest(root, exclude=["outputs"], gitignore=True, limits=LIMITS)


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
    counts = StreamCounts()
    stream = b"".join(blob_stream(manifest, [model.sha256], counts))
    assert (counts.files, counts.raw_bytes, counts.bytes) == (1, 6, len(stream))
    assert gzip.decompress(stream) == f"{model.sha256} 6\n".encode() + b"X = 1\n"


def test_the_stream_is_made_a_block_at_a_time(tmp_path: Path) -> None:
    """A file larger than a block comes out in several pieces, the same bytes as gzip's."""
    (tmp_path / "big.bin").write_bytes(os.urandom(3 << 20))
    limits = Limits(max_files=10, max_bytes=10 << 20, max_file_bytes=10 << 20)
    manifest = build_manifest(tmp_path, gitignore=False, limits=limits)
    entry = manifest.entries[0]
    chunks = list(blob_stream(manifest, [entry.sha256]))
    assert len(chunks) > 2
    data = gzip.decompress(b"".join(chunks))
    assert data == f"{entry.sha256} {3 << 20}\n".encode() + (tmp_path / "big.bin").read_bytes()
    regrouped = list(pieces(chunks, 1 << 20))
    assert [len(p) for p in regrouped[:-1]] == [1 << 20] * (len(regrouped) - 1)
    assert b"".join(regrouped) == b"".join(chunks)


@pytest.mark.parametrize("change", ["content", "longer", "shorter"])
def test_a_file_changed_while_streaming_is_refused(tmp_path: Path, change: str) -> None:
    (tmp_path / "a.txt").write_text("12345")
    manifest = build_manifest(tmp_path, gitignore=False, limits=LIMITS)
    new = {"content": "54321", "longer": "123456", "shorter": "1234"}[change]
    (tmp_path / "a.txt").write_text(new)
    with pytest.raises(UsageError, match=r"a\.txt changed while deploying it"):
        list(blob_stream(manifest, [manifest.entries[0].sha256]))


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


def test_pushed_pieces_are_read_as_one_stream_and_each_checked(tmp_path: Path) -> None:
    from launcher.agent.base import AgentError
    from launcher.agent.release import PartsReader, parts_param

    data = os.urandom(10_000)
    parts = []
    for n, start in enumerate(range(0, len(data), 3000)):
        piece = data[start : start + 3000]
        path = tmp_path / f".release.launcher-x-{n:05d}.tmp"
        path.write_bytes(piece)
        parts.append([str(path), len(piece), hashlib.sha256(piece).hexdigest()])
    assert parts_param(str(tmp_path), parts) == parts
    reader = PartsReader(parts)
    assert reader.read() == data
    reader.read_to_the_end()
    Path(parts[1][0]).write_bytes(b"x" * parts[1][1])  # same size, other bytes
    with pytest.raises(AgentError, match="piece 2 of 4"):
        PartsReader(parts).read()
    Path(parts[2][0]).unlink()  # a push that wrote nothing
    with pytest.raises(AgentError, match=r"piece 3 of 4 .* is missing"):
        parts_param(str(tmp_path), parts)
    with pytest.raises(AgentError, match="not launcher's"):
        parts_param(str(tmp_path), [["/etc/passwd", 1, "a" * 64]])


def test_reused_setup_output_is_relocated(tmp_path: Path) -> None:
    """Copied, not linked, with the old release's path replaced in text, binary and links."""
    from launcher.agent.release import copy_extras

    old = tmp_path / "releases" / "20261203T081012Z-1a2b3c4d"
    new = tmp_path / "releases" / "20261203T091544Z-5e6f7a8b"
    (old / ".venv" / "bin").mkdir(parents=True)
    new.mkdir()
    (old / "main.py").write_text("print(1)\n")  # in the manifest: not copied
    script = old / ".venv" / "bin" / "tool"
    script.write_text(f"#!{old}/.venv/bin/python\nprint(1)\n")
    script.chmod(0o755)
    blob = b"\0" * ((1 << 20) - 5) + f"{old}/lib".encode() + b"\0" * 10  # across a block
    (old / ".venv" / "lib.so").write_bytes(blob)
    os.symlink(f"{old}/.venv/bin/tool", old / ".venv" / "bin" / "link")
    os.symlink("/usr/bin/python3", old / ".venv" / "bin" / "python")
    pairs = [(os.fsencode(old), os.fsencode(new))]
    files, relocated = copy_extras(str(old), str(new), {"main.py"}, pairs)
    assert (files, relocated) == (2, 2)
    assert not (new / "main.py").exists()
    copied = new / ".venv" / "bin" / "tool"
    assert copied.read_text() == f"#!{new}/.venv/bin/python\nprint(1)\n"
    assert copied.stat().st_mode & 0o777 == 0o755
    assert copied.stat().st_ino != script.stat().st_ino
    assert (new / ".venv" / "lib.so").read_bytes() == blob.replace(
        os.fsencode(old), os.fsencode(new)
    )
    assert os.readlink(new / ".venv" / "bin" / "link") == f"{new}/.venv/bin/tool"
    assert os.readlink(new / ".venv" / "bin" / "python") == "/usr/bin/python3"
    assert script.read_text().startswith(f"#!{old}/")  # the old release is as it was

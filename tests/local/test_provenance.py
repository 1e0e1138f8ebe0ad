"""A deploy's provenance read from a real git work tree (local tier: it runs git)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.deploy.provenance import describe, source_of

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(where: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(where), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        check=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "train.py").write_text("print('step=1')\n")
    (root / "old name.py").write_text("x = 1\n")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    return root


def test_nothing_is_recorded_outside_a_work_tree(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    assert source_of(tmp_path / "train.py") is None
    assert describe(None) is None and describe({"commit": 1}) is None


def test_a_repository_without_a_commit_records_nothing(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    assert source_of(tmp_path) is None


def test_a_clean_tree_is_its_commit_and_branch(repo: Path) -> None:
    source = source_of(repo / "train.py")
    assert source is not None
    assert source["commit"] == git(repo, "rev-parse", "HEAD")
    assert source["branch"] == "main" and source["dirty"] is False
    assert source["changed"] == [] and source["diffstat"] == ""
    assert describe(source) == f"{source['commit'][:12]} (main)"


def test_uncommitted_changes_are_named_with_hostile_paths_unchanged(repo: Path) -> None:
    (repo / "train.py").write_text("print('step=2')\nprint('more')\n")
    git(repo, "mv", "old name.py", "new $(name); 'x'.py")
    (repo / "notes\nwith newline.txt").write_text("untracked")
    source = source_of(repo)
    assert source is not None and source["dirty"] is True
    assert sorted(source["changed"]) == sorted(
        ["train.py", "new $(name); 'x'.py", "notes\nwith newline.txt"]
    )
    assert source["changed_count"] == 3
    assert "2 files changed" in source["diffstat"], source["diffstat"]
    assert describe(source) == f"{source['commit'][:12]} (main) + 3 uncommitted files"


def test_a_detached_head_has_no_branch(repo: Path) -> None:
    git(repo, "checkout", "-q", "--detach")
    source = source_of(repo)
    assert source is not None and source["branch"] is None
    assert describe(source) == f"{source['commit'][:12]} (detached)"


def test_the_repositorys_config_runs_nothing_and_no_lock_is_taken(repo: Path) -> None:
    # core.fsmonitor names a program git would run on `status`: a deploy must not run it.
    ran = repo.parent / "fsmonitor-ran"
    hook = repo.parent / "hook.sh"
    hook.write_text(f"#!/bin/sh\ntouch '{ran}'\n")
    hook.chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(hook))
    index = repo / ".git" / "index"
    before = index.stat().st_mtime_ns
    (repo / "train.py").write_text("changed\n")
    source = source_of(repo)
    assert source is not None and source["dirty"] is True
    assert not ran.exists()
    assert index.stat().st_mtime_ns == before  # GIT_OPTIONAL_LOCKS=0: no index refresh written

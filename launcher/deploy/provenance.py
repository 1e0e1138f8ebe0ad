"""Which code a deploy sent: the git commit of the script's or project's work tree, its branch,
whether it had uncommitted changes and which.

Read with the local `git`, bounded in time and output, and safely: `core.fsmonitor` and hooks
could run a program named in the repository's config, so git runs with them off and with no
optional locks (a deploy must not write into the user's repository). Nothing is recorded when
the source is not in a work tree, git is missing or slow, or the repository is refused
(another user's, `safe.directory`): provenance is information, never a reason to fail.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

GIT_TIMEOUT = 5.0  # seconds for each git call
CHANGED_LIMIT = 50  # uncommitted paths recorded at most (the count is always exact)
OUTPUT_LIMIT = 1 << 20  # bytes of one git answer read at most

# Configuration that would make git run something or write: off for every call.
SAFE_CONFIG = ("-c", "core.fsmonitor=false", "-c", "core.untrackedCache=false")


def _git(where: Path, *args: str) -> str | None:
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", *SAFE_CONFIG, "-C", str(where), *args],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=GIT_TIMEOUT,
            env=env,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or len(done.stdout) > OUTPUT_LIMIT:
        return None
    return done.stdout.decode("utf-8", "replace")


def source_of(path: Path) -> dict[str, Any] | None:
    """The git provenance of `path` (a file or a directory), or None outside a work tree."""
    where = path if path.is_dir() else path.parent
    if not _in_work_tree(where):  # no git process for a source outside any repository
        return None
    status = _git(where, "status", "--porcelain=v2", "--branch", "-z", "--", ".")
    if status is None:
        return None
    commit, branch, changed = _read_status(status)
    if commit is None:  # a repository with no commit yet records nothing
        return None
    stat = (_git(where, "diff", "--shortstat", "HEAD", "--", ".") or "").strip() if changed else ""
    return {
        "commit": commit,
        "branch": branch,
        "dirty": bool(changed),
        "changed": changed[:CHANGED_LIMIT],
        "changed_count": len(changed),
        "diffstat": stat,
    }


def _in_work_tree(where: Path) -> bool:
    """Whether `where` or a parent holds `.git` (a directory, or a file in a linked work tree
    or submodule); with GIT_DIR set, git decides."""
    if os.environ.get("GIT_DIR"):
        return True
    try:
        here = where.resolve()
    except OSError:
        return False
    return any((folder / ".git").exists() for folder in (here, *here.parents))


def _read_status(text: str) -> tuple[str | None, str | None, list[str]]:
    """`git status --porcelain=v2 --branch -z`: the commit, the branch, the changed paths."""
    commit = branch = None
    changed: list[str] = []
    fields = iter(text.split("\0"))
    for entry in fields:
        if entry.startswith("# branch.oid "):
            oid = entry.split(" ", 2)[2]
            commit = None if oid == "(initial)" else oid
        elif entry.startswith("# branch.head "):
            head = entry.split(" ", 2)[2]
            branch = None if head == "(detached)" else head
        elif entry.startswith("1 "):
            changed.append(entry.split(" ", 8)[-1])
        elif entry.startswith("2 "):
            changed.append(entry.split(" ", 9)[-1])
            next(fields, None)  # the path it was renamed or copied from
        elif entry.startswith("u "):
            changed.append(entry.split(" ", 10)[-1])
        elif entry.startswith("? "):
            changed.append(entry[2:])
    return commit, branch, changed


def describe(source: object) -> str | None:
    """One line for people: `a1b2c3d4e5f6 (main) + 2 uncommitted files`; None without one."""
    if not isinstance(source, dict) or not isinstance(source.get("commit"), str):
        return None
    text = str(source["commit"])[:12]
    if source.get("branch"):
        text += f" ({source['branch']})"
    else:
        text += " (detached)"
    count = source.get("changed_count")
    if isinstance(count, int) and count:
        text += f" + {count} uncommitted file{'s' if count != 1 else ''}"
    return text


def describe_overrides(record: dict[str, Any]) -> str:
    """A deploy record's --env/--set/--command as they were typed ("" when none): env names
    only, a `--set env.NAME=…` redacted (launcher.deploy.deploy.override_record)."""
    given = record.get("overrides")
    structured = isinstance(given, dict)
    given = given if isinstance(given, dict) else record  # records from before `overrides`
    told = [f"--env {name}" for name in given.get("env") or []]
    told += [f"--set {item}" for item in given.get("set") or []]
    if structured and given.get("command"):
        told.append(f"--command {shlex.quote(str(given['command']))}")
    return " ".join(told)

"""The client's half of a project release: the manifest, what the container lacks, the stream.

One `releases` round trip asks the agent which of the manifest's files the container already
holds (by sha256, verified there) and what the current release is; the deploy transaction then
carries the missing files (inline while small, else pushed first with `pct push`, a piece at a
time), and the agent builds and checks the release before anything is stopped
(launcher/agent/release.py). The stream is made while it is sent (project.blob_stream): what
the client holds is a piece, whatever the size of the tree.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import posixpath
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from launcher.agent import protocol as p
from launcher.config.models import Target
from launcher.container.agentclient import AgentClient
from launcher.container.pct import Container, Pushed
from launcher.core.errors import UsageError
from launcher.deploy.project import (
    Limits,
    Manifest,
    StreamCounts,
    blob_stream,
    build_manifest,
    changes,
    pieces,
    text_diff,
)

Emit = Callable[[str, str, str], None]


# A stream larger than the inline limit is pushed in pieces of this size: each one is held in
# memory once (a persisted connection's frame holds it base64-encoded, 4/3 of it, besides).
PIECE = 8 * 1024 * 1024
DIFF_LIMIT = 1 << 20  # --diff: files up to this size are shown (the agent's CONTENT_LIMIT)


@dataclass
class PreparedRelease:
    manifest: Manifest
    spec: p.ReleaseSpec
    missing: list[str] = field(default_factory=list)  # sha256s the container lacks
    sent: StreamCounts = field(default_factory=StreamCounts)
    current: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)


def manifest_for(target: Target) -> Manifest:
    playbook = target.playbook
    project = playbook.spec.project
    assert project is not None and playbook.project_source is not None
    limits = Limits(project.max_files, project.max_bytes, project.max_file_bytes)
    return build_manifest(
        playbook.project_source,
        exclude=project.exclude,
        gitignore=project.gitignore,
        limits=limits,
    )


def setup_request(target: Target, manifest: Manifest) -> p.SetupRequest | None:
    """The setup and the hash of its inputs: the commands and each named file's sha256."""
    setup = target.playbook.spec.setup
    if setup is None:
        return None
    files = manifest.by_path()
    inputs = []
    for name in setup.inputs:
        entry = files.get(name)
        if entry is None:
            raise UsageError(
                f"{target.playbook.path}: setup.inputs names {name!r}, which is not in the project"
            )
        inputs.append([name, entry.sha256])
    text = json.dumps({"run": setup.run, "inputs": inputs}, sort_keys=True)
    return {
        "run": list(setup.run),
        "hash": hashlib.sha256(text.encode()).hexdigest(),
        "timeout": setup.timeout,
    }


def prepare(
    target: Target,
    container: Container,
    emit: Emit,
    *,
    timeout: float,
    diff: bool = False,
    plan: bool = False,
) -> PreparedRelease:
    """Manifest, the agent's view, the changes (shown), and the stream of what is missing."""
    project = target.playbook.spec.project
    assert project is not None
    manifest = manifest_for(target)
    client = AgentClient(container)
    workdir = target.playbook.spec.workdir
    wanted = sorted({e.sha256 for e in manifest.entries})
    answer = client.releases(
        {"op": "releases", "workdir": workdir, "want": wanted}, timeout=timeout
    )
    found = changes(manifest, answer.get("manifest"))
    counts = {
        kind: sum(1 for c in found if c.kind == kind) for kind in ("added", "changed", "removed")
    }
    emit(
        "manifest",
        "ok",
        f"{len(manifest.entries)} file(s), {manifest.total_bytes} bytes, manifest sha256 "
        f"{manifest.digest[:12]}; against {answer.get('current') or 'no release'}: "
        + ", ".join(f"{n} {kind}" for kind, n in counts.items()),
    )
    if plan:
        for change in found:
            sizes = f"{change.size} bytes"
            if change.kind == "changed":
                sizes = f"{change.old_size} -> {change.size} bytes"
            elif change.kind == "removed":
                sizes = f"{change.old_size} bytes"
            emit("file", "planned", f"{change.kind:8} {change.path} ({sizes})")
    if diff:
        _show_diffs(client, workdir, manifest, found, emit, timeout)
    missing = sorted(set(wanted) - set(answer.get("have") or []))
    by_digest = {e.sha256: e.size for e in manifest.entries}
    spec: p.ReleaseSpec = {
        "manifest": manifest.as_lists(),
        "manifest_sha256": manifest.digest,
        "blobs_b64": None,
        "blobs_parts": None,
        "sent_files": 0,
        "keep_releases": project.keep_releases,
        "setup": setup_request(target, manifest),
    }
    prepared = PreparedRelease(manifest, spec, missing, current=answer.get("current"))
    prepared.summary = {
        "manifest_sha256": manifest.digest,
        "files": len(manifest.entries),
        "bytes": manifest.total_bytes,
        "changes": counts,
        "missing_files": len(missing),
        "missing_bytes": sum(by_digest[d] for d in missing),
        "sent_files": 0,
        "sent_raw_bytes": 0,
        "sent_bytes": 0,
        "previous": answer.get("current"),
    }
    return prepared


def _show_diffs(
    client: AgentClient,
    workdir: str,
    manifest: Manifest,
    found: list[Any],
    emit: Emit,
    timeout: float,
) -> None:
    changed = [c.path for c in found if c.kind in ("changed", "removed")]
    old: dict[str, str | None] = {}
    if changed:
        answer = client.releases(
            {"op": "releases", "workdir": workdir, "contents": changed}, timeout=timeout
        )
        old = answer.get("contents") or {}
    entries = manifest.by_path()
    for change in found:
        before = old.get(change.path)
        old_bytes = base64.b64decode(before) if before else None
        entry = entries.get(change.path)
        if entry is not None and entry.size > DIFF_LIMIT:
            emit("diff", "planned", f"{change.path}: over {DIFF_LIMIT} bytes, not shown")
            continue
        new_bytes = entry.local.read_bytes() if entry is not None else None
        for line in text_diff(change.path, old_bytes, new_bytes):
            emit("diff", "planned", line)


def send_stream(
    prepared: PreparedRelease,
    container: Container,
    workdir: str,
    inline_limit: int,
    make_workdir: Callable[[], None],
) -> str | None:
    """The missing files' stream, made while it is sent: inline in the spec while it stays
    within `inline_limit`, else pushed to temp files in the workdir a PIECE at a time (the
    workdir made first: `pct push` into a missing directory may exit 0 having written
    nothing). The pieces' sizes and sha256s are checked in the container once all are pushed
    (one call), and go into the spec: the agent checks them again before it reads a byte.
    Returns where the pieces went (None: inline, or nothing to send)."""
    if not prepared.missing:
        return None
    counts = prepared.sent
    stream = iter(pieces(blob_stream(prepared.manifest, prepared.missing, counts), PIECE))
    head: list[bytes] = []
    for piece in stream:  # the first pieces say whether the whole stream fits inline
        head.append(piece)
        if sum(map(len, head)) > inline_limit:
            break
    else:
        prepared.spec["blobs_b64"] = base64.b64encode(b"".join(head)).decode("ascii")
        _sent(prepared)
        return None
    make_workdir()
    stem = posixpath.join(workdir, f".release.launcher-{secrets.token_hex(6)}")
    parts: list[list[Any]] = []
    try:
        for piece in _chain(head, stream):
            path = f"{stem}-{len(parts):05d}.tmp"
            parts.append([path, len(piece), hashlib.sha256(piece).hexdigest()])
            container.push(piece, path, perms="0600", verify=False)
        # pct may exit 0 having written nothing: every piece checked in the container, at once.
        container.verify_pushed([Pushed(*row) for row in parts])
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: the next deploy removes them too
            container.exec(["rm", "-f", "--", *(row[0] for row in parts)], timeout=30)
        raise
    prepared.spec["blobs_parts"] = parts
    _sent(prepared)
    return f"{stem}-*.tmp ({len(parts)} piece(s))"


def _chain(first: list[bytes], rest: Iterator[bytes]) -> Iterator[bytes]:
    while first:  # handed over, not kept: a piece is freed once it is pushed
        yield first.pop(0)
    yield from rest


def _sent(prepared: PreparedRelease) -> None:
    counts = prepared.sent
    prepared.spec["sent_files"] = counts.files
    prepared.summary.update(
        {"sent_files": counts.files, "sent_raw_bytes": counts.raw_bytes, "sent_bytes": counts.bytes}
    )

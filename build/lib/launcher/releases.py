"""The client's half of a project release: the manifest, what the container lacks, the stream.

One `releases` round trip asks the agent which of the manifest's files the container already
holds (by sha256, verified there) and what the current release is; the deploy transaction then
carries the missing files (inline while small, else pushed first with `pct push`), and the
agent builds and checks the release before anything is stopped (launcher/agent/release.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from launcher import protocol as p
from launcher.agentclient import AgentClient
from launcher.config import Target
from launcher.container import Container
from launcher.errors import UsageError
from launcher.project import Limits, Manifest, blob_stream, build_manifest, changes, text_diff

Emit = Callable[[str, str, str], None]


@dataclass
class PreparedRelease:
    manifest: Manifest
    spec: p.ReleaseSpec
    stream: bytes = b""
    sent_files: int = 0
    sent_raw_bytes: int = 0
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
    stream, files, raw = (b"", 0, 0) if plan else blob_stream(manifest, missing)
    spec: p.ReleaseSpec = {
        "manifest": manifest.as_lists(),
        "manifest_sha256": manifest.digest,
        "blobs_b64": None,
        "blobs_tmp": None,
        "sent_files": files,
        "keep_releases": project.keep_releases,
        "setup": setup_request(target, manifest),
    }
    prepared = PreparedRelease(manifest, spec, stream, files, raw, answer.get("current"))
    prepared.summary = {
        "manifest_sha256": manifest.digest,
        "files": len(manifest.entries),
        "bytes": manifest.total_bytes,
        "changes": counts,
        "missing_files": len(missing),
        "sent_files": files,
        "sent_raw_bytes": raw,
        "sent_bytes": len(stream),
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
        new_bytes = entry.local.read_bytes() if entry is not None else None
        for line in text_diff(change.path, old_bytes, new_bytes):
            emit("diff", "planned", line)


def attach_stream(
    prepared: PreparedRelease, container: Container, workdir: str, inline_limit: int
) -> str | None:
    """The stream inline in the spec, or pushed to a temp file in the workdir (returned)."""
    if not prepared.stream:
        return None
    if len(prepared.stream) <= inline_limit:
        prepared.spec["blobs_b64"] = base64.b64encode(prepared.stream).decode("ascii")
        return None
    tmp = posixpath.join(workdir, f".release.launcher-{secrets.token_hex(6)}.tmp")
    container.push(prepared.stream, tmp, perms="0600")
    prepared.spec["blobs_tmp"] = tmp
    return tmp

# mypy: allow-untyped-calls
"""Releases of a project directory: the `releases` op and the release transaction.

Layout in the workdir:
    releases/<id>/             one release: the project's files (and what its setup made)
    current -> releases/<id>   the release the run starts in; switched by a symlink rename
    .launcher/releases/<id>.json  its manifest, setup hash and the release it replaced

ReleaseDeploy is the deploy transaction (deploy.Deploy) with the release built and checked among
the checks: files received or hard-linked from an earlier release, every sha256 verified, every
.py compiled, the setup run, all before the old run is stopped. `current` switches only in the
destructive part, after every check has passed; a failed check removes the half-built release.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time

from launcher.agent.base import (
    AgentError,
    emit_event,
    list_dir,
    new_run_id,
    remove_quietly,
    sha256_file,
    utc_iso,
    write_atomic,
)
from launcher.agent.deploy import Deploy, run_to_the_end
from launcher.agent.params import param, workdir_param
from launcher.agent.paths import (
    checkpoint_problem,
    is_strict_child,
    protected_paths,
    remove_tree,
    state_dir,
    tmp_path,
)
from launcher.protocol import CURRENT_LINK, RELEASES_DIR

# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RELEASE_ID = r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$"
SHA256 = r"^[0-9a-f]{64}$"
MANIFEST_LIMIT = 1000000  # rows; the client's own limits are lower
CONTENT_LIMIT = 1 << 20  # --diff: old file contents answered up to this size
SETUP_TAIL = 20  # lines of a failed setup quoted in the error


def releases_dir(workdir):
    return os.path.join(workdir, RELEASES_DIR)


def current_link(workdir):
    return os.path.join(workdir, CURRENT_LINK)


def manifest_path(workdir, rid):
    return os.path.join(state_dir(workdir), "releases", rid + ".json")


def release_path_problem(rel):
    """The client's path rules (launcher.project.path_problem), checked again here."""
    if not isinstance(rel, str) or not rel or rel.startswith("/"):
        return "it is empty or absolute"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in rel):
        return "it contains a newline or another control character"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "it is not normalised"
    return None


def manifest_param(rows):
    """Validated manifest rows; `invalid` naming the first bad one."""
    if not isinstance(rows, list) or not rows or len(rows) > MANIFEST_LIMIT:
        raise AgentError("invalid", "the manifest must list 1 to %d files" % MANIFEST_LIMIT)
    seen: set[str] = set()
    for row in rows:
        ok = isinstance(row, list) and len(row) == 4
        path, size, mode, digest = row if ok else (None, None, None, None)
        problem = release_path_problem(path)
        if problem:
            raise AgentError("unsafe_path", "manifest path %r refused: %s" % (path, problem))
        if not (isinstance(size, int) and size >= 0 and mode in (0o644, 0o755)
                and isinstance(digest, str) and re.match(SHA256, digest)):  # fmt: skip
            raise AgentError("invalid", "manifest row for %r is malformed" % path)
        if path in seen:
            raise AgentError("invalid", "manifest lists %r twice" % path)
        seen.add(str(path))
    for path in seen:  # a file cannot also be a directory of another
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in seen:
                raise AgentError("invalid", "manifest has %r as a file and a directory" % path)
    return rows


def current_release(workdir):
    """The id `current` points at, or None; `current` that is not our symlink is refused."""
    link = current_link(workdir)
    if not os.path.lexists(link):
        return None
    if not os.path.islink(link):
        raise AgentError("unsafe_path", "%s exists and is not a symlink: launcher will not "
                         "replace it (move it away)" % link)  # fmt: skip
    target = str(os.readlink(link))
    parts = target.split("/")
    if len(parts) == 2 and parts[0] == RELEASES_DIR and re.match(RELEASE_ID, parts[1]):
        return parts[1]
    raise AgentError("unsafe_path", "%s points at %r, not at a release" % (link, target))


def read_release(workdir, rid):
    """A release's record (manifest, setup hash, previous), or None when it is not whole."""
    if not rid or not re.match(RELEASE_ID, rid):
        return None
    directory = os.path.join(releases_dir(workdir), rid)
    if os.path.islink(directory) or not os.path.isdir(directory):
        return None
    try:
        with open(manifest_path(workdir, rid)) as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("manifest"), list) else None


def release_ids(workdir):
    """Whole releases, oldest first (ids start with their UTC time)."""
    try:
        names = os.listdir(releases_dir(workdir))
    except OSError:
        return []
    return sorted(n for n in names if re.match(RELEASE_ID, n) and read_release(workdir, n))


def is_file_with(path, size, digest):
    try:
        if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) != size:
            return False
        return sha256_file(path) == digest
    except OSError:
        return False


def known_blobs(workdir, wanted):
    """sha256 -> a verified file with that content in an earlier release (newest first)."""
    found = {}
    wanted = set(wanted)
    for rid in reversed(release_ids(workdir)):
        record = read_release(workdir, rid) or {}
        base = os.path.join(releases_dir(workdir), rid)
        for path, size, _mode, digest in record.get("manifest") or []:
            if digest in wanted and digest not in found:
                full = os.path.join(base, path)
                if is_file_with(full, size, digest):
                    found[digest] = full
        if len(found) == len(wanted):
            break
    return found


def op_releases(request, warnings):
    """What the container holds: the current release's manifest and which wanted blobs exist."""
    workdir = workdir_param(request)
    want = param(request, "want", list, default=[])
    want = [d for d in want if isinstance(d, str) and re.match(SHA256, d)]
    rid = current_release(workdir) if os.path.isdir(workdir) else None
    record = read_release(workdir, rid) or {}
    contents: dict[str, Any] = {}
    manifest = record.get("manifest") or []
    rows = {row[0]: row for row in manifest}
    for path in param(request, "contents", list, default=[]):
        row = rows.get(path)
        full = os.path.join(releases_dir(workdir), rid or "-", str(path))
        if row is None or row[1] > CONTENT_LIMIT or not is_file_with(full, row[1], row[3]):
            contents[path] = None
            continue
        with open(full, "rb") as handle:
            contents[path] = base64.b64encode(handle.read()).decode("ascii")
    return {
        "current": rid if record else None,
        "manifest": manifest or None,
        "manifest_sha256": record.get("manifest_sha256"),
        "have": sorted(known_blobs(workdir, want)) if want else [],
        "contents": contents,
        "releases": release_ids(workdir),
    }


def read_frames(stream, manifest, blobs):
    """The client's gzip frames `<sha256> <size>\\n<bytes>` into blobs/<sha256>; each blob must
    be one the manifest names, with its size, and hash to its name. Returns the count."""
    sizes = dict((row[3], row[1]) for row in manifest)
    count = 0
    with gzip.GzipFile(fileobj=stream, mode="rb") as frames:
        while True:
            header = frames.readline(200)
            if not header:
                return count
            parts = header.decode("ascii", "replace").split()
            if len(parts) != 2 or not re.match(SHA256, parts[0]) or not parts[1].isdigit():
                raise AgentError("corrupt", "transfer corrupted: bad frame header %r" % header[:80])
            digest, size = parts[0], int(parts[1])
            if sizes.get(digest) != size:
                raise AgentError("corrupt", "transfer corrupted: blob %s is not in the manifest "
                                 "with %d bytes" % (digest, size))  # fmt: skip
            path = os.path.join(blobs, digest)
            hasher, left = hashlib.sha256(), size
            with open(path, "xb") as out:
                while left:
                    chunk = frames.read(min(left, 1 << 20))
                    if not chunk:
                        raise AgentError(
                            "corrupt", "transfer corrupted: blob %s cut short" % digest
                        )
                    hasher.update(chunk)
                    out.write(chunk)
                    left -= len(chunk)
            if hasher.hexdigest() != digest:
                raise AgentError("corrupt", "transfer corrupted: blob %s hashes to %s"
                                 % (digest, hasher.hexdigest()))  # fmt: skip
            count += 1


class ReleaseDeploy(Deploy):
    """The deploy transaction of a project release (and of its rollback)."""

    def __init__(self, request, warnings):
        Deploy.__init__(self, request, warnings)
        spec = param(request, "release", dict, required=True)
        self.rollback = spec.get("rollback") is True
        self.keep_releases = param(spec, "keep_releases", int, default=3)
        self.setup = param(spec, "setup", dict)
        self.blobs_b64 = param(spec, "blobs_b64", str)
        self.blobs_tmp = param(spec, "blobs_tmp", str)
        self.sent_files = param(spec, "sent_files", int, default=0)
        self.rows: Any = None if self.rollback else manifest_param(spec.get("manifest"))
        self.manifest_sha = param(spec, "manifest_sha256", str)
        self.release_id: Any = None if self.rollback else new_run_id()
        self.previous = None
        self.staging = None
        self.built: Any = None  # the new release's directory, removed on failure until switched
        self.switched = False
        self.release_info = {}
        self.start_dir = current_link(self.workdir)
        if self.keep_releases < 1:
            raise AgentError("invalid", "keep_releases must be at least 1")

    # -- driver

    def checks(self):
        checks = Deploy.checks(self)
        if self.dest_rel is None:  # no script beside the project
            checks = [c for c in checks if c[0] not in ("receive", "verify", "compile")]
        names = [name for name, _ in checks]
        at = names.index("checkpoint_guard")
        return checks[:at] + [("release", self.build_release), ("setup", self.run_setup)] + \
            checks[at:]  # fmt: skip

    def check_paths(self):
        if self.dest_rel is not None:
            Deploy.check_paths(self)
        self.previous = current_release(self.workdir)  # refuses a `current` that is not ours
        rdir = releases_dir(self.workdir)
        if os.path.islink(rdir) or (os.path.lexists(rdir) and not os.path.isdir(rdir)):
            raise AgentError("unsafe_path", "%s is not a directory of launcher's" % rdir)
        if self.blobs_tmp is not None:
            self.blobs_tmp = tmp_path(self.workdir, self.blobs_tmp)
        return "ok", "%s (current: %s)" % (rdir, self.previous or "none")

    def remove_stale_temps(self):
        if self.dest_rel is not None:
            Deploy.remove_stale_temps(self)
        for name in list_dir(self.workdir):  # a pushed stream, a `current` about to be renamed
            full = os.path.join(self.workdir, name)
            ours = name.startswith((".release.launcher-", ".current.launcher-"))
            if (
                ours
                and name.endswith(".tmp")
                and full != self.blobs_tmp
                and (os.path.islink(full) or os.path.isfile(full))
            ):
                remove_quietly(full)
        rdir = releases_dir(self.workdir)
        try:
            names = os.listdir(rdir)
        except OSError:
            return
        for name in names:  # staging and blob directories of deploys that were killed
            full = os.path.join(rdir, name)
            if name.startswith(".") and name.endswith(".tmp") and not os.path.islink(full):
                remove_tree(full)

    def plan_actions(self):
        Deploy.plan_actions(self)
        target = self.release_id or "the previous release"
        self.steps.insert(-4, {"name": "release", "status": "planned",
                               "detail": "switch %s to releases/%s" % (current_link(self.workdir),
                                                                        target)})  # fmt: skip

    def cleanup(self):
        Deploy.cleanup(self)
        if self.staging:
            remove_tree_quietly(self.staging)
        if self.built and not self.switched:
            remove_tree_quietly(self.built)
            remove_quietly(manifest_path(self.workdir, os.path.basename(self.built)))
        if self.blobs_tmp:
            remove_quietly(self.blobs_tmp)

    # -- checks

    def build_release(self):
        if self.rollback:
            return self.check_rollback_target()
        rows = self.rows
        wanted = set(row[3] for row in rows)
        if self.plan:
            have = known_blobs(self.workdir, wanted)
            return "ok", "%d file(s), %d to send (plan: nothing built)" % (
                len(rows),
                len(wanted - set(have)),
            )
        rdir = releases_dir(self.workdir)
        os.makedirs(rdir, exist_ok=True)
        self.staging = os.path.join(rdir, ".%s.tmp" % self.release_id)
        blobs = os.path.join(rdir, ".%s.blobs.tmp" % self.release_id)
        os.mkdir(self.staging, 0o755)
        os.mkdir(blobs, 0o700)
        try:
            received = self.receive_blobs(rows, blobs)
            have = known_blobs(self.workdir, wanted - received)
            lacking = wanted - received - set(have)
            if lacking:
                raise AgentError(
                    "corrupt",
                    "%d file(s) neither sent nor in an earlier release "
                    "(e.g. %s); deploy again" % (len(lacking), sorted(lacking)[0]),
                )
            linked = self.place_files(rows, blobs, have)
        finally:
            remove_tree_quietly(blobs)
        self.verify_tree(self.staging, rows)
        final = os.path.join(rdir, self.release_id)
        os.rename(self.staging, final)
        self.built, self.staging = final, None
        self.release_info = {"id": self.release_id, "files": len(rows),
                             "sent_files": len(received), "linked_files": linked}  # fmt: skip
        return (
            "ok",
            "releases/%s: %d file(s), %d received, %d hard-linked; every sha256 "
            "verified, .py compiled" % (self.release_id, len(rows), len(received), linked),
        )

    def receive_blobs(self, rows, blobs):
        if self.blobs_b64 is not None:
            try:
                data = base64.b64decode(self.blobs_b64, validate=True)
            except (ValueError, TypeError) as exc:
                raise AgentError("corrupt", "transfer corrupted: not base64: %s" % exc) from None
            stream: Any = io.BytesIO(data)
        elif self.blobs_tmp is not None:
            stream = open(self.blobs_tmp, "rb")
        else:
            return set()
        try:
            read_frames(stream, rows, blobs)
        except (OSError, EOFError, ValueError) as exc:  # gzip's own complaints
            raise AgentError("corrupt", "transfer corrupted: %s" % exc) from None
        finally:
            stream.close()
        return set(os.listdir(blobs))

    def place_files(self, rows, blobs, have):
        """Each file hard-linked from a received blob or an earlier release (copied when the
        mode differs, so an old release never changes); returns how many came from releases."""
        linked = 0
        staging = str(self.staging)
        for path, _size, mode, digest in rows:
            dest = os.path.join(staging, path)
            parent = os.path.dirname(dest)
            if not os.path.isdir(parent):
                os.makedirs(parent, 0o755)
            source = os.path.join(blobs, digest)
            if not os.path.exists(source):
                source = have[digest]
                linked += 1
            same_mode = (os.stat(source).st_mode & 0o777) == mode
            try:
                if not same_mode:
                    raise OSError("mode differs")
                os.link(source, dest)
            except OSError:
                shutil.copyfile(source, dest)
                os.chmod(dest, mode)
            if source.startswith(blobs + "/") and not same_mode:
                os.chmod(source, mode)
        return linked

    def verify_tree(self, root, rows):
        """Every file hashed where it lies, and every .py compiled, as the run will read them."""
        real_root = os.path.realpath(root)
        for path, size, _mode, digest in rows:
            full = os.path.join(root, path)
            if not is_strict_child(os.path.realpath(full), real_root):
                raise AgentError("unsafe_path", "%s leads out of the release" % path)
            if not is_file_with(full, size, digest):
                raise AgentError("corrupt", "%s in the release does not have sha256 %s"
                                 % (path, digest))  # fmt: skip
            if path.endswith(".py"):
                with open(full, "rb") as handle:
                    source = handle.read()
                try:
                    compile(source, path, "exec", dont_inherit=True)
                except SyntaxError as exc:
                    raise AgentError("compile", 'File "%s", line %s\nSyntaxError: %s'
                                     % (path, exc.lineno, exc.msg)) from None  # fmt: skip
                except ValueError as exc:
                    raise AgentError("compile", "%s: %s" % (path, exc)) from None

    def check_rollback_target(self):
        if self.previous is None:
            raise AgentError("refused", "no release to roll back from: %s does not exist"
                             % current_link(self.workdir))  # fmt: skip
        record = read_release(self.workdir, self.previous) or {}
        target = record.get("previous")
        if not read_release(self.workdir, target):
            older = [r for r in release_ids(self.workdir) if r < self.previous]
            target = older[-1] if older else None
        if target is None:
            raise AgentError("refused", "no earlier release than %s to roll back to"
                             % self.previous)  # fmt: skip
        old = read_release(self.workdir, target)
        self.release_id = target
        self.manifest_sha = old.get("manifest_sha256")
        self.verify_tree(os.path.join(releases_dir(self.workdir), target), old["manifest"])
        self.release_info = {"id": target, "files": len(old["manifest"]), "sent_files": 0,
                             "rollback_from": self.previous}  # fmt: skip
        return "ok", "releases/%s (replacing %s): every sha256 verified, .py compiled" % (
            target,
            self.previous,
        )

    def run_setup(self):
        if self.rollback:
            return "skipped", "done when releases/%s was built" % self.release_id
        if not self.setup:
            self.write_manifest(None)
            return "skipped", "no setup"
        digest = str(self.setup.get("hash"))
        if self.plan:
            old = read_release(self.workdir, self.previous) or {}
            reuse = old.get("setup_hash") == digest
            return "ok", "setup %s" % ("reused (inputs unchanged)" if reuse else "would run")
        old = read_release(self.workdir, self.previous) or {}
        if self.previous and old.get("setup_hash") == digest:
            count = link_extras(os.path.join(releases_dir(self.workdir), self.previous),
                                self.built, set(row[0] for row in self.rows))  # fmt: skip
            self.write_manifest(digest)
            return "ok", "reused from releases/%s (inputs unchanged; %d file(s) linked)" % (
                self.previous,
                count,
            )
        deadline = time.monotonic() + float(self.setup.get("timeout") or 1800.0)
        for command in self.setup.get("run") or []:
            self.run_setup_command(str(command), deadline)
        self.write_manifest(digest)
        return "ok", "%d command(s) ran in releases/%s" % (len(self.setup["run"]), self.release_id)

    def run_setup_command(self, command, deadline):
        """One setup command in the new release, its output streamed as progress lines; it and
        its children are killed at the deadline (a session of their own)."""
        env = dict(os.environ)
        env.update(self.env)
        env["PATH"] = env.get("PATH", "") + ":/usr/local/bin:/usr/bin:/bin"
        proc = subprocess.Popen(
            [self.shell, "-c", command], cwd=self.built, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        tail: list[str] = []
        pending = b""
        out: Any = proc.stdout
        fd = out.fileno()
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise AgentError("failed", "setup %r timed out; nothing was stopped" % command)
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                break
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                self.setup_line(line, tail)
        if pending:
            self.setup_line(pending, tail)
        out.close()
        code = proc.wait()
        if code != 0:
            raise AgentError("failed", "setup %r exited %d; nothing was stopped:\n%s"
                             % (command, code, "\n".join(tail)))  # fmt: skip

    def setup_line(self, line, tail):
        text = line.decode("utf-8", "replace").rstrip("\r")
        tail.append(text)
        del tail[:-SETUP_TAIL]
        if self.events:
            emit_event({"event": "progress", "name": "setup", "detail": text})

    def write_manifest(self, setup_hash):
        if self.plan or self.rollback:
            return
        path = manifest_path(self.workdir, self.release_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, json.dumps({
            "id": self.release_id, "created": utc_iso(), "manifest": self.rows,
            "manifest_sha256": self.manifest_sha, "setup_hash": setup_hash,
            "previous": self.previous,
        }) + "\n")  # fmt: skip

    def safe_checkpoints(self):
        protected = protected_paths(self.workdir, self.session, getattr(self, "dest", None))
        protected += [releases_dir(self.workdir), current_link(self.workdir)]
        path, reason = checkpoint_problem(self.workdir, self.checkpoints_rel, protected)
        if reason is None and os.path.realpath(path) == os.path.realpath(self.start_dir):
            reason = "it is the release the run starts in"
        if reason:
            raise AgentError(
                "unsafe_path", "checkpoints path %r is unsafe: %s" % (self.checkpoints_rel, reason)
            )
        return path

    # -- destructive

    def install(self):
        self.destructive = True
        details = []
        if self.dest_rel is not None:
            details.append(Deploy.install(self)[1])
        link = current_link(self.workdir)
        tmp = os.path.join(self.workdir, ".%s.launcher-%s.tmp" % (CURRENT_LINK, self.run_id))
        remove_quietly(tmp)
        os.symlink(os.path.join(RELEASES_DIR, self.release_id), tmp)
        os.replace(tmp, link)  # rename(2): `current` is the old release or the new, never absent
        self.switched = True
        details.append("%s -> releases/%s (was %s)" % (link, self.release_id,
                                                        self.previous or "none"))  # fmt: skip
        return "ok", "; ".join(details)

    def write_record(self):
        outcome = Deploy.write_record(self)
        pruned = prune_releases(self.workdir, self.keep_releases, self.release_id, self.warnings)
        self.release_info["pruned"] = pruned
        return outcome

    def build_record(self, outcome):
        record = Deploy.build_record(self, outcome)
        info = dict(self.release_info)
        info.update({"manifest_sha256": self.manifest_sha, "previous": self.previous})
        record["release"] = info
        if self.rollback:
            record["rollback"] = True
        self.result["release"] = info
        return record


def link_extras(old, new, manifest_paths):
    """What the old release's setup made (files not in its manifest) hard-linked into the new
    one; symlinks are recreated as they are (a venv's python link points at the system's)."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(old):
        rel_dir = os.path.relpath(dirpath, old)
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            source, dest = os.path.join(old, rel), os.path.join(new, rel)
            if rel in manifest_paths or os.path.lexists(dest):
                continue
            if os.path.islink(source):
                os.symlink(os.readlink(source), dest)
            elif os.path.isdir(source):
                os.mkdir(dest, os.stat(source).st_mode & 0o7777)
            else:
                os.link(source, dest)
                count += 1
    return count


def prune_releases(workdir, keep, current, warnings):
    """Releases beyond `keep` (the newest, counting the current one) removed; never current."""
    ids = [r for r in release_ids(workdir) if r != current]
    pruned = []
    for rid in ids[: max(len(ids) - (keep - 1), 0)]:
        full = os.path.join(releases_dir(workdir), rid)
        if os.path.islink(full) or not is_strict_child(os.path.realpath(full),
                                                       os.path.realpath(workdir)):  # fmt: skip
            warnings.append("left %s alone: it is a symlink or outside the workdir" % full)
            continue
        remove_tree(full)
        remove_quietly(manifest_path(workdir, rid))
        pruned.append(rid)
    return pruned


def remove_tree_quietly(path):
    try:
        remove_tree(path)
    except OSError:
        pass


def run_release_transaction(request, warnings):
    return run_to_the_end(ReleaseDeploy(request, warnings))


def dispatching(plain):
    """The op handler for a request with a release, and `plain` (a script's) for the rest."""

    def handler(request, warnings):
        if request.get("release"):
            return run_release_transaction(request, warnings)
        return plain(request, warnings)

    return handler

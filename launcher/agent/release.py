# mypy: allow-untyped-calls
"""Releases of a project directory: the `releases` op and the release transaction.

Layout in the workdir:
    releases/<id>/             one release: the project's files (and what its setup made)
    current -> releases/<id>   the release the run starts in; switched by a symlink rename
    .launcher/releases/<id>.json  its manifest, setup hash and the release it replaced

A release deploy is the deploy transaction (deploy.py) with a `Release` plugged into it: the
release built and checked among the checks (files received or copied from an earlier release,
every sha256 verified, every .py compiled, the setup run, then the release and the ones before it
checked again), all before the old run is stopped. `current` switches only in the destructive
part, after every check has passed; a failed check removes the half-built release.

Releases share no inode: a release's files are its own (cloned copy-on-write where the
filesystem can, copied where not), so a write into one release, by its setup, its run or a
person, never changes another, and a setup's output reused by a later release is copied there
with the old release's path rewritten to the new one's (relocate).
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
    login_env,
    new_run_id,
    remove_quietly,
    sha256_file,
    utc_iso,
    write_atomic,
)
from launcher.agent.commandcheck import CommandCheck
from launcher.agent.deploy import DeployState, run_to_the_end, start_queries
from launcher.agent.deploy import check_paths as check_script_paths
from launcher.agent.deploy import install as install_script
from launcher.agent.deploy import write_record as write_deploy_record
from launcher.agent.params import param, workdir_param
from launcher.agent.paths import (
    is_strict_child,
    remove_tree,
    state_dir,
)
from launcher.agent.protocol import CURRENT_LINK, RELEASES_DIR
from launcher.agent.rollback import rollback_request

# Only mypy reads the annotations (postponed by the __future__ import): the
# agent's start, on every call, need not import typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

RELEASE_ID = r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$"
# What build_release stages a release in (and its blobs): only such names are removed as a
# killed deploy's leftovers, never another dot-file of releases/.
STAGING_NAME = r"^\.[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}(\.blobs)?\.tmp$"
SHA256 = r"^[0-9a-f]{64}$"
MANIFEST_LIMIT = 1000000  # rows; the client's own limits are lower
CONTENT_LIMIT = 1 << 20  # --diff: old file contents answered up to this size
SETUP_TAIL = 20  # lines of a failed setup quoted in the error
LINE_LIMIT = 4096  # bytes of one setup output line shown; the rest is cut, and said so
BLOCK = 1 << 20
QUERY_FRESH = 10.0  # s: older nvidia-smi queries are started again after the release is built
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int), a reflink (btrfs, XFS, ZFS 2.2, bcachefs)


def releases_dir(workdir):
    return os.path.join(workdir, RELEASES_DIR)


def current_link(workdir):
    return os.path.join(workdir, CURRENT_LINK)


def manifest_path(workdir, rid):
    return os.path.join(state_dir(workdir), "releases", rid + ".json")


def release_path_problem(rel):
    """The client's path rules (launcher.deploy.project.path_problem), checked again here."""
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


class PartsReader(io.RawIOBase):
    """The pushed pieces of the stream read as one file, each piece's sha256 checked as it is
    read: `pct push` may exit 0 having written nothing, or part of a piece."""

    def __init__(self, parts):
        io.RawIOBase.__init__(self)
        self.parts = parts
        self.index = -1
        self.handle: Any = None
        self.hasher: Any = None

    def readable(self):
        return True

    def readinto(self, buffer):
        while True:
            if self.handle is None:
                if self.index + 1 >= len(self.parts):
                    return 0
                self.index += 1
                self.handle = open(self.parts[self.index][0], "rb")
                self.hasher = hashlib.sha256()
            count = self.handle.readinto(buffer)
            if count:
                self.hasher.update(memoryview(buffer)[:count])
                return count
            self.end_part()

    def end_part(self):
        path, _size, digest = self.parts[self.index]
        self.handle.close()
        self.handle = None
        got = self.hasher.hexdigest()
        if got != digest:
            raise AgentError("corrupt", "transfer corrupted: piece %d of %d (%s) has sha256 %s, "
                             "not %s; deploy again" % (self.index + 1, len(self.parts), path,
                                                       got, digest))  # fmt: skip

    def read_to_the_end(self):
        """What is left read and checked (gzip may stop before a piece's end)."""
        while self.read(BLOCK):
            pass

    def close(self):
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        io.RawIOBase.close(self)


def parts_param(workdir, rows):
    """The pushed pieces: [path inside the workdir, size, sha256] each, every one in place
    with its size before a byte is read."""
    import stat  # loaded with os already; imported here, the agent's preload list stays

    if rows is None:
        return None
    if not isinstance(rows, list) or not rows or len(rows) > 100000:
        raise AgentError("invalid", "blobs_parts must list 1 to 100000 pieces")
    real_workdir = os.path.realpath(workdir)
    for n, row in enumerate(rows, 1):
        ok = isinstance(row, list) and len(row) == 3
        path, size, digest = row if ok else (None, None, None)
        if not (isinstance(path, str) and os.path.isabs(path) and isinstance(size, int)
                and isinstance(digest, str) and re.match(SHA256, digest)):  # fmt: skip
            raise AgentError("invalid", "blobs_parts row %d is malformed" % n)
        if not (os.path.basename(path).startswith(".release.launcher-")
                and is_strict_child(os.path.realpath(path), real_workdir)):  # fmt: skip
            raise AgentError("unsafe_path", "pushed piece %r is not launcher's, in the workdir"
                             % path)  # fmt: skip
        try:
            info = os.lstat(path)
        except OSError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode) or info.st_size != size:
            found = "missing" if info is None else "%d bytes" % info.st_size
            raise AgentError("corrupt", "transfer corrupted: piece %d of %d (%s) is %s, not %d "
                             "bytes: the push did not write it whole; deploy again"
                             % (n, len(rows), path, found, size))  # fmt: skip
    return rows


class Release:
    """A project release's part of the deploy transaction (and of its rollback), plugged into
    it as `state.release` (deploy.DeployState): its own steps put into the transaction's lists
    (`checks`, `changes`), and the hooks the transaction calls where a release differs (its
    stale temp files, its cleanup, the paths it protects, the command judged in the release,
    its record). What the transaction holds is read from `state`; what only a release has,
    here."""

    def __init__(self, request):
        spec = param(request, "release", dict, required=True)
        self.rollback = spec.get("rollback") is True
        # The release of the run being put back (its spec's); default: the one before current.
        self.rollback_to = param(spec, "to", str)
        self.keep_releases = param(spec, "keep_releases", int, default=3)
        self.setup = param(spec, "setup", dict)
        self.blobs_b64 = param(spec, "blobs_b64", str)
        self.blobs_parts: Any = param(spec, "blobs_parts", list)
        self.sent_files = param(spec, "sent_files", int, default=0)
        self.rows: Any = None if self.rollback else manifest_param(spec.get("manifest"))
        self.manifest_sha = param(spec, "manifest_sha256", str)
        self.release_id: Any = None if self.rollback else new_run_id()
        self.previous = None
        self.staging = None
        self.built: Any = None  # the new release's directory, removed on failure until switched
        self.switched = False
        self.release_info = {}
        self.before_setup: Any = None  # what setup must leave as it was (snapshot)
        if self.keep_releases < 1:
            raise AgentError("invalid", "keep_releases must be at least 1")

    # -- its steps in the transaction's lists

    def checks(self, state, checks):
        """The script's checks with the release's paths, and the release built, set up and
        checked again just before the checkpoint guard; no script checks without a script."""
        if state.dest_rel is None:  # no script beside the project
            checks = [c for c in checks if c[0] not in ("receive", "verify", "compile")]
        checks = [("paths", self.check_paths) if name == "paths" else (name, check)
                  for name, check in checks]  # fmt: skip
        names = [name for name, _ in checks]
        at = names.index("checkpoint_guard")
        ours = [("release", self.build_release), ("setup", self.run_setup),
                ("integrity", self.check_intact)]  # fmt: skip
        return checks[:at] + ours + checks[at:]

    def changes(self, state, changes):
        """The install switches `current` too; the record prunes old releases."""
        ours = {"install": self.install, "record": self.write_record}
        return [(name, ours.get(name, change)) for name, change in changes]

    # -- hooks

    def remove_stale_temps(self, state):
        """A pushed stream, a `current` about to be renamed, and staging and blob directories
        of deploys that were killed."""
        pushed = set(row[0] for row in self.blobs_parts or ())
        for name in list_dir(state.workdir):  # a pushed stream, a `current` about to be renamed
            full = os.path.join(state.workdir, name)
            ours = name.startswith((".release.launcher-", ".current.launcher-"))
            if (
                ours
                and name.endswith(".tmp")
                and full not in pushed
                and (os.path.islink(full) or os.path.isfile(full))
            ):
                remove_quietly(full)
        rdir = releases_dir(state.workdir)
        try:
            names = os.listdir(rdir)
        except OSError:
            return
        for name in names:  # staging and blob directories of deploys that were killed
            full = os.path.join(rdir, name)
            if re.match(STAGING_NAME, name) and not os.path.islink(full):
                remove_tree(full)

    def planned_switch(self, state):
        """The plan's `release` step."""
        target = self.release_id or "the previous release"
        return "switch %s to releases/%s" % (current_link(state.workdir), target)

    def cleanup(self, state):
        """After the transaction's own: the half-built release, the pushed pieces."""
        if self.staging:
            remove_tree_quietly(self.staging)
        if self.built and not self.switched:
            remove_tree_quietly(self.built)
            remove_quietly(manifest_path(state.workdir, os.path.basename(self.built)))
        for row in self.blobs_parts or ():
            remove_quietly(row[0])

    def protected_paths(self, state):
        return [releases_dir(state.workdir), current_link(state.workdir)]

    def checkpoints_problem(self, state, path):
        if os.path.realpath(path) == os.path.realpath(state.start_dir):
            return "it is the release the run starts in"
        return None

    def command_check(self, state):
        """The command is judged in the new release (the run starts in `current`, switched to
        it only after the stop); in plan mode nothing is built: left to the deploy itself."""
        root = self.built
        if root is None and self.rollback and self.release_id:
            root = os.path.join(releases_dir(state.workdir), self.release_id)
        if root is None:
            return None
        link = current_link(state.workdir)
        moved = {link: root, os.path.join(os.path.realpath(state.workdir), CURRENT_LINK): root}
        coming = [state.dest] if state.dest_rel is not None else []
        return CommandCheck(link, moved, [c for c in coming if c], state.env)

    def add_to_record(self, state, record):
        info = dict(self.release_info)
        info.update({"manifest_sha256": self.manifest_sha, "previous": self.previous})
        record["release"] = info  # a rollback's record says so (op_rollback's request)
        state.result["release"] = info

    # -- checks

    def check_paths(self, state):
        if state.dest_rel is not None:
            check_script_paths(state)
        self.previous = current_release(state.workdir)  # refuses a `current` that is not ours
        rdir = releases_dir(state.workdir)
        if os.path.islink(rdir) or (os.path.lexists(rdir) and not os.path.isdir(rdir)):
            raise AgentError("unsafe_path", "%s is not a directory of launcher's" % rdir)
        self.blobs_parts = parts_param(state.workdir, self.blobs_parts)
        return "ok", "%s (current: %s)" % (rdir, self.previous or "none")

    def build_release(self, state):
        if self.rollback:
            return self.check_rollback_target(state)
        rows = self.rows
        wanted = set(row[3] for row in rows)
        if state.plan:
            have = known_blobs(state.workdir, wanted)
            return "ok", "%d file(s), %d to send (plan: nothing built)" % (
                len(rows),
                len(wanted - set(have)),
            )
        rdir = releases_dir(state.workdir)
        os.makedirs(rdir, exist_ok=True)
        self.staging = os.path.join(rdir, ".%s.tmp" % self.release_id)
        blobs = os.path.join(rdir, ".%s.blobs.tmp" % self.release_id)
        os.mkdir(self.staging, 0o755)
        os.mkdir(blobs, 0o700)
        try:
            received = self.receive_blobs(rows, blobs)
            have = known_blobs(state.workdir, wanted - received)
            lacking = wanted - received - set(have)
            if lacking:
                raise AgentError(
                    "corrupt",
                    "%d file(s) neither sent nor in an earlier release "
                    "(e.g. %s); deploy again" % (len(lacking), sorted(lacking)[0]),
                )
            reused = self.place_files(rows, blobs, have)
        finally:
            remove_tree_quietly(blobs)
        self.verify_tree(self.staging, rows)
        final = os.path.join(rdir, self.release_id)
        os.rename(self.staging, final)
        self.built, self.staging = final, None
        self.release_info = {"id": self.release_id, "files": len(rows),
                             "sent_files": len(received), "linked_files": reused}  # fmt: skip
        return (
            "ok",
            "releases/%s: %d file(s), %d received, %d copied from earlier releases; every "
            "sha256 verified, .py compiled" % (self.release_id, len(rows), len(received), reused),
        )

    def receive_blobs(self, rows, blobs):
        if self.blobs_b64 is not None:
            try:
                data = base64.b64decode(self.blobs_b64, validate=True)
            except (ValueError, TypeError) as exc:
                raise AgentError("corrupt", "transfer corrupted: not base64: %s" % exc) from None
            stream: Any = io.BytesIO(data)
        elif self.blobs_parts is not None:
            stream = io.BufferedReader(PartsReader(self.blobs_parts), BLOCK)
        else:
            return set()
        try:
            read_frames(stream, rows, blobs)
            if self.blobs_parts is not None:
                stream.raw.read_to_the_end()
        except (OSError, EOFError, ValueError) as exc:  # gzip's own complaints
            raise AgentError("corrupt", "transfer corrupted: %s" % exc) from None
        finally:
            stream.close()
        return set(os.listdir(blobs))

    def place_files(self, rows, blobs, have):
        """Each file the release's own: a received blob moved into place, any other copy of the
        same content and every file from an earlier release copied (cloned where the
        filesystem can). Returns how many came from earlier releases."""
        reused = 0
        staging = str(self.staging)
        placed: dict[str, str] = {}  # sha256 -> its first path in this release
        for path, _size, mode, digest in rows:
            dest = os.path.join(staging, path)
            parent = os.path.dirname(dest)
            if not os.path.isdir(parent):
                os.makedirs(parent, 0o755)
            blob = os.path.join(blobs, digest)
            if digest in placed:
                copy_file(placed[digest], dest)
            elif os.path.exists(blob):
                os.rename(blob, dest)
            else:
                copy_file(have[digest], dest)
                reused += 1
            os.chmod(dest, mode)
            placed.setdefault(digest, dest)
        return reused

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

    def check_rollback_target(self, state):
        if self.previous is None:
            raise AgentError("refused", "no release to roll back from: %s does not exist"
                             % current_link(state.workdir))  # fmt: skip
        record = read_release(state.workdir, self.previous) or {}
        target = record.get("previous")
        if self.rollback_to is not None:
            if not read_release(state.workdir, self.rollback_to):
                raise AgentError("refused", "release %s of the run being put back is gone"
                                 % self.rollback_to)  # fmt: skip
            target = self.rollback_to
        elif not read_release(state.workdir, target):
            older = [r for r in release_ids(state.workdir) if r < self.previous]
            target = older[-1] if older else None
        if target is None:
            raise AgentError("refused", "no earlier release than %s to roll back to"
                             % self.previous)  # fmt: skip
        old = read_release(state.workdir, target)
        self.release_id = target
        self.manifest_sha = old.get("manifest_sha256")
        self.verify_tree(os.path.join(releases_dir(state.workdir), target), old["manifest"])
        self.release_info = {"id": target, "files": len(old["manifest"]), "sent_files": 0,
                             "rollback_from": self.previous}  # fmt: skip
        return "ok", "releases/%s (replacing %s): every sha256 verified, .py compiled" % (
            target,
            self.previous,
        )

    def run_setup(self, state):
        if self.rollback:
            return "skipped", "done when releases/%s was built" % self.release_id
        if not self.setup:
            self.write_manifest(state, None)
            return "skipped", "no setup"
        digest = str(self.setup.get("hash"))
        if state.plan:
            old = read_release(state.workdir, self.previous) or {}
            reuse = old.get("setup_hash") == digest
            return "ok", "setup %s" % ("reused (inputs unchanged)" if reuse else "would run")
        old = read_release(state.workdir, self.previous) or {}
        self.before_setup = self.snapshot(state)
        if self.previous and old.get("setup_hash") == digest:
            source = os.path.join(releases_dir(state.workdir), self.previous)
            pairs = self.relocations(state, self.previous)
            files, relocated = copy_extras(source, self.built, set(row[0] for row in self.rows),
                                           pairs)  # fmt: skip
            self.write_manifest(state, digest)
            return "ok", (
                "reused from releases/%s (inputs unchanged; %d file(s) copied, %d of them "
                "relocated to this release's path)" % (self.previous, files, relocated)
            )
        deadline = time.monotonic() + float(self.setup.get("timeout") or 1800.0)
        for command in self.setup.get("run") or []:
            self.run_setup_command(state, str(command), deadline)
        self.write_manifest(state, digest)
        return "ok", "%d command(s) ran in releases/%s" % (len(self.setup["run"]), self.release_id)

    def relocations(self, state, old_id):
        """(old, new) byte strings: the old release's path, as the workdir was given and as it
        resolves, and the new release's. Ids have one width, so the two are of one length."""
        pairs = []
        for base in (state.workdir, os.path.realpath(state.workdir)):
            old = os.fsencode(os.path.join(base, RELEASES_DIR, old_id))
            new = os.fsencode(os.path.join(base, RELEASES_DIR, str(self.release_id)))
            if len(old) == len(new) and (old, new) not in pairs:
                pairs.append((old, new))
        return pairs

    def run_setup_command(self, state, command, deadline):
        """One setup command in the new release, its output streamed as progress lines (each
        cut at LINE_LIMIT bytes, so an endless line costs neither memory nor time); it and its
        children are killed at the deadline (a session of their own)."""
        env = login_env()  # as the run's: a login's in this container, then the playbook's
        env.update(state.env)
        env["PATH"] = env.get("PATH", "") + ":/usr/local/bin:/usr/bin:/bin"
        proc = subprocess.Popen(
            [state.shell, "-c", command], cwd=self.built, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        tail: list[str] = []
        line, cut = bytearray(), 0
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
            start = 0
            while True:
                end = data.find(b"\n", start)
                stop = len(data) if end < 0 else end
                room = max(LINE_LIMIT - len(line), 0)
                line += data[start : min(stop, start + room)]
                cut += max(stop - start - room, 0)
                if end < 0:
                    break
                self.setup_line(state, line, cut, tail)
                line, cut, start = bytearray(), 0, end + 1
        if line or cut:
            self.setup_line(state, line, cut, tail)
        out.close()
        code = proc.wait()
        # What the command left running in its session (a `... &` with its output elsewhere)
        # would go on changing the release after the check that follows: it ends with it.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:  # nothing left
            pass
        if code != 0:
            raise AgentError("failed", "setup %r exited %d; nothing was stopped:\n%s"
                             % (command, code, "\n".join(tail)))  # fmt: skip

    def setup_line(self, state, line, cut, tail):
        text = bytes(line).decode("utf-8", "replace").rstrip("\r")
        if cut:
            text += " [line cut: %d more bytes]" % cut
        tail.append(text)
        del tail[:-SETUP_TAIL]
        if state.events:
            emit_event({"event": "progress", "name": "setup", "detail": text})

    def write_manifest(self, state, setup_hash):
        if state.plan or self.rollback:
            return
        path = manifest_path(state.workdir, self.release_id)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, json.dumps({
            "id": self.release_id, "created": utc_iso(), "manifest": self.rows,
            "manifest_sha256": self.manifest_sha, "setup_hash": setup_hash,
            "previous": self.previous,
        }) + "\n")  # fmt: skip

    def snapshot(self, state):
        """What setup must leave as it was: `current`, `releases/`, and every release's
        directory and manifest files (inode, size, mode, mtime, ctime: a write changes ctime,
        whatever it does to mtime)."""
        link = current_link(state.workdir)
        rdir = releases_dir(state.workdir)
        files: dict[str, Any] = {}
        dirs: dict[str, Any] = {}
        rows_of = dict((rid, (read_release(state.workdir, rid) or {}).get("manifest") or [])
                       for rid in release_ids(state.workdir))  # fmt: skip
        rows_of[str(self.release_id)] = self.rows
        for rid, rows in rows_of.items():
            base = os.path.join(rdir, rid)
            dirs[rid] = node_key(base)
            for row in rows:
                files[os.path.join(base, str(row[0]))] = node_key(os.path.join(base, str(row[0])))
        current = os.readlink(link) if os.path.islink(link) else None
        return {"current": current, "releases": node_key(rdir), "dirs": dirs, "files": files}

    def check_intact(self, state):
        """After setup, before the switch and before anything is stopped: the releases, the
        new one's files and `current` as they were before setup ran."""
        self.refresh_queries(state)
        if self.rollback or state.plan or self.before_setup is None:
            return "skipped", "nothing ran"
        before, after = self.before_setup, self.snapshot(state)
        problems = []
        rdir = releases_dir(state.workdir)
        if after["current"] != before["current"]:
            problems.append("%s %s" % (current_link(state.workdir), "was removed"
                            if after["current"] is None else "was changed"))  # fmt: skip
        if after["releases"] != before["releases"]:
            problems.append("%s was removed or replaced" % rdir)
        gone = sorted(rid for rid, key in before["dirs"].items() if after["dirs"].get(rid) != key)
        if gone:
            problems.append("releases/%s %s removed or replaced" % (
                ", releases/".join(gone), "was" if len(gone) == 1 else "were"))  # fmt: skip
        changed = sorted(p for p, key in before["files"].items() if after["files"].get(p) != key)
        changed = [p for p in changed if not any(is_strict_child(p, os.path.join(rdir, g))
                                                 for g in gone)]  # fmt: skip
        if changed:
            shown = ", ".join(os.path.relpath(p, rdir) for p in changed[:3])
            more = " and %d more" % (len(changed) - 3) if len(changed) > 3 else ""
            problems.append("release files changed: %s%s" % (shown, more))
        if not problems:
            return "ok", "%d release(s), %d file(s) and %s as they were before setup" % (
                len(before["dirs"]),
                len(before["files"]),
                CURRENT_LINK,
            )
        restored = self.restore_current(state, before["current"])
        raise AgentError("failed", "setup changed what it must not (it may add files to its "
                         "own release, nothing else): %s; nothing was stopped%s"
                         % ("; ".join(problems), restored))  # fmt: skip

    def refresh_queries(self, state):
        """The nvidia-smi and tmux queries started with the transaction, started again when
        building the release took a while: they answer within their timeout of their start,
        and saw the container before setup ran."""
        started = [q for q in state.queries.values() if q is not None]
        if state.plan or not started:
            return
        if time.monotonic() - min(q.deadline - q.timeout for q in started) < QUERY_FRESH:
            return
        for query in started:
            query.cancel()
        start_queries(state)

    def restore_current(self, state, target):
        """`current` put back when setup removed it and its release is still there."""
        link = current_link(state.workdir)
        if target is None or os.path.lexists(link):
            return ""
        if not os.path.isdir(os.path.join(state.workdir, target)):
            return "; %s is gone and so is %s: roll back or deploy again" % (link, target)
        tmp = os.path.join(state.workdir, ".%s.launcher-%s.tmp" % (CURRENT_LINK, state.run_id))
        remove_quietly(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)
        return "; %s restored (-> %s)" % (link, target)

    # -- destructive

    def install(self, state):
        state.destructive = True
        details = []
        if state.dest_rel is not None:
            details.append(install_script(state)[1])
        link = current_link(state.workdir)
        tmp = os.path.join(state.workdir, ".%s.launcher-%s.tmp" % (CURRENT_LINK, state.run_id))
        remove_quietly(tmp)
        os.symlink(os.path.join(RELEASES_DIR, self.release_id), tmp)
        os.replace(tmp, link)  # rename(2): `current` is the old release or the new, never absent
        self.switched = True
        details.append("%s -> releases/%s (was %s)" % (link, self.release_id,
                                                        self.previous or "none"))  # fmt: skip
        return "ok", "; ".join(details)

    def write_record(self, state):
        outcome = write_deploy_record(state)
        pruned = prune_releases(state.workdir, self.keep_releases, self.release_id, state.warnings)
        self.release_info["pruned"] = pruned
        state.result["release"]["pruned"] = pruned  # the record, written before, has not
        return outcome


def node_key(path):
    """What changes when a file or directory is written, replaced or removed (None: gone)."""
    import stat  # loaded with os already; imported here, the agent's preload list stays

    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISDIR(info.st_mode):  # entries come and go in a directory: its identity only
        return ("dir", info.st_dev, info.st_ino)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mode, info.st_mtime_ns,
            info.st_ctime_ns)  # fmt: skip


def copy_file(source, dest):
    """`source` to a new file `dest`: a clone sharing blocks copy-on-write where the filesystem
    can (a write to either then changes only that one), else a copy."""
    import fcntl  # only a release's copies need it

    with open(source, "rb") as src, open(dest, "xb") as out:
        try:
            fcntl.ioctl(out.fileno(), FICLONE, src.fileno())
            return
        except OSError:
            pass
    shutil.copyfile(source, dest)  # in the kernel (sendfile), into the file made above


def copy_extras(old, new, manifest_paths, pairs):
    """What the old release's setup made (what is not in its manifest) copied into the new
    one and relocated: each old path of `pairs` in a file or a link's target replaced by the
    new one, byte for byte (one length, so offsets in a .pyc or an ELF file stay right; conda
    relocates its packages' binary files the same way, padding to keep the length). A venv's
    scripts then name the new release's python, and pruning the old release breaks nothing.
    Returns (files copied, files relocated)."""
    import stat

    files = relocated = 0
    for dirpath, dirnames, filenames in os.walk(old):
        rel_dir = os.path.relpath(dirpath, old)
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            source, dest = os.path.join(old, rel), os.path.join(new, rel)
            if rel in manifest_paths or os.path.lexists(dest):
                continue
            info = os.lstat(source)
            if stat.S_ISLNK(info.st_mode):
                target = os.fsencode(os.readlink(source))
                for before, after in pairs:
                    target = target.replace(before, after)
                os.symlink(os.fsdecode(target), dest)
            elif stat.S_ISDIR(info.st_mode):
                os.mkdir(dest, 0o700)
                os.chmod(dest, stat.S_IMODE(info.st_mode))
            elif stat.S_ISREG(info.st_mode):
                copy_file(source, dest)
                relocated += 1 if relocate(dest, pairs) else 0
                os.chmod(dest, stat.S_IMODE(info.st_mode))
                os.utime(dest, ns=(info.st_atime_ns, info.st_mtime_ns))
                files += 1
    return files, relocated


def relocate(path, pairs):
    """Each `old` of `pairs` in the file replaced in place by its `new` (of the same length),
    a block at a time; returns how many were replaced."""
    count = 0
    with open(path, "r+b") as handle:
        for old, new in pairs:
            handle.seek(0)
            offset, carry = 0, b""
            while True:
                block = handle.read(BLOCK)
                if not block:
                    break
                data = carry + block
                base = offset - len(carry)
                at = data.find(old)
                while at >= 0:
                    handle.seek(base + at)
                    handle.write(new)
                    count += 1
                    at = data.find(old, at + len(old))
                offset += len(block)
                carry = data[-(len(old) - 1) :] if len(old) > 1 else b""
                handle.seek(offset)
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
    state = DeployState(request, warnings)
    state.release = Release(request)
    state.start_dir = current_link(state.workdir)  # the run starts in the release
    return run_to_the_end(state)


def dispatching(plain):
    """The op handler for a request with a release, and `plain` (a script's) for the rest."""

    def handler(request, warnings):
        if request.get("release"):
            if request.get("op") == "rollback":
                request = rollback_request(request, warnings)
                request.pop("script_sha256", None)  # a release's code is the release
            return run_release_transaction(request, warnings)
        return plain(request, warnings)

    return handler

# mypy: allow-untyped-calls
"""Checkpoint archives: made by a deploy (`<checkpoints>.archived-<UTC time>`), measured (how
long their run lived, how many checkpoints they hold, their size) and pruned only with the
user's word.

No archive is deleted by default (`keep_archives` unset). With a limit, an archive beyond it is
pruned only if the runs kept in its place lived at least as long and hold at least as many
checkpoints; one worth more (a week-long run replaced by a few quick "fix a typo" deploys) is
kept unless the deploy was given `--prune-archives`. What a deploy archives is measured then
(its run's start is in its run id, its end in its exit file) and recorded in
`<workdir>/.launcher/archives.jsonl`; an archive without a record is measured from its files.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import time

from launcher.agent.base import list_dir, utc_iso, utc_now
from launcher.agent.paths import exit_path, is_strict_child, remove_tree, state_dir

# The name a deploy gives an archive; only such names are launcher's to prune.
STAMP = r"\.archived-([0-9]{8}T[0-9]{6}Z)(?:-([0-9]+))?$"
RUN_START = re.compile(r":([0-9]{8}T[0-9]{6}Z)-[0-9a-f]+$")  # session:<UTC start>-<hex>
RECORDS = "archives.jsonl"

# Only mypy reads the annotations (postponed by the __future__ import).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def archive_name(path):
    base = "%s.archived-%s" % (path, utc_now().strftime("%Y%m%dT%H%M%SZ"))
    candidate, n = base, 1
    while os.path.lexists(candidate):  # two deploys within one second
        candidate, n = "%s-%d" % (base, n), n + 1
    return candidate


def archives_of(path):
    """The archives a deploy made of the checkpoints at `path`, newest first."""
    parent, name = os.path.split(path)
    pattern = re.compile(re.escape(name) + STAMP)
    found = []
    for entry in list_dir(parent):
        match = pattern.match(entry)
        if match:
            found.append(((match.group(1), int(match.group(2) or 0)), os.path.join(parent, entry)))
    return [full for _, full in sorted(found, reverse=True)]


def measure_tree(path):
    """{checkpoints, seconds, bytes} of a checkpoints tree: its top-level entries (one per
    checkpoint: `step_100.pt`, `checkpoint-500/`), the time between the first and the last of
    them, and the size of every file in it (symlinks not followed)."""
    entries = []
    for name in list_dir(path):
        try:
            entries.append(os.lstat(os.path.join(path, name)).st_mtime)
        except OSError:
            continue
    return {
        "checkpoints": len(entries),
        "seconds": round(max(entries) - min(entries), 1) if entries else 0.0,
        "bytes": tree_bytes(path),
    }


def tree_bytes(path):
    total = 0
    for directory, dirs, files in os.walk(path):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(directory, d))]:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                continue
    return total


def run_seconds(workdir, session, run):
    """How long the run `run` (its marker) lived: from the start in its run id to its exit
    file (written when it ended) or now; None when the marker carries no start."""
    match = RUN_START.search(run or "")
    if not match:
        return None
    started = (
        datetime.datetime.strptime(match.group(1), "%Y%m%dT%H%M%SZ")
        .replace(tzinfo=datetime.timezone.utc)
        .timestamp()
    )
    try:
        ended = os.stat(exit_path(workdir, session)).st_mtime
    except OSError:
        ended = time.time()
    return round(max(ended - started, 0.0), 1)


def describe_archive(info):
    """`a run of 2.0 h, 12 checkpoints, 3.1 GiB`."""
    parts = []
    if info.get("seconds") is not None:
        parts.append("a run of %s" % duration_text(info["seconds"]))
    parts.append("%d checkpoint(s)" % info.get("checkpoints", 0))
    parts.append(size_text(info.get("bytes", 0)))
    return ", ".join(parts)


def duration_text(seconds):
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return "%.1f %s" % (seconds / length, unit)
    return "%d s" % seconds


def size_text(count):
    for unit, length in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= length:
            return "%.1f %s" % (count / length, unit)
    return "%d bytes" % count


def record_archive(workdir, path, run, seconds, warnings):
    """Measure the archive just made and append it to the records; its measures. A record that
    cannot be written (a full disk) is a warning: the archive is made, the launch goes on."""
    info = measure_tree(path)
    if seconds is not None:
        info["seconds"] = max(seconds, info["seconds"])
    info.update({"path": path, "run": run, "time": utc_iso()})
    directory = state_dir(workdir)
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, RECORDS), "a") as handle:
            handle.write(json.dumps(info, sort_keys=True) + "\n")
    except OSError as exc:
        warnings.append("could not record the archive's measures: %s" % exc)
    return info


def recorded(workdir):
    """{archive path: its record}, the latest record of each."""
    found: dict[str, Any] = {}
    try:
        with open(os.path.join(state_dir(workdir), RECORDS)) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return found
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            found[entry["path"]] = entry
    return found


def measured_archives(workdir, paths):
    """Each archive's measures: its record, else what its files say."""
    records = recorded(workdir)
    result = []
    for path in paths:
        entry = records.get(path)
        if entry is None:
            entry = measure_tree(path)
            entry["path"] = path
        result.append(entry)
    return result


def choose_prunes(archives, keep, force):
    """(to prune, kept beyond the limit with the reason) among `archives` (measures, newest
    first; the first is the one this deploy made and is never pruned by it). keep None: all
    kept. An archive beyond the newest `keep` is pruned only when the runs kept in its place
    lived at least as long and hold at least as many checkpoints, or when `force`."""
    if keep is None or len(archives) <= max(keep, 1):
        return [], []
    kept = archives[: max(keep, 1)]
    longest = max(a.get("seconds") or 0.0 for a in kept)
    most = max(a.get("checkpoints") or 0 for a in kept)
    prune, spared = [], []
    for archive in archives[max(keep, 1) :]:
        reasons = []
        seconds = archive.get("seconds") or 0.0
        if seconds > longest:
            reasons.append("lived longer (%s) than the runs since (at most %s)"
                           % (duration_text(seconds), duration_text(longest)))  # fmt: skip
        if (archive.get("checkpoints") or 0) > most:
            reasons.append("holds more checkpoints (%d) than theirs (at most %d)"
                           % (archive["checkpoints"], most))  # fmt: skip
        if reasons and not force:
            spared.append(dict(archive, reason="its run " + " and ".join(reasons)))
        else:
            prune.append(archive)
    return prune, spared


def prune_archives(archives, workdir, warnings):
    """Delete these archives (each checked to be a real directory inside the workdir); the
    paths deleted."""
    pruned = []
    real_workdir = os.path.realpath(workdir)
    for archive in archives:
        full = archive["path"]
        if os.path.islink(full) or not is_strict_child(os.path.realpath(full), real_workdir):
            warnings.append("left %s alone: it is a symlink or outside the workdir" % full)
            continue
        remove_tree(full)
        pruned.append(full)
    return pruned

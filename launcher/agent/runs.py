# mypy: allow-untyped-calls
"""What each run was, kept so it can be put back: its spec (command, environment, code) in a
0600 file of its own, and where its checkpoints are now, read from the deploy records."""

from __future__ import annotations

import json
import os

from launcher.agent.base import AgentError, list_dir, remove_quietly, sha256_or_none, utc_iso
from launcher.agent.paths import is_strict_child, read_json, state_dir, write_private

RUN_SPECS = 20  # the newest run specs kept (a watcher's restarts count too)

# --------------------------------------------------------------------------- run specs


def runs_dir(workdir):
    return os.path.join(state_dir(workdir), "runs")


def run_spec_path(workdir, marker):
    """`<session>:<id>` -> .launcher/runs/<session>.<id>.json (a session name holds no ':')."""
    session, _, run_id = marker.partition(":")
    if not session or not run_id or "/" in marker or marker.startswith("."):
        raise AgentError("invalid", "not a run: %r (want SESSION:ID)" % marker)
    return os.path.join(runs_dir(workdir), "%s.%s.json" % (session, run_id))


def save_run_spec(workdir, spec):
    """The run's spec, readable by its owner only: its env may hold secrets, as its run file
    does. The oldest beyond RUN_SPECS are removed."""
    os.makedirs(runs_dir(workdir), mode=0o700, exist_ok=True)
    write_private(run_spec_path(workdir, spec["run"]), json.dumps(spec, sort_keys=True) + "\n")
    entries = [os.path.join(runs_dir(workdir), n) for n in list_dir(runs_dir(workdir))]
    entries = [e for e in entries if e.endswith(".json")]
    entries.sort(key=os.path.getmtime, reverse=True)
    for old in entries[RUN_SPECS:]:
        remove_quietly(old)


def load_run_spec(workdir, marker):
    """The spec a run was launched with, or None (launched before specs were kept, or removed)."""
    spec = read_json(run_spec_path(workdir, marker))
    if spec is None or spec.get("run") != marker:
        return None
    if not isinstance(spec.get("env"), dict) or not isinstance(spec.get("command"), str):
        return None
    return spec


def new_spec(marker, command, env, checkpoints, record):
    return {
        "run": marker,
        "time": utc_iso(),
        "command": command,
        "env": env,
        "checkpoints": checkpoints,
        "overrides": record.get("overrides"),
        "message": record.get("message"),
    }


# --------------------------------------------------------------------------- the records


def read_records(workdir):
    """(the deploy records, oldest first; the count of unreadable lines)."""
    path = os.path.join(state_dir(workdir), "deploys.jsonl")
    records, unreadable = [], 0
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            unreadable += 1
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            unreadable += 1
    return records, unreadable


def launched(record):
    return record.get("outcome") == "launched" and isinstance(record.get("run"), str)


def replaced_run(records, index):
    """The run record `index` replaced: recorded as `replaced` (or, in records written before
    it was, the run launched just before it)."""
    record = records[index]
    if "replaced" in record:
        return record.get("replaced")
    for earlier in reversed(records[:index]):
        if launched(earlier) and earlier.get("session") == record.get("session"):
            return earlier["run"]
    return None


def latest_run(records, session):
    """The session's latest launched run (what a watcher's restart puts back as it was)."""
    for record in reversed(records):
        if launched(record) and record.get("session") == session:
            return record["run"]
    return None


def previous_run(records, session):
    """The run before the session's latest one (what a rollback puts back): the run the latest
    replaced, looking through a watcher's restarts (the same run again) to the run before."""
    index = next((i for i in range(len(records) - 1, -1, -1) if launched(records[i])
                  and records[i].get("session") == session), None)  # fmt: skip
    seen = set()
    while index is not None and index not in seen:
        seen.add(index)
        before = replaced_run(records, index)
        if not records[index].get("restarted_by") or before is None:
            return before
        index = launch_of(records, before)  # a restart: the run it restarted, and before it
    return None


def launch_of(records, marker):
    """The index of the record that launched `marker`, or None."""
    for index in range(len(records) - 1, -1, -1):
        if launched(records[index]) and records[index]["run"] == marker:
            return index
    return None


def checkpoints_of(records, marker):
    """Where `marker`'s checkpoints went when it was replaced, from the newest record that
    replaced it: ("archived", path), ("kept", None: left in place for the next run),
    ("deleted", None), ("none", None) or (None, None) when no record says."""
    for index in range(len(records) - 1, -1, -1):
        if replaced_run(records, index) != marker:
            continue
        moved = records[index].get("checkpoints") or {}
        action = moved.get("action")
        if action == "archive":
            return "archived", moved.get("to")
        if action == "restore":
            return ("archived", moved.get("archived")) if moved.get("archived") else ("none", None)
        if action == "purge":
            return "deleted", None
        if action == "keep":
            return "kept", None
        return "none", None
    return None, None


def where_checkpoints_are(records):
    """Each run's checkpoints now: {run: {"state", "path", "by"}}, following every record in
    order (archived, moved back, kept for the next run, deleted, pruned). `state`: live (in
    place, the run's own), archived (at `path`), continued (left in place for run `by`),
    restored (moved back in place for run `by`), deleted, pruned, gone (not at `path` any
    more), none (it had none)."""
    where = {}
    for index, record in enumerate(records):
        moved = record.get("checkpoints") or {}
        action = moved.get("action")
        new, old = record.get("run"), replaced_run(records, index)
        ok = launched(record)
        if old and action == "archive":
            where[old] = {"state": "archived", "path": moved.get("to")}
        elif old and action == "restore":
            kept = moved.get("archived")
            where[old] = {"state": "archived", "path": kept} if kept else {"state": "none"}
        elif old and action == "purge":
            where[old] = {"state": "deleted"}
        elif old and action == "keep" and ok:
            where[old] = {"state": "continued", "path": moved.get("from"), "by": new}
        if action == "restore" and moved.get("run") and ok:
            where[moved["run"]] = {"state": "restored", "path": moved.get("to"), "by": new}
        for path in moved.get("pruned") or ():
            for state in where.values():
                if state.get("state") == "archived" and state.get("path") == path:
                    state["state"] = "pruned"
        if ok:
            live = moved.get("to") if action == "restore" else moved.get("from")
            where[new] = {"state": "live", "path": live}
    for state in where.values():
        if state["state"] == "archived" and not os.path.isdir(state.get("path") or ""):
            state["state"] = "gone"
    return where


def env_diff(workdir, first, second):
    """Which env names differ between two runs' specs (names only: values may be secrets)."""
    a, b = load_run_spec(workdir, first), load_run_spec(workdir, second)
    if a is None or b is None:
        return {"known": False, "added": [], "removed": [], "changed": []}
    old, new = a["env"], b["env"]
    return {
        "known": True,
        "added": sorted(set(new) - set(old)),
        "removed": sorted(set(old) - set(new)),
        "changed": sorted(k for k in set(old) & set(new) if old[k] != new[k]),
    }


def archive_problem(workdir, checkpoints, archive):
    """Why `archive` may not be moved back to `checkpoints`, or None: it must be one of the
    checkpoints' own archives (a sibling named <checkpoints>.archived-…), a real directory
    strictly inside the real workdir, not a symlink."""
    if not archive:
        return "no archive recorded"
    parent, name = os.path.split(checkpoints)
    if os.path.dirname(archive) != parent or not os.path.basename(archive).startswith(
        name + ".archived-"
    ):
        return "%s is not an archive of %s" % (archive, checkpoints)
    if os.path.islink(archive) or not os.path.isdir(archive):
        return "%s is not there (pruned or removed)" % archive
    if not is_strict_child(os.path.realpath(archive), os.path.realpath(workdir)):
        return "%s resolves outside the workdir" % archive
    return None


def find_script(workdir, dest, sha):
    """A file with the script of sha256 `sha`: its kept copy (.launcher/scripts/<sha>.py), the
    installed script or its .prev; None when none of them has it."""
    if not sha or len(sha) != 64 or not all(c in "0123456789abcdef" for c in sha):
        return None
    kept = os.path.join(state_dir(workdir), "scripts", sha + ".py")
    for path in (kept, dest, dest + ".prev") if dest else (kept,):
        if not os.path.islink(path) and sha256_or_none(path) == sha:
            return path
    return None

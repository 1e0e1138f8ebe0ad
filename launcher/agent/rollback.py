# mypy: allow-untyped-calls
"""The `rollback` op: the run being put back (its command, env, code and checkpoints) turned
into a deploy transaction's request, then run through that transaction (deploy.py)."""

from __future__ import annotations

import os
import shutil

from launcher.agent.base import AgentError, random_hex, remove_quietly, sha256_file, sha256_or_none
from launcher.agent.deploy import op_apply
from launcher.agent.params import param, session_param, workdir_param
from launcher.agent.paths import dest_path
from launcher.agent.protocol import SPEC_NOT_KEPT
from launcher.agent.runs import (
    checkpoints_of,
    find_script,
    latest_run,
    load_run_spec,
    previous_run,
    read_records,
)


def op_rollback(request, warnings):
    """Put the previous run back through the same transaction as apply (lock, guards, stop,
    launch, record): its script (from the kept copies, verified like an upload; <dest>.prev for
    a run launched before specs were kept), its command and environment, and (restore) its
    archived checkpoints."""
    request = rollback_request(request, warnings)
    workdir = workdir_param(request)
    dest = dest_path(workdir, param(request, "dest", str, required=True))
    wanted = request.pop("script_sha256", None)
    previous = find_script(workdir, dest, wanted) if wanted else dest + ".prev"
    if previous is None:
        raise AgentError("refused", "the script of run %s (sha256 %s) is no longer kept"
                         % (request.get("to_run") or "being put back", wanted[:12]))  # fmt: skip
    if os.path.islink(previous) or not os.path.isfile(previous):
        raise AgentError(
            "refused", "no previous version to roll back to: %s does not exist" % previous
        )
    sha = sha256_file(previous)
    directory, name = os.path.split(dest)
    tmp = os.path.join(directory, ".%s.launcher-rollback-%s.tmp" % (name, random_hex(12)))
    shutil.copy2(previous, tmp)
    record = dict(request["record"])
    if not request.get("relaunch"):
        record["rolled_back_from"] = sha256_or_none(dest)
    applied = dict(request)
    applied.update({"op": "apply", "tmp": tmp, "sha256": sha, "record": record})
    try:
        return op_apply(applied, warnings)
    finally:
        remove_quietly(tmp)  # the transaction moved or removed it; this covers an early refusal


def rollback_request(request, warnings):
    """The rollback's request with the run it puts back filled in: `to_run` (default: the run
    the session's latest run replaced), its command and env from its spec, `restore_from`
    (checkpoint_mode restore: its archive, when there; otherwise a fresh start, said so), and
    for a script the sha256 of its kept copy. `relaunch` (a watcher's restart): the run is put
    back as it was, checkpoints kept in place, not called a rollback."""
    workdir = workdir_param(request)
    session = session_param(request)
    records = read_records(workdir)[0]
    relaunch = param(request, "relaunch", bool, default=False)
    marker = param(request, "to_run", str)
    marker = marker or (
        latest_run(records, session) if relaunch else previous_run(records, session)
    )
    request = dict(request)
    record = dict(param(request, "record", dict, default={}))
    if not relaunch:
        record["rollback"] = True
    use_spec = param(request, "use_spec", bool, default=True)
    spec = load_run_spec(workdir, marker) if marker and use_spec else None
    if spec is not None:
        record.update({"rolled_back_to": marker, "command": spec["command"]})
        if spec.get("overrides") is not None:
            record["overrides"] = spec["overrides"]
        request.update({"command": spec["command"], "env": spec["env"]})
        request["script_sha256"] = spec.get("sha256")
        if request.get("release") and spec.get("release"):
            request["release"] = dict(request["release"], to=spec["release"])
    elif marker and (relaunch or param(request, "need_spec", bool, default=False)):
        raise AgentError("refused", "cannot put run %s back: %s" % (marker, SPEC_NOT_KEPT))
    elif marker and use_spec:
        warnings.append("run %s was launched before launcher kept run specs: the playbook's "
                        "command and env are used" % marker)  # fmt: skip
    request["record"] = record
    if param(request, "checkpoint_mode", str) == "restore":
        state, where = checkpoints_of(records, marker) if marker else (None, None)
        if state == "archived" and where and os.path.isdir(where):
            request.update({"restore_from": where, "restore_run": marker})
        elif state == "kept":
            request["checkpoint_mode"] = "keep"  # they never left: the replaced run went on
        else:
            request["checkpoint_mode"] = "archive"
            reasons = {"archived": "its archive %s is gone" % where, "deleted": "they were deleted",
                       "none": "it had none"}  # fmt: skip
            why = reasons.get(state or "", "no record says where they went")
            warnings.append("checkpoints of %s not restored (%s): the run starts fresh"
                            % (marker or "the previous run", why))  # fmt: skip
    return request

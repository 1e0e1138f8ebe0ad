# mypy: allow-untyped-calls
"""The `preflight` op: what the container has for a deploy (python, tmux, workdir, space,
GPUs, the session, the lock), changing nothing but an asked-for workdir."""

from __future__ import annotations

import os

from launcher.agent.base import PYTHON_VERSION, sha256_or_none
from launcher.agent.gpus import gpu_report
from launcher.agent.lock import lock_state
from launcher.agent.params import param, session_param, workdir_param
from launcher.agent.paths import checkpoint_problem, protected_paths, state_dir
from launcher.agent.protocol import LOCK_PATH
from launcher.agent.tmux import session_state, tmux_version

# --------------------------------------------------------------------------- op: preflight


def op_preflight(request, warnings):
    workdir = workdir_param(request)
    session = session_param(request)
    dest = param(request, "dest", str, required=True)
    checkpoints = param(request, "checkpoints", str)
    gpus = param(request, "gpus", int, default=0)
    need = param(request, "need_bytes", int, default=0)
    workdir_info = prepare_workdir(workdir, param(request, "create_workdir", bool, default=False))
    free = free_bytes(workdir)
    if free is not None and need and free < need:
        warnings.append("only %d bytes free, %d needed" % (free, need))
    gpu_info = gpu_report(gpus)
    if gpus > 0 and gpu_info["visible"] < gpus:
        warnings.append("%d GPUs wanted, %d visible" % (gpus, gpu_info["visible"]))
    return {
        "python": PYTHON_VERSION,
        "tmux": tmux_version(),
        "workdir": workdir_info,
        "free_bytes": free,
        "gpus": gpu_info,
        "session": session_state(session),
        "dest_sha256": sha256_or_none(os.path.join(workdir, dest)),
        "checkpoints": checkpoints_info(
            workdir, checkpoints, protected_paths(workdir, session, os.path.join(workdir, dest))
        ),
        "lock": lock_state(param(request, "lock_path", str, default=LOCK_PATH)),
    }


def prepare_workdir(workdir, create):
    exists = os.path.isdir(workdir)
    created = False
    if create and not exists:
        os.makedirs(state_dir(workdir), exist_ok=True)
        exists = created = True
    elif create:
        os.makedirs(state_dir(workdir), exist_ok=True)
    writable = exists and os.access(workdir, os.W_OK | os.X_OK)
    return {"exists": exists, "writable": writable, "created": created}


def free_bytes(path):
    # The workdir may not exist yet: measure the filesystem it would be created on.
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def checkpoints_info(workdir, rel, protected=()):
    if rel is None:
        return None
    path, unsafe = checkpoint_problem(workdir, rel, protected)
    return {"path": path, "exists": os.path.lexists(path), "unsafe": unsafe}

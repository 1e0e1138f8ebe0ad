"""The contract between launcher and its in-container agent: every op's request and answer.

This file travels with the agent: the client sends its source first in the agent's bundle, and
inside the container it is the module `launcher.protocol` the agent's modules import (see
launcher/agent/__init__.py). So it has to run on whatever python3 the container has (Python 3.8
syntax, standard library only) and define nothing but names and types. The client
(`launcher.agentclient`) builds requests and reads answers only through these types, and the
agent uses the same names and constants: there is no second copy to drift.

Every answer is an envelope::

    {"ok": bool, "op": str, "error": AgentErrorInfo | None, "warnings": [str], ...op data}
"""

from __future__ import annotations

TYPE_CHECKING = False
# The agent's loader marks each module it makes (launcher/agent/boot.py, BUNDLED).
if TYPE_CHECKING or not globals().get("__launcher_bundled__"):
    # The client's Python (3.11+) has all of these; in the container they are never imported
    # (see below) and the annotations naming them are never evaluated (the __future__ import).
    from typing import Any, Literal, NotRequired, Required, TypedDict  # novermin
else:
    # In the container nothing reads these types: a plain dict base stands in
    # for TypedDict, so the agent's start, on every call, neither imports typing nor builds
    # two dozen TypedDict classes (~10 ms together).
    class TypedDict(dict):
        def __init_subclass__(cls, **options: object) -> None:
            pass


# Shared constants: the client sends them, the agent defaults to them.
LOCK_PATH = "/run/launcher/deploy.lock"
STATE_DIR = ".launcher"
PANE_WIDTH = 250
PANE_HEIGHT = 50
HISTORY_LIMIT = 100_000

# How the client starts the agent: `pct exec VMID -- AGENT_ARGV`, where BOOT reads one JSON line
# from stdin and runs the loader in it (launcher/agent/boot.py), which comes zlib-compressed in
# base64 (it travels on every call: 1.4 KB so, 2.5 KB as JSON-escaped source). Until that line
# arrives it does nothing.
# The trailing comment names the process in `ps` (and for `pkill -f launcher_agent`).
# BOOT also imports the standard modules the agent and its loader use (a test keeps the list in
# step with the agent's modules) before it waits: they load while the request is on its way.
AGENT_MODULES = (
    "base64", "contextlib", "datetime", "fcntl", "gzip", "hashlib", "io", "marshal", "os", "re",
    "select", "shlex", "shutil", "signal", "subprocess", "time",
)  # fmt: skip
BOOT = (
    f"import json,sys,zlib,{','.join(AGENT_MODULES)};"
    "m=json.loads(sys.stdin.readline());"
    "exec(zlib.decompress(base64.b64decode(m['boot'])))#launcher_agent"
)
# -I: no PYTHON* variables, user site or working directory on sys.path can put code of someone
# else's in the agent (a json.py in the directory pct exec starts in); -S: no site import, which
# the stdlib-only agent does not need and which costs start-up time on every call.
AGENT_ARGV = ["python3", "-I", "-S", "-c", BOOT]

OPS = ("preflight", "apply", "stop", "poll", "logs", "follow", "history", "rollback", "releases")
# Ops whose stdout carries a stream (log bytes): their envelope is the last line on stderr.
STREAMING_OPS = ("follow",)
# A workdir may not be one of SYSTEM_DIRS nor lie below one of SYSTEM_TREES: checkpoints under it
# are moved and deleted. The config checks the written path, the agent the real one.
SYSTEM_TREES = (
    "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/usr", "/etc",
)  # fmt: skip
SYSTEM_DIRS = (
    *SYSTEM_TREES, "/", "/run", "/var", "/home", "/tmp", "/opt", "/srv", "/mnt", "/media",
    "/var/lib", "/var/tmp", "/run/launcher",
)  # fmt: skip


def system_path_problem(path: str) -> str | None:
    """Why `path` (absolute, normalised) cannot be a workdir, or None."""
    if path in SYSTEM_DIRS:
        return f"{path} is a system directory"
    for tree in SYSTEM_TREES:
        if path.startswith(tree + "/"):
            return f"{path} is inside the system directory {tree}"
    return None


# The start of the refusal a deploy with expect_run gets when the run was replaced meanwhile.
RUN_REPLACED = "no longer runs"

# Error kinds an answer can carry; the client maps each onto one exit code. "down": a deploy
# stopped the old run and then could not launch the new one (nothing runs; the message says what
# was stopped and where the checkpoints are).
ERROR_KINDS = ("refused", "locked", "unsafe_path", "corrupt", "compile", "missing", "invalid",
               "failed", "down")  # fmt: skip


class AgentErrorInfo(TypedDict, total=False):
    kind: Required[str]
    message: Required[str]
    holder: dict[str, Any]  # locked: who holds the deploy lock
    holders: list[dict[str, Any]]  # refused for GPUs: the processes holding them
    gpus_outside: list[dict[str, Any]]  # refused for GPUs used from outside the container


class Operator(TypedDict):
    user: str
    host: str
    pid: int


class SessionState(TypedDict):
    exists: bool
    pane_dead: bool | None
    dead_status: int | None
    pane_pid: int | None
    width: int | None
    run: str | None  # the run marker "session:run-id" of the deploy that launched it
    created: int | None  # when tmux created the session (epoch s, the container's clock)


class GpuHolder(TypedDict, total=False):
    """A process of the container with /dev/nvidia<N> open (container PID, from /proc)."""

    pid: int
    name: str
    gpus: list[int]
    command: str | None


class GpuOutside(TypedDict):
    """A GPU with memory in use and no holder in the container: another CT or the host."""

    index: int
    used_mib: int | None


class GpuReport(TypedDict):
    visible: int
    names: list[str]
    error: str | None
    holders: list[GpuHolder]
    skipped: bool
    outside: list[GpuOutside]
    watchers: NotRequired[str]  # `nvtop (pid 812) watches GPUs 0-7`: files open, no GPU used


class PollGpus(TypedDict, total=False):
    """A poll's GPUs: those the run's processes use, per GPU [index, util %, used MiB] (None:
    unknown); `age`: the device facts are an earlier query's, this many seconds old (the
    current nvidia-smi still runs); `watchers`: [pid, name, GPUs] of processes with device
    files open and no GPU in use (nvtop, NVML monitors)."""

    want: Required[int]
    held: Required[list[int]]
    devices: Required[list[list[int | None]]]
    error: Required[str | None]
    age: float
    watchers: list[list[Any]]


class LockState(TypedDict, total=False):
    operator: str | None
    from_host: str | None
    client_pid: int | None
    agent_pid: int | None
    since: str | None
    raw: str
    stale: bool


class Step(TypedDict, total=False):
    name: str
    status: str  # ok | unchanged | skipped | warning | failed | planned
    detail: str
    seconds: float
    kind: str  # failed steps: the error kind


class StopReport(TypedDict):
    was_running: bool
    session_existed: bool
    pids: list[int]
    forced: bool
    leftover: list[int]
    gpu_holders: list[GpuHolder]  # the run's own processes still holding GPU devices
    gpu_others: list[GpuHolder]  # processes of the container outside the run holding GPUs
    gpu_outside: list[GpuOutside]  # its GPUs still in use from outside the container


class Envelope(TypedDict):
    ok: bool
    op: str
    error: AgentErrorInfo | None
    warnings: list[str]


# --------------------------------------------------------------------------- requests
# Each request declares every key the agent reads from it: `NotRequired` where the agent has a
# default, required where it cannot do without the key (most answer `invalid`). `op` is the op's
# name as a Literal. tests/unit/test_protocol_contract.py runs each handler against requests
# that record what is read and fails on a key the request type does not declare.


class PreflightRequest(TypedDict):
    op: Literal["preflight"]
    workdir: str
    session: str
    dest: str
    checkpoints: NotRequired[str | None]
    gpus: NotRequired[int]
    need_bytes: NotRequired[int]  # free bytes a deploy needs (script, its .prev copy, a margin)
    create_workdir: NotRequired[bool]
    lock_path: NotRequired[str]


# A release's directory and link inside the workdir, and where their manifests are kept.
RELEASES_DIR = "releases"
CURRENT_LINK = "current"
# Manifest rows: [path, size, mode (0o644 or 0o755), sha256]; a path is relative and normalised.


class SetupRequest(TypedDict):
    run: list[str]
    hash: str  # over the commands and the sha256 of each input: equal means reuse
    timeout: NotRequired[float]


class ReleaseSpec(TypedDict, total=False):
    """The release part of an apply (or, with rollback, of a rollback)."""

    manifest: list[list[Any]]  # required unless rollback
    manifest_sha256: str | None
    blobs_b64: str | None  # the missing files' stream (gzip frames), inline
    # or pushed before, in pieces: [path in the workdir, size, sha256] each, in stream order
    blobs_parts: list[list[Any]] | None
    sent_files: int
    keep_releases: int
    setup: SetupRequest | None
    rollback: bool


class ReleasesRequest(TypedDict):
    op: Literal["releases"]
    workdir: str
    want: NotRequired[list[str]]  # sha256s: which of them does the container hold (verified)?
    contents: NotRequired[list[str]]  # paths in the current release whose text to answer (--diff)


class TransactionRequest(TypedDict, total=False):
    """apply (deploy) and rollback: one locked transaction, or (plan) its checks alone. A
    rollback is an apply of `<dest>.prev` (or of the previous release): it reads the same keys."""

    op: Required[Literal["apply", "rollback"]]
    workdir: Required[str]
    session: Required[str]
    command: Required[str]
    dest: str | None  # required without a release
    restart: bool
    kill_gpu_holders: bool
    grace: float
    checkpoints: str | None
    checkpoint_mode: Literal["archive", "purge", "keep"]
    keep_archives: int
    env: dict[str, str]
    width: int
    height: int
    history_limit: int
    gpus: int
    lock_path: str
    operator: Operator
    record: dict[str, Any]
    run_id: str | None  # default: a new one; a multi-node job gives every node the same
    # The script: inline (base64) or pushed before to `tmp`; its sha256 is checked either way
    # (required without a release).
    content_b64: str | None
    tmp: str | None
    sha256: str | None
    check_resources: bool
    need_bytes: int
    # A project release (see ReleaseSpec); dest and sha256 are then only for a script beside it.
    release: ReleaseSpec | None
    plan: bool  # run every check, change nothing, answer the planned steps
    keep_going: bool  # with plan: go on after a failed check (doctor shows them all)
    wait_lock: float  # seconds to wait for another deploy's lock before refusing (0: at once)
    # Replace only this run (its marker): refused when the session runs another one by now.
    # Two watchers that saw the same crash both ask; under the deploy lock only one acts.
    expect_run: str | None
    events: bool  # each step as a JSON line on stderr as it happens (AgentClient.transaction)
    # The shell that runs the command and the Python that compiles the script; launcher sends
    # neither (the agent's defaults: /bin/sh, its own interpreter).
    shell: str
    python: str


class StopRequest(TypedDict):
    op: Literal["stop"]
    session: str
    workdir: NotRequired[str]  # where the stop is recorded (the run's state is then `stopped`)
    grace: NotRequired[float]
    gpus: NotRequired[int]
    cuda_visible_devices: NotRequired[str]  # the playbook's env: which GPUs its run uses
    lock_path: NotRequired[str]
    operator: NotRequired[Operator]


class PollRequest(TypedDict):
    op: Literal["poll"]
    workdir: str
    session: str
    lines: NotRequired[int]
    lock_path: NotRequired[str]
    checkpoints: NotRequired[str | None]  # answer checkpoint_age for this directory
    gpus: NotRequired[int]  # answer gpus (the run's GPUs) when > 0


class LogsRequest(TypedDict):
    op: Literal["logs"]
    workdir: str
    session: str
    lines: NotRequired[int]
    raw: NotRequired[bool]


class FollowRequest(TypedDict):
    op: Literal["follow"]
    workdir: str
    session: str
    offset: NotRequired[int]
    heartbeat: NotRequired[float]
    interval: NotRequired[float]


class HistoryRequest(TypedDict):
    op: Literal["history"]
    workdir: str
    limit: NotRequired[int]


# --------------------------------------------------------------------------- answers


class WorkdirInfo(TypedDict):
    exists: bool
    writable: bool
    created: bool


class CheckpointsInfo(TypedDict):
    path: str
    exists: bool
    unsafe: str | None


class PreflightAnswer(Envelope):
    python: str
    tmux: str | None
    workdir: WorkdirInfo
    free_bytes: int | None
    gpus: GpuReport
    session: SessionState
    dest_sha256: str | None
    checkpoints: CheckpointsInfo | None
    lock: LockState | None


class TransactionAnswer(Envelope, total=False):
    steps: list[Step]
    script: dict[str, Any] | None
    stopped: StopReport | None
    checkpoints: dict[str, Any] | None
    launched: dict[str, Any] | None
    record: dict[str, Any] | None
    preflight: dict[str, Any] | None
    release: dict[str, Any] | None  # a project: the release built (or rolled back to)


class StopAnswer(Envelope):
    stopped: StopReport


class PollAnswer(Envelope):
    session: SessionState
    capture: str
    exit_code: int | None
    stopped: dict[str, Any] | None  # who stopped the run and when (launcher stop), if anyone
    now: float
    record: dict[str, Any] | None
    log_age: float | None
    # Seconds since anything below `checkpoints` was written (0 for a tree too large to look
    # through: taken as being written); None: no such directory, or not asked.
    checkpoint_age: float | None
    lock: LockState | None  # a deploy in progress (its run is about to replace this one)
    gpus: PollGpus | None  # asked with gpus > 0


class LogsAnswer(Envelope):
    source: str  # log | pane
    log_file: str
    log_exists: bool
    lines: list[str]
    partial: str
    offset: int
    session: SessionState
    exit_code: int | None


class RunEnd(TypedDict):
    reason: str
    exit_code: int | None


class FollowAnswer(Envelope):
    ended: RunEnd | None
    client_gone: bool
    offset: int


class ReleasesAnswer(Envelope):
    current: str | None  # the release `current` points at
    manifest: list[list[Any]] | None
    manifest_sha256: str | None
    have: list[str]
    contents: dict[str, str | None]  # base64, None when missing or too large
    releases: list[str]


class HistoryAnswer(Envelope):
    path: str
    records: list[dict[str, Any]]
    total: int

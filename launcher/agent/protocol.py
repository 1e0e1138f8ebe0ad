"""The contract between launcher and its in-container agent: every op's request and answer.

This file travels with the agent: the client sends its source first in the agent's bundle, and
inside the container it is the module `launcher.agent.protocol` the agent's modules import (see
launcher/agent/__init__.py). So it has to run on whatever python3 the container has (Python 3.8
syntax, standard library only) and define nothing but names and types. The client
(`launcher.container.agentclient`) builds requests and reads answers only through these types,
and the agent uses the same names and constants: there is no second copy to drift.

Every answer is an envelope::

    {"ok": bool, "op": str, "error": AgentErrorInfo | None, "warnings": [str], ...op data}
"""

from __future__ import annotations

TYPE_CHECKING = False
# The agent's loader marks each module it makes (launcher/agent/boot.py, BUNDLED).
if TYPE_CHECKING or not globals().get("__launcher_bundled__"):
    # Only the client imports these; in the container they are never imported (see below)
    # and the annotations naming them are never evaluated (the __future__ import).
    import sys
    from typing import Any, Literal

    if sys.version_info >= (3, 12):
        from typing import NotRequired, Required, TypedDict  # novermin
    else:  # before 3.12, pydantic (the client's check of answers) takes typing_extensions' one
        from typing_extensions import NotRequired, Required, TypedDict
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
# What launcher tells every run about itself, in its run file after the playbook's env (so a
# trainer need not hard-code what launcher knows). A playbook may not set them itself.
RUN_ENV = (
    "LAUNCHER_RUN_ID",  # this launch's id (the part after "session:" of LAUNCHER_RUN)
    "LAUNCHER_RELEASE",  # the project's release id, or the script's sha256
    "LAUNCHER_WORKDIR",  # the playbook's workdir, absolute
    "LAUNCHER_CHECKPOINTS",  # the checkpoints directory, absolute ("" when there is none)
    "LAUNCHER_RESTART_COUNT",  # 0, or how many times in a row a watcher restarted this run
)

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

OPS = ("preflight", "apply", "stop", "poll", "logs", "follow", "history", "rollback", "releases",
       "network")  # fmt: skip
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
# Said when a run cannot be put back as it was: launched before launcher kept run specs.
SPEC_NOT_KEPT = "its spec (command, environment, code) was not kept"

# Error kinds an answer can carry; the client maps each onto one exit code. "down": a deploy
# stopped the old run and then could not launch the new one (nothing runs; the message says what
# was stopped and where the checkpoints are). "expired": the request reached the point where it
# would change something after its deadline (its client had given up): nothing was changed.
ERROR_KINDS = ("refused", "locked", "unsafe_path", "corrupt", "compile", "missing", "invalid",
               "failed", "down", "expired")  # fmt: skip

# Requests that change something carry `deadline`: seconds, counted from when the host's shell
# received the call (by the host's clock, read before `pct` ran; the container shares it), after
# which the agent refuses to start changing anything. A relative budget on the host's clock, not
# an absolute time on the client's: the client's clock may be off by any amount, the host's and
# the container's are one.


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
# name as a Literal. tests/local/test_protocol_contract.py runs each handler against requests
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


class ListenSpec(TypedDict):
    port: int
    seconds: float  # how long the listener waits for the others' probes
    expect: int  # how many connections end it early


class ProbeSpec(TypedDict):
    address: str
    port: int
    seconds: float  # connects retried until then (the listener may start a moment later)


class HostsBlock(TypedDict):
    marker: str  # the block's name: `# --- BEGIN <marker> ---` ... `# --- END <marker> ---`
    lines: list[str]  # `<address> <name>...`


class NetworkRequest(TypedDict):
    """What a job's node can tell about the network torchrun will use (launcher.jobs.network): its
    names and interfaces, the names it resolves, the torch it has; on rank 0 a listener on the
    master port for a while, on the others a probe of it."""

    op: Literal["network"]
    resolve: NotRequired[list[str]]
    pythons: NotRequired[list[str]]  # where torch is looked for, first found wins
    listen: NotRequired[ListenSpec | None]
    probe: NotRequired[ProbeSpec | None]
    # The one change this op makes, and only when asked (a job's launch, manage_hosts): the
    # block in /etc/hosts replaced by these lines.
    hosts: NotRequired[HostsBlock | None]


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
    to: str  # with rollback: the release to go back to (default: the one before current)


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
    # restore (rollback): the replaced run's checkpoints to an archive of their own, and the
    # archive `restore_from` (the agent finds it) moved back in place for the run put back.
    checkpoint_mode: Literal["archive", "purge", "keep", "restore"]
    restore_from: str | None
    restore_run: str | None
    keep_archives: int | None  # None: every archive kept
    # The user's --prune-archives: beyond keep_archives, also archives of runs that lived
    # longer or hold more checkpoints than the runs kept in their place.
    prune_archives: bool
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
    # with plan, for a person (deploy --dry-run): an active run without restart is a warning
    # and the plan goes on as --restart would, instead of a refusal (a job's checks refuse)
    preview: bool
    wait_lock: float  # seconds to wait for another deploy's lock before refusing (0: at once)
    # Replace only this run (its marker): refused when the session runs another one by now.
    # Two watchers that saw the same crash both ask; under the deploy lock only one acts.
    expect_run: str | None
    # Seconds from the host's receipt within which the transaction may begin to change anything
    # (checked at its start and again before its first change); see `deadline` above.
    deadline: float
    events: bool  # each step as a JSON line on stderr as it happens (AgentClient.transaction)
    # The shell that runs the command and the Python that compiles the script; launcher sends
    # neither (the agent's defaults: /bin/sh, its own interpreter).
    shell: str
    python: str
    restart_count: int  # LAUNCHER_RESTART_COUNT: a watcher's restart says which one (default 0)
    # rollback: the run to put back (default: the run the session's latest run replaced), its
    # command, env and code from the spec kept when it was launched. relaunch: a watcher's
    # restart of that same run (no rollback). need_spec: refuse when the spec was not kept.
    to_run: str | None
    relaunch: bool
    need_spec: bool
    # false (a multi-node job's rollback: the job gives every node its env anew): the previous
    # script version (<dest>.prev) with the request's command and env, as before run specs.
    use_spec: bool
    # deploy --rollback-on-failure: refuse before any change unless the replaced run can be put
    # back (its spec and code kept, its checkpoints neither purged nor pruned at once).
    rollback_guard: bool


class StopRequest(TypedDict):
    op: Literal["stop"]
    session: str
    workdir: NotRequired[str]  # where the stop is recorded (the run's state is then `stopped`)
    grace: NotRequired[float]
    gpus: NotRequired[int]
    cuda_visible_devices: NotRequired[str]  # the playbook's env: which GPUs its run uses
    lock_path: NotRequired[str]
    operator: NotRequired[Operator]
    # The run the client means to stop (its marker, as the poll it made first saw it; None: a
    # session launcher did not start, or none): a session running another one is not touched.
    # Absent: whatever runs.
    expect_run: NotRequired[str | None]
    deadline: NotRequired[float]  # see `deadline` above


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
    # Two runs (markers): answer `env_diff`, which env names differ between their specs (the
    # values, which may be secrets, never leave the container).
    diff: NotRequired[list[str]]


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
    # With diff: {"known": both specs kept, "added", "removed", "changed": env names}.
    env_diff: NotRequired[dict[str, Any]]


class NetInterface(TypedDict):
    name: str | None  # None: from `hostname -I`, which names no interface
    address: str
    prefix: int | None


class Resolved(TypedDict):
    addresses: list[str]
    error: str | None


class TorchInfo(TypedDict):
    python: str
    version: str | None
    local_addr: bool  # torchrun has --local_addr (newer torch)


class Listened(TypedDict):
    bound: bool
    in_use: bool  # the port was taken (an old run's store): the probes reached that instead
    accepted: int
    error: str | None


class Probed(TypedDict):
    ok: bool
    attempts: int
    seconds: float
    error: str | None


class NetworkAnswer(Envelope):
    hostname: str
    fqdn: str  # what torch 1.13's elastic agent publishes (socket.getfqdn(gethostname()))
    interfaces: list[NetInterface]
    resolved: dict[str, Resolved]
    torch: TorchInfo | None
    listened: Listened | None
    probed: Probed | None
    hosts: str | None  # the file whose block was written (asked with `hosts`)

"""Inventory and playbook models: validated once, with errors that name file, key and line."""

from __future__ import annotations

import ipaddress
import math
import os
import posixpath
import re
import reprlib
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from launcher.agent.protocol import RUN_ENV, STATE_DIR, system_path_problem
from launcher.config.proxyjump import JUMP_RE
from launcher.config.yamlsource import YamlDocument, load_yaml
from launcher.core.bounded import regular_file_problem
from launcher.core.errors import ConfigError, UsageError
from launcher.verify.formats import StatusSpec
from launcher.verify.spec import ChecksSpec, QueueSpec, StepSpec

DEFAULT_INVENTORY = "inventory.yaml"

# tmux treats '.', ':' and a leading '=' specially in target names; refuse rather than escape.
SESSION_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

HOUR = 3600.0
DAY = 24 * HOUR
WEEK = 7 * DAY
MAX_VMID = 999_999_999  # Proxmox's largest VMID


class _Model(BaseModel):
    # Numbers are finite: `.inf` or `.nan` as a timeout would mean "never" or a traceback.
    # defer_build: a model's validator is built when it first validates, not at import; the
    # inventory's and the playbook's take their nested models' schemas in, and those never
    # build their own (every model built at import cost `status` ~30 ms, with its serializer).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, defer_build=True)


# A training script is kilobytes; one of gigabytes is a mistake (a checkpoint, a dataset), read
# whole into memory and sent through the container's stdin before anything could refuse it.
SCRIPT_LIMIT = 64 << 20
# What an address may be: a host name or IPv4 address, or an IPv6 address (no port: `port:`).
ADDRESS_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def address_problem(value: str) -> str | None:
    """Why `value` is no host address (a `host:port`, a URL, spaces), or None."""
    if ADDRESS_RE.match(value) and len(value) <= 253:
        return None
    try:
        ipaddress.IPv6Address(value.removeprefix("[").removesuffix("]"))
    except ValueError:
        pass
    else:
        return None
    if ":" in value and value.count(":") == 1:
        return f"{value!r} is host:port; give the port as `port:` and the host alone here"
    return f"{value!r} is not a host name or IP address"


def _no_control(value: str) -> str:
    if "\x00" in value or "\n" in value or "\r" in value:
        raise ValueError("must not contain NUL or newline characters")
    return value


def _inside(value: str) -> str:
    return _relative_inside(_no_control(value), allow_nested=True)


# A value written on one line (a file name, an address): no NUL, no newline.
SingleLine = Annotated[str, AfterValidator(_no_control)]
NonEmptyLine = Annotated[str, Field(min_length=1), AfterValidator(_no_control)]
# A path below the workdir: relative, without '..', on one line.
InsidePath = Annotated[str, AfterValidator(_inside)]


class HostSpec(_Model):
    address: NonEmptyLine
    user: NonEmptyLine = "root"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 22
    identity_file: SingleLine | None = None
    known_hosts: SingleLine | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    jump: str | None = None
    # A key with a passphrase: through ssh-agent only, or also asked for on the terminal.
    passphrase: Literal["agent", "prompt"] = "agent"
    connect_timeout: Annotated[float, Field(strict=True, gt=0, le=600)] = 10.0
    command_timeout: Annotated[float, Field(strict=True, gt=0, le=DAY)] = 300.0
    # Commands at once on the one connection: each is an SSH session, and sshd refuses more
    # than its MaxSessions (10 by default) per connection; 8 leaves room for `attach`.
    max_sessions: Annotated[StrictInt, Field(ge=1, le=1000)] = 8
    # Keep the connection open in a background process for later commands until it has been
    # idle this long (seconds; 0: off), as OpenSSH's ControlPersist (see persist.py).
    control_persist: Annotated[float, Field(strict=True, ge=0, le=DAY)] = 0.0

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        problem = address_problem(value)
        if problem:
            raise ValueError(problem)
        return value.removeprefix("[").removesuffix("]")

    @field_validator("jump")
    @classmethod
    def _jump(cls, value: str | None) -> str | None:
        if value is not None:
            parse_jumps(value)
        return value


def parse_jumps(value: str) -> list[tuple[str | None, str, int]]:
    """ProxyJump as OpenSSH writes it: hops separated by commas, the nearest first, or `none`
    (no jump host, whatever ssh_config says); ValueError saying what is wrong."""
    if value == "none":
        return []
    return [parse_jump(hop) for hop in value.split(",")]


def parse_jump(jump: str) -> tuple[str | None, str, int]:
    """One hop `[user@]host[:port]` -> (user or None, host, port); ValueError saying what is
    wrong."""
    _no_control(jump)
    if "," in jump or "://" in jump:
        raise ValueError(f"each jump host must be [user@]host[:port] (got {jump!r})")
    match = JUMP_RE.match(jump)
    if match is None:
        raise ValueError(f"must be [user@]host[:port] (got {jump!r})")
    host = match["host"].removeprefix("[").removesuffix("]")
    return match["user"], host, _port(match["port"])


def _port(text: str | None) -> int:
    if text is None:
        return 22
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise ValueError(f"port must be a number from 1 to 65535 (got {text!r})")
    return int(text)


class ClusterSpec(_Model):
    """A Proxmox cluster: its nodes (each reached like a host) and the ones asked where a VMID
    runs (`entry`, default: every node, in order)."""

    nodes: Annotated[dict[str, HostSpec], Field(min_length=1)]
    entry: Annotated[list[str], Field(min_length=1)] | None = None


class TargetSpec(_Model):
    host: str | None = None
    cluster: str | None = None  # instead of host: the node that runs the VMID is looked up
    vmid: Annotated[StrictInt, Field(gt=0, le=MAX_VMID)]
    playbook: SingleLine


class JobSpec(_Model):
    """One training run across several targets (launcher.jobs.job): its nodes in rank order, the
    playbook every node runs, where the ranks meet, and the rank whose status lines are judged."""

    nodes: Annotated[list[str], Field(min_length=1, max_length=1024)]
    playbook: SingleLine
    master_port: Annotated[StrictInt, Field(ge=1, le=65535)] = 29500
    # A node's address as the other nodes reach it; a node without one is asked (`hostname -I`).
    addresses: dict[str, str] = Field(default_factory=dict)
    status_rank: Annotated[StrictInt, Field(ge=0)] = 0
    # torchrun's rendezvous (launcher.jobs.network): `auto` takes c10d when every node resolves rank
    # 0's name to its address, else one that needs no names; `c10d` or `static` insist.
    rendezvous: Literal["auto", "c10d", "static"] = "auto"
    # torchrun's --max_restarts (PET_MAX_RESTARTS): in-place restarts of a node's workers.
    max_restarts: Annotated[StrictInt, Field(ge=0, le=1000)] = 0
    # Write the other nodes' names into each node's /etc/hosts (a block of launcher's own, just
    # before the launch), so torch's c10d rendezvous finds them without DNS.
    manage_hosts: bool = False

    @field_validator("addresses")
    @classmethod
    def _addresses(cls, value: dict[str, str]) -> dict[str, str]:
        for node, address in value.items():
            problem = reachable_address_problem(address)
            if problem:
                raise ValueError(f"{node}: {problem}")
        return value


def reachable_address_problem(address: str) -> str | None:
    """Why `address` cannot be where other nodes reach a rank (None: it can)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return f"{address!r} is not an IP address"
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        return f"{address} is a loopback, unspecified, multicast or link-local address"
    return None


class InventorySpec(_Model):
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    clusters: dict[str, ClusterSpec] = Field(default_factory=dict)
    targets: dict[str, TargetSpec]
    default_target: str | None = None
    groups: dict[str, list[str]] = Field(default_factory=dict)
    jobs: dict[str, JobSpec] = Field(default_factory=dict)


class ScriptSpec(_Model):
    source: SingleLine
    dest: InsidePath


class ProjectSpec(_Model):
    """A directory deployed as a release (`<workdir>/releases/<id>`, `<workdir>/current`)."""

    source: SingleLine
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)
    gitignore: bool = True
    keep_releases: Annotated[StrictInt, Field(ge=1, le=100)] = 3
    # A hostile or mistaken tree (a dataset, a million files) is refused before anything is sent.
    max_files: Annotated[StrictInt, Field(ge=1, le=1_000_000)] = 20_000
    max_bytes: Annotated[StrictInt, Field(ge=1, le=2**40)] = 2 * 2**30
    max_file_bytes: Annotated[StrictInt, Field(ge=1, le=2**40)] = 2**30


class SetupSpec(_Model):
    """Commands run in a new release before the old run is stopped; rerun only when the
    commands or the files named in `inputs` (paths in the project) change."""

    run: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    inputs: list[str] = Field(default_factory=list)
    timeout: Annotated[float, Field(strict=True, gt=0, le=DAY)] = 1800.0

    @field_validator("run")
    @classmethod
    def _commands(cls, value: list[str]) -> list[str]:
        for item in value:
            if "\x00" in item:
                raise ValueError("setup commands must not contain NUL characters")
        return value

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: list[str]) -> list[str]:
        return [_inside(item) for item in value]


class _Step(StepSpec):
    """A stall is noticed within the longest probe window."""

    stall_after: Annotated[float, Field(strict=True, gt=0, le=WEEK)] = 120.0
    hang_after: Annotated[float | None, Field(strict=True, gt=0, le=WEEK)] = None

    @model_validator(mode="after")
    def _hang_within_stall(self) -> _Step:
        if self.hang_after is not None and self.hang_after > self.stall_after:
            raise ValueError(
                f"hang_after ({self.hang_after:g} s) must be at most stall_after "
                f"({self.stall_after:g} s): a step unchanged for stall_after is a stall anyway"
            )
        return self


class VerifySpec(ChecksSpec):
    """The playbook's `verify:` section: probe timing plus the check settings."""

    wait: Annotated[float, Field(strict=True, ge=0, le=WEEK)] = 180.0
    interval: Annotated[float, Field(strict=True, ge=0.2, le=HOUR)] = 10.0
    window: Annotated[float, Field(strict=True, ge=0, le=WEEK)] = 300.0
    successes: Annotated[StrictInt, Field(ge=1, le=1000)] = 3
    lines: Annotated[StrictInt, Field(ge=10, le=100_000)] = 2000
    # The run is meant to be short (a CI smoke run with a small max_steps): one that exits 0
    # after progress, before the probe counted its passing polls, is healthy. Off: it is not.
    finish_ok: StrictBool = False
    step: _Step = Field(default_factory=_Step)


class PlaybookSpec(_Model):
    name: Annotated[str, Field(min_length=1)]
    session: str
    workdir: str
    script: ScriptSpec | None = None
    project: ProjectSpec | None = None
    setup: SetupSpec | None = None
    checkpoints: InsidePath = "checkpoints"
    command: Annotated[str, Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    gpus: Annotated[StrictInt, Field(ge=0, le=256)] = 0
    # Bounded: the deploy lock is held while the old run gets its grace.
    stop_grace: Annotated[float, Field(strict=True, ge=0, le=HOUR)] = 30.0
    # Checkpoint archives kept (None: all). Beyond it, an archive of a run worth more than the
    # runs kept in its place is pruned only with `deploy --prune-archives`.
    keep_archives: Annotated[StrictInt, Field(ge=0, le=1000)] | None = None
    # Length-bucket boundaries of the trainer's bucketed shuffle (`launcher buckets plan`).
    buckets: (
        Annotated[list[Annotated[StrictInt, Field(ge=0, le=2**40)]], Field(max_length=1000)] | None
    ) = None
    verify: VerifySpec = Field(default_factory=VerifySpec)
    # How the trainer's status lines are read (format, preset, fields): launcher.verify.formats.
    status: StatusSpec = Field(default_factory=StatusSpec)

    @model_validator(mode="after")
    def _mapped_queues_checked(self) -> PlaybookSpec:
        # A queue the status: block maps is one its lines report: checked like DFlash's own
        # (the dict is filled in place: the playbook did not set verify.queues).
        if "queues" not in self.verify.model_fields_set:
            for name in self.status.fields.queues:
                self.verify.queues.setdefault(name, QueueSpec())
        return self

    @model_validator(mode="after")
    def _script_or_project(self) -> PlaybookSpec:
        if self.script is None and self.project is None:
            raise ValueError("give script, project, or both")
        if self.setup is not None and self.project is None:
            raise ValueError("setup runs in a project's release: it needs project")
        return self

    @model_validator(mode="after")
    def _dest_not_launchers_own(self) -> PlaybookSpec:
        if self.script is None:
            return self
        problem = dest_problem(self.script.dest, self.checkpoints)
        if problem:
            raise ValueError(f"script.dest {self.script.dest!r} {problem}")
        return self

    @field_validator("buckets")
    @classmethod
    def _increasing(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (
            len(value) < 2 or value[0] < 0 or any(b <= a for a, b in pairwise(value))
        ):
            raise ValueError("must be at least two strictly increasing lengths, from 0 or more")
        return value

    @field_validator("session")
    @classmethod
    def _session_name(cls, value: str) -> str:
        if not SESSION_RE.match(value):
            raise ValueError(
                f"{value!r} is not a usable tmux session name "
                "(letters, digits, '_' and '-', at most 64, not starting with '-')"
            )
        return value

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, value: str) -> str:
        _no_control(value)
        if not value.startswith("/"):
            raise ValueError(f"must be an absolute path inside the container (got {value!r})")
        # normpath keeps a leading '//' (POSIX leaves its meaning open); Linux reads it as '/'.
        normal = "/" + posixpath.normpath(value).lstrip("/")
        if normal == "/" or ".." in value.split("/"):
            raise ValueError(f"must be a directory below / without '..' (got {value!r})")
        problem = system_path_problem(normal)
        if problem:
            raise ValueError(
                f"{problem}: a deploy writes there and purges checkpoints below it "
                f"(got {value!r}; use e.g. /root/<name> or /opt/<name>)"
            )
        return normal

    @field_validator("command")
    @classmethod
    def _command_line(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not ENV_NAME_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key in RUN_ENV or key in ("LAUNCHER_RUN", "LAUNCHER_COMMAND"):
                raise ValueError(f"{key} is launcher's own: every run gets it (docs/deploy.md)")
            if "\x00" in item:
                raise ValueError(f"value of {key} must not contain NUL characters")
        return value


def dest_problem(dest: str, checkpoints: str) -> str | None:
    """Why a (normalised, workdir-relative) script destination is unusable, or None: launcher's
    own records and the checkpoints (moved aside by a deploy) are no place for the script. The
    container checks it again by real path (symlinks, an existing directory)."""
    if _within(dest, STATE_DIR):
        return f"is inside {STATE_DIR}/, where launcher keeps its deploy records, run file and log"
    if _within(dest, checkpoints) or _within(checkpoints, dest):
        return f"overlaps checkpoints ({checkpoints!r}), which a deploy may move aside"
    return None


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _relative_inside(value: str, *, allow_nested: bool) -> str:
    """A path relative to workdir that stays strictly inside it (checked again in the container)."""
    if not value or value.startswith("/"):
        raise ValueError(f"must be a path relative to workdir, strictly inside it (got {value!r})")
    parts = value.split("/")
    if ".." in parts:
        raise ValueError(f"must not contain '..': it would escape workdir (got {value!r})")
    normal = posixpath.normpath(value)
    if normal in (".", "") or (not allow_nested and "/" in normal):
        raise ValueError(f"must name something inside workdir, not workdir itself (got {value!r})")
    return normal


@dataclass(frozen=True)
class Playbook:
    """A validated playbook plus where it came from and its resolved script source."""

    path: Path
    spec: PlaybookSpec
    script_source: Path | None
    project_source: Path | None = None

    @property
    def dest_path(self) -> str | None:
        script = self.spec.script
        return None if script is None else posixpath.join(self.spec.workdir, script.dest)

    @property
    def checkpoints_path(self) -> str:
        return posixpath.join(self.spec.workdir, self.spec.checkpoints)


@dataclass(frozen=True)
class Cluster:
    name: str
    spec: ClusterSpec


@dataclass(frozen=True)
class Target:
    """One container to act on: its host, its VMID and its playbook.

    A cluster target has `cluster` set; until launcher.targets.cluster.place() has found the node
    that runs the VMID, host_name is the cluster's name and host its first entry node.
    """

    name: str
    host_name: str
    host: HostSpec
    vmid: int
    playbook: Playbook
    cluster: Cluster | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.host_name} CT {self.vmid})"


@dataclass(frozen=True)
class Inventory:
    path: Path
    spec: InventorySpec
    document: YamlDocument

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def resolve_names(self, names: list[str], *, all_targets: bool = False) -> list[str]:
        """Expand target names, `a,b` lists and groups; default_target when none is given."""
        if all_targets:
            return list(self.spec.targets)
        wanted: list[str] = []
        for raw in names:
            wanted.extend(part.strip() for part in raw.split(",") if part.strip())
        if not wanted:
            if not self.spec.default_target:
                raise UsageError(
                    f"{self.path}: no target given and no default_target set",
                    hint="pass -t NAME or set default_target in the inventory",
                )
            wanted = [self.spec.default_target]
        result: list[str] = []
        for name in wanted:
            members = self.spec.groups.get(name, [name])
            for member in members:
                if member not in self.spec.targets:
                    known = ", ".join(sorted(self.spec.targets)) or "none"
                    raise UsageError(f"{self.path}: unknown target {member!r} (known: {known})")
                if member not in result:
                    result.append(member)
        return result

    def target(self, name: str, playbook: Playbook | None = None) -> Target:
        """The target; `playbook` instead of its own (a job's nodes all run the job's)."""
        spec = self.spec.targets[name]
        if playbook is None:
            playbook = load_playbook(
                self.base_dir / spec.playbook,
                referenced_from=self.document.problem(("targets", name, "playbook"), ""),
            )
        if spec.cluster is not None:
            cluster = Cluster(spec.cluster, self.spec.clusters[spec.cluster])
            first = (cluster.spec.entry or list(cluster.spec.nodes))[0]
            host_name, host = spec.cluster, cluster.spec.nodes[first]
        else:
            cluster, host_name = None, str(spec.host)
            host = self.spec.hosts[host_name]
        return Target(name, host_name, host, spec.vmid, playbook, cluster)


def _friendly(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling)"
    if kind == "missing":
        return "required key is missing"
    if kind in ("int_type", "int_parsing", "int_from_float") and error["loc"][-1] == "vmid":
        return f"must be a positive integer (got {_shown(error.get('input'))})"
    if kind == "greater_than" and error["loc"][-1] == "vmid":
        return f"must be a positive integer (got {_shown(error.get('input'))})"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind in _SHOW_INPUT:
        message += f" (got {_shown(error.get('input'))})"
    return message


# Number errors, where the value given helps: `true`, `.inf`, `"10"` or 1e9 for a timeout.
_SHOW_INPUT = frozenset(
    [
        "finite_number",
        "float_type",
        "int_type",
        "int_from_float",
        "int_parsing",
        "float_parsing",
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
    ]
)


def _shown(value: object) -> str:
    """A value as YAML spells it, cut short (it can be a whole subtree)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"
    return reprlib.repr(value)


def _validate(document: YamlDocument, model: type[_Model], what: str) -> Any:
    if not isinstance(document.data, dict):
        raise ConfigError([document.problem((), f"{what} must be a YAML mapping")])
    try:
        return model.model_validate(document.data)
    except ValidationError as exc:
        problems = [
            document.problem([p for p in e["loc"] if isinstance(p, str | int)], _friendly(dict(e)))
            for e in exc.errors()
        ]
        raise ConfigError(problems) from None
    except Exception as exc:
        if interrupted_build(exc):
            raise KeyboardInterrupt from None
        raise


def interrupted_build(error: BaseException) -> bool:
    """A Ctrl-C that landed while pydantic-core built a validator: every model here is built
    on its first use (defer_build), which is in `_validate`. pydantic-core turns the
    KeyboardInterrupt into a SchemaError whose message ends with it and keeps neither
    __cause__ nor __context__; it is still a Ctrl-C (the CLI's guard: exit 130)."""
    return type(error).__name__ == "SchemaError" and str(error).rstrip().endswith(
        "KeyboardInterrupt:"
    )


def inventory_path(option: str | None) -> Path:
    return Path(option or os.environ.get("LAUNCHER_INVENTORY") or DEFAULT_INVENTORY)


def load_inventory(path: Path) -> Inventory:
    """Load and validate inventory.yaml, including cross references between its sections."""
    document = load_yaml(path, what="inventory")
    spec: InventorySpec = _validate(document, InventorySpec, "the inventory")
    problems: list[str] = []
    for name, target in spec.targets.items():
        if not NAME_RE.match(name):
            problems.append(
                document.problem(("targets", name), "target names use letters, digits, '_.-'")
            )
        problems.extend(_placement_problems(document, spec, name, target))
    problems.extend(_cluster_problems(document, spec))
    problems.extend(_job_problems(document, spec))
    if spec.default_target and spec.default_target not in spec.targets:
        problems.append(
            document.problem(("default_target",), f"unknown target {spec.default_target!r}")
        )
    for group, members in spec.groups.items():
        if group in spec.targets:
            problems.append(
                document.problem(("groups", group), "a group cannot share a target's name")
            )
        for index, member in enumerate(members):
            if member not in spec.targets:
                problems.append(
                    document.problem(("groups", group, index), f"unknown target {member!r}")
                )
    if problems:
        raise ConfigError(problems)
    return Inventory(path=path, spec=spec, document=document)


def _placement_problems(
    document: YamlDocument, spec: InventorySpec, name: str, target: TargetSpec
) -> list[str]:
    """A target names exactly one known host or cluster."""
    where = ("targets", name)
    if (target.host is None) == (target.cluster is None):
        return [document.problem(where, "give either host or cluster (exactly one of them)")]
    if target.cluster is not None:
        if target.cluster in spec.clusters:
            return []
        known = ", ".join(sorted(spec.clusters)) or "none"
        message = f"unknown cluster {target.cluster!r} (clusters: {known})"
        return [document.problem((*where, "cluster"), message)]
    if target.host in spec.hosts:
        return []
    known = ", ".join(sorted(spec.hosts)) or "none"
    return [document.problem((*where, "host"), f"unknown host {target.host!r} (hosts: {known})")]


def _cluster_problems(document: YamlDocument, spec: InventorySpec) -> list[str]:
    """Entry nodes must be nodes of their cluster."""
    problems = []
    for name, cluster in spec.clusters.items():
        for index, entry in enumerate(cluster.entry or []):
            if entry not in cluster.nodes:
                known = ", ".join(sorted(cluster.nodes))
                message = f"unknown node {entry!r} (nodes: {known})"
                problems.append(document.problem(("clusters", name, "entry", index), message))
    return problems


def _job_problems(document: YamlDocument, spec: InventorySpec) -> list[str]:
    """A job's nodes are distinct known targets, in distinct containers; its addresses and
    status rank refer to them."""
    problems = []
    for name, job in spec.jobs.items():
        where = ("jobs", name)
        if not NAME_RE.match(name) or name in spec.targets or name in spec.groups:
            message = "job names use letters, digits, '_.-' and differ from targets and groups"
            problems.append(document.problem(where, message))
        seen: dict[tuple[str | None, int], str] = {}
        for index, node in enumerate(job.nodes):
            target = spec.targets.get(node)
            if target is None:
                known = ", ".join(sorted(spec.targets)) or "none"
                message = f"unknown target {node!r} (known: {known})"
                problems.append(document.problem((*where, "nodes", index), message))
                continue
            place = (target.host or target.cluster, target.vmid)
            if place in seen:
                message = f"{node!r} is the same container as {seen[place]!r} (one rank each)"
                problems.append(document.problem((*where, "nodes", index), message))
            seen.setdefault(place, node)
        for node in job.addresses:
            if node not in job.nodes:
                message = f"{node!r} is not one of this job's nodes"
                problems.append(document.problem((*where, "addresses", node), message))
        if job.status_rank >= len(job.nodes):
            message = f"rank {job.status_rank} does not exist: the job has {len(job.nodes)} node(s)"
            problems.append(document.problem((*where, "status_rank"), message))
    return problems


def load_playbook(path: Path, *, referenced_from: str | None = None) -> Playbook:
    """Load and validate a playbook; the script source is resolved relative to the playbook."""
    if not path.is_file() and referenced_from:
        raise ConfigError(
            [f"{referenced_from.rstrip(': ')}: playbook file not found: {path}"],
            hint="a target's playbook path is relative to the inventory file's directory",
        )
    document = load_yaml(path, what="playbook")
    spec: PlaybookSpec = _validate(document, PlaybookSpec, "a playbook")
    source = None if spec.script is None else _script_source(path, spec.script.source, document)
    project = None if spec.project is None else _project_source(path, spec.project, document)
    return Playbook(path=path, spec=spec, script_source=source, project_source=project)


def _project_source(playbook: Path, project: ProjectSpec, document: YamlDocument) -> Path:
    """The project directory, resolved relative to the playbook."""
    where = ("project", "source")
    try:
        source = (playbook.parent / os.path.expanduser(project.source)).resolve()
    except (OSError, RuntimeError) as exc:
        raise ConfigError(
            [document.problem(where, f"cannot resolve {project.source}: {exc}")]
        ) from None
    if not source.is_dir():
        raise ConfigError([document.problem(where, f"project directory not found: {source}")])
    return source


def _script_source(playbook: Path, value: str, document: YamlDocument) -> Path:
    """The script's resolved path, which must be a regular file launcher can open."""
    where = ("script", "source")
    try:
        source = (playbook.parent / os.path.expanduser(value)).resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise ConfigError([document.problem(where, f"cannot resolve {value}: {exc}")]) from None
    if not source.exists():
        raise ConfigError(
            [document.problem(where, f"script not found: {source}")],
            hint="script.source is relative to the playbook file's directory",
        )
    problem = regular_file_problem(source, SCRIPT_LIMIT)
    if problem:
        raise ConfigError([document.problem(where, f"script {source}: {problem}")])
    try:
        # unreadable (permissions): say so now, not at upload; non-blocking (a FIFO swapped in)
        os.close(os.open(source, os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        problem = f"cannot read script {source}: {exc.strerror or exc}"
        raise ConfigError([document.problem(where, problem)]) from None
    return source


def check_all(path: Path) -> tuple[Inventory, list[Target], list[str]]:
    """Validate the inventory and every playbook it names; collect all problems."""
    inventory = load_inventory(path)
    targets: list[Target] = []
    problems: list[str] = []
    for name in inventory.spec.targets:
        try:
            targets.append(inventory.target(name))
        except ConfigError as exc:
            problems.extend(exc.problems)
    return inventory, targets, problems

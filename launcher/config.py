"""Inventory and playbook models: validated once, with errors that name file, key and line."""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
)

from launcher.checks import ChecksSpec
from launcher.errors import ConfigError, UsageError
from launcher.yamlsource import YamlDocument, load_yaml

DEFAULT_INVENTORY = "inventory.yaml"

# tmux treats '.', ':' and a leading '=' specially in target names; refuse rather than escape.
SESSION_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,63}$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _no_control(value: str) -> str:
    if "\x00" in value or "\n" in value or "\r" in value:
        raise ValueError("must not contain NUL or newline characters")
    return value


class HostSpec(_Model):
    address: Annotated[str, Field(min_length=1)]
    user: Annotated[str, Field(min_length=1)] = "root"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] = 22
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["strict", "accept-new"] = "strict"
    jump: str | None = None
    connect_timeout: Annotated[float, Field(gt=0, le=600)] = 10.0
    command_timeout: Annotated[float, Field(gt=0)] = 300.0

    @field_validator("address", "user", "jump")
    @classmethod
    def _single_line(cls, value: str | None) -> str | None:
        return value if value is None else _no_control(value)


class TargetSpec(_Model):
    host: str
    vmid: Annotated[StrictInt, Field(gt=0)]
    playbook: str


class InventorySpec(_Model):
    hosts: dict[str, HostSpec]
    targets: dict[str, TargetSpec]
    default_target: str | None = None
    groups: dict[str, list[str]] = Field(default_factory=dict)


class ScriptSpec(_Model):
    source: str
    dest: str

    @field_validator("dest")
    @classmethod
    def _dest_inside(cls, value: str) -> str:
        return _relative_inside(_no_control(value), allow_nested=True)


class VerifySpec(ChecksSpec):
    """The playbook's `verify:` section: probe timing plus the check settings."""

    wait: Annotated[float, Field(ge=0)] = 180.0
    interval: Annotated[float, Field(gt=0)] = 10.0
    window: Annotated[float, Field(ge=0)] = 300.0
    successes: Annotated[StrictInt, Field(ge=1)] = 3
    lines: Annotated[StrictInt, Field(ge=10, le=100_000)] = 2000


class PlaybookSpec(_Model):
    name: Annotated[str, Field(min_length=1)]
    session: str
    workdir: str
    script: ScriptSpec
    checkpoints: str = "checkpoints"
    command: Annotated[str, Field(min_length=1)]
    env: dict[str, str] = Field(default_factory=dict)
    gpus: Annotated[StrictInt, Field(ge=0)] = 0
    stop_grace: Annotated[float, Field(ge=0)] = 30.0
    keep_archives: Annotated[StrictInt, Field(ge=0)] = 3
    # Length-bucket boundaries of the trainer's bucketed shuffle (`launcher buckets plan`).
    buckets: list[StrictInt] | None = None
    verify: VerifySpec = Field(default_factory=VerifySpec)

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
        normal = posixpath.normpath(value)
        if normal == "/" or ".." in value.split("/"):
            raise ValueError(f"must be a directory below / without '..' (got {value!r})")
        return normal

    @field_validator("checkpoints")
    @classmethod
    def _checkpoints_inside(cls, value: str) -> str:
        return _relative_inside(_no_control(value), allow_nested=True)

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
            if "\x00" in item:
                raise ValueError(f"value of {key} must not contain NUL characters")
        return value


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
    script_source: Path

    @property
    def dest_path(self) -> str:
        return posixpath.join(self.spec.workdir, self.spec.script.dest)

    @property
    def checkpoints_path(self) -> str:
        return posixpath.join(self.spec.workdir, self.spec.checkpoints)


@dataclass(frozen=True)
class Target:
    """One container to act on: its host, its VMID and its playbook."""

    name: str
    host_name: str
    host: HostSpec
    vmid: int
    playbook: Playbook

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

    def target(self, name: str) -> Target:
        spec = self.spec.targets[name]
        playbook = load_playbook(
            self.base_dir / spec.playbook,
            referenced_from=self.document.problem(("targets", name, "playbook"), ""),
        )
        return Target(
            name=name,
            host_name=spec.host,
            host=self.spec.hosts[spec.host],
            vmid=spec.vmid,
            playbook=playbook,
        )


def _friendly(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key (check the spelling)"
    if kind == "missing":
        return "required key is missing"
    if kind in ("int_type", "int_parsing", "int_from_float") and error["loc"][-1] == "vmid":
        return f"must be a positive integer (got {error.get('input')!r})"
    if kind == "greater_than" and error["loc"][-1] == "vmid":
        return f"must be a positive integer (got {error.get('input')!r})"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


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
        if target.host not in spec.hosts:
            known = ", ".join(sorted(spec.hosts)) or "none"
            problems.append(
                document.problem(
                    ("targets", name, "host"), f"unknown host {target.host!r} (hosts: {known})"
                )
            )
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


def load_playbook(path: Path, *, referenced_from: str | None = None) -> Playbook:
    """Load and validate a playbook; the script source is resolved relative to the playbook."""
    if not path.is_file() and referenced_from:
        raise ConfigError([f"{referenced_from.rstrip(': ')}: playbook file not found: {path}"])
    document = load_yaml(path, what="playbook")
    spec: PlaybookSpec = _validate(document, PlaybookSpec, "a playbook")
    source = (path.parent / os.path.expanduser(spec.script.source)).resolve()
    if not source.is_file():
        raise ConfigError([document.problem(("script", "source"), f"script not found: {source}")])
    return Playbook(path=path, spec=spec, script_source=source)


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

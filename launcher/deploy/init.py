"""`launcher init`: an inventory and a playbook for one trainer on one container, from a few
answers, with the `status:` block found in the trainer's own output.

The files are made here from the answers (`Answers`), the output is read from a log the person
names or from a short trial run of the command in the container (`trial_lines`: the script
pushed to a private temporary directory, the command run there under `timeout`, the directory
removed), and `verify/detect.py` finds the block. What asks the questions and shows the host
key is `cli/init.py`.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from launcher.config.models import NAME_RE, SESSION_RE, Target
from launcher.container.pct import Container, HostConnection
from launcher.core.errors import ContainerError, UsageError
from launcher.transport import hostkey
from launcher.verify.detect import Detection, detect_status

HostKey = hostkey.HostKey
DEFAULT_HOST = "pve"
_HOST_RE = re.compile(
    r"^(?:(?P<user>[^@\s]+)@)?(?P<address>\[[^\]]+\]|[^:\s]+)(?::(?P<port>\d+))?$"
)
TRIAL_GRACE = 30.0  # on top of the trial's own seconds: the push, the start, C-c and the kill


@dataclass(frozen=True)
class Answers:
    """What `launcher init` asked for (or was given as flags)."""

    address: str
    port: int
    user: str
    vmid: int
    trainer: Path  # the script on this machine
    command: str  # run in the workdir, as the playbook's `command:`
    name: str  # the target, the playbook's name and its tmux session
    gpus: int = 0
    identity_file: str | None = None


def parse_host(text: str, *, port: int = 22, user: str = "root") -> tuple[str, str, int]:
    """`[user@]address[:port]` → (user, address, port); the flags' values where it is silent."""
    match = _HOST_RE.match(text.strip())
    if match is None:
        raise UsageError(f"host {text!r}: write ADDRESS, USER@ADDRESS or ADDRESS:PORT")
    found = match["port"]
    if found is not None and not 0 < int(found) < 65536:
        raise UsageError(f"host {text!r}: port {found} is not 1..65535")
    return match["user"] or user, match["address"].strip("[]"), int(found) if found else port


def default_name(trainer: Path) -> str:
    """The trainer file's stem as a target and session name (`train_gpt.py` → `train_gpt`)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", trainer.stem).strip("-")[:64]
    return name if name and SESSION_RE.match(name) else "train"


def check_name(name: str) -> str:
    if not (NAME_RE.match(name) and SESSION_RE.match(name)):
        raise UsageError(
            f"name {name!r}: use letters, digits, '_' and '-' (64 at most), not starting with '-'"
        )
    return name


def playbook_path(inventory: Path, name: str) -> Path:
    return inventory.parent / "playbooks" / f"{name}.yaml"


def existing(paths: list[Path]) -> list[Path]:
    return [path for path in paths if os.path.lexists(path)]


def inventory_document(answers: Answers, playbook: Path, inventory: Path) -> dict[str, Any]:
    host: dict[str, Any] = {"address": answers.address}
    if answers.port != 22:
        host["port"] = answers.port
    if answers.user != "root":
        host["user"] = answers.user
    if answers.identity_file:
        host["identity_file"] = answers.identity_file
    relative = os.path.relpath(playbook, inventory.parent)
    return {
        "hosts": {DEFAULT_HOST: host},
        "targets": {
            answers.name: {"host": DEFAULT_HOST, "vmid": answers.vmid, "playbook": relative}
        },
        "default_target": answers.name,
    }


def playbook_document(
    answers: Answers, playbook: Path, status: dict[str, Any] | None
) -> dict[str, Any]:
    source = os.path.relpath(answers.trainer.resolve(), playbook.parent.resolve())
    book: dict[str, Any] = {
        "name": answers.name,
        "session": answers.name,
        "workdir": f"/root/{answers.name}",
        "script": {"source": source, "dest": answers.trainer.name},
        "checkpoints": "checkpoints",
        "command": answers.command,
        "gpus": answers.gpus,
    }
    if status:  # `{}`: DFlash's own lines, read by default; None: nothing found
        book["status"] = status
    return book


def write_yaml(path: Path, document: dict[str, Any], header: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    path.write_text(header + text, encoding="utf-8")


def sample_lines(path: Path, limit: int = 64 << 20) -> list[str]:
    """A log's lines (of its last `limit` bytes), split at newlines only (as `status-format`)."""
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limit:
                handle.seek(size - limit)
            data = handle.read(limit)
    except OSError as exc:
        raise UsageError(f"sample {path}: {exc.strerror or exc}") from None
    return data.decode("utf-8", "replace").split("\n")


def trial_lines(target: Target, seconds: float) -> list[str]:
    """The trainer's output from a trial run of `seconds` in the target's container."""
    from launcher.targets.fleet import on_target

    return on_target(target, lambda placed, conn: _trial(placed, conn, seconds))


def _trial(target: Target, conn: HostConnection, seconds: float) -> list[str]:
    source = target.playbook.script_source
    spec = target.playbook.spec
    assert source is not None and spec.script is not None  # init writes a script playbook
    script = source.read_bytes()
    container = Container(conn, target.vmid, label=target.label)
    where = f"/tmp/launcher-init-{secrets.token_hex(6)}"
    dest = f"{where}/{spec.script.dest}"
    container.exec(["mkdir", "-m", "700", where], timeout=conn.endpoint.command_timeout)
    try:
        container.push(script, dest, perms="0755")
        # pct push can exit 0 after a failed write: the content is checked before it runs.
        sums = container.exec(["sha256sum", dest], timeout=conn.endpoint.command_timeout)
        if sums.out.split()[:1] != [hashlib.sha256(script).hexdigest()]:
            raise ContainerError(f"{target.label}: the trial copy of {dest} did not arrive intact")
        # C-c after `seconds` (a trainer's own KeyboardInterrupt flushes), killed 5 s later;
        # unbuffered, so a Python trainer's lines are not lost in a pipe's buffer.
        run = ["env", "PYTHONUNBUFFERED=1", "timeout", "-s", "INT", "-k", "5", f"{seconds:g}",
               "sh", "-c", f"cd {shlex.quote(where)} && {spec.command}"]  # fmt: skip
        result = container.exec(run, timeout=seconds + TRIAL_GRACE)
    finally:
        container.exec(["rm", "-rf", where], timeout=conn.endpoint.command_timeout)
    return (result.out + "\n" + result.err).splitlines()


def detect(lines: list[str]) -> Detection:
    return detect_status(lines)


def host_key(address: str, port: int, timeout: float) -> hostkey.HostKey:
    """The key the host presents, fetched with no login (transport/hostkey.py)."""
    return hostkey.fetch(address, port, timeout)


def host_key_state(known_hosts: Path, key: hostkey.HostKey) -> str:
    """`same`, `changed` or `unknown` in that known_hosts file."""
    return hostkey.known(known_hosts, key)


def trust_host_key(known_hosts: Path, key: hostkey.HostKey) -> None:
    hostkey.remember(known_hosts, key)

"""Keys protected by a passphrase: used through ssh-agent, or unlocked with a passphrase asked
on the terminal when the host says `passphrase: prompt`; never asked without a terminal (CI).

paramiko skips an encrypted key file it cannot open and tries the agent; what is here only
explains that failure (agent mode) or unlocks the key beforehand (prompt mode).
"""

from __future__ import annotations

import base64
import getpass
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.bounded import read_regular, regular_file_problem
from launcher.core.errors import AuthError, UsageError
from launcher.transport.sshlibs import paramiko

if TYPE_CHECKING:
    from launcher.transport.endpoint import Endpoint

# What paramiko's look_for_keys tries when no identity file is configured.
DEFAULT_KEYS = ("~/.ssh/id_rsa", "~/.ssh/id_ecdsa", "~/.ssh/id_ed25519")
PROMPT_TRIES = 3
OPENSSH_MAGIC = b"openssh-key-v1\x00"

# One prompt at a time (a fleet connects in parallel), one per key file and process.
_UNLOCKED: dict[Path, paramiko.PKey] = {}
_PROMPT_LOCK = threading.Lock()


@dataclass(frozen=True)
class KeyFile:
    path: Path
    key_type: str | None  # e.g. "ssh-ed25519"; None when the file does not say
    encrypted: bool
    public_blob: bytes | None  # to recognise the key in ssh-agent


def candidates(ep: Endpoint) -> list[Path]:
    """The key files paramiko offers for this endpoint."""
    paths = ep.identity_files or tuple(os.path.expanduser(p) for p in DEFAULT_KEYS)
    return [Path(p) for p in paths if Path(p).is_file()]


# A private key is a few KB (16384-bit RSA: about 12 KB); paramiko reads a key file whole.
KEY_LIMIT = 1 << 20


def check_identity_files(ep: Endpoint) -> None:
    """Refuse (exit 2) an identity file paramiko would read without end (/dev/zero, a FIFO)
    or into gigabytes of memory, before it is handed one: a wrong path in the inventory."""
    for name in ep.identity_files:
        if not os.path.lexists(name):
            continue  # ssh_config's defaults name keys that need not exist
        problem = regular_file_problem(name, KEY_LIMIT)
        if problem:
            raise UsageError(f"{ep.name}: identity_file {name}: {problem}")


def locked_keys(ep: Endpoint) -> list[Path]:
    """Candidate keys that need a passphrase and that ssh-agent does not hold."""
    keys = [k for k in map(read_key_file, candidates(ep)) if k is not None and k.encrypted]
    if not keys:
        return []
    held = agent_blobs()
    return [k.path for k in keys if k.public_blob is None or k.public_blob not in held]


def unlock(ep: Endpoint) -> paramiko.PKey | None:
    """prompt mode: the first locked key, decrypted with a passphrase asked on the terminal."""
    locked = locked_keys(ep)
    if not locked:
        return None
    path = locked[0]
    with _PROMPT_LOCK:
        if path not in _UNLOCKED:
            if not has_terminal():
                raise AuthError(
                    f"{ep.name}: {path} is protected by a passphrase, ssh-agent does not hold "
                    "it, and there is no terminal to ask on",
                    hint=f"load it into ssh-agent first (ssh-add {path}); in CI start an agent "
                    "and add the key, or use a key without a passphrase",
                )
            _UNLOCKED[path] = _ask(ep, path)
        return _UNLOCKED[path]


def locked_hint(ep: Endpoint, locked: list[Path]) -> tuple[str, str]:
    """agent mode: why authentication failed, and what to do."""
    path = locked[0]
    return (
        f"{path} is protected by a passphrase and ssh-agent does not hold it",
        f"add it to the agent (ssh-add {path}), or set `passphrase: prompt` for this host "
        "to be asked on the terminal",
    )


def has_terminal() -> bool:
    """A person can be asked: stdin is a terminal and /dev/tty opens (getpass reads it)."""
    try:
        if sys.stdin is None or not sys.stdin.isatty():
            return False
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except (OSError, ValueError):  # ValueError: stdin was closed
        return False
    return True


def _ask(ep: Endpoint, path: Path) -> paramiko.PKey:
    info = read_key_file(path)
    key_type = info.key_type if info is not None else None
    for _ in range(PROMPT_TRIES):
        passphrase = getpass.getpass(f"Passphrase for {path} ({ep.name}): ")
        key = _load(path, key_type, passphrase)
        if key is not None:
            return key
        print("Bad passphrase, try again.", file=sys.stderr)
    raise AuthError(
        f"{ep.name}: wrong passphrase for {path} ({PROMPT_TRIES} tries)",
        hint="ssh-keygen -y -f KEY checks a passphrase without connecting",
    )


def _load(path: Path, key_type: str | None, passphrase: str) -> paramiko.PKey | None:
    classes: list[type[paramiko.PKey]] = [paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key]
    if key_type == "ssh-rsa":
        classes = [paramiko.RSAKey]
    elif key_type == "ssh-ed25519":
        classes = [paramiko.Ed25519Key]
    elif key_type is not None and key_type.startswith("ecdsa-"):
        classes = [paramiko.ECDSAKey]
    for cls in classes:
        try:
            return cls.from_private_key_file(str(path), password=passphrase)
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    return None


def read_key_file(path: Path) -> KeyFile | None:
    """Whether a private key file is encrypted, and its public key, without a passphrase."""
    try:
        text = read_regular(path, KEY_LIMIT).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    if "-----BEGIN OPENSSH PRIVATE KEY-----" in text:
        return _openssh_key(path, text)
    for label, key_type in (("RSA", "ssh-rsa"), ("EC", "ecdsa-"), ("DSA", "ssh-dss")):
        if f"-----BEGIN {label} PRIVATE KEY-----" in text:
            return KeyFile(path, key_type, "ENCRYPTED" in text, _pub_file_blob(path))
    if "-----BEGIN ENCRYPTED PRIVATE KEY-----" in text:
        return KeyFile(path, None, True, _pub_file_blob(path))
    return None


def _openssh_key(path: Path, text: str) -> KeyFile | None:
    """The openssh-key-v1 format keeps the cipher name and the public key in clear."""
    body = text.split("-----BEGIN OPENSSH PRIVATE KEY-----", 1)[1]
    body = body.split("-----END OPENSSH PRIVATE KEY-----", 1)[0]
    try:
        data = base64.b64decode("".join(body.split()))
        if not data.startswith(OPENSSH_MAGIC):
            return None
        message = paramiko.Message(data[len(OPENSSH_MAGIC) :])
        cipher = message.get_text()
        message.get_text()  # kdf name
        message.get_binary()  # kdf options
        message.get_int()  # number of keys
        blob = message.get_binary()
        key_type = paramiko.Message(blob).get_text()
    except (ValueError, paramiko.SSHException, UnicodeDecodeError):
        return None
    return KeyFile(path, key_type, cipher != "none", blob)


def _pub_file_blob(path: Path) -> bytes | None:
    try:
        fields = path.with_name(path.name + ".pub").read_text(encoding="ascii").split()
        return base64.b64decode(fields[1]) if len(fields) >= 2 else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def agent_blobs() -> set[bytes]:
    """The public keys ssh-agent holds (none when there is no agent)."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return set()
    try:
        agent = paramiko.Agent()
    except (paramiko.SSHException, OSError):
        return set()
    try:
        return {key.asbytes() for key in agent.get_keys()}
    finally:
        agent.close()

"""ssh_config as OpenSSH reads it, for the settings launcher connects with.

Each alias is looked up by the OpenSSH client itself (`ssh -G`), so Include, Match, canonical
names and the system file work exactly as for `ssh ALIAS`. Where no OpenSSH client is
installed, paramiko's parser reads the same files (without Include). Nothing here connects
anywhere or imports paramiko unless that fallback is needed.

`ssh -G` prints every setting, defaults included, so the lookup appends a last `Host *` block
with markers: a User, IdentityFile or UserKnownHostsFile that comes out as a marker was set by
no block. Port 22 counts as unset.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.config.proxyjump import JUMP_RE
from launcher.core.errors import ConfigError

SYSTEM_CONFIG = Path("/etc/ssh/ssh_config")
USER_CONFIG = "~/.ssh/config"
UNSET = "/nonexistent/launcher-unset"  # marker value: no block set this
SINGLE_KEYS = ("hostname", "user", "port", "userknownhostsfile", "proxyjump", "proxycommand")
LOOKUP_TIMEOUT = 10.0  # a `Match exec` in ssh_config runs a command: bound it
PIPE_KEPT = 4096  # bytes a pipe takes in one write, with no reader, on every POSIX system


@dataclass(frozen=True)
class HostOptions:
    """What ssh_config sets for one alias (None or empty where no block sets it)."""

    alias: str
    hostname: str | None = None
    user: str | None = None
    port: int | None = None
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None
    proxy_jump: str | None = None
    proxy_command: str | None = None

    @property
    def unrouted(self) -> bool:
        """Neither ProxyJump nor ProxyCommand is set."""
        return not (self.proxy_jump or self.proxy_command)

    def before(self, later: HostOptions) -> HostOptions:
        """These options, with what they leave unset taken from `later` (first one wins)."""
        return HostOptions(
            alias=self.alias,
            hostname=self.hostname or later.hostname,
            user=self.user or later.user,
            port=self.port or later.port,
            identity_files=self.identity_files or later.identity_files,
            known_hosts=self.known_hosts or later.known_hosts,
            # OpenSSH: whichever of ProxyJump and ProxyCommand comes first disables the other.
            proxy_jump=later.proxy_jump if self.unrouted else self.proxy_jump,
            proxy_command=later.proxy_command if self.unrouted else self.proxy_command,
        )


@dataclass(frozen=True)
class Hop:
    """One ProxyJump hop, `[user@]host[:port]` (None where the hop does not say)."""

    user: str | None
    host: str
    port: int | None


def split_jump(value: str) -> list[Hop]:
    """ProxyJump hops, nearest first (`none`: no hops). ConfigError on a malformed hop."""
    if value.strip() == "none":
        return []
    hops = []
    for text in value.split(","):
        match = JUMP_RE.match(text.strip().removeprefix("ssh://"))
        port = match["port"] if match else None
        if match is None or (port is not None and not _is_port(port)):
            raise ConfigError([f"ssh_config: ProxyJump hop {text!r} is not [user@]host[:port]"])
        host = match["host"].removeprefix("[").removesuffix("]")
        hops.append(Hop(match["user"], host, int(port) if port else None))
    return hops


def expand_proxy_command(template: str, *, host: str, port: int, user: str, alias: str) -> str:
    """A ProxyCommand with OpenSSH's tokens replaced: %h %p %r %n and %%."""
    values = {"h": host, "p": str(port), "r": user, "n": alias, "%": "%"}
    out = []
    rest = template
    while "%" in rest:
        before, _, rest = rest.partition("%")
        token, rest = rest[:1], rest[1:]
        if token not in values:
            raise ConfigError(
                [f"ssh_config: ProxyCommand {template!r}: unknown token %{token}"],
                hint="a ProxyCommand may use %h, %p, %r, %n and %%",
            )
        out += [before, values[token]]
    return "".join([*out, rest])


def lookup(
    aliases: Sequence[str],
    config: Path | None = None,
    *,
    meanwhile: Callable[[], object] | None = None,
) -> list[HostOptions]:
    """The options for each alias, in order. `config` replaces the user's and the system's
    files (as `ssh -F`); by default ~/.ssh/config, then /etc/ssh/ssh_config. `meanwhile` runs
    while OpenSSH answers (each `ssh -G` is a process of its own)."""
    files = _files(config)
    client = shutil.which("ssh") if files else None  # no file: nothing to ask OpenSSH about
    if client is None:
        if meanwhile is not None:
            meanwhile()
        return [_paramiko(alias, files) for alias in aliases]
    return _ask_openssh(client, list(aliases), files, meanwhile)


def _files(config: Path | None) -> tuple[Path, ...]:
    if config is not None:
        return (config,) if config.is_file() else ()
    user = Path(os.path.expanduser(USER_CONFIG))
    found = []
    if user.is_file():
        _check_owner(user)
        found.append(user)
    if SYSTEM_CONFIG.is_file():
        found.append(SYSTEM_CONFIG)
    return tuple(found)


def _check_owner(path: Path) -> None:
    """OpenSSH's rule for ~/.ssh/config: owned by the user (or root), writable by nobody else
    (another user could otherwise plant a ProxyCommand)."""
    info = path.stat()
    if info.st_uid not in (0, os.getuid()) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(
            [f"{path}: bad owner or permissions (ssh refuses it too)"],
            hint=f"chmod go-w {path}",
        )


def _wrapper(files: tuple[Path, ...]) -> str:
    """The config `ssh -G` reads from stdin: the files in order, then the markers."""
    lines = []
    for path in files:
        text = str(path)
        if '"' in text:
            raise ConfigError([f"{text}: an ssh_config path must not contain '\"'"])
        lines.append(f'Include "{text}"')
    lines += ["Host *", "  User launcher-unset", f"  IdentityFile {UNSET}"]
    lines += [f"  UserKnownHostsFile {UNSET}", ""]
    return "\n".join(lines)


def _ask_openssh(
    client: str,
    aliases: list[str],
    files: tuple[Path, ...],
    meanwhile: Callable[[], object] | None,
) -> list[HostOptions]:
    """`ssh -G` for each alias, all at once (each costs a few milliseconds of its own), each
    with its configuration already in its stdin, so that they answer while `meanwhile` runs."""
    wrapper = _wrapper(files).encode()
    procs = []
    for alias in aliases:
        config = _filled_pipe(wrapper)
        try:
            procs.append(
                subprocess.Popen(
                    [client, "-G", "-T", "-F", "/dev/stdin", "--", alias],
                    stdin=config,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        finally:
            os.close(config)
    try:
        if meanwhile is not None:
            meanwhile()
        return [_answer(alias, proc) for alias, proc in zip(aliases, procs, strict=True)]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _filled_pipe(data: bytes) -> int:
    """The read end of a pipe that holds `data` and then its end of file. `data` (a few Include
    lines) is far smaller than a pipe's buffer, so writing it waits for no reader."""
    if len(data) > PIPE_KEPT:
        raise ConfigError([f"ssh_config: {len(data)} bytes of Include lines is too long"])
    read, write = os.pipe()
    try:
        os.write(write, data)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    return read


def _answer(alias: str, proc: subprocess.Popen[str]) -> HostOptions:
    try:
        out, err = proc.communicate(timeout=LOOKUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ConfigError(
            [f"ssh_config: `ssh -G {alias}` did not answer within {LOOKUP_TIMEOUT:g} s"],
            hint="a `Match exec` command in ssh_config may hang",
        ) from None
    if proc.returncode != 0:
        lines = [line for line in err.splitlines() if _worth_saying(line)]
        raise ConfigError(
            [f"ssh_config ({alias}): {line}" for line in lines[:5]]
            or [f"ssh_config ({alias}): ssh -G failed with exit code {proc.returncode}"],
            hint="`ssh -G ALIAS` shows how OpenSSH reads it",
        )
    return _parse_dump(alias, out)


def _parse_dump(alias: str, text: str) -> HostOptions:
    single: dict[str, str] = {}
    identities: list[str] = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "identityfile":
            identities.append(value)
        elif key in SINGLE_KEYS:
            single[key] = value
    hostname = single.get("hostname")
    port = int(single.get("port", "22"))
    known = single.get("userknownhostsfile", UNSET).split()
    return HostOptions(
        alias=alias,
        hostname=hostname if hostname and hostname.lower() != alias.lower() else None,
        user=_unless(single.get("user"), "launcher-unset"),
        port=port if port != 22 else None,
        identity_files=tuple(path for path in identities if path != UNSET),
        known_hosts=_unless(known[0] if known else None, UNSET),
        proxy_jump=_unless(single.get("proxyjump"), "none"),
        proxy_command=_unless(single.get("proxycommand"), "none"),
    )


def _paramiko(alias: str, files: tuple[Path, ...]) -> HostOptions:
    """Without an OpenSSH client: paramiko's parser (no Include; tokens its own way)."""
    from launcher.transport.sshlibs import paramiko

    parsed = paramiko.SSHConfig()
    for path in files:
        try:
            with path.open(encoding="utf-8") as handle:
                parsed.parse(handle)
        except (OSError, UnicodeDecodeError, paramiko.SSHException) as exc:
            raise ConfigError([f"{path}: {exc}"]) from None
    found = parsed.lookup(alias)
    hostname = found.get("hostname")
    raw_port = str(found.get("port", "22"))
    if not _is_port(raw_port):
        where = ", ".join(str(path) for path in files)
        raise ConfigError([f"{where}: Port {raw_port!r} (for {alias}) is not a port number"])
    port = int(raw_port)
    known = str(found.get("userknownhostsfile", "")).split()
    return HostOptions(
        alias=alias,
        hostname=hostname if hostname and hostname.lower() != alias.lower() else None,
        user=found.get("user"),
        port=port if port != 22 else None,
        identity_files=tuple(found.get("identityfile", [])),
        known_hosts=known[0] if known else None,
        proxy_jump=_unless(found.get("proxyjump"), "none"),
        proxy_command=_unless(found.get("proxycommand"), "none"),
    )


def _worth_saying(line: str) -> bool:
    """ssh's own error lines, without the ones about the wrapper or the closing summary."""
    return bool(line.strip()) and "/dev/stdin" not in line and "terminating," not in line


def _unless(value: str | None, marker: str) -> str | None:
    return None if value is None or value == marker else value


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 1 <= int(text) <= 65535

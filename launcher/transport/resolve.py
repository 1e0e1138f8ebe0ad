"""Where to connect for an inventory host: the inventory, then ssh_config (through OpenSSH
itself), merged into an `Endpoint`, jump chains and ProxyCommand resolved."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.core.errors import ConfigError
from launcher.transport import sshconfig
from launcher.transport.endpoint import Endpoint

if TYPE_CHECKING:
    from launcher.config.models import HostSpec

MAX_HOPS = 8  # jump hosts in one chain, the jump hosts' own included


def known_hosts_override() -> str | None:
    """`--known-hosts FILE` / LAUNCHER_KNOWN_HOSTS: one known_hosts file for every host (a CI
    job writes its secret there instead of rewriting the inventory)."""
    return os.environ.get("LAUNCHER_KNOWN_HOSTS") or None


def identity_override() -> str | None:
    """`--identity FILE` / LAUNCHER_IDENTITY: one private key for every host (a CI job names
    the key it was given instead of rewriting the inventory)."""
    return os.environ.get("LAUNCHER_IDENTITY") or None


def identities(name: str, host: HostSpec, from_ssh_config: tuple[str, ...]) -> tuple[str, ...]:
    """The key files to offer: `--identity`, else the inventory's, else ssh_config's. An
    inventory's identity_file that does not exist here (a CI runner that has the key in
    ssh-agent only) is dropped with a warning when the agent holds a key; without one, the
    missing file stays and the connection says so (exit 3)."""
    override = identity_override()
    if override:
        return (override,)
    if not host.identity_file:
        return tuple(os.path.expanduser(p) for p in from_ssh_config)
    path = os.path.expanduser(host.identity_file)
    if not os.path.lexists(path) and agent_holds_a_key():
        _warn_once(
            f"warning: {name}: identity_file {path} does not exist; "
            "using the keys ssh-agent holds (--identity FILE names another)"
        )
        return ()
    return (path,)


def agent_holds_a_key() -> bool:
    """Whether ssh-agent (SSH_AUTH_SOCK) answers with at least one key."""
    if not os.environ.get("SSH_AUTH_SOCK"):
        return False
    from launcher.transport.sshkeys import agent_blobs

    return bool(agent_blobs())


_WARNED: set[str] = set()


def _warn_once(text: str) -> None:
    # Endpoints are resolved once per host and per hop; a command says it once.
    if text not in _WARNED:
        _WARNED.add(text)
        print(text, file=sys.stderr)


def resolve_endpoint(name: str, host: HostSpec, ssh_config: Path | None = None) -> Endpoint:
    """Where to connect for inventory host `name`: inventory values win; ssh_config fills what
    the inventory left unset, from the blocks for the host's name, then for its address.

    The address is what is connected to (an ssh_config HostName for the address is followed);
    jump hosts are resolved too (`via`). `ssh_config` replaces the user's and system's files.
    Raises ConfigError (exit 2) for ssh_config that OpenSSH rejects or a jump chain that loops.
    """
    aliases = [name, host.address] if name != host.address else [host.address]
    explicit = host.model_fields_set
    if "control_persist" in explicit:
        control_persist = host.control_persist
    else:
        from launcher.transport.persistidle import default_idle

        control_persist = default_idle(host.passphrase)
    # While OpenSSH answers, import the SSH libraries a connection will need; not for a host
    # whose connection may be persisted, where the command usually needs none.
    meanwhile = None if control_persist else _load_ssh_stack
    found = sshconfig.lookup(aliases, ssh_config, meanwhile=meanwhile)
    by_address = found[-1]
    options = found[0].before(by_address)
    known_hosts = known_hosts_override() or host.known_hosts or options.known_hosts
    known_hosts = known_hosts or "~/.ssh/known_hosts"
    endpoint = Endpoint(
        name=name,
        hostname=by_address.hostname or host.address,
        port=host.port if "port" in explicit else options.port or host.port,
        user=host.user if "user" in explicit else options.user or host.user,
        identity_files=identities(name, host, options.identity_files),
        known_hosts=Path(os.path.expanduser(known_hosts)),
        accept_new=host.host_key_policy == "accept-new",
        jump=None,
        connect_timeout=host.connect_timeout,
        command_timeout=host.command_timeout,
        passphrase=host.passphrase,
        max_sessions=host.max_sessions,
        control_persist=control_persist,
    )
    if "jump" in explicit:
        jump, proxy = (None if host.jump == "none" else host.jump), None
    else:
        jump, proxy = options.proxy_jump, options.proxy_command
    return _with_route(endpoint, jump, proxy, host, ssh_config, alias=name)


def _load_ssh_stack() -> None:
    """Import paramiko and Fabric (a connection follows) while OpenSSH reads ssh_config."""
    import launcher.transport.sshopen  # noqa: F401


def _with_route(
    endpoint: Endpoint,
    jump: str | None,
    proxy: str | None,
    host: HostSpec,
    ssh_config: Path | None,
    *,
    alias: str,
    seen: tuple[tuple[str, int], ...] = (),
) -> Endpoint:
    """The endpoint with its ProxyCommand expanded, or its jump chain resolved (`via`)."""
    seen = (*seen, (endpoint.hostname, endpoint.port))
    if proxy:
        command = sshconfig.expand_proxy_command(
            proxy, host=endpoint.hostname, port=endpoint.port, user=endpoint.user, alias=alias
        )
        return replace(endpoint, proxy_command=command)
    hops = sshconfig.split_jump(jump) if jump else []
    if not hops:
        return endpoint
    if len(seen) + len(hops) > MAX_HOPS:
        raise ConfigError([f"{endpoint.name}: more than {MAX_HOPS} jump hosts in a row"])
    found = sshconfig.lookup([hop.host for hop in hops], ssh_config)
    via: Endpoint | None = None
    for index, (hop, options) in enumerate(zip(hops, found, strict=True)):
        label = "jump" if len(hops) == 1 else f"jump {index + 1}"
        known_hosts = known_hosts_override() or host.known_hosts or options.known_hosts
        known_hosts = known_hosts or "~/.ssh/known_hosts"
        hop_endpoint = replace(
            endpoint,
            name=f"{endpoint.name} ({label})",
            hostname=options.hostname or hop.host,
            port=hop.port or options.port or 22,
            user=hop.user or options.user or endpoint.user,
            identity_files=identities(endpoint.name, host, options.identity_files),
            known_hosts=Path(os.path.expanduser(known_hosts)),
            jump=None,
            proxy_command=None,
            via=via,
        )
        key = (hop_endpoint.hostname, hop_endpoint.port)
        if key in seen:
            raise ConfigError(
                [f"{endpoint.name}: the jump chain {jump!r} loops through {key[0]}:{key[1]}"],
                hint="check ProxyJump in the inventory and ssh_config (ssh -G ALIAS)",
            )
        if index == 0:
            # As OpenSSH: the nearest hop is reached the way its own ssh_config says.
            hop_endpoint = _with_route(
                hop_endpoint,
                options.proxy_jump,
                options.proxy_command,
                host,
                ssh_config,
                alias=hop.host,
                seen=seen,
            )
        node: Endpoint | None = hop_endpoint
        while node is not None:  # the hop, and the hosts it is reached through
            seen = (*seen, (node.hostname, node.port))
            node = node.via
        via = hop_endpoint
    return replace(endpoint, jump=jump, via=via)

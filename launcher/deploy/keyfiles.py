"""`inventory check`'s look at the files a connection will read: identity files and known_hosts.

A wrong `identity_file` otherwise passes every configuration check and only shows at connect
time; here it is a problem with the inventory's file and line.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from launcher.config.models import HostSpec, Inventory
from launcher.transport.resolve import agent_holds_a_key, identity_override, known_hosts_override


def hosts_of(inventory: Inventory) -> Iterator[tuple[tuple[str, ...], HostSpec]]:
    """Every host spec with its key path in the inventory (cluster nodes included)."""
    for name, host in inventory.spec.hosts.items():
        yield ("hosts", name), host
    for cluster, spec in inventory.spec.clusters.items():
        for node, host in spec.nodes.items():
            yield ("clusters", cluster, "nodes", node), host


def key_file_findings(inventory: Inventory) -> tuple[list[str], list[str]]:
    """(problems, warnings): a named identity file that is missing or unreadable is a problem
    (every connect would fail); loose permissions and a missing known_hosts are warnings."""
    problems: list[str] = []
    warnings: list[str] = []
    document = inventory.document
    override = identity_override()
    if override:  # --identity: the one key file every host uses, checked once
        problem, warning = _identity_finding(Path(override))
        problems += [f"--identity: {problem}"] if problem else []
        warnings += [f"--identity: {warning}"] if warning else []
    for where, host in hosts_of(inventory):
        if host.identity_file and not override:
            loc = (*where, "identity_file")
            problem, warning = _identity_finding(Path(os.path.expanduser(host.identity_file)))
            if problem and problem.startswith(NOT_FOUND) and agent_holds_a_key():
                problem, warning = None, f"{problem}: the keys ssh-agent holds are used instead"
            if problem:
                problems.append(document.problem(loc, problem))
            if warning:
                warnings.append(document.problem(loc, warning))
        known_hosts = known_hosts_override() or host.known_hosts
        if known_hosts:
            loc = (*where, "known_hosts")
            path = Path(os.path.expanduser(known_hosts))
            if not path.is_file():
                what = (
                    "will be created on the first connect (accept-new)"
                    if host.host_key_policy == "accept-new"
                    else "every host key will be unknown (host_key_policy: strict)"
                )
                warnings.append(document.problem(loc, f"{path} does not exist: {what}"))
            elif not os.access(path, os.R_OK):
                problems.append(document.problem(loc, f"cannot read {path}"))
    return problems, warnings


NOT_FOUND = "identity file not found"


def _identity_finding(path: Path) -> tuple[str | None, str | None]:
    try:
        info = path.stat()
    except FileNotFoundError:
        return f"{NOT_FOUND}: {path}", None
    except OSError as exc:
        return f"cannot read identity file {path}: {exc.strerror or exc}", None
    if not stat.S_ISREG(info.st_mode):
        return f"identity file is not a regular file: {path}", None
    try:
        path.open("rb").close()
    except OSError as exc:
        return f"cannot read identity file {path}: {exc.strerror or exc}", None
    if info.st_mode & 0o077:
        # OpenSSH refuses such a key ("UNPROTECTED PRIVATE KEY FILE", sshkey.c
        # sshkey_perm_ok); paramiko uses it, but `launcher attach` runs ssh.
        mode = stat.S_IMODE(info.st_mode)
        return (
            None,
            f"{path} is mode {mode:04o}; ssh refuses keys others can read: chmod 600 {path}",
        )
    return None, None

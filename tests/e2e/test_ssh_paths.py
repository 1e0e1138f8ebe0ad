"""The ways people reach their Proxmox host, end to end through Fabric against real sshd's: an
ssh_config alias from an Included file, two jump hosts, a ProxyCommand, a key with a passphrase
(through ssh-agent, or asked on a terminal), and host keys refused on every hop.

The jump hosts are more sshd's of the sandbox on 127.0.0.2 and 127.0.0.3: OpenSSH refuses a
jump chain that loops through one address. HOME is a fresh directory per test (conftest), so
~/.ssh/config is the test's own.
"""

from __future__ import annotations

import hashlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

import launcher.transport.sshopen  # imported up front: the timings are about connecting
from launcher.config.models import HostSpec
from launcher.core.errors import HostKeyError
from launcher.sandbox import Sandbox, SandboxInfo
from launcher.sandbox.manager import JumpHost
from launcher.transport.connection import Connection
from launcher.transport.resolve import resolve_endpoint
from launcher.transport.runner import STATS
from tests.e2e.project import DEMO_TRAINER, accepted_logins

pytestmark = pytest.mark.e2e

VMID = 200
LAUNCHER = [sys.executable, "-m", "launcher"]
PASSPHRASE = "correct horse"


@pytest.fixture(scope="module")
def jumps(sandbox: tuple[Sandbox, SandboxInfo]) -> Iterator[tuple[JumpHost, JumpHost]]:
    sb, _ = sandbox
    first, second = sb.start_jump_host("127.0.0.2"), sb.start_jump_host("127.0.0.3")
    yield first, second
    for jump in (first, second):
        sb.stop_jump_host(jump.address)


@pytest.fixture
def home() -> Path:
    return Path(os.environ["HOME"])


def known_hosts(path: Path, info: SandboxInfo, *hops: JumpHost) -> Path:
    lines = [info.known_hosts.read_text().strip(), *(hop.known_hosts_line for hop in hops)]
    path.write_text("\n".join(lines) + "\n")
    return path


def ssh_config(home: Path, text: str) -> Path:
    path = home / ".ssh" / "config"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(text)
    return path


def inventory(root: Path, name: str, host: dict[str, Any]) -> Path:
    """One host `name`, one target `sandbox` on CT 200 with the demo playbook."""
    root.mkdir(parents=True, exist_ok=True)
    book = {
        "name": "paths",
        "session": "paths",
        "workdir": "/root/paths",
        "script": {"source": str(DEMO_TRAINER), "dest": "train_demo.py"},
        "command": "python3 train_demo.py",
        "gpus": 0,
    }
    (root / "paths.yaml").write_text(yaml.safe_dump(book))
    data = {
        "hosts": {name: host},
        "targets": {"sandbox": {"host": name, "vmid": VMID, "playbook": "paths.yaml"}},
        "default_target": "sandbox",
    }
    path = root / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def launcher(
    inv: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LAUNCHER, "-i", str(inv), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def accepted(hop: JumpHost, sandbox: Sandbox, at_least: int = 0) -> int:
    """How many logins the jump host's sshd has accepted so far."""
    return accepted_logins(sandbox.state_dir / "jumps" / hop.address / "sshd.log", at_least)


# --------------------------------------------------------------------------- ssh_config aliases


@pytest.mark.parametrize("alias_is", ["host name", "address"])
def test_an_alias_from_an_included_file(
    sandbox: tuple[Sandbox, SandboxInfo], home: Path, tmp_path: Path, alias_is: str
) -> None:
    _, info = sandbox
    included = tmp_path / "ssh_config.d" / "pve.conf"
    included.parent.mkdir()
    # Include with a glob, Match: what paramiko's own parser ignores and OpenSSH does not.
    included.write_text(
        "Host pve-alias\n"
        "  HostName 127.0.0.1\n"
        f"  IdentityFile {info.identity_file}\n"
        f"  UserKnownHostsFile {info.known_hosts}\n"
        "Match originalhost pve-alias\n"
        f"  Port {info.port}\n"
    )
    ssh_config(home, f"Include {included.parent}/*.conf\n")
    if alias_is == "host name":
        inv = inventory(tmp_path / "p", "pve-alias", {"address": "127.0.0.1"})
    else:
        inv = inventory(tmp_path / "p", "prod", {"address": "pve-alias"})
    result = launcher(inv, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reachable    root@127.0.0.1:{info.port}" in result.stderr


def test_inventory_values_win_over_ssh_config(
    sandbox: tuple[Sandbox, SandboxInfo], home: Path, tmp_path: Path
) -> None:
    _, info = sandbox
    ssh_config(home, "Host pve-alias\n  HostName 127.0.0.1\n  Port 1\n  User nobody\n")
    host = {
        "address": "127.0.0.1",
        "port": info.port,
        "user": "root",
        "identity_file": str(info.identity_file),
        "known_hosts": str(info.known_hosts),
    }
    result = launcher(inventory(tmp_path / "p", "pve-alias", host), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr


def test_broken_ssh_config_is_exit_2_before_connecting(home: Path, tmp_path: Path) -> None:
    ssh_config(home, "Host pve\n  NoSuchOption yes\n")
    result = launcher(inventory(tmp_path / "p", "pve", {"address": "127.0.0.1"}), "status")
    assert result.returncode == 2, result.stderr
    assert f"{home}/.ssh/config: line 2: Bad configuration option" in result.stderr
    assert "terminating" not in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------- jump hosts


def two_hop_config(
    home: Path, info: SandboxInfo, jumps: tuple[JumpHost, JumpHost], kh: Path
) -> None:
    first, second = jumps
    ssh_config(
        home,
        f"Host hop1\n  HostName {first.address}\n  Port {first.port}\n"
        f"Host hop2\n  HostName {second.address}\n  Port {second.port}\n"
        f"Host *\n  IdentityFile {info.identity_file}\n  UserKnownHostsFile {kh}\n",
    )


def test_two_jump_hosts_by_alias(
    sandbox: tuple[Sandbox, SandboxInfo],
    jumps: tuple[JumpHost, JumpHost],
    home: Path,
    tmp_path: Path,
) -> None:
    sb, info = sandbox
    kh = known_hosts(tmp_path / "known_hosts", info, *jumps)
    two_hop_config(home, info, jumps, kh)
    before = [accepted(hop, sb) for hop in jumps]
    inv = inventory(
        tmp_path / "p", "pve", {"address": "127.0.0.1", "port": info.port, "jump": "hop1,hop2"}
    )
    result = launcher(inv, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    after = [accepted(hop, sb, at_least=n + 1) for hop, n in zip(jumps, before, strict=True)]
    assert after == [n + 1 for n in before], "one login per hop"


def test_commands_and_streams_through_two_hops(
    sandbox: tuple[Sandbox, SandboxInfo],
    jumps: tuple[JumpHost, JumpHost],
    home: Path,
    tmp_path: Path,
) -> None:
    """launcher's channel code (stdin in one write, the streaming read loop) and Fabric's own
    API share one connection through the chain."""
    _, info = sandbox
    kh = known_hosts(tmp_path / "known_hosts", info, *jumps)
    two_hop_config(home, info, jumps, kh)
    spec = HostSpec(address="127.0.0.1", port=info.port, jump="hop1,hop2", connect_timeout=5)
    payload = os.urandom(2_000_000)
    before = STATS.connects
    with Connection(resolve_endpoint("pve", spec)) as conn:
        result = conn.run("sha256sum", stdin=payload, timeout=60)
        assert result.out.split()[0] == hashlib.sha256(payload).hexdigest()
        chunks: list[bytes] = []
        code = conn.stream("for i in 1 2 3; do echo line$i; sleep 0.2; done", chunks.append)
        assert code == 0 and b"".join(chunks) == b"line1\nline2\nline3\n"
        assert conn.fabric.run("echo fabric", hide=True, in_stream=False).stdout == "fabric\n"
        assert repr(conn.fabric.gateway.gateway).startswith("<Connection host=127.0.0.2")
    assert STATS.connects - before == 3, "the two hops and the host, once each"


def test_unknown_and_changed_keys_are_refused_on_every_hop(
    sandbox: tuple[Sandbox, SandboxInfo],
    jumps: tuple[JumpHost, JumpHost],
    home: Path,
    tmp_path: Path,
) -> None:
    _, info = sandbox
    first, second = jumps
    kh = known_hosts(tmp_path / "known_hosts", info, first)  # the second hop is unknown
    two_hop_config(home, info, jumps, kh)
    spec = HostSpec(address="127.0.0.1", port=info.port, jump="hop1,hop2", connect_timeout=5)
    with Connection(resolve_endpoint("pve", spec)) as conn, pytest.raises(HostKeyError) as error:
        conn.run("true")
    assert error.value.message.startswith("pve (jump 2): host key of")
    assert "is not in" in error.value.message
    assert kh.read_text().count("\n") == 2, "nothing was added"

    # A changed key on the first hop is refused even with accept-new.
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    forged = " ".join(other.with_suffix(".pub").read_text().split()[:2])
    kh.write_text(f"{info.known_hosts.read_text()}[{first.address}]:{first.port} {forged}\n")
    changed = HostSpec(
        address="127.0.0.1",
        port=info.port,
        jump="hop1,hop2",
        connect_timeout=5,
        host_key_policy="accept-new",
    )
    with Connection(resolve_endpoint("pve", changed)) as conn, pytest.raises(HostKeyError) as error:
        conn.run("true")
    assert error.value.message.startswith("pve (jump 1)") and "CHANGED" in error.value.message

    # accept-new records what it has never seen, on every hop; strict passes afterwards.
    kh.write_text(info.known_hosts.read_text())
    with Connection(resolve_endpoint("pve", changed)) as conn:
        assert conn.run("true").ok
    recorded = kh.read_text()
    assert f"[{first.address}]:{first.port} ssh-ed25519" in recorded
    assert f"[{second.address}]:{second.port} ssh-ed25519" in recorded
    with Connection(resolve_endpoint("pve", spec)) as conn:
        assert conn.run("true").ok


# --------------------------------------------------------------------------- ProxyCommand


def proxy_command(info: SandboxInfo, hop: JumpHost, kh: Path, port: int | None = None) -> str:
    return (
        f"ssh -F none -i {info.identity_file} -o UserKnownHostsFile={kh} "
        f"-o StrictHostKeyChecking=yes -o BatchMode=yes -p {port or hop.port} -W %h:%p "
        f"root@{hop.address}"
    )


def test_proxy_command(
    sandbox: tuple[Sandbox, SandboxInfo],
    jumps: tuple[JumpHost, JumpHost],
    home: Path,
    tmp_path: Path,
) -> None:
    sb, info = sandbox
    kh = known_hosts(tmp_path / "known_hosts", info, jumps[0])
    ssh_config(
        home,
        f"Host via-proxy\n  HostName 127.0.0.1\n  Port {info.port}\n"
        f"  IdentityFile {info.identity_file}\n  UserKnownHostsFile {kh}\n"
        f"  ProxyCommand {proxy_command(info, jumps[0], kh)}\n"
        f"Host broken-proxy\n  HostName 127.0.0.1\n  Port {info.port}\n"
        f"  ProxyCommand {proxy_command(info, jumps[0], kh, port=1)}\n",
    )
    before = accepted(jumps[0], sb)
    result = launcher(inventory(tmp_path / "p", "via-proxy", {"address": "via-proxy"}), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    assert accepted(jumps[0], sb, at_least=before + 1) == before + 1

    started = time.monotonic()
    broken = launcher(inventory(tmp_path / "b", "x", {"address": "broken-proxy"}), "status")
    assert broken.returncode == 3, broken.stderr
    assert "the ProxyCommand ended (exit code 255: ssh: connect to host" in broken.stderr
    assert "Traceback" not in broken.stderr
    assert time.monotonic() - started < 10, "a proxy that fails fails at once"


# --------------------------------------------------------------------------- passphrases


@pytest.fixture
def locked_key(sandbox: tuple[Sandbox, SandboxInfo], tmp_path: Path) -> Iterator[Path]:
    """A key with a passphrase that the sandbox's sshd lets in (for this test only)."""
    sb, _ = sandbox
    key = tmp_path / "locked_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", PASSPHRASE, "-f", str(key)], check=True
    )
    authorized = sb.state_dir / "authorized_keys"
    before = authorized.read_text()
    authorized.write_text(before + key.with_suffix(".pub").read_text())
    yield key
    authorized.write_text(before)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A running ssh-agent (its environment), stopped afterwards."""
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not sock.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield {"SSH_AUTH_SOCK": str(sock)}
    proc.send_signal(signal.SIGTERM)
    proc.wait(10)


def locked_inventory(tmp_path: Path, info: SandboxInfo, key: Path, **extra: str) -> Path:
    host = {
        "address": info.address,
        "port": info.port,
        "identity_file": str(key),
        "known_hosts": str(info.known_hosts),
        **extra,
    }
    return inventory(tmp_path / "p", "pve", host)


def test_a_key_with_a_passphrase_through_ssh_agent(
    sandbox: tuple[Sandbox, SandboxInfo], locked_key: Path, agent: dict[str, str], tmp_path: Path
) -> None:
    _, info = sandbox
    inv = locked_inventory(tmp_path, info, locked_key)

    without = launcher(inv, "doctor")
    assert without.returncode == 3, without.stdout + without.stderr
    assert f"{locked_key} is protected by a passphrase and ssh-agent does not hold it" in (
        without.stdout + without.stderr
    )
    assert f"ssh-add {locked_key}" in without.stdout + without.stderr

    askpass = tmp_path / "askpass"
    askpass.write_text(f"#!/bin/sh\necho '{PASSPHRASE}'\n")
    askpass.chmod(0o700)
    subprocess.run(
        ["ssh-add", str(locked_key)],
        env={**os.environ, **agent, "SSH_ASKPASS": str(askpass), "SSH_ASKPASS_REQUIRE": "force"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=True,
    )
    with_agent = launcher(inv, "doctor", env=agent)
    assert with_agent.returncode == 0, with_agent.stdout + with_agent.stderr


def test_passphrase_prompt_on_a_terminal_never_without_one(
    sandbox: tuple[Sandbox, SandboxInfo], locked_key: Path, tmp_path: Path
) -> None:
    _, info = sandbox
    inv = locked_inventory(tmp_path, info, locked_key, passphrase="prompt")

    # CI: no terminal, so no prompt and no waiting: exit 3 with what to do instead.
    in_ci = launcher(inv, "status", env={"CI": "true"})
    assert in_ci.returncode == 3, in_ci.stderr
    assert "no terminal to ask on" in in_ci.stderr and f"ssh-add {locked_key}" in in_ci.stderr

    # On a terminal: asked, a wrong answer asked again, then connected.
    code, screen = run_on_terminal(
        [*LAUNCHER, "-i", str(inv), "doctor"], answers=["wrong", PASSPHRASE]
    )
    assert screen.count(f"Passphrase for {locked_key} (pve): ") == 2, screen
    assert "Bad passphrase, try again." in screen
    assert PASSPHRASE not in screen, "the terminal does not echo it"
    assert code == 0, screen


def run_on_terminal(
    argv: list[str],
    answers: list[str],
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Run argv with a pseudo-terminal as its controlling terminal (in `env`, else this
    process's environment); type each answer when a passphrase prompt appears. Returns the exit
    code and everything the terminal showed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: becomes the program, or ends
        try:
            os.execvpe(argv[0], argv, os.environ if env is None else env)
        finally:
            os._exit(127)
    screen = b""
    pending = list(answers)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            screen += data
            if pending and screen.count(b"Passphrase for") > len(answers) - len(pending):
                os.write(fd, pending.pop(0).encode() + b"\n")
    finally:
        os.close(fd)
    return _wait(pid, deadline), screen.decode("utf-8", "replace")


def _wait(pid: int, deadline: float) -> int:
    """The child's exit code; killed if it is still running a little after the deadline."""
    while time.monotonic() < deadline + 5:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

"""The sandbox's OpenSSH server: keys, config, start, find, stop.

The server listens on 127.0.0.1 only, accepts one ed25519 client key for root, and puts
<state_dir>/bin (the pct stand-in) first on the PATH of its sessions.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from launcher.core.errors import RemoteError

SSHD = "/usr/sbin/sshd"
ADDRESS = "127.0.0.1"
SESSION_PATH_TAIL = "/usr/sbin:/usr/bin:/sbin:/bin"


class SshdError(RemoteError):
    """The sandbox's sshd could not be set up or started."""


def _quote(value: str) -> str:
    if any(c in value for c in '"\n'):
        raise SshdError(f"unsupported character in sandbox path: {value!r}")
    return f'"{value}"'


def ensure_key(path: Path, comment: str) -> bool:
    """Create an ed25519 key pair at path unless a complete one is there; True if created."""
    pub = path.with_name(path.name + ".pub")
    if path.is_file() and pub.is_file():
        return False
    for p in (path, pub):
        p.unlink(missing_ok=True)
    result = subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        capture_output=True,
        check=False,
    )
    if result.returncode != 0:
        raise SshdError(f"ssh-keygen failed: {result.stderr.decode(errors='replace').strip()}")
    path.chmod(0o600)
    return True


# What a root SSH session on a Proxmox node has besides sshd's own SSH_* (sshd runs with
# UsePAM yes there): pam_systemd's XDG_* (logind's session and runtime directory), pam_env's
# LANG from /etc/default/locale (or the client's, through Debian's `AcceptEnv LANG LC_*`),
# pam_motd's MOTD_SHOWN. Not the sandbox containers' locale (C.UTF-8), so a leak shows.
NODE_SESSION_ENV = (
    "LANG=en_US.UTF-8",
    "XDG_SESSION_ID=7",
    "XDG_RUNTIME_DIR=/run/user/0",
    "XDG_SESSION_TYPE=tty",
    "XDG_SESSION_CLASS=user",
    "MOTD_SHOWN=pam",
)


def config_text(
    state_dir: Path,
    port: int,
    *,
    address: str = ADDRESS,
    authorized_keys: Path | None = None,
    home: Path | None = None,
) -> str:
    """sshd_config for the sandbox's sshd (or another one on `address`, e.g. a jump host that
    lets in the keys of `authorized_keys`). `home`: the sessions' HOME (see stock_home)."""
    session_path = f"{state_dir / 'bin'}:{SESSION_PATH_TAIL}"
    session_env = [_quote("PATH=" + session_path), *map(_quote, NODE_SESSION_ENV)]
    if home is not None:
        session_env.append(_quote(f"HOME={home}"))
    keys = authorized_keys or state_dir / "authorized_keys"
    lines = [
        f"Port {port}",
        f"ListenAddress {address}",
        f"HostKey {_quote(str(state_dir / 'ssh_host_ed25519_key'))}",
        f"AuthorizedKeysFile {_quote(str(keys))}",
        f"PidFile {_quote(str(state_dir / 'sshd.pid'))}",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "UsePAM no",
        "StrictModes no",
        "PrintMotd no",
        "LogLevel VERBOSE",  # each session logged too ("Starting session: ..."), for the tests
        "Subsystem sftp internal-sftp",
        "MaxSessions 10",  # OpenSSH's default, which launcher must live with
        "MaxStartups 200:30:400",
        # one SetEnv line: sshd keeps only the first (sshd_config(5))
        f"SetEnv {' '.join(session_env)}",
        "",
    ]
    return "\n".join(lines)


# Debian's stock dotfiles for root, as base-files installs them (its postinst copies these to
# /root/.bashrc and /root/.profile); a Proxmox VE host is Debian with root's left as they are.
STOCK_DOTFILES = Path("/usr/share/base-files")


def stock_home(home: Path) -> Path:
    """A HOME for the sessions holding a Proxmox host's root dotfiles instead of this machine's
    root's: bash sources ~/.bashrc for every command sshd runs (Debian builds it with
    SSH_SOURCE_BASHRC), and a developer machine's may run `pyenv init`, which costs each SSH
    command about 0.1 s and puts pyenv's shims before the host's python3."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in ("bashrc", "profile"):
        stock = STOCK_DOTFILES / f"dot.{name}"
        text = stock.read_bytes() if stock.is_file() else b"# Debian's stock (all comments)\n"
        (home / f".{name}").write_bytes(text)
    return home


def config_port(config: Path) -> int | None:
    try:
        for line in config.read_text().splitlines():
            key, _, value = line.strip().partition(" ")
            if key == "Port" and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ADDRESS, port))
        except OSError:
            return False
    return True


def free_port(address: str = ADDRESS) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        port: int = s.getsockname()[1]
        return port


def accepting(port: int, timeout: float = 0.5, *, address: str = ADDRESS) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def find_listeners(config: Path) -> list[int]:
    """PIDs of sshd listeners started with `-f config` (sshd rewrites its title, so match text)."""
    needle = f"-f {config}"
    found = []
    for pid in _pids():
        cmd = _cmdline(pid)
        if "sshd" in cmd and (cmd.endswith(needle) or f"{needle} " in cmd):
            found.append(pid)
    return found


def descendants(roots: list[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid in _pids():
        ppid = _ppid(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def kill(pids: list[int], timeout: float = 3.0) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.02)
        pids = [p for p in pids if alive(p)]
        if not pids:
            return
    raise SshdError(f"could not stop sandbox sshd process(es): {pids}")


def stop_all(config: Path) -> None:
    """Stop every sshd started from this config, and its sessions."""
    listeners = find_listeners(config)
    if listeners:
        kill([*descendants(listeners), *listeners])


def start(
    state_dir: Path, config: Path, port: int, timeout: float = 10.0, *, address: str = ADDRESS
) -> int:
    """Start sshd and wait until it answers on the port; return its PID."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    check = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, check=False)
    if check.returncode != 0:
        text = check.stderr.decode(errors="replace").strip()
        raise SshdError(f"sshd rejected {config}: {text}")
    log = state_dir / "sshd.log"
    pid_file = state_dir / "sshd.pid"
    pid_file.unlink(missing_ok=True)
    result = subprocess.run(
        [SSHD, "-f", str(config), "-E", str(log)], capture_output=True, check=False
    )
    if result.returncode != 0:
        raise SshdError(f"sshd failed to start: {result.stderr.decode(errors='replace').strip()}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = read_pid(pid_file)
        if pid is not None and alive(pid) and accepting(port, address=address):
            return pid
        time.sleep(0.02)
    tail = log.read_text(errors="replace").splitlines()[-5:] if log.is_file() else []
    raise SshdError(
        f"sshd did not come up on {address}:{port}" + "".join(f"\n  {line}" for line in tail)
    )


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None

"""Sandbox: a local staging "Proxmox host" (sshd on 127.0.0.1 + LXC containers + pct stand-in).

sb = Sandbox(Path("/tmp/sb"))
info = sb.up([200, 201], gpus=8)   # idempotent
sb.up([202], distro="bullseye")    # a container from Debian 11's root filesystem
# ssh -i info.identity_file -p info.port root@127.0.0.1 pct exec 200 -- ...
sb.down()                          # removes everything it made, nothing else
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.core.errors import UsageError
from launcher.sandbox import containers, network, ownership, rootfs, sshd
from launcher.sandbox import gpus as sandbox_gpus

DEFAULT_STATE_DIR = Path("/var/lib/launcher-sandbox")
STATE_DIR_ENV = "LAUNCHER_SANDBOX_DIR"
HERE = Path(__file__).resolve().parent
REQUIRED_TOOLS = ("lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "ssh-keygen", sshd.SSHD)


@dataclass(frozen=True)
class SandboxInfo:
    """Where the sandbox is and how to reach it."""

    state_dir: Path
    address: str
    port: int
    user: str
    identity_file: Path
    known_hosts: Path
    inventory_path: Path
    vmids: tuple[int, ...]


@dataclass(frozen=True)
class SandboxStatus:
    """What is running: sshd (pid, port, answering?) and each container's LXC state."""

    state_dir: Path
    exists: bool
    sshd_pid: int | None
    port: int | None
    sshd_alive: bool
    containers: Mapping[int, str] = field(default_factory=dict)  # vmid -> "running"/"stopped"

    @property
    def healthy(self) -> bool:
        return self.sshd_alive and all(s == "running" for s in self.containers.values())


@dataclass(frozen=True)
class JumpHost:
    """An extra sshd of the sandbox (see Sandbox.start_jump_host)."""

    address: str
    port: int
    known_hosts_line: str  # "[address]:port type key", for a known_hosts file


class Sandbox:
    """A staging Proxmox host on this machine; see the module docstring."""

    def __init__(self, state_dir: Path | None = None, *, stock_home: bool = False) -> None:
        """stock_home: the sshd's sessions get a HOME of their own with a Proxmox host's root
        dotfiles (sshd.stock_home), not this machine's root's (the default, which the
        benchmarks measure against)."""
        if state_dir is None:
            env = os.environ.get(STATE_DIR_ENV)
            state_dir = Path(env) if env else DEFAULT_STATE_DIR
        self.state_dir = Path(state_dir).absolute()
        self.session_home = self.state_dir / "home" if stock_home else None
        self.lxcpath = self.state_dir / "lxc"
        self.sshd_config = self.state_dir / "sshd_config"
        self.identity_file = self.state_dir / "id_ed25519"
        self.known_hosts = self.state_dir / "known_hosts"
        self.inventory_path = self.state_dir / "inventory.yaml"

    # -- lifecycle ------------------------------------------------------------------------

    def up(
        self,
        vmids: Sequence[int] = (200,),
        *,
        gpus: int | Sequence[int] = 8,
        distro: str | None = None,
    ) -> SandboxInfo:
        """Create or repair the sandbox; keeps running containers, adds missing ones. New ones
        are made from `distro`'s root filesystem (None: `host`, which bind-mounts this machine's
        /usr); an existing one keeps its own, and naming another distro for it is refused.
        `gpus`: how many (the host's 0..N-1) or which of the host's GPUs, by minor number (a
        slice, as a CI staging CT is given 6 and 7); a running container with another slice
        is restarted."""
        self._preflight(vmids, gpus if isinstance(gpus, int) else len(gpus))
        minors = sandbox_gpus.slice_of(gpus)
        if distro is not None and distro not in rootfs.CHOICES:
            raise UsageError(f"unknown --distro {distro!r}: use one of {', '.join(rootfs.CHOICES)}")
        kinds = {v: self._made_from(v) or distro or rootfs.HOST for v in vmids}
        if distro is not None:
            self._check_distro(vmids, distro)
        # Claimed before anything is made: down removes only what a marked sandbox made.
        ownership.claim(self.state_dir, list(vmids))
        self.lxcpath.mkdir(exist_ok=True)
        self._install_pct()

        wanted = sorted(set(vmids))
        current = containers.states(self.lxcpath, wanted)
        for vmid in wanted:
            ct_dir = self.lxcpath / str(vmid)
            ct_dir.mkdir(exist_ok=True)
            kind = kinds[vmid]
            (ct_dir / "distro").write_text(kind + "\n")
            config_file = ct_dir / "config"
            if current[vmid] == "RUNNING" and sandbox_gpus.outdated(config_file, minors):
                containers.stop(self.lxcpath, [vmid])  # mounts change only with a restart
                current[vmid] = "STOPPED"
            containers.build_rootfs(ct_dir / "rootfs", vmid, minors, kind)
            if current[vmid] != "RUNNING" or not config_file.is_file():
                config = containers.config_text(self.lxcpath, vmid, kind)
                config += sandbox_gpus.config_lines(self.state_dir, minors)
                config_file.write_text(config)
        odd = [v for v in wanted if current[v] not in ("RUNNING", "STOPPED")]
        if odd:  # half started or stopping after a killed run: reset them
            containers.stop(self.lxcpath, odd)
        containers.start(self.lxcpath, [v for v in wanted if current[v] != "RUNNING"])

        port = self._ensure_sshd()
        all_vmids = self._vmids()
        self._write_inventory(port, all_vmids, len(minors))
        return self._info(port, all_vmids)

    def down(self) -> list[Path]:
        """Remove every container, process and file the sandbox made, and nothing else: a
        directory without the sandbox's marker is refused (UsageError) before anything is
        touched. Returns what is left in the state dir (files a user put there)."""
        if not self.state_dir.exists():
            return []
        _require_root()
        marker = ownership.required(self.state_dir)
        # A sandbox cluster's other nodes and the jump hosts each run an sshd of their own.
        for node_config in self.state_dir.glob("nodes/*/sshd_config"):
            sshd.stop_all(node_config)
        for jump_config in self.state_dir.glob("jumps/*/sshd_config"):
            sshd.stop_all(jump_config)
        sshd.stop_all(self.sshd_config)
        vmids = [v for v in containers.defined(self.lxcpath) if v in marker.vmids]
        if vmids:
            containers.stop(self.lxcpath, vmids)
        network.remove(self.state_dir)
        mounted = self._mounts_inside()
        if mounted:
            raise containers.ContainerError(
                "refusing to delete the sandbox: still mounted: " + ", ".join(mounted)
            )
        return ownership.remove_made(self.state_dir, marker)

    def status(self) -> SandboxStatus:
        """sshd pid/port (answering or not) and the state of each container."""
        if not self.state_dir.exists():
            return SandboxStatus(self.state_dir, False, None, None, False, {})
        pid = sshd.read_pid(self.state_dir / "sshd.pid")
        port = sshd.config_port(self.sshd_config)
        ok = pid is not None and sshd.alive(pid) and port is not None and sshd.accepting(port)
        states = containers.states(self.lxcpath, containers.defined(self.lxcpath))
        return SandboxStatus(
            self.state_dir,
            True,
            pid,
            port,
            ok,
            {v: _state_word(s) for v, s in states.items()},
        )

    def info(self) -> SandboxInfo:
        """Connection details of a sandbox that is up (without changing anything)."""
        port = sshd.config_port(self.sshd_config)
        if port is None:
            raise UsageError(f"no sandbox in {self.state_dir}", hint="run: launcher sandbox up")
        return self._info(port, self._vmids())

    # -- helpers for tests and benchmarks -----------------------------------------------

    def set_faults(
        self,
        *,
        pct_latency: float = 0.0,
        partial_push: bool | Sequence[int] = False,
        push_error: str = "",
        keep_env: bool = True,
    ) -> None:
        """Faults the pct stand-in injects from its next call on. partial_push: every push cut
        in half, or only those into these VMIDs. push_error: every push's write fails with this
        strerror (say "No space left on device"), and pct exits 0 as a real node's does.
        keep_env: what `pct exec` does without --keep-env (today's default keeps the caller's
        environment; Proxmox announced clearing it as the future default)."""
        if not isinstance(partial_push, bool):
            partial_push = list(partial_push)
        faults = {
            "pct_latency": pct_latency,
            "partial_push": partial_push,
            "push_error": push_error,
            "keep_env": keep_env,
        }
        tmp = self.state_dir / "faults.json.tmp"
        tmp.write_text(json.dumps(faults) + "\n")
        tmp.replace(self.state_dir / "faults.json")

    def stall_pct(self, seconds: float, *, skip: int = 0, calls: int = 1) -> None:
        """After `skip` more pct calls, the next `calls` wait `seconds` on the host before
        doing anything (pct.py, `stall`); 0 seconds ends the stall."""
        faults = self._faults()
        faults.pop("pct_stall", None)
        if seconds > 0:
            first = self.pct_calls() + skip
            faults["pct_stall"] = {"seconds": seconds, "from": first, "count": calls}
        self._write_faults(faults)

    def freeze(self, vmid: int, lock: str | None = "backup") -> None:
        """Freeze the CT as a vzdump backup in suspend mode does: the lock first, then the
        cgroup (pve-container src/PVE/VZDump/LXC.pm: `lock_vm`, then `suspend_vm` →
        `PVE::LXC::freeze`); calls into it then hang until `thaw`."""
        if lock is not None:
            self._pct("set", str(vmid), "--lock", lock)
        containers.freeze(self.lxcpath, vmid)

    def thaw(self, vmid: int, *, unlock: bool = True) -> None:
        """Thaw the CT and clear its lock, as the backup's end does (`resume_vm`, then
        `unlock_vm`)."""
        containers.thaw(self.lxcpath, vmid)
        if unlock:
            self._pct("unlock", str(vmid))

    def _pct(self, *args: str) -> None:
        """The sandbox's own pct, here (a lock is a config change, as `pct set` makes it)."""
        subprocess.run(
            [str(self.state_dir / "bin" / "pct"), *args], check=True, capture_output=True
        )

    def _faults(self) -> dict[str, object]:
        try:
            found = json.loads((self.state_dir / "faults.json").read_text())
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def _write_faults(self, faults: Mapping[str, object]) -> None:
        tmp = self.state_dir / "faults.json.tmp"
        tmp.write_text(json.dumps(dict(faults)) + "\n")
        tmp.replace(self.state_dir / "faults.json")

    def stop_container(self, vmid: int) -> None:
        containers.stop(self.lxcpath, [vmid])

    def start_container(self, vmid: int) -> None:
        if containers.states(self.lxcpath, [vmid])[vmid] != "RUNNING":
            containers.start(self.lxcpath, [vmid])

    def start_jump_host(self, address: str) -> JumpHost:
        """Another sshd on a loopback `address` (127.0.0.2, ...) with its own host key, letting
        in the sandbox's client key and forwarding TCP: a jump host. Idempotent; down() stops
        it. (OpenSSH refuses a jump chain that loops through one address: hence one each.)"""
        home = self.state_dir / "jumps" / address
        home.mkdir(parents=True, exist_ok=True)
        sshd.ensure_key(home / "ssh_host_ed25519_key", f"launcher-sandbox jump {address}")
        config = home / "sshd_config"
        port = sshd.config_port(config)
        running = sshd.find_listeners(config)
        if not (running and port is not None and sshd.accepting(port, address=address)):
            sshd.stop_all(config)
            port = sshd.free_port(address)
            keys = self.state_dir / "authorized_keys"
            config.write_text(sshd.config_text(home, port, address=address, authorized_keys=keys))
            sshd.start(home, config, port, address=address)
        key_type, key = (home / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        return JumpHost(address, port, f"[{address}]:{port} {key_type} {key}")

    def stop_jump_host(self, address: str) -> None:
        sshd.stop_all(self.state_dir / "jumps" / address / "sshd_config")

    def distro(self, vmid: int) -> str:
        """What the container was made from (`host` or a Debian release)."""
        return self._made_from(vmid) or rootfs.HOST

    def _made_from(self, vmid: int) -> str | None:
        """The recorded kind of an existing container; None for a new one."""
        ct_dir = self.lxcpath / str(vmid)
        try:
            return (ct_dir / "distro").read_text().strip() or rootfs.HOST
        except FileNotFoundError:  # made before containers recorded it, or not made yet
            return rootfs.HOST if (ct_dir / "rootfs").exists() else None

    def connect(self, vmids: Sequence[int], hosts: str = "static") -> dict[int, str]:
        """Put these containers on one network (launcher.sandbox.network), with a job over
        them in the inventory; their addresses. The nodes of a job stand for machines of their
        own, so each container gets GPUs of its own (a pool named after it). `hosts`: each
        /etc/hosts as Proxmox writes it for a static address (`static`) or DHCP (`dhcp`), or
        with every container's name (`all`)."""
        for vmid in vmids:
            self.set_gpu_pool(vmid, f"node{vmid}")
        addresses = network.enable(self.state_dir, self.lxcpath, vmids, hosts=hosts)
        network.add_job(self.inventory_path, vmids)
        return addresses

    def container_root(self, vmid: int) -> Path:
        """The container's own files on the host: the whole tree of a `host` container; of a
        Debian one, the overlay's upper layer (what the container wrote or changed)."""
        return self.lxcpath / str(vmid) / "rootfs"

    def ct_exec(
        self, vmid: int, argv: Sequence[str], input: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run argv in the container directly with lxc-attach (no ssh, no pct, no shell)."""
        return containers.attach(self.lxcpath, vmid, argv, input=input)

    def set_gpu_pool(self, vmid: int, pool: str) -> None:
        """Containers with the same pool share their GPUs (the default: all share `host`)."""
        sandbox_gpus.set_pool(self.container_root(vmid), pool)

    def set_gpu_slice(self, vmid: int, gpus: int | Sequence[int]) -> None:
        """Give the container these of the host's GPUs (by minor number; an int N: 0..N-1), as
        Proxmox gives a CT device entries: its device files change, so it restarts (what runs
        in it ends) unless it has this slice already."""
        minors = sandbox_gpus.slice_of(gpus)
        config_file = self.lxcpath / str(vmid) / "config"
        text = config_file.read_text()
        sandbox_gpus.set_minors(self.container_root(vmid), minors)
        if sandbox_gpus.config_minors(text) == minors and "dev/nvidia-uvm" in text:
            return
        running = containers.states(self.lxcpath, [vmid])[vmid] == "RUNNING"
        if running:
            containers.stop(self.lxcpath, [vmid])
        config_file.write_text(sandbox_gpus.with_slice(text, self.state_dir, minors))
        if running:
            containers.start(self.lxcpath, [vmid])

    def set_gpu_fault(self, vmid: int, *faults: str) -> None:
        """Make the container's driver misbehave (launcher.sandbox.gpus.FAULTS: `mismatch`,
        `lost 1`, `na`, `delay 20`, `hang`, `no-apps`); none: healthy again."""
        sandbox_gpus.set_fault(self.container_root(vmid), faults)

    def set_gpu_pid_mode(self, vmid: int, mode: str) -> None:
        """What PIDs the container's nvidia-smi reports: `host` (default) or `bare-metal`."""
        sandbox_gpus.set_pid_mode(self.container_root(vmid), mode)

    def pct_calls(self) -> int:
        try:
            with (self.state_dir / "pct-calls.log").open("rb") as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    # -- internals ----------------------------------------------------------------------

    def _preflight(self, vmids: Sequence[int], gpus: int) -> None:
        _require_root()
        missing = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
        if missing:
            raise UsageError(
                "launcher sandbox needs " + ", ".join(missing),
                hint="apt-get install lxc openssh-server openssh-client tmux",
            )
        if not vmids:
            raise UsageError("launcher sandbox needs at least one VMID")
        bad = [v for v in vmids if not 100 <= v <= 999_999_999]
        if bad:
            raise UsageError(f"invalid VMID(s) {bad}: Proxmox VMIDs are 100..999999999")
        if gpus < 0:
            raise UsageError(f"--gpus must be 0 or more, not {gpus}")

    def _check_distro(self, vmids: Sequence[int], distro: str) -> None:
        """A container keeps the root filesystem it was made from (as a Proxmox CT does)."""
        made = {v: self._made_from(v) for v in vmids}
        other = {v: d for v, d in made.items() if d is not None and d != distro}
        if other:
            names = ", ".join(f"{v} ({d})" for v, d in sorted(other.items()))
            raise UsageError(
                f"container(s) {names} exist with another root filesystem than {distro}",
                hint="use other VMIDs for them, or launcher sandbox down first",
            )

    def _install_pct(self) -> None:
        bin_dir = self.state_dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        data = (HERE / "pct.py").read_bytes()
        target = bin_dir / "pct"
        if not (target.is_file() and target.read_bytes() == data):
            tmp = bin_dir / "pct.tmp"
            tmp.write_bytes(data)
            tmp.chmod(0o755)
            tmp.replace(target)

    def _vmids(self) -> tuple[int, ...]:
        """Containers that are fully defined (have a config), sorted."""
        defined = containers.defined(self.lxcpath)
        return tuple(v for v in defined if (self.lxcpath / str(v) / "config").is_file())

    def _ensure_sshd(self) -> int:
        """Start sshd unless the one from this state dir already runs with the same setup."""
        changed = sshd.ensure_key(self.state_dir / "ssh_host_ed25519_key", "launcher-sandbox host")
        changed |= sshd.ensure_key(self.identity_file, "launcher-sandbox client")
        pub = self.identity_file.with_name(self.identity_file.name + ".pub").read_text()
        (self.state_dir / "authorized_keys").write_text(pub)

        if self.session_home is not None:
            sshd.stock_home(self.session_home)
        running = sshd.find_listeners(self.sshd_config)
        port = sshd.config_port(self.sshd_config)
        if running and port is not None and not changed:
            desired = sshd.config_text(self.state_dir, port, home=self.session_home)
            if self.sshd_config.read_text() == desired and sshd.accepting(port):
                pid_file = self.state_dir / "sshd.pid"
                if sshd.read_pid(pid_file) not in running:
                    pid_file.write_text(f"{running[0]}\n")
                self._write_known_hosts(port)
                return port
        sshd.stop_all(self.sshd_config)
        if port is None or not sshd.port_free(port):
            port = sshd.free_port()
        self.sshd_config.write_text(sshd.config_text(self.state_dir, port, home=self.session_home))
        sshd.start(self.state_dir, self.sshd_config, port)
        self._write_known_hosts(port)
        return port

    def _write_known_hosts(self, port: int) -> None:
        key_type, key = (self.state_dir / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[{sshd.ADDRESS}]:{port} {key_type} {key}\n")

    def _write_inventory(self, port: int, vmids: tuple[int, ...], gpus: int) -> None:
        host = {
            "address": sshd.ADDRESS,
            "port": port,
            "user": "root",
            "identity_file": str(self.identity_file),
            "known_hosts": str(self.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 5,
        }

        def target(vmid: int) -> dict[str, object]:
            return {"host": "sandbox", "vmid": vmid, "playbook": "playbooks/demo.yaml"}

        targets = {"sandbox": target(vmids[0])} if vmids else {}
        targets.update({f"sandbox-{vmid}": target(vmid) for vmid in vmids})
        inventory = {"hosts": {"sandbox": host}, "targets": targets, "default_target": "sandbox"}
        playbook = {
            "name": "demo",
            "session": "demo",
            "workdir": "/root/demo",
            "script": {"source": str(HERE / "demo_trainer.py"), "dest": "train_demo.py"},
            "checkpoints": "checkpoints",
            "command": "python3 train_demo.py",
            "env": {},
            "gpus": gpus,
            "verify": {"wait": 20, "interval": 2},
        }
        (self.state_dir / "playbooks").mkdir(exist_ok=True)
        _dump(self.state_dir / "playbooks" / "demo.yaml", playbook)
        _dump(self.inventory_path, inventory)

    def _info(self, port: int, vmids: tuple[int, ...]) -> SandboxInfo:
        return SandboxInfo(
            state_dir=self.state_dir,
            address=sshd.ADDRESS,
            port=port,
            user="root",
            identity_file=self.identity_file,
            known_hosts=self.known_hosts,
            inventory_path=self.inventory_path,
            vmids=vmids,
        )

    def _mounts_inside(self) -> list[str]:
        prefix = str(self.state_dir) + "/"
        found = []
        with open("/proc/self/mountinfo") as f:
            for line in f:
                mount_point = line.split()[4].replace("\\040", " ")
                if mount_point == str(self.state_dir) or mount_point.startswith(prefix):
                    found.append(mount_point)
        return found


def _state_word(state: str) -> str:
    """running | frozen (a backup's freeze: still running for Proxmox) | stopped."""
    return {"RUNNING": "running", "FROZEN": "frozen", "FREEZING": "frozen"}.get(state, "stopped")


def _require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError("launcher sandbox needs root (run with sudo)")


def _dump(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=False))
    tmp.replace(path)

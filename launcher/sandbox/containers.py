"""The sandbox's LXC containers: rootfs, config, start/stop, attach.

Each container has its own rootfs directory under <lxcpath>/<vmid>/rootfs, of one of two kinds:

- `host` (fast): a small tree; the host's /usr is bind-mounted read-only into it, /bin, /lib and
  /lib64 are symlinks into /usr, and /sbin is a real directory holding the container's init
  (ctinit, which also brings the loopback interface up) and the nvidia-smi stand-in.
- a Debian release (`bookworm`, ...): a root filesystem debootstrap built (see rootfs.py) with
  the container's directory over it (an overlay): its own /etc, /usr, python3 and tmux, booting
  its own systemd, as a CT made from a Proxmox template. The rootfs directory holds only what
  the container changed.

Both get what Proxmox sets up in a CT: the hostname in /etc/hostname and /etc/hosts, and the
loopback interface up.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from launcher.core.errors import RemoteError
from launcher.sandbox import gpus as sandbox_gpus
from launcher.sandbox import rootfs

CONTAINER_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
GPU_DIR = "var/lib/sandbox-gpu"
HERE = Path(__file__).resolve().parent

ETC_FILES: Mapping[str, str] = {
    "passwd": (
        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
}


class ContainerError(RemoteError):
    """An LXC operation in the sandbox failed."""


def hostname(vmid: int) -> str:
    return f"sandbox-{vmid}"


def mount_entries(distro: str) -> list[str]:
    """`lxc.mount.entry` values (host path, path in the rootfs, type, options)."""
    if distro != rootfs.HOST:
        return []
    # /etc/alternatives belongs to the host's /usr: its links pick the libraries there (libblas,
    # liblapack: python3-torch fails to import without them)
    return ["/usr usr none bind,ro 0 0", "/etc/alternatives etc/alternatives none bind,ro 0 0"]


def rootfs_path(ct_dir: Path, distro: str) -> str:
    """`lxc.rootfs.path`: the container's own tree, or the overlay over a cached one (LXC puts
    the overlay's work directory next to the upper one, in ct_dir)."""
    if distro == rootfs.HOST:
        return f"dir:{ct_dir / 'rootfs'}"
    return f"overlay:{rootfs.lower_dir(distro)}:{ct_dir / 'rootfs'}"


def config_text(lxcpath: Path, vmid: int, distro: str = rootfs.HOST) -> str:
    ct_dir = lxcpath / str(vmid)
    return "\n".join(
        [
            f"lxc.uts.name = {hostname(vmid)}",
            f"lxc.rootfs.path = {rootfs_path(ct_dir, distro)}",
            *(f"lxc.mount.entry = {entry}" for entry in mount_entries(distro)),
            "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
            "lxc.autodev = 1",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.pty.max = 64",
            "lxc.tty.max = 0",
            *init_config(distro),
            f"lxc.log.file = {ct_dir / 'lxc.log'}",
            "lxc.log.level = WARN",
            "",
        ]
    )


def init_config(distro: str) -> list[str]:
    """A distribution's container boots its own init, systemd, as a Proxmox CT made from a
    template does (lxc.signal.halt: systemd halts on SIGRTMIN+3, not LXC's default SIGPWR;
    systemd brings `lo` up itself). A `host` container, whose /usr is this machine's, runs
    ctinit: the host's systemd is not the container's to boot."""
    if distro == rootfs.HOST:
        return ["lxc.init.cmd = /sbin/ctinit"]
    return ["lxc.init.cmd = /sbin/init", "lxc.signal.halt = SIGRTMIN+3"]


def _write(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write only when the content differs (so a running container's files stay put)."""
    data = text.encode() if isinstance(text, str) else text
    if not (path.is_file() and not path.is_symlink() and path.read_bytes() == data):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    path.chmod(mode)


def hosts_text(vmid: int) -> str:
    """/etc/hosts as Proxmox writes it for a CT without a static address (PVE::LXC::Setup::Base,
    update_etc_hosts): the hostname on 127.0.1.1, so the name resolves without a network."""
    name = hostname(vmid)
    return f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n::1\tlocalhost ip6-localhost ip6-loopback\n"


def build_rootfs(root: Path, vmid: int, minors: Sequence[int], distro: str = rootfs.HOST) -> None:
    """Create or repair the rootfs of one container; safe to run on a running container."""
    if distro == rootfs.HOST:
        _host_tree(root)
        etc, sbin = root / "etc", root / "sbin"
    else:
        # the upper layer: directories are made where the cached tree has them (its /sbin is
        # usr/sbin), with the modes it has (an upper directory's attributes win in overlayfs)
        lower = rootfs.cached(distro)
        etc, sbin = (root / rootfs.real_path(lower, name) for name in ("etc", "sbin"))
        for d in (root, etc, sbin, root / GPU_DIR):
            d.mkdir(mode=0o755, parents=True, exist_ok=True)
        root.chmod(0o755)
    _write(etc / "hostname", hostname(vmid) + "\n")
    _write(etc / "hosts", hosts_text(vmid))
    _write(sbin / "ctinit", (HERE / "ctinit.py").read_bytes(), 0o755)
    _write(sbin / "nvidia-smi", (HERE / "nvidia_smi.py").read_bytes(), 0o755)
    _write(sbin / "nvtop", (HERE / "nvtop.py").read_bytes(), 0o755)
    set_gpus(root, minors)


def _host_tree(root: Path) -> None:
    """The small tree of a `host` container: its /usr is the host's, bind-mounted."""
    for name, mode in [
        ("etc", 0o755),
        ("etc/alternatives", 0o755),
        ("sbin", 0o755),
        ("root", 0o700),
        ("tmp", 0o1777),
        ("run", 0o755),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("var/lib", 0o755),
        (GPU_DIR, 0o755),
        ("usr", 0o755),
        ("dev", 0o755),
        ("proc", 0o555),
        ("sys", 0o555),
        ("home", 0o755),
    ]:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)
    for link, target in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")]:
        p = root / link
        if p.is_symlink() and str(p.readlink()) == target:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        p.symlink_to(target)
    etc = root / "etc"
    for name, text in ETC_FILES.items():
        _write(etc / name, text)
    ld_cache = Path("/etc/ld.so.cache")
    if ld_cache.is_file():
        _write(etc / "ld.so.cache", ld_cache.read_bytes())


def set_gpus(root: Path, minors: Sequence[int]) -> None:
    """The container's GPU files (see launcher/sandbox/gpus.py)."""
    sandbox_gpus.prepare_rootfs(root, minors)


def defined(lxcpath: Path) -> list[int]:
    """VMIDs with a directory under lxcpath (complete or not)."""
    if not lxcpath.is_dir():
        return []
    return sorted(int(p.name) for p in lxcpath.iterdir() if p.name.isdigit() and p.is_dir())


def states(lxcpath: Path, vmids: Iterable[int]) -> dict[int, str]:
    """LXC state per VMID: RUNNING, STOPPED, STARTING, ... (queried in parallel)."""
    procs = {
        vmid: subprocess.Popen(
            ["lxc-info", "-n", str(vmid), "-P", str(lxcpath), "-s", "-H"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        for vmid in vmids
    }
    result = {}
    for vmid, proc in procs.items():
        out, _ = proc.communicate()
        result[vmid] = out.decode().strip() or "STOPPED"
    return result


def _run_all(commands: Sequence[list[str]]) -> list[subprocess.CompletedProcess[bytes]]:
    procs = [
        (cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        for cmd in commands
    ]
    results = []
    for cmd, proc in procs:
        out, _ = proc.communicate()
        results.append(subprocess.CompletedProcess(cmd, proc.returncode, out, b""))
    return results


def start(lxcpath: Path, vmids: Sequence[int], timeout: float = 15.0) -> None:
    """Start stopped containers (in parallel) and wait until they run."""
    if not vmids:
        return
    results = _run_all([["lxc-start", "-n", str(v), "-P", str(lxcpath), "-d"] for v in vmids])
    deadline = time.monotonic() + timeout
    pending = list(vmids)
    while pending:
        now = states(lxcpath, pending)
        pending = [v for v in pending if now[v] != "RUNNING"]
        if not pending:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    details = []
    for vmid, res in zip(vmids, results, strict=True):
        if vmid in pending:
            log = lxcpath / str(vmid) / "lxc.log"
            tail = log.read_text(errors="replace").splitlines()[-5:] if log.is_file() else []
            text = res.stdout.decode(errors="replace").strip()
            details.append(f"container {vmid}: {text or 'did not reach RUNNING'}")
            details.extend(f"  {line}" for line in tail)
    raise ContainerError("could not start sandbox container(s):\n" + "\n".join(details))


def freeze(lxcpath: Path, vmid: int) -> None:
    """Freeze the container's processes (LXC's freezer: the cgroup v2 `cgroup.freeze` or the
    v1 freezer, as `PVE::LXC::freeze` has it done)."""
    result = subprocess.run(
        ["lxc-freeze", "-n", str(vmid), "-P", str(lxcpath)], capture_output=True, check=False
    )
    if result.returncode != 0:
        raise ContainerError(f"could not freeze container {vmid}: {result.stderr.decode()}")


def thaw(lxcpath: Path, vmid: int) -> None:
    subprocess.run(
        ["lxc-unfreeze", "-n", str(vmid), "-P", str(lxcpath)], capture_output=True, check=False
    )


def stop(lxcpath: Path, vmids: Sequence[int]) -> None:
    """Kill containers (in parallel); stopping a stopped one is not an error. A frozen one is
    thawed first: its processes could not die of the kill while frozen."""
    _run_all([["lxc-unfreeze", "-n", str(v), "-P", str(lxcpath)] for v in vmids])
    _run_all([["lxc-stop", "-n", str(v), "-P", str(lxcpath), "-k"] for v in vmids])
    still = [v for v, s in states(lxcpath, vmids).items() if s != "STOPPED"]
    if still:
        raise ContainerError(f"could not stop sandbox container(s): {still}")


def attach(
    lxcpath: Path, vmid: int, argv: Sequence[str], input: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run argv (no shell) in the container with a clean environment."""
    cmd = ["lxc-attach", "-n", str(vmid), "-P", str(lxcpath), "--clear-env"]
    for var in (f"PATH={CONTAINER_PATH}", "HOME=/root", "LANG=C.UTF-8", "TERM=xterm-256color"):
        cmd += ["-v", var]
    return subprocess.run(
        [*cmd, "--", *argv],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )

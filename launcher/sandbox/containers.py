"""The sandbox's LXC containers: rootfs, config, start/stop, attach.

Each container has its own small rootfs directory under <lxcpath>/<vmid>/rootfs; the host's
/usr is bind-mounted read-only into it, /bin, /lib and /lib64 are symlinks into /usr, and /sbin
is a real directory holding the container's init (ctinit) and the nvidia-smi stand-in.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from launcher.errors import RemoteError

CONTAINER_PATH = "/sbin:/bin:/usr/sbin:/usr/bin"
GPU_DIR = "var/lib/sandbox-gpu"
GPU_COUNT_FILE = "etc/sandbox-gpus"
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


def config_text(lxcpath: Path, vmid: int) -> str:
    ct_dir = lxcpath / str(vmid)
    return "\n".join(
        [
            f"lxc.uts.name = {hostname(vmid)}",
            f"lxc.rootfs.path = dir:{ct_dir / 'rootfs'}",
            "lxc.mount.entry = /usr usr none bind,ro 0 0",
            "lxc.mount.auto = proc:mixed sys:ro cgroup:mixed",
            "lxc.autodev = 1",
            "lxc.net.0.type = empty",
            "lxc.apparmor.profile = unconfined",
            "lxc.pty.max = 64",
            "lxc.tty.max = 0",
            "lxc.init.cmd = /sbin/ctinit",
            f"lxc.log.file = {ct_dir / 'lxc.log'}",
            "lxc.log.level = WARN",
            "",
        ]
    )


def _write(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    """Write only when the content differs (so a running container's files stay put)."""
    data = text.encode() if isinstance(text, str) else text
    if not (path.is_file() and not path.is_symlink() and path.read_bytes() == data):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    path.chmod(mode)


def build_rootfs(root: Path, vmid: int, gpus: int) -> None:
    """Create or repair the rootfs of one container; safe to run on a running container."""
    for name, mode in [
        ("etc", 0o755),
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
    _write(etc / "hostname", hostname(vmid) + "\n")
    _write(etc / "hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname(vmid)}\n::1\tlocalhost\n")
    ld_cache = Path("/etc/ld.so.cache")
    if ld_cache.is_file():
        _write(etc / "ld.so.cache", ld_cache.read_bytes())
    _mirror_alternatives(etc / "alternatives")
    _write(root / "sbin" / "ctinit", (HERE / "ctinit.py").read_bytes(), 0o755)
    _write(root / "sbin" / "nvidia-smi", (HERE / "nvidia_smi.py").read_bytes(), 0o755)
    set_gpus(root, gpus)


def _mirror_alternatives(here: Path) -> None:
    """The host's /etc/alternatives links: the packages in the bind-mounted /usr reach some of
    their files through them (python3-torch's libblas.so.3 and liblapack.so.3), as they do in a
    CT that has those packages installed."""
    host = Path("/etc/alternatives")
    if not host.is_dir():
        return
    here.mkdir(exist_ok=True)
    for link in host.iterdir():
        if not link.is_symlink():
            continue
        target = link.readlink()
        mine = here / link.name
        if mine.is_symlink() and mine.readlink() == target:
            continue
        if mine.is_symlink() or mine.exists():
            mine.unlink()
        mine.symlink_to(target)


def set_gpus(root: Path, gpus: int) -> None:
    """N fake GPU device files; a process holds a GPU while it has that file open."""
    gpu_dir = root / GPU_DIR
    wanted = {f"nvidia{i}" for i in range(gpus)}
    for name in wanted:
        f = gpu_dir / name
        if not f.exists():
            f.touch()
        f.chmod(0o666)
    for f in gpu_dir.iterdir():
        if f.name not in wanted:
            f.unlink()
    _write(root / GPU_COUNT_FILE, f"{gpus}\n")


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


def stop(lxcpath: Path, vmids: Sequence[int]) -> None:
    """Kill containers (in parallel); stopping a stopped one is not an error."""
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

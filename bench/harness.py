"""The benchmark's own sandbox and project: inventories, playbooks, and timed commands.

Everything lives under one temp dir (sandbox state, project files, a HOME for the commands)
and is removed by `BenchEnv.close()`, whatever happened before.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout

from launcher.sandbox import Sandbox, SandboxInfo  # noqa: E402

DEMO_TRAINER = ROOT / "launcher" / "sandbox" / "demo_trainer.py"
HANDWRITTEN = Path(__file__).resolve().parent / "handwritten.sh"
FAST_ENV = {"DEMO_INTERVAL": "0.5", "DEMO_RAMP": "3"}
SESSION = "demo"
WORKDIR = "/root/demo"
DEST = "train_demo.py"
CHECKPOINTS = "checkpoints"
COMMAND = "python3 train_demo.py"
# Each contender redeploys over its own previous run, on a container of its own (all alike):
# launcher's stop waits for the pane's process, which for a hand-typed run is an
# interactive shell that outlives C-c, so replacing the others' runs would cost it the grace.
DEPLOY_VMID = 300
CRASH_VMID = 301
HAND_VMID = 302
MUX_VMID = 303
ACCEPTED = re.compile(rb"Accepted publickey for ")


@dataclass(frozen=True)
class Timed:
    """One finished command: wall seconds, exit code, output, and when it ended (epoch)."""

    seconds: float
    code: int
    out: str
    err: str
    ended: float


class Recording:
    """A launcher host connection that keeps what each command sent, (command line bytes, stdin
    bytes): what crosses the SSH channel for it, framing and encryption aside."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.sent: list[tuple[int, int]] = []

    @property
    def endpoint(self) -> Any:
        return self.conn.endpoint

    def run(self, command: str, *, stdin: bytes | None = None, timeout: float | None = None) -> Any:
        self.sent.append((len(command.encode()), len(stdin or b"")))
        return self.conn.run(command, stdin=stdin, timeout=timeout)

    def stream(self, command: str, on_stdout: Callable[[bytes], None], **kwargs: Any) -> int:
        self.sent.append((len(command.encode()), len(kwargs.get("stdin") or b"")))
        return int(self.conn.stream(command, on_stdout, **kwargs))

    def take(self) -> list[int]:
        """Bytes sent by each command since the last take()."""
        sent, self.sent = self.sent, []
        return [command + stdin for command, stdin in sent]


class BenchError(Exception):
    """A benchmark step could not be measured (a command failed that must not)."""


def check(result: Timed, what: str, codes: Sequence[int] = (0,)) -> Timed:
    if result.code not in codes:
        tail = "\n".join((result.err or result.out).strip().splitlines()[-8:])
        raise BenchError(f"{what} exited {result.code} (wanted {list(codes)}):\n{tail}")
    return result


class BenchEnv:
    """A sandbox of the benchmark's own plus a project (inventories, playbooks) for launcher."""

    def __init__(self, vmids: Sequence[int], *, stock_home: bool = False) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="launcher-bench-"))
        self.sandbox = Sandbox(self.tmp / "sandbox", stock_home=stock_home)
        self.project = self.tmp / "project"
        self.home = self.tmp / "home"
        self.control_dir = self.tmp / "mux"
        self.runtime_dir = self.tmp / "run"  # launcher's persisted connections (short path)
        self.vmids = list(vmids)
        self.python = Path(sys.executable)
        self.info: SandboxInfo | None = None
        self._script_version = 0

    # -- lifecycle --------------------------------------------------------------------------

    def up(self) -> SandboxInfo:
        for d in (self.project / "playbooks", self.home, self.control_dir, self.runtime_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.control_dir.chmod(0o700)
        self.runtime_dir.chmod(0o700)
        self.info = self.sandbox.up(self.vmids, gpus=8)
        # Each container its own 8 GPUs: the benchmark runs 8-GPU runs in many containers at
        # once, which one host's 8 shared GPUs would (rightly) refuse.
        for vmid in self.vmids:
            self.sandbox.set_gpu_pool(vmid, f"ct{vmid}")
        self.sandbox.set_faults()
        self.new_script()
        return self.info

    def close(self) -> None:
        try:
            if self.info is not None:
                self.close_master()
                self.run([str(self.python), "-m", "launcher", "disconnect"])
            self.sandbox.down()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def env(self) -> dict[str, str]:
        """The commands' environment: a HOME of our own, no agent, no user inventory, and .pyc
        files written and used as for a user (start-up figures depend on them)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SSH_", "LAUNCHER_"))}
        env["HOME"] = str(self.home)
        env["XDG_RUNTIME_DIR"] = str(self.runtime_dir)
        for name in ("XDG_STATE_HOME", "PYTHONDONTWRITEBYTECODE"):
            env.pop(name, None)
        return env

    # -- project files ----------------------------------------------------------------------

    @property
    def script(self) -> Path:
        return self.project / DEST

    def new_script(self) -> None:
        """A new version of the trainer (so every deploy has something to upload)."""
        self._script_version += 1
        text = DEMO_TRAINER.read_text() + f"# bench version {self._script_version}\n"
        self.script.write_text(text)

    def playbook(
        self,
        name: str,
        *,
        session: str = SESSION,
        verify: dict[str, Any] | None = None,
        **env: str,
    ) -> str:
        book: dict[str, Any] = {
            "name": name,
            "session": session,
            "workdir": f"/root/{session}",
            "script": {"source": str(self.script), "dest": DEST},
            "checkpoints": CHECKPOINTS,
            "command": COMMAND,
            "env": {**FAST_ENV, **env},
            "gpus": 8,
            "stop_grace": 2,
            "verify": {
                "wait": 5,
                "interval": 1,
                "window": 30,
                "successes": 2,
                "lines": 500,
                **(verify or {}),
            },
        }
        path = self.project / "playbooks" / f"{name}.yaml"
        path.write_text(yaml.safe_dump(book, sort_keys=False))
        return f"playbooks/{name}.yaml"

    def inventory(
        self, name: str, targets: Mapping[str, tuple[int, str]], **host_options: object
    ) -> Path:
        """targets: name -> (vmid, playbook path relative to the project)."""
        assert self.info is not None
        info = self.info
        host: dict[str, object] = {
            "address": info.address,
            "port": info.port,
            "user": info.user,
            "identity_file": str(info.identity_file),
            "known_hosts": str(info.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 5,
            **host_options,
        }
        inv = {
            "hosts": {"sandbox": host},
            "targets": {
                t: {"host": "sandbox", "vmid": vmid, "playbook": book}
                for t, (vmid, book) in targets.items()
            },
            "default_target": next(iter(targets)),
        }
        path = self.project / f"{name}.yaml"
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
        return path

    # -- commands ---------------------------------------------------------------------------

    def run(self, argv: Sequence[str | Path], *, timeout: float = 180) -> Timed:
        start = time.perf_counter()
        proc = subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.project,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        seconds = time.perf_counter() - start
        return Timed(seconds, proc.returncode, proc.stdout, proc.stderr, time.time())

    def launcher_argv(self, inventory: Path, *args: str) -> list[str]:
        return [str(self.python), "-m", "launcher", "-i", str(inventory), *args]

    def launcher(self, inventory: Path, *args: str, timeout: float = 180) -> Timed:
        return self.run(self.launcher_argv(inventory, *args), timeout=timeout)

    def handwritten_argv(self, vmid: int, *, mux: bool) -> list[str]:
        assert self.info is not None
        info = self.info
        argv = [
            "bash", str(HANDWRITTEN),
            "--host", info.address, "--port", str(info.port), "--user", info.user,
            "--key", str(info.identity_file), "--known-hosts", str(info.known_hosts),
            "--vmid", str(vmid), "--script", str(self.script), "--workdir", WORKDIR,
            "--dest", DEST, "--session", SESSION, "--checkpoints", CHECKPOINTS,
            "--command", COMMAND,
        ]  # fmt: skip
        for key, value in FAST_ENV.items():
            argv += ["--env", f"{key}={value}"]
        if mux:
            argv += ["--control-dir", str(self.control_dir)]
        return argv

    def ssh_argv(self, *remote: str, mux: bool = False, options: Sequence[str] = ()) -> list[str]:
        assert self.info is not None
        info = self.info
        argv = [
            "ssh", "-F", "none", "-i", str(info.identity_file), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f'UserKnownHostsFile="{info.known_hosts}"',
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-p", str(info.port),
        ]  # fmt: skip
        if mux:
            argv += ["-o", f"ControlPath={self.control_dir}/%C"]
        return [*argv, *options, f"{info.user}@{info.address}", *remote]

    def close_master(self) -> None:
        """Tear down B's multiplexed master connection, if one is up."""
        if any(self.control_dir.iterdir()):
            subprocess.run(
                self.ssh_argv(mux=True, options=("-O", "exit")),
                capture_output=True,
                env=self.env,
                timeout=10,
                check=False,
            )

    # -- counters ---------------------------------------------------------------------------

    def pct_calls(self) -> int:
        return self.sandbox.pct_calls()

    def ssh_accepts(self) -> int:
        """Connections the sandbox's sshd accepted (it logs one line per authenticated login)."""
        try:
            return len(ACCEPTED.findall((self.sandbox.state_dir / "sshd.log").read_bytes()))
        except FileNotFoundError:
            return 0

    @staticmethod
    def cpu_ticks() -> tuple[int, int]:
        """(busy, total) jiffies of the whole machine (/proc/stat), for a busy fraction."""
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields) - idle, sum(fields)

    @staticmethod
    def children_cpu() -> float:
        """CPU seconds (user + system) of the commands run and waited for so far: launcher's
        own share of a run, apart from sshd, pct and the containers'."""
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    def set_latency(self, seconds: float) -> None:
        self.sandbox.set_faults(pct_latency=seconds)

    def clear_agent_cache(self, vmid: int) -> int:
        """Remove the agent bundles cached in a container's /run/launcher; how many there were."""
        cache = self.sandbox.container_root(vmid) / "run" / "launcher"
        found = list(cache.glob("agent-*.bundle"))
        for path in found:
            path.unlink()
        return len(found)

    def ct_file_mtime(self, vmid: int, path: str) -> float | None:
        """mtime of a file inside a container (its rootfs is a directory on this machine)."""
        try:
            return (self.sandbox.container_root(vmid) / path.lstrip("/")).stat().st_mtime
        except FileNotFoundError:
            return None

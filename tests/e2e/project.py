"""Per-test projects on the sandbox: an inventory pointing at its sshd, and playbooks to taste."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from launcher.sandbox import Sandbox, SandboxInfo

T = TypeVar("T")

DEMO_TRAINER = Path(__file__).resolve().parents[2] / "launcher" / "sandbox" / "demo_trainer.py"

# Fast DFlash-like timings for tests: a status line every 0.5 s and a short ramp.
FAST_ENV = {"DEMO_INTERVAL": "0.5", "DEMO_RAMP": "3"}


@dataclass
class Project:
    """An inventory + playbooks in a temp dir, all targets on the session's sandbox host."""

    root: Path
    sandbox: Sandbox
    info: SandboxInfo

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def inventory(self) -> Path:
        return self.root / "inventory.yaml"

    def host(self, **overrides: Any) -> dict[str, Any]:
        host = {
            "address": self.info.address,
            "port": self.info.port,
            "user": self.info.user,
            "identity_file": str(self.info.identity_file),
            "known_hosts": str(self.info.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 5,
        }
        host.update(overrides)
        return host

    def playbook(self, name: str, **overrides: Any) -> dict[str, Any]:
        book: dict[str, Any] = {
            "name": name,
            "session": name,
            "workdir": f"/root/{name}",
            "script": {"source": str(DEMO_TRAINER), "dest": "train_demo.py"},
            "checkpoints": "checkpoints",
            "command": "python3 train_demo.py",
            "env": dict(FAST_ENV),
            "gpus": 8,
            "stop_grace": 3,
            "verify": {"wait": 4, "interval": 1, "window": 30, "successes": 2, "lines": 500},
        }
        env = overrides.pop("env", None)
        verify = overrides.pop("verify", None)
        book.update(overrides)
        if env:
            book["env"].update(env)
        if verify:
            book["verify"].update(verify)
        return book

    def write(
        self,
        targets: dict[str, tuple[int, dict[str, Any]]],
        *,
        host: dict[str, Any] | None = None,
    ) -> Path:
        """targets: name -> (vmid, playbook dict). Returns the inventory path."""
        (self.root / "playbooks").mkdir(parents=True, exist_ok=True)
        inv_targets = {}
        for name, (vmid, book) in targets.items():
            path = self.root / "playbooks" / f"{name}.yaml"
            path.write_text(yaml.safe_dump(book, sort_keys=False))
            inv_targets[name] = {
                "host": "sandbox",
                "vmid": vmid,
                "playbook": f"playbooks/{name}.yaml",
            }
        inventory = {
            "hosts": {"sandbox": host or self.host()},
            "targets": inv_targets,
            "default_target": next(iter(targets)),
        }
        self.inventory.write_text(yaml.safe_dump(inventory, sort_keys=False))
        return self.inventory

    def argv(self, *args: str) -> list[str]:
        """The command line that runs the real CLI on this project's inventory, for tests that
        start it themselves (to kill it, feed it, or run several at once)."""
        return [sys.executable, "-m", "launcher", "-i", str(self.inventory), *args]

    def launcher(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the real CLI in a process of its own, as a user (or CI) would: a fresh
        `python -m launcher`."""
        return subprocess.run(
            self.argv(*args),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def ct(self, vmid: int, *argv: str) -> subprocess.CompletedProcess[bytes]:
        return self.sandbox.ct_exec(vmid, list(argv))

    def ct_text(self, vmid: int, *argv: str) -> str:
        result = self.ct(vmid, *argv)
        return result.stdout.decode()

    def processes(self, vmid: int, pattern: str) -> list[str]:
        """Live python processes in the CT running `pattern` (not shells, tmux or zombies)."""
        out = self.ct_text(vmid, "ps", "-eo", "stat=,args=")
        found = []
        for line in out.splitlines():
            stat, _, args = line.strip().partition(" ")
            args = args.strip()
            if pattern in args and args.startswith("python3") and not stat.startswith("Z"):
                found.append(args)
        return found

    def deploy_healthy(self, name: str, vmid: int, host: dict[str, Any] | None = None) -> None:
        """Target `name` (its own playbook) on `vmid`, deployed and polled until healthy (with
        `status -t NAME --json`, the command line the tests' own status calls use, so that it
        leaves no hint of another command line)."""
        self.write({name: (vmid, self.playbook(name))}, host=host)
        deployed = self.launcher("deploy", "-t", name, "--restart")
        assert deployed.returncode == 0, deployed.stderr
        self.wait_for(
            lambda: self.launcher("status", "-t", name, "--json").returncode == 0,
            timeout=30,
            what="a healthy run",
        )

    def kill_session(self, vmid: int, session: str) -> None:
        self.ct(vmid, "tmux", "kill-session", "-t", f"={session}")

    def sshd_logins(self, at_least: int = 0) -> int:
        """Logins the sandbox host's sshd has accepted so far (see accepted_logins)."""
        return accepted_logins(self.sandbox.state_dir / "sshd.log", at_least)

    def sshd_sessions(self, at_least: int = 0) -> int:
        """Sessions (command channels) the sandbox host's sshd has started so far."""
        return started_sessions(self.sandbox.state_dir / "sshd.log", at_least)

    def wait_for(
        self, predicate: Callable[[], T], timeout: float = 20, what: str = "condition"
    ) -> T:
        """Polls predicate until it returns something truthy, and returns that. Between polls
        it pauses 0.2 s, or as long as the poll took: a poll that starts `launcher` (half a
        second of CPU) then keeps at most half a core busy, not most of one, while the suite's
        other workers share the machine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            started = time.monotonic()
            value = predicate()
            if value:
                return value
            now = time.monotonic()
            time.sleep(max(0.0, min(max(0.2, now - started), deadline - now)))
        raise AssertionError(f"timed out waiting for {what}")


def json_out(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def tree(project: Project, vmid: int, folder: str) -> list[str]:
    """Every path under `folder` in the CT with size and mode (for before/after comparisons)."""
    out = project.ct_text(vmid, "find", folder, "-printf", "%p %s %m %y\n")
    return sorted(out.splitlines())


def host_tmp_files() -> list[str]:
    """Upload temp files left on the host (the sandbox host is this machine)."""
    return sorted(p.name for p in Path("/tmp").glob(".launcher-*"))


def new_host_tmp_files(before: list[str], settle: float = 15.0) -> list[str]:
    """Upload temp files on the host that were not there `before` and stay: another test run
    on this machine (another xdist worker's sandbox) has its own in /tmp for the moment of a
    push, which its shell's trap removes; one that outlives `settle` seconds was left."""
    deadline = time.monotonic() + settle
    while (new := sorted(set(host_tmp_files()) - set(before))) and time.monotonic() < deadline:
        time.sleep(0.2)
    return new


LOG_SETTLE = 0.3  # s without a new login line before a count is taken


def local_processes() -> list[tuple[int, bytes, list[bytes]]]:
    """This machine's processes: (pid, command line as /proc has it, NUL-separated, environment
    as `NAME=value` entries); a process that ended or is not readable is left out."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found.append((int(proc.name), cmdline, environ))
    return found


def accepted_logins(log: Path, at_least: int = 0, timeout: float = 10.0) -> int:
    """The logins an sshd log records ("Accepted publickey"), read once the log has settled.
    sshd's monitor writes that line after it has answered its unprivileged child (OpenSSH
    monitor.c, monitor_child_preauth: monitor_read, then auth_log), so a client can be logged
    in, and even done, before the line is there. Waits until there are `at_least` (for up to
    `timeout` s), then until the count has held for LOG_SETTLE s, so that a late line is counted
    rather than missed, and a check that no login happened can still see one that did."""
    return _settled_count(log, "Accepted publickey", at_least, timeout)


def started_sessions(log: Path, at_least: int = 0, timeout: float = 10.0) -> int:
    """The sessions (one per command channel) an sshd log records, read as accepted_logins
    reads logins: sshd logs "Starting session: command for ..." at LogLevel VERBOSE (OpenSSH
    session.c, do_exec), which the sandbox's sshd_config sets."""
    return _settled_count(log, "Starting session: ", at_least, timeout)


def _settled_count(log: Path, needle: str, at_least: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    count, held_since = _count(log, needle), time.monotonic()
    while time.monotonic() < deadline:
        if count >= at_least and time.monotonic() - held_since >= LOG_SETTLE:
            break
        time.sleep(0.05)
        now = _count(log, needle)
        if now != count:
            count, held_since = now, time.monotonic()
    return count


def _count(log: Path, needle: str) -> int:
    return log.read_text(errors="replace").count(needle)


def verify_json(project: Project, *args: str) -> tuple[int, dict[str, Any], float]:
    """`launcher verify --json ARGS`: exit code, the report (checked against its shipped schema)
    and how long it took."""
    import jsonschema

    schema = json.loads(
        resources.files("launcher").joinpath("schemas/verify.schema.json").read_text()
    )
    started = time.monotonic()
    result = project.launcher("verify", "--json", *args, timeout=90)
    elapsed = time.monotonic() - started
    report = json_out(result)
    jsonschema.validate(report, schema)
    return result.returncode, report, elapsed

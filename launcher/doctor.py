"""`doctor`: check everything a deploy needs, say what is wrong and how to fix it.

Host checks go through the connection (its errors tell reachability, host key and auth apart);
the in-container checks are one preflight agent call that creates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launcher.config import Target
from launcher.container import host_command
from launcher.deploy import DISK_MARGIN, preflight
from launcher.errors import (
    AuthError,
    ConnectError,
    ContainerError,
    ExitCode,
    HostKeyError,
    LauncherError,
    RemoteError,
)
from launcher.remote import Connection
from launcher.runops import container_for

MIB = 1024 * 1024


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | failed | skipped
    detail: str
    fix: str | None = None
    exit_code: ExitCode = ExitCode.OK


@dataclass
class DoctorResult:
    exit_code: ExitCode
    summary: str
    checks: list[Check] = field(default_factory=list)


class _Checks:
    def __init__(self) -> None:
        self.checks: list[Check] = []

    def ok(self, name: str, detail: str) -> None:
        self.checks.append(Check(name, "ok", detail))

    def fail(self, name: str, detail: str, fix: str, code: ExitCode = ExitCode.UNREACHABLE) -> None:
        self.checks.append(Check(name, "failed", detail, fix, code))

    def skip(self, names: list[str], why: str) -> None:
        self.checks.extend(Check(name, "skipped", f"skipped: {why}") for name in names)

    def result(self, label: str) -> DoctorResult:
        failed = [c for c in self.checks if c.status == "failed"]
        if not failed:
            passed = sum(c.status == "ok" for c in self.checks)
            return DoctorResult(ExitCode.OK, f"{label}: all {passed} checks passed", self.checks)
        first = failed[0]
        summary = f"{label}: {len(failed)} check(s) failed, first {first.name}: {first.detail}"
        return DoctorResult(first.exit_code, summary, self.checks)


HOST_CHECKS = ["reachable", "host key", "auth", "pct"]
CT_CHECKS = ["container", "running", "python3", "tmux", "gpus", "disk", "workdir", "lock"]


def config_failed(error: LauncherError) -> DoctorResult:
    """The result when the inventory or playbook does not load: nothing else can be checked."""
    checks = _Checks()
    checks.fail(
        "config",
        error.message.replace("\n", "; "),
        error.hint or "fix the file and line named above; `launcher inventory check` lists all",
        error.exit_code,
    )
    checks.skip(HOST_CHECKS + CT_CHECKS, "the configuration is invalid")
    return checks.result("config")


def doctor(target: Target, conn: Connection) -> DoctorResult:
    """Every check in order; a failure skips the checks that depend on it."""
    checks = _Checks()
    playbook = target.playbook
    checks.ok("config", f"{playbook.path} valid; script {playbook.script_source}")
    if _host(target, conn, checks) and _container(target, conn, checks):
        _inside(target, conn, checks)
    return checks.result(target.label)


def _host(target: Target, conn: Connection, checks: _Checks) -> bool:
    ep = conn.endpoint
    where = f"{ep.user}@{ep.hostname}:{ep.port}"
    try:
        found = conn.run(host_command(["command", "-v", "pct"]), timeout=30)
    except HostKeyError as exc:
        checks.ok("reachable", f"{where} answers")
        checks.fail("host key", exc.message, exc.hint or "add the host key to known_hosts")
        checks.skip(["auth", "pct", *CT_CHECKS], "host key not trusted")
        return False
    except AuthError as exc:
        checks.ok("reachable", f"{where} answers")
        checks.ok("host key", f"known in {ep.known_hosts}")
        checks.fail("auth", exc.message, exc.hint or "check identity_file and authorized_keys")
        checks.skip(["pct", *CT_CHECKS], "not logged in")
        return False
    except (ConnectError, RemoteError) as exc:
        fix = exc.hint or "check the address and port in the inventory, and that sshd runs"
        checks.fail("reachable", exc.message, fix)
        checks.skip(["host key", "auth", "pct", *CT_CHECKS], "host not reachable")
        return False
    checks.ok("reachable", where)
    checks.ok("host key", f"known in {ep.known_hosts}")
    checks.ok("auth", f"as {ep.user}")
    if not found.ok or not found.out.strip():
        checks.fail(
            "pct",
            f"`pct` not found on {ep.hostname}",
            "run against a Proxmox VE node (pct comes with pve-container)",
        )
        checks.skip(CT_CHECKS, "no pct on the host")
        return False
    checks.ok("pct", found.out.strip().splitlines()[0])
    return True


def _container(target: Target, conn: Connection, checks: _Checks) -> bool:
    vmid = target.vmid
    status = conn.run(host_command(["pct", "status", str(vmid)]), timeout=60)
    text = (status.out + status.err).strip()
    if not status.ok:
        checks.fail(
            "container",
            f"CT {vmid}: {text.splitlines()[-1] if text else 'pct status failed'}",
            "check the vmid in the inventory against `pct list` on the host",
        )
        checks.skip(CT_CHECKS[1:], f"CT {vmid} not found")
        return False
    checks.ok("container", f"CT {vmid} exists")
    state = text.partition("status:")[2].strip() or text
    if state != "running":
        checks.fail("running", f"CT {vmid} is {state or 'not running'}", f"pct start {vmid}")
        checks.skip(CT_CHECKS[2:], f"CT {vmid} not running")
        return False
    checks.ok("running", f"CT {vmid} is running")
    return True


def _inside(target: Target, conn: Connection, checks: _Checks) -> None:
    spec = target.playbook.spec
    need = target.playbook.script_source.stat().st_size
    try:
        pre = preflight(
            target, container_for(target, conn), need, create_workdir=False, timeout=120
        )
    except ContainerError as exc:
        checks.fail("python3", exc.message, exc.hint or "install python3 in the container")
        checks.skip(CT_CHECKS[3:], "the in-container checks need python3")
        return
    checks.ok("python3", f"python {pre.get('python')}")
    if pre.get("tmux"):
        checks.ok("tmux", str(pre.get("tmux")))
    else:
        checks.fail("tmux", "tmux is not installed in the CT", "apt-get install tmux (in the CT)")
    _gpus(spec.gpus, pre.get("gpus") or {}, checks)
    free = pre.get("free_bytes")
    wanted = need * 2 + DISK_MARGIN
    if free is None:
        checks.fail("disk", f"cannot measure free space under {spec.workdir}", "check the disk")
    elif int(free) < wanted:
        checks.fail(
            "disk",
            f"{int(free) // MIB} MiB free under {spec.workdir}, {wanted // MIB} MiB needed",
            "free space in the CT or grow its disk (pct resize)",
        )
    else:
        checks.ok("disk", f"{int(free) // MIB} MiB free under {spec.workdir}")
    _workdir(spec.workdir, pre, checks)
    _lock(pre.get("lock"), checks)


def _gpus(wanted: int, gpus: dict[str, Any], checks: _Checks) -> None:
    if wanted <= 0:
        checks.ok("gpus", "not needed (playbook gpus: 0)")
        return
    visible = int(gpus.get("visible") or 0)
    if visible < wanted:
        reason = gpus.get("error") or f"{visible} visible"
        checks.fail(
            "gpus",
            f"playbook wants {wanted} GPUs, {reason}",
            "check the CT's GPU passthrough (device entries and mounts) and nvidia-smi in the CT",
        )
        return
    holders = gpus.get("holders") or []
    held = f"; in use by pids {', '.join(str(h.get('pid')) for h in holders)}" if holders else ""
    checks.ok("gpus", f"{visible} visible (wanted {wanted}){held}")


def _workdir(workdir: str, pre: dict[str, Any], checks: _Checks) -> None:
    info = pre.get("workdir") or {}
    unsafe = (pre.get("checkpoints") or {}).get("unsafe")
    if unsafe:
        checks.fail(
            "workdir",
            f"checkpoints path refused: {unsafe}",
            "point `checkpoints:` at a real directory strictly inside the workdir",
            ExitCode.USAGE,
        )
    elif not info.get("exists"):
        checks.ok("workdir", f"{workdir} does not exist yet (deploy creates it)")
    elif not info.get("writable"):
        checks.fail("workdir", f"{workdir} is not writable", f"check ownership of {workdir}")
    else:
        checks.ok("workdir", f"{workdir} writable")


def _lock(lock: dict[str, Any] | None, checks: _Checks) -> None:
    if not lock:
        checks.ok("lock", "free")
        return
    holder = (
        f"{lock.get('operator')}@{lock.get('from_host')} "
        f"(pid {lock.get('client_pid')}, since {lock.get('since')})"
    )
    if lock.get("stale"):
        checks.ok("lock", f"stale lock of {holder}; the next deploy breaks it")
        return
    checks.fail(
        "lock",
        f"held by a deploy of {holder}",
        "wait for that deploy to finish (or ask its operator)",
        ExitCode.REFUSED,
    )

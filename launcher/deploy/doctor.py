"""`doctor`: check everything a deploy needs, say what is wrong and how to fix it.

Host checks go through the connection (its errors tell reachability, host key and auth apart);
the in-container checks are the deploy transaction in plan mode (one agent call, nothing
changed), so doctor, `deploy --dry-run` and the deploy itself run the same checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from launcher.agent.protocol import ReleaseSpec, TransactionAnswer
from launcher.config.models import Target
from launcher.container.agentclient import ERROR_KINDS, AgentClient, AgentFailure, container_for
from launcher.container.pct import HostConnection, host_command, missing_container_hint
from launcher.core.errors import (
    AuthError,
    ConnectError,
    ContainerError,
    ExitCode,
    HostKeyError,
    LauncherError,
    RemoteError,
    UsageError,
)
from launcher.core.requests import DeployOptions, DoctorRequest
from launcher.deploy.deploy import plan_request, read_script
from launcher.targets.fleet import Outcome
from launcher.targets.workflow import Context, Step


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
    target: str = ""

    def to_json(self) -> dict[str, Any]:
        """The target's item of `doctor --json` (schema launcher.doctor/1)."""
        return {
            "target": self.target,
            "exit_code": int(self.exit_code),
            "summary": self.summary,
            "checks": [
                {"name": c.name, "status": c.status, "detail": c.detail, "fix": c.fix}
                for c in self.checks
            ],
        }


def run_doctor(ctx: Context, request: DoctorRequest) -> DoctorResult:
    """`launcher doctor` on the context's target: each check a step, with its fix."""
    result = doctor(ctx.target, ctx.conn)
    result.target = ctx.target.name
    for check in result.checks:
        ctx.step(Step(check.name, check.status, check.detail + check_fix(check)))
    return result


def check_fix(check: Check) -> str:
    return f"  fix: {check.fix}" if check.fix else ""


def doctor_row(ctx: Context, result: DoctorResult) -> Outcome:
    return Outcome(
        ctx.target.name, result.exit_code, result.summary, result.to_json(), value=result
    )


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
# The in-container checks after python3 are the deploy transaction's own (agent/deploy.py `checks`).
CT_CHECKS = ["container", "running", "python3", "deploy checks"]


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


def doctor(target: Target, conn: HostConnection) -> DoctorResult:
    """Every check in order; a failure skips the checks that depend on it."""
    checks = _Checks()
    playbook = target.playbook
    what = "script" if playbook.script_source else "project"
    source = playbook.script_source or playbook.project_source
    checks.ok("config", f"{playbook.path} valid; {what} {source}")
    if _host(target, conn, checks) and _container(target, conn, checks):
        _inside(target, conn, checks)
    return checks.result(target.label)


def _host(target: Target, conn: HostConnection, checks: _Checks) -> bool:
    ep = conn.endpoint
    where = f"{ep.user}@{ep.hostname}:{ep.port}"
    try:
        found = conn.run(host_command(["command", "-v", "pct"]), timeout=ep.command_timeout)
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


def _container(target: Target, conn: HostConnection, checks: _Checks) -> bool:
    vmid = target.vmid
    # The host's own deadline: a hung `pct status` costs command_timeout, not a fixed minute.
    status = conn.run(
        host_command(["pct", "status", str(vmid)]), timeout=conn.endpoint.command_timeout
    )
    text = (status.out + status.err).strip()
    if not status.ok:
        checks.fail(
            "container",
            f"CT {vmid}: {text.splitlines()[-1] if text else 'pct status failed'}",
            missing_container_hint(conn, vmid),
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


# What to do about each failed check of the deploy transaction's plan.
FIXES = {
    "paths": "point workdir and script.dest at a directory that belongs to the run",
    "receive": "check the script file and the connection",
    "lock": "wait for that deploy to finish (or ask its operator)",
    "tmux": "apt-get install tmux (in the CT)",
    "resources": "free space in the CT or grow its disk (pct resize); check GPU passthrough "
    "(device entries and mounts) and nvidia-smi in the CT",
    "active_check": "deploy with --restart to replace it",
    "gpus": "stop the processes named, or deploy with --kill-gpu-holders",
    "verify": "the script changed in transit: check the connection and try again",
    "compile": "fix the syntax error in the script",
    "checkpoint_guard": "point `checkpoints:` at a real directory strictly inside the workdir",
    "launch_check": "check the shell and that <workdir>/.launcher is writable",
}


def _release_plan(target: Target) -> ReleaseSpec:
    """The release part of the planned deploy: the manifest alone (plan mode sends no files)."""
    from launcher.deploy import releases

    manifest = releases.manifest_for(target)
    project = target.playbook.spec.project
    return {
        "manifest": manifest.as_lists(),
        "manifest_sha256": manifest.digest,
        "keep_releases": project.keep_releases if project is not None else 3,
        "setup": releases.setup_request(target, manifest),
    }


def _inside(target: Target, conn: HostConnection, checks: _Checks) -> None:
    """The deploy transaction in plan mode, every check shown: the very checks a deploy runs."""
    spec = target.playbook.spec
    options = DeployOptions(restart=True)
    script = read_script(target) if target.playbook.script_source is not None else None
    request = plan_request(target, script, options, spec.stop_grace, keep_going=True)
    if spec.project is not None:
        request["release"] = _release_plan(target)
    try:
        answer = AgentClient(container_for(target, conn)).transaction(
            request, timeout=conn.endpoint.command_timeout
        )
    except AgentFailure as failure:
        answer = cast(TransactionAnswer, failure.response)
    except ContainerError as exc:
        checks.fail("python3", exc.message, exc.hint or "install python3 in the container")
        checks.skip(CT_CHECKS[3:], "the in-container checks need python3")
        return
    except UsageError as exc:  # refused before the first check, e.g. an unsafe workdir
        checks.fail("paths", exc.message, FIXES["paths"], exc.exit_code)
        return
    python = (answer.get("preflight") or {}).get("python")
    checks.ok("python3", f"python {python}" if python else "python3 answers")
    for step in answer.get("steps") or []:
        name, status, detail = str(step.get("name")), step.get("status"), str(step.get("detail"))
        if status == "planned":
            continue
        if status == "failed":
            code = ERROR_KINDS.get(str(step.get("kind")), RemoteError).exit_code
            checks.fail(name, detail, FIXES.get(name, "see the message"), code)
        else:
            checks.ok(name, detail)
